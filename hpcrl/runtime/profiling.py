"""In-job timing for ``python -m hpcrl.bench scaling`` (on when ``HPCRL_PHASE_TIMES_DIR`` is
set, see :mod:`hpcrl.runtime.hooks`): cumulative clocks appended as JSON Lines rows.

* :class:`PhaseClock`, on an actor-learner: seconds spent in env steps, acting forward passes
  and rollout gradients. Timed inside the running loop, the bound is measured in the same
  process and over the same seconds as the rate, so a machine that changes speed between two
  measurements cannot move their ratio.
* :func:`ps_cpu_clock`, on a ps rank: its process CPU seconds and gradients applied.

Both write through :func:`append_row`; the benchmark reads the files after the job.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable


def append_row(path: Path, row: dict) -> None:
    """Append one JSON object as a line (the files are read after the job ends)."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


class PhaseClock:
    """Cumulative seconds one actor-learner spends in each phase of its bound.

    Appends ``{"t", "agent_steps", "env_s", "forward_s", "learn_s"}`` (cumulative) to ``path``
    at most every ``every_s`` seconds of wall time. What the loop does beyond the three phases
    (pull, push, counters, rollout bookkeeping, action sampling) is the gap to the bound.
    """

    PHASES = ("env", "forward", "learn")

    def __init__(self, path: Path, every_s: float = 2.0):
        self._now, self.path, self.every_s = time.perf_counter, Path(path), every_s
        self.seconds = dict.fromkeys(self.PHASES, 0.0)
        self._last_write = -float("inf")
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def timed(self, phase: str, fn: Callable) -> Callable:
        """``fn`` wrapped so that its calls add to ``phase``."""
        def wrapper(*args, **kwargs):
            t0 = self._now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += self._now() - t0
        return wrapper

    def maybe_write(self, agent_steps: int, force: bool = False) -> None:
        if not force and self._now() - self._last_write < self.every_s:
            return
        self._last_write = self._now()
        append_row(self.path, {"t": time.time(), "agent_steps": agent_steps,
                               **{f"{k}_s": v for k, v in self.seconds.items()}})


class NullClock:
    """A PhaseClock that times nothing (the default: no wrapper, no file)."""

    def timed(self, phase: str, fn: Callable) -> Callable:
        return fn

    def maybe_write(self, agent_steps: int, force: bool = False) -> None:
        pass


def ps_cpu_clock(path: Path, applied: Callable[[], int], then: Callable | None = None,
                 every_s: float = 2.0) -> Callable[[], None]:
    """An ``on_tick`` for a ps rank: appends ``{"t", "cpu_s", "applied"}`` (this process's
    CPU seconds and ``applied()`` gradients, cumulative) to ``path`` every ``every_s``; calls
    ``then`` (rank 0's metrics tick) every time."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    last = -float("inf")

    def tick() -> None:
        nonlocal last
        if then is not None:
            then()
        now = time.monotonic()
        if now - last >= every_s:
            last = now
            append_row(path, {"t": time.time(), "cpu_s": time.process_time(),
                              "applied": applied()})
    return tick
