"""Continuous-action tasks (gymnasium's MuJoCo tasks, Pendulum) behind the Atari interface.

The asynchronous-methods paper runs A3C with a Gaussian policy on MuJoCo tasks from physical
state (Mnih et al. 2016, §5.3 and supplementary §9). Here one agent step is one step of the
gymnasium task (``frames_per_step == 1``: "frames" count agent steps), the observation is the
float32 state vector and an action is a float32 vector of ``action_dim`` values, clipped to
the task's bounds before the step (the policy's draw itself is what the loss sees). Episodes
end when the task terminates (a terminal: no bootstrap) or at its registered step limit or
``max_episode_frames``, whichever is smaller (a truncation: bootstrapped). Rewards are
clipped to [-1, 1] only when training with ``clip_rewards`` (the continuous configs switch it
off: a task's reward scale is its signal).

Checkpoints keep each simulator's full integration state (MuJoCo's ``mjSTATE_INTEGRATION``:
time, positions, velocities, actuator activations, warm start, ...) or, for the classic tasks,
their ``state`` vector, and each task's RNG, so a resume continues every episode exactly.
"""

from __future__ import annotations

import numpy as np

from hpcrl.envs.base import Episodes, StepResult
from hpcrl.io.rngstate import generator_from_array, generator_state_to_array


def check_float_actions(actions: np.ndarray, num_envs: int, action_dim: int) -> np.ndarray:
    """``[N, D]`` finite float actions, else a ValueError."""
    actions = np.asarray(actions, np.float32)
    if actions.shape != (num_envs, action_dim):
        raise ValueError(f"actions must have shape ({num_envs}, {action_dim}), got {actions.shape}")
    if not np.isfinite(actions).all():
        raise ValueError(f"actions must be finite, got {actions}")
    return actions


class ContinuousControlEnv:
    """N gymnasium tasks with a Box action space, stepped in lockstep (see the module
    docstring). ``num_actions`` is the action dimension D; ``continuous`` is True."""

    frames_per_step = 1
    continuous = True

    def __init__(self, game: str, num_envs: int, seed: int, *, training: bool,
                 max_episode_frames: int = 108_000, clip_rewards: bool = False):
        import gymnasium

        self.game, self.num_envs = game, num_envs
        self.clip_rewards = training and clip_rewards
        try:
            self._envs = [gymnasium.make(game, disable_env_checker=True).unwrapped
                          for _ in range(num_envs)]
        except gymnasium.error.DependencyNotInstalled as exc:
            raise ImportError(f"{game} needs MuJoCo: pip install -e '.[mujoco]' ({exc})") from None
        limit = gymnasium.spec(game).max_episode_steps
        self.max_episode_frames = min(limit, max_episode_frames) if limit else max_episode_frames
        self._seeds = [int(s) for s in
                       np.random.SeedSequence(seed).generate_state(num_envs) & 0x7FFFFFFF]
        space = self._envs[0].action_space
        self.num_actions = self.action_dim = int(np.prod(space.shape))
        self.action_low = np.asarray(space.low, np.float32).reshape(-1)
        self.action_high = np.asarray(space.high, np.float32).reshape(-1)
        self.obs_shape = self.frame_shape = (int(np.prod(self._envs[0].observation_space.shape)),)
        self._obs = np.zeros((num_envs, *self.obs_shape), np.float32)
        self._episodes = Episodes(num_envs)

    def _reset_one(self, i: int) -> None:
        seed, self._seeds[i] = self._seeds[i], None  # seed the first reset only
        obs, _ = self._envs[i].reset(seed=seed)
        self._obs[i] = np.asarray(obs, np.float32).reshape(-1)
        self._episodes.returns[i] = 0.0
        self._episodes.frames[i] = 0

    def reset(self) -> np.ndarray:
        for i in range(self.num_envs):
            self._reset_one(i)
        return self._obs.copy()

    def step(self, actions: np.ndarray) -> StepResult:
        acts = np.clip(check_float_actions(actions, self.num_envs, self.action_dim),
                       self.action_low, self.action_high)
        n = self.num_envs
        raw = np.zeros(n, np.float32)
        terminal = np.zeros(n, bool)
        for i in range(n):
            obs, raw[i], terminal[i], _, _ = self._envs[i].step(acts[i])
            self._obs[i] = np.asarray(obs, np.float32).reshape(-1)
        last_frame = self._obs.copy()
        self._episodes.frames += 1
        self._episodes.returns += raw
        episode_end = terminal | (self._episodes.frames >= self.max_episode_frames)
        episode_return = np.where(episode_end, self._episodes.returns, 0.0).astype(np.float32)
        episode_frames = np.where(episode_end, self._episodes.frames, 0)
        for i in np.flatnonzero(episode_end):
            self._reset_one(int(i))
        reward = np.clip(raw, -1.0, 1.0) if self.clip_rewards else raw.copy()
        return StepResult(self._obs.copy(), last_frame, reward, raw, terminal, episode_end,
                          episode_return, episode_frames)

    @property
    def action_ids(self) -> list[int]:
        return list(range(self.action_dim))

    @property
    def render_fps(self) -> float:
        return float(self._envs[0].metadata.get("render_fps", 50))

    def render_rgb(self, i: int = 0) -> np.ndarray:
        """[H, W, 3] uint8 picture of env ``i`` (MuJoCo's off-screen renderer)."""
        env = self._envs[i]
        env.render_mode = "rgb_array"
        picture = env.render()
        if picture is None:
            raise RuntimeError("render_rgb before reset: the environment has no state yet")
        return np.asarray(picture, np.uint8)

    def _physics(self, env) -> np.ndarray:
        if hasattr(env, "data"):                       # MuJoCo
            import mujoco

            spec = mujoco.mjtState.mjSTATE_INTEGRATION
            out = np.empty(mujoco.mj_stateSize(env.model, spec), np.float64)
            mujoco.mj_getState(env.model, env.data, out, spec)
            return out
        return np.asarray(env.state, np.float64).copy()

    def _set_physics(self, env, physics: np.ndarray) -> None:
        if hasattr(env, "data"):
            import mujoco

            mujoco.mj_setState(env.model, env.data, np.asarray(physics, np.float64),
                               mujoco.mjtState.mjSTATE_INTEGRATION)
            mujoco.mj_forward(env.model, env.data)
        else:
            env.state = np.array(physics, np.float64)

    def get_state(self) -> dict[str, np.ndarray]:
        """Simulator state, each env's RNG, counters and current observations."""
        state = {"obs": self._obs.copy(), **self._episodes.get_state()}
        for i, env in enumerate(self._envs):
            state[f"physics_{i}"] = self._physics(env)
            state[f"rng_{i}"] = generator_state_to_array(env.np_random)
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self._obs[:] = state["obs"]
        self._episodes.set_state(state)
        for i, env in enumerate(self._envs):
            self._set_physics(env, state[f"physics_{i}"])
            env.np_random = generator_from_array(state[f"rng_{i}"])
            self._seeds[i] = None

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []
