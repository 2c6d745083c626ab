"""Issue acceptance, in CI: each asynchronous method learns CartPole-v1 under mpiexec -n 4
(1 ps + 3 actor-learners): the mean return of the last 20 episodes reaches 195 within 300,000
agent steps over all actor-learners (CartPole: one agent step = one frame).

Which episodes: the value methods' configs evaluate (each rank plays 5 episodes at epsilon 0.05
every 2,500 of its steps) and are judged on those, because their training episodes are played
at the paper's per-rank final epsilons {0.1, 0.01, 0.5}: a rank at 0.5 keeps a perfect policy's
training returns far below 195. A3C is judged on its training episodes (it samples its policy).
``early_stop`` ends each run when the mark is reached, so the test costs what learning costs.

A3C LSTM (``configs/a3c_lstm_cartpole.toml``) is here at the paper's gamma 0.99 with
``reward_norm``: 10 of 10 seeds reached the mark at 13-27 k agent steps, a tenth of the budget
(docs/experiments/cartpole-learning-checks.md); without ``reward_norm`` it does not learn at 0.99
(0 of 3 seeds).
"""

import numpy as np
import pytest

from hpcrl.io.metrics import read_metrics
from tests.test_gorila import first_frame_reaching, pong_smoke_run
from tests.util import run_mpi

pytestmark = pytest.mark.mpi
BUDGET = 300_000


def test_a3c_pong_smoke_writes_gorila_schema(tmp_path):
    """mpiexec -n 3 (1 ps + 2 actor-learners) A3C on Pong for 20,000 frames, one environment
    each (the paper's setting; the config's 8 would end no episode in 20,000 frames), exits 0
    and writes metrics.h5 with the same schema as Gorila."""
    _, m = pong_smoke_run(tmp_path, "a3c", 3, sets=["envs_per_actor=1"])
    assert len(m["episodes"]["return"]) >= 2          # Pong episodes are >= 3,000 frames here
    assert (m["episodes"]["return"] >= -21).all() and (m["episodes"]["return"] <= 21).all()
    assert int(m["train"]["updates"][-1]) >= 20000 // 4 // 5 - 10   # one push per 5 steps


@pytest.mark.slow
@pytest.mark.parametrize("config, extra", [
    ("one_step_q_cartpole", []),
    ("one_step_sarsa_cartpole", []),
    ("n_step_q_cartpole", []),
    ("a3c_cartpole", []),
    ("a3c_lstm_cartpole", []),
], ids=["one_step_q", "one_step_sarsa", "n_step_q", "a3c_ff", "a3c_lstm"])
def test_learns_cartpole_within_300k_agent_steps(config, extra, tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "hpcrl.run", "--config", f"configs/{config}.toml", "--set", f"run_dir={run_dir}",
            "--set", f"total_frames={BUDGET}", "--set", "early_stop=true"]
    for item in extra:
        args += ["--set", item]
    proc, wall = run_mpi(4, args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = read_metrics(run_dir / "metrics.h5")
    kind = "episodes" if config.startswith("a3c") else "eval"
    assert len(m[kind]["return"]) >= 20, kind
    reached = first_frame_reaching(m[kind]["frames"], m[kind]["return"], 195.0)
    print(f"{config} {extra}: {kind} mean(20) reached 195 at frame {reached}, {wall:.0f} s")
    assert reached is not None and reached <= BUDGET
    assert "[hpcrl] early stop: mean return of the last 20" in proc.stdout
    assert f"[hpcrl] {config}.toml on CartPole-v1 learns: CI learning gate" in proc.stdout
    # the run ended at the mark, not at the budget
    assert int(m["train"]["frames"][-1]) < BUDGET
    assert np.isfinite(m["train"]["loss"][-5:]).any()


#: InvertedPendulum-v5's gate: the evaluation mean of 20 (the task's maximum is 1,000) and the
#: acceptance budget of the continuous-control issue (agent steps over all actor-learners)
PENDULUM_MARK, PENDULUM_BUDGET = 200.0, 1_000_000


@pytest.mark.slow
def test_a3c_gaussian_learns_inverted_pendulum(tmp_path):
    """configs/a3c_mujoco.toml as shipped, on InvertedPendulum-v5 with mpiexec -n 3 (1 ps + 2
    actor-learners x 8 environments): the mean of the last 20 evaluation episodes (the
    Gaussian policy's mean action) reaches 200 within 1,000,000 agent steps, and early stop
    ends the run there. Calibration (docs/experiments/continuous-control.md, 2026-12-03):
    seeds 1-3 passed 200 at 0.30, 0.42 and 0.21 M steps and 1,000, the task's maximum, at
    0.49, 0.53 and 0.33 M; this test's seed 0 passed 200 at 0.26 M. A random policy holds the
    pole for 5-20 steps."""
    pytest.importorskip("mujoco")
    run_dir = tmp_path / "run"
    proc, wall = run_mpi(3, ["-m", "hpcrl.run", "--config", "configs/a3c_mujoco.toml",
                             "--set", f"run_dir={run_dir}", "--set", "early_stop=true",
                             "--set", f"early_stop_return={PENDULUM_MARK}",
                             "--set", f"total_frames={PENDULUM_BUDGET}"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = read_metrics(run_dir / "metrics.h5")
    reached = first_frame_reaching(m["eval"]["frames"], m["eval"]["return"], PENDULUM_MARK)
    print(f"a3c_mujoco InvertedPendulum-v5: evaluation mean(20) reached {PENDULUM_MARK} at "
          f"frame {reached}, {wall:.0f} s")
    assert reached is not None and reached <= PENDULUM_BUDGET
    assert "[hpcrl] early stop: mean return of the last 20 evaluation episodes" in proc.stdout
    assert int(m["train"]["frames"][-1]) < PENDULUM_BUDGET      # ended at the mark
    assert len(m["final"]["return"]) == 30                      # the final evaluation ran
