"""TD errors, returns and losses of DQN/Gorila and the asynchronous methods, as pure functions.

Sources: Mnih et al. 2015 ("Human-level control through deep RL", Nature DQN: target network,
error clipping), Nair et al. 2015 (Gorila: the same DQN loss per learner) and Mnih et al. 2016
("Asynchronous Methods for Deep RL": one-step Q / Sarsa, n-step returns, A3C).

This module is the one home of every target and return in the package: the learners of both
families call these functions, so the tests that check them against hand-worked numbers and
slow reference loops check the code that trains. No modules, optimisers or MPI (dqn_zoo, acme
`losses.py`): the caller runs the networks and calls `.backward()`.

* Targets and returns are numpy (they are computed from target-network outputs that need no
  gradient, over [T, N] rollouts or [B] minibatches).
* TD errors and losses are torch; targets are detached inside, so a caller cannot leak
  gradients into the target network by accident.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def huber(x: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """Elementwise Huber loss: 0.5 x^2 for |x| <= delta, delta (|x| - 0.5 delta) beyond.

    Its derivative is x clipped to [-delta, delta], which is the Nature DQN error clipping.
    """
    abs_x = x.abs()
    quadratic = torch.clamp(abs_x, max=delta)
    return 0.5 * quadratic ** 2 + delta * (abs_x - quadratic)


def td_error(q_tm1: torch.Tensor, a_tm1: torch.Tensor, target: torch.Tensor | np.ndarray
             ) -> torch.Tensor:
    """target - q_tm1[a_tm1], differentiable through q_tm1 only (the target is detached).

    Args:
        q_tm1: [B, A] Q(s_tm1, .; theta) of the online network.
        a_tm1: [B] integer actions taken in s_tm1.
        target: [B] the targets y (from `one_step_targets`, `n_step_q_targets`, ...).
    """
    target = torch.as_tensor(target, dtype=q_tm1.dtype)
    assert target.shape == a_tm1.shape == q_tm1.shape[:1], (target.shape, a_tm1.shape, q_tm1.shape)
    return target.detach() - _select(q_tm1, a_tm1)


def q_learning_td(q_tm1: torch.Tensor, a_tm1: torch.Tensor, r_t: torch.Tensor,
                  discount_t: torch.Tensor, q_t: torch.Tensor, gamma: float) -> torch.Tensor:
    """One-step Q-learning TD error (Mnih et al. 2015, eq. 2; Mnih et al. 2016, Algorithm 1).

        td = r_t + gamma * discount_t * max_a q_t[a] - q_tm1[a_tm1]

    The target is `one_step_targets`'s, the TD `td_error`'s: the Gorila learner and the
    asynchronous one-step methods run the same two functions.

    Args:
        q_tm1: [B, A] Q(s_tm1, .; theta) of the online network.
        a_tm1: [B] integer actions taken in s_tm1.
        r_t: [B] rewards.
        discount_t: [B] 0 where s_t is terminal, else 1.
        q_t: [B, A] Q(s_t, .; theta^-) of the target network (detached here).
        gamma: discount factor.

    Returns:
        td: [B], differentiable through q_tm1 only.
    """
    _check_batch(q_tm1, a_tm1, r_t, discount_t, q_t)
    y = one_step_targets(_numpy(r_t), _numpy(discount_t), _numpy(q_t), gamma)
    return td_error(q_tm1, a_tm1, y)


def dqn_loss(td: torch.Tensor, kind: str = "huber", reduction: str = "mean") -> torch.Tensor:
    """DQN loss over the batch (mean, or sum with ``reduction="sum"``), with the TD error's gradient clipped to [-1, 1].

    Nature DQN (Mnih et al. 2015, Methods, "we also found it helpful to clip the error term
    from the update to be between -1 and 1") clips the derivative of the squared error, i.e. the
    TD error itself, in the gradient. Both kinds give that same gradient; they differ in the
    value they report:

    - "huber": mean Huber loss (delta 1), whose derivative is clip(td, -1, 1).
    - "clip": mean 0.5 td^2, the unclipped squared TD error the paper writes down, with the
      gradient replaced by clip(td, -1, 1) (straight-through). Its value is the quantity the
      Gorila loss-outlier filter and logs may want to see without the Huber flattening.

    Args:
        td: [B] TD errors (differentiable).
        kind: "huber" or "clip".
        reduction: "mean" (DQN, Gorila: a minibatch) or "sum" (the asynchronous methods
            accumulate the gradients of a rollout's transitions).

    Returns:
        Scalar loss.
    """
    assert td.dim() == 1, td.shape
    reduce = {"mean": torch.mean, "sum": torch.sum}[reduction]
    if kind == "huber":
        return reduce(huber(td))
    if kind == "clip":
        squared = 0.5 * td.detach() ** 2
        clipped = td.detach().clamp(-1.0, 1.0)
        return reduce(squared + clipped * (td - td.detach()))
    raise ValueError(f"unknown dqn loss kind {kind!r}; want 'huber' or 'clip'")


# ------------------------------------------------------------------ targets and returns (numpy)
def rollout_cuts(end_t: np.ndarray) -> np.ndarray:
    """Where the n-step return restarts: at episode ends and at the rollout's last step.

    Args:
        end_t: [T, N] bool.

    Returns:
        [T, N] bool, True where step i's return bootstraps from s_t[i] instead of R_{i+1}.
    """
    cut_t = np.array(end_t, bool, copy=True)
    cut_t[-1] = True
    return cut_t


def bootstrap_returns(r_t: np.ndarray, discount_t: np.ndarray, cut_t: np.ndarray,
                      bootstrap_t: np.ndarray, gamma: float) -> np.ndarray:
    """n-step returns of a rollout, forward view (Algorithms S2/S3), with cuts inside it.

        R_i = r_i + gamma * discount_i * (bootstrap_i   if cut_i
                                          R_{i+1}       otherwise)

    so step i gets the longest return that stays in its episode and in the rollout; the last
    step, and a step that ends an episode, bootstrap from the value of their own s_t (terminal
    steps have discount 0, so their bootstrap is never used).

    Args:
        r_t, discount_t: [T, N].
        cut_t: [T, N] bool, True at least on the last step (see `rollout_cuts`).
        bootstrap_t: [T, N] value of s_t[i] (max_a Q(., a; theta-) or V(.; theta)); read only
            where cut_t.
        gamma: discount factor.

    Returns:
        [T, N] float32 returns.
    """
    assert r_t.shape == discount_t.shape == cut_t.shape == bootstrap_t.shape, (
        r_t.shape, discount_t.shape, cut_t.shape, bootstrap_t.shape)
    assert np.all(cut_t[-1]), "the last step of a rollout must bootstrap"
    returns = np.empty(r_t.shape, np.float32)
    ret = np.zeros(r_t.shape[1:], np.float64)
    for i in range(r_t.shape[0] - 1, -1, -1):
        ret = r_t[i] + gamma * discount_t[i] * np.where(cut_t[i], bootstrap_t[i], ret)
        returns[i] = ret
    return returns


def one_step_targets(r_t: np.ndarray, discount_t: np.ndarray, q_t: np.ndarray, gamma: float,
                     a_t: np.ndarray | None = None) -> np.ndarray:
    """One-step Q-learning (Algorithm 1) or, given a_t, Sarsa targets (§4), elementwise.

        Q-learning: y = r_t + gamma * discount_t * max_a q_t[a]
        Sarsa:      y = r_t + gamma * discount_t * q_t[a_t]

    Args:
        r_t, discount_t: [T, N].
        q_t: [T, N, A] Q(s_t, .; theta-).
        a_t: [T, N] action taken in s_t (Sarsa), or None (Q-learning).

    Returns:
        [T, N] float32 targets.
    """
    if a_t is None:
        v_t = q_t.max(axis=-1)
    else:
        v_t = np.take_along_axis(q_t, a_t[..., None].astype(np.int64), axis=-1)[..., 0]
    return (r_t + gamma * discount_t * v_t).astype(np.float32)


def sarsa_next_actions(a_tm1: np.ndarray, a_next: np.ndarray, end_t: np.ndarray,
                       q_t: np.ndarray) -> np.ndarray:
    """a_t, the action taken in s_t, for every step of a rollout.

    a_t[i] = a_tm1[i + 1] inside the rollout, ``a_next`` (the action chosen for the next
    rollout's first step) for the last step, and argmax q_t[i] where the episode ended at s_t:
    the next action was taken in a new episode, and at a terminal the value is unused anyway.

    Args:
        a_tm1: [T, N]; a_next: [N]; end_t: [T, N] bool; q_t: [T, N, A].

    Returns:
        [T, N] int64.
    """
    a_t = np.concatenate([a_tm1[1:], np.asarray(a_next, np.int64)[None]], axis=0)
    return np.where(end_t, q_t.argmax(axis=-1), a_t).astype(np.int64)


def n_step_q_targets(r_t: np.ndarray, discount_t: np.ndarray, end_t: np.ndarray,
                     q_t: np.ndarray, gamma: float) -> np.ndarray:
    """n-step Q-learning targets (Algorithm S2): returns bootstrapped with max_a Q(s_t, a; theta-).

    Args:
        r_t, discount_t, end_t: [T, N]; q_t: [T, N, A] Q(s_t, .; theta-).

    Returns:
        [T, N] float32.
    """
    return bootstrap_returns(r_t, discount_t, rollout_cuts(end_t), q_t.max(axis=-1), gamma)


def value_targets(algo: str, r_t: np.ndarray, discount_t: np.ndarray, end_t: np.ndarray,
                  a_tm1: np.ndarray, q_t: np.ndarray, gamma: float,
                  a_next: np.ndarray | None = None) -> np.ndarray:
    """The target of each transition of a rollout ([T, N] arrays, q_t [T, N, A]) for one of
    the asynchronous value-based methods (Mnih et al. 2016): one_step_q (Algorithm 1),
    one_step_sarsa (§4; ``a_next`` is the action chosen for the next rollout's first step)
    or n_step_q (Algorithm S2)."""
    if algo == "one_step_q":
        return one_step_targets(r_t, discount_t, q_t, gamma)
    if algo == "one_step_sarsa":
        a_t = sarsa_next_actions(a_tm1, a_next, end_t, q_t)
        return one_step_targets(r_t, discount_t, q_t, gamma, a_t)
    if algo == "n_step_q":
        return n_step_q_targets(r_t, discount_t, end_t, q_t, gamma)
    raise ValueError(f"not a value-based async method: {algo!r}")


# ------------------------------------------------------------------ A3C
def a3c_loss(logits: torch.Tensor, values: torch.Tensor, actions: torch.Tensor,
             returns: torch.Tensor, entropy_beta: float = 0.01, value_coef: float = 0.5,
             reduction: str = "sum") -> dict[str, torch.Tensor]:
    """Advantage actor-critic loss (Mnih et al. 2016, §4 and Algorithm S3).

    Algorithm S3 accumulates, over the rollout's steps i,
        d theta   += grad log pi(a_i | s_i) (R_i - V(s_i)) + beta grad H(pi(s_i))   (ascent)
        d theta_v += d (R_i - V(s_i))^2 / d theta_v                                   (descent)
    As one loss to minimise (shared trunk, as in the paper's Atari networks):
        policy  = -log pi(a_i | s_i) * A_i,  A_i = R_i - V(s_i) detached (no gradient from the
                  policy term into the critic)
        value   = (R_i - V(s_i))^2
        entropy = H(pi(s_i)) = -sum_a pi log pi
        total   = policy + value_coef * value - entropy_beta * entropy

    Args:
        logits: [T, A] (or [T, B, A]) policy logits.
        values: [T] (or [T, B]) V(s_i).
        actions: [T] (or [T, B]) integer actions taken.
        returns: [T] (or [T, B]) n-step returns R_i (targets; detached here).
        entropy_beta: entropy regularisation weight (0.01 in the paper).
        value_coef: weight of the squared value error (0.5 makes its gradient -(R - V) grad V).
        reduction: "sum" over steps (default: the paper accumulates gradients over the rollout,
            and its learning rates were tuned that way) or "mean".

    Returns:
        dict with scalar tensors "total", "policy", "value", "entropy".
    """
    assert logits.shape[:-1] == values.shape == actions.shape == returns.shape, (
        logits.shape, values.shape, actions.shape, returns.shape)
    reduce = {"sum": torch.sum, "mean": torch.mean}[reduction]
    log_pi = F.log_softmax(logits, dim=-1)
    log_pi_a = log_pi.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    advantages = (returns.detach() - values).detach()
    policy = reduce(-log_pi_a * advantages)
    value = reduce((returns.detach() - values) ** 2)
    entropy = reduce(-(log_pi.exp() * log_pi).sum(dim=-1))
    total = policy + value_coef * value - entropy_beta * entropy
    return {"total": total, "policy": policy, "value": value, "entropy": entropy}


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _select(q: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """q[b, a[b]] for each b: [B, A], [B] -> [B]."""
    return q.gather(1, a.long().unsqueeze(1)).squeeze(1)


def _check_batch(q_tm1, a_tm1, r_t, discount_t, q_t) -> None:
    assert q_tm1.dim() == 2 and q_t.shape == q_tm1.shape, (q_tm1.shape, q_t.shape)
    batch = (q_tm1.shape[0],)
    assert a_tm1.shape == r_t.shape == discount_t.shape == batch, (
        a_tm1.shape, r_t.shape, discount_t.shape, batch)
