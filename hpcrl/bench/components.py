"""One-process benchmarks of the Gorila agent's parts, each against its bound timed in the
same process in alternating blocks (machine noise hits both alike), and of a bundle's
checkpoint:

* actor: agent steps/s of a Gorila actor on Pong (epsilon-greedy forward, env step, replay add,
  parameter pulls from a real RMA store every ``actor_sync_every`` steps) against
  ``bound_steps_per_s`` = 1 / (env step + batch-1 forward), timed as one loop of exactly those
  two calls (the emulator and the network evict each other's data from the caches, as in the
  actor); ``bound_separate_steps_per_s`` adds the two timed in separate loops (warm caches,
  optimistic) and ``fraction_of_separate_bound`` is the actor against that.
* learner: Gorila learner updates/s (parameter pull, replay sample, DQN gradient, gradient push)
  against a pure torch loop (sample a batch from an in-memory array, forward, target forward,
  backward). The store lives on this one rank (COMM_SELF); the ps's apply runs on another rank
  in real jobs, so here the inbox is emptied in place after each push instead.
* checkpoint: one bundle's checkpoint file written and read back.

Also the helpers the job benchmarks share (:func:`rate`, :func:`build`, :func:`plain_update`).
"""

from __future__ import annotations

import time

import numpy as np


def rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def self_store(n_params: int, theta: np.ndarray):
    from mpi4py import MPI

    from hpcrl.runtime.params.store import ParameterStore, StoreSpec

    store = ParameterStore(MPI.COMM_SELF, StoreSpec(n_params, (0,), (0,)))
    store.initialize(theta)
    return store


def build(config: str | None, overrides: list[str], n_env: int = 1):
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

    cfg, env, net = build(None, [f"game={game}", *overrides])
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
    store = self_store(layout.size, layout.to_flat(net))
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
        r["env"].append(rate(env_only, steps))
        r["fwd"].append(rate(forward_only, steps))
        r["both"].append(rate(env_and_forward, steps))
        r["paper"].append(rate(actors[1].step, steps))
        r["default"].append(rate(actors[cfg.actor_sync_every].step, steps))
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


def plain_update(net, target, obs_all: np.ndarray, actions, rng, batch_size: int):
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
    from hpcrl.runtime.params.server import ShardServer

    cfg, env, net, layout = _setup(game, [f"learner_precision={precision}"])
    target = build_network(cfg, env.obs_shape, env.num_actions)
    theta = layout.to_flat(net)
    store = self_store(layout.size, theta)
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
        grad = learner.gradient(replay.sample(cfg.batch_size), targets.pulls)
        store.push(grad, versions, cfg.learning_rate)
        server.discard_inboxes()            # the ps's apply runs on another core in a job

    obs_all = rng.integers(0, 255, size=(fill,) + env.obs_shape, dtype=np.uint8)
    actions = torch.from_numpy(rng.integers(env.num_actions, size=fill))

    def torch_update():
        plain_update(net, target, obs_all, actions, rng, cfg.batch_size)

    r = {"real": [], "torch": [], "gradient": []}
    for _ in range(blocks):
        r["torch"].append(rate(torch_update, updates))
        r["gradient"].append(rate(gradient_only, updates))
        r["real"].append(rate(real_update, updates))
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
