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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

from hpcrl import __version__
from hpcrl.config import Config, ConfigError, to_toml
from hpcrl.params.store import FRAMES, ParameterStore, ShardServer, StoreSpec
from hpcrl.reshard import layout_change_error, merge_pieces, shard_pieces, worker_source_rank
from hpcrl.topology import Layout, Role

# Messages from clients to rank 0 (float64 rows on a dedicated communicator).
TAG_EPISODE, TAG_STATS, TAG_CKPT = 11, 12, 14
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
                                           hidden=cfg.mlp_hidden, init=cfg.init)
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


#: Fields that define what a run directory holds: a different value is a different run.
IDENTITY_FIELDS = ("algo", "game", "seed", "mode", "network", "mlp_hidden", "lstm",
                   "frame_skip", "frame_stack")


def _owner_mismatch(run_dir: Path, cfg: Config) -> str | None:
    """Which identity field of the run already in ``run_dir`` differs from ``cfg``, if any."""
    from hpcrl.config import load_config

    path = run_dir / "config.toml"
    if not path.exists():
        return None
    try:
        old = load_config(path)
    except ConfigError as exc:
        return f"its config.toml is unreadable ({exc})"
    for name in IDENTITY_FIELDS:
        if getattr(old, name) != getattr(cfg, name):
            return f"it holds a run with {name}={getattr(old, name)!r}, not {getattr(cfg, name)!r}"
    return None


def prepare_run_dir(comm: MPI.Comm, cfg: Config, force_new: bool = False) -> Path:
    """Rank 0 checks, creates and claims the run directory; all ranks learn the outcome.

    A directory that holds a different run (see IDENTITY_FIELDS) is refused unless
    ``force_new``, which moves it aside to ``<dir>.old-<unix time>`` (never deletes it).
    """
    run_dir = cfg.resolved_run_dir()
    error = None
    if comm.Get_rank() == 0:
        try:
            mismatch = _owner_mismatch(run_dir, cfg)
            if mismatch and not force_new:
                error = (f"run directory {run_dir} belongs to another run: {mismatch}; choose "
                         "another --set run_dir=..., or pass --force-new to move it aside")
            else:
                if mismatch:
                    os.replace(run_dir, run_dir.with_name(f"{run_dir.name}.old-{int(time.time())}"))
                run_dir.mkdir(parents=True, exist_ok=True)
                probe = run_dir / ".hpcrl-write-probe"
                probe.write_text("")
                probe.unlink()
        except OSError as exc:
            error = f"run directory {run_dir} is not usable: {exc.strerror or exc}"
    error = comm.bcast(error, root=0)
    if error:
        raise ConfigError(error)
    return run_dir


def write_config(run_dir: Path, cfg: Config) -> None:
    """The resolved config, once the run is known to start or resume here (rank 0)."""
    tmp = run_dir / "config.toml.tmp"
    tmp.write_text(to_toml(cfg))
    os.replace(tmp, run_dir / "config.toml")


def find_resume(comm: MPI.Comm, run_dir: Path, layout: Layout, n_params: int):
    """Rank 0 picks the newest complete checkpoint generation and checks that this job can
    continue it; every rank gets (generation, manifest) or None, or the same ConfigError."""
    from hpcrl import checkpoint as ck

    found, error = None, None
    if comm.Get_rank() == 0:
        root = run_dir / "checkpoints"
        found = ck.latest_complete(root, warn=lambda m: print(m, flush=True))
        damaged = [g for g in ck.generations(root) if (ck.gen_dir(root, g) / ck.MANIFEST).exists()]
        if found is None and damaged:
            error = (f"no usable checkpoint in {root}: every complete generation "
                     f"({', '.join(map(str, damaged))}) is damaged (see the warnings above); "
                     "move that directory aside to start this run over")
        if found is not None:
            gen, manifest = found
            why = layout_change_error(manifest.get("roles", []), layout.role_names())
            if why:
                error = f"checkpoint generation {gen} in {run_dir} {why}"
            elif manifest.get("n_params") != n_params:
                error = (f"checkpoint generation {gen} has {manifest.get('n_params')} network "
                         f"parameters, this network has {n_params}")
    found, error = comm.bcast((found, error), root=0)
    if error:
        raise ConfigError(error)
    return found


def load_rank_state(root: Path, gen: int, manifest: dict, layout: Layout, rank: int,
                    n_params: int) -> dict:
    """This rank's state from generation ``gen``, moved to this job's layout if it differs:
    a ps rank assembles its new shard from slices of the old shards' files, a worker reads the
    file of the old worker at its position (hpcrl.reshard)."""
    from hpcrl import checkpoint as ck

    old_roles, new_roles = manifest["roles"], layout.role_names()
    if old_roles == new_roles:
        return ck.read_state(ck.rank_file(root, gen, rank))
    if layout.roles[rank] != Role.PS:
        return ck.read_state(ck.rank_file(root, gen, worker_source_rank(old_roles, new_roles, rank)))
    old_ps = [i for i, r in enumerate(old_roles) if r == "ps"]
    pieces = shard_pieces(n_params, len(old_ps), len(layout.ps_ranks),
                          layout.ps_ranks.index(rank))
    return merge_pieces([ck.read_state(ck.rank_file(root, gen, old_ps[j]), slice(lo, hi))
                         for j, lo, hi in pieces])


class Reporter:
    """Rank 0's gatherer: episodes and learner statistics from all clients into metrics.h5,
    plus a progress line every ``log_every_s`` seconds."""

    def __init__(self, mcomm: MPI.Comm, store: ParameterStore, cfg: Config, layout: Layout,
                 run_dir: Path, resume_frames: int | None = None, on_early_stop=None):
        from hpcrl.metrics import MetricsWriter

        self.mcomm, self.store, self.cfg = mcomm, store, cfg
        self.clients = layout.client_ranks
        attrs = dict(algo=cfg.algo, game=cfg.game, seed=cfg.seed, config=to_toml(cfg),
                     hpcrl_version=__version__)
        path = run_dir / "metrics.h5"
        resume = resume_frames is not None and path.exists()
        if path.exists() and not resume:                 # a start that never checkpointed
            old = run_dir / f"metrics.old-{int(time.time())}.h5"
            os.replace(path, old)
            print(f"hpcrl: warning: {run_dir} has metrics but no checkpoint; starting over, the "
                  f"old metrics are kept as {old.name}", flush=True)
        self.writer = MetricsWriter(path, attrs, resume=resume)
        if resume:
            self.writer.rollback(resume_frames)   # rows after the checkpoint happen again
        self.markers = 0
        self.resume_frames = resume_frames or 0
        self.stats = {r: np.zeros(len(STATS_FIELDS)) for r in self.clients}
        self.loss_at_report = (0.0, 0.0)
        self.returns: list[float] = []
        self.eval_returns: list[float] = []
        self.on_early_stop, self.early_stopped = on_early_stop, False
        self.episodes = 0
        self.t0 = time.monotonic()
        self.last_report = (self.t0, self.resume_frames)
        if resume:
            self.episodes = self.writer.rows("episodes")
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
                else:
                    self.eval_returns.append(row["return"])
            elif tag == TAG_STATS:
                self.stats[src] = self.buf[:len(STATS_FIELDS)].copy()
            elif tag == TAG_CKPT:
                self.markers += 1

    def tick(self) -> None:
        self.drain()
        if self.cfg.early_stop and not self.early_stopped:
            self.check_early_stop()
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
        evals = (f"eval(last 20) {np.mean(self.eval_returns[-20:]):8.2f} | "
                 if self.eval_returns else "")
        line = (f"frames {c['frames']:>11,} | {fps:8.0f} frames/s | episodes {self.episodes:>6} | "
                f"return(last 20) {recent:8.2f} | {evals}updates {c['applied']:>9,} | dropped stale "
                f"{c['dropped_stale']} outlier {int(s['dropped_outlier'])} nonfinite "
                f"{c['dropped_nonfinite'] + int(s['dropped_nonfinite'])}")
        if self.tty:
            done = min(c["frames"] / self.cfg.total_frames, 1.0)
            bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
            print(f"\r[{bar}] {100 * done:5.1f}% {line}", end="", flush=True)
        else:
            print(f"[hpcrl] {line}", flush=True)

    def check_early_stop(self) -> None:
        """``early_stop``: once the mean of the last 20 evaluation episodes (training episodes
        when nothing evaluates) reaches ``early_stop_return``, end the run like a spent budget.
        Returns seen since a resume only (the file's earlier rows were judged before)."""
        kind, returns = (("evaluation", self.eval_returns) if self.eval_returns
                         else ("training", self.returns))
        if len(returns) < 20 or np.mean(returns[-20:]) < self.cfg.early_stop_return:
            return
        self.early_stopped = True
        frames = self.store.read_word(0, FRAMES)
        print(f"[hpcrl] early stop: mean return of the last 20 {kind} episodes "
              f"{np.mean(returns[-20:]):.1f} >= {self.cfg.early_stop_return} at frame "
              f"{frames:,}", flush=True)
        self.on_early_stop()

    def before_checkpoint(self) -> None:
        """Drain every client's messages up to its checkpoint marker, then flush: the file then
        holds exactly the episodes played before the checkpoint."""
        while self.markers < len(self.clients):
            self.drain()
            time.sleep(1e-4)
        self.markers = 0
        self.writer.flush()

    def finish(self, status: str = "finished") -> None:
        self.drain()
        self.report(time.monotonic())
        if self.tty:
            print(flush=True)
        self.writer.close(status)


@dataclass
class Context:
    """Everything a role's loop needs, built once by :func:`run`."""

    comm: MPI.Comm
    cfg: Config
    layout: Layout
    rank: int
    store: ParameterStore
    mcomm: MPI.Comm            # clients -> rank 0: episodes, statistics, checkpoint markers
    rcomm: MPI.Comm            # actors/learners <-> global replay ranks
    run_dir: Path
    coord: "Coordinator"
    state: dict | None         # this rank's state from the checkpoint being resumed
    resume_frames: int | None  # global frames of that checkpoint
    opt: object = None         # ps ranks: the shard optimiser

    @property
    def seed(self) -> int:
        return self.cfg.seed + 1000 * self.rank

    def link(self) -> "ClientLink":
        return ClientLink(self.mcomm, self.rank)

    def client_checkpoint(self, link: "ClientLink", state_fn, markers=None) -> int:
        """A client's part of a coordinated checkpoint; returns the stop code (0 = go on)."""
        link.marker()
        if markers is not None:
            markers()
        self.coord.client_ready()
        return self.coord.write(state_fn)


def sub_state(state: dict | None, prefix: str) -> dict | None:
    """The entries of a flat checkpoint dict under ``prefix/``, prefix removed."""
    if state is None:
        return None
    out = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + "/")}
    return out or None


def with_prefix(prefix: str, state: dict) -> dict:
    return {f"{prefix}/{k}": v for k, v in state.items()}


def run(comm: MPI.Comm, cfg: Config, layout: Layout, force_new: bool = False) -> int:
    """Build and run this rank's role; returns the exit status."""
    from hpcrl.coord import STOP_SIGNAL, Coordinator
    from hpcrl.run import EXIT_REQUEUE

    rank = comm.Get_rank()
    role = layout.roles[rank]
    role_comm = comm.Split(layout.color(rank), rank)
    mcomm, rcomm = comm.Dup(), comm.Dup()
    run_dir = prepare_run_dir(comm, cfg, force_new)
    if rank == 0:
        print(f"[hpcrl] {cfg.algo} on {cfg.game}: {layout.world_size} ranks "
              f"({', '.join(f'{n} {r}' for r, n in layout.counts().items())}), run dir {run_dir},"
              f" {MPI.Get_library_version().splitlines()[0].strip()}, host {socket.gethostname()}",
              flush=True)
    first_client = layout.client_ranks[0]
    theta0 = None
    if rank == first_client:
        obs_shape, num_actions = env_spec(cfg)
        net = build_network(cfg, obs_shape, num_actions)
        from hpcrl.networks import ParamLayout

        theta0 = ParamLayout.from_module(net).to_flat(net)
    n_params = comm.bcast(None if theta0 is None else theta0.size, root=first_client)
    found = find_resume(comm, run_dir, layout, n_params)
    if rank == 0:
        write_config(run_dir, cfg)
    gen, manifest = found if found else (0, None)
    state = (load_rank_state(run_dir / "checkpoints", gen, manifest, layout, rank, n_params)
             if found else None)
    if rank == 0 and found:
        old_n_ps = manifest["roles"].count("ps")
        moved = (f", its {old_n_ps} parameter shards re-split over {len(layout.ps_ranks)} ps ranks"
                 if manifest["roles"] != layout.role_names() else "")
        print(f"[hpcrl] resuming from checkpoint generation {gen} at frame "
              f"{manifest['frames']:,}{moved}", flush=True)
    store = ParameterStore(comm, StoreSpec(n_params, layout.ps_ranks, layout.client_ranks))
    opt = None
    if role == Role.PS:
        opt = make_optimizer(cfg, store)
        if state is not None:
            from hpcrl.params.store import load_shard_state

            load_shard_state(store, opt, state)
    store.initialize(None if found else theta0)
    info = dict(roles=layout.role_names(), world_size=layout.world_size,
                n_params=n_params, algo=cfg.algo, game=cfg.game, seed=cfg.seed,
                hpcrl_version=__version__)
    coord = Coordinator(comm, store, run_dir / "checkpoints", gen_done=gen,
                        every_s=cfg.checkpoint_every_min * 60, keep=cfg.checkpoint_keep,
                        info=info)
    ctx = Context(comm, cfg, layout, rank, store, mcomm, rcomm, run_dir, coord, state,
                  manifest["frames"] if manifest else None, opt)
    from hpcrl import watchdog

    watchdog.start(cfg.watchdog_s, rank, role.value, lambda: comm.Abort(1))
    if os.environ.get("HPCRL_FAULT_RANK") == str(rank):   # failure-injection hooks for tests
        raise RuntimeError(f"injected fault on rank {rank}")
    if os.environ.get("HPCRL_HANG_RANK") == str(rank):
        time.sleep(1e9)
    role_main(ctx, role)()
    store.free()
    for c in (role_comm, mcomm, rcomm):
        c.Free()
    return EXIT_REQUEUE if coord.stop_code == STOP_SIGNAL else 0


def role_main(ctx: Context, role: Role):
    """The loop of ``role`` as a zero-argument callable (imports only what the role needs)."""
    if role == Role.PS:
        return lambda: run_ps(ctx)
    if role == Role.REPLAY:
        return lambda: run_replay(ctx)
    if role == Role.ACTOR_LEARNER and ctx.cfg.algo != "gorila":
        from hpcrl.async_rl import run_actor_learner

        return lambda: run_actor_learner(ctx)
    from hpcrl import gorila

    fn = {Role.ACTOR_LEARNER: gorila.run_bundle, Role.ACTOR: gorila.run_actor,
          Role.LEARNER: gorila.run_learner, Role.EVALUATOR: gorila.run_evaluator}[role]
    return lambda: fn(ctx)


def make_optimizer(cfg: Config, store: ParameterStore):
    from hpcrl.optim import ShardOptimizer

    return ShardOptimizer(cfg.optimizer, store.sizes[store.shard], store.spec.n_clients,
                          decay=cfg.rmsprop_decay, eps=cfg.optim_eps, momentum=cfg.momentum)


def _assert_no_torch(role: str) -> None:
    """ps and replay ranks must not import torch: ~155 MB each, and 130 ranks share 24 GiB."""
    if "torch" in sys.modules:
        raise RuntimeError(f"a {role} rank imported torch; it must not (memory per rank)")


def run_replay(ctx: Context) -> None:
    """A global replay rank (no torch): serves its actors' streams to all learners."""
    _assert_no_torch("replay")
    from hpcrl.envs import make_env
    from hpcrl.replay import frame_layout
    from hpcrl.replay_server import ReplayServer

    cfg, layout = ctx.cfg, ctx.layout
    env = make_env(cfg.game, 1, cfg.seed, **env_kwargs(cfg, training=False))
    stack, frame_shape, frame_dtype = frame_layout(env.obs_shape)
    env.close()
    replays = layout.ranks_of(Role.REPLAY)
    me = replays.index(ctx.rank)
    n_actors = len(layout.ranks_of(Role.ACTOR))
    n_streams = sum(1 for a in range(n_actors) if a % len(replays) == me) * cfg.envs_per_actor
    n_peers = n_actors + len(layout.ranks_of(Role.LEARNER))
    server = ReplayServer(ctx.rcomm, cfg.replay_capacity, cfg.replay_min_fill, frame_shape,
                          frame_dtype, stack, n_streams, n_peers, ctx.seed)
    if ctx.state is not None:
        server.set_state(ctx.state)
    server.serve(coord=ctx.coord, save_replay=cfg.checkpoint_replay)


def _ps_cpu_clock(path, server, then=None, every_s: float = 2.0):
    """An ``on_tick`` for ``phase_times``: appends ``{"t", "cpu_s", "applied"}`` (this ps
    process's CPU seconds and gradients applied, cumulative) to ``path`` every ``every_s``, so
    ``bench scaling`` can say how much of a core the ps took and per gradient; calls ``then``
    (rank 0's metrics tick) every time."""
    import json
    path.parent.mkdir(parents=True, exist_ok=True)
    last = -float("inf")

    def tick() -> None:
        nonlocal last
        if then is not None:
            then()
        now = time.monotonic()
        if now - last >= every_s:
            last = now
            row = {"t": time.time(), "cpu_s": time.process_time(), "applied": server.version}
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
    return tick


def run_ps(ctx: Context) -> None:
    _assert_no_torch("ps")
    from hpcrl.coord import STOP_SIGNAL

    cfg = ctx.cfg
    # Gorila refreshes the target every N applied updates; the async methods ask for it
    # every I_target global steps (clients call request_target_refresh).
    target_every = cfg.target_update_every if cfg.algo == "gorila" else 0
    server = ShardServer(ctx.store, ctx.opt, max_staleness=cfg.max_staleness,
                         target_update_every=target_every)
    from hpcrl.coord import STOP_BUDGET

    reporter = (Reporter(ctx.mcomm, ctx.store, cfg, ctx.layout, ctx.run_dir, ctx.resume_frames,
                         on_early_stop=lambda: ctx.coord.request(STOP_BUDGET))
                if ctx.rank == 0 else None)
    on_tick = reporter.tick if reporter else None
    if cfg.phase_times and cfg.algo != "gorila":
        on_tick = _ps_cpu_clock(ctx.run_dir / "phase_times" / f"ps-rank-{ctx.rank}.jsonl",
                                server, on_tick)
    stop = server.serve(idle_sleep_s=cfg.ps_idle_sleep_ms / 1e3, on_tick=on_tick, coord=ctx.coord,
                        before_write=reporter.before_checkpoint if reporter else None)
    if reporter:
        reporter.finish("preempted" if stop == STOP_SIGNAL else "finished")


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

    def marker(self) -> None:
        """Everything this client reported so far precedes the coming checkpoint."""
        self.mcomm.Send(np.zeros(1), 0, TAG_CKPT)
