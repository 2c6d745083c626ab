"""A3C with a Gaussian policy for continuous actions (Mnih et al. 2016, §5.3 and
supplementary §9), as pure functions: the policy's log-density, its differential entropy, the
loss, and how an action is drawn.

The paper's continuous-control networks output a mean vector mu (a linear layer) and a
variance sigma^2 (a SoftPlus layer); actions are drawn from N(mu, sigma^2) independently per
dimension, the entropy regulariser is the Gaussian's differential entropy
H = 1/2 (log(2 pi sigma^2) + 1) per dimension, weighted by a small cost (1e-4 in the paper),
and the rest of the loss is A3C's (:func:`hpcrl.rl.losses.a3c_loss`). Evaluation acts with the
mean.

A network's policy output is one tensor ``[..., 2 D]``: the D means, then the D variances
(:func:`split_policy`), so continuous and discrete actor-critics share the call signature
``policy_out, value, state = net(obs, state)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

LOG_2PI = math.log(2.0 * math.pi)


def split_policy(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., 2 D]`` policy output -> mean ``[..., D]``, variance ``[..., D]``."""
    d = out.shape[-1] // 2
    return out[..., :d], out[..., d:]


def gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor, var: torch.Tensor
                      ) -> torch.Tensor:
    """log N(a; mu, diag(var)), summed over the last (action) dimension:
    -1/2 sum_d [(a_d - mu_d)^2 / var_d + log(2 pi var_d)]."""
    return -0.5 * ((actions - mean) ** 2 / var + torch.log(var) + LOG_2PI).sum(-1)


def gaussian_entropy(var: torch.Tensor) -> torch.Tensor:
    """Differential entropy of N(mu, diag(var)), summed over the action dimension:
    sum_d 1/2 (log(2 pi var_d) + 1) (the paper's entropy term, §9)."""
    return 0.5 * (torch.log(var) + LOG_2PI + 1.0).sum(-1)


def a3c_gaussian_loss(policy_out: torch.Tensor, values: torch.Tensor, actions: torch.Tensor,
                      returns: torch.Tensor, entropy_beta: float = 1e-4,
                      value_coef: float = 0.5) -> dict[str, torch.Tensor]:
    """A3C's loss with a Gaussian policy, summed over the steps (as
    :func:`hpcrl.rl.losses.a3c_loss` for softmax policies):

        policy  = -log N(a_i; mu_i, sigma_i^2) * A_i,  A_i = R_i - V(s_i) detached
        value   = (R_i - V(s_i))^2
        entropy = sum_d 1/2 (log(2 pi sigma_{i,d}^2) + 1)
        total   = policy + value_coef * value - entropy_beta * entropy

    Args:
        policy_out: [T, 2 D] or [T, N, 2 D]: means, then variances (> 0).
        values: [T] or [T, N] V(s_i).
        actions: [T, D] or [T, N, D] the actions taken (as drawn, before the env clipped them).
        returns: [T] or [T, N] n-step returns R_i (targets; detached here).
        entropy_beta: entropy cost (1e-4 in the paper's continuous experiments).
        value_coef: weight of the squared value error.

    Returns:
        dict with scalar tensors "total", "policy", "value", "entropy".
    """
    mean, var = split_policy(policy_out)
    assert mean.shape == actions.shape and values.shape == returns.shape == mean.shape[:-1], (
        policy_out.shape, actions.shape, values.shape, returns.shape)
    log_prob = gaussian_log_prob(actions, mean, var)
    advantages = (returns.detach() - values).detach()
    policy = torch.sum(-log_prob * advantages)
    value = torch.sum((returns.detach() - values) ** 2)
    entropy = torch.sum(gaussian_entropy(var))
    total = policy + value_coef * value - entropy_beta * entropy
    return {"total": total, "policy": policy, "value": value, "entropy": entropy}


def sample_gaussian(policy_out: np.ndarray, normals: np.ndarray) -> np.ndarray:
    """Actions mu + sigma * z from the policy output ``[N, 2 D]`` and standard normal draws
    ``[N, D]`` (float32; unclipped: the env clips to its bounds, the loss sees what was
    drawn)."""
    d = policy_out.shape[-1] // 2
    return (policy_out[:, :d] + np.sqrt(policy_out[:, d:]) * normals).astype(np.float32)


def mean_action(policy_out: np.ndarray) -> np.ndarray:
    """The evaluation action: the mean ``[N, D]`` of the policy output ``[N, 2 D]``."""
    return np.ascontiguousarray(policy_out[:, :policy_out.shape[-1] // 2], np.float32)
