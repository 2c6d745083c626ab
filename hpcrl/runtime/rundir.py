"""The run directory: which job holds it, which run owns it, the config written into it, and what a resume reads.

Rank 0 decides every question here and broadcasts the answer, so a refusal is the same
one-line :class:`~hpcrl.config.ConfigError` on every rank.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mpi4py import MPI

from hpcrl.config import Config, ConfigError, load_config, to_toml
from hpcrl.io import checkpoint as ck
from hpcrl.io.files import replace_text
from hpcrl.io.metrics import MetricsError, read_metrics
from hpcrl.runtime.lease import RunDirBusy, RunDirLease
from hpcrl.runtime.reshard import layout_change_error, merge_pieces, shard_pieces, \
    worker_source_rank
from hpcrl.runtime.topology import Layout, Role


#: Fields that define what a run directory holds: a different value is a different run.
IDENTITY_FIELDS = ("algo", "game", "seed", "mode", "network", "mlp_hidden", "lstm",
                   "frame_skip", "frame_stack", "obs_norm", "reward_norm", "value_network",
                   "gaussian_std")


def _owner_mismatch(run_dir: Path, cfg: Config) -> str | None:
    """Which identity field of the run already in ``run_dir`` differs from ``cfg``, if any."""
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


def prepare_run_dir(comm: MPI.Comm, cfg: Config, force_new: bool = False
                    ) -> tuple[Path, RunDirLease | None]:
    """Rank 0 checks, creates and leases the run directory; all ranks learn the outcome.

    The lease (:mod:`hpcrl.runtime.lease`) comes first: a directory another live job holds is
    refused (:class:`RunDirBusy` on every rank) before anything in it is read or moved. A directory that holds a different run
    (see IDENTITY_FIELDS) is refused unless ``force_new``, which moves it aside to
    ``<dir>.old-<unix time>`` (never deletes it).

    Returns:
        The run directory, and on rank 0 the lease it holds until the job ends (else None).
    """
    run_dir = cfg.resolved_run_dir()
    error, busy, lease = None, False, None
    # A requeue may start while its previous start is still being cleaned up (a node that
    # failed keeps its lock until the lock manager evicts it): it retries a busy directory.
    retry_s = 2 * cfg.run_dir_lease_s if _slurm_restart_count() > 0 else 0.0
    if comm.Get_rank() == 0:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            lease = RunDirLease.acquire(run_dir, cfg.run_dir_lease_s, retry_s=retry_s)
            mismatch = _owner_mismatch(run_dir, cfg)
            if mismatch and not force_new:
                error = (f"run directory {run_dir} belongs to another run: {mismatch}; choose "
                         "another --set run_dir=..., or pass --force-new to move it aside")
            else:
                if mismatch:
                    lease.release()
                    os.replace(run_dir, run_dir.with_name(f"{run_dir.name}.old-{int(time.time())}"))
                    run_dir.mkdir(parents=True, exist_ok=True)
                    lease = RunDirLease.acquire(run_dir, cfg.run_dir_lease_s, retry_s=retry_s)
                probe = run_dir / ".hpcrl-write-probe"
                probe.write_text("")
                probe.unlink()
        except RunDirBusy as exc:
            error, busy = str(exc), True
        except OSError as exc:
            error = f"run directory {run_dir} is not usable: {exc.strerror or exc}"
        if error and lease is not None:
            lease.release()
            lease = None
    error, busy = comm.bcast((error, busy), root=0)
    if error:
        raise (RunDirBusy if busy else ConfigError)(error)
    return run_dir, lease


def _slurm_restart_count() -> int:
    """How many times SLURM requeued this job (0 outside SLURM or on its first start)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def write_config(run_dir: Path, cfg: Config) -> None:
    """The resolved config, once the run is known to start or resume here (rank 0)."""
    replace_text(run_dir / "config.toml", to_toml(cfg))


def find_resume(comm: MPI.Comm, run_dir: Path, layout: Layout, n_params: int,
                obs_norm: bool = False):
    """Rank 0 picks the newest complete checkpoint generation and checks that this job can
    continue it; every rank gets ((generation, manifest) or None, the highest generation number
    on disk), or the same ConfigError. New generations are numbered above every directory on
    disk, so a damaged or partial generation that was skipped is never written into again."""
    found, error, highest = None, None, 0
    if comm.Get_rank() == 0:
        root = run_dir / "checkpoints"
        highest = max(ck.generations(root), default=0)
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
            elif bool(manifest.get("obs_norm", False)) != obs_norm:
                error = (f"checkpoint generation {gen} in {run_dir} was written with obs_norm "
                         f"= {str(not obs_norm).lower()} (observation statistics are part of "
                         f"the network); resume it with the same value or start another run "
                         f"directory")
    found, error, highest = comm.bcast((found, error, highest), root=0)
    if error:
        raise ConfigError(error)
    return found, highest


def check_metrics(comm: MPI.Comm, run_dir: Path, found, reset_metrics: bool = False) -> None:
    """Before a resume, rank 0 reads ``metrics.h5``: an unreadable one is the same one-line
    ConfigError on every rank, with the remedy; with ``reset_metrics`` it is moved aside to
    ``metrics.damaged-<unix time>.h5`` and the run continues from its checkpoint with fresh
    metrics (rows before the checkpoint are then only in the damaged file)."""
    error = None
    path = run_dir / "metrics.h5"
    if comm.Get_rank() == 0 and found is not None and path.exists():
        try:
            read_metrics(path)
        except MetricsError as exc:
            gen = found[0]
            if reset_metrics:
                aside = run_dir / f"metrics.damaged-{int(time.time())}.h5"
                os.replace(path, aside)
                print(f"hpcrl: warning: {path} was unreadable ({_reason(exc)}); it is kept as "
                      f"{aside.name}, and the run continues from checkpoint generation {gen} "
                      "with fresh metrics", flush=True)
            else:
                error = (f"{path} is unreadable ({_reason(exc)}); pass --reset-metrics to move "
                         f"it aside and continue from checkpoint generation {gen} with fresh "
                         "metrics")
    error = comm.bcast(error, root=0)
    if error:
        raise ConfigError(error)


def _reason(exc: MetricsError) -> str:
    """The error without the path it starts with (the message names the file once)."""
    text = str(exc)
    head, sep, tail = text.partition(": ")
    return tail if sep and head.endswith(".h5") else text


def load_rank_state(root: Path, gen: int, manifest: dict, layout: Layout, rank: int,
                    n_params: int) -> dict:
    """This rank's state from generation ``gen``, moved to this job's layout if it differs:
    a ps rank assembles its new shard from slices of the old shards' files, a worker reads the
    file of the old worker at its position (hpcrl.reshard)."""
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
