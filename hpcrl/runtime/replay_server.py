"""Global replay memory on replay ranks (Gorila's "global replay", Nair et al. 2015 §4).

Actors ship their transitions in chunks to one replay rank (actor ``i`` to replay
``i % n_replay``); learners ask any replay rank for a minibatch. A replay rank keeps one
:class:`ReplayMemory` per (actor, environment) stream, because frames are stored once and the
stacking of observations needs each stream's steps in order. Capacity per replay rank is
``replay_capacity``, shared equally by the streams it serves, so the total grows with the
number of replay ranks.

Replay ranks need no network, so this module never imports torch.

Protocol on a dedicated communicator (two-sided messages; a replay rank answers in its own loop):

* actor -> replay: ``CHUNK`` int64 ``[T, env]``, then ``CHUNK_FRAMES`` ``[T, *frame_shape]``, then
  ``CHUNK_META`` float64 ``[T, 4]`` (action, reward, terminal, first): the arguments of
  :meth:`ReplayMemory.add_batch`.
* learner -> replay: ``REQUEST`` int64 ``[batch_size]``; reply ``BATCH`` int64 ``[B]`` (0 = not
  filled yet), then if B > 0 ``BATCH_S_TM1``, ``BATCH_S_T`` frames and ``BATCH_META`` float64
  ``[B, 3]`` (a_tm1, r_t, discount_t).
* actors and learners send ``END`` once; a replay rank stops when all have (tests, benches).
* coordinated checkpoints (:mod:`hpcrl.coord`): actors and learners send ``MARKER`` to every
  replay rank once everything before the checkpoint was sent (actors ship partial chunks first);
  a replay rank writes its memories when it has every peer's marker.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime import watchdog
from hpcrl.io.rngstate import generator_state_from_array, generator_state_to_array
from hpcrl.rl.replay import ReplayMemory, sample_across
from hpcrl.rl.types import Transition

CHUNK, CHUNK_FRAMES, CHUNK_META, REQUEST, BATCH, BATCH_S_TM1, BATCH_S_T, BATCH_META, END, \
    MARKER = range(21, 31)
CHUNK_STEPS = 64  # agent steps per shipped chunk


class ChunkSender:
    """An actor's sink: buffers steps per environment, ships full chunks to its replay rank."""

    def __init__(self, comm: MPI.Comm, replay_ranks: tuple[int, ...], actor_index: int,
                 chunk_steps: int = CHUNK_STEPS):
        self.comm, self.replay_ranks = comm, replay_ranks
        self.dest = replay_ranks[actor_index % len(replay_ranks)]
        self.chunk_steps = chunk_steps
        self.rows: dict[int, list] = {}

    def first(self, i: int, frame: np.ndarray) -> None:
        self._row(i, frame, 0, 0.0, False, True)

    def add(self, i: int, action: int, reward: float, terminal: bool, frame: np.ndarray) -> None:
        self._row(i, frame, action, reward, terminal, False)

    def _row(self, i, frame, action, reward, terminal, first) -> None:
        rows = self.rows.setdefault(i, [])
        rows.append((np.array(frame, copy=True), action, reward, terminal, first))
        if len(rows) >= self.chunk_steps:
            self._ship(i)

    def _ship(self, i: int) -> None:
        rows = self.rows.get(i)
        if not rows:
            return
        frames = np.stack([r[0] for r in rows])
        meta = np.array([[r[1], r[2], r[3], r[4]] for r in rows], np.float64)
        self.comm.Send(np.array([len(rows), i], np.int64), self.dest, CHUNK)
        self.comm.Send(frames, self.dest, CHUNK_FRAMES)
        self.comm.Send(meta, self.dest, CHUNK_META)
        self.rows[i] = []

    def close(self) -> None:
        for i in list(self.rows):
            self._ship(i)
        for r in self.replay_ranks:
            self.comm.Send(np.zeros(1, np.int64), r, END)

    def marker(self) -> None:
        """Ship what is buffered, then tell every replay rank that nothing else precedes the
        checkpoint."""
        for i in list(self.rows):
            self._ship(i)
        for r in self.replay_ranks:
            self.comm.Send(np.zeros(1, np.int64), r, MARKER)


class BatchClient:
    """A learner's handle on global replay: minibatches from a random replay rank."""

    def __init__(self, comm: MPI.Comm, replay_ranks: tuple[int, ...], seed: int,
                 sample_shape: tuple[int, ...], frame_dtype):
        self.comm, self.replay_ranks = comm, replay_ranks
        self.rng = np.random.default_rng(seed)
        self.shape, self.frame_dtype = tuple(sample_shape), frame_dtype
        self.n = np.zeros(1, np.int64)

    def sample(self, batch_size: int) -> Transition | None:
        """A minibatch, or None while the chosen replay rank holds fewer than min_fill."""
        src = self.replay_ranks[int(self.rng.integers(len(self.replay_ranks)))]
        self.comm.Send(np.array([batch_size], np.int64), src, REQUEST)
        self.comm.Recv(self.n, src, BATCH)
        b = int(self.n[0])
        return self._recv(src, b) if b else None

    def _recv(self, src: int, b: int) -> Transition:
        s_tm1 = np.empty((b,) + self.shape, self.frame_dtype)
        s_t = np.empty_like(s_tm1)
        meta = np.empty((b, 3), np.float64)
        self.comm.Recv(s_tm1, src, BATCH_S_TM1)
        self.comm.Recv(s_t, src, BATCH_S_T)
        self.comm.Recv(meta, src, BATCH_META)
        return Transition(s_tm1=s_tm1, a_tm1=meta[:, 0].astype(np.int64),
                          r_t=meta[:, 1].astype(np.float32),
                          discount_t=meta[:, 2].astype(np.float32), s_t=s_t)

    def close(self) -> None:
        for r in self.replay_ranks:
            self.comm.Send(np.zeros(1, np.int64), r, END)

    def marker(self) -> None:
        for r in self.replay_ranks:
            self.comm.Send(np.zeros(1, np.int64), r, MARKER)


class ReplayServer:
    """One replay rank: stores the chunks of its actors, answers learners' batch requests."""

    def __init__(self, comm: MPI.Comm, capacity: int, min_fill: int, frame_shape, frame_dtype,
                 stack: int, n_streams: int, n_peers: int, seed: int, *, n_step: int = 1,
                 gamma: float = 0.99):
        self.comm, self.min_fill = comm, min_fill
        self.frame_shape, self.frame_dtype, self.stack = tuple(frame_shape), frame_dtype, stack
        self.stream_capacity = max(capacity // max(n_streams, 1), 1)
        self.memories: dict[tuple[int, int], ReplayMemory] = {}
        self.n_peers, self.ended = n_peers, 0
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.n_step, self.gamma = n_step, gamma
        self.hdr = np.zeros(2, np.int64)

    @property
    def size(self) -> int:
        return sum(m.size for m in self.memories.values())

    def _memory(self, src: int, env: int) -> ReplayMemory:
        key = (src, env)
        if key not in self.memories:
            self.memories[key] = ReplayMemory(self.stream_capacity, self.frame_shape,
                                              self.frame_dtype, self.stack,
                                              self.seed + 7919 * len(self.memories),
                                              n_step=self.n_step, gamma=self.gamma)
        return self.memories[key]

    def _take_chunk(self, src: int) -> None:
        self.comm.Recv(self.hdr, src, CHUNK)
        t, env = int(self.hdr[0]), int(self.hdr[1])
        frames = np.empty((t,) + self.frame_shape, self.frame_dtype)
        meta = np.empty((t, 4), np.float64)
        self.comm.Recv(frames, src, CHUNK_FRAMES)
        self.comm.Recv(meta, src, CHUNK_META)
        self._memory(src, env).add_batch(frames, meta[:, 0].astype(np.int64), meta[:, 1],
                                         meta[:, 2] != 0, meta[:, 3] != 0)

    def sample(self, batch_size: int) -> Transition:
        """A minibatch over all streams, each transition's stream drawn in proportion to size."""
        return sample_across(list(self.memories.values()), batch_size, self.rng)

    def _answer(self, src: int) -> None:
        req = np.zeros(1, np.int64)
        self.comm.Recv(req, src, REQUEST)
        if self.size < self.min_fill:
            self.comm.Send(np.zeros(1, np.int64), src, BATCH)
            return
        batch = self.sample(int(req[0]))
        meta = np.stack([batch.a_tm1, batch.r_t, batch.discount_t], axis=1).astype(np.float64)
        self.comm.Send(np.array([len(meta)], np.int64), src, BATCH)
        self.comm.Send(np.ascontiguousarray(batch.s_tm1), src, BATCH_S_TM1)
        self.comm.Send(np.ascontiguousarray(batch.s_t), src, BATCH_S_T)
        self.comm.Send(meta, src, BATCH_META)

    def get_state(self, with_memories: bool = True) -> dict:
        state = {"rng": generator_state_to_array(self.rng)}
        if with_memories:
            for (src, env), memory in self.memories.items():
                state.update({f"mem/{src}_{env}/{k}": v for k, v in memory.get_state().items()})
        return state

    def set_state(self, state: dict) -> None:
        generator_state_from_array(self.rng, state["rng"])
        keys = sorted({k.split("/")[1] for k in state if k.startswith("mem/")})
        for key in keys:
            src, env = (int(x) for x in key.split("_"))
            prefix = f"mem/{key}/"
            self._memory(src, env).set_state(
                {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})

    def serve(self, idle_sleep_s: float = 1e-3, coord=None, save_replay: bool = True) -> int:
        """Answer actors and learners until all sent END, or until a coordinated checkpoint
        says stop (returns its stop code)."""
        status = MPI.Status()
        markers = 0
        while self.ended < self.n_peers:
            watchdog.beat()
            if coord is not None and markers == self.n_peers:
                markers = 0
                stop = coord.write(lambda: self.get_state(save_replay))
                if stop:
                    return stop
            if not self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
                time.sleep(idle_sleep_s)
                continue
            src, tag = status.Get_source(), status.Get_tag()
            if tag == CHUNK:
                self._take_chunk(src)
            elif tag == REQUEST:
                self._answer(src)
            elif tag in (END, MARKER):
                self.comm.Recv(np.zeros(1, np.int64), src, tag)
                if tag == END:
                    self.ended += 1
                else:
                    markers += 1
            else:
                raise RuntimeError(f"replay rank got unexpected message tag {tag} from {src}")
        return 0
