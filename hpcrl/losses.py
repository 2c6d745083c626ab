"""TD errors, returns and losses of DQN/Gorila and the asynchronous methods, as pure functions.

Sources: Mnih et al. 2015 ("Human-level control through deep RL", Nature DQN: target network,
error clipping), Nair et al. 2015 (Gorila: the same DQN loss per learner) and Mnih et al. 2016
("Asynchronous Methods for Deep RL": one-step Q / Sarsa, n-step returns, A3C).

Everything here takes tensors and returns tensors: no modules, optimisers or MPI (dqn_zoo,
acme `losses.py`). The caller runs the networks and calls `.backward()`. Targets are detached
inside, so a caller cannot leak gradients into the target network by accident.
"""

import torch
import torch.nn.functional as F


def huber(x: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """Elementwise Huber loss: 0.5 x^2 for |x| <= delta, delta (|x| - 0.5 delta) beyond.

    Its derivative is x clipped to [-delta, delta], which is the Nature DQN error clipping.
    """
    abs_x = x.abs()
    quadratic = torch.clamp(abs_x, max=delta)
    return 0.5 * quadratic ** 2 + delta * (abs_x - quadratic)


def q_learning_td(q_tm1: torch.Tensor, a_tm1: torch.Tensor, r_t: torch.Tensor,
                  discount_t: torch.Tensor, q_t: torch.Tensor, gamma: float) -> torch.Tensor:
    """One-step Q-learning TD error (Mnih et al. 2015, eq. 2; Mnih et al. 2016, Algorithm 1).

        td = r_t + gamma * discount_t * max_a q_t[a] - q_tm1[a_tm1]

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
    target = r_t + gamma * discount_t * q_t.max(dim=1).values
    return target.detach() - _select(q_tm1, a_tm1)


def sarsa_td(q_tm1: torch.Tensor, a_tm1: torch.Tensor, r_t: torch.Tensor,
             discount_t: torch.Tensor, q_t: torch.Tensor, a_t: torch.Tensor,
             gamma: float) -> torch.Tensor:
    """One-step Sarsa TD error (Mnih et al. 2016, §4 "Asynchronous one-step Sarsa").

        td = r_t + gamma * discount_t * q_t[a_t] - q_tm1[a_tm1]

    The target uses the action a_t that the behaviour policy actually took in s_t (on-policy),
    where Q-learning takes the max.

    Args:
        q_tm1, a_tm1, r_t, discount_t, gamma: as in `q_learning_td`.
        q_t: [B, A] Q(s_t, .; theta^-) of the target network (detached here).
        a_t: [B] integer actions taken in s_t.

    Returns:
        td: [B], differentiable through q_tm1 only.
    """
    _check_batch(q_tm1, a_tm1, r_t, discount_t, q_t)
    assert a_t.shape == a_tm1.shape, (a_t.shape, a_tm1.shape)
    target = r_t + gamma * discount_t * _select(q_t, a_t)
    return target.detach() - _select(q_tm1, a_tm1)


def dqn_loss(td: torch.Tensor, kind: str = "huber") -> torch.Tensor:
    """Mean DQN loss over the batch, with the TD error's gradient clipped to [-1, 1].

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

    Returns:
        Scalar loss.
    """
    assert td.dim() == 1, td.shape
    if kind == "huber":
        return huber(td).mean()
    if kind == "clip":
        squared = 0.5 * td.detach() ** 2
        clipped = td.detach().clamp(-1.0, 1.0)
        return (squared + clipped * (td - td.detach())).mean()
    raise ValueError(f"unknown dqn loss kind {kind!r}; want 'huber' or 'clip'")


def n_step_returns(r_t: torch.Tensor, discount_t: torch.Tensor, bootstrap_value: torch.Tensor,
                   gamma: float) -> torch.Tensor:
    """n-step returns of a rollout, forward view (Mnih et al. 2016, Algorithms S2 and S3).

    Going backwards from R = V(s_T) (or max_a Q(s_T, a; theta^-) for n-step Q-learning):

        R_i = r_i + gamma * discount_i * R_{i+1},    R_T = bootstrap_value,

    so each step gets the longest available return (1-step for the last, T-step for the first).
    discount_i = 0 where the step ends an episode (s_{i+1} terminal): R restarts there, which is
    the paper's "R = 0 for terminal s_t" when a rollout of fixed length runs across an episode end.
    A time-limit truncation inside a rollout needs the truncated state's value and is not
    expressible here; end the rollout there instead.

    Args:
        r_t: [T] or [T, B] rewards of steps 0..T-1.
        discount_t: same shape, 0 where step i's next state is terminal, else 1.
        bootstrap_value: [] or [B], value of the state after the last step (detached here: the
            return is a target).
        gamma: discount factor.

    Returns:
        [T] or [T, B] returns, detached.
    """
    assert r_t.shape == discount_t.shape, (r_t.shape, discount_t.shape)
    assert bootstrap_value.shape == r_t.shape[1:], (bootstrap_value.shape, r_t.shape)
    returns = torch.empty_like(r_t)
    ret = bootstrap_value.detach().to(r_t.dtype)
    for i in range(r_t.shape[0] - 1, -1, -1):
        ret = r_t[i] + gamma * discount_t[i] * ret
        returns[i] = ret
    return returns.detach()


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


def _select(q: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """q[b, a[b]] for each b: [B, A], [B] -> [B]."""
    return q.gather(1, a.long().unsqueeze(1)).squeeze(1)


def _check_batch(q_tm1, a_tm1, r_t, discount_t, q_t) -> None:
    assert q_tm1.dim() == 2 and q_t.shape == q_tm1.shape, (q_tm1.shape, q_t.shape)
    batch = (q_tm1.shape[0],)
    assert a_tm1.shape == r_t.shape == discount_t.shape == batch, (
        a_tm1.shape, r_t.shape, discount_t.shape, batch)
