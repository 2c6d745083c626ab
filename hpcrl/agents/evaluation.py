"""The evaluation protocol of both families (Mnih et al. 2015, Methods; Nair et al. 2015).

``eval_episodes`` episodes with no reward clipping, no life-loss terminals, no-op starts and
the episode cap. Q-networks act epsilon-greedily at ``eval_epsilon`` (0.05): the value
methods' training episodes mix in exploration (up to epsilon 0.5 for the asynchronous ones),
so they do not show what was learned. A3C samples from its softmax policy, the LSTM state
reset per episode; on continuous actions it acts with the Gaussian policy's mean.

Two kinds of evaluation, both played by the *evaluating ranks* (evaluator ranks where the
layout has them, else every acting rank: :attr:`hpcrl.runtime.topology.Layout.evaluating_ranks`):

* periodic: each evaluating rank every ``eval_every_frames`` of its own frames, the ranks
  staggered (:func:`first_evaluation`), so the job evaluates about once per
  ``eval_every_frames`` global frames instead of all ranks at once;
* final: once the frame budget is spent (or ``early_stop`` ends the run), the final weights
  over ``final_eval_episodes`` episodes (30 in Mnih et al. 2015 and 2016), shared out among
  the evaluating ranks (:func:`hpcrl.runtime.topology.even_share`) and recorded in ``metrics.h5``'s ``final`` group.

A rank plays its episodes on up to ``envs_per_actor`` environments with one batched forward.
Each environment plays a fixed quota of episodes (:func:`episode_quotas`): taking the first N
episodes to finish from a batch would favour short episodes.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from hpcrl.config import Config
from hpcrl.core import Policy
from hpcrl.envs import make_env_from_config
from hpcrl.games import continuous_id
from hpcrl.rl.acting import ActorCriticPolicy, FixedEpsilonPolicy, GaussianPolicy
from hpcrl.runtime import watchdog
from hpcrl.runtime.topology import even_share


def first_evaluation(every_frames: int, index: int, count: int) -> int:
    """Own frames at which evaluating rank ``index`` of ``count`` evaluates first (then every
    ``every_frames``): rank k at ``every * (k + 1) / count``, so that ``count`` ranks running
    at one speed take turns about every ``every_frames / count`` of their own frames, i.e.
    about every ``every_frames`` frames of the job."""
    return max(every_frames * (index + 1) // count, 1)


def episode_quotas(episodes: int, num_envs: int) -> np.ndarray:
    """Episodes each of ``num_envs`` environments plays so that together they play
    ``episodes``: as even as possible, the first environments one more."""
    return np.array([even_share(episodes, i, num_envs) for i in range(num_envs)], np.int64)


def evaluation_policy(net: torch.nn.Module, cfg: Config, num_envs: int,
                      rng: np.random.Generator) -> Policy:
    """A3C samples from its softmax policy and acts with the mean of a Gaussian one (the
    paper's continuous-control evaluation); Q-networks act epsilon-greedily."""
    if cfg.algo == "a3c":
        if continuous_id(cfg.game) is not None:
            return GaussianPolicy(net, num_envs, rng, use_mean=True)
        return ActorCriticPolicy(net, num_envs, rng)
    return FixedEpsilonPolicy(net, cfg.eval_epsilon, rng)


class EvaluationInterrupted(Exception):
    """A periodic evaluation given up because a coordinated checkpoint is due: every other
    rank would wait for it (minutes for Atari episodes), so the rank joins the checkpoint at
    once and evaluates again after it, from the same seed."""


#: Evaluation steps between two looks at the checkpoint request (one atomic read each).
INTERRUPT_CHECK_STEPS = 16


def interrupt_at_checkpoint(due: Callable[[], bool]) -> Callable[[], None]:
    """An ``on_step`` for :func:`evaluate` that raises :class:`EvaluationInterrupted` once
    ``due()`` (the coordinator's poll) says a checkpoint is due, looking every
    ``INTERRUPT_CHECK_STEPS`` batched steps."""
    steps = 0

    def on_step() -> None:
        nonlocal steps
        steps += 1
        if steps % INTERRUPT_CHECK_STEPS == 0 and due():
            raise EvaluationInterrupted

    return on_step


def evaluate(net: torch.nn.Module, cfg: Config, seed: int, rng: np.random.Generator,
             episodes: int | None = None, on_step: Callable[[], None] | None = None
             ) -> list[tuple[float, int]]:
    """Play ``episodes`` (default ``cfg.eval_episodes``) evaluation episodes with ``net``'s
    current parameters, on ``min(envs_per_actor, episodes)`` environments stepped together.

    Args:
        on_step: called after every batched step (besides the watchdog's beat), e.g. to
            tell rank 0 that a long final evaluation is alive.

    Returns:
        (return, length in frames) of each episode, in the order they ended.
    """
    episodes = cfg.eval_episodes if episodes is None else episodes
    if episodes <= 0:
        return []
    num_envs = min(cfg.envs_per_actor, episodes)
    quotas = episode_quotas(episodes, num_envs)
    policy = evaluation_policy(net, cfg, num_envs, rng)
    env = make_env_from_config(cfg, num_envs, seed, training=False)
    obs, results = env.reset(), []
    try:
        while np.any(quotas > 0):
            watchdog.beat()
            res = env.step(policy.act(obs))
            policy.episode_end(res.episode_end)
            for i in np.flatnonzero(res.episode_end & (quotas > 0)):
                quotas[i] -= 1
                results.append((float(res.episode_return[i]), int(res.episode_frames[i])))
            obs = res.obs
            if on_step is not None:
                on_step()
    finally:
        env.close()
    return results


def final_evaluation(net: torch.nn.Module, cfg: Config, episodes: int, seed: int,
                     on_step: Callable[[], None] | None = None) -> list[tuple[float, int]]:
    """The final evaluation's share of one rank: ``episodes`` episodes with ``net`` (holding
    the final parameters), its own RNG seeded from ``seed`` so that it draws nothing from
    the training streams."""
    return evaluate(net, cfg, seed, np.random.default_rng(seed), episodes, on_step)
