"""Wiring: build each role's parts and run them (acme's ``make_distributed_experiment`` shape).

Call order on every rank (collective steps marked *):

    run dir prepared by rank 0, outcome broadcast *     -> one-line error on all ranks if unusable
    network built on the first client, size broadcast *
    ParameterStore created *, initialised from the first client's parameters *
    role loop: ps -> ShardServer.serve (rank 0 also gathers metrics); clients -> algorithm loop
    store freed *

ps ranks never import torch (about 155 MB per rank; ARCHITECTURE.md §8).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from hpcrl import __version__
from hpcrl.config import Config, ConfigError, to_toml
from hpcrl.params.store import ParameterStore, ShardServer, StoreSpec
from hpcrl.topology import Layout, Role

# Messages from clients to rank 0 (float64 rows on a dedicated communicator).
TAG_EPISODE, TAG_STATS, TAG_END = 11, 12, 13
EPISODE_FIELDS = ("kind", "frames", "return", "length", "rank", "wall_time")  # kind 0 train, 1 eval
STATS_FIELDS = ("loss_sum", "loss_count", "updates", "dropped_outlier", "dropped_nonfinite")


def validate(cfg: Config) -> None:
    """Checks that need no MPI and no torch (so they fail fast on every rank)."""
    from hpcrl.games import resolve_game_id

    resolve_game_id(cfg.game)


def env_kwargs(cfg: Config, training: bool) -> dict:
    return dict(training=training, frame_skip=cfg.frame_skip, stack=cfg.frame_stack,
                noop_max=cfg.noop_max, sticky_prob=cfg.sticky_prob,
                max_episode_frames=cfg.max_episode_frames, clip_rewards=cfg.clip_rewards,
                terminal_on_life_loss=cfg.terminal_on_life_loss)


def build_network(cfg: Config, obs_shape, num_actions):
    """The algorithm's network: a Q-network for the value-based methods, else actor-critic."""
    import torch

    torch.set_num_threads(1)
    from hpcrl import networks

    if cfg.algo == "a3c":
        return networks.build_actor_critic(obs_shape, num_actions, lstm=cfg.lstm,
                                           hidden=cfg.mlp_hidden)
    return networks.build_q_network(obs_shape, num_actions, kind=cfg.network,
                                    hidden=cfg.mlp_hidden)


def env_spec(cfg: Config) -> tuple[tuple[int, ...], int]:
    from hpcrl.envs import make_env

    env = make_env(cfg.game, 1, cfg.seed, **env_kwargs(cfg, training=False))
    spec = (tuple(env.obs_shape), int(env.num_actions))
    env.close()
    return spec


def count_params(cfg: Config) -> int:
    obs_shape, num_actions = env_spec(cfg)
    net = build_network(cfg, obs_shape, num_actions)
    return sum(p.numel() for p in net.parameters())


def prepare_run_dir(comm: MPI.Comm, cfg: Config) -> Path:
    """Rank 0 creates the run directory and writes config.toml; all ranks learn the outcome."""
    run_dir = cfg.resolved_run_dir()
    error = None
    if comm.Get_rank() == 0:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            tmp = run_dir / "config.toml.tmp"
            tmp.write_text(to_toml(cfg))
            os.replace(tmp, run_dir / "config.toml")
        except OSError as exc:
            error = f"run directory {run_dir} is not usable: {exc.strerror or exc}"
    error = comm.bcast(error, root=0)
    if error:
        raise ConfigError(error)
    return run_dir


class Reporter:
    """Rank 0's gatherer: episodes and learner statistics from all clients into metrics.h5,
    plus a progress line every ``log_every_s`` seconds."""

    def __init__(self, mcomm: MPI.Comm, store: ParameterStore, cfg: Config, layout: Layout,
                 run_dir: Path):
        from hpcrl.metrics import MetricsWriter

        self.mcomm, self.store, self.cfg = mcomm, store, cfg
        self.clients = layout.client_ranks
        attrs = dict(algo=cfg.algo, game=cfg.game, seed=cfg.seed, config=to_toml(cfg),
                     hpcrl_version=__version__)
        self.writer = MetricsWriter(run_dir / "metrics.h5", attrs)
        self.stats = {r: np.zeros(len(STATS_FIELDS)) for r in self.clients}
        self.loss_at_report = (0.0, 0.0)
        self.ended: set[int] = set()
        self.returns: list[float] = []
        self.episodes = 0
        self.t0 = time.monotonic()
        self.last_report = (self.t0, 0)
        self.buf = np.zeros(max(len(EPISODE_FIELDS), len(STATS_FIELDS)))
        self.tty = sys.stdout.isatty()

    def drain(self) -> None:
        status = MPI.Status()
        while self.mcomm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            src, tag = status.Get_source(), status.Get_tag()
            self.mcomm.Recv(self.buf, src, tag)
            if tag == TAG_EPISODE:
                row = dict(zip(EPISODE_FIELDS, self.buf))
                group = "eval" if row["kind"] == 1 else "episodes"
                self.writer.append(group, **{k: row[k] for k in EPISODE_FIELDS[1:]})
                if group == "episodes":
                    self.returns.append(row["return"])
                    self.episodes += 1
            elif tag == TAG_STATS:
                self.stats[src] = self.buf[:len(STATS_FIELDS)].copy()
            elif tag == TAG_END:
                self.ended.add(src)

    def tick(self) -> None:
        self.drain()
        now = time.monotonic()
        if now - self.last_report[0] >= self.cfg.log_every_s:
            self.report(now)

    def report(self, now: float) -> None:
        c = self.store.counters()
        total = np.sum(list(self.stats.values()), axis=0)
        s = dict(zip(STATS_FIELDS, total))
        d_loss = s["loss_sum"] - self.loss_at_report[0]
        d_n = s["loss_count"] - self.loss_at_report[1]
        self.loss_at_report = (s["loss_sum"], s["loss_count"])
        t_prev, f_prev = self.last_report
        fps = (c["frames"] - f_prev) / max(now - t_prev, 1e-9)
        self.last_report = (now, c["frames"])
        loss = d_loss / d_n if d_n else float("nan")
        self.writer.append("train", frames=c["frames"], updates=c["applied"], loss=loss,
                           dropped_stale=c["dropped_stale"],
                           dropped_outlier=int(s["dropped_outlier"]),
                           dropped_nonfinite=c["dropped_nonfinite"] + int(s["dropped_nonfinite"]),
                           frames_per_second=fps, wall_time=now - self.t0)
        self.writer.flush()
        recent = np.mean(self.returns[-20:]) if self.returns else float("nan")
        line = (f"frames {c['frames']:>11,} | {fps:8.0f} frames/s | episodes {self.episodes:>6} | "
                f"return(last 20) {recent:8.2f} | updates {c['applied']:>9,} | dropped stale "
                f"{c['dropped_stale']} outlier {int(s['dropped_outlier'])} nonfinite "
                f"{c['dropped_nonfinite'] + int(s['dropped_nonfinite'])}")
        if self.tty:
            done = min(c["frames"] / self.cfg.total_frames, 1.0)
            bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
            print(f"\r[{bar}] {100 * done:5.1f}% {line}", end="", flush=True)
        else:
            print(f"[hpcrl] {line}", flush=True)

    def finish(self) -> None:
        while len(self.ended) < len(self.clients):
            self.drain()
            time.sleep(1e-3)
        self.drain()
        self.report(time.monotonic())
        if self.tty:
            print(flush=True)
        self.writer.close("finished")


def run(comm: MPI.Comm, cfg: Config, layout: Layout) -> int:
    """Build and run this rank's role; returns the exit status."""
    rank = comm.Get_rank()
    role = layout.roles[rank]
    role_comm = comm.Split(layout.color(rank), rank)
    mcomm = comm.Dup()
    rcomm = comm.Dup()
    run_dir = prepare_run_dir(comm, cfg)
    if rank == 0:
        print(f"[hpcrl] {cfg.algo} on {cfg.game}: {layout.world_size} ranks "
              f"({', '.join(f'{n} {r}' for r, n in layout.counts().items())}), run dir {run_dir},"
              f" {MPI.Get_library_version().splitlines()[0].strip()}, host {socket.gethostname()}",
              flush=True)
    first_client = layout.client_ranks[0]
    net = theta0 = None
    if rank == first_client:
        obs_shape, num_actions = env_spec(cfg)
        net = build_network(cfg, obs_shape, num_actions)
        from hpcrl.networks import ParamLayout

        theta0 = ParamLayout.from_module(net).to_flat(net)
    n_params = comm.bcast(None if theta0 is None else theta0.size, root=first_client)
    store = ParameterStore(comm, StoreSpec(n_params, layout.ps_ranks, layout.client_ranks))
    store.initialize(theta0)
    if os.environ.get("HPCRL_FAULT_RANK") == str(rank):   # failure-injection hook for tests
        raise RuntimeError(f"injected fault on rank {rank}")
    if role == Role.PS:
        run_ps(store, cfg, mcomm, layout, run_dir)
    elif role == Role.ACTOR_LEARNER and cfg.algo == "gorila":
        from hpcrl.gorila import run_bundle

        run_bundle(store, cfg, mcomm, rank)
    elif role == Role.ACTOR_LEARNER:
        from hpcrl.async_rl import run_actor_learner

        run_actor_learner(store, cfg, mcomm, rank)
    elif role == Role.REPLAY:
        run_replay(cfg, rcomm, layout, rank)
    elif role == Role.ACTOR:
        from hpcrl.gorila import run_actor

        run_actor(store, cfg, mcomm, rcomm, rank, layout.ranks_of(Role.REPLAY),
                  layout.index_in_role(rank))
    elif role == Role.EVALUATOR:
        from hpcrl.gorila import run_evaluator

        run_evaluator(store, cfg, mcomm, rank)
    elif role == Role.LEARNER:
        from hpcrl.gorila import run_learner

        run_learner(store, cfg, mcomm, rcomm, rank, layout.ranks_of(Role.REPLAY))
    else:
        raise NotImplementedError(f"role {role.value} is not implemented yet")
    store.free()
    for c in (role_comm, mcomm, rcomm):
        c.Free()
    return 0


def _assert_no_torch(role: str) -> None:
    """ps and replay ranks must not import torch: ~155 MB each, and 130 ranks share 24 GiB."""
    if "torch" in sys.modules:
        raise RuntimeError(f"a {role} rank imported torch; it must not (memory per rank)")


def run_replay(cfg: Config, rcomm: MPI.Comm, layout: Layout, rank: int) -> None:
    """A global replay rank (no torch): serves its actors' streams to all learners."""
    _assert_no_torch("replay")
    from hpcrl.envs import make_env
    from hpcrl.replay_server import ReplayServer

    env = make_env(cfg.game, 1, cfg.seed, **env_kwargs(cfg, training=False))
    image = len(env.obs_shape) == 3
    stack = env.obs_shape[0] if image else 1
    frame_shape, frame_dtype = env.frame_shape, (np.uint8 if image else np.float32)
    env.close()
    replays = layout.ranks_of(Role.REPLAY)
    me = replays.index(rank)
    n_actors = len(layout.ranks_of(Role.ACTOR))
    n_streams = sum(1 for a in range(n_actors) if a % len(replays) == me) * cfg.envs_per_actor
    n_peers = n_actors + len(layout.ranks_of(Role.LEARNER))
    server = ReplayServer(rcomm, cfg.replay_capacity, cfg.replay_min_fill, frame_shape,
                          frame_dtype, stack, n_streams, n_peers, cfg.seed + 1000 * rank)
    server.serve()


def run_ps(store: ParameterStore, cfg: Config, mcomm: MPI.Comm, layout: Layout,
           run_dir: Path) -> None:
    from hpcrl.optim import ShardOptimizer

    _assert_no_torch("ps")
    opt = ShardOptimizer(cfg.optimizer, store.sizes[store.shard], store.spec.n_clients,
                         decay=cfg.rmsprop_decay, eps=cfg.optim_eps, momentum=cfg.momentum)
    # Gorila refreshes the target every N applied updates; the async methods ask for it
    # every I_target global steps (clients call request_target_refresh).
    target_every = cfg.target_update_every if cfg.algo == "gorila" else 0
    server = ShardServer(store, opt, max_staleness=cfg.max_staleness,
                         target_update_every=target_every)
    reporter = Reporter(mcomm, store, cfg, layout, run_dir) if store.rank == 0 else None
    server.serve(idle_sleep_s=cfg.ps_idle_sleep_ms / 1e3,
                 on_tick=reporter.tick if reporter else None)
    if reporter:
        reporter.finish()


class ClientLink:
    """A client's side of the reporting channel to rank 0."""

    def __init__(self, mcomm: MPI.Comm, rank: int):
        self.mcomm, self.rank = mcomm, rank
        self.t0 = time.monotonic()

    def episode(self, frames: int, ret: float, length: int, eval_: bool = False) -> None:
        row = np.array([1.0 if eval_ else 0.0, frames, ret, length, self.rank,
                        time.monotonic() - self.t0])
        self.mcomm.Send(row, 0, TAG_EPISODE)

    def stats(self, loss_sum: float, loss_count: int, updates: int, dropped_outlier: int,
              dropped_nonfinite: int) -> None:
        row = np.array([loss_sum, loss_count, updates, dropped_outlier, dropped_nonfinite],
                       np.float64)
        self.mcomm.Send(row, 0, TAG_STATS)

    def end(self) -> None:
        self.mcomm.Send(np.zeros(1), 0, TAG_END)
