"""Atari through ale-py's ``ALEInterface``, driven from Python with DQN preprocessing
(see :mod:`hpcrl.envs` for the preprocessing and the backend choice)."""

from __future__ import annotations

import functools
import math

import numpy as np

from hpcrl.envs.base import Episodes, StepResult, check_actions
from hpcrl.io.rngstate import generator_from_array, generator_state_to_array

FRAME_HEIGHT = 84
FRAME_WIDTH = 84


try:      # the resize in C (_frames.c beside this file), built by pip install when a compiler exists
    from hpcrl.envs import _frames
except ImportError:  # pragma: no cover - without a compiler: PIL
    _frames = None

ALE_SCREEN = (210, 160)  # the emulator's screen, rows x columns, for every game
PRECISION_BITS = 22     # Pillow's fixed-point fraction bits for 8-bit images (32 - 8 - 2)


def box_weights(in_size: int, out_size: int) -> list[tuple[int, list[int]]]:
    """Pillow's BOX filter along one axis, as its ``precompute_coeffs`` and
    ``normalize_coeffs_8bpc`` compute it (src/libImaging/Resample.c), in the same double
    arithmetic (Python floats are IEEE doubles): for each output index, the first input index
    of its window and the window's weights in fixed point (``PRECISION_BITS``).

    The BOX filter weighs 1 every input pixel whose centre lies inside the output pixel's
    footprint, normalised by their count.
    """
    scale = float(in_size) / out_size          # Pillow: (double)(in1 - in0) / outSize
    filterscale = max(scale, 1.0)
    support = 0.5 * filterscale                # the BOX filter's support, 0.5
    ss = 1.0 / filterscale
    out = []
    for xx in range(out_size):
        center = 0.0 + (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        w = [1.0 if -0.5 < ((x + xmin) - center + 0.5) * ss <= 0.5 else 0.0 for x in range(xmax)]
        ww = sum(w)
        out.append((xmin, [int(0.5 + (k / ww if ww != 0.0 else k) * (1 << PRECISION_BITS))
                           for k in w]))
    return out


@functools.lru_cache(maxsize=None)
def box_windows(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The windows of :func:`box_weights` as `_frames.box_resize` takes them: the first input
    index and the count of each window's weighted pixels ([out_size] int32 each), and the
    table of each output value by count and pixel sum, ``lut[count, sum]`` = Pillow's rounded
    fixed-point sum ([max count + 1, 255 * max count + 1] uint8).

    Raises ValueError where a window's weighted pixels are not contiguous or not all alike, or
    two windows of one count weigh differently (not so for BOX; the table would not hold).
    """
    first, count, weight_of = [], [], {0: 0}
    for xmin, w in box_weights(in_size, out_size):
        used = [i for i, k in enumerate(w) if k]
        weight = w[used[0]] if used else 0
        if used and (used != list(range(used[0], used[-1] + 1)) or any(w[i] != weight for i in used)):
            raise ValueError("a BOX window with a gap or unequal weights")
        if weight_of.setdefault(len(used), weight) != weight:
            raise ValueError("BOX windows of one size weigh differently")
        first.append(xmin + used[0] if used else min(xmin, in_size - 1))
        count.append(len(used))
    top = max(count)
    sums = np.arange(255 * top + 1, dtype=np.int64)
    lut = np.zeros((top + 1, sums.size), np.uint8)
    for c, k in weight_of.items():
        lut[c] = np.clip(((1 << (PRECISION_BITS - 1)) + k * sums) >> PRECISION_BITS, 0, 255)
    arrays = (np.array(first, np.int32), np.array(count, np.int32), lut)
    for a in arrays:
        a.setflags(write=False)
    return arrays


def resize_84x84(screens: np.ndarray) -> np.ndarray:
    """[n, H, W] uint8 grayscale screens -> [n, 84, 84] uint8 with PIL's BOX filter.

    The ALE's 210 x 160 screens go through Pillow's own BOX arithmetic in the C extension
    (`_frames.c`), in one call from the contiguous batch: the same pixels as PIL (tested
    against PIL on real and random screens), without PIL's per-call image objects and copies.
    The extension runs Pillow's horizontal pass first, as Pillow does for this shape (for some
    other shapes Pillow 13 runs the vertical pass first, which rounds differently), so other
    shapes, and every shape without the extension, go through PIL (:func:`resize_84x84_pil`).
    """
    screens = np.ascontiguousarray(screens, np.uint8)
    n, h, w = screens.shape
    if _frames is None or (h, w) != ALE_SCREEN:
        return resize_84x84_pil(screens)
    out = np.empty((n, FRAME_HEIGHT, FRAME_WIDTH), np.uint8)
    _frames.box_resize(screens, out, *box_windows(w, FRAME_WIDTH), *box_windows(h, FRAME_HEIGHT))
    return out


def max_pool(pairs: np.ndarray, grabbed: np.ndarray) -> np.ndarray:
    """[n, 2, H, W] uint8 frame pairs -> [n, H, W]: each screen the pixelwise max of its two
    frames where ``grabbed`` is 2, its first frame where it is 1 (DQN's max over the last two
    frames of a skip, or the one frame of a skip cut short)."""
    pooled = np.maximum(pairs[:, 0], pairs[:, 1])
    single = np.asarray(grabbed) == 1
    pooled[single] = pairs[single, 0]
    return pooled


def pool_resize_84x84(pairs: np.ndarray, grabbed: np.ndarray) -> np.ndarray:
    """:func:`max_pool` then :func:`resize_84x84`: [n, 2, H, W] uint8 -> [n, 84, 84] uint8.

    For the ALE's screens the C extension does both in one pass (`_frames.pool_box_resize`:
    each row's max goes straight into the horizontal pass, no pooled screen is written), the
    same pixels; other shapes and installs without the extension pool in numpy and resize as
    :func:`resize_84x84` does."""
    n, two, h, w = pairs.shape
    if _frames is None or (h, w) != ALE_SCREEN or two != 2:
        return resize_84x84(max_pool(pairs, grabbed))
    pairs = np.ascontiguousarray(pairs, np.uint8)
    out = np.empty((n, FRAME_HEIGHT, FRAME_WIDTH), np.uint8)
    _frames.pool_box_resize(pairs, np.ascontiguousarray(grabbed, np.uint8), out,
                            *box_windows(w, FRAME_WIDTH), *box_windows(h, FRAME_HEIGHT))
    return out


def pool_resize_84x84_pil(pairs: np.ndarray, grabbed: np.ndarray) -> np.ndarray:
    """The same as :func:`pool_resize_84x84` by numpy's max and PIL's resize (the reference
    the C pass is measured and tested against)."""
    return resize_84x84_pil(max_pool(pairs, grabbed))


def resize_84x84_pil(screens: np.ndarray) -> np.ndarray:
    """[n, H, W] uint8 grayscale screens -> [n, 84, 84] uint8 with PIL's BOX filter.

    BOX averages the input pixels whose centres fall inside each output pixel's footprint,
    close to OpenCV's INTER_AREA (gymnasium, Dopamine) without needing OpenCV. The n screens
    are resized in one PIL call, laid side by side as one [H, n * W] image: the horizontal
    footprints end exactly at the screens' edges (n * W / (n * 84) is the same scale), so
    each output pixel is the one of a screen resized alone (`tests/test_envs.py` checks it
    against per-screen resizes); one call per batch instead of one per screen saves PIL's
    per-image overhead. Stacking the screens vertically instead would need no transpose, but
    PIL's vertical pass then rounds some pixels differently (off by one).

    A numpy version with exact area weights was tried: as a BLAS matmul it was twice as fast
    but OpenBLAS ran it on several threads (and its idle threads spin), against the
    one-core-per-rank rule; in pure integer numpy it was slower than PIL.
    """
    from PIL import Image

    n, h, w = screens.shape
    wide = np.ascontiguousarray(screens.transpose(1, 0, 2)).reshape(h, n * w)
    img = Image.frombuffer("L", (n * w, h), wide, "raw", "L", 0, 1)
    small = np.asarray(img.resize((n * FRAME_WIDTH, FRAME_HEIGHT), Image.BOX))
    return np.ascontiguousarray(small.reshape(FRAME_HEIGHT, n, FRAME_WIDTH).transpose(1, 0, 2))


class PaletteGray:
    """The ALE's grayscale screens from its palette indices, with a table learned from the ALE.

    The ALE makes a grayscale screen by looking every pixel's palette index up in its
    palette's luminance table (``getScreenGrayscale``: about 10 us per screen here, two per
    agent step). Its palette indices (``getScreen``) are a plain copy (0.4 us), and with
    AVX-512 VBMI a 256-entry byte table is applied to 64 pixels per instruction pair
    (`_frames.palette_gray`, 0.6 us a screen). The table is not taken from ALE's source: each
    index's gray value is learned from the ALE's own grayscale screen the first time the index
    appears (a screen with an index not yet seen is grabbed in grayscale from the ALE and
    teaches the table), so every pixel is the ALE's. Should a gray value ever not be a
    function of the index (no ALE setting used here does that), the table is no longer used
    and every screen comes from ``getScreenGrayscale`` again. Without the extension or without
    VBMI (where a scalar loop is no faster than the ALE's) every screen comes from the ALE.
    """

    def __init__(self, shape: tuple[int, int]):
        self.enabled = _frames is not None and _frames.palette_simd()
        self.gray = np.zeros(256, np.uint8)
        self.unknown = np.ones(256, np.uint8)        # 1 until the index's gray value is seen
        self._indices = np.empty(shape, np.uint8)    # one screen's palette indices, reused

    def grab(self, ale, out: np.ndarray) -> None:
        """``ale``'s current screen in grayscale into ``out`` (contiguous uint8 [H, W])."""
        if self.enabled:
            ale.getScreen(self._indices)
            if _frames.palette_gray(self._indices, out, self.gray, self.unknown, True):
                return
        ale.getScreenGrayscale(out)
        if self.enabled:
            self.learn(self._indices, out)

    def learn(self, indices: np.ndarray, gray: np.ndarray) -> None:
        """Take each index's gray value from a screen the ALE converted itself."""
        pairs = np.unique(indices.astype(np.int32).ravel() * 256 + gray.ravel())
        idx, val = pairs >> 8, (pairs & 255).astype(np.uint8)
        known = self.unknown[idx] == 0
        if (np.any(idx[1:] == idx[:-1])                     # one index, two gray values
                or np.any(self.gray[idx[known]] != val[known])):
            self.enabled = False
            return
        self.gray[idx] = val
        self.unknown[idx] = 0


class AtariEnv:
    """N Atari games, one `ale_py.ALEInterface` each, stepped in turn on the calling thread.

    Usage::

        env = AtariEnv("pong", num_envs=8, seed=0, training=True)
        obs = env.reset()                       # [8, 4, 84, 84] uint8
        res = env.step(actions)                 # StepResult, auto-resets ended games
    """

    frames_per_step: int

    def __init__(self, game: str, num_envs: int, seed: int, *, training: bool, frame_skip: int = 4,
                 stack: int = 4, noop_max: int = 30, sticky_prob: float = 0.0,
                 max_episode_frames: int = 108_000, clip_rewards: bool = True,
                 terminal_on_life_loss: bool = True):
        import ale_py

        if num_envs < 1 or frame_skip < 1 or stack < 1 or noop_max < 0:
            raise ValueError("num_envs, frame_skip and stack must be >= 1 and noop_max >= 0")
        self.game = game
        self.num_envs = num_envs
        self.frames_per_step = frame_skip
        self.noop_max = noop_max
        self.max_episode_frames = max_episode_frames
        self.clip_rewards = training and clip_rewards
        self.life_loss_terminal = training and terminal_on_life_loss
        ss_ale, ss_noop = np.random.SeedSequence(seed).spawn(2)
        ale_seeds = ss_ale.generate_state(num_envs, dtype=np.uint32) & 0x7FFFFFFF
        self._noop_rng = np.random.Generator(np.random.PCG64(ss_noop))
        rom = ale_py.roms.get_rom_path(game)
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        self._ales = []
        for s in ale_seeds:
            ale = ale_py.ALEInterface()
            ale.setInt("random_seed", int(s))
            ale.setFloat("repeat_action_probability", float(sticky_prob))  # ALE's default is 0.25
            ale.setInt("frame_skip", 1)  # the skip and the max-pool are done here
            ale.loadROM(str(rom))
            self._ales.append(ale)
        self._action_set = list(self._ales[0].getMinimalActionSet())
        self._noop = ale_py.Action.NOOP
        self.num_actions = len(self._action_set)
        h, w = self._ales[0].getScreenDims()
        self._screens = np.zeros((num_envs, 2, h, w), np.uint8)  # last two frames of the skip
        self._grabbed = np.ones(num_envs, np.uint8)    # how many of them this step holds
        self._frame_pairs = [(pair[0], pair[1]) for pair in self._screens]  # views, made once
        self._palette = PaletteGray((h, w))
        self.frame_shape = (FRAME_HEIGHT, FRAME_WIDTH)
        self.obs_shape = (stack, FRAME_HEIGHT, FRAME_WIDTH)
        self._stack = np.zeros((num_envs, *self.obs_shape), np.uint8)
        self._lives = np.zeros(num_envs, np.int64)
        self._episodes = Episodes(num_envs)
        self.render_fps = 60 / frame_skip  # the ALE's 60 Hz, one picture per agent step

    # -- preprocessing ---------------------------------------------------------------------
    #: the max of each environment's frame pair and the 84 x 84 resize (bench env swaps it)
    _pool_resize = staticmethod(pool_resize_84x84)

    def pooled_screens(self) -> np.ndarray:
        """[n, 210, 160] uint8: the max-pooled grayscale screens of the last step or reset,
        before the resize."""
        return max_pool(self._screens, self._grabbed)

    def _frames_of(self, idx: np.ndarray | None = None) -> np.ndarray:
        """[n, 84, 84] uint8: the new frame of every environment (or of those in ``idx``)."""
        if idx is None:
            return self._pool_resize(self._screens, self._grabbed)
        return self._pool_resize(self._screens[idx], self._grabbed[idx])

    def _act(self, i: int, action) -> tuple[int, bool]:
        """One agent step of env i: repeat `action` for up to frame_skip frames.

        Stops early at game over or at the frame cap. Grabs the last two emulator frames of
        the skip into `self._screens[i]` (only the final frame if the skip stopped early or
        frame_skip == 1) and their count into `self._grabbed[i]`; the step pools and resizes
        them. Returns the summed raw reward and whether the game is over (asked once per
        emulator frame; the step does not ask again).
        """
        ale, screens = self._ales[i], self._frame_pairs[i]
        grab = self._palette.grab
        skip, cap = self.frames_per_step, self.max_episode_frames
        frames = int(self._episodes.frames[i])
        reward = grabbed = 0
        over = False
        for k in range(skip):
            reward += ale.act(action)
            frames += 1
            over = ale.game_over()
            done = over or frames >= cap
            if k >= skip - 2 or done:
                grab(ale, screens[grabbed])
                grabbed += 1
            if done:
                break
        self._episodes.frames[i] = frames
        self._grabbed[i] = grabbed
        return reward, over

    def _reset_one(self, i: int) -> None:
        """New game in env i: reset, U{0..noop_max} no-op frames; its first screen grabbed."""
        ale = self._ales[i]
        ale.reset_game()
        num_noops = int(self._noop_rng.integers(0, self.noop_max + 1))
        for _ in range(num_noops):
            ale.act(self._noop)
            if ale.game_over():  # never seen in practice; start over without no-ops
                ale.reset_game()
                num_noops = 0
                break
        self._episodes.frames[i] = num_noops
        self._episodes.returns[i] = 0.0
        self._lives[i] = ale.lives()
        self._palette.grab(ale, self._frame_pairs[i][0])
        self._grabbed[i] = 1

    def _reset_envs(self, idx: np.ndarray) -> None:
        """Reset the envs in `idx`; their stacks become zeros + the first frame."""
        for i in idx:
            self._reset_one(int(i))
        self._stack[idx] = 0
        self._stack[idx, -1] = self._frames_of(idx)

    # -- interface ---------------------------------------------------------------------------
    @property
    def action_ids(self) -> list[int]:
        """ALE action number of each of the agent's actions (the game's minimal action set)."""
        return [int(a.value) for a in self._action_set]

    def render_rgb(self, i: int = 0) -> np.ndarray:
        """[210, 160, 3] uint8: env ``i``'s current screen in colour (for videos)."""
        return self._ales[i].getScreenRGB()

    def reset(self) -> np.ndarray:
        """Start a new game in every env. Returns obs [N, stack, 84, 84] uint8 (zeros + 1 frame)."""
        self._stack = np.zeros_like(self._stack)     # never write into an array handed out
        self._reset_envs(np.arange(self.num_envs))
        return self._stack.copy()

    #: step() can write its observations into a buffer of the caller's (``out``)
    obs_into = True

    def step(self, actions: np.ndarray, out: np.ndarray | None = None) -> StepResult:
        """One agent step (frame_skip emulator frames) in every env; auto-resets ended games.

        ``out``: an [N, *obs_shape] uint8 array to write the new observations into (a slot of
        a rollout's storage, say), handed out as ``obs`` in place of a fresh array; the env
        never writes into it after this step. It must not be the previous step's ``obs``.
        """
        acts = check_actions(actions, self.num_envs, self.num_actions)
        n = self.num_envs
        raw = np.zeros(n, np.float32)
        game_over = np.zeros(n, bool)
        lives = np.empty(n, np.int64)
        count_lives = self.life_loss_terminal      # lives only matter for life-loss terminals
        for i in range(n):
            raw[i], game_over[i] = self._act(i, self._action_set[acts[i]])
            lives[i] = self._ales[i].lives() if count_lives else self._lives[i]
        last_frame = self._frames_of()
        truncated = ~game_over & (self._episodes.frames >= self.max_episode_frames)
        life_lost = lives < self._lives
        self._lives = lives
        self._episodes.returns += raw
        episode_end = game_over | truncated
        terminal = game_over | (life_lost & self.life_loss_terminal)
        episode_return = np.where(episode_end, self._episodes.returns, 0.0).astype(np.float32)
        episode_frames = np.where(episode_end, self._episodes.frames, 0)
        # The new stack is a fresh array (or the caller's `out`), handed out as the observation
        # without a copy: the env never writes into it after this step (the next step builds
        # another one).
        if out is None:
            stack = np.empty_like(self._stack)
        elif (out.shape != self._stack.shape or out.dtype != np.uint8
              or np.may_share_memory(out, self._stack)):
            raise ValueError(f"out must be a fresh {self._stack.shape} uint8 array")
        else:
            stack = out
        stack[:, :-1] = self._stack[:, 1:]
        stack[:, -1] = last_frame
        self._stack = stack
        ended = np.flatnonzero(episode_end)
        if ended.size:
            self._reset_envs(ended)
        reward = np.clip(raw, -1.0, 1.0) if self.clip_rewards else raw.copy()
        return StepResult(stack, last_frame, reward, raw, terminal, episode_end,
                          episode_return, episode_frames)

    def get_state(self) -> dict[str, np.ndarray]:
        """Complete state: every emulator (RAM, CPU, TIA, its RNG), stacks, counters, no-op RNG.

        Restoring it into an env built with the same arguments continues bit for bit.
        """
        state = {f"ale_{i}": np.frombuffer(ale.cloneState(include_rng=True).serialize(), np.uint8).copy()
                 for i, ale in enumerate(self._ales)}
        # the emulators' lives: _lives is only kept current where life-loss terminals need it,
        # and a resume may switch them on
        lives = np.array([ale.lives() for ale in self._ales], np.int64)
        state.update(stack=self._stack.copy(), lives=lives,
                     noop_rng=generator_state_to_array(self._noop_rng), **self._episodes.get_state())
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        import ale_py

        if np.shape(state["stack"]) != self._stack.shape:
            raise ValueError(f"state is for stack {np.shape(state['stack'])}, env has {self._stack.shape}")
        for i, ale in enumerate(self._ales):
            ale.restoreState(ale_py.ALEState(np.asarray(state[f"ale_{i}"], np.uint8).tobytes()))
        self._stack = np.array(state["stack"], np.uint8)
        self._lives[:] = state["lives"]
        self._noop_rng = generator_from_array(state["noop_rng"])
        self._episodes.set_state(state)

    def close(self) -> None:
        self._ales = []
