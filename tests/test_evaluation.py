"""Evaluation as the papers report it: periodic evaluations staggered over the evaluating
ranks, and the final evaluation of the final weights (30 episodes by default) in
``metrics.h5``'s ``final`` group, read by analyze, export and play. Real MPI ranks, real
environments, real HDF5 files."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcrl.agents.evaluation import episode_quotas, evaluate, first_evaluation
from hpcrl.config import Config, default_job_path, load_config
from hpcrl.envs import make_env_from_config
from hpcrl.io.metrics import COLUMNS, MetricsWriter, read_metrics
from hpcrl.rl.networks import build_network
from hpcrl.runtime.topology import even_share
from hpcrl.tools import runfiles
from tests.util import ROOT, run_mpi


# --- pure rules ------------------------------------------------------------------------------

def test_first_evaluations_take_turns_over_the_ranks():
    # 4 ranks, every 1,000 of their own frames: the first at 250 / 500 / 750 / 1,000
    assert [first_evaluation(1000, k, 4) for k in range(4)] == [250, 500, 750, 1000]
    assert first_evaluation(1000, 0, 1) == 1000
    assert first_evaluation(3, 0, 16) == 1           # never at frame 0


def test_even_share_and_episode_quotas_by_hand():
    assert [even_share(30, k, 16) for k in range(16)] == [2] * 14 + [1] * 2
    assert [even_share(30, k, 2) for k in range(2)] == [15, 15]
    assert [even_share(2, k, 3) for k in range(3)] == [1, 1, 0]
    assert episode_quotas(6, 4).tolist() == [2, 2, 1, 1]


def test_batched_evaluation_plays_each_environments_quota():
    """6 episodes on 4 CartPole environments: each environment plays its quota (2, 2, 1, 1)
    of its own episode stream, not the first 6 episodes to end (which favours short ones).
    Reference: the same 4 seeded environments stepped greedily until each ended 3 episodes."""
    cfg = Config(algo="gorila", game="CartPole-v1", envs_per_actor=4, eval_epsilon=0.0,
                 mlp_hidden=8)
    torch.manual_seed(0)
    net = build_network(cfg, (4,), 2)
    got = evaluate(net, cfg, seed=9, rng=np.random.default_rng(0), episodes=6)
    env = make_env_from_config(cfg, 4, 9, training=False)
    obs, per_env = env.reset(), [[] for _ in range(4)]
    while min(len(e) for e in per_env) < 3:
        with torch.no_grad():
            res = env.step(net(torch.from_numpy(obs)).argmax(1).numpy())
        for i in np.flatnonzero(res.episode_end):
            per_env[i].append((float(res.episode_return[i]), int(res.episode_frames[i])))
        obs = res.obs
    want = [ep for i, q in enumerate([2, 2, 1, 1]) for ep in per_env[i][:q]]
    assert len(got) == 6 and sorted(got) == sorted(want)


# --- the metrics file ------------------------------------------------------------------------

ATTRS = {"algo": "a3c", "game": "pong", "seed": 0, "config": ""}


def _episode(frames, ret):
    return dict(frames=frames, **{"return": ret}, length=100, rank=1, wall_time=1.0)


def test_rollback_drops_every_final_row(tmp_path):
    """The final evaluation follows the last checkpoint: a resume plays it again, so none of
    the earlier one's rows may stay (they would count twice)."""
    path = tmp_path / "metrics.h5"
    with MetricsWriter(path, ATTRS) as w:
        w.append("eval", **_episode(900, -20.0))
        w.append("final", **_episode(1000, 5.0))
        w.append("final", **_episode(1000, 7.0))
    w = MetricsWriter(path, ATTRS, resume=True)
    w.rollback(1000)
    w.close()
    m = read_metrics(path)
    assert m["eval"]["return"].tolist() == [-20.0] and m["final"]["return"].size == 0


def test_a_schema_1_file_reads_with_an_empty_final_group_and_resumes(tmp_path):
    """Files written before the final group (three groups, three row counts) still read and
    resume; the resumed file has the group."""
    path = tmp_path / "metrics.h5"
    with h5py.File(path, "w", libver="latest") as f:
        for k, v in ATTRS.items():
            f.attrs[k] = v
        f.attrs["schema_version"] = 1
        for group in ("episodes", "eval", "train"):
            g = f.create_group(group)
            for name, dtype in COLUMNS[group].items():
                g.create_dataset(name, data=np.zeros(1 if group == "eval" else 0, dtype),
                                 maxshape=(None,))
        f["eval/return"][0] = -7.0
        s = f.create_group("status")
        s.create_dataset("state", data=np.bytes_("preempted"), dtype="S16")
        s.create_dataset("heartbeat_unix", data=np.float64(0))
        s.create_dataset("committed_rows", data=np.array([0, 1, 0], np.int64))
    m = read_metrics(path)
    assert m["eval"]["return"].tolist() == [-7.0] and m["final"]["return"].size == 0
    w = MetricsWriter(path, ATTRS, resume=True)
    w.append("final", **_episode(0, 3.0))
    w.close()
    m = read_metrics(path)
    assert m["eval"]["return"].tolist() == [-7.0] and m["final"]["return"].tolist() == [3.0]
    assert m["attrs"]["schema_version"] == 4


# --- configs ---------------------------------------------------------------------------------

CLASSIC = ("CartPole-v1", "Acrobot-v1")


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")) +
                         [default_job_path(), None],
                         ids=lambda p: p.name if p else "field defaults")
def test_every_atari_config_evaluates(path):
    """Periodic evaluation on and a final evaluation of 30 episodes, as the papers report."""
    cfg = load_config(path)
    if cfg.game in CLASSIC:
        pytest.skip("classic control: the learning checks judge their own episodes")
    assert cfg.eval_every_frames > 0 and cfg.final_eval_episodes == 30
    assert cfg.eval_every_frames <= 1_000_000
    if path is not None:      # no config turns the default off behind the user's back
        assert "final_eval_episodes" not in tomllib.loads(path.read_text())


# --- real runs -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A3C CartPole, 1 ps + 2 actor-learners, 3,000 frames, the default final evaluation."""
    run = tmp_path_factory.mktemp("final") / "run"
    args = ["-m", "hpcrl.run", "--config", "configs/a3c_cartpole.toml", "--set",
            "total_frames=3000", "--set", f"run_dir={run}", "--set", "seed=3"]
    proc, _ = run_mpi(3, args, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return run, args, proc.stdout


@pytest.mark.mpi
def test_the_final_evaluation_is_in_metrics_h5(finished_run):
    run, _, stdout = finished_run
    m = read_metrics(run / "metrics.h5")
    final = m["final"]
    _, manifest = runfiles.checkpoint_generation(run)
    assert m["status"] == "finished" and final["return"].size == 30
    assert sorted(final["rank"].tolist()) == [1] * 15 + [2] * 15     # shared out, 15 each
    assert set(final["frames"].tolist()) == {manifest["frames"]}      # the final weights' frame
    assert (final["return"] == final["length"]).all()                 # CartPole: +1 per frame
    assert "[hpcrl] final evaluation: 30 episodes, mean return " \
        f"{final['return'].mean():.2f}" in stdout


@pytest.mark.mpi
def test_analyze_export_and_play_read_the_final_evaluation(finished_run, tmp_path):
    run, _, _ = finished_run
    final = read_metrics(run / "metrics.h5")["final"]
    out = subprocess.run([sys.executable, "-m", "hpcrl.analyze", str(run), "--format", "json"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["games"][0]
    assert row["score_source"] == "final" and row["episodes_used"] == [30]
    assert row["score_mean"] == pytest.approx(final["return"].mean())
    out = subprocess.run([sys.executable, "-m", "hpcrl.export", "csv", str(run), "-o",
                          str(tmp_path / "csv")], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "csv" / "final.csv").read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS["final"]) and len(lines) == 31
    from hpcrl.tools import export
    from tests.test_play_export import _read_events

    tb = export.TensorBoardExport(tmp_path / "tb")
    tb.append(read_metrics(run / "metrics.h5"))
    tb.close()
    scalars = _read_events(tmp_path / "tb")
    assert len(scalars["final/return"]) == 30
    assert scalars["final/mean_return"] == [(int(final["frames"][0]),
                                             pytest.approx(final["return"].mean()))]
    out = subprocess.run([sys.executable, "-m", "hpcrl.play", str(run)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (f"the run's final evaluation (metrics.h5): mean return "
            f"{final['return'].mean():g} over 30 episodes") in out.stdout


@pytest.mark.mpi
def test_running_a_finished_run_again_replaces_its_final_evaluation(finished_run, tmp_path):
    """The same command on the finished run: it resumes at the spent budget, writes a new
    final generation and evaluates again; the file keeps 30 final rows, not 60."""
    run, args, _ = finished_run
    copy = tmp_path / "again"
    subprocess.run(["cp", "-r", str(run), str(copy)], check=True)
    args = [a.replace(str(run), str(copy)) for a in args]
    proc, _ = run_mpi(3, args, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    m = read_metrics(copy / "metrics.h5")
    assert m["final"]["return"].size == 30 and m["attrs"]["num_starts"] == 2


@pytest.mark.mpi
def test_a_frozen_evaluator_is_named_and_the_job_ends(tmp_path):
    """Rank 2 stops (SIGSTOP) as its final evaluation begins: rank 0 names it within 0.8 x
    watchdog_s and the job exits non-zero instead of hanging."""
    run = tmp_path / "run"
    proc, wall = run_mpi(3, ["-m", "hpcrl.run", "--config", "configs/a3c_cartpole.toml",
                             "--set", "total_frames=2000", "--set", f"run_dir={run}",
                             "--set", "watchdog_s=30"],
                         env={"HPCRL_FREEZE_FINAL_RANK": "2"}, timeout=120)
    assert proc.returncode != 0
    assert "final evaluation: no word from rank 2 (actor-learner)" in proc.stdout + proc.stderr
    assert runfiles.checkpoint_generation(run)[1]["frames"] >= 2000   # the weights are saved


# --- a checkpoint does not wait for a periodic evaluation -------------------------------------

def test_the_interrupt_looks_every_16_steps_and_raises_once_a_checkpoint_is_due():
    from hpcrl.agents.evaluation import EvaluationInterrupted, interrupt_at_checkpoint

    polls, due = [], [False]

    def poll():
        polls.append(1)
        return due[0]

    on_step = interrupt_at_checkpoint(poll)
    for _ in range(47):
        on_step()
    assert len(polls) == 2                           # at steps 16 and 32
    due[0] = True
    with pytest.raises(EvaluationInterrupted):
        on_step()                                    # step 48: looks, and gives up
    assert len(polls) == 3


@pytest.mark.mpi
def test_a_stop_signal_during_a_long_evaluation_checkpoints_at_once(tmp_path):
    """A3C CartPole whose actor-learners spend nearly all their time in periodic evaluations
    (100,000 episodes after every 200 of their own steps, minutes each: 1,000 untrained
    CartPole episodes can end within the 2 s this test waits on a quiet machine): the stop
    signal's checkpoint comes within seconds, not after the evaluation in progress."""
    import re
    import time

    from tests.util import job_reported, mpiexec_path, stop_signal

    run = tmp_path / "run"
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcrl.run", "--config",
           "configs/a3c_cartpole.toml", "--set", f"run_dir={run}", "--set", "total_frames=10000000",
           "--set", "eval_every_frames=200", "--set", "eval_episodes=100000", "--set",
           "log_every_s=0.5"]
    env = dict(__import__("os").environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    # rank 1 evaluates from 100 of its own frames on, rank 2 from 200: at 300 frames both run
    # (one still importing under load would hold the checkpoint up on its own)
    deadline = time.monotonic() + 120
    while not job_reported(run, 300):
        assert job.poll() is None and time.monotonic() < deadline, "no progress to 300 frames"
        time.sleep(0.2)
    time.sleep(2.0)                                  # inside the evaluations
    job.send_signal(stop_signal())
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 85, out[-3000:]
    after = re.search(r"checkpoint generation 1 at frame [\d,]+: .* ([\d.]+) s after the signal",
                      out)
    assert after is not None, out[-3000:]
    assert float(after.group(1)) < 5.0, out[-3000:]
    assert read_metrics(run / "metrics.h5")["eval"]["return"].size == 0   # none finished yet
