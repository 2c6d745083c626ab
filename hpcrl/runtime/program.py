"""Wiring: build each rank's parts and run its role (acme's ``make_distributed_experiment``).

Call order on every rank (collective steps marked *):

    run dir leased and prepared by rank 0, outcome broadcast * -> one-line error on all ranks
    network built on the first client, size broadcast *
    resume point chosen by rank 0, its metrics.h5 checked, broadcast *; each rank reads its own state
    pre-flight sizing: each node's memory and the checkpoints' disk, refused if short *
    ParameterStore created *, initialised from the first client's parameters *
    role loop: ps -> run_ps (rank 0 also gathers metrics); replay -> run_replay;
               clients -> run_client(the worker that ``make_worker`` builds for the role)
    store freed *

The runtime knows no algorithm: ``make_worker(ctx, role)`` (:func:`hpcrl.agents.make_worker`)
is handed in by the command line. ps and replay ranks never import torch.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable

import numpy as np
from mpi4py import MPI

from hpcrl.version import __version__
from hpcrl.config import Config, ConfigError
from hpcrl.core import Worker
from hpcrl.io.quota import quota_headroom
from hpcrl.runtime import hooks, sizing, watchdog
from hpcrl.runtime.client import run_client
from hpcrl.runtime.context import Context
from hpcrl.runtime.coord import STOP_FAILED, STOP_SIGNAL, Coordinator
from hpcrl.runtime.node_guard import NodeGuard, Peer
from hpcrl.runtime.exits import EXIT_BUSY, EXIT_CHECKPOINT, EXIT_FAILURE, EXIT_REQUEUE, abort_job
from hpcrl.runtime.params.server import load_shard_state
from hpcrl.runtime.params.store import ParameterStore, StoreSpec
from hpcrl.runtime.provenance import provenance
from hpcrl.runtime.ps import make_optimizer, run_ps, run_replay
from hpcrl.runtime.rundir import check_metrics, find_resume, load_rank_state, prepare_run_dir, \
    write_config
from hpcrl.runtime.topology import Layout, Role

WorkerFactory = Callable[[Context, Role], Worker]

#: Rank 0 names the clients missing at a checkpoint after this share of ``watchdog_s``: before
#: the arrived ranks' own watchdogs fire in the gather they wait in.
STALL_SHARE = 0.8
#: A client waiting for a ps to take its gradient beats its watchdog and names that ps after
#: ``watchdog_s`` plus this: a ps that is alive but stuck reports itself (with its stack) first.
PEER_GRACE_S = 10.0
#: A client rank may take this many times ``watchdog_s`` to build its worker (networks, envs).
STARTUP_WATCHDOG_SHARE = 4.0


def validate(cfg: Config) -> None:
    """Checks that need no MPI and no torch (so they fail fast on every rank)."""
    from hpcrl.games import resolve_game_id

    resolve_game_id(cfg.game)


def initial_parameters(cfg: Config):
    """theta0: the flat parameters of a freshly built network for the run's game, drawn from
    torch's generator seeded with ``cfg.seed``: a run's initial weights follow from its
    recorded seed (one seed, one theta0; torch's unseeded generator differs per process)."""
    return initial_network(cfg)[0]


def initial_network(cfg: Config) -> tuple[np.ndarray, list[int], list[str]]:
    """(theta0 as in :func:`initial_parameters`, the sizes of the network's tensors in the
    flat vector's order, their names)."""
    import torch

    from hpcrl.envs import env_spec
    from hpcrl.rl.networks import build_network
    from hpcrl.runtime.params.layout import ParamLayout

    torch.manual_seed(cfg.seed)
    net = build_network(cfg, *env_spec(cfg))
    layout = ParamLayout.from_module(net)
    ends = list(layout.offsets[1:]) + [layout.size]
    return layout.to_flat(net), [e - o for o, e in zip(layout.offsets, ends)], list(layout.names)


def preflight(comm: MPI.Comm, cfg: Config, layout: Layout, run_dir: Path, n_params: int,
              memory_available: float | None = None
              ) -> tuple[list[str] | None, float, float, list[Peer]]:
    """Collective. Rank 0 prints the memory each node and the disk the checkpoints need
    (:mod:`hpcrl.runtime.sizing`) and, with ``cfg.preflight``, refuses a job that does not
    fit: the same one-line ConfigError on every rank. Returns every rank's host on rank 0 (None
    elsewhere) and, on every rank, the bytes of one checkpoint generation, the memory this
    rank is estimated to need (the memory guard's base) and the job's ranks on this rank's
    node (the node memory guard's table).

    ``memory_available``: this node's free memory as measured before the rank imported torch
    (the sizing counts torch's share of each client itself); measured now if None."""
    free = sizing.memory_available() if memory_available is None else memory_available
    mine = (socket.gethostname(), free, os.getpid())
    gathered = comm.gather(mine, root=0)
    error, hosts, generation_bytes, rank_bytes, where = None, None, 0.0, None, None
    if comm.Get_rank() == 0:
        from hpcrl.envs import env_spec

        hosts = [h for h, _, _ in gathered]
        where = [(h, pid) for h, _, pid in gathered]
        totals = sizing.summary(cfg, layout, env_spec(cfg)[0], n_params, hosts)
        generation_bytes = float(totals["generation_bytes"])
        rank_bytes = totals["rank_memory"]
        for line in sizing.describe(totals):
            print(f"[hpcrl] {line}", flush=True)
        if cfg.preflight:
            quota = quota_headroom(run_dir) if cfg.checkpoint_quota_check else None
            error = sizing.check(cfg, totals, run_dir, {h: f for h, f, _ in gathered},
                                 sizing.free_disk_bytes(run_dir, quota))
    error, generation_bytes, rank_bytes, where = comm.bcast(
        (error, generation_bytes, rank_bytes, where), root=0)
    if error:
        raise ConfigError(error)
    roles = layout.role_names()
    peers = [Peer(r, roles[r], pid, rank_bytes[r]) for r, (host, pid) in enumerate(where)
             if host == mine[0]]
    return hosts, generation_bytes, rank_bytes[comm.Get_rank()], peers


def count_params(cfg: Config) -> int:
    """Parameters of the run's network (for ``--dry-run``)."""
    return int(initial_parameters(cfg).size)


def run(comm: MPI.Comm, cfg: Config, layout: Layout, make_worker: WorkerFactory,
        force_new: bool = False, reset_metrics: bool = False) -> int:
    """Build and run this rank's role; returns the exit status."""
    run_dir, lease = prepare_run_dir(comm, cfg, force_new)
    if lease is not None:
        # Another job took the directory over (this one was frozen past run_dir_lease_s):
        # stop at once, writing nothing more; that job carries the run.
        lease.on_lost = lambda: abort_job(comm, EXIT_BUSY)
    try:
        return _run_in(comm, cfg, layout, make_worker, run_dir, reset_metrics,
                       lease.check if lease is not None else None)
    finally:                  # a one-line refusal leaves the run directory as it was found
        if lease is not None:
            lease.release()


def announce_start(found: tuple[int, dict] | None, layout: Layout) -> None:
    """Say, as soon as it is decided, whether the job resumes or starts from new parameters."""
    if not found:
        print("[hpcrl] no complete checkpoint: starting from new parameters", flush=True)
        return
    gen, manifest = found
    old_n_ps = manifest["roles"].count("ps")
    moved = (f", its {old_n_ps} parameter shards re-split over {len(layout.ps_ranks)} ps ranks"
             if manifest["roles"] != layout.role_names() else "")
    print(f"[hpcrl] resuming from checkpoint generation {gen} at frame "
          f"{manifest['frames']:,}{moved}", flush=True)


def _run_in(comm: MPI.Comm, cfg: Config, layout: Layout, make_worker: WorkerFactory,
            run_dir: Path, reset_metrics: bool, guard=None) -> int:
    """Everything after the run directory is leased (see :func:`run`). ``guard``: rank 0's
    lease check, called before anything replaces or deletes files of the run."""
    rank = comm.Get_rank()
    role = layout.roles[rank]
    mcomm, rcomm = comm.Dup(), comm.Dup()
    if rank == 0:
        print(f"[hpcrl] {cfg.algo} on {cfg.game}: {layout.world_size} ranks "
              f"({', '.join(f'{n} {r}' for r, n in layout.counts().items())}), run dir {run_dir},"
              f" {MPI.Get_library_version().splitlines()[0].strip()}, host {socket.gethostname()}",
              flush=True)
    first_client = layout.client_ranks[0]
    memory_free = sizing.memory_available()           # before torch: the sizing counts it
    if role not in (Role.PS, Role.REPLAY):
        # Every client needs torch for its worker: importing it now, beside the first
        # client's import for theta0, instead of after theta0's broadcast, takes one import's
        # time off the start of every job (seconds of CPU per rank). Like the first client's
        # import before it, this runs before the watchdog: an import hung on a file system
        # holds the job at the broadcast below until its time limit.
        import torch  # noqa: F401
    theta0, tensor_sizes, tensor_names = (initial_network(cfg) if rank == first_client
                                          else (None, None, None))
    tensor_sizes, tensor_names = comm.bcast((tensor_sizes, tensor_names), root=first_client)
    n_params = sum(tensor_sizes)
    found, highest_gen = find_resume(comm, run_dir, layout, n_params, cfg.obs_norm)
    check_metrics(comm, run_dir, found, reset_metrics)
    if rank == 0:
        announce_start(found, layout)
    hosts, generation_bytes, memory_need, peers = preflight(comm, cfg, layout, run_dir, n_params,
                                                     memory_free)
    origin = (provenance(MPI.Get_library_version().splitlines()[0].strip(), hosts)
              if rank == 0 else None)
    if rank == 0:
        write_config(run_dir, cfg)
    gen, manifest = found if found else (0, None)
    state = (load_rank_state(run_dir / "checkpoints", gen, manifest, layout, rank, n_params)
             if found else None)
    store = ParameterStore(comm, StoreSpec(n_params, layout.ps_ranks, layout.client_ranks,
                                           tuple(tensor_sizes)))
    store.stall_s = cfg.watchdog_s + PEER_GRACE_S          # a frozen ps is named by its clients
    opt = None
    if role == Role.PS:
        opt = make_optimizer(cfg, store, tensor_sizes)
        if state is not None:
            load_shard_state(store, opt, state)
    store.initialize(None if found else theta0)
    info = dict(roles=layout.role_names(), world_size=layout.world_size,
                n_params=n_params, obs_norm=cfg.obs_norm, algo=cfg.algo, game=cfg.game,
                seed=cfg.seed,
                hpcrl_version=__version__, provenance=origin)
    coord = Coordinator(comm, store, run_dir / "checkpoints", gen_done=max(gen, highest_gen),
                        every_s=cfg.checkpoint_every_min * 60, keep=cfg.checkpoint_keep,
                        info=info, stall_s=STALL_SHARE * cfg.watchdog_s,
                        startup_s=STARTUP_WATCHDOG_SHARE * cfg.watchdog_s,
                        max_failures=cfg.checkpoint_max_failures, guard=guard,
                        write_bound_s=sizing.checkpoint_bound_s(
                            generation_bytes, cfg.watchdog_s, cfg.checkpoint_min_mb_per_s),
                        quota_bytes=generation_bytes if cfg.checkpoint_quota_check else 0.0)
    ctx = Context(comm, cfg, layout, rank, store, mcomm, rcomm, run_dir, coord,
                  None if role == Role.PS else state, manifest["frames"] if manifest else None,
                  opt, hosts, origin, tuple(zip(tensor_names, tensor_sizes)),
                  memory_need + cfg.memory_guard_gb * sizing.GB if cfg.memory_guard_gb else None)
    del state                   # the context hands it over (Context.hand_over_state)
    watchdog.start(cfg.watchdog_s, rank, role.value, lambda: abort_job(comm, EXIT_FAILURE))
    watchdog.guard_node(NodeGuard(rank, cfg.memory_floor_gb * sizing.GB, peers)
                        if cfg.memory_floor_gb else None)
    hooks.after_startup(rank)
    if role == Role.PS:
        ctx.hand_over_state(None)               # the shard's state is in place already
        run_ps(ctx)
    elif role == Role.REPLAY:
        run_replay(ctx)
    else:
        # Building a worker builds networks and makes environments: on a shared file system
        # with many ranks starting at once that can take several times watchdog_s.
        with watchdog.allow(STARTUP_WATCHDOG_SHARE * cfg.watchdog_s):
            worker = make_worker(ctx, role)
        run_client(ctx, worker)
    store.free()
    for c in (mcomm, rcomm):
        c.Free()
    return {STOP_SIGNAL: EXIT_REQUEUE, STOP_FAILED: EXIT_CHECKPOINT}.get(coord.stop_code, 0)
