"""Every rank ends within seconds when the process that launched it is gone.

A rank's parent is its launcher's local process: MPICH's ``hydra_pmi_proxy``, Open MPI's
``prterun`` (one node) or ``prted``, SLURM's ``slurmstepd``. When that process is killed (a
``kill -9`` of mpirun, the OOM killer, a crashed node daemon), the kernel gives its ranks a new
parent, and nothing tells them: the launcher that would have killed them is the one that died.
Under Open MPI they then run on, or wait for ever on a peer that died with the launcher, and an
``MPI_Abort`` has no server left to carry it. Left alone they would hold the node's cores and
memory, and rank 0 its run directory's lock, until someone finds them.

So each rank of a job of more than one rank watches its parent process id from a daemon thread
(:data:`PERIOD_S`); when it changes, the rank writes one line and leaves with
``os._exit(EXIT_FAILURE)``: no MPI call (there is no launcher to answer it), no file written
(the checkpoint generations on disk are complete or ignored, as after a SIGKILL). A single
rank (world size 1) is not watched: ``nohup python -m hpcrl.run &`` outlives its shell on
purpose.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from hpcrl.runtime.exits import EXIT_FAILURE

#: How often a rank looks at its parent process id (seconds).
PERIOD_S = 1.0


def start(parent: int, rank: int, period_s: float = PERIOD_S) -> threading.Thread | None:
    """Watch ``parent`` (this rank's parent pid, read at start-up) from a daemon thread.

    Returns the thread, or None where the parent cannot be watched: pid 1 (the launcher is the
    container's init; if it ends, so does the container).
    """
    if parent <= 1:
        return None
    thread = threading.Thread(target=_watch, args=(parent, rank, period_s),
                              name="hpcrl-launcher-watch", daemon=True)
    thread.start()
    return thread


def _watch(parent: int, rank: int, period_s: float) -> None:
    while os.getppid() == parent:          # a dead parent's children get a new one
        time.sleep(period_s)
    try:
        sys.stderr.write(f"hpcrl: rank {rank} on host {socket.gethostname()}: its launcher "
                         f"(parent process {parent}) is gone; exiting without writing "
                         "anything more\n")
        sys.stderr.flush()
    except (OSError, ValueError):   # the launcher held the other end of stderr
        pass
    os._exit(EXIT_FAILURE)
