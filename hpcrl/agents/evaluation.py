"""The evaluation protocol of both families (Mnih et al. 2015, Methods; Nair et al. 2015).

``eval_episodes`` episodes with no reward clipping, no life-loss terminals, no-op starts and
the episode cap. Q-networks act epsilon-greedily at ``eval_epsilon`` (0.05): the value
methods' training episodes mix in exploration (up to epsilon 0.5 for the asynchronous ones),
so they do not show what was learned. A3C samples from its policy, the LSTM state reset per
episode.
"""

from __future__ import annotations

import numpy as np
import torch

from hpcrl.config import Config
from hpcrl.core import Policy
from hpcrl.envs import make_env_from_config
from hpcrl.rl.acting import ActorCriticPolicy, FixedEpsilonPolicy
from hpcrl.runtime import watchdog


def evaluation_policy(net: torch.nn.Module, cfg: Config, rng: np.random.Generator) -> Policy:
    if cfg.algo == "a3c":
        return ActorCriticPolicy(net, 1, rng)
    return FixedEpsilonPolicy(net, cfg.eval_epsilon, rng)


def evaluate(net: torch.nn.Module, cfg: Config, seed: int,
             rng: np.random.Generator) -> list[tuple[float, int]]:
    """Play the evaluation episodes with ``net``'s current parameters.

    Returns:
        (return, length in frames) of each episode.
    """
    policy = evaluation_policy(net, cfg, rng)
    env = make_env_from_config(cfg, 1, seed, training=False)
    obs, results = env.reset(), []
    while len(results) < cfg.eval_episodes:
        watchdog.beat()
        res = env.step(policy.act(obs))
        policy.episode_end(res.episode_end)
        if res.episode_end[0]:
            results.append((float(res.episode_return[0]), int(res.episode_frames[0])))
        obs = res.obs
    env.close()
    return results
