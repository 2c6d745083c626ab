"""Tests of hpcrl.envs: DQN preprocessing semantics (Mnih et al. 2015) behind the batched API."""

import subprocess
import sys

import ale_py
import numpy as np
import pytest

from hpcrl.envs import StepResult, atari, make_env, resize_84x84
from hpcrl.envs.atari import resize_84x84_pil


def _random_actions(env, seed, num_steps):
    return np.random.default_rng(seed).integers(0, env.num_actions, (num_steps, env.num_envs))


def test_shapes_and_dtypes():
    env = make_env("pong", 2, 0, training=True)
    assert (env.num_envs, env.num_actions, env.frames_per_step) == (2, 6, 4)
    assert env.obs_shape == (4, 84, 84) and env.frame_shape == (84, 84)
    obs = env.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    res = env.step(np.array([0, 1]))
    assert isinstance(res, StepResult)
    assert res.obs.shape == (2, 4, 84, 84) and res.obs.dtype == np.uint8
    assert res.last_frame.shape == (2, 84, 84) and res.last_frame.dtype == np.uint8
    for name in ("reward", "raw_reward", "episode_return"):
        assert getattr(res, name).shape == (2,) and getattr(res, name).dtype == np.float32
    for name in ("terminal", "episode_end"):
        assert getattr(res, name).dtype == np.bool_
    assert res.episode_frames.dtype == np.int64
    with pytest.raises(ValueError):
        env.step(np.array([0, 6]))
    with pytest.raises(ValueError):
        env.step(np.array([0]))
    env.close()


def test_stack_zeros_at_reset_newest_last_and_shift():
    env = make_env("pong", 2, 1, training=True)
    obs = env.reset()
    assert not obs[:, :3].any()          # zeros ...
    assert obs[:, 3].any()               # ... + the first frame, newest last
    for a in _random_actions(env, 0, 5):
        res = env.step(a)
        assert not res.episode_end.any()
        np.testing.assert_array_equal(res.obs[:, :3], obs[:, 1:])
        np.testing.assert_array_equal(res.obs[:, 3], res.last_frame)
        obs = res.obs
    assert obs[:, 0].any()               # after 5 steps the zeros are gone


def test_frame_skip_and_max_pool_match_a_reference_loop():
    """last_frame == resize(max(screen after frame 3, screen after frame 4)) of a raw ALE
    restored from the env's state and driven by hand, one emulator frame at a time."""
    env = make_env("breakout", 1, 3, training=True)
    env.reset()
    ref = ale_py.ALEInterface()
    ref.setFloat("repeat_action_probability", 0.0)
    ref.setInt("frame_skip", 1)
    ref.loadROM(str(ale_py.roms.get_rom_path("breakout")))
    actions = ref.getMinimalActionSet()
    pooling_mattered = 0
    for a in _random_actions(env, 1, 30):
        ref.restoreState(ale_py.ALEState(env.get_state()["ale_0"].tobytes()))
        frame0 = ref.getEpisodeFrameNumber()
        screens = []
        for _ in range(4):
            ref.act(actions[a[0]])
            screens.append(ref.getScreenGrayscale())
        res = env.step(a)
        expected = resize_84x84(np.maximum(screens[2], screens[3])[None])[0]
        np.testing.assert_array_equal(res.last_frame[0], expected)
        assert ref.getEpisodeFrameNumber() - frame0 == 4
        pooling_mattered += not np.array_equal(resize_84x84(screens[3][None])[0], expected)
    assert pooling_mattered > 0   # the last screen alone would have failed this test


def test_frames_per_agent_step_and_truncation():
    """noop_max=0, cap 40 frames: the episode is cut after 10 agent steps of 4 frames."""
    env = make_env("pong", 1, 0, training=True, noop_max=0, max_episode_frames=40)
    first = env.reset()
    for t in range(10):
        res = env.step(np.array([0]))
        assert res.episode_end[0] == (t == 9)
    assert res.episode_frames[0] == 40
    assert not res.terminal[0]           # truncation is not a terminal: bootstrap stays on
    np.testing.assert_array_equal(res.obs, first)   # fresh stack (no no-ops: same start)
    assert not np.array_equal(res.last_frame[0], first[0, 3])  # last_frame is the old episode's


def test_noop_starts_count_in_episode_frames():
    env = make_env("pong", 4, 5, training=True, noop_max=30, max_episode_frames=1000)
    env.reset()
    noops = env.get_state()["episode_frames_so_far"].copy()
    assert noops.min() >= 0 and noops.max() <= 30 and len(set(noops.tolist())) > 1
    for _ in range((1000 - 30) // 4 + 1):
        res = env.step(np.zeros(4, np.int64))
        if res.episode_end.any():
            break
    # The env whose noops were most ends first, at exactly 1000 frames (noops + 4k, cut at cap).
    assert res.episode_end[np.argmax(noops)]
    assert (res.episode_frames[res.episode_end] == 1000).all()


def test_reward_clipping_only_in_training():
    train = make_env("space_invaders", 2, 7, training=True)
    evalu = make_env("space_invaders", 2, 7, training=False)
    train.reset(), evalu.reset()
    raws = []
    for a in _random_actions(train, 2, 400):
        rt, re = train.step(a), evalu.step(a)
        np.testing.assert_array_equal(rt.raw_reward, re.raw_reward)   # same seed, same game
        np.testing.assert_array_equal(rt.reward, np.clip(rt.raw_reward, -1, 1))
        np.testing.assert_array_equal(re.reward, re.raw_reward)
        raws.append(rt.raw_reward)
    assert np.concatenate(raws).max() > 1    # space invaders pays 5-30 per alien


def test_life_loss_terminal_only_in_training():
    train = make_env("breakout", 1, 11, training=True)
    evalu = make_env("breakout", 1, 11, training=False)
    no_flag = make_env("breakout", 1, 11, training=True, terminal_on_life_loss=False)
    envs = (train, evalu, no_flag)
    for e in envs:
        e.reset()
    lives = [train.get_state()["lives"][0]]
    life_loss_steps = []
    for t, a in enumerate(_random_actions(train, 3, 2000)):
        rt, re, rn = (e.step(a) for e in envs)
        lives.append(train.get_state()["lives"][0])
        if rt.episode_end[0]:
            break
        if lives[-1] < lives[-2]:
            life_loss_steps.append(t)
            assert rt.terminal[0] and not re.terminal[0] and not rn.terminal[0]
        else:
            assert not (rt.terminal[0] or re.terminal[0] or rn.terminal[0])
        assert not (re.episode_end[0] or rn.episode_end[0])   # a lost life does not reset
    assert len(life_loss_steps) >= 2, "random play should lose lives within 2000 steps"
    assert lives[0] == 5


def test_auto_reset_return_is_sum_of_raw_rewards():
    env = make_env("space_invaders", 3, 4, training=True, max_episode_frames=1200)
    env.reset()
    running = np.zeros(3)
    num_ended = 0
    for a in _random_actions(env, 4, 400):
        res = env.step(a)
        running += res.raw_reward
        for i in np.flatnonzero(res.episode_end):
            assert res.episode_return[i] == pytest.approx(running[i])
            assert not res.obs[i, :3].any() and res.obs[i, 3].any()   # fresh stack
            # last_frame belongs to the old episode: it is not the new first frame
            assert not np.array_equal(res.last_frame[i], res.obs[i, 3])
            running[i] = 0
            num_ended += 1
        assert (res.episode_return[~res.episode_end] == 0).all()
    assert num_ended >= 3


def test_unknown_game_raises_with_list_hint():
    with pytest.raises(ValueError, match=r"python -m hpcrl\.games --list") as info:
        make_env("not_a_game", 1, 0, training=True)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["Pong", "ALE/Pong-v5", "PongNoFrameskip-v4"])
def test_gymnasium_style_ids(name):
    assert make_env(name, 1, 0, training=False).game == "pong"


def test_cartpole_through_the_same_interface():
    env = make_env("CartPole-v1", 3, 0, training=True)
    assert env.obs_shape == env.frame_shape == (4,) and env.num_actions == 2
    assert env.frames_per_step == 1
    obs = env.reset()
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    lengths = np.zeros(3, int)
    ended = 0
    for a in _random_actions(env, 0, 200):
        res = env.step(a)
        lengths += 1
        for i in np.flatnonzero(res.episode_end):
            # CartPole pays +1 per step, so return == length == frames
            assert res.episode_frames[i] == lengths[i] == res.episode_return[i]
            assert res.terminal[i]             # pole fell (random play never reaches 500)
            assert not np.array_equal(res.obs[i], res.last_frame[i])
            lengths[i] = 0
            ended += 1
    assert ended > 5
    assert make_env("acrobot", 1, 0, training=True).num_actions == 3


def _trajectory(env, actions):
    out = []
    for a in actions:
        r = env.step(a)
        out.append((r.obs, r.raw_reward, r.terminal, r.episode_end))
    return out


def _assert_same(t1, t2):
    for x, y in zip(t1, t2):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("game", ["pong", "CartPole-v1"])
def test_determinism_and_state_round_trip(game):
    kwargs = dict(training=True, sticky_prob=0.25)
    e1, e2, e3 = make_env(game, 2, 9, **kwargs), make_env(game, 2, 9, **kwargs), make_env(game, 2, 10, **kwargs)
    actions = _random_actions(e1, 5, 60)
    np.testing.assert_array_equal(e1.reset(), e2.reset())
    e3.reset()
    t1, t2, t3 = _trajectory(e1, actions[:30]), _trajectory(e2, actions[:30]), _trajectory(e3, actions[:30])
    _assert_same(t1, t2)
    assert any(not np.array_equal(x[0], y[0]) for x, y in zip(t1, t3))   # another seed differs
    state = e1.get_state()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    rest1 = _trajectory(e1, actions[30:])
    e3.set_state(state)                       # e3 continues e1's game, RNGs included
    _assert_same(rest1, _trajectory(e3, actions[30:]))


def test_import_does_not_import_torch():
    code = "import sys, hpcrl.envs, hpcrl.games; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_env_rng_states_of_older_checkpoints_still_restore():
    """Checkpoints written before the one RNG encoding hold PCG64 as 6 uint64 words."""
    from hpcrl.io.rngstate import generator_from_array, generator_state_to_array

    rng = np.random.default_rng(123)
    rng.random(7)
    st = rng.bit_generator.state
    mask = (1 << 64) - 1
    s, inc = st["state"]["state"], st["state"]["inc"]
    legacy = np.array([s >> 64, s & mask, inc >> 64, inc & mask, st["has_uint32"],
                       st["uinteger"]], np.uint64)
    expected = rng.random(5)
    np.testing.assert_array_equal(generator_from_array(legacy).random(5), expected)
    again = np.random.default_rng(9)
    saved = generator_state_to_array(again)
    np.testing.assert_array_equal(generator_from_array(saved).random(3), again.random(3))


def _resize_each(screens):
    """The slow reference: every screen resized alone by PIL's BOX filter."""
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(s).resize((84, 84), Image.BOX)) for s in screens])


@pytest.mark.parametrize("resize", [resize_84x84, resize_84x84_pil], ids=["c", "pil"])
def test_batched_resize_equals_each_screen_resized_alone(resize):
    """Both resize paths give PIL's pixels of each screen resized alone, on real screens and
    on noise (where any window or rounding difference shows) and at the extremes."""
    if resize is resize_84x84 and atari._frames is None:
        pytest.fail("hpcrl.envs._frames is not built (pip install -e . with a C compiler)")
    env = make_env("breakout", 8, seed=3, training=True)
    env.reset()
    checked = 0
    for actions in _random_actions(env, 4, 60):
        env.step(actions)
        screens = env.pooled_screens()                # real max-pooled grayscale screens
        for n in (1, 3, 8):
            np.testing.assert_array_equal(resize(screens[:n]), _resize_each(screens[:n]))
            checked += n
    assert checked == 60 * 12
    noise = np.random.default_rng(0).integers(0, 256, (64, 210, 160), dtype=np.uint8)
    np.testing.assert_array_equal(resize(noise), _resize_each(noise))
    flat = np.stack([np.full((210, 160), v, np.uint8) for v in (0, 1, 254, 255)])
    np.testing.assert_array_equal(resize(flat), _resize_each(flat))


def test_resize_of_other_shapes_and_without_the_extension_is_pils(monkeypatch):
    """Only the ALE's 210 x 160 screens take the C path: Pillow 13 resizes a 250 x 160 screen
    vertical pass first, which the C path would not match; without the extension, PIL."""
    rng = np.random.default_rng(5)
    tall = rng.integers(0, 256, (1, 250, 160), dtype=np.uint8)
    np.testing.assert_array_equal(resize_84x84(tall), _resize_each(tall))
    screens = rng.integers(0, 256, (3, 210, 160), dtype=np.uint8)
    monkeypatch.setattr(atari, "_frames", None)
    np.testing.assert_array_equal(resize_84x84(screens), _resize_each(screens))


def _table_resize(screens, h, v):
    """The slow reference of the C pass's arithmetic for any windows and tables: each
    horizontal window's pixel sum looked up in its table, into an 8-bit image, then each
    vertical window's sum of that image's rows looked up in its table."""
    (hf, hc, hl), (vf, vc, vl) = h, v
    out = []
    for s in screens.astype(np.int64):
        rows = np.stack([hl[c, s[:, f:f + c].sum(axis=1)] for f, c in zip(hf, hc)], axis=1)
        out.append(np.stack([vl[c, rows[f:f + c].sum(axis=0)] for f, c in zip(vf, vc)]))
    return np.stack(out).astype(np.uint8)


def test_c_resize_is_its_table_arithmetic_for_any_table():
    """The C pass selects from each row and its pair means where the horizontal table is
    BOX's plain mean (the ALE's screens); with any other table it adds up the windows. Both
    equal the table arithmetic written out in numpy (`_table_resize`)."""
    if atari._frames is None:
        pytest.fail("hpcrl.envs._frames is not built (pip install -e . with a C compiler)")
    rng = np.random.default_rng(11)
    screens = rng.integers(0, 256, (3, 210, 160), dtype=np.uint8)
    h, v = atari.box_windows(160, 84), atari.box_windows(210, 84)
    other = h[2].copy()
    other[2] = np.minimum(other[2].astype(np.int64) + 1, 255).astype(np.uint8)  # not a mean
    for table in (h[2], other):
        out = np.empty((3, 84, 84), np.uint8)
        atari._frames.box_resize(screens, out, h[0], h[1], table, *v)
        np.testing.assert_array_equal(out, _table_resize(screens, (h[0], h[1], table), v))
    assert not np.array_equal(_table_resize(screens, (h[0], h[1], other), v),
                              _table_resize(screens, h, v))


def test_pooled_resize_equals_numpy_max_then_pil():
    """pool_box_resize: the max of each frame pair (or the first frame, where the skip
    grabbed one) resized, the pixels of numpy's max and PIL's resize of each screen alone, on
    real frame pairs of a running game and on noise."""
    if atari._frames is None:
        pytest.fail("hpcrl.envs._frames is not built (pip install -e . with a C compiler)")
    env = make_env("breakout", 4, seed=5, training=True)
    env.reset()
    rng = np.random.default_rng(2)
    for actions in _random_actions(env, 6, 40):
        env.step(actions)
        pairs, grabbed = env._screens.copy(), rng.integers(1, 3, 4).astype(np.uint8)
        pooled = np.where((grabbed == 2)[:, None, None],
                          np.maximum(pairs[:, 0], pairs[:, 1]), pairs[:, 0])
        np.testing.assert_array_equal(atari.max_pool(pairs, grabbed), pooled)
        np.testing.assert_array_equal(atari.pool_resize_84x84(pairs, grabbed), _resize_each(pooled))
    noise = rng.integers(0, 256, (16, 2, 210, 160), dtype=np.uint8)
    grabbed = np.tile(np.array([1, 2], np.uint8), 8)
    expected = _resize_each(atari.max_pool(noise, grabbed))
    np.testing.assert_array_equal(atari.pool_resize_84x84(noise, grabbed), expected)
    np.testing.assert_array_equal(atari.pool_resize_84x84_pil(noise, grabbed), expected)


def test_pooled_resize_refuses_bad_frame_counts_and_shapes():
    """pool_box_resize checks its frame counts and shapes before writing anything."""
    if atari._frames is None:
        pytest.fail("hpcrl.envs._frames is not built (pip install -e . with a C compiler)")
    h, v = atari.box_windows(160, 84), atari.box_windows(210, 84)
    pairs = np.zeros((2, 2, 210, 160), np.uint8)
    out = np.full((2, 84, 84), 7, np.uint8)
    for bad in ([1, 0], [3, 2]):
        with pytest.raises(ValueError, match=r"grabbed\[\d\] is [03]"):
            atari._frames.pool_box_resize(pairs, np.array(bad, np.uint8), out, *h, *v)
    with pytest.raises(ValueError, match="2 frames a screen"):
        atari._frames.pool_box_resize(np.zeros((2, 3, 210, 160), np.uint8),
                                      np.ones(2, np.uint8), out, *h, *v)
    with pytest.raises(ValueError, match="different numbers of screens"):
        atari._frames.pool_box_resize(pairs, np.ones(3, np.uint8), out, *h, *v)
    with pytest.raises(TypeError, match="src must be a contiguous 4D uint8"):
        atari._frames.pool_box_resize(pairs[0], np.ones(2, np.uint8), out, *h, *v)
    with pytest.raises(TypeError, match="pool_box_resize"):
        atari._frames.pool_box_resize(pairs, out, *h, *v)
    assert (out == 7).all()
    atari._frames.pool_box_resize(pairs, np.ones(2, np.uint8), out, *h, *v)
    assert not out.any()


def test_c_resize_refuses_windows_outside_the_screen():
    """box_resize checks every window against the input and its table before writing."""
    if atari._frames is None:
        pytest.fail("hpcrl.envs._frames is not built (pip install -e . with a C compiler)")
    screens = np.zeros((2, 210, 160), np.uint8)
    h, v = atari.box_windows(160, 84), atari.box_windows(210, 84)
    out = np.full((2, 84, 84), 7, np.uint8)
    for i, value, which in ((83, 159, "horizontal"),      # a 2-pixel window from the last column
                            (0, -1, "horizontal"),
                            (0, 2 ** 31 - 1, "horizontal"),  # first + count wraps in int32
                            (83, 209, "vertical"),         # a 2-row window from the last row
                            (0, 2 ** 31 - 1, "vertical")):
        windows = {"horizontal": list(h), "vertical": list(v)}
        first = windows[which][0].copy()
        first[i] = value
        windows[which][0] = first
        with pytest.raises(ValueError, match=f"{which} window {i} "):
            atari._frames.box_resize(screens, out, *windows["horizontal"], *windows["vertical"])
    count = v[1].copy()
    count[0] = 4                                      # beyond the table's counts
    with pytest.raises(ValueError, match="vertical window 0"):
        atari._frames.box_resize(screens, out, *h, v[0], count, v[2])
    with pytest.raises(ValueError, match="horizontal window 0"):      # a table too narrow
        atari._frames.box_resize(screens, out, *h[:2], np.ascontiguousarray(h[2][:, :300]), *v)
    with pytest.raises(TypeError, match="src must be a contiguous 3D uint8"):
        atari._frames.box_resize(screens.astype(np.int16), out, *h, *v)
    read_only = np.zeros((2, 84, 84), np.uint8)
    read_only.setflags(write=False)
    with pytest.raises((BufferError, ValueError), match="read-only"):
        atari._frames.box_resize(screens, read_only, *h, *v)
    assert (out == 7).all() and not read_only.any()
    atari._frames.box_resize(screens, out, *h, *v)    # the same arguments, corrected
    assert not out.any()


def _stream_digest(game, num_envs, num_steps, seed, training):
    """sha256 of the reset observation and of every field of every step, random actions."""
    import hashlib

    env = make_env(game, num_envs, seed=seed, training=training)
    h = hashlib.sha256(env.reset().tobytes())
    ends = 0
    for actions in _random_actions(env, seed, num_steps):
        res = env.step(actions)
        for x in res:
            h.update(np.ascontiguousarray(x).tobytes())
        ends += int(res.episode_end.sum())
    return h.hexdigest()[:16], ends


@pytest.mark.skipif(ale_py.__version__ != "0.12.1", reason="digests recorded with ale-py 0.12.1")
def test_observation_stream_is_the_one_of_per_frame_preprocessing():
    """Breakout (life-loss terminals, game overs, auto-resets inside the stream) in training and
    evaluation: every observation, frame, reward and flag hashes to the digest recorded with
    the per-screen resize, two game_over calls per step and a copied stack."""
    assert _stream_digest("breakout", 3, 1500, 7, True) == ("f4f41f677fa5b654", 21)
    assert _stream_digest("breakout", 2, 600, 8, False) == ("0056171760f8b014", 6)


def test_observations_handed_out_are_never_written_again():
    env = make_env("breakout", 2, seed=1, training=True)
    handed = [env.reset()]
    for actions in _random_actions(env, 2, 400):
        handed.append(env.step(actions).obs)
    copies = [h.copy() for h in handed]
    state = env.get_state()
    env.reset()
    env.set_state(state)
    env.step(np.zeros(2, np.int64))
    for h, c in zip(handed, copies):
        np.testing.assert_array_equal(h, c)


def test_a_resume_that_switches_life_loss_terminals_on_sees_no_stale_life_loss():
    """Without life-loss terminals the env does not follow lives step by step; its state
    still holds the emulators' lives, so a resume with them switched on starts from there."""
    off = make_env("breakout", 1, seed=2, training=True, terminal_on_life_loss=False)
    off.reset()
    lost = False
    for actions in _random_actions(off, 3, 400):
        res = off.step(actions)
        lives = off._ales[0].lives()
        if 0 < lives < 5 and not res.episode_end[0]:
            lost = True
            break
    assert lost                                   # a life lost, the game going on
    state = off.get_state()
    assert state["lives"][0] == lives
    on = make_env("breakout", 1, seed=2, training=True, terminal_on_life_loss=True)
    on.set_state(state)
    assert not on.step(np.zeros(1, np.int64)).terminal[0]


needs_palette_simd = pytest.mark.skipif(atari._frames is None or not atari._frames.palette_simd(),
                                        reason="the palette lookup's AVX-512 VBMI loop")


@pytest.mark.skipif(atari._frames is None, reason="the C extension")
@pytest.mark.parametrize("simd", [True, False])
def test_palette_lookup_is_the_table_at_every_length(simd):
    """dst == gray[src] for lengths around the 64-byte blocks and a whole screen; True exactly
    when no pixel's index is marked unknown (the flag of the last pixel, inside the tail)."""
    rng = np.random.default_rng(3)
    gray = rng.integers(0, 256, 256).astype(np.uint8)
    for n in [1, 63, 64, 65, 127, 128, 1000, 210 * 160]:
        src = rng.integers(0, 256, n).astype(np.uint8)
        dst = np.zeros(n, np.uint8)
        unknown = np.zeros(256, np.uint8)
        unknown[np.setdiff1d(np.arange(256), src)] = 1        # indices absent from src
        assert atari._frames.palette_gray(src, dst, gray, unknown, simd) is True
        np.testing.assert_array_equal(dst, gray[src])
        unknown[src[-1]] = 1
        assert atari._frames.palette_gray(src, dst, gray, unknown, simd) is False
        np.testing.assert_array_equal(dst, gray[src])         # written all the same


@pytest.mark.skipif(atari._frames is None, reason="the C extension")
def test_palette_lookup_refuses_bad_buffers():
    src, dst, table = np.zeros(100, np.uint8), np.zeros(100, np.uint8), np.zeros(256, np.uint8)
    lookup = atari._frames.palette_gray
    with pytest.raises(ValueError, match="size of src"):
        lookup(src, dst[:99], table, table, True)
    with pytest.raises(ValueError, match="256 bytes"):
        lookup(src, dst, table[:255], table, True)
    with pytest.raises(ValueError, match="not be src"):
        lookup(src, src, table, table, True)
    with pytest.raises(TypeError, match="uint8"):
        lookup(src.astype(np.int32), dst, table, table, True)
    read_only = np.zeros(100, np.uint8)
    read_only.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):
        lookup(src, read_only, table, table, True)


@needs_palette_simd
@pytest.mark.parametrize("game", ["pong", "ms_pacman", "space_invaders", "seaquest"])
def test_palette_screens_are_the_ales_grayscale_screens(game):
    """Two envs of one seed and actions, one with the learned palette and one asking the ALE
    for every grayscale screen: the same pooled screens and observations at every step, and
    after the first steps the ALE is asked for (almost) none."""
    fast, plain = (make_env(game, 2, seed=5, training=True) for _ in range(2))
    plain._palette.enabled = False
    calls = []
    grab = fast._palette.grab

    def counted(ale, out):
        before = int(fast._palette.unknown.sum())
        grab(ale, out)
        calls.append(before != int(fast._palette.unknown.sum()))
    fast._palette.grab = counted
    np.testing.assert_array_equal(fast.reset(), plain.reset())
    for actions in _random_actions(fast, 5, 400):
        a, b = fast.step(actions), plain.step(actions)
        np.testing.assert_array_equal(fast.pooled_screens(), plain.pooled_screens())
        np.testing.assert_array_equal(a.obs, b.obs)
    palette = fast._palette
    assert palette.enabled and sum(calls) < 20 < len(calls)   # the table learned in a few screens
    seen = np.flatnonzero(palette.unknown == 0)
    assert 2 <= seen.size <= 40 and not np.any(seen % 2)       # the NTSC palette's even indices


@needs_palette_simd
def test_palette_that_is_not_a_function_of_the_index_falls_back_to_the_ale():
    env = make_env("pong", 1, seed=2, training=True)
    env.reset()
    palette = env._palette
    idx, gray = np.flatnonzero(palette.unknown == 0)[0], palette.gray.copy()
    indices = np.full((210, 160), idx, np.uint8)
    other = np.full((210, 160), gray[idx] ^ 1, np.uint8)      # a second value for a known index
    palette.learn(indices, other)
    assert not palette.enabled
    np.testing.assert_array_equal(palette.gray, gray)          # nothing learned from it
    ref = make_env("pong", 1, seed=2, training=True)
    ref._palette.enabled = False
    ref.reset()
    for actions in _random_actions(env, 2, 30):
        np.testing.assert_array_equal(env.step(actions).obs, ref.step(actions).obs)
