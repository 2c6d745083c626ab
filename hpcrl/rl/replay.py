"""Circular replay memory that stores every frame once (Mnih et al. 2015; Nair et al. 2015 §3).

DQN and Gorila sample minibatches of transitions `(s_tm1, a_tm1, r_t, discount_t, s_t)` whose
observations are stacks of the last 4 preprocessed 84x84 frames. Storing the stacks themselves
costs 2 x 4 x 7,056 bytes per transition; consecutive stacks share 3 of their 4 frames, so this
memory stores each frame once (about 7.1 KB per transition, 1 M transitions in about 7 GB) and
rebuilds the stacks when sampling, as dopamine's `OutOfGraphReplayBuffer` does.

Layout. One ring of `num_slots = capacity + stack` slots. Every `add_first`/`add` call writes one
slot: the newest frame of the state it reached and, for `add`, the step that led there. Slot `j`
also records `pos[j]`, the number of earlier frames of the same episode (0 for an episode's first
frame). A slot with `pos[j] >= 1` holds one transition:

    s_tm1 = frames j-stack .. j-1,  a_tm1 = action[j],  r_t = reward[j],
    discount_t = 0 if terminal[j] else 1,  s_t = frames j-stack+1 .. j,

where a frame whose offset from `j` exceeds `pos[j]` lies before the episode start and reads as
zeros (the environment code stacks the first observation after a reset the same way). Only
`add_first` starts an episode: a terminal step (e.g. a life loss used as terminal in training)
gives discount 0 but the frames after it keep stacking onto the same episode.

A transition is sampleable ("valid") when (a) it is one of the newest `capacity` transitions and
(b) every frame its two stacks need is still in the ring (not overwritten by the write head).
With one long episode the ring's `stack` extra slots make exactly `capacity` transitions valid;
every episode start inside the window uses one slot without adding a transition, so with short
episodes `size` stays a little below `capacity` (1% for 100-step episodes). Both invalid kinds
can only sit in the `stack` oldest slots (see `size`), so `size` costs O(stack) and uniform
sampling is rejection sampling over the ring, vectorised over the batch.

n-step returns (``n_step`` > 1; Mnih et al. 2016 §4, the n-step target of DQN variants such as
Rainbow, Hessel et al. 2018). The transition at slot `j` then runs m <= n steps: it stops after a
terminal step, at its episode's end, and at the newest stored step, so

    r_t = sum_{k<m} gamma^k reward[j+k],   discount_t = gamma^(m-1) if not terminal else 0,
    s_t = the stacked state reached at slot j+m-1,

and the learner's one-step target r_t + gamma discount_t max_a Q(s_t, a) is the m-step target
r_t + gamma^m max_a Q(s_t, a) without knowing m. With n_step = 1 this is the table above.

Differs from dopamine: terminal flags do not end episodes (only `add_first` does), the final frame
of every episode is stored (so time-limit truncation can bootstrap), and no padding frames are
written between episodes.
"""

import numpy as np

from hpcrl.io.rngstate import generator_state_from_array, generator_state_to_array
from hpcrl.rl.types import Transition


def frame_layout(obs_shape) -> tuple[int, tuple[int, ...], type]:
    """(stack, frame shape, frame dtype) for storing observations of ``obs_shape`` frame by
    frame: image stacks [stack, H, W] as uint8 frames, vectors [D] as float32 with stack 1."""
    obs_shape = tuple(int(d) for d in obs_shape)
    if len(obs_shape) == 3:
        return obs_shape[0], obs_shape[1:], np.uint8
    return 1, obs_shape, np.float32


class ReplayMemory:
    """Uniform replay of frame-stacked transitions, each frame stored once.

    Call order, for an actor:

        memory.add_first(frame_0)                    # after env.reset()
        memory.add(a_0, r_1, terminal_1, frame_1)    # after each env.step(a)
        ...
        memory.add_first(frame_0_of_next_episode)
        batch = memory.sample(32)                    # Transition of [32, ...] arrays

    Attributes:
        capacity: the most transitions kept (the newest ones).
        size: transitions that `sample` can return now.
        num_added: transitions ever added (`add` calls and non-first rows of `add_batch`).
        bytes_per_transition: bytes of all storage arrays divided by `capacity`.
    """

    def __init__(self, capacity: int, frame_shape: tuple[int, ...], frame_dtype, stack: int,
                 seed: int, *, n_step: int = 1, gamma: float = 0.99):
        """Allocates the ring.

        Args:
            capacity: the most transitions kept; the oldest are overwritten first.
            frame_shape: shape of one frame, e.g. (84, 84) for Atari or (4,) for CartPole.
            frame_dtype: dtype of frames, e.g. np.uint8 (Atari) or np.float32 (CartPole).
            stack: frames per observation (4 for Atari DQN, 1 for vector observations).
            seed: seed of the sampling random number generator.
            n_step: steps per sampled return (1 = one-step transitions).
            gamma: the discount of n-step returns (unused when n_step = 1).
        """
        if capacity < 1 or stack < 1 or n_step < 1:
            raise ValueError(f"capacity, stack and n_step must be >= 1, got {capacity}, {stack}, "
                             f"{n_step}")
        self._n_step, self._gamma = int(n_step), float(gamma)
        self._capacity = int(capacity)
        self._stack = int(stack)
        self._frame_shape = tuple(int(d) for d in frame_shape)
        self._num_slots = self._capacity + self._stack
        n = self._num_slots
        self._frames = np.zeros((n,) + self._frame_shape, dtype=np.dtype(frame_dtype))
        self._actions = np.zeros(n, dtype=np.int32)
        self._rewards = np.zeros(n, dtype=np.float32)
        self._terminals = np.zeros(n, dtype=np.bool_)
        self._pos = np.full(n, -1, dtype=np.int32)  # -1: never written.
        self._transition_ids = np.full(n, -1, dtype=np.int64)  # -1: first frame / never written.
        self._head = 0  # Next slot to write.
        self._num_slots_written = 0
        self._num_added = 0
        self._num_firsts_retained = 0  # Slots with pos == 0 among the retained ones.
        self._rng = np.random.default_rng(seed)

    # ----------------------------------------------------------------------------- properties

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def stack(self) -> int:
        return self._stack

    @property
    def num_added(self) -> int:
        return self._num_added

    @property
    def bytes_per_transition(self) -> float:
        arrays = (self._frames, self._actions, self._rewards, self._terminals, self._pos,
                  self._transition_ids)
        return sum(a.nbytes for a in arrays) / self._capacity

    @property
    def size(self) -> int:
        """Number of valid transitions.

        Every retained slot with pos >= 1 is a transition; the invalid ones among them all lie in
        the `stack` oldest retained slots: a slot at age-order position p (0 = oldest) needs the
        frames p - min(pos, stack) .. p, so it misses frames only if p < stack; and the ring holds
        at most capacity + stack slots, so the retained transitions beyond the newest `capacity`
        (at most stack - num_firsts of them) also sit within the oldest `stack` positions.
        """
        num_retained = self._num_retained()
        num_transitions = num_retained - self._num_firsts_retained
        oldest = self._oldest_slots(min(num_retained, self._stack))
        num_old_transitions = int(np.count_nonzero(self._pos[oldest] >= 1))
        num_old_valid = int(np.count_nonzero(self._is_valid(oldest)))
        return num_transitions - num_old_transitions + num_old_valid

    # ----------------------------------------------------------------------------- writing

    def add_first(self, frame: np.ndarray) -> None:
        """Starts a new episode whose first state's newest frame is `frame` (after env reset)."""
        self._write_slot(frame, action=0, reward=0.0, terminal=False, pos=0, transition_id=-1)

    def add(self, action: int, reward: float, terminal: bool, frame: np.ndarray) -> None:
        """Adds one transition: `action` in the current state gave `reward` and led to `frame`.

        Args:
            action: the action taken in the current state.
            reward: the reward of this step.
            terminal: True if the new state is terminal (discount 0 for this transition). It does
                not start a new episode; only `add_first` does.
            frame: the newest frame of the new state.
        """
        if self._num_slots_written == 0:
            raise RuntimeError("add() before add_first(): no episode to continue")
        pos = int(self._pos[(self._head - 1) % self._num_slots]) + 1
        self._write_slot(frame, action, reward, terminal, pos, transition_id=self._num_added)
        self._num_added += 1

    def add_batch(self, frames: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                  terminals: np.ndarray, firsts: np.ndarray) -> None:
        """Adds T consecutive steps at once, exactly as T calls of add_first/add would.

        Row i is `add_first(frames[i])` where `firsts[i]` (its action, reward and terminal are
        ignored), else `add(actions[i], rewards[i], terminals[i], frames[i])`. An actor can
        record its steps in this form and ship them to a global replay rank as five arrays.

        Args:
            frames: [T, *frame_shape] newest frame of each state reached.
            actions: [T] integer actions.
            rewards: [T] rewards.
            terminals: [T] bool, discount 0 for that step's transition.
            firsts: [T] bool, the row starts a new episode.
        """
        frames = np.asarray(frames)
        num_rows = len(frames)
        if frames.shape[1:] != self._frame_shape:
            raise ValueError(f"frames shape {frames.shape}, want [T, *{self._frame_shape}]")
        firsts = np.asarray(firsts, dtype=np.bool_).reshape(num_rows)
        if num_rows == 0:
            return
        if self._num_slots_written == 0 and not firsts[0]:
            raise RuntimeError("add_batch() must start with a first frame on an empty memory")
        rows = np.arange(num_rows)
        last_first = np.maximum.accumulate(np.where(firsts, rows, -1))
        next_pos = int(self._pos[(self._head - 1) % self._num_slots]) + 1
        pos = np.where(last_first >= 0, rows - last_first, next_pos + rows)
        is_transition = ~firsts
        transition_ids = np.where(is_transition, self._num_added + np.cumsum(is_transition) - 1, -1)
        keep = slice(max(0, num_rows - self._num_slots), num_rows)  # Older rows are overwritten.
        slots = (self._head + rows[keep]) % self._num_slots
        self._num_firsts_retained -= int(np.count_nonzero(self._pos[slots] == 0))
        self._frames[slots] = frames[keep]
        self._actions[slots] = np.asarray(actions).reshape(num_rows)[keep]
        self._rewards[slots] = np.asarray(rewards).reshape(num_rows)[keep]
        self._terminals[slots] = np.asarray(terminals).reshape(num_rows)[keep]
        self._pos[slots] = pos[keep]
        self._transition_ids[slots] = transition_ids[keep]
        self._num_firsts_retained += int(np.count_nonzero(pos[keep] == 0))
        self._head = (self._head + num_rows) % self._num_slots
        self._num_slots_written += num_rows
        self._num_added += int(np.count_nonzero(is_transition))

    def _write_slot(self, frame, action, reward, terminal, pos, transition_id) -> None:
        if np.shape(frame) != self._frame_shape:
            raise ValueError(f"frame shape {np.shape(frame)}, want {self._frame_shape}")
        j = self._head
        self._num_firsts_retained += int(pos == 0) - int(self._pos[j] == 0)
        self._frames[j] = frame
        self._actions[j] = action
        self._rewards[j] = reward
        self._terminals[j] = terminal
        self._pos[j] = pos
        self._transition_ids[j] = transition_id
        self._head = (j + 1) % self._num_slots
        self._num_slots_written += 1

    # ----------------------------------------------------------------------------- sampling

    def sample(self, batch_size: int) -> Transition:
        """Samples `batch_size` valid transitions uniformly, with replacement.

        Returns:
            Transition with s_tm1, s_t [B, stack, *frame_shape] (frame dtype), a_tm1 int64 [B],
            r_t float32 [B], discount_t float32 [B].
        """
        return self._transitions_at(self._sample_slots(batch_size))

    def _sample_slots(self, batch_size: int) -> np.ndarray:
        """Rejection sampling: uniform retained slots, keep the valid ones, until B are found."""
        size = self.size
        if size == 0:
            raise ValueError("cannot sample from a replay memory with no valid transition")
        num_retained = self._num_retained()
        oldest = (self._head - num_retained) % self._num_slots
        found = []
        num_found = 0
        for _ in range(8):
            need = batch_size - num_found
            if need <= 0:
                break
            num_draws = int(need * num_retained / size * 1.1) + 4  # Expected acceptance size/M.
            slots = (oldest + self._rng.integers(0, num_retained, num_draws)) % self._num_slots
            slots = slots[self._is_valid(slots)][:need]
            found.append(slots)
            num_found += len(slots)
        if num_found < batch_size:  # Few valid slots: enumerate them (O(num_slots)).
            found.append(self._rng.choice(self._valid_slots(), batch_size - num_found))
        return np.concatenate(found).astype(np.int64)

    def _transitions_at(self, slots: np.ndarray) -> Transition:
        """Rebuilds the transitions at `slots` (all valid), zero-padding before episode start."""
        if self._n_step > 1:
            last, r_t, discount_t = self._n_step_returns(slots)
        else:
            last = slots
            r_t = self._rewards[slots].astype(np.float32)
            discount_t = (~self._terminals[slots]).astype(np.float32)
        return Transition(s_tm1=self._stack_at(slots, 1), a_tm1=self._actions[slots].astype(np.int64),
                          r_t=r_t, discount_t=discount_t, s_t=self._stack_at(last, 0))

    def _stack_at(self, slots: np.ndarray, back: int) -> np.ndarray:
        """[B, stack, *frame_shape]: the stacked state whose newest frame is `back` slots before
        each of `slots`, zeros where a frame lies before its episode's first frame."""
        offsets = np.arange(self._stack - 1 + back, back - 1, -1)  # Frames back from the slot.
        frames = self._frames[(slots[:, None] - offsets[None, :]) % self._num_slots]
        frames[offsets[None, :] > self._pos[slots][:, None]] = 0
        return frames

    def _n_step_returns(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the slot of each return's last step, r_t, discount_t) of up-to-n-step returns from
        `slots` (see the module docstring): step k extends the return while the previous step
        was not terminal and slot j+k is stored and continues j's episode."""
        pos = self._pos[slots].astype(np.int64)
        newer = (self._head - 1 - slots) % self._num_slots  # Slots written after each slot.
        terminal = self._terminals[slots].copy()
        r_t = self._rewards[slots].astype(np.float64)
        last, steps = slots.copy(), np.ones(len(slots), np.int64)
        go = np.ones(len(slots), np.bool_)
        for k in range(1, self._n_step):
            nxt = (slots + k) % self._num_slots
            go &= ~terminal & (newer >= k) & (self._pos[nxt] == pos + k)
            r_t += np.where(go, self._gamma ** k * self._rewards[nxt], 0.0)
            last = np.where(go, nxt, last)
            steps += go
            terminal = np.where(go, self._terminals[nxt], terminal)
        discount_t = np.where(terminal, 0.0, self._gamma ** (steps - 1))
        return last, r_t.astype(np.float32), discount_t.astype(np.float32)

    def _num_retained(self) -> int:
        return min(self._num_slots_written, self._num_slots)

    def _oldest_slots(self, count: int) -> np.ndarray:
        start = self._head - self._num_retained()
        return (start + np.arange(count)) % self._num_slots

    def _is_valid(self, slots: np.ndarray) -> np.ndarray:
        """Whether each retained slot holds a sampleable transition (see the module docstring)."""
        pos = self._pos[slots].astype(np.int64)
        age = (self._head - 1 - slots) % self._num_slots  # 0 = newest.
        position = self._num_retained() - 1 - age  # 0 = oldest retained.
        frames_retained = position >= np.minimum(pos, self._stack)
        recent = self._transition_ids[slots] >= self._num_added - self._capacity
        return (pos >= 1) & frames_retained & recent

    def _valid_slots(self) -> np.ndarray:
        slots = self._oldest_slots(self._num_retained())
        return slots[self._is_valid(slots)]

    # ----------------------------------------------------------------------------- state

    def get_state(self) -> dict[str, np.ndarray]:
        """Returns the whole memory as arrays (for an HDF5 checkpoint).

        The big arrays are read-only views of the live storage, not copies (a copy of a 7 GB
        frame ring would double the memory): write them out before the next `add`. Before the
        ring first wraps, only the written prefix is returned (a 1 M capacity memory that holds
        5,000 transitions checkpoints 5,000 slots, not 7 GB).
        """
        used = min(self._num_slots_written, self._num_slots)
        state = {
            "frames": self._frames, "actions": self._actions, "rewards": self._rewards,
            "terminals": self._terminals, "pos": self._pos,
            "transition_ids": self._transition_ids,
        }
        state = {k: _read_only_view(v[:used]) for k, v in state.items()}
        state.update(
            capacity=np.asarray(self._capacity, np.int64),
            stack=np.asarray(self._stack, np.int64),
            head=np.asarray(self._head, np.int64),
            num_slots_written=np.asarray(self._num_slots_written, np.int64),
            num_added=np.asarray(self._num_added, np.int64),
            num_firsts_retained=np.asarray(self._num_firsts_retained, np.int64),
            rng_state=generator_state_to_array(self._rng),
        )
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restores a state from `get_state` (arrays or h5py datasets), copying it into RAM."""
        if int(state["capacity"]) != self._capacity or int(state["stack"]) != self._stack:
            raise ValueError(
                f"state has capacity {int(state['capacity'])}, stack {int(state['stack'])}; "
                f"this memory has {self._capacity}, {self._stack}")
        used = min(int(state["num_slots_written"]), self._num_slots)
        # Slots past those this memory has written still hold their initial values: writing
        # them again would make a fresh memory's whole ring resident at once (7 GB for 1 M
        # Atari transitions) however little the checkpoint held.
        written = max(used, min(self._num_slots_written, self._num_slots))
        for name in ("frames", "actions", "rewards", "terminals", "pos", "transition_ids"):
            target = getattr(self, "_" + name)
            source = np.asarray(state[name])
            if source.shape != (used,) + target.shape[1:]:
                raise ValueError(f"state[{name!r}] shape {source.shape}, want "
                                 f"{(used,) + target.shape[1:]}")
            np.copyto(target[:used], source, casting="same_kind")
            target[used:written] = -1 if name in ("pos", "transition_ids") else 0
        self._head = int(state["head"])
        self._num_slots_written = int(state["num_slots_written"])
        self._num_added = int(state["num_added"])
        self._num_firsts_retained = int(state["num_firsts_retained"])
        generator_state_from_array(self._rng, state["rng_state"])


def sample_across(memories: list[ReplayMemory], batch_size: int,
                  rng: np.random.Generator) -> Transition:
    """A minibatch drawn uniformly from the union of several memories (one per environment
    stream, since stacking needs each stream's steps in order): each transition's memory drawn
    in proportion to its number of valid transitions (``rng``), then each memory's share drawn
    by that memory (:meth:`ReplayMemory.sample`), concatenated in memory order. Memories with
    no valid transition are skipped.

    A batch from one stream's memory picked at random would span the episodes of that memory
    only, 1 / n of the capacity of n streams."""
    mems = [m for m in memories if m.size > 0]
    if not mems:
        raise ValueError("cannot sample from replay memories with no valid transition")
    sizes = np.array([m.size for m in mems], np.float64)
    counts = rng.multinomial(batch_size, sizes / sizes.sum())
    parts = [m.sample(int(c)) for m, c in zip(mems, counts) if c > 0]
    if len(parts) == 1:                  # one memory (one environment): no copy of its batch
        return parts[0]
    return Transition(*(np.concatenate(field) for field in zip(*parts)))


def _read_only_view(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
