"""Failure-injection and profiling hooks, switched on by environment variables.

Tests and benchmarks use them; a normal run sets none. They are all here, so the loops that
honour them carry one call each and no variable names:

=============================  ===========================================================
``HPCRL_FAULT_RANK=r``         rank r raises right after start-up (the job-abort path)
``HPCRL_HANG_RANK=r``          rank r stops making progress after start-up (the watchdog)
``HPCRL_GROW_RANK=r:gb``       rank r takes gb GB more memory after start-up and keeps it
                               (the memory guard)
``HPCRL_CKPT_FAIL_RANK=r``     rank r's checkpoint file writes fail with "no space left"
``HPCRL_CKPT_DELAY=r:s``       rank r takes s seconds longer to write its first checkpoint
                               file (``r:stop``: it stops itself there)
``HPCRL_CKPT_CRASH_AT=r:step``  rank r kills itself (SIGKILL) at that step of its checkpoint
                               write: closed, synced, renamed, dir-synced (its file), or
                               manifest (rank 0, before pruning)
``HPCRL_METRICS_FULL_FILE=F``   while file F exists, rank 0's metrics.h5 flushes fail with
                               "no space left" (the test frees the disk by removing F)
``HPCRL_FREEZE_FINAL_RANK=r``  rank r stops itself (SIGSTOP, its watchdog too) as its final
                               evaluation begins
``HPCRL_LEASE_NO_FLOCK``       the run-directory lease sees no ``flock`` (as on Lustre
                               ``noflock`` or NFSv3 ``nolock``): only its lease file guards
``HPCRL_CHECKPOINT_ON_START``  rank 0 asks for a checkpoint generation as soon as it can
``HPCRL_PHASE_TIMES_DIR=D``    actor-learners and ps ranks append phase timings under D
                               (``python -m hpcrl.bench scaling`` sets it for its jobs)
``HPCRL_SEPARATE_MODEL``       ps ranks treat their windows as in MPI's separate memory
                               model (atomics on their own header words), as they do on an
                               MPI whose windows are not ``MPI.WIN_UNIFIED``
=============================  ===========================================================
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _rank_is(var: str, rank: int) -> bool:
    return os.environ.get(var) == str(rank)


def after_startup(rank: int) -> None:
    """Inject the start-up fault or hang asked for on this rank, if any."""
    if _rank_is("HPCRL_FAULT_RANK", rank):
        raise RuntimeError(f"injected fault on rank {rank}")
    if _rank_is("HPCRL_HANG_RANK", rank):
        time.sleep(1e9)
    who, _, gb = os.environ.get("HPCRL_GROW_RANK", "").partition(":")
    if who == str(rank) and gb:
        import numpy as np

        _ballast.append(np.ones(int(float(gb) * 1e9), dtype=np.uint8))   # touched: resident


#: What ``HPCRL_GROW_RANK`` holds on to.
_ballast: list = []


def before_final_evaluation(rank: int) -> None:
    """Freeze this rank at the start of its final evaluation, if asked (rank 0 names it): a
    stopped process, as a node stuck on a file system is, whose watchdog cannot fire."""
    if _rank_is("HPCRL_FREEZE_FINAL_RANK", rank):
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)


_delayed = False


def checkpoint_delay(rank: int) -> None:
    """Make this rank's checkpoint write slow (a slow shared file system) or, with "stop",
    freeze it there (SIGSTOP: a node stuck on its file system), if asked."""
    global _delayed
    who, _, what = os.environ.get("HPCRL_CKPT_DELAY", "").partition(":")
    if who != str(rank) or not what or _delayed:
        return
    _delayed = True
    if what == "stop":
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        time.sleep(float(what))


def checkpoint_crash(rank: int, step: str) -> None:
    """Die here, as a node that crashes at this step of a checkpoint write does, if asked."""
    if os.environ.get("HPCRL_CKPT_CRASH_AT") == f"{rank}:{step}":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def metrics_flush_fails(path) -> None:
    """Raise the OSError of a full disk for a metrics flush, while the test says the disk is
    full (see the table)."""
    flag = os.environ.get("HPCRL_METRICS_FULL_FILE")
    if flag and os.path.exists(flag):
        raise OSError(28, "No space left on device (injected)")


def checkpoint_write_fails(rank: int) -> bool:
    return _rank_is("HPCRL_CKPT_FAIL_RANK", rank)


def flock_disabled() -> bool:
    """Simulate a file system without locks for the run-directory lease (see the table)."""
    return bool(os.environ.get("HPCRL_LEASE_NO_FLOCK"))


def checkpoint_on_start() -> bool:
    return bool(os.environ.get("HPCRL_CHECKPOINT_ON_START"))


def phase_times_dir() -> Path | None:
    """Where to write phase timings (None: do not time phases)."""
    value = os.environ.get("HPCRL_PHASE_TIMES_DIR")
    return Path(value) if value else None


def separate_memory_model() -> bool:
    """Force the ps's path for windows that are not unified (tests; see the table above)."""
    return bool(os.environ.get("HPCRL_SEPARATE_MODEL"))
