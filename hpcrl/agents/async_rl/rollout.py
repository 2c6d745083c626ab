"""Rollouts of the asynchronous methods: t_max agent steps of N environments in lockstep,
time-major ([T, N, ...]), with what the learner needs to rebuild every target.

Rollouts have a fixed length of ``t_max`` steps and may run across an episode end (Mnih et al.
2016 stop a rollout at a terminal state). Returns restart at the end
(:func:`hpcrl.rl.losses.rollout_cuts`), so each step's target is the paper's; only the grouping
of steps into updates differs, which lets ``envs_per_actor`` environments step in lockstep with
one batched forward pass.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from hpcrl.envs import StepResult


class Rollout(NamedTuple):
    """t_max agent steps of N environments, time-major ([T, N, ...]).

    Attributes:
        s_tm1: [T, N, *obs] observation in which a_tm1 was taken.
        a_tm1: [T, N] int64 actions, or [T, N, D] float32 ones (continuous control).
        r_t: [T, N] float32 training rewards.
        discount_t: [T, N] float32, 0 where s_t is terminal (no bootstrap), else 1.
        end_t: [T, N] bool, the episode ended at s_t (terminal or cut by the time limit); the
            env was reset, so s_tm1[i + 1] starts a new episode.
        s_t: [T, N, *obs] the state a_tm1 led to, before any reset.
        state0: LSTM (h, c) at s_tm1[0] (None for feed-forward and value networks).
    """

    s_tm1: np.ndarray
    a_tm1: np.ndarray
    r_t: np.ndarray
    discount_t: np.ndarray
    end_t: np.ndarray
    s_t: np.ndarray
    state0: tuple[torch.Tensor, torch.Tensor] | None = None


def next_obs_before_reset(obs_tm1: np.ndarray, last_frame: np.ndarray) -> np.ndarray:
    """The observation an action led to, rebuilt where the env auto-reset.

    Vector observations (classic control) are the last frame itself; stacked frames [N, k, H, W]
    are the previous stack shifted by one with the newest frame appended (what the env's own
    stack held before the reset).
    """
    if obs_tm1.ndim == last_frame.ndim:
        return last_frame.copy()
    return np.concatenate([obs_tm1[:, 1:], last_frame[:, None]], axis=1)


def collect_rollout(env, obs: np.ndarray, policy, num_steps: int,
                    on_step: Callable[[StepResult], None] | None = None,
                    first_actions: np.ndarray | None = None,
                    step: Callable[[np.ndarray], StepResult] | None = None
                    ) -> tuple[Rollout, np.ndarray]:
    """Act ``num_steps`` agent steps in every env of ``env``.

    Args:
        env: batched env from `hpcrl.envs.make_env` (auto-resets ended episodes).
        obs: [N, *obs] current observations.
        policy: has ``state`` (LSTM state or None), ``act(obs) -> [N] actions`` (advances the
            state) and ``episode_end(end)`` (zeroes the state rows of ended episodes).
        num_steps: T.
        on_step: called with each StepResult (frame counting, episode reports).
        first_actions: actions to take at the first step instead of asking the policy (Sarsa:
            the a' chosen for the last step of the previous rollout).
        step: the call that steps ``env`` (``env.step`` unless a benchmark times it).

    Returns:
        (rollout, obs after the last step).
    """
    state0 = None if policy.state is None else tuple(x.detach().clone() for x in policy.state)
    # Per step only what must happen per step; dtype conversions wait for the stacks at the end
    # (numpy calls are slow right after a forward pass or an emulator step: their code is cold).
    step = step or env.step
    # Where the env writes its observations into a buffer of ours, they go straight into the
    # rollout's storage: states[i] is s_tm1[i] and, unless an episode ended, states[i + 1] is
    # s_t[i], so neither needs stacking (two copies of the rollout's frames saved).
    states = (np.empty((num_steps + 1, *obs.shape), obs.dtype)
              if getattr(env, "obs_into", False) else None)
    if states is not None:
        states[0] = obs
        obs = states[0]
    s_tm1, a_tm1, r_t, terminal_t, end_t, s_t = [], [], [], [], [], []
    ended = False
    for i in range(num_steps):
        actions = first_actions if (i == 0 and first_actions is not None) else policy.act(obs)
        res = step(actions) if states is None else step(actions, out=states[i + 1])
        if states is None:                  # else states[:-1] holds them already
            s_tm1.append(obs)
        a_tm1.append(actions)
        r_t.append(res.reward)
        terminal_t.append(res.terminal)
        end_t.append(res.episode_end)             # a fresh array every step (both env kinds)
        if res.episode_end.any():          # auto-reset: res.obs is the next episode's start
            s_t.append(np.where(_expand(res.episode_end, obs.ndim),
                                next_obs_before_reset(obs, res.last_frame), res.obs))
            policy.episode_end(res.episode_end)
            ended = True
        else:
            s_t.append(res.obs)
        if on_step is not None:
            on_step(res)
        obs = res.obs
    discount_t = (~np.stack(terminal_t)).astype(np.float32)
    actions = np.stack(a_tm1)                       # float [T, N, D] for continuous actions
    actions = actions if actions.dtype.kind == "f" else actions.astype(np.int64, copy=False)
    if states is not None:
        s_tm1_all, s_t_all = states[:-1], (np.stack(s_t) if ended else states[1:])
    else:
        s_tm1_all, s_t_all = np.stack(s_tm1), np.stack(s_t)
    return Rollout(s_tm1_all, actions,
                   np.stack(r_t).astype(np.float32, copy=False), discount_t,
                   np.stack(end_t).astype(bool, copy=False), s_t_all, state0), obs


def _expand(mask: np.ndarray, ndim: int) -> np.ndarray:
    return mask.reshape(mask.shape + (1,) * (ndim - 1))


def flat_batch(x: np.ndarray) -> np.ndarray:
    """[T, N, *obs] -> [T * N, *obs]."""
    return x.reshape((-1,) + x.shape[2:])
