"""``python -m hpcrl.bench actor|learner|scaling|checkpoint``: the agents' benchmarks.

Each compares the real code path with its bound measured in the same process and run, in
alternating blocks so that machine noise hits both alike:

* actor: agent steps/s of a Gorila actor on Pong (epsilon-greedy forward, env step, replay add,
  parameter pulls from a real RMA store every ``actor_sync_every`` steps) against
  ``bound_steps_per_s`` = 1 / (env step + batch-1 forward), timed as one loop of exactly those
  two calls (the emulator and the network evict each other's data from the caches, as in the
  actor); ``bound_separate_steps_per_s`` adds the two timed in separate loops (warm caches,
  optimistic) and ``fraction_of_separate_bound`` is the actor against that.
* scaling: A3C (or another asynchronous method) on Pong with 1 and with 2 actor-learners
  (plus one ps rank each) for a fixed wall time each, frames/s from the jobs' own metrics,
  ``speedup`` = frames/s(2) / frames/s(1), the jobs run in the order 1, 2, 1 and frames/s(1)
  the mean of the two (drift cancels); the ps's share of a core and its CPU ms per gradient
  (``ps_cpu_fraction_*``); and one actor-learner's agent steps/s against
  its bound 1 / (env step + forward + rollout gradient / 5), the three phases timed inside
  the running actor-learner over the same window (``HPCRL_PHASE_TIMES_DIR``, see
  ``hpcrl.runtime.profiling.PhaseClock``): ``fraction`` is the share of its wall time spent in
  them.
  The same bound timed offline in the bench process, between the jobs (env step and forward
  in one loop, as acting interleaves them; backward of a 5-step rollout), is reported as
  ``fraction_of_offline_bound``.
* scaling ``--envs-per-actor N`` (N > 1): batched actor-learners. The same layout (1 ps + 2
  actor-learners) with N environments per actor-learner against one each, jobs in the order
  one, batched, one: whole-job agent steps/s of both and ``batched_over_one_env``; each
  batched actor-learner's agent steps/s against its in-process bound (N env steps + one
  batched forward per agent step, one rollout gradient per t_max x N steps); and the raw
  costs of the same day (ALE frames/s, forward at batch 1 and N, rollout gradient).
* every scaling benchmark also times the raw bound (:mod:`hpcrl.bench.raw`: ALE alone on
  every core at once) before and after each job and reports the job's frames/s over it,
  ``raw_fraction`` (the batched job's, the 2-actor-learner job's, Gorila's), beside
  ``raw_fraction_one_env`` / ``raw_fraction_1`` for the comparison jobs.
* learner: Gorila learner updates/s (parameter pull, replay sample, DQN gradient, gradient push)
  against a pure torch loop (sample a batch from an in-memory array, forward, target forward,
  backward). The store lives on this one rank (COMM_SELF); the ps's apply runs on another rank
  in real jobs, so here the inbox is emptied in place after each push instead.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hpcrl.bench.raw import concurrent_raw_frames, n_cores, raw_figures
from hpcrl.runtime.profiling import PhaseClock

PHASES = PhaseClock.PHASES


def _rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def _self_store(n_params: int, theta: np.ndarray):
    from mpi4py import MPI

    from hpcrl.runtime.params.store import ParameterStore, StoreSpec

    store = ParameterStore(MPI.COMM_SELF, StoreSpec(n_params, (0,), (0,)))
    store.initialize(theta)
    return store


def _build(config: str | None, overrides: list[str], n_env: int = 1):
    """(cfg, env, net) of a config (None: the field defaults, Gorila's paper rule), one torch thread."""
    import torch

    from hpcrl.config import load_config
    from hpcrl.envs import make_env_from_config
    from hpcrl.rl.networks import build_network

    torch.set_num_threads(1)
    cfg = load_config(config, overrides)
    env = make_env_from_config(cfg, n_env, 0, training=True)
    return cfg, env, build_network(cfg, env.obs_shape, env.num_actions)


def _setup(game: str, overrides: list[str] = ()):
    from hpcrl.runtime.params.layout import ParamLayout

    cfg, env, net = _build(None, [f"game={game}", *overrides])
    return cfg, env, net, ParamLayout.from_module(net)


class _NullLink:
    """Stands in for the reporting channel to rank 0 (no rank 0 in a one-process bench)."""

    def episode(self, *args, **kwargs) -> None:
        pass


def bench_actor(game: str, steps: int, blocks: int) -> dict:
    """The real :class:`hpcrl.agents.gorila.actor.Actor` (local replay sink) against env step + forward."""
    import torch

    from hpcrl.agents.gorila.actor import Actor, LocalReplaySink
    from hpcrl.rl.replay import ReplayMemory

    cfg, env, net, layout = _setup(game)
    store = _self_store(layout.size, layout.to_flat(net))
    rng = np.random.default_rng(0)
    replay = ReplayMemory(steps * blocks * 3 + 10, env.frame_shape, np.uint8, 4, 0)
    actors = {k: Actor(cfg.replace(actor_sync_every=k, eval_every_frames=0), 0, store,
                       _NullLink(), LocalReplaySink([replay]), env=env, net=net)
              for k in (1, cfg.actor_sync_every)}
    obs = {"o": env.reset()}

    def env_only():
        obs["o"] = env.step(rng.integers(env.num_actions, size=1)).obs

    def forward_only():
        with torch.no_grad():
            net(torch.from_numpy(obs["o"]))

    def env_and_forward():      # the bound's two parts in one loop, caches shared as in acting
        forward_only()
        env_only()

    r = {"env": [], "fwd": [], "both": [], "paper": [], "default": []}
    for _ in range(blocks):
        r["env"].append(_rate(env_only, steps))
        r["fwd"].append(_rate(forward_only, steps))
        r["both"].append(_rate(env_and_forward, steps))
        r["paper"].append(_rate(actors[1].step, steps))
        r["default"].append(_rate(actors[cfg.actor_sync_every].step, steps))
    med = {k: float(np.median(v)) for k, v in r.items()}
    separate = 1.0 / (1.0 / med["env"] + 1.0 / med["fwd"])
    bound = med["both"]
    store.free()
    return {"bench": "actor", "game": game, "param_floats": layout.size,
            "env_steps_per_s": med["env"], "forward_per_s": med["fwd"],
            "bound_separate_steps_per_s": separate, "bound_steps_per_s": bound,
            "fraction_of_separate_bound": med["default"] / separate,
            "actor_steps_per_s_sync1": med["paper"], "fraction_sync1": med["paper"] / bound,
            "actor_sync_every_default": cfg.actor_sync_every,
            "actor_steps_per_s": med["default"], "fraction": med["default"] / bound}


def _plain_update(net, target, obs_all: np.ndarray, actions, rng, batch_size: int):
    """The plain torch DQN update that the bounds use: a batch from an in-memory array of
    stacked observations, online forward, target forward, backward."""
    import torch

    fill = len(obs_all)
    idx = rng.integers(fill, size=batch_size)
    q = net(torch.from_numpy(obs_all[idx])).gather(1, actions[idx][:, None])[:, 0]
    with torch.no_grad():
        q_t = target(torch.from_numpy(obs_all[(idx + 1) % fill])).max(1).values
    loss = ((q - 0.99 * q_t) ** 2).mean()
    net.zero_grad()
    loss.backward()


def _job_command(ranks: int, config: str, run_dir, launcher_args) -> list[str]:
    """mpiexec (the venv's when it has one) running ``config`` on ``ranks`` ranks with an
    endless budget, one metrics row per second, no periodic checkpoint and no periodic
    evaluation (a benchmark times training; the signal that ends it skips the final one)."""
    import sys
    from pathlib import Path

    mpiexec = Path(sys.executable).parent / "mpiexec"
    return [str(mpiexec) if mpiexec.exists() else "mpiexec", *launcher_args, "-n", str(ranks),
            sys.executable, "-m", "hpcrl.run", "--config", config,
            "--set", "total_frames=10000000000", "--set", f"run_dir={run_dir}",
            "--set", "checkpoint_every_min=0", "--set", "log_every_s=1",
            "--set", "eval_every_frames=0"]


def bench_learner(game: str, updates: int, blocks: int, fill: int,
                  precision: str = "float32") -> dict:
    """The Gorila learner's update (``learner_precision`` = ``precision``) against the plain
    float32 torch update, alternating blocks in one process."""
    import torch

    from hpcrl.agents.base import TargetNetwork
    from hpcrl.agents.gorila.learner import GorilaLearner
    from hpcrl.rl.networks import build_network
    from hpcrl.rl.replay import ReplayMemory
    from hpcrl.runtime.params.optim import ShardOptimizer
    from hpcrl.runtime.params.store import ShardServer

    cfg, env, net, layout = _setup(game, [f"learner_precision={precision}"])
    target = build_network(cfg, env.obs_shape, env.num_actions)
    theta = layout.to_flat(net)
    store = _self_store(layout.size, theta)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, size=(fill,) + env.frame_shape, dtype=np.uint8)
    replay = ReplayMemory(fill, env.frame_shape, np.uint8, 4, 0)
    firsts = np.zeros(fill, bool)
    firsts[::500] = True
    replay.add_batch(frames, rng.integers(env.num_actions, size=fill),
                     rng.normal(size=fill).astype(np.float32), np.zeros(fill, bool), firsts)
    learner = GorilaLearner(net, target, cfg.replace(outlier_k=0.0))
    targets = TargetNetwork(store, target)
    layout.bind(net, theta)
    server = ShardServer(store, ShardOptimizer("sgd", layout.size, 1), max_staleness=10**9,
                         target_update_every=0)

    def gradient_only():                    # replay sample + the learner's gradient
        learner.gradient(replay.sample(cfg.batch_size))

    def real_update():                      # the body of LearnerWorker.step, replay local
        versions = store.pull(theta)
        targets.refresh()
        grad = learner.gradient(replay.sample(cfg.batch_size))
        store.push(grad, versions, cfg.learning_rate)
        server.discard_inboxes()            # the ps's apply runs on another core in a job

    obs_all = rng.integers(0, 255, size=(fill,) + env.obs_shape, dtype=np.uint8)
    actions = torch.from_numpy(rng.integers(env.num_actions, size=fill))

    def torch_update():
        _plain_update(net, target, obs_all, actions, rng, cfg.batch_size)

    r = {"real": [], "torch": [], "gradient": []}
    for _ in range(blocks):
        r["torch"].append(_rate(torch_update, updates))
        r["gradient"].append(_rate(gradient_only, updates))
        r["real"].append(_rate(real_update, updates))
    med = {k: float(np.median(v)) for k, v in r.items()}
    replay84 = ReplayMemory(10_000, (84, 84), np.uint8, 4, 0)
    store.free()
    return {"bench": "learner", "game": game, "batch_size": cfg.batch_size,
            "learner_precision": precision,
            "learner_updates_per_s": med["real"], "torch_updates_per_s": med["torch"],
            "gradient_updates_per_s": med["gradient"],
            "fraction": med["real"] / med["torch"],
            "gradient_speedup_over_torch": med["gradient"] / med["torch"],
            "torch_runs": [round(x, 2) for x in r["torch"]],
            "gradient_runs": [round(x, 2) for x in r["gradient"]],
            "real_runs": [round(x, 2) for x in r["real"]],
            "bytes_per_transition": replay84.bytes_per_transition}


def _stop_with_parent() -> None:
    """In a benchmark's job launcher, before exec: SIGTERM it when the benchmark process dies
    (killed at a timeout, say), so its job checkpoints and ends instead of running on."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):     # not Linux: the job may outlive a killed benchmark
        pass


def _measure_job(algo: str, n_workers: int, seconds: float, warmup: float, run_dir,
                 overrides: list[str] = (), launcher_args: list[str] = ()) -> dict:
    """Run the algorithm's Pong config with 1 ps + ``n_workers`` actor-learners; frames/s over
    the window after ``warmup`` seconds, from the job's own metrics (train rows)."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    from hpcrl.io.metrics import read_metrics

    cmd = [*_job_command(n_workers + 1, f"configs/{algo}_pong.toml", run_dir, launcher_args),
           "--set", "n_ps=1",
           "--set", "checkpoint_replay=false"]
    for item in overrides:
        cmd += ["--set", item]
    times = Path(run_dir) / "phase_times"
    env = dict(os.environ, OMP_NUM_THREADS="1", HPCRL_PHASE_TIMES_DIR=str(times))
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           preexec_fn=_stop_with_parent)
    # the window starts once every actor-learner writes its phase times: start-up (imports,
    # network, environments) takes seconds on a quiet machine and far longer on a loaded one
    deadline = time.monotonic() + 300
    while len(list(times.glob("rank-*.jsonl"))) < n_workers and time.monotonic() < deadline:
        if job.poll() is not None:
            raise RuntimeError(f"the benchmark job exited with status {job.returncode}")
        time.sleep(0.5)
    time.sleep(warmup + seconds + 1)
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=120)
    train = read_metrics(Path(run_dir) / "metrics.h5")["train"]
    t, f = train["wall_time"], train["frames"]
    start = np.searchsorted(t, t[-1] - seconds)      # the last `seconds` of the run
    return {"frames_per_s": float((f[-1] - f[start]) / max(t[-1] - t[start], 1e-9)),
            "window_s": float(t[-1] - t[start]),
            "phases": [_phase_window(path, seconds) for path in sorted(times.glob("rank-*.jsonl"))],
            "ps": [_ps_window(path, seconds) for path in sorted(times.glob("ps-rank-*.jsonl"))]}


def _window_rows(path, seconds: float) -> tuple[dict, dict]:
    """The first and last rows of a cumulative JSON Lines clock file (rows ``{"t", ...}``)
    that span its last ``seconds`` (at least two rows apart when it has two)."""
    import json

    rows = [json.loads(line) for line in open(path)]
    t = np.array([r["t"] for r in rows])
    first = min(int(np.searchsorted(t, t[-1] - seconds)), len(rows) - 2)
    return rows[max(first, 0)], rows[-1]


def phase_fraction(first: dict, last: dict) -> dict:
    """Agent steps/s between two :class:`PhaseClock` rows, its bound and their ratio."""
    steps = last["agent_steps"] - first["agent_steps"]
    busy = sum(last[f"{k}_s"] - first[f"{k}_s"] for k in PHASES)
    wall = last["t"] - first["t"]
    return {"steps_per_s": steps / wall, "bound_steps_per_s": steps / busy,
            "fraction": busy / wall, "window_s": wall,
            **{f"{k}_ms_per_step": 1e3 * (last[f"{k}_s"] - first[f"{k}_s"]) / steps
               for k in PHASES}}


def _phase_window(path, seconds: float) -> dict:
    """An actor-learner's in-process bound over the last ``seconds`` of its PhaseClock rows."""
    return phase_fraction(*_window_rows(path, seconds))


def _ps_window(path, seconds: float) -> dict:
    """A ps rank's share of one core and its CPU ms per applied gradient over the last
    ``seconds`` (``hpcrl.runtime.profiling.ps_cpu_clock`` rows)."""
    a, b = _window_rows(path, seconds)
    cpu, applied = b["cpu_s"] - a["cpu_s"], b["applied"] - a["applied"]
    return {"cpu_fraction": cpu / max(b["t"] - a["t"], 1e-9),
            "cpu_ms_per_gradient": 1e3 * cpu / max(applied, 1)}


def _a3c_pong(n_env: int):
    """(env, net, obs) of ``configs/a3c_pong.toml`` with ``n_env`` environments."""
    _, env, net = _build("configs/a3c_pong.toml", [], n_env)
    return env, net, env.reset()


def _rollout_gradient(net, obs: np.ndarray, t_max: int):
    """A call that computes the A3C loss's gradient of a t_max x len(obs) rollout."""
    import torch

    from hpcrl.rl.losses import a3c_loss

    batch = torch.from_numpy(np.repeat(obs, t_max, axis=0))
    zeros = torch.zeros(len(batch))

    def backward():
        logits, values, _ = net(batch)
        loss = a3c_loss(logits, values, zeros.long(), zeros)["total"]
        net.zero_grad()
        loss.backward()
    return backward


def _a3c_bound(steps: int, t_max: int = 5) -> dict:
    """Agent steps/s bounds of an A3C actor-learner: 1 / (env step + batch-1 forward + backward
    of a t_max rollout / t_max). ``bound`` times env step and forward in one loop, as acting
    interleaves them (each evicts the other's data from the caches); ``bound_separate`` times
    them in separate loops (warm caches, optimistic), as ``bench actor`` reports both."""
    import torch

    env, net, obs = _a3c_pong(1)
    rng = np.random.default_rng(0)

    def env_step():
        env.step(rng.integers(env.num_actions, size=1))

    def forward():
        with torch.no_grad():
            net(torch.from_numpy(obs))

    def env_and_forward():
        env_step()
        forward()

    backward = _rollout_gradient(net, obs, t_max)
    t_env, t_fwd = 1 / _rate(env_step, steps), 1 / _rate(forward, steps)
    t_both = 1 / _rate(env_and_forward, steps)
    t_bwd = 1 / _rate(backward, max(steps // t_max, 10)) / t_max
    env.close()
    return {"bound": 1.0 / (t_both + t_bwd), "bound_separate": 1.0 / (t_env + t_fwd + t_bwd)}


def _raw_bounds(n_env: int, t_max: int = 5, reps: int = 200) -> dict:
    """The raw costs a reader needs to tell a slow day: ALE emulation alone (frames/s, no
    preprocessing), one agent step of the env driver, the A3C network's forward at batch 1
    and at batch ``n_env``, and forward + backward of a rollout of t_max x ``n_env`` states."""
    import ale_py
    import torch

    ale = ale_py.ALEInterface()
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(str(ale_py.roms.get_rom_path("pong")))
    actions = ale.getMinimalActionSet()
    rng = np.random.default_rng(0)

    def emulate():
        ale.act(actions[int(rng.integers(len(actions)))])
        if ale.game_over():
            ale.reset_game()

    env, net, obs = _a3c_pong(n_env)
    one, many = torch.from_numpy(obs[:1]), torch.from_numpy(obs)

    def forward(x):
        with torch.no_grad():
            net(x)

    out = {"ale_frames_per_s": _rate(emulate, 20 * reps),
           "env_ms_per_agent_step": 1e3 / _rate(lambda: env.step(
               rng.integers(env.num_actions, size=n_env)), max(reps // n_env, 20)) / n_env,
           "forward_ms_batch_1": 1e3 / _rate(lambda: forward(one), reps),
           f"forward_ms_batch_{n_env}": 1e3 / _rate(lambda: forward(many), reps),
           f"rollout_gradient_ms_{t_max}x{n_env}":
               1e3 / _rate(_rollout_gradient(net, obs, t_max), max(reps // 10, 10))}
    env.close()
    return out


def bench_batched(algo: str, n_env: int, n_workers: int, seconds: float, warmup: float,
                  overrides: list[str] = (), launcher_args: list[str] = ()) -> dict:
    """The whole job's agent steps/s with ``n_env`` environments per actor-learner against the
    same layout with one each, in the order one, batched, one (the mean of the two one-env
    jobs cancels a linear drift), and each batched actor-learner's rate as a fraction of its
    in-process bound (env steps + batched forwards + rollout gradients, timed in the job)."""
    import tempfile

    jobs, raws = [], [concurrent_raw_frames("pong", _raw_seconds(seconds))]
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate((1, n_env, 1)):
            jobs.append(_measure_job(algo, n_workers, seconds, warmup, f"{tmp}/job{i}",
                                     [*overrides, f"envs_per_actor={n}"], launcher_args))
            raws.append(concurrent_raw_frames("pong", _raw_seconds(seconds)))
    raw = _raw_bounds(n_env)
    frames_per_step = 4                                  # Pong: frame skip 4
    one = float(np.mean([jobs[0]["frames_per_s"], jobs[2]["frames_per_s"]])) / frames_per_step
    batched = jobs[1]["frames_per_s"] / frames_per_step
    phases = jobs[1]["phases"]

    def mean(key: str) -> float:
        return float(np.mean([p[key] for p in phases]))

    return {"bench": "scaling", "algo": algo, "envs_per_actor": n_env,
            "actor_learners": n_workers, "seconds": seconds, "overrides": list(overrides),
            "launcher_args": list(launcher_args),
            "agent_steps_per_s_one_env": one, "agent_steps_per_s_batched": batched,
            "batched_over_one_env": batched / one,
            "frames_per_s_one_env_runs": [round(j["frames_per_s"], 1) for j in (jobs[0], jobs[2])],
            "frames_per_s_batched": jobs[1]["frames_per_s"],
            "fraction": mean("fraction"), "fraction_runs": [round(p["fraction"], 4) for p in phases],
            "actor_learner_steps_per_s": mean("steps_per_s"),
            "bound_steps_per_s": mean("bound_steps_per_s"),
            "phase_ms_per_step": {k: round(mean(f"{k}_ms_per_step"), 4) for k in PHASES},
            "fraction_one_env": [round(p["fraction"], 4) for j in (jobs[0], jobs[2])
                                 for p in j["phases"]],
            "ps_cpu_fraction_batched": [round(p["cpu_fraction"], 3) for p in jobs[1]["ps"]],
            **raw_figures(jobs[1]["frames_per_s"], raws),
            "raw_fraction_one_env": one * frames_per_step / float(np.median(raws)),
            **{k: round(v, 4) for k, v in raw.items()}}


def bench_scaling(algo: str, seconds: float, warmup: float, overrides: list[str] = (),
                  launcher_args: list[str] = ()) -> dict:
    """frames/s with 1 and 2 actor-learners (plus one ps each), same config, in the order
    1, 2, 1: ``speedup`` divides by the mean of the two 1-actor-learner jobs, so a machine
    that drifts linearly in speed over the bench (its offline bound moved by 6-24 % between
    timings minutes apart) does not bias the ratio either way."""
    import tempfile

    # The offline bound is timed before, between and after the jobs; the median is used.
    blocks = [_a3c_bound(300)]
    jobs, raws = [], [concurrent_raw_frames("pong", _raw_seconds(seconds))]
    with tempfile.TemporaryDirectory() as tmp:
        for i, n_workers in enumerate((1, 2, 1)):
            jobs.append(_measure_job(algo, n_workers, seconds, warmup, f"{tmp}/job{i}",
                                     overrides, launcher_args))
            blocks.append(_a3c_bound(300))
            raws.append(concurrent_raw_frames("pong", _raw_seconds(seconds)))
    bounds = {k: float(np.median([b[k] for b in blocks])) for k in blocks[0]}
    ones, two = [jobs[0], jobs[2]], jobs[1]
    fps_1 = float(np.mean([j["frames_per_s"] for j in ones]))
    phases_1 = [j["phases"][0] for j in ones]       # the one actor-learner of each 1-job

    def mean_phase(key: str, phases: list[dict]) -> float:
        return float(np.mean([p[key] for p in phases]))

    steps_one = fps_1 / 4                              # Pong: 4 frames per agent step
    return {"bench": "scaling", "algo": algo, "seconds": seconds, "overrides": list(overrides),
            "launcher_args": list(launcher_args),
            "frames_per_s_1": fps_1, "frames_per_s_2": two["frames_per_s"],
            "speedup": two["frames_per_s"] / fps_1,
            "frames_per_s_1_runs": [round(j["frames_per_s"], 1) for j in ones],
            "actor_learner_steps_per_s": mean_phase("steps_per_s", phases_1),
            "bound_steps_per_s": mean_phase("bound_steps_per_s", phases_1),
            "fraction": mean_phase("fraction", phases_1),
            "fraction_runs": [round(p["fraction"], 4) for p in phases_1],
            "phase_ms_per_step": {k: round(mean_phase(f"{k}_ms_per_step", phases_1), 4)
                                  for k in ("env", "forward", "learn")},
            "fraction_2": [round(p["fraction"], 4) for p in two["phases"]],
            "phase_ms_per_step_2": {k: round(mean_phase(f"{k}_ms_per_step", two["phases"]), 4)
                                    for k in ("env", "forward", "learn")},
            "ps_cpu_fraction_1": [round(p["cpu_fraction"], 3) for j in ones for p in j["ps"]],
            "ps_cpu_fraction_2": [round(p["cpu_fraction"], 3) for p in two["ps"]],
            "ps_cpu_ms_per_gradient_2": [round(p["cpu_ms_per_gradient"], 3) for p in two["ps"]],
            "offline_bound_steps_per_s": bounds["bound"],
            "fraction_of_offline_bound": steps_one / bounds["bound"],
            "offline_bound_blocks_steps_per_s": [round(b["bound"], 1) for b in blocks],
            "offline_bound_separate_steps_per_s": bounds["bound_separate"],
            "fraction_of_offline_separate_bound": steps_one / bounds["bound_separate"],
            **raw_figures(two["frames_per_s"], raws),
            "raw_fraction_1": fps_1 / float(np.median(raws))}


def _gorila_job(ranks: int, seconds: float, warmup: float, run_dir, overrides: list[str],
                launcher_args: list[str]) -> dict:
    """Run ``configs/gorila_pong.toml`` on ``ranks`` ranks; updates/s and agent steps/s of the
    whole job (its own train rows) over ``seconds`` that start ``warmup`` seconds after the ps
    applied its first update (after the replay fill)."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    from hpcrl.io.metrics import MetricsError, read_metrics

    cmd = [*_job_command(ranks, "configs/gorila_pong.toml", run_dir, launcher_args),
           "--set", "checkpoint_replay=false",
           "--set", "replay_capacity=30000", "--set", "replay_min_fill=4000"]
    for item in overrides:
        cmd += ["--set", item]
    log = open(Path(run_dir).parent / (Path(run_dir).name + ".log"), "w")
    job = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=log,
                           stderr=subprocess.STDOUT, preexec_fn=_stop_with_parent)
    metrics = Path(run_dir) / "metrics.h5"
    deadline, started = time.monotonic() + 600, None
    while started is None and time.monotonic() < deadline:
        time.sleep(2.0)
        if job.poll() is not None:
            raise RuntimeError(f"the benchmark job exited with status {job.returncode} "
                               f"(log: {log.name})")
        try:
            train = read_metrics(metrics)["train"]
        except (MetricsError, OSError, KeyError, ValueError):
            continue                      # not written yet
        if len(train["updates"]) and train["updates"][-1] > 0:
            started = float(train["wall_time"][np.argmax(train["updates"] > 0)])
    if started is None:
        job.kill()
        raise RuntimeError("the benchmark job applied no update within 10 minutes")
    while True:
        train = read_metrics(metrics)["train"]
        if train["wall_time"][-1] >= started + warmup + seconds:
            break
        time.sleep(2.0)
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=120)
    train = read_metrics(metrics)["train"]
    t = train["wall_time"]
    a, b = np.searchsorted(t, started + warmup), np.searchsorted(t, started + warmup + seconds)
    b = min(b, len(t) - 1)
    wall = float(t[b] - t[a])
    return {"updates_per_s": float(train["updates"][b] - train["updates"][a]) / wall,
            "agent_steps_per_s": float(train["frames"][b] - train["frames"][a]) / 4 / wall,
            "window_s": wall,
            "dropped_stale": int(train["dropped_stale"][b] - train["dropped_stale"][a])}


def kernel_loop(update_every: int, seconds: float, seed: int) -> dict:
    """The Gorila job's two compute kernels at its replay ratio and nothing else: one plain
    torch DQN update (sample a batch from an array, online forward, target forward, backward)
    per ``update_every`` acting steps (Pong env step + batch-1 forward), for ``seconds``.
    No MPI, replay memory or parameter server. Returns updates/s."""
    import torch

    from hpcrl.rl.networks import NatureQNetwork

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    cfg, env, net = _build(None, ["game=pong"])
    target = NatureQNetwork(env.obs_shape, env.num_actions)
    rng = np.random.default_rng(seed)
    fill = 5000
    obs_all = rng.integers(0, 255, size=(fill,) + env.obs_shape, dtype=np.uint8)
    actions = torch.from_numpy(rng.integers(env.num_actions, size=fill))
    obs = env.reset()

    def update():
        _plain_update(net, target, obs_all, actions, rng, cfg.batch_size)

    def act(obs):
        with torch.no_grad():
            net(torch.from_numpy(obs))
        return env.step(rng.integers(env.num_actions, size=1)).obs

    update()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(update_every):
            obs = act(obs)
        update()
        n += 1
    return {"updates_per_s": n / (time.perf_counter() - t0)}


def concurrent_bound(n_procs: int, update_every: int, seconds: float) -> float:
    """Updates/s of ``n_procs`` :func:`kernel_loop` processes run at the same time (one per
    core), summed: what the cores do together, memory bandwidth and caches shared as in a job."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json, sys; from hpcrl.bench.agents import kernel_loop; "
            "print(json.dumps(kernel_loop(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))))")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(update_every), str(seconds), str(i)],
                              stdout=subprocess.PIPE, text=True, env=env) for i in range(n_procs)]
    rates = [json.loads(p.communicate()[0].strip().splitlines()[-1])["updates_per_s"] for p in procs]
    return float(sum(rates))


def _raw_seconds(seconds: float) -> float:
    """How long each timing of the raw bound runs: a sixth of a job's window, 2 s at least."""
    return max(2.0, seconds / 6)


def bench_gorila_scaling(ranks: int, runs: int, seconds: float, warmup: float,
                         overrides: list[str] = (), launcher_args: list[str] = ()) -> dict:
    """Gorila on Pong, the whole job against its compute bound.

    The bound is what the machine's cores do when they run only the job's two compute kernels
    at its replay ratio: one process per core, each a plain torch DQN update (sample from an
    array, online forward, target forward, backward) per ``update_every`` acting steps (env
    step + batch-1 forward; ``split_update_every`` in split mode), all at the same time, their
    updates/s summed (:func:`concurrent_bound`). It is timed before, between and after the
    jobs (median), nothing else running; ``fraction`` = the job's updates/s / the bound. The
    learner's own update (replay sample + ``GorilaLearner.gradient``) is timed against the
    plain torch update in alternating blocks in one process: ``learner_speedup_over_torch``.
    """
    import tempfile

    from hpcrl.config import load_config

    cfg = load_config("configs/gorila_pong.toml", list(overrides))
    every = cfg.split_update_every if cfg.mode == "split" else cfg.update_every
    if not every:
        raise SystemExit("bench scaling --algo gorila: split mode needs split_update_every > 0 "
                         "(the bound assumes a fixed replay ratio)")
    cores = n_cores()
    bound_s = max(10.0, seconds / 3)
    bounds = [concurrent_bound(cores, every, bound_s)]
    raws = [concurrent_raw_frames("pong", _raw_seconds(seconds))]
    offline = [bench_learner("pong", 20, 3, 5000, cfg.learner_precision)]
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            jobs.append(_gorila_job(ranks, seconds, warmup, f"{tmp}/job{i}", list(overrides),
                                    list(launcher_args)))
            bounds.append(concurrent_bound(cores, every, bound_s))
            raws.append(concurrent_raw_frames("pong", _raw_seconds(seconds)))
            offline.append(bench_learner("pong", 20, 3, 5000, cfg.learner_precision))
    bound = float(np.median(bounds))
    torch_rate = float(np.median([o["torch_updates_per_s"] for o in offline]))
    grad_rate = float(np.median([o["gradient_updates_per_s"] for o in offline]))
    ups = [j["updates_per_s"] for j in jobs]
    return {"bench": "scaling", "algo": "gorila", "ranks": ranks, "mode": cfg.mode,
            "learner_precision": cfg.learner_precision,
            "overrides": list(overrides), "cores": cores, "update_every": every,
            "seconds": seconds,
            "job_updates_per_s": float(np.median(ups)),
            "job_agent_steps_per_s": float(np.median([j["agent_steps_per_s"] for j in jobs])),
            "bound_updates_per_s": bound, "bound_agent_steps_per_s": bound * every,
            "bound_runs": [round(b, 2) for b in bounds],
            "fraction": float(np.median(ups)) / bound,
            "fraction_runs": [round(u / bound, 4) for u in ups],
            "job_updates_per_s_runs": [round(u, 2) for u in ups],
            "dropped_stale": [j["dropped_stale"] for j in jobs],
            "torch_updates_per_s": torch_rate, "learner_updates_per_s": grad_rate,
            "learner_speedup_over_torch": grad_rate / torch_rate,
            "learner_speedup_runs": [round(o["gradient_updates_per_s"] / o["torch_updates_per_s"], 4)
                                     for o in offline],
            "learner_with_pull_push_updates_per_s":
                float(np.median([o["learner_updates_per_s"] for o in offline])),
            **raw_figures(4 * float(np.median([j["agent_steps_per_s"] for j in jobs])), raws)}


def bench_checkpoint(transitions: int, out_dir: str | None) -> dict:
    """Write and read back one Gorila bundle's checkpoint file for Pong: a replay memory holding
    ``transitions`` 84x84 transitions (random frames: incompressible, as real ones are to us) and
    a Nature-DQN-sized shard with AdaGrad state. Extrapolates the write to 1 M transitions."""
    import tempfile
    from pathlib import Path

    from hpcrl.io import checkpoint as ck
    from hpcrl.rl.replay import ReplayMemory

    rng = np.random.default_rng(0)
    replay = ReplayMemory(transitions, (84, 84), np.uint8, 4, 0)
    chunk = 10_000
    for start in range(0, transitions, chunk):
        n = min(chunk, transitions - start)
        firsts = np.zeros(n, bool)
        firsts[::1000] = True
        replay.add_batch(rng.integers(0, 256, (n, 84, 84), np.uint8), rng.integers(0, 6, n),
                         rng.normal(size=n).astype(np.float32), np.zeros(n, bool), firsts)
    n_params = 1_687_206
    state = {**{f"replay0/{k}": v for k, v in replay.get_state().items()},
             "params": rng.normal(size=n_params).astype(np.float32),
             "target": rng.normal(size=n_params).astype(np.float32),
             "opt/G": rng.random(n_params).astype(np.float32)}
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        path = Path(tmp) / "rank-00001.h5"
        t0 = time.perf_counter()
        entry = ck.write_state(path, state)           # tmp, flush, fsync, rename, fsync dir
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ck.read_state(path)
        read_s = time.perf_counter() - t0
    nbytes = entry["bytes"]
    per_transition = (nbytes - 3 * n_params * 4) / transitions
    bytes_1m = per_transition * 1_000_000 + 3 * n_params * 4
    return {"bench": "checkpoint", "transitions": transitions, "file_bytes": nbytes,
            "write_s": write_s, "read_s": read_s, "write_mb_per_s": nbytes / write_s / 1e6,
            "bytes_per_transition_on_disk": per_transition, "bytes_1m_transitions": bytes_1m,
            "write_s_1m_transitions_estimate": bytes_1m / (nbytes / write_s)}


def main(what: str, argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m hpcrl.bench {what}")
    p.add_argument("--game", default="pong")
    p.add_argument("--steps", type=int, default=400, help="actor: agent steps per block")
    p.add_argument("--updates", type=int, default=20, help="learner: updates per block")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--fill", type=int, default=5000, help="learner: replay transitions")
    p.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                   help="learner: the learner's learner_precision (the plain loop: float32)")
    p.add_argument("--algo", default="a3c", help="scaling: algorithm (its <algo>_pong config)")
    p.add_argument("--seconds", type=float, default=60.0, help="scaling: measured window")
    p.add_argument("--warmup", type=float, default=15.0, help="scaling: seconds skipped")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="scaling: config overrides for both jobs (e.g. optimizer=sgd)")
    p.add_argument("--launcher-args", default="",
                   help="scaling: extra mpiexec arguments, e.g. '-bind-to core'")
    p.add_argument("--envs-per-actor", type=int, default=1,
                   help="scaling: > 1 compares actor-learners stepping this many environments "
                   "each with one environment each (same layout, same run)")
    p.add_argument("--actor-learners", type=int, default=2,
                   help="scaling with --envs-per-actor: actor-learner ranks per job")
    p.add_argument("--ranks", type=int, default=3,
                   help="scaling --algo gorila: ranks of the job (default 3: 1 ps + 2 bundles)")
    p.add_argument("--runs", type=int, default=1,
                   help="scaling --algo gorila: jobs, each between two timings of the bound")
    p.add_argument("--transitions", type=int, default=100_000, help="checkpoint: replay size")
    p.add_argument("--dir", default=None, help="checkpoint: where to write (default: tmp)")
    args = p.parse_args(argv)
    if what == "checkpoint":
        return bench_checkpoint(args.transitions, args.dir)
    if what == "scaling" and args.algo == "gorila":
        return bench_gorila_scaling(args.ranks, args.runs, args.seconds, args.warmup, args.set,
                                    args.launcher_args.split())
    if what == "scaling" and args.envs_per_actor > 1:
        return bench_batched(args.algo, args.envs_per_actor, args.actor_learners, args.seconds,
                             args.warmup, args.set, args.launcher_args.split())
    if what == "scaling":         # one environment per actor-learner, whatever the config says
        return bench_scaling(args.algo, args.seconds, args.warmup,
                             ["envs_per_actor=1", *args.set], args.launcher_args.split())
    if what == "actor":
        return bench_actor(args.game, args.steps, args.blocks)
    if what == "learner":
        return bench_learner(args.game, args.updates, args.blocks, args.fill, args.precision)
    raise SystemExit(f"unknown benchmark {what!r}: choose ps, actor or learner")
