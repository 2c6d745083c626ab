"""Batched environments: Atari (ale-py) and gymnasium classic control behind one interface.

Atari preprocessing is the standard DQN one (Mnih et al. 2015, "Human-level control through
deep reinforcement learning", Methods), also used by Gorila (Nair et al. 2015) and A3C
(Mnih et al. 2016):

* frame skip 4: the agent picks an action every 4th emulator frame and the action repeats;
* the observed frame is the pixel-wise max of the last two emulator frames of the skip
  (removes the flicker of sprites drawn on alternate frames);
* grayscale (ALE's luminance palette), resized to 84x84 with a box filter (`resize_84x84`);
* the agent sees a stack of the 4 newest frames (newest last); at reset the stack is zeros
  plus the first frame, so no frame of the previous episode leaks in;
* each episode starts with U{0..noop_max} no-op emulator frames (noop_max=30), the
  "no-op starts" evaluation protocol;
* episodes are cut at 108,000 emulator frames (30 minutes of play);
* for training only: rewards clipped to [-1, 1] and the loss of a life is a terminal
  transition (the game goes on; only the bootstrap is cut). Unclipped returns of whole games
  are always reported;
* optional sticky actions (repeat the previous action with probability 0.25 at every emulator
  frame, Machado et al. 2018, "Revisiting the ALE"), off by default as in the 2015/2016 papers.

Backend choice (measured on this project's 2-core machine, Pong, random actions, one core, CPU
time of the whole process; the other core was busy with other work, so +-10 %):

====================================================  =========  ==========
backend                                               1 env      8 envs
====================================================  =========  ==========
ale_py.ALEInterface driven from Python (this module)  2.75 k/s   3.0 k/s
ale_py.vector_env.AtariVectorEnv, num_threads=1       2.75 k/s   3.15 k/s
====================================================  =========  ==========

(agent steps/s; one agent step = 4 emulator frames). Emulation is about 60 % of a step
(~37-55 us per emulator frame), so the backends differ little. The direct driver is kept: it
ties with one env per actor (the Gorila and A3C layouts), runs on the calling thread (the
vector env adds a worker thread, and `num_threads=0` would start one per core), gives exact
control of the semantics above (life-loss terminals that do not reset the game, the frame
before an auto-reset, exact episode frame counts when a game ends inside a frame skip) and can
save and restore complete emulator states with their RNGs (`get_state`), which the vector env
cannot. `gymnasium.wrappers.AtariPreprocessing` needs OpenCV, which is not installed.

Importing this module does not import torch (parameter-server and replay ranks stay small).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hpcrl.games import resolve_game_id

__all__ = ["StepResult", "AtariEnv", "ClassicControlEnv", "make_env"]

FRAME_HEIGHT = 84
FRAME_WIDTH = 84


class StepResult(NamedTuple):
    """What `step` returns for a batch of N environments.

    Attributes:
        obs: [N, *obs_shape] next observation; where `episode_end`, the first observation of the
            new episode (the env was auto-reset).
        last_frame: [N, *frame_shape] newest frame of the state the action led to, taken before
            any auto-reset (what a replay memory that stores single frames stores).
        reward: [N] float32 training reward (clipped to [-1, 1] when training and clip_rewards).
        raw_reward: [N] float32 unclipped reward.
        terminal: [N] bool training terminal (no bootstrap): game over, or a lost life when
            training with terminal_on_life_loss.
        episode_end: [N] bool game over or truncated at the frame cap; the env was reset.
        episode_return: [N] float32 unclipped return of the episode that just ended (valid where
            `episode_end`, 0 elsewhere).
        episode_frames: [N] int64 emulator frames of that episode, no-op start frames included
            (valid where `episode_end`, 0 elsewhere).
    """

    obs: np.ndarray
    last_frame: np.ndarray
    reward: np.ndarray
    raw_reward: np.ndarray
    terminal: np.ndarray
    episode_end: np.ndarray
    episode_return: np.ndarray
    episode_frames: np.ndarray


def _generator_to_array(rng: np.random.Generator) -> np.ndarray:
    """PCG64 state as 6 uint64 (state hi/lo, inc hi/lo, has_uint32, uinteger), for HDF5."""
    st = rng.bit_generator.state
    mask = (1 << 64) - 1
    s, inc = st["state"]["state"], st["state"]["inc"]
    return np.array([s >> 64, s & mask, inc >> 64, inc & mask, st["has_uint32"], st["uinteger"]],
                    dtype=np.uint64)


def _generator_from_array(a: np.ndarray) -> np.random.Generator:
    v = [int(x) for x in np.asarray(a, dtype=np.uint64)]
    bg = np.random.PCG64()
    bg.state = {"bit_generator": "PCG64",
                "state": {"state": (v[0] << 64) | v[1], "inc": (v[2] << 64) | v[3]},
                "has_uint32": v[4], "uinteger": v[5]}
    return np.random.Generator(bg)


class _Episodes:
    """Per-env running return and frame count; pure bookkeeping shared by both backends."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, np.float64)
        self.frames = np.zeros(num_envs, np.int64)

    def get_state(self) -> dict[str, np.ndarray]:
        return {"episode_return_so_far": self.returns.copy(), "episode_frames_so_far": self.frames.copy()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self.returns[:] = state["episode_return_so_far"]
        self.frames[:] = state["episode_frames_so_far"]


def _check_actions(actions: np.ndarray, num_envs: int, num_actions: int) -> list[int]:
    actions = np.asarray(actions)
    if actions.shape != (num_envs,):
        raise ValueError(f"actions must have shape ({num_envs},), got {actions.shape}")
    acts = actions.tolist()          # bounds checked in Python: numpy reductions run cold here
    if acts and (min(acts) < 0 or max(acts) >= num_actions):
        raise ValueError(f"actions must lie in [0, {num_actions}), got {actions}")
    return acts


def resize_84x84(screens: np.ndarray) -> np.ndarray:
    """[n, H, W] uint8 grayscale screens -> [n, 84, 84] uint8 with PIL's BOX filter.

    BOX averages the input pixels whose centres fall inside each output pixel's footprint,
    close to OpenCV's INTER_AREA (gymnasium, Dopamine) without needing OpenCV. About 60 us per
    frame on one core. A numpy version with exact area weights was tried: as a BLAS matmul it
    was twice as fast but OpenBLAS ran it on several threads (and its idle threads spin),
    against the one-core-per-rank rule; in pure integer numpy it was slower than PIL.
    """
    from PIL import Image

    n, h, w = screens.shape
    out = np.empty((n, FRAME_HEIGHT, FRAME_WIDTH), np.uint8)
    for i in range(n):
        img = Image.frombuffer("L", (w, h), screens[i], "raw", "L", 0, 1)
        out[i] = np.asarray(img.resize((FRAME_WIDTH, FRAME_HEIGHT), Image.BOX))
    return out


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
        self._pooled = np.zeros((num_envs, h, w), np.uint8)
        self.frame_shape = (FRAME_HEIGHT, FRAME_WIDTH)
        self.obs_shape = (stack, FRAME_HEIGHT, FRAME_WIDTH)
        self._stack = np.zeros((num_envs, *self.obs_shape), np.uint8)
        self._lives = np.zeros(num_envs, np.int64)
        self._episodes = _Episodes(num_envs)

    # -- preprocessing ---------------------------------------------------------------------
    @staticmethod
    def _resize(screens: np.ndarray) -> np.ndarray:
        return resize_84x84(screens)

    def _act(self, i: int, action) -> int:
        """One agent step of env i: repeat `action` for up to frame_skip frames.

        Stops early at game over or at the frame cap. Writes the max of the last two emulator
        frames of the skip into `self._pooled[i]` (only the final frame if the skip stopped
        early or frame_skip == 1). Returns the summed raw reward.
        """
        ale, screens = self._ales[i], self._screens[i]
        skip, cap = self.frames_per_step, self.max_episode_frames
        frames = int(self._episodes.frames[i])
        reward = grabbed = 0
        for k in range(skip):
            reward += ale.act(action)
            frames += 1
            done = ale.game_over() or frames >= cap
            if k >= skip - 2 or done:
                ale.getScreenGrayscale(screens[grabbed])
                grabbed += 1
            if done:
                break
        self._episodes.frames[i] = frames
        if grabbed == 2:
            np.maximum(screens[0], screens[1], out=self._pooled[i])
        else:
            self._pooled[i] = screens[0]
        return reward

    def _reset_one(self, i: int) -> None:
        """New game in env i: reset, U{0..noop_max} no-op frames; first screen into `_pooled[i]`."""
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
        ale.getScreenGrayscale(self._pooled[i])

    def _reset_envs(self, idx: np.ndarray) -> None:
        """Reset the envs in `idx`; their stacks become zeros + the first frame."""
        for i in idx:
            self._reset_one(int(i))
        self._stack[idx] = 0
        self._stack[idx, -1] = self._resize(self._pooled[idx])

    # -- interface ---------------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        """Start a new game in every env. Returns obs [N, stack, 84, 84] uint8 (zeros + 1 frame)."""
        self._reset_envs(np.arange(self.num_envs))
        return self._stack.copy()

    def step(self, actions: np.ndarray) -> StepResult:
        """One agent step (frame_skip emulator frames) in every env; auto-resets ended games."""
        acts = _check_actions(actions, self.num_envs, self.num_actions)
        n = self.num_envs
        raw = np.zeros(n, np.float32)
        game_over = np.zeros(n, bool)
        lives = np.empty(n, np.int64)
        for i in range(n):
            raw[i] = self._act(i, self._action_set[acts[i]])
            game_over[i] = self._ales[i].game_over()
            lives[i] = self._ales[i].lives()
        last_frame = self._resize(self._pooled)
        truncated = ~game_over & (self._episodes.frames >= self.max_episode_frames)
        life_lost = lives < self._lives
        self._lives = lives
        self._episodes.returns += raw
        episode_end = game_over | truncated
        terminal = game_over | (life_lost & self.life_loss_terminal)
        episode_return = np.where(episode_end, self._episodes.returns, 0.0).astype(np.float32)
        episode_frames = np.where(episode_end, self._episodes.frames, 0)
        self._stack[:, :-1] = self._stack[:, 1:]
        self._stack[:, -1] = last_frame
        ended = np.flatnonzero(episode_end)
        if ended.size:
            self._reset_envs(ended)
        reward = np.clip(raw, -1.0, 1.0) if self.clip_rewards else raw.copy()
        return StepResult(self._stack.copy(), last_frame, reward, raw, terminal, episode_end,
                          episode_return, episode_frames)

    def get_state(self) -> dict[str, np.ndarray]:
        """Complete state: every emulator (RAM, CPU, TIA, its RNG), stacks, counters, no-op RNG.

        Restoring it into an env built with the same arguments continues bit for bit.
        """
        state = {f"ale_{i}": np.frombuffer(ale.cloneState(include_rng=True).serialize(), np.uint8).copy()
                 for i, ale in enumerate(self._ales)}
        state.update(stack=self._stack.copy(), lives=self._lives.copy(),
                     noop_rng=_generator_to_array(self._noop_rng), **self._episodes.get_state())
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        import ale_py

        if np.shape(state["stack"]) != self._stack.shape:
            raise ValueError(f"state is for stack {np.shape(state['stack'])}, env has {self._stack.shape}")
        for i, ale in enumerate(self._ales):
            ale.restoreState(ale_py.ALEState(np.asarray(state[f"ale_{i}"], np.uint8).tobytes()))
        self._stack[:] = state["stack"]
        self._lives[:] = state["lives"]
        self._noop_rng = _generator_from_array(state["noop_rng"])
        self._episodes.set_state(state)

    def close(self) -> None:
        self._ales = []


class ClassicControlEnv:
    """N gymnasium classic-control envs (CartPole-v1, Acrobot-v1) behind the Atari interface.

    No frame skip, stacking, no-ops or sticky actions: one agent step is one env step
    (`frames_per_step == 1`) and the observation is the float32 state vector. Episodes are cut
    at the task's registered limit (500 steps for both) or `max_episode_frames`, whichever is
    smaller. Rewards (+1 / -1 per step) are unchanged by clipping; there are no lives.
    """

    frames_per_step = 1

    def __init__(self, game: str, num_envs: int, seed: int, *, training: bool,
                 max_episode_frames: int = 108_000, clip_rewards: bool = True):
        import gymnasium

        self.game = game
        self.num_envs = num_envs
        self.clip_rewards = training and clip_rewards
        self._envs = [gymnasium.make(game, disable_env_checker=True).unwrapped for _ in range(num_envs)]
        limit = gymnasium.spec(game).max_episode_steps
        self.max_episode_frames = min(limit, max_episode_frames) if limit else max_episode_frames
        self._seeds = [int(s) for s in np.random.SeedSequence(seed).generate_state(num_envs) & 0x7FFFFFFF]
        self.num_actions = int(self._envs[0].action_space.n)
        self.obs_shape = self.frame_shape = tuple(self._envs[0].observation_space.shape)
        self._obs = np.zeros((num_envs, *self.obs_shape), np.float32)
        self._episodes = _Episodes(num_envs)

    def _reset_one(self, i: int) -> None:
        seed, self._seeds[i] = self._seeds[i], None  # seed the first reset only
        self._obs[i], _ = self._envs[i].reset(seed=seed)
        self._episodes.returns[i] = 0.0
        self._episodes.frames[i] = 0

    def reset(self) -> np.ndarray:
        for i in range(self.num_envs):
            self._reset_one(i)
        return self._obs.copy()

    def step(self, actions: np.ndarray) -> StepResult:
        acts = _check_actions(actions, self.num_envs, self.num_actions)
        n = self.num_envs
        raw = np.zeros(n, np.float32)
        game_over = np.zeros(n, bool)
        for i in range(n):
            self._obs[i], raw[i], game_over[i], _, _ = self._envs[i].step(acts[i])
        last_frame = self._obs.copy()
        self._episodes.frames += 1
        self._episodes.returns += raw
        episode_end = game_over | (self._episodes.frames >= self.max_episode_frames)
        episode_return = np.where(episode_end, self._episodes.returns, 0.0).astype(np.float32)
        episode_frames = np.where(episode_end, self._episodes.frames, 0)
        for i in np.flatnonzero(episode_end):
            self._reset_one(int(i))
        reward = np.clip(raw, -1.0, 1.0) if self.clip_rewards else raw.copy()
        return StepResult(self._obs.copy(), last_frame, reward, raw, game_over.copy(), episode_end,
                          episode_return, episode_frames)

    def get_state(self) -> dict[str, np.ndarray]:
        """Physics state, each env's RNG, counters and current observations."""
        state = {"obs": self._obs.copy(), **self._episodes.get_state()}
        for i, env in enumerate(self._envs):
            state[f"physics_{i}"] = np.asarray(env.state, np.float64).copy()
            state[f"rng_{i}"] = _generator_to_array(env.np_random)
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self._obs[:] = state["obs"]
        self._episodes.set_state(state)
        for i, env in enumerate(self._envs):
            env.state = np.array(state[f"physics_{i}"], np.float64)
            env.np_random = _generator_from_array(state[f"rng_{i}"])
            if hasattr(env, "steps_beyond_terminated"):
                env.steps_beyond_terminated = None
            self._seeds[i] = None

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


def make_env(game: str, num_envs: int, seed: int, *, training: bool, frame_skip: int = 4,
             stack: int = 4, noop_max: int = 30, sticky_prob: float = 0.0,
             max_episode_frames: int = 108_000, clip_rewards: bool = True,
             terminal_on_life_loss: bool = True) -> AtariEnv | ClassicControlEnv:
    """Build N environments of one game with DQN preprocessing (see the module docstring).

    Args:
        game: ale-py ROM id (``pong``, ``space_invaders``; ``Pong`` and ``ALE/Pong-v5`` work
            too) or a classic-control id (``CartPole-v1``, ``Acrobot-v1``).
        num_envs: environments stepped together (one batched forward pass per step).
        seed: seeds every emulator, the no-op starts and sticky actions; different ranks
            should pass different seeds.
        training: enables reward clipping and life-loss terminals (if their flags are set);
            evaluation envs pass False.
        frame_skip: emulator frames per agent step (Atari only).
        stack: frames per observation (Atari only).
        noop_max: most no-op frames at the start of an episode (Atari only).
        sticky_prob: probability of repeating the previous action at each emulator frame
            (Machado et al. 2018 use 0.25; Atari only).
        max_episode_frames: episode cap in emulator frames (108,000 = 30 min of play).
        clip_rewards: clip training rewards to [-1, 1] (only when training).
        terminal_on_life_loss: a lost life is a training terminal (only when training).

    Raises:
        ValueError: unknown game id (the message says how to list the valid ones).
    """
    kind, game_id = resolve_game_id(game)
    if kind == "classic":
        return ClassicControlEnv(game_id, num_envs, seed, training=training,
                                 max_episode_frames=max_episode_frames, clip_rewards=clip_rewards)
    return AtariEnv(game_id, num_envs, seed, training=training, frame_skip=frame_skip, stack=stack,
                    noop_max=noop_max, sticky_prob=sticky_prob, max_episode_frames=max_episode_frames,
                    clip_rewards=clip_rewards, terminal_on_life_loss=terminal_on_life_loss)
