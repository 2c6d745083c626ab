"""A per-rank watchdog: a rank that stops making progress is reported and the job aborted.

Every role's loop calls :meth:`Watchdog.beat` once per iteration (through
``Coordinator.due``, which every loop polls). A daemon thread checks the time since the last
beat; past ``timeout_s`` it prints the rank, role, host and the main thread's stack (where it is
stuck: a deadlock, an MPI call waiting for a dead node, an endless loop) and calls
``COMM_WORLD.Abort``, so the job ends instead of holding its allocation until the time limit.

The same thread bounds the rank's memory (``memory_bound``, from the pre-flight estimate plus
``memory_guard_gb``). A rank whose memory runs away does not stop beating: the node swaps and
every rank on it crawls on at a few frames a second, for hours, with no error anywhere. Past
the bound the rank reports its anonymous resident memory, the largest arrays and tensors it
holds and the main thread's stack, and aborts the job the same way. It also watches the node
(:mod:`hpcrl.runtime.node_guard`, ``memory_floor_gb``): ranks that each stay under their bound
can together run the node out of memory.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import sys
import threading
import time
import traceback
import warnings

from hpcrl.runtime.node_guard import NodeGuard, anonymous_resident_bytes


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
    """Watch this rank's progress (``timeout_s``); its memory once :func:`bound_memory` says."""
    global CURRENT
    CURRENT = Watchdog(timeout_s, rank, role, abort)
    return CURRENT


def bound_memory(bound: float | None) -> None:
    """From now on, abort the job when this rank's anonymous memory passes ``bound`` bytes
    (None: no bound). A rank arms it once its start-up is over, so the state it read from a
    checkpoint and copied into place no longer counts twice."""
    if CURRENT is not None:
        CURRENT.memory_bound = bound


def guard_node(guard: NodeGuard | None) -> None:
    """From now on, also watch this rank's node (:mod:`hpcrl.runtime.node_guard`; None: do
    not). Every rank arms it as its watchdog starts, so that the rank whose memory takes the
    node short is watching when it does; a resumed rank's second copy of its state (see
    :func:`bound_memory`) is memory the node must hold all the same."""
    if CURRENT is not None:
        CURRENT.node_guard = guard


def largest_buffers(n: int = 5) -> list[tuple[float, str]]:
    """The ``n`` largest numpy arrays and torch tensors reachable by the garbage collector, as
    (bytes, description): where a runaway rank's memory went, when it is held by Python."""
    found, seen = [], set()
    with warnings.catch_warnings():         # deprecated module attributes warn when touched
        warnings.simplefilter("ignore")
        for obj in _reachable():
            if id(obj) not in seen:
                seen.add(id(obj))
                found.extend(_describe(obj))
    return sorted(found, key=lambda t: -t[0])[:n]


def python_allocations(n: int = 8) -> str:
    """Where Python's own allocations are, by line, when the rank runs under ``tracemalloc``
    (``PYTHONTRACEMALLOC=1`` or ``-X tracemalloc``; slow, for chasing a leak); else ""."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return ""
    top = tracemalloc.take_snapshot().statistics("lineno")[:n]
    traced, _ = tracemalloc.get_traced_memory()
    return (f"Python allocations by line (tracemalloc, {traced / 1e9:.2f} GB traced):\n"
            + "".join(f"  {st.size / 1e9:.3f} GB in {st.count} blocks  {st.traceback[0]}\n"
                      for st in top))


def _describe(obj) -> list[tuple[float, str]]:
    """``[(bytes, description)]`` for a numpy array or torch tensor, else ``[]``."""
    kind = type(obj).__name__
    try:
        if kind == "ndarray":
            return [(float(obj.nbytes), f"ndarray {obj.dtype} {obj.shape}")]
        if kind in ("Tensor", "Parameter"):
            return [(float(obj.untyped_storage().nbytes()),
                     f"{kind} {obj.dtype} {tuple(obj.shape)}")]
    except Exception:  # noqa: BLE001 - a half-built or foreign object: skip it
        pass
    return []


def _reachable():
    """Objects tracked by the collector, what they hold, and the locals of every thread's
    stack: numpy arrays, and the dicts and tuples that hold only arrays, are not tracked."""
    for holder in gc.get_objects():
        yield holder
        for held in gc.get_referents(holder):
            yield held
            if isinstance(held, (dict, list, tuple)) and not gc.is_tracked(held):
                yield from (held.values() if isinstance(held, dict) else held)
    for frame in sys._current_frames().values():
        while frame is not None:
            yield from list(frame.f_locals.values())
            frame = frame.f_back


class Watchdog:
    def __init__(self, timeout_s: float, rank: int, role: str, abort):
        self.timeout_s, self.rank, self.role, self.abort = timeout_s, rank, role, abort
        self.memory_bound: float | None = None      # bytes; set by :func:`bound_memory`
        self.node_guard: NodeGuard | None = None    # set by :func:`guard_node`
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
            bound = self.memory_bound
            held = anonymous_resident_bytes() if bound else None
            if held is not None and held > bound:
                self._report_memory(held, bound)
                self.abort()
                return
            found = self._check_node()
            if found is not None:
                self._report_node(*found)
                self.abort()
                return

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._main)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)\n"

    def _report_memory(self, held: float, bound: float) -> None:
        largest = self._largest()
        sys.stderr.write(f"hpcrl: memory guard: rank {self.rank} ({self.role}) on host "
                         f"{socket.gethostname()} holds {held / 1e9:.2f} GB of anonymous "
                         f"memory, over its bound of {bound / 1e9:.2f} GB (its "
                         "pre-flight estimate + memory_guard_gb); aborting the job before its "
                         "node swaps (--set memory_guard_gb=N raises the bound, 0 turns it "
                         f"off). Largest arrays and tensors:\n{largest}"
                         f"Main thread here:\n{self._stack()}")
        sys.stderr.flush()

    def _check_node(self) -> tuple[str, bool] | None:
        """The node guard's verdict; an error inside it turns the node guard off (with one
        line) instead of ending this thread, which also watches for hangs."""
        if self.node_guard is None:
            return None
        try:
            return self.node_guard.check(time.monotonic())
        except Exception as e:  # noqa: BLE001 - the hang watchdog must go on
            self.node_guard = None
            sys.stderr.write(f"hpcrl: warning: rank {self.rank}: node memory guard off after "
                             f"an error reading the node's memory: {e!r}\n")
            return None

    def _report_node(self, message: str, culprit: bool) -> None:
        sys.stderr.write(message)           # at once: finding the largest buffers takes a while
        sys.stderr.flush()
        if culprit:
            sys.stderr.write(f"Largest arrays and tensors of rank {self.rank}:\n"
                             f"{self._largest()}Main thread here:\n{self._stack()}")
            sys.stderr.flush()

    def _largest(self) -> str:
        return ("".join(f"  {b / 1e9:.2f} GB  {what}\n" for b, what in largest_buffers())
                or "  (none found)\n") + python_allocations()

    def _report(self, idle: float) -> None:
        stack = self._stack()
        sys.stderr.write(f"hpcrl: watchdog: rank {self.rank} ({self.role}) on host "
                         f"{socket.gethostname()} made no progress for {idle:.0f} s "
                         f"(watchdog_s = {self.timeout_s:g}"
                         f"{f', this phase {self.grace_s:.0f} s' if self.grace_s else ''}); "
                         f"aborting the job. It is stuck "
                         f"here:\n{stack}")
        sys.stderr.flush()
