"""gymnasium's classic-control tasks behind the Atari interface (fast learning checks)."""

from __future__ import annotations

import os

import numpy as np

from hpcrl.envs.base import Episodes, StepResult, check_actions
from hpcrl.io.rngstate import generator_from_array, generator_state_to_array


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
        self.num_actions = self._action_count(self._envs[0].action_space)
        self.obs_shape = self.frame_shape = tuple(self._envs[0].observation_space.shape)
        self._obs = np.zeros((num_envs, *self.obs_shape), np.float32)
        self._episodes = Episodes(num_envs)

    def _action_count(self, space) -> int:
        return int(space.n)

    def _reset_one(self, i: int) -> None:
        seed, self._seeds[i] = self._seeds[i], None  # seed the first reset only
        self._obs[i], _ = self._envs[i].reset(seed=seed)
        self._episodes.returns[i] = 0.0
        self._episodes.frames[i] = 0

    def reset(self) -> np.ndarray:
        for i in range(self.num_envs):
            self._reset_one(i)
        return self._obs.copy()

    def _checked_actions(self, actions: np.ndarray):
        return check_actions(actions, self.num_envs, self.num_actions)

    def step(self, actions: np.ndarray) -> StepResult:
        acts = self._checked_actions(actions)
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

    @property
    def action_ids(self) -> list[int]:
        return list(range(self.num_actions))

    @property
    def render_fps(self) -> float:
        return float(self._envs[0].metadata.get("render_fps", 50))

    def render_rgb(self, i: int = 0) -> np.ndarray:
        """[H, W, 3] uint8 picture of env ``i`` (gymnasium's renderer, which needs pygame)."""
        import gymnasium

        # an off-screen picture needs no display: SDL's dummy driver, and no pygame banner
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        env = self._envs[i]
        env.render_mode = "rgb_array"
        try:
            picture = env.render()
        except gymnasium.error.DependencyNotInstalled:
            raise ImportError(f"rendering {self.game} needs pygame") from None
        if picture is None:
            raise RuntimeError("render_rgb before reset: the environment has no state yet")
        return np.asarray(picture, np.uint8)

    def get_state(self) -> dict[str, np.ndarray]:
        """Physics state, each env's RNG, counters and current observations."""
        state = {"obs": self._obs.copy(), **self._episodes.get_state()}
        for i, env in enumerate(self._envs):
            state[f"physics_{i}"] = self._physics(env)
            state[f"rng_{i}"] = generator_state_to_array(env.np_random)
        return state

    def _physics(self, env) -> np.ndarray:
        return np.asarray(env.state, np.float64).copy()

    def _set_physics(self, env, physics: np.ndarray) -> None:
        env.state = np.array(physics, np.float64)

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self._obs[:] = state["obs"]
        self._episodes.set_state(state)
        for i, env in enumerate(self._envs):
            self._set_physics(env, state[f"physics_{i}"])
            env.np_random = generator_from_array(state[f"rng_{i}"])
            if hasattr(env, "steps_beyond_terminated"):
                env.steps_beyond_terminated = None
            self._seeds[i] = None

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []
