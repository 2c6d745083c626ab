"""``python -m hpcrl.bench scaling`` for A3C (or another asynchronous method) on Pong:

* one environment per actor-learner: 1 and 2 actor-learners (plus one ps rank each) for a
  fixed wall time each, frames/s from the jobs' own metrics, ``speedup`` = frames/s(2) /
  frames/s(1), the jobs run in the order 1, 2, 1 and frames/s(1) the mean of the two (drift
  cancels); the ps's share of a core and its CPU ms per gradient (``ps_cpu_fraction_*``); and
  one actor-learner's agent steps/s against its bound 1 / (env step + forward + rollout
  gradient / 5), the three phases timed inside the running actor-learner over the same window:
  ``fraction`` is the share of its wall time spent in them. The same bound timed offline in
  the bench process, between the jobs (env step and forward in one loop, as acting
  interleaves them; backward of a 5-step rollout), is reported as
  ``fraction_of_offline_bound``.
* ``--envs-per-actor N`` (N > 1): batched actor-learners. The same layout (1 ps + 2
  actor-learners) with N environments per actor-learner against one each, jobs in the order
  one, batched, one: whole-job agent steps/s of both and ``batched_over_one_env``; each
  batched actor-learner's agent steps/s against its in-process bound (N env steps + one
  batched forward per agent step, one rollout gradient per t_max x N steps); and the raw
  costs of the same day (ALE frames/s, forward at batch 1 and N, rollout gradient).
* both also time the raw bound (:mod:`hpcrl.bench.raw`: ALE alone on every core at once)
  before and after each job and report the job's frames/s over it, ``raw_fraction`` (the
  batched job's, the 2-actor-learner job's), beside ``raw_fraction_one_env`` /
  ``raw_fraction_1`` for the comparison jobs; the batched bench also reports
  ``raw_fraction_ceiling`` (:func:`hpcrl.bench.raw.raw_fraction_ceiling`: the raw_fraction
  its network as timed in the job leaves room for, with an environment step that cost only
  its emulator frames).
"""

from __future__ import annotations

import numpy as np

from hpcrl.bench.components import build, rate
from hpcrl.bench.jobs import PHASES, measure_job, raw_seconds
from hpcrl.bench.raw import concurrent_raw_frames, n_cores, raw_figures, raw_fraction_ceiling


def _a3c_pong(n_env: int):
    """(env, net, obs) of ``configs/a3c_pong.toml`` with ``n_env`` environments."""
    _, env, net = build("configs/a3c_pong.toml", [], n_env)
    return env, net, env.reset()


def rollout_gradient(net, obs: np.ndarray, t_max: int):
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

    backward = rollout_gradient(net, obs, t_max)
    t_env, t_fwd = 1 / rate(env_step, steps), 1 / rate(forward, steps)
    t_both = 1 / rate(env_and_forward, steps)
    t_bwd = 1 / rate(backward, max(steps // t_max, 10)) / t_max
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

    out = {"ale_frames_per_s": rate(emulate, 20 * reps),
           "env_ms_per_agent_step": 1e3 / rate(lambda: env.step(
               rng.integers(env.num_actions, size=n_env)), max(reps // n_env, 20)) / n_env,
           "forward_ms_batch_1": 1e3 / rate(lambda: forward(one), reps),
           f"forward_ms_batch_{n_env}": 1e3 / rate(lambda: forward(many), reps),
           f"rollout_gradient_ms_{t_max}x{n_env}":
               1e3 / rate(rollout_gradient(net, obs, t_max), max(reps // 10, 10))}
    env.close()
    return out


def bench_batched(algo: str, n_env: int, n_workers: int, seconds: float, warmup: float,
                  overrides: list[str] = (), launcher_args: list[str] = ()) -> dict:
    """The whole job's agent steps/s with ``n_env`` environments per actor-learner against the
    same layout with one each, in the order one, batched, one (the mean of the two one-env
    jobs cancels a linear drift), and each batched actor-learner's rate as a fraction of its
    in-process bound (env steps + batched forwards + rollout gradients, timed in the job)."""
    import tempfile

    jobs, raws = [], [concurrent_raw_frames("pong", raw_seconds(seconds))]
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate((1, n_env, 1)):
            jobs.append(measure_job(algo, n_workers, seconds, warmup, f"{tmp}/job{i}",
                                     [*overrides, f"envs_per_actor={n}"], launcher_args))
            raws.append(concurrent_raw_frames("pong", raw_seconds(seconds)))
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
            "raw_fraction_ceiling": raw_fraction_ceiling(
                float(np.median(raws)), n_cores(), frames_per_step,
                mean("forward_ms_per_step") + mean("learn_ms_per_step")),
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
    jobs, raws = [], [concurrent_raw_frames("pong", raw_seconds(seconds))]
    with tempfile.TemporaryDirectory() as tmp:
        for i, n_workers in enumerate((1, 2, 1)):
            jobs.append(measure_job(algo, n_workers, seconds, warmup, f"{tmp}/job{i}",
                                     overrides, launcher_args))
            blocks.append(_a3c_bound(300))
            raws.append(concurrent_raw_frames("pong", raw_seconds(seconds)))
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
