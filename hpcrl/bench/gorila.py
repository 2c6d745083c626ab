"""``python -m hpcrl.bench scaling --algo gorila``: the Gorila job on Pong against its compute
bound (what the cores do running only the job's two kernels at its replay ratio, one process
per core) and its raw bound (:mod:`hpcrl.bench.raw`), with the learner's own update against
the plain torch update in the same process."""

from __future__ import annotations

import time

import numpy as np

from hpcrl.bench.components import bench_learner, build, plain_update
from hpcrl.bench.jobs import job_command, raw_seconds, stop_with_parent
from hpcrl.bench.raw import concurrent_raw_frames, n_cores, raw_figures


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

    cmd = [*job_command(ranks, "configs/gorila_pong.toml", run_dir, launcher_args),
           "--set", "checkpoint_replay=false",
           "--set", "replay_capacity=30000", "--set", "replay_min_fill=4000"]
    for item in overrides:
        cmd += ["--set", item]
    log = open(Path(run_dir).parent / (Path(run_dir).name + ".log"), "w")
    job = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=log,
                           stderr=subprocess.STDOUT, preexec_fn=stop_with_parent)
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
    cfg, env, net = build(None, ["game=pong"])
    target = NatureQNetwork(env.obs_shape, env.num_actions)
    rng = np.random.default_rng(seed)
    fill = 5000
    obs_all = rng.integers(0, 255, size=(fill,) + env.obs_shape, dtype=np.uint8)
    actions = torch.from_numpy(rng.integers(env.num_actions, size=fill))
    obs = env.reset()

    def update():
        plain_update(net, target, obs_all, actions, rng, cfg.batch_size)

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

    code = ("import json, sys; from hpcrl.bench.gorila import kernel_loop; "
            "print(json.dumps(kernel_loop(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))))")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(update_every), str(seconds), str(i)],
                              stdout=subprocess.PIPE, text=True, env=env) for i in range(n_procs)]
    rates = [json.loads(p.communicate()[0].strip().splitlines()[-1])["updates_per_s"] for p in procs]
    return float(sum(rates))


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
    # The job acts at its final epsilon from the start, as a run does after its first
    # epsilon_frames: the bound runs a forward every acting step, and an actor still exploring
    # skips the forward on the steps where every environment explores (epsilon_greedy_lazy).
    overrides = [f"epsilon_start={cfg.epsilon_end}", *overrides]
    cores = n_cores()
    bound_s = max(10.0, seconds / 3)
    bounds = [concurrent_bound(cores, every, bound_s)]
    raws = [concurrent_raw_frames("pong", raw_seconds(seconds))]
    offline = [bench_learner("pong", 20, 3, 5000, cfg.learner_precision)]
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            jobs.append(_gorila_job(ranks, seconds, warmup, f"{tmp}/job{i}", list(overrides),
                                    list(launcher_args)))
            bounds.append(concurrent_bound(cores, every, bound_s))
            raws.append(concurrent_raw_frames("pong", raw_seconds(seconds)))
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
