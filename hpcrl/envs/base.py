"""What both environment kinds share: the step result and per-episode bookkeeping."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

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


class Episodes:
    """Per-env running return and frame count; pure bookkeeping shared by both backends."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, np.float64)
        self.frames = np.zeros(num_envs, np.int64)

    def get_state(self) -> dict[str, np.ndarray]:
        return {"episode_return_so_far": self.returns.copy(), "episode_frames_so_far": self.frames.copy()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self.returns[:] = state["episode_return_so_far"]
        self.frames[:] = state["episode_frames_so_far"]


def check_actions(actions: np.ndarray, num_envs: int, num_actions: int) -> list[int]:
    actions = np.asarray(actions)
    if actions.shape != (num_envs,):
        raise ValueError(f"actions must have shape ({num_envs},), got {actions.shape}")
    acts = actions.tolist()          # bounds checked in Python: numpy reductions run cold here
    if acts and (min(acts) < 0 or max(acts) >= num_actions):
        raise ValueError(f"actions must lie in [0, {num_actions}), got {actions}")
    return acts
