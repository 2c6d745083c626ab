"""Tests for hpcrl.rl.replay.ReplayMemory.

Buffers are drawn in comments as the ring's slots, `f` marks an episode's first frame (add_first),
`*` a terminal step, `^` the write head (next slot to be written). Frames are 1-element vectors
whose value names them, so expected stacks can be written out by hand; 0 is zero padding.
"""

import numpy as np
import pytest

from hpcrl.io.rngstate import generator_state_from_array, generator_state_to_array
from hpcrl.rl.replay import ReplayMemory


def _frame(value):
    return np.array([value], dtype=np.float32)


def _values(obs):
    """[B, stack, 1] observations -> [B, stack] frame values."""
    return obs[..., 0]


def _fill(memory, steps):
    """steps: list of ('first', v) or (action, reward, terminal, v)."""
    for step in steps:
        if step[0] == "first":
            memory.add_first(_frame(step[1]))
        else:
            action, reward, terminal, value = step
            memory.add(action, reward, terminal, _frame(value))


def _all_valid(memory):
    return memory._transitions_at(memory._valid_slots())


def _rows(transition):
    """Transition of [B, ...] arrays -> sorted list of hashable rows."""
    rows = []
    for i in range(len(transition.a_tm1)):
        rows.append((tuple(transition.s_tm1[i].ravel().tolist()), int(transition.a_tm1[i]),
                     float(transition.r_t[i]), float(transition.discount_t[i]),
                     tuple(transition.s_t[i].ravel().tolist())))
    return sorted(rows)


def test_stacks_zero_padding_terminal_and_episode_boundary():
    # capacity 6, stack 3 -> 9 slots, no wrap yet:
    #   slot:  0   1   2   3    4   5    6   7  8
    #   frame: 1f  2   3   4*   5   11f  12  ^
    # 4* is a life loss: discount 0, but frame 5 still stacks onto 2 3 4 (same episode).
    # Expected transitions (s_tm1 -> s_t, a, r, discount):
    #   [0 0 1] -> [0 1 2]   a0 r1 d1
    #   [0 1 2] -> [1 2 3]   a1 r2 d1
    #   [1 2 3] -> [2 3 4]   a2 r3 d0
    #   [2 3 4] -> [3 4 5]   a0 r4 d1
    #   [0 0 11] -> [0 11 12] a1 r5 d1      (none from 5 to 11: 11 starts a new episode)
    memory = ReplayMemory(capacity=6, frame_shape=(1,), frame_dtype=np.float32, stack=3, seed=0)
    _fill(memory, [("first", 1), (0, 1.0, False, 2), (1, 2.0, False, 3), (2, 3.0, True, 4),
                   (0, 4.0, False, 5), ("first", 11), (1, 5.0, False, 12)])
    assert memory.size == 5
    assert memory.num_added == 5
    got = memory._transitions_at(np.array([1, 2, 3, 4, 6]))
    np.testing.assert_array_equal(
        _values(got.s_tm1), [[0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4], [0, 0, 11]])
    np.testing.assert_array_equal(
        _values(got.s_t), [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5], [0, 11, 12]])
    np.testing.assert_array_equal(got.a_tm1, [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(got.r_t, [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(got.discount_t, [1, 1, 0, 1, 1])
    assert got.a_tm1.dtype == np.int64
    assert got.r_t.dtype == np.float32 and got.discount_t.dtype == np.float32
    assert got.s_tm1.shape == (5, 3, 1) and got.s_tm1.dtype == np.float32
    # Sampling only ever returns those five, each about 1/5 of the time.
    batch = memory.sample(5000)
    expected = set(_rows(got))
    counts = {}
    for row in _rows(batch):
        assert row in expected
        counts[row] = counts.get(row, 0) + 1
    assert len(counts) == 5
    assert all(abs(c - 1000) < 5 * np.sqrt(1000 * 0.8) for c in counts.values())


def test_single_episode_wraps_and_keeps_exactly_capacity():
    # capacity 4, stack 2 -> 6 slots; one episode of frames 1..8 (8 writes):
    #   slot:  0  1  2  3  4  5
    #   frame: 7  8  3  4  5  6        head ^ at slot 2, oldest retained frame 3
    #                ^
    # Newest 4 transitions end at frames 5..8 and all their frames (3..8) are retained.
    memory = ReplayMemory(capacity=4, frame_shape=(1,), frame_dtype=np.float32, stack=2, seed=1)
    _fill(memory, [("first", 1)] + [(v % 3, float(v), False, v) for v in range(2, 9)])
    assert memory.num_added == 7
    assert memory.size == memory.capacity == 4
    got = _all_valid(memory)
    assert _rows(got) == sorted([
        ((3.0, 4.0), 2, 5.0, 1.0, (4.0, 5.0)),  # action v % 3, reward v into frame v.
        ((4.0, 5.0), 0, 6.0, 1.0, (5.0, 6.0)),
        ((5.0, 6.0), 1, 7.0, 1.0, (6.0, 7.0)),
        ((6.0, 7.0), 2, 8.0, 1.0, (7.0, 8.0)),
    ])


def test_never_samples_across_the_write_head():
    # capacity 4, stack 2 -> 6 slots, 7 writes:
    #   slot:  0    1  2  3    4   5
    #   frame: 22   2  3  11f  12  21f       (22 overwrote 1f)
    #               ^
    # Transitions ending at 2 and 3 need frame 1, which the head overwrote: not valid, although
    # they are among the newest 4 transitions. Valid: [0 11]->[11 12], [0 21]->[21 22].
    memory = ReplayMemory(capacity=4, frame_shape=(1,), frame_dtype=np.float32, stack=2, seed=2)
    _fill(memory, [("first", 1), (0, 1.0, False, 2), (1, 1.0, False, 3), ("first", 11),
                   (2, 2.0, True, 12), ("first", 21), (3, 3.0, False, 22)])
    assert memory.num_added == 4
    assert memory.size == 2
    batch = memory.sample(1000)
    assert set(_rows(batch)) == {((0.0, 11.0), 2, 2.0, 0.0, (11.0, 12.0)),
                                 ((0.0, 21.0), 3, 3.0, 1.0, (21.0, 22.0))}
    # One more write overwrites 2: the transition into 3 stays invalid, nothing changes.
    memory.add(0, 0.5, False, _frame(23))
    assert memory.size == 3  # + [21 22] -> [22 23]
    assert all(v not in (1.0, 2.0, 3.0) for row in _rows(memory.sample(1000))
               for v in row[0] + row[4])


def test_oldest_transitions_beyond_capacity_are_dropped():
    # capacity 4, stack 2 -> 6 slots:
    #   writes: 1f 2 11f 12 13 14 15 16
    #   slot:   0  1  2   3  4  5  0  1    -> ring [15 16 11f 12 13 14], head ^ at slot 2
    # Six retained frames hold five transitions (into 12 13 14 15 16); the one into 12 is the
    # fifth newest, beyond capacity 4, so it is dropped although its frames are retained.
    memory = ReplayMemory(capacity=4, frame_shape=(1,), frame_dtype=np.float32, stack=2, seed=3)
    _fill(memory, [("first", 1), (0, 0.0, False, 2), ("first", 11)]
          + [(0, 0.0, False, v) for v in (12, 13, 14, 15, 16)])
    assert memory.size == 4
    assert [row[4] for row in _rows(_all_valid(memory))] == [
        (12.0, 13.0), (13.0, 14.0), (14.0, 15.0), (15.0, 16.0)]


def test_size_capacity_and_counters_while_filling():
    memory = ReplayMemory(capacity=10, frame_shape=(1,), frame_dtype=np.float32, stack=4, seed=0)
    assert memory.size == 0 and memory.capacity == 10 and memory.num_added == 0
    with pytest.raises(ValueError):
        memory.sample(1)
    with pytest.raises(RuntimeError):
        memory.add(0, 0.0, False, _frame(1))
    memory.add_first(_frame(1))
    assert memory.size == 0
    for v in range(2, 40):
        memory.add(0, 0.0, False, _frame(v))
        assert memory.size == min(v - 1, 10)
        assert memory.num_added == v - 1
    with pytest.raises(ValueError):
        memory.add(0, 0.0, False, np.zeros(2, np.float32))


def test_bytes_per_transition_atari():
    memory = ReplayMemory(capacity=10_000, frame_shape=(84, 84), frame_dtype=np.uint8, stack=4,
                          seed=0)
    # One 84x84 uint8 frame is 7,056 bytes; the target for all storage is 7,300 bytes.
    assert 7056 < memory.bytes_per_transition <= 7300
    memory.add_first(np.full((84, 84), 7, np.uint8))
    memory.add(3, 1.0, False, np.full((84, 84), 9, np.uint8))
    batch = memory.sample(32)
    assert batch.s_tm1.shape == batch.s_t.shape == (32, 4, 84, 84)
    assert batch.s_t.dtype == np.uint8
    np.testing.assert_array_equal(batch.s_t[:, :2], 0)
    np.testing.assert_array_equal(batch.s_t[:, 2], 7)
    np.testing.assert_array_equal(batch.s_t[:, 3], 9)


def _random_steps(rng, num_steps, p_first=0.08, p_terminal=0.1):
    """A random add_first/add sequence; frame values are the write number (from 1)."""
    steps = [("first", 1)]
    for value in range(2, num_steps + 2):
        if rng.random() < p_first:
            steps.append(("first", value))
        else:
            terminal = bool(rng.random() < p_terminal)
            steps.append((int(rng.integers(6)), float(rng.normal()), terminal, value))
    return steps


def _reference_transitions(steps, capacity, stack):
    """Slow reference: replay the steps as a list of episodes and list the valid transitions.

    A transition into frame w (w = write number) of an episode that started at write e has
        s_t   = [frame(w - stack + 1 + i) if w - stack + 1 + i >= e else 0 for i in range(stack)]
        s_tm1 = the same ending at w - 1,
    and is valid iff it is one of the newest `capacity` transitions and every frame it uses is
    one of the newest `capacity + stack` writes.
    """
    episodes = []  # Each: [start_write, [(write, action, reward, terminal), ...]]
    for write, step in enumerate(steps, start=1):
        if step[0] == "first":
            episodes.append([write, []])
        else:
            episodes[-1][1].append((write,) + tuple(step[:3]))
    num_writes = len(steps)
    oldest_retained = num_writes - (capacity + stack) + 1
    transitions = [(start, t) for start, ts in episodes for t in ts]
    rows = []
    for start, (write, action, reward, terminal) in transitions[-capacity:]:
        if max(start, write - stack) < oldest_retained:
            continue
        def stack_at(w):
            return tuple(float(x) if x >= start else 0.0 for x in range(w - stack + 1, w + 1))
        rows.append((stack_at(write - 1), action, float(np.float32(reward)),
                     0.0 if terminal else 1.0, stack_at(write)))
    return sorted(rows)


def test_n_step_returns_by_hand():
    # n 3, gamma 0.5, stack 1:  1f 2 3 4* 5 | 11f 12 13 14 ^
    #   into 2: 1 + 0.5 * 2 + 0.25 * 4 = 3, stops after the terminal 4*: discount 0, s_t [4]
    #   into 3: 2 + 0.5 * 4 = 4, d 0;  into 4: 4, d 0
    #   into 5: 8, the episode ends after one step: d = gamma^0 = 1, s_t [5]
    #   into 12: 16 + 0.5 * 32 + 0.25 * 64 = 48, three steps: d = gamma^2 = 0.25, s_t [14]
    #   into 13: 32 + 0.5 * 64 = 64, stops at the newest step: d 0.5;  into 14: 64, d 1
    memory = ReplayMemory(20, (1,), np.float32, 1, 0, n_step=3, gamma=0.5)
    _fill(memory, [("first", 1), (0, 1.0, False, 2), (1, 2.0, False, 3), (2, 4.0, True, 4),
                   (0, 8.0, False, 5), ("first", 11), (1, 16.0, False, 12),
                   (2, 32.0, False, 13), (0, 64.0, False, 14)])
    assert _rows(_all_valid(memory)) == sorted([
        ((1.0,), 0, 3.0, 0.0, (4.0,)), ((2.0,), 1, 4.0, 0.0, (4.0,)),
        ((3.0,), 2, 4.0, 0.0, (4.0,)), ((4.0,), 0, 8.0, 1.0, (5.0,)),
        ((11.0,), 1, 48.0, 0.25, (14.0,)), ((12.0,), 2, 64.0, 0.5, (14.0,)),
        ((13.0,), 0, 64.0, 1.0, (14.0,))])


def _reference_n_step(steps, capacity, stack, n, gamma):
    """Slow reference for n-step returns: walk each episode's list of steps forward from each
    valid transition (found by ``_reference_transitions``'s rule) until a terminal step, the
    episode's last step or n steps."""
    one_step = set(_reference_transitions(steps, capacity, stack))
    episodes = []
    for write, step in enumerate(steps, start=1):
        if step[0] == "first":
            episodes.append([write, []])
        else:
            episodes[-1][1].append((write,) + tuple(step[:3]))
    rows = []
    for start, ts in episodes:
        def stack_at(w):
            return tuple(float(x) if x >= start else 0.0 for x in range(w - stack + 1, w + 1))
        for i, (write, action, reward, terminal) in enumerate(ts):
            row = (stack_at(write - 1), action, float(np.float32(reward)),
                   0.0 if terminal else 1.0, stack_at(write))
            if row not in one_step:
                continue
            ret, m = 0.0, 0
            while True:
                w, _, r, term = ts[i + m]
                ret += gamma ** m * float(np.float32(r))
                m += 1
                if term or m == n or i + m == len(ts):
                    break
            rows.append((stack_at(write - 1), action, float(np.float32(ret)),
                         0.0 if term else float(np.float32(gamma ** (m - 1))), stack_at(w)))
    return sorted(rows)


@pytest.mark.parametrize("capacity,stack,n", [(50, 4, 3), (7, 1, 5), (13, 3, 2)])
def test_n_step_agrees_with_slow_reference(capacity, stack, n):
    rng = np.random.default_rng(100 + capacity)
    steps = _random_steps(rng, num_steps=6 * capacity)
    memory = ReplayMemory(capacity, (1,), np.float32, stack, 5, n_step=n, gamma=0.9)
    for i, step in enumerate(steps):
        _fill(memory, [step])
        if i % 5 == 0 or i > len(steps) - 3:
            expected = _reference_n_step(steps[:i + 1], capacity, stack, n, 0.9)
            got = _rows(_all_valid(memory)) if memory.size else []
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                assert a[0] == b[0] and a[1] == b[1] and a[4] == b[4]
                assert a[2] == pytest.approx(b[2], rel=1e-5, abs=1e-5) and a[3] == b[3]


@pytest.mark.parametrize("capacity,stack", [(50, 4), (7, 1), (13, 3)])
def test_agrees_with_slow_reference(capacity, stack):
    rng = np.random.default_rng(capacity)
    steps = _random_steps(rng, num_steps=6 * capacity)
    memory = ReplayMemory(capacity, frame_shape=(1,), frame_dtype=np.float32, stack=stack, seed=5)
    for i, step in enumerate(steps):
        _fill(memory, [step])
        if i % 5 == 0 or i > len(steps) - 3:
            expected = _reference_transitions(steps[:i + 1], capacity, stack)
            assert memory.size == len(expected)
            if expected:
                assert _rows(_all_valid(memory)) == expected
                # Vectorised sampling returns only rows of the reference, at random indices.
                sampled = _rows(memory.sample(64))
                assert set(sampled) <= set(expected)
    # Uniform over the valid transitions: chi-square over 200 draws per transition.
    expected = _reference_transitions(steps, capacity, stack)
    num_draws = 200 * len(expected)
    counts = dict.fromkeys(expected, 0)
    for row in _rows(memory.sample(num_draws)):
        counts[row] += 1
    observed = np.array(list(counts.values()))
    chi2 = float(np.sum((observed - 200) ** 2 / 200))
    dof = len(expected) - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10


def test_add_batch_matches_single_adds():
    rng = np.random.default_rng(11)
    steps = _random_steps(rng, num_steps=150)
    one_by_one = ReplayMemory(20, frame_shape=(1,), frame_dtype=np.float32, stack=3, seed=0)
    batched = ReplayMemory(20, frame_shape=(1,), frame_dtype=np.float32, stack=3, seed=0)
    _fill(one_by_one, steps)
    firsts = np.array([s[0] == "first" for s in steps])
    frames = np.array([[s[-1]] for s in steps], np.float32)
    actions = np.array([0 if f else s[0] for s, f in zip(steps, firsts)])
    rewards = np.array([0.0 if f else s[1] for s, f in zip(steps, firsts)])
    terminals = np.array([False if f else s[2] for s, f in zip(steps, firsts)])
    # Chunks of 1, 7, 40 (more than the 23 slots) and the rest.
    for lo, hi in [(0, 1), (1, 8), (8, 48), (48, len(steps))]:
        batched.add_batch(frames[lo:hi], actions[lo:hi], rewards[lo:hi], terminals[lo:hi],
                          firsts[lo:hi])
    a, b = one_by_one.get_state(), batched.get_state()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert batched.size == one_by_one.size and batched.num_added == one_by_one.num_added
    with pytest.raises(RuntimeError):
        ReplayMemory(5, (1,), np.float32, 2, 0).add_batch(frames[1:3], actions[1:3], rewards[1:3],
                                                          terminals[1:3], np.zeros(2, bool))


def test_get_set_state_round_trip_gives_same_samples():
    rng = np.random.default_rng(3)
    steps = _random_steps(rng, num_steps=120)
    memory = ReplayMemory(30, frame_shape=(1,), frame_dtype=np.float32, stack=4, seed=9)
    _fill(memory, steps[:100])
    memory.sample(10)  # Advance the RNG so that its state matters.
    state = {k: np.array(v) for k, v in memory.get_state().items()}  # Copies, as HDF5 would.
    assert all(isinstance(v, np.ndarray) and v.dtype != object for v in state.values())
    restored = ReplayMemory(30, frame_shape=(1,), frame_dtype=np.float32, stack=4, seed=123)
    restored.set_state(state)
    assert restored.size == memory.size and restored.num_added == memory.num_added
    for _ in range(3):
        a, b = memory.sample(16), restored.sample(16)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    _fill(memory, steps[100:])
    _fill(restored, steps[100:])
    for x, y in zip(memory.sample(16), restored.sample(16)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError):
        ReplayMemory(31, (1,), np.float32, 4, 0).set_state(state)


def test_get_state_views_are_read_only():
    memory = ReplayMemory(4, frame_shape=(1,), frame_dtype=np.float32, stack=2, seed=0)
    memory.add_first(_frame(1))
    with pytest.raises(ValueError):
        memory.get_state()["frames"][0] = 5


def test_generator_state_round_trip():
    rng = np.random.default_rng(42)
    rng.random(3)
    saved = generator_state_to_array(rng)
    assert saved.dtype == np.uint8
    expected = rng.integers(0, 1 << 62, 5)
    other = np.random.default_rng(0)
    generator_state_from_array(other, saved)
    np.testing.assert_array_equal(other.integers(0, 1 << 62, 5), expected)


def test_state_of_a_partly_filled_memory_holds_only_the_written_prefix():
    memory = ReplayMemory(1000, (2,), np.float32, 2, seed=1)
    memory.add_first(np.zeros(2, np.float32))
    for t in range(1, 6):
        memory.add(t % 2, float(t), t == 5, np.full(2, t, np.float32))
    state = memory.get_state()
    assert state["frames"].shape == (6, 2) and state["pos"].shape == (6,)
    other = ReplayMemory(1000, (2,), np.float32, 2, seed=99)
    other.set_state({k: np.array(v) for k, v in state.items()})
    a, b = memory.sample(16), other.sample(16)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert other.size == memory.size == 5


def _stream(i, steps):
    """A memory whose rewards and frames are all i, ``steps`` steps long."""
    m = ReplayMemory(capacity=60, frame_shape=(1,), frame_dtype=np.float32, stack=2, seed=10 + i)
    _fill(m, [("first", i)] + [(i % 2, float(i), step % 7 == 6, i) for step in range(steps)])
    return m


@pytest.mark.parametrize("n, batch", [(8, 32), (3, 32), (1, 32), (5, 3)])
def test_a_batch_across_memories_is_each_memorys_own_sample_of_its_drawn_share(n, batch):
    """sample_across: the shares are one multinomial draw over the memories' sizes; memory i
    (rewards and frames all i) gives its share as its own sample would (a twin memory of the
    same seed), in memory order."""
    from hpcrl.rl.replay import sample_across

    out = sample_across([_stream(i, 40) for i in range(n)], batch, np.random.default_rng(3))
    sizes = np.array([_stream(i, 40).size for i in range(n)], np.float64)
    shares = np.random.default_rng(3).multinomial(batch, sizes / sizes.sum())
    assert len(out.r_t) == batch
    np.testing.assert_array_equal(out.r_t, np.repeat(np.arange(n, dtype=np.float32), shares))
    start = 0
    for i, share in enumerate(shares):
        if share:
            alone = _stream(i, 40).sample(int(share))
            for got, want in zip(out, alone):
                np.testing.assert_array_equal(got[start:start + share], want)
        start += share


def test_a_batch_across_memories_is_uniform_over_their_union():
    """Memories of 10, 30 and 0 valid transitions: over 4,000 batches of 32 the first gives a
    quarter of the transitions and the second three quarters (multinomial: within 4 std of
    128,000 draws), the empty one none; no memory at all has nothing to sample."""
    from hpcrl.rl.replay import sample_across

    memories = [_stream(0, 10), _stream(1, 30), _stream(2, 0)]
    assert [m.size for m in memories] == [10, 30, 0]
    rng = np.random.default_rng(5)
    batches = [sample_across(memories, 32, rng).r_t for _ in range(4000)]
    from_first = sum(int((r == 0).sum()) for r in batches)
    assert not any((r == 2).any() for r in batches)
    n = 4000 * 32
    assert abs(from_first - n / 4) < 4 * (n * 0.25 * 0.75) ** 0.5
    with pytest.raises(ValueError, match="no valid transition"):
        sample_across([_stream(2, 0)], 32, rng)
