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

import sys

import numpy as np

from hpcrl.envs.classic import ClassicControlEnv

#: MuJoCo warnings this process has already said (each is said once)
_SAID: set[str] = set()


def say_mujoco_warning_once(text: str) -> None:
    """MuJoCo's warning handler here: each distinct text once per process, to stderr.

    Without a handler MuJoCo prints a model's compiler warnings at every load (a new
    environment: every evaluation) and appends them to ``MUJOCO_LOG.TXT`` in the working
    directory; gymnasium's HalfCheetah-v5 model alone warns that ``settotalmass`` is
    deprecated, which filled a run's log."""
    text = str(text).strip()
    if text not in _SAID:
        _SAID.add(text)
        print(f"hpcrl: MuJoCo warning (said once per rank): {text}", file=sys.stderr,
              flush=True)


def _handle_mujoco_warnings() -> None:
    try:
        import mujoco
    except ImportError:                   # Pendulum-v1 and MountainCar need no MuJoCo
        return
    mujoco.set_mju_user_warning(say_mujoco_warning_once)


def check_float_actions(actions: np.ndarray, num_envs: int, action_dim: int) -> np.ndarray:
    """``[N, D]`` finite float actions, else a ValueError."""
    actions = np.asarray(actions, np.float32)
    if actions.shape != (num_envs, action_dim):
        raise ValueError(f"actions must have shape ({num_envs}, {action_dim}), got {actions.shape}")
    if not np.isfinite(actions).all():
        raise ValueError(f"actions must be finite, got {actions}")
    return actions


class ContinuousControlEnv(ClassicControlEnv):
    """N gymnasium tasks with a Box action space, stepped in lockstep (see the module
    docstring): the classic-control driver with float actions, clipped to the bounds, and
    MuJoCo's simulator state in checkpoints. ``num_actions`` is the action dimension D;
    ``continuous`` is True."""

    continuous = True

    def __init__(self, game: str, num_envs: int, seed: int, *, training: bool,
                 max_episode_frames: int = 108_000, clip_rewards: bool = False):
        import gymnasium

        _handle_mujoco_warnings()
        try:
            super().__init__(game, num_envs, seed, training=training,
                             max_episode_frames=max_episode_frames, clip_rewards=clip_rewards)
        except gymnasium.error.DependencyNotInstalled as exc:
            raise ImportError(f"{game} needs MuJoCo: pip install -e '.[mujoco]' ({exc})") from None

    def _action_count(self, space) -> int:
        self.action_low = np.asarray(space.low, np.float32).reshape(-1)
        self.action_high = np.asarray(space.high, np.float32).reshape(-1)
        self.action_dim = int(np.prod(space.shape))
        return self.action_dim

    def _checked_actions(self, actions: np.ndarray) -> np.ndarray:
        return np.clip(check_float_actions(actions, self.num_envs, self.action_dim),
                       self.action_low, self.action_high)

    @property
    def action_ids(self) -> list[int]:
        return list(range(self.action_dim))

    def render_rgb(self, i: int = 0) -> np.ndarray:
        """[H, W, 3] uint8 picture of env ``i`` (MuJoCo's off-screen renderer)."""
        env = self._envs[i]
        env.render_mode = "rgb_array"
        picture = env.render()
        if picture is None:
            raise RuntimeError("render_rgb before reset: the environment has no state yet")
        return np.asarray(picture, np.uint8)

    def _physics(self, env) -> np.ndarray:
        if not hasattr(env, "data"):                   # Pendulum, MountainCarContinuous
            return super()._physics(env)
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        out = np.empty(mujoco.mj_stateSize(env.model, spec), np.float64)
        mujoco.mj_getState(env.model, env.data, out, spec)
        return out

    def _set_physics(self, env, physics: np.ndarray) -> None:
        if not hasattr(env, "data"):
            return super()._set_physics(env, physics)
        import mujoco

        mujoco.mj_setState(env.model, env.data, np.asarray(physics, np.float64),
                           mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(env.model, env.data)
