"""Sharded parameter store over one-sided MPI RMA windows.

Differs from Gorila (Nair et al. 2015): there the parameter servers are RPC servers on separate
machines. Here each shard is memory in an MPI window hosted by a ps rank, and clients read and
write it with one-sided operations, so a client never waits for the server's Python loop to
answer a request, and the same code runs on one node (shared memory) or many.

Per ps rank, three windows over the store communicator (every rank joins; non-ps ranks expose
zero bytes):

* ``par``  float32 ``[4, n]``: parameters in a double buffer (rows 0/1) and the target network
  in a double buffer (rows 2/3). Version ``v`` of the parameters lives in row ``v % 2``.
* ``slot`` float32 ``[n_clients, n + 2]``: one gradient inbox per client, then the learning rate
  that client asks for (the clients own the lr schedule, e.g. A3C's annealing) and the squared
  L2 norm of the whole gradient, computed by the client (most clients have it already, e.g.
  for norm clipping), so the ps learns whether the gradient is finite without a pass over it.
* ``hdr``  int64: the named words of :mod:`hpcrl.runtime.params.header`, then one flag per
  client slot (0 = empty, else version + 1); job-wide words through :meth:`ParameterStore.word`.

**Consistent reads (seqlock over a double buffer).** The ps writes version ``v + 1`` into row
``(v + 1) % 2`` while readers read row ``v % 2``. Before it starts writing version ``u`` it
publishes ``S = u``; after, ``V = u``. A reader fetches ``V = v``, ``Get``s row ``v % 2``,
``Flush``es, then fetches ``S``: the row it read was untouched iff ``S <= v + 1`` (the write of
``v + 2``, the next one to reuse that row, had not begun), else it retries. A plain ``Get`` that
overlaps a local update can return a mix of two versions (measured on this MPICH; see
docs/architecture.md), which is what this prevents.

**Progress.** Every rank opens one passive epoch per window with ``Lock_all(MODE_NOCHECK)`` at
creation and completes operations with ``Flush``: with MPICH a ``Lock`` needs the target's help
and stalls while the ps computes outside MPI, whereas ``Flush`` on a NOCHECK epoch does not
(a 1.7 M-float Get took 2.8 ms while the target slept).

**Pushes.** A client ``Put``s its gradient into its own slot on every shard, ``Flush``es, then sets
the slot's flag atomically to ``version + 1``. The ps polls the flags, applies or drops each
gradient through :class:`hpcrl.optim.ShardOptimizer` and clears the flag; a client waits for its
flag to be clear before it writes the slot again. One gradient per optimiser step, as the paper's
servers apply each gradient they receive (an ``Accumulate`` inbox would merge gradients before
AdaGrad/RMSProp see them and lose the version each one was computed from).

**Shards.** Each shard counts its own versions; a pull returns one version per shard and a push
tags each shard's part with that shard's version. As in Gorila's sharded servers, different
shards may be at slightly different versions at any moment.

The ps side, the loop that applies the gradients, is :mod:`hpcrl.runtime.params.server`.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from hpcrl.runtime import hooks, watchdog
from hpcrl.runtime.params.header import FLAGS, Word
from hpcrl.runtime.topology import shard_ranges


class NonFiniteState(ValueError):
    """A shard's parameters hold NaN or inf: that checkpoint generation must not be written."""

class PeerStalled(RuntimeError):
    """A ps shard has not taken this client's gradient for ``ParameterStore.stall_s``
    seconds: its rank is frozen (a stopped process, a node stuck on a file system) or dead."""


V, S, TV, TS = Word.V, Word.S, Word.TV, Word.TS
_NO_OP_ORIGIN = np.zeros(1, np.int64)


def piece_puts(piece_sizes: tuple[int, ...], ranges: list[tuple[int, int]]
               ) -> list[list[tuple[int, int, int, int]]]:
    """The Puts that write each shard's part of a vector held as consecutive pieces.

    A gradient can reach :meth:`ParameterStore.push` as the parameters' own ``.grad`` buffers
    (one piece per parameter, in layout order) instead of one flat copy: backward then writes
    fresh tensors rather than accumulating into a zeroed flat vector, which saved 0.45 ms of a
    4.4 ms A3C Pong rollout gradient.

    Args:
        piece_sizes: lengths of the pieces; their concatenation is the vector.
        ranges: [start, stop) of each shard in the vector.

    Returns:
        For each shard, a list of (piece, start in piece, count, offset in shard).
    """
    if sum(piece_sizes) != (ranges[-1][1] if ranges else 0):
        raise ValueError(f"pieces hold {sum(piece_sizes)} floats, the shards {ranges[-1][1]}")
    starts = [0, *itertools.accumulate(piece_sizes)]
    plan = []
    for a, b in ranges:
        puts = []
        for k, size in enumerate(piece_sizes):
            lo, hi = max(a, starts[k]), min(b, starts[k] + size)
            if lo < hi:
                puts.append((k, lo - starts[k], hi - lo, lo - a))
        plan.append(puts)
    return plan


@dataclass(frozen=True)
class StoreSpec:
    """What every rank must agree on to create the store collectively."""

    n_params: int
    ps_ranks: tuple[int, ...]
    client_ranks: tuple[int, ...]
    #: the network's tensors in the flat vector's order (sizes): each shard publishes, per
    #: tensor, how many of its parameters' optimiser statistics are exactly 0 (network health)
    tensor_sizes: tuple[int, ...] = ()

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return shard_ranges(self.n_params, len(self.ps_ranks))

    @property
    def n_clients(self) -> int:
        return len(self.client_ranks)


class ParameterStore:
    """One rank's handle on the store: a ps rank hosts one shard, a client reads and writes all.

    Call order (collective parts marked):

        store = ParameterStore(comm, spec)          # collective: windows + epochs
        store.initialize(theta0)                    # collective; theta0 given on one client
        # clients:                                  # ps ranks: ShardServer(store, ...).serve()
        versions = store.pull(theta)
        store.push(grad, versions, lr)
        store.done()                                # or coordinated stops (hpcrl.coord)
        store.free()                                # collective
    """

    def __init__(self, comm: MPI.Comm, spec: StoreSpec):
        self.comm, self.spec = comm, spec
        self.rank = comm.Get_rank()
        self.n_ps = len(spec.ps_ranks)
        self.shard = spec.ps_ranks.index(self.rank) if self.rank in spec.ps_ranks else None
        self.client = (spec.client_ranks.index(self.rank)
                       if self.rank in spec.client_ranks else None)
        self.sizes = [b - a for a, b in spec.ranges]
        n = self.sizes[self.shard] if self.shard is not None else 0
        ncl = spec.n_clients
        own = self.shard is not None
        self.win_par = MPI.Win.Allocate(4 * n * 4 if own else 0, 4, comm=comm)
        self.win_slot = MPI.Win.Allocate(ncl * (n + 2) * 4 if own else 0, 4, comm=comm)
        #: first header word of the per-tensor zero-statistic counts (after the client flags)
        self.health_word = FLAGS + ncl
        n_words = self.health_word + len(spec.tensor_sizes)
        self.win_hdr = MPI.Win.Allocate(n_words * 8 if own else 0, 8, comm=comm)
        self._wins = (self.win_par, self.win_slot, self.win_hdr)
        if own:
            self.par = np.frombuffer(self.win_par.tomemory(), np.float32).reshape(4, n)
            self.slots = np.frombuffer(self.win_slot.tomemory(), np.float32).reshape(ncl, n + 2)
            self.hdr = np.frombuffer(self.win_hdr.tomemory(), np.int64)
            self.par[...] = 0
            self.slots[...] = 0
            self.hdr[...] = 0
        for win in self._wins:
            win.Lock_all(MPI.MODE_NOCHECK)
        # A ps rank reads its own header words, and writes those only it writes, with plain
        # loads/stores plus Win_sync (a memory barrier) instead of MPI atomics on itself: with
        # MPICH those take a lock that the clients' atomics contend for, and on an
        # oversubscribed node they cost the ps ~100 us each (measured: 14 % of its time, more
        # than applying the gradients). Only valid in the unified memory model.
        self._local_hdr = (own and self.win_hdr.model == MPI.WIN_UNIFIED
                           and not hooks.separate_memory_model())
        self._res = np.zeros(max(self.n_ps, 1), np.int64)
        self._res2 = np.zeros(max(self.n_ps, 1), np.int64)
        self._word = np.zeros(1, np.int64)
        # one origin buffer per shard for push's version tags: MPI forbids changing an origin
        # buffer before the operation completes, and they complete together at one Flush_all
        self._tags = np.zeros(max(self.n_ps, 1), np.int64)
        self._lr_norm = np.zeros(2, np.float32)          # lr, squared norm
        self._plans: dict[tuple[int, ...], list] = {}
        #: seconds a client waits for a shard to take its gradient before it raises
        #: PeerStalled naming that shard's rank (0 = wait for ever, without watchdog beats);
        #: while it waits it feeds its watchdog, which would otherwise blame the client
        self.stall_s = 0.0
        self._freed = False
        comm.Barrier()

    # ------------------------------------------------------------------ atomics on header words
    def _fetch_words(self, word: int | list[int], shards, out: np.ndarray) -> None:
        """out[j] = header word of shard j (atomic NO_OP fetch), for j in shards."""
        words = word if isinstance(word, list) else [word] * self.n_ps
        for j in shards:
            self.win_hdr.Fetch_and_op(_NO_OP_ORIGIN, out[j:j + 1], self.spec.ps_ranks[j],
                                      words[j], MPI.NO_OP)
        self.win_hdr.Flush_all()

    def _atomic(self, shard: int, word: int, value: int, op=MPI.REPLACE) -> int:
        """Apply ``op`` to one header word of ``shard``; returns the old value."""
        self._word[0] = value
        out = np.zeros(1, np.int64)
        target = self.spec.ps_ranks[shard]
        self.win_hdr.Fetch_and_op(self._word, out, target, word, op)
        self.win_hdr.Flush(target)
        return int(out[0])

    def read_word(self, shard: int, word: int) -> int:
        if shard == self.shard and self._local_hdr:
            self.win_hdr.Sync()
            return int(self.hdr[word])
        return self._atomic(shard, word, 0, MPI.NO_OP)

    def write_own_word(self, word: int, value: int) -> None:
        """Set a header word of this rank's shard that no other rank writes concurrently
        (versions, drop counters, a client's flag the ps clears)."""
        if self._local_hdr:
            self.hdr[word] = value
            self.win_hdr.Sync()
        else:
            self._atomic(self.shard, word, value, MPI.REPLACE)

    # ------------------------------------------------------------------ set-up
    def initialize(self, theta0: np.ndarray | None) -> None:
        """Collective. The one rank that passes ``theta0`` writes it as version 0 and target 0."""
        if theta0 is not None:
            theta0 = np.ascontiguousarray(theta0, np.float32)
            assert theta0.shape == (self.spec.n_params,), theta0.shape
            for j, (a, b) in enumerate(self.spec.ranges):
                target, n = self.spec.ps_ranks[j], b - a
                self.win_par.Put(theta0[a:b], target, (0, n, MPI.FLOAT))
                self.win_par.Put(theta0[a:b], target, (2 * n, n, MPI.FLOAT))
            self.win_par.Flush_all()
        self.comm.Barrier()
        if self.shard is not None:
            self.win_par.Sync()

    # ------------------------------------------------------------------ client side
    def _read_rows(self, out: np.ndarray, v_word: int, s_word: int, row0: int) -> np.ndarray:
        vres, sres = self._res, self._res2
        pending = list(range(self.n_ps))
        while pending:
            self._fetch_words(v_word, pending, vres)
            for j in pending:
                a, b = self.spec.ranges[j]
                n = b - a
                row = row0 + int(vres[j]) % 2
                self.win_par.Get(out[a:b], self.spec.ps_ranks[j], (row * n, n, MPI.FLOAT))
            self.win_par.Flush_all()
            self._fetch_words(s_word, pending, sres)
            pending = [j for j in pending if sres[j] > vres[j] + 1]
        return vres[:self.n_ps].copy()

    def pull(self, out: np.ndarray) -> np.ndarray:
        """Fill ``out`` (float32 [n_params]) with a consistent snapshot of every shard.

        Returns:
            int64 [n_ps]: the version of each shard that was read (tag pushes with it).
        """
        return self._read_rows(out, V, S, 0)

    def pull_target(self, out: np.ndarray) -> np.ndarray:
        """Like :meth:`pull` for the target-network copy; returns each shard's target version."""
        return self._read_rows(out, TV, TS, 2)

    def _flag_word(self) -> int:
        return FLAGS + self.client

    def push(self, grad: np.ndarray | list[np.ndarray], versions: np.ndarray, lr: float,
             sq_norm: float | None = None, poll_s: float = 50e-6) -> None:
        """Hand one gradient to every shard, tagged with the versions it was computed from.

        Args:
            grad: the flat float32 vector, or consecutive 1-D float32 pieces of it (e.g. each
                parameter's ``.grad``, see :func:`piece_puts`).
            versions: the shard versions it was computed from (:meth:`pull`).
            lr: the learning rate to apply it with.
            sq_norm: its squared L2 norm (float32 dots), if the caller has it; the shards drop
                the gradient when this is not finite (NaN/inf, or float32 overflow).

        Waits (polling) while this client's previous gradient is still in a shard's inbox.
        """
        pieces = [grad] if isinstance(grad, np.ndarray) else grad
        pieces = [np.ascontiguousarray(g, np.float32).reshape(-1) for g in pieces]
        sizes = tuple(g.size for g in pieces)
        plan = self._plans.get(sizes)
        if plan is None:
            plan = self._plans[sizes] = piece_puts(sizes, self.spec.ranges)
        if sq_norm is None:
            sq_norm = sum(float(np.dot(g, g)) for g in pieces)
        finite32 = sq_norm <= np.finfo(np.float32).max           # False for NaN too
        self._lr_norm[:] = lr, (sq_norm if finite32 else np.inf)
        flag = self._flag_word()
        flags = self._res
        pending = list(range(self.n_ps))
        t0 = time.monotonic()
        while pending:
            self._fetch_words(flag, pending, flags)
            self._check_stall(t0, [j for j in pending if flags[j] != 0])
            free = [j for j in pending if flags[j] == 0]
            for j in free:
                n, target = self.sizes[j], self.spec.ps_ranks[j]
                base = self.client * (n + 2)
                for k, start, count, dst in plan[j]:
                    self.win_slot.Put(pieces[k][start:start + count], target,
                                      (base + dst, count, MPI.FLOAT))
                self.win_slot.Put(self._lr_norm, target, (base + n, 2, MPI.FLOAT))
            self.win_slot.Flush_all()
            for j in free:
                self._tags[j] = int(versions[j]) + 1
                self.win_hdr.Accumulate(self._tags[j:j + 1], self.spec.ps_ranks[j], flag,
                                        MPI.REPLACE)
            self.win_hdr.Flush_all()
            pending = [j for j in pending if flags[j] != 0]
            if pending:
                time.sleep(poll_s)

    def wait_consumed(self, poll_s: float = 50e-6, timeout_s: float | None = None) -> bool:
        """Block until every shard has taken this client's last gradient out of its inbox (a
        shard clears the flag after applying or dropping it), or ``timeout_s`` has passed.

        Returns:
            True if every shard took it.
        """
        t0 = time.monotonic()
        deadline = None if timeout_s is None else t0 + timeout_s
        pending = list(range(self.n_ps))
        while pending:
            self._fetch_words(self._flag_word(), pending, self._res)
            pending = [j for j in pending if self._res[j] != 0]
            if pending:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                self._check_stall(t0, pending)
                time.sleep(poll_s)
        return True

    def _check_stall(self, t0: float, full: list[int]) -> None:
        """Raise PeerStalled when shards in ``full`` have held this client's gradient since
        ``t0`` for longer than ``stall_s``."""
        if not full or self.stall_s <= 0:
            return
        watchdog.beat()                 # waiting on a peer: the peer's watchdog speaks first
        if time.monotonic() - t0 > self.stall_s:
            ranks = ", ".join(f"rank {self.spec.ps_ranks[j]} (ps, shard {j})" for j in full)
            raise PeerStalled(f"{ranks} has not taken rank {self.comm.Get_rank()}'s gradient "
                              f"for {time.monotonic() - t0:.0f} s: that rank is frozen or dead")

    def word(self, word: Word) -> "SharedWord":
        """A job-wide header word of shard 0 (frames, steps, the checkpoint words)."""
        return SharedWord(self, word)

    def target_version(self) -> int:
        """The version of shard 0's target copy (it changes when the ps refreshes it)."""
        return self.read_word(0, TV)

    def request_target_refresh(self, count: int = 1) -> None:
        """Ask every shard for ``count`` copies of its parameters to the target copy (async
        methods' I_target; one per multiple of the period crossed)."""
        for j in range(self.n_ps):
            self._atomic(j, Word.TARGET_REQ, count, MPI.SUM)

    def done(self) -> None:
        """This client will push no more: a shard stops serving when all clients said so."""
        for j in range(self.n_ps):
            self._atomic(j, Word.DONE, 1, MPI.SUM)

    def zero_statistics(self) -> np.ndarray:
        """Per tensor, how many parameters' optimiser statistics were exactly 0 when their
        shards last counted (``ShardServer.count_zero_statistics`` in
        :mod:`hpcrl.runtime.params.server`), summed over shards; int64 [n_tensors]."""
        n_t = len(self.spec.tensor_sizes)
        total = np.zeros(n_t, np.int64)
        for t in range(n_t):
            self._fetch_words(self.health_word + t, range(self.n_ps), self._res)
            total[t] = int(self._res[:self.n_ps].sum())
        return total

    def counters(self) -> dict:
        """Progress counters. Every gradient is applied or dropped by each shard on its own, so
        ``applied`` is shard 0's count (one per gradient), the drop counts are the largest over
        shards (a gradient stale at any shard counts once), and ``*_per_shard`` keep the detail."""
        out: dict = {}
        for name, word in {"applied": Word.APPLIED, "dropped_stale": Word.STALE,
                           "dropped_nonfinite": Word.NONFINITE}.items():
            self._fetch_words(word, range(self.n_ps), self._res)
            per_shard = [int(x) for x in self._res[:self.n_ps]]
            out[name] = per_shard[0] if name == "applied" else max(per_shard)
            out[f"{name}_per_shard"] = per_shard
        for name, word in {"frames": Word.FRAMES, "steps": Word.STEPS}.items():
            out[name] = self.read_word(0, word)
        return out

    # ------------------------------------------------------------------ teardown
    def free(self) -> None:
        """Collective. Safe to call twice."""
        if self._freed:
            return
        self._freed = True
        self.comm.Barrier()
        for win in self._wins:
            win.Unlock_all()
            win.Free()


class SharedWord:
    """One job-wide int64 word on shard 0, updated with MPI atomics by any rank.

    What ``mpi4py.util.sync.Counter`` is to its own window, this is to one header word of the
    store's: an object that says what it counts (``store.word(Word.FRAMES)``), so no caller
    needs the header's layout or the store's atomics.
    """

    def __init__(self, store: ParameterStore, word: Word):
        self.store, self.word = store, Word(word)

    def read(self) -> int:
        return self.store.read_word(0, self.word)

    def add(self, n: int) -> int:
        """Atomically add ``n``; returns the new total."""
        return self.store._atomic(0, self.word, n, MPI.SUM) + n

    def raise_to(self, value: int) -> int:
        """Atomically set the word to max(word, value); returns the old value."""
        return self.store._atomic(0, self.word, value, MPI.MAX)

    def set(self, value: int) -> int:
        """Atomically set the word; returns the old value."""
        return self.store._atomic(0, self.word, value, MPI.REPLACE)
