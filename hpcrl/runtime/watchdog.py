"""A per-rank watchdog: a rank that stops making progress is reported and the job aborted.

Every role's loop calls :meth:`Watchdog.beat` once per iteration (through
``Coordinator.due``, which every loop polls). A daemon thread checks the time since the last
beat; past ``timeout_s`` it prints the rank, role, host and the main thread's stack (where it is
stuck: a deadlock, an MPI call waiting for a dead node, an endless loop) and calls
``COMM_WORLD.Abort``, so the job ends instead of holding its allocation until the time limit.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
import traceback


#: This rank's watchdog (set by :func:`start`); :func:`beat` is a no-op without one.
CURRENT: "Watchdog | None" = None


def beat() -> None:
    """Progress was made (call from any long loop)."""
    if CURRENT is not None:
        CURRENT.last = time.monotonic()


@contextlib.contextmanager
def allow(seconds: float):
    """Within the block, this rank counts as stuck only after ``seconds`` without a beat (at
    least ``timeout_s``): for one long operation that cannot beat, such as writing or waiting
    for a checkpoint generation of hundreds of GB, which has its own bound."""
    if CURRENT is None:
        yield
        return
    CURRENT.last, CURRENT.grace_s = time.monotonic(), seconds
    try:
        yield
    finally:
        CURRENT.last, CURRENT.grace_s = time.monotonic(), 0.0


def start(timeout_s: float, rank: int, role: str, abort) -> "Watchdog":
    global CURRENT
    CURRENT = Watchdog(timeout_s, rank, role, abort)
    return CURRENT


class Watchdog:
    def __init__(self, timeout_s: float, rank: int, role: str, abort):
        self.timeout_s, self.rank, self.role, self.abort = timeout_s, rank, role, abort
        self.last = time.monotonic()
        self.grace_s = 0.0                  # a longer bound while inside :func:`allow`
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._watch, name="hpcrl-watchdog", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while True:
            time.sleep(period)
            idle = time.monotonic() - self.last
            if idle > max(self.timeout_s, self.grace_s):
                self._report(idle)
                self.abort()           # hpcrl.runtime.exits.abort_job: a grace, then Abort
                return

    def _report(self, idle: float) -> None:
        frame = sys._current_frames().get(self._main)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)\n"
        sys.stderr.write(f"hpcrl: watchdog: rank {self.rank} ({self.role}) on host "
                         f"{socket.gethostname()} made no progress for {idle:.0f} s "
                         f"(watchdog_s = {self.timeout_s:g}"
                         f"{f', this phase {self.grace_s:.0f} s' if self.grace_s else ''}); "
                         f"aborting the job. It is stuck "
                         f"here:\n{stack}")
        sys.stderr.flush()
