"""The ps side of the parameter store (:mod:`hpcrl.runtime.params.store`): the loop of a ps
rank that applies or drops the gradients arriving in its shard's inboxes, refreshes the
target network, counts its optimiser statistics' zeros (dead units, live), and saves and
restores its shard for checkpoints."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.params.header import FLAGS, SAVED, Word
from hpcrl.runtime.params.optim import ShardOptimizer, tensor_pieces
from hpcrl.runtime.params.store import NonFiniteState, ParameterStore

V, S, TV, TS = Word.V, Word.S, Word.TV, Word.TS


def health_layout(tensor_sizes: Sequence[int], lo: int, hi: int) -> tuple[int, list[int]]:
    """(index of the first tensor that overlaps [lo, hi), lengths of the pieces of tensors in
    [lo, hi) in order) for one shard's flat range."""
    start = 0
    for t, size in enumerate(tensor_sizes):
        if start + size > lo:
            return t, tensor_pieces(tensor_sizes, lo, hi)
        start += size
    return len(tensor_sizes), []


def zero_counts(stat: np.ndarray, pieces: Sequence[int]) -> np.ndarray:
    """Per piece of the flat range, how many statistics are exactly 0 (``stat`` [n] or
    [n_clients, n]: a parameter counts only if every client's is 0, as in
    :func:`hpcrl.tools.diagnose.zero_fractions`)."""
    stat2 = np.atleast_2d(stat)
    zero = ~np.any(stat2 != 0, axis=0)
    starts = np.cumsum([0] + list(pieces[:-1]))
    return np.add.reduceat(zero.astype(np.int64), starts)


class ShardServer:
    """The loop of a ps rank: apply or drop the gradients that arrive in its shard's inboxes.

    Enters MPI every ``idle_sleep_s`` at most while idle (one ``Iprobe`` per poll; the flags are
    read from local memory), so it neither stalls progress nor burns a core.
    """

    def __init__(self, store: ParameterStore, optimizer: ShardOptimizer, *,
                 max_staleness: int, target_update_every: int, health_every_s: float = 5.0):
        assert store.shard is not None, "ShardServer runs on a ps rank"
        lo, hi = store.spec.ranges[store.shard]
        #: (first tensor, pieces) of this shard's slice of the network's tensors
        self._health = health_layout(store.spec.tensor_sizes, lo, hi)
        self.health_every_s = health_every_s
        self._health_at = 0.0
        self.store, self.opt = store, optimizer
        self.max_staleness = max_staleness
        self.target_update_every = target_update_every
        self.n = store.sizes[store.shard]
        self.me = store.rank
        self._flags = np.zeros(store.spec.n_clients, np.int64)
        self._ncl = store.spec.n_clients
        self._zeros = np.zeros(self._ncl, np.int64)
        self.version = int(store.hdr[V])                  # non-zero after a resume
        self.target_version = int(store.hdr[TV])
        self.targets_served = int(store.hdr[Word.TARGET_REQ])

    def _set(self, word: int, value: int) -> None:
        """Only the ps writes the words it sets (versions, its drop and apply counters)."""
        self.store.write_own_word(word, value)

    def _add(self, word: int, n: int = 1) -> None:
        self._set(word, self.store.read_word(self.store.shard, word) + n)

    def _read_flags(self) -> np.ndarray:
        win = self.store.win_hdr
        if self.store._local_hdr:
            win.Sync()
            self._flags[:] = self.store.hdr[FLAGS:FLAGS + self._ncl]
            return self._flags
        win.Get_accumulate(self._zeros, self._flags, self.me, (FLAGS, self._ncl, MPI.INT64_T),
                           MPI.NO_OP)
        win.Flush(self.me)
        return self._flags

    def poll(self) -> int:
        """Process every full inbox once; returns how many gradients were taken.

        Enters MPI once per call even when the header is read locally: MPICH progresses
        messages only inside MPI calls, and a rank's eager sends to this rank (rank 0 is a ps
        and receives the metrics) block once the shared-memory cells fill up."""
        self.store.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        flags = self._read_flags()
        taken = 0
        for client in np.flatnonzero(flags):
            self._take(int(client), int(flags[client]) - 1)
            taken += 1
        self._maybe_refresh_target()
        return taken

    def discard_inboxes(self) -> None:
        """Empty every full inbox without applying its gradient (``bench learner`` times the
        client side of an update on one rank; a real ps applies on another core)."""
        for client in np.flatnonzero(self._read_flags()):
            self._set(FLAGS + int(client), 0)

    def _take(self, client: int, tag: int) -> None:
        self.store.win_slot.Sync()
        row = self.store.slots[client]
        grad, lr, sq_norm = row[:self.n], float(row[self.n]), float(row[self.n + 1])
        # The client's squared norm of the whole gradient: NaN or inf anywhere makes it
        # non-finite, and so does a float32 overflow, which would turn AdaGrad/RMSProp
        # statistics into inf all the same. Taking it from the client spares the ps a pass
        # over the gradient (0.18 of its 0.85 ms per A3C Pong gradient).
        if not np.isfinite(sq_norm) or not np.isfinite(lr):
            self._add(Word.NONFINITE)
        elif self.version - tag > self.max_staleness:
            self._add(Word.STALE)
        else:
            self._apply(grad, lr, client)
        self._set(FLAGS + client, 0)        # the client writes it only while it is 0

    def _apply(self, grad: np.ndarray, lr: float, client: int) -> None:
        v, par = self.version, self.store.par
        self._set(S, v + 1)                               # readers of row (v+1)%2 must retry
        self.opt.step(par[v % 2], grad, par[(v + 1) % 2], lr, client)
        self.store.win_par.Sync()
        self._set(V, v + 1)
        self.version = v + 1
        self._add(Word.APPLIED)
        if self.target_update_every and self.version % self.target_update_every == 0:
            self.refresh_target()

    def refresh_target(self) -> None:
        """Copy the current parameters into the target double buffer (Gorila's theta-)."""
        u, par = self.target_version + 1, self.store.par
        self._set(TS, u)
        par[2 + u % 2] = par[self.version % 2]
        self.store.win_par.Sync()
        self._set(TV, u)
        self.target_version = u

    def _maybe_refresh_target(self) -> None:
        requested = self.store.read_word(self.store.shard, Word.TARGET_REQ)
        while self.targets_served < requested:
            self.refresh_target()
            self.targets_served += 1

    def finished(self) -> bool:
        """Every client called ``done()`` (the plain shutdown, without a coordinator)."""
        st = self.store
        return st.read_word(st.shard, Word.DONE) >= st.spec.n_clients

    def serve(self, idle_sleep_s: float = 2e-3, on_tick=None, tick_s: float = 0.02,
              coord=None, before_write=None) -> int:
        """Serve until every client called ``done()`` (no ``coord``), or until a coordinated
        checkpoint says stop. Returns the stop code (0 without ``coord``).

        ``on_tick`` (rank 0's metrics gathering) runs at most every ``tick_s`` seconds, busy or
        not. With a coordinator, a due checkpoint keeps this loop applying gradients until every
        client is ready, then runs ``before_write`` (which may return an error that fails the
        generation: rank 0's metrics flush) and writes this shard's state.
        """
        last_tick = 0.0
        while True:
            taken = self.poll()
            if time.monotonic() - self._health_at >= self.health_every_s:
                self.count_zero_statistics()
            if on_tick is not None and time.monotonic() - last_tick >= tick_s:
                on_tick()
                last_tick = time.monotonic()
            if coord is not None and coord.due():
                while not coord.all_clients_ready():
                    if not self.poll():
                        time.sleep(idle_sleep_s / 4)
                self.poll()
                error = before_write() if before_write is not None else None
                stop = coord.write(self._checkpoint_state, local_error=error)
                if stop:
                    return stop
                continue
            if taken:
                continue
            if coord is None and self.finished():
                self.poll()                                 # drain what raced with DONE
                return 0
            time.sleep(idle_sleep_s)

    def count_zero_statistics(self) -> None:
        """Publish, per tensor, how many of this shard's parameters have an optimiser
        statistic of exactly 0 (RMSProp's v or AdaGrad's G; for every client under per-client
        RMSProp): what ``python -m hpcrl.diagnose`` reads from a checkpoint, counted live.
        A few hundred microseconds per million parameters."""
        self._health_at = time.monotonic()
        first, pieces = self._health
        stat = self.opt.statistic()
        if stat is None or not pieces:
            return
        for k, count in enumerate(zero_counts(stat, pieces)):
            self._set(self.store.health_word + first + k, int(count))

    def _checkpoint_state(self) -> dict[str, np.ndarray]:
        """The state a generation saves, with the health counts of exactly that state (a
        report after the checkpoint agrees with ``hpcrl.diagnose`` of it)."""
        self.count_zero_statistics()
        return self.get_state()

    # ------------------------------------------------------------------ state (checkpoints)
    def get_state(self) -> dict[str, np.ndarray]:
        """This shard's parameters, target, optimiser state and counters (a quiescent ps)."""
        par, hdr = self.store.par, self.store.hdr
        for name, row in (("parameters", par[self.version % 2]),
                          ("target parameters", par[2 + self.target_version % 2])):
            if not np.isfinite(row.sum(dtype=np.float64)):
                raise NonFiniteState(f"shard {self.store.shard} {name} hold NaN or inf; this "
                                     "generation is not written (lower the learning rate?)")
        state = {f"opt/{k}": v for k, v in self.opt.get_state().items()}
        state.update(params=par[self.version % 2].copy(),
                     target=par[2 + self.target_version % 2].copy())
        state.update({f"hdr/{name}": np.int64(hdr[w]) for name, w in SAVED.items()})
        return state


def load_shard_state(store: ParameterStore, opt: ShardOptimizer, state: dict) -> None:
    """Put a checkpointed shard back into this ps rank's window, before ``initialize``.

    Raises:
        ValueError: the checkpoint's shard does not have this shard's size.
    """
    n = store.sizes[store.shard]
    if np.shape(state["params"]) != (n,) or np.shape(state["target"]) != (n,):
        raise ValueError(f"checkpoint shard has {np.shape(state['params'])} parameters, this "
                         f"shard has {n}: the network or the number of ps ranks differs")
    v, tv = int(state["hdr/V"]), int(state["hdr/TV"])
    store.par[v % 2] = state["params"]
    store.par[2 + tv % 2] = state["target"]
    for name, word in SAVED.items():
        store.hdr[word] = int(state[f"hdr/{name}"])
    store.hdr[S], store.hdr[TS] = v, tv
    opt.set_state({k[4:]: v for k, v in state.items() if k.startswith("opt/")})
    store.win_par.Sync()
    store.win_hdr.Sync()
