"""Actor and learner benchmarks (``python -m hpcrl.bench actor|learner``), one process.

Both compare the real code path with its bound measured in the same process and run, in
alternating blocks so that machine noise hits both alike:

* actor: agent steps/s of a Gorila actor on Pong (epsilon-greedy forward, env step, replay add,
  parameter pulls from a real RMA store every ``actor_sync_every`` steps) against
  ``bound_steps_per_s = 1 / (env step + batch-1 forward)``.
* learner: Gorila learner updates/s (parameter pull, replay sample, DQN gradient, gradient push)
  against a pure torch loop (sample a batch from an in-memory array, forward, target forward,
  backward). The store lives on this one rank (COMM_SELF); the ps's apply runs on another rank
  in real jobs, so here the inbox is emptied in place after each push instead.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def _self_store(n_params: int, theta: np.ndarray):
    from mpi4py import MPI

    from hpcrl.params.store import ParameterStore, StoreSpec

    store = ParameterStore(MPI.COMM_SELF, StoreSpec(n_params, (0,), (0,)))
    store.initialize(theta)
    return store


def _setup(game: str):
    import torch

    from hpcrl.config import load_config
    from hpcrl.envs import make_env
    from hpcrl.networks import ParamLayout
    from hpcrl.program import build_network, env_kwargs

    torch.set_num_threads(1)
    cfg = load_config(None, [f"game={game}"])
    env = make_env(cfg.game, 1, 0, **env_kwargs(cfg, training=True))
    net = build_network(cfg, env.obs_shape, env.num_actions)
    layout = ParamLayout.from_module(net)
    return cfg, env, net, layout


class _NullLink:
    """Stands in for the reporting channel to rank 0 (no rank 0 in a one-process bench)."""

    def episode(self, *args, **kwargs) -> None:
        pass


def bench_actor(game: str, steps: int, blocks: int) -> dict:
    """The real :class:`hpcrl.gorila.Actor` (local replay sink) against env step + forward."""
    import torch

    from hpcrl.gorila import Actor, LocalReplaySink
    from hpcrl.replay import ReplayMemory

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

    r = {"env": [], "fwd": [], "paper": [], "default": []}
    for _ in range(blocks):
        r["env"].append(_rate(env_only, steps))
        r["fwd"].append(_rate(forward_only, steps))
        r["paper"].append(_rate(actors[1].step, steps))
        r["default"].append(_rate(actors[cfg.actor_sync_every].step, steps))
    med = {k: float(np.median(v)) for k, v in r.items()}
    bound = 1.0 / (1.0 / med["env"] + 1.0 / med["fwd"])
    store.free()
    return {"bench": "actor", "game": game, "param_floats": layout.size,
            "env_steps_per_s": med["env"], "forward_per_s": med["fwd"],
            "bound_steps_per_s": bound,
            "actor_steps_per_s_sync1": med["paper"], "fraction_sync1": med["paper"] / bound,
            "actor_sync_every_default": cfg.actor_sync_every,
            "actor_steps_per_s": med["default"], "fraction": med["default"] / bound}


def bench_learner(game: str, updates: int, blocks: int, fill: int) -> dict:
    import torch

    from hpcrl.gorila import GorilaLearner, TargetTracker
    from hpcrl.params.store import HDR_WORDS
    from hpcrl.program import build_network
    from hpcrl.replay import ReplayMemory

    cfg, env, net, layout = _setup(game)
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
    targets = TargetTracker(store, target, layout)
    layout.bind(net, theta)

    def real_update():                                  # the body of gorila.run_learner
        versions = store.pull(theta)
        targets.refresh()
        grad = learner.gradient(replay.sample(cfg.batch_size))
        store.push(grad, versions, cfg.learning_rate)
        store._atomic(0, HDR_WORDS, 0)                 # inbox emptied (ps work is elsewhere)

    obs_all = rng.integers(0, 255, size=(fill,) + env.obs_shape, dtype=np.uint8)
    actions = torch.from_numpy(rng.integers(env.num_actions, size=fill))

    def torch_update():
        idx = rng.integers(fill, size=cfg.batch_size)
        s_tm1 = torch.from_numpy(obs_all[idx])
        s_t = torch.from_numpy(obs_all[(idx + 1) % fill])
        q = net(s_tm1).gather(1, actions[idx][:, None])[:, 0]
        with torch.no_grad():
            q_t = target(s_t).max(1).values
        loss = ((q - 0.99 * q_t) ** 2).mean()
        net.zero_grad()
        loss.backward()

    r = {"real": [], "torch": []}
    for _ in range(blocks):
        r["torch"].append(_rate(torch_update, updates))
        r["real"].append(_rate(real_update, updates))
    med = {k: float(np.median(v)) for k, v in r.items()}
    replay84 = ReplayMemory(10_000, (84, 84), np.uint8, 4, 0)
    store.free()
    return {"bench": "learner", "game": game, "batch_size": cfg.batch_size,
            "learner_updates_per_s": med["real"], "torch_updates_per_s": med["torch"],
            "fraction": med["real"] / med["torch"],
            "bytes_per_transition": replay84.bytes_per_transition}


def main(what: str, argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m hpcrl.bench {what}")
    p.add_argument("--game", default="pong")
    p.add_argument("--steps", type=int, default=400, help="actor: agent steps per block")
    p.add_argument("--updates", type=int, default=20, help="learner: updates per block")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--fill", type=int, default=5000, help="learner: replay transitions")
    args = p.parse_args(argv)
    if what == "actor":
        return bench_actor(args.game, args.steps, args.blocks)
    if what == "learner":
        return bench_learner(args.game, args.updates, args.blocks, args.fill)
    raise SystemExit(f"unknown benchmark {what!r}: choose ps, actor or learner")
