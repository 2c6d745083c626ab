"""Stop signals that arrive while a job starts, before its Coordinator exists.

Start-up (imports of mpi4py, h5py and torch, MPI start-up, the network build, the resume
lookup) takes seconds to minutes. Without a handler, SLURM's SIGUSR1 in that window would kill
the rank with a status the batch script does not requeue. :func:`install` is the first thing
``python -m hpcrl.run`` does, so this module imports nothing heavy; the Coordinator reads
:data:`signal_time` and takes the first coordinated checkpoint as soon as the loops run, and
the job exits 85.
"""

from __future__ import annotations

import signal
import time

#: Time (monotonic) of the first SIGUSR1/SIGTERM seen during start-up, or None.
signal_time: float | None = None


def _record(signum, frame) -> None:
    global signal_time
    if signal_time is None:
        signal_time = time.monotonic()


def install() -> None:
    """Record SIGUSR1 and SIGTERM from now on (the Coordinator installs its own later)."""
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, _record)
