"""Coordinated checkpoints and stops: every rank reaches one consistent point, then writes.

Any rank may ask for a checkpoint generation by raising the request word on shard 0
(``Word.CKPT_REQ``, an atomic MAX to ``generation + 1``): rank 0 every ``checkpoint_every_min``
minutes, a rank that received SIGUSR1 / SIGTERM (SLURM's warning before a time limit or
preemption), and a client that spent the frame budget (the final generation). A stop request
also raises ``Word.CKPT_STOP`` (1 = budget spent, 2 = signal). A stop whose generation could
not be written, or ``checkpoint_max_failures`` failed generations in a row, end the job with
stop code 3 (failed): without a checkpoint, going on or requeueing would only lose more work.

Every role polls the request word between steps. Then, in order:

1. each client finishes its step, waits until its last gradient left its inboxes, sends a marker
   to rank 0's metrics channel (and to its replay ranks), and adds 1 to ``Word.CKPT_READY``;
2. ps ranks keep applying gradients until ``Word.CKPT_READY`` equals the number of clients (then no
   gradient is in flight); rank 0 also drains the metrics messages up to every client's marker;
   replay ranks keep answering until every actor and learner sent its marker;
3. all ranks write their own file of the generation; rank 0 gathers the sizes and hashes and
   writes the manifest last (:mod:`hpcrl.io.checkpoint`), then tells everyone whether to stop.

No rank writes while another still computes, so the files describe one instant of the job:
parameters, optimiser state and counters on the ps ranks agree with every replay memory and
exploration state on the clients.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from mpi4py import MPI

from hpcrl.io import checkpoint as ck
from hpcrl.io.files import HDF5_SLACK_BYTES
from hpcrl.io.quota import quota_headroom
from hpcrl.runtime import early_signals, hooks, watchdog
from hpcrl.runtime.exits import EXIT_FAILURE, abort_job
from hpcrl.runtime.params.header import Word
from hpcrl.runtime.params.store import NonFiniteState, ParameterStore

STOP_BUDGET, STOP_SIGNAL, STOP_FAILED = 1, 2, 3
#: Tag of a rank's checkpoint file entry to rank 0 (on the coordinator's own communicator).
TAG_ENTRY = 31
#: Prefix of a rank's error that must stop the run at once (a write failed inside HDF5).
FATAL_MARK = "!"
WAIT_POLL_S = 1e-3

def _say(line: str) -> None:
    """Print one line; a closed or broken stdout (EPIPE) must not undo a checkpoint."""
    try:
        print(line, flush=True)
    except OSError:
        pass


class Coordinator:
    """One rank's part in coordinated checkpoints (see the module docstring)."""

    def __init__(self, comm: MPI.Comm, store: ParameterStore, root: Path, *, gen_done: int,
                 every_s: float, keep: int, info: dict, stall_s: float = 0.0,
                 write_bound_s: float = 600.0, startup_s: float = 0.0,
                 max_failures: int = 3, guard=None, quota_bytes: float = 0.0):
        self.comm, self.store, self.root = comm.Dup(), store, Path(root)
        #: bytes of one generation, checked against the run directory's quota (where a quota
        #: tool reports one) before each generation is written; 0 = no check
        self.quota_bytes = quota_bytes
        #: seconds one generation may take to be written and gathered on every rank
        #: (:func:`hpcrl.runtime.sizing.checkpoint_bound_s`); the watchdog waits as long
        self.write_bound_s = write_bound_s
        #: rank 0: generations that failed in a row, and how many end the job
        self.failures, self.max_failures = 0, max_failures
        #: rank 0: the run directory's lease check (raises LeaseLost when another job took the
        #: directory over), called before the manifest and before pruning
        self.guard = guard
        self.rank = comm.Get_rank()
        self.gen_done, self.every_s, self.keep, self.info = gen_done, every_s, keep, info
        self.next_time = time.monotonic() + every_s if every_s > 0 else None
        self.signal_time: float | None = early_signals.signal_time
        self._signal_sent = False
        self.stop_code = 0
        self._extra_requested = False
        #: rank 0: seconds the ps waits for clients at a checkpoint before it names those that
        #: did not arrive and aborts the job (0 = never), and the callable that names them
        self.stall_s, self.not_arrived = stall_s, None
        #: rank 0: whether a missing client is still building its worker, which may take
        #: ``startup_s`` (then that, not ``stall_s``, bounds the wait)
        self.still_starting, self.startup_s = None, startup_s
        self._wait_t0: float | None = None
        self._req, self._stop = store.word(Word.CKPT_REQ), store.word(Word.CKPT_STOP)
        self._ready, self._frames = store.word(Word.CKPT_READY), store.word(Word.FRAMES)
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGUSR2, self._on_usr2)
        if hooks.checkpoint_on_start() and self.rank == 0:
            self.request()

    def _on_usr2(self, signum, frame) -> None:
        """SIGUSR2: write a checkpoint generation now and carry on (on demand)."""
        self._extra_requested = True

    def _on_signal(self, signum, frame) -> None:
        if self.signal_time is None:
            self.signal_time = time.monotonic()

    def request(self, stop: int = 0) -> None:
        """Ask for generation ``gen_done + 1`` (idempotent: every rank asks for the same one)."""
        if stop:
            self._stop.raise_to(stop)
        self._req.raise_to(self.gen_done + 1)

    def due(self) -> bool:
        """Cheap poll (one atomic read): must this rank enter a checkpoint now? Every role's
        loop calls this once per iteration, so it also feeds the watchdog."""
        watchdog.beat()
        if self._extra_requested:
            self._extra_requested = False
            self.request()
        if self.signal_time is not None and not self._signal_sent:
            self._signal_sent = True
            self.request(STOP_SIGNAL)
        if self.next_time is not None and self.rank == 0 and time.monotonic() >= self.next_time:
            self.next_time = time.monotonic() + self.every_s
            self.request()
        return self._req.read() > self.gen_done

    def client_ready(self) -> None:
        """Step 1 for a client: no gradient of mine is in flight any more."""
        self.store.wait_consumed()
        self._ready.add(1)

    def all_clients_ready(self) -> bool:
        """Step 2's poll on a ps rank. On rank 0, a wait longer than ``stall_s`` (a frozen or
        dead client: a stopped process, a node stuck on a file system) ends the job with the
        ranks that did not arrive named. The ranks that did arrive wait in step 3's gather,
        where their own watchdogs would blame themselves after ``watchdog_s``; ``stall_s`` is
        set below that, so this report comes first."""
        watchdog.beat()
        if self._ready.read() >= self.store.spec.n_clients:
            self._wait_t0 = None
            return True
        if self.not_arrived is not None and self.stall_s > 0:
            now = time.monotonic()
            if self._wait_t0 is None:
                self._wait_t0 = now
            elif now - self._wait_t0 > self.stall_s:
                starting = self.still_starting is not None and self.still_starting()
                if not starting or now - self._wait_t0 > self.startup_s:
                    self._abort_stalled(now - self._wait_t0)
        return False

    def _abort_stalled(self, waited_s: float) -> None:
        sys.stderr.write(f"hpcrl: checkpoint generation {self.gen_done + 1}: waited "
                         f"{waited_s:.0f} s for ranks that did not arrive: {self.not_arrived()}"
                         f"; aborting the job (a frozen or dead rank; generation "
                         f"{self.gen_done} is kept)\n")
        sys.stderr.flush()
        abort_job(self.comm, EXIT_FAILURE)

    def write(self, state_fn, local_error: str | None = None) -> int:
        """Step 3, collective over every rank: write, gather, manifest. Returns the stop code
        (0 = carry on). ``local_error``: this rank cannot make the generation whole (rank 0's
        metrics.h5 flush failed: the generation would not match the metrics), so it fails."""
        gen = self.gen_done + 1
        t0 = time.monotonic()
        # Writing and waiting for the slowest rank may take far longer than watchdog_s (a
        # generation of hundreds of GB on a shared file system): the phase has its own bound,
        # and rank 0 names the ranks that did not finish within it.
        with watchdog.allow(self.write_bound_s):
            refusal = self._quota_refusal(gen) if self.quota_bytes else None
            try:
                hooks.checkpoint_delay(self.rank)
                if local_error:
                    raise OSError(local_error)
                if refusal:
                    raise OSError(errno.EDQUOT, refusal)
                if hooks.checkpoint_write_fails(self.rank):
                    raise OSError(28, "No space left on device (injected)")
                entry, error = (ck.write_state(ck.rank_file(self.root, gen, self.rank),
                                               state_fn(), crash=self._crash_point), None)
            except OSError as exc:                  # disk full, quota, unwritable: keep going
                entry, error = None, f"rank {self.rank}: {exc.strerror or exc}"
                if ck.failed_inside_hdf5(exc):
                    error = FATAL_MARK + error          # see _finish
            except NonFiniteState as exc:
                entry, error = None, f"rank {self.rank}: {exc}"
            stop = 0
            if self.rank == 0:
                stop = self._finish(gen, self._gather_entries(gen, (entry, error), t0), t0)
        # A client may get here before the others are ready (one still starting up): rank 0
        # bounds each phase and names whom it waits for; this wait is only a backstop for a
        # rank 0 that hangs itself.
        with watchdog.allow(self.startup_s + self.stall_s + 2 * self.write_bound_s):
            if self.rank != 0:
                self.comm.send((entry, error), 0, TAG_ENTRY)
            stop = self.comm.bcast(stop, root=0)
        self.gen_done = gen
        self.stop_code = stop
        if self.next_time is not None:      # the period counts from the end of a slow write
            self.next_time = max(self.next_time, time.monotonic() + self.every_s)
        return stop

    def _quota_refusal(self, gen: int) -> str | None:
        """Collective: rank 0 asks the quota tool whether generation ``gen`` fits under the
        run directory's quota; every rank gets the same answer (a reason, or None). A
        generation that does not fit is not started: a write that runs into a quota fails
        inside HDF5, after which the run must stop, where this refusal is one failed
        generation of ``checkpoint_max_failures``. The older generations still count: they
        are pruned only after the new one is published."""
        refusal = None
        if self.rank == 0:
            found = quota_headroom(self.root)
            need = self.quota_bytes * 1.05 + HDF5_SLACK_BYTES * self.comm.Get_size()
            if found is not None and found[0] < need:
                refusal = (f"{os.strerror(errno.EDQUOT)}: {found[0] / 1e6:.1f} MB left under "
                           f"{found[1]}, {need / 1e6:.1f} MB needed for generation {gen}")
        return self.comm.bcast(refusal, root=0)

    def _gather_entries(self, gen: int, mine: tuple, t0: float) -> list:
        """Rank 0: every rank's (file entry, error), in rank order, as each arrives; a rank
        still writing after ``write_bound_s`` is named and the job aborted (the previous
        generation is kept)."""
        size = self.comm.Get_size()
        entries: list = [mine] + [None] * (size - 1)
        pending = {r: self.comm.irecv(source=r, tag=TAG_ENTRY) for r in range(1, size)}
        while pending:
            for r, req in list(pending.items()):
                done, value = req.test()
                if done:
                    entries[r] = value
                    del pending[r]
            if pending and time.monotonic() - t0 > self.write_bound_s:
                roles = self.info.get("roles") or []
                names = ", ".join(f"{r} ({roles[r] if r < len(roles) else '?'})"
                                  for r in sorted(pending))
                sys.stderr.write(
                    f"hpcrl: checkpoint generation {gen}: rank(s) {names} did not finish "
                    f"writing within {self.write_bound_s:.0f} s (watchdog_s + the generation's "
                    f"size at checkpoint_min_mb_per_s); aborting the job (a file system too "
                    f"slow or stuck; generation {self.gen_done} is kept)\n")
                sys.stderr.flush()
                abort_job(self.comm, EXIT_FAILURE)
            time.sleep(WAIT_POLL_S)
        return entries

    def _finish(self, gen: int, entries, t0: float) -> int:
        """Rank 0: publish the generation (manifest, then prune) or drop it; the stop code."""
        errors = [e for _, e in entries if e]
        # A write that failed inside HDF5 (a quota) leaves that rank's library in an undefined
        # state, where another attempt may crash it: the run stops now.
        fatal = any(e.startswith(FATAL_MARK) for e in errors)
        errors = [e.removeprefix(FATAL_MARK) for e in errors]
        frames = self._frames.read()
        files = [e for e, _ in entries]
        if not errors:
            info = dict(self.info, frames=frames, wall_unix=time.time())
            try:
                self._guard()
                ck.write_manifest(self.root, gen, files, info)
                self._crash_point("manifest")
            except OSError as exc:
                errors = [f"manifest: {exc.strerror or exc}"]
        self._ready.set(0)
        stop = self._stop.read()
        if errors:
            shutil.rmtree(ck.gen_dir(self.root, gen), ignore_errors=True)
            self.failures += 1
            return self._failed(gen, errors[0], stop, fatal)
        self.failures = 0
        try:                            # the generation is published: nothing below undoes it
            self._guard()
            ck.prune(self.root, self.keep)
        except OSError as exc:
            _say(f"hpcrl: warning: older checkpoint generations not pruned "
                 f"({exc.strerror or exc})")
        size = sum(f["bytes"] for f in files) / 1e6
        since = (f", {time.monotonic() - self.signal_time:.1f} s after the signal"
                 if self.signal_time is not None else "")
        _say(f"[hpcrl] checkpoint generation {gen} at frame {frames:,}: {len(files)} files, "
             f"{size:.1f} MB, written in {time.monotonic() - t0:.1f} s{since}")
        return stop

    def _crash_point(self, step: str) -> None:
        hooks.checkpoint_crash(self.rank, step)

    def _guard(self) -> None:
        if self.guard is not None:
            self.guard()

    def _failed(self, gen: int, error: str, stop: int, fatal: bool = False) -> int:
        """A generation that could not be written: go on with a warning, or stop as failed
        when the job was stopping anyway (its state would be lost) or too many failed in a
        row."""
        kept = f"generation {self.gen_done} is the newest kept" if self.gen_done else \
            "no generation is kept"
        if stop == STOP_FAILED:         # whoever asked for this stop printed its error line
            _say(f"hpcrl: warning: checkpoint generation {gen} not written ({error}); {kept}")
            return STOP_FAILED
        if stop or fatal or self.failures >= self.max_failures:
            why = ("the job was stopping" if stop else
                   "the write failed inside HDF5, which cannot be trusted to write again"
                   if fatal else
                   f"{self.failures} generations in a row failed (checkpoint_max_failures)")
            _say(f"hpcrl: error: checkpoint generation {gen} not written ({error}); {why}: "
                 f"the run stops as failed with status 3, not requeued ({kept}; free space "
                 f"or raise the quota, then run the same command to resume)")
            return STOP_FAILED
        _say(f"hpcrl: warning: checkpoint generation {gen} not written ({error}); {kept}; "
             f"{self.failures} of checkpoint_max_failures = {self.max_failures} in a row")
        return 0
