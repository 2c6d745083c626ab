"""The gradient of one rollout for any of the four asynchronous methods (Mnih et al. 2016).

* value methods (one-step Q, one-step Sarsa, n-step Q): targets from the target network
  theta- (`hpcrl.rl.losses.value_targets`), the DQN loss (Huber by default) summed over the
  rollout's transitions: each transition's gradient is its TD error clipped to [-1, 1] (DQN
  error clipping) where the paper wrote the plain squared error. The one-step methods compute
  the t_max per-step gradients of one rollout in one batched backward pass; theta does not
  change between pulls here, so the sum equals the paper's accumulation step by step.
* A3C (Algorithm S3): n-step returns bootstrapped with V(s_T; theta)
  (`hpcrl.rl.losses.bootstrap_returns`), advantage R - V(s), entropy regularisation, feed-
  forward or LSTM (state carried across rollouts, zeroed at episode ends); a softmax policy
  over discrete actions or a Gaussian one over continuous actions (`hpcrl.rl.gaussian`).
* Every gradient is clipped to a global norm (``grad_clip_norm``) before it is pushed.
* Image networks (feed-forward, float32) take the gradient from the acting passes'
  activations (`hpcrl.rl.reuse`, ``learner_reuse_acting``) instead of running the forward
  over the rollout a second time: the same gradient to rounding.

An episode cut by the time limit (not terminal) bootstraps from the state it was cut at, with
V or Q of that state; for Sarsa, whose next action does not exist there, with the max.
"""

from __future__ import annotations

import numpy as np
import torch

from hpcrl.agents.async_rl.rollout import Rollout, flat_batch
from hpcrl.config import Config
from hpcrl.core import LearnerStats
from hpcrl.rl.gaussian import a3c_gaussian_loss
from hpcrl.rl.losses import a3c_loss, bootstrap_returns, dqn_loss, rollout_cuts, td_error, \
    value_targets
from hpcrl.rl.networks import reset_lstm_state, scaled_channels_last
from hpcrl.rl.reuse import RecordedActivations, reusable_torso, torso_backward
from hpcrl.runtime.params.layout import ParamLayout

VALUE_METHODS = ("one_step_q", "one_step_sarsa", "n_step_q")


def clip_by_global_norm(grad: np.ndarray | list[np.ndarray], max_norm: float) -> float:
    """Scale ``grad`` (one array or the pieces of one vector) in place so that its global L2
    norm is at most ``max_norm`` (0 = no clipping).

    Returns:
        The norm before clipping.
    """
    pieces = [grad] if isinstance(grad, np.ndarray) else grad
    # float32 BLAS dots (no float64 copies), summed in float64
    norm = float(np.sqrt(sum(float(np.dot(g, g)) for g in pieces)))
    if max_norm > 0 and norm > max_norm:
        for g in pieces:
            g *= np.float32(max_norm / norm)
    return norm


def _recurrent(net: torch.nn.Module) -> bool:
    """Whether ``net`` carries an LSTM state between steps (A3C LSTM)."""
    return getattr(net, "lstm", None) is not None


def unroll_actor_critic(net: torch.nn.Module, rollout: Rollout):
    """Run the actor-critic over a rollout, as the actor did, keeping the graph.

    The LSTM state starts at ``rollout.state0`` and is zeroed after every episode end, exactly
    where the acting loop zeroed it, so the outputs equal those seen while acting (for the same
    parameters). Where the torso reads each observation alone (``net.batched_torso``), all
    T * N observations pass it in one batch (channels-last for images) and only the LSTM and
    the heads step through the rollout: for one environment per actor-learner (the paper's
    layout) that replaces T batch-1 convolution forwards and backwards, about half of the
    step-by-step unroll's time (docs/performance.md).

    Returns:
        logits [T, N, A], values [T, N], and the state after each step before any reset (a list
        of T states; None entries for feed-forward nets), which bootstraps V(s_t[i]).
    """
    T, N = rollout.a_tm1.shape[:2]
    if not _recurrent(net):
        # feed-forward: one batched pass over all T * N states (one backward graph, not T)
        lg, v, _ = net(torch.from_numpy(flat_batch(rollout.s_tm1)), None)
        return lg.reshape(T, N, -1), v.reshape(T, N), [None] * T
    if getattr(net, "batched_torso", False):
        x = net.features(gradient_batch(rollout)).reshape(T, N, -1)
        step = lambda i, state: net.recurrent_heads(x[i], state)       # noqa: E731
    else:
        step = lambda i, state: net(torch.from_numpy(rollout.s_tm1[i]), state)  # noqa: E731
    state = rollout.state0
    logits, values, after = [], [], []
    for i in range(T):
        lg, v, state = step(i, state)
        logits.append(lg)
        values.append(v)
        after.append(state)
        state = reset_lstm_state(state, rollout.end_t[i])
    return torch.stack(logits), torch.stack(values), after


def bootstrap_mask(rollout: Rollout) -> np.ndarray:
    """[T, N] bool: where a return bootstraps from s_t (cut and not terminal)."""
    return rollout_cuts(rollout.end_t) & (rollout.discount_t > 0)


def gradient_batch(rollout: Rollout) -> torch.Tensor:
    """The rollout's s_tm1 as one [T * N, ...] batch, images scaled to float in channels-last
    memory (oneDNN's faster convolution layout on this CPU, docs/performance.md)."""
    x = torch.from_numpy(flat_batch(rollout.s_tm1))
    return scaled_channels_last(x) if x.dim() == 4 else x


@torch.no_grad()
def actor_critic_bootstrap(net: torch.nn.Module, rollout: Rollout, after: list) -> np.ndarray:
    """V(s_t[i]; theta) where step i's return bootstraps (cut and not terminal), else 0.

    Returns:
        [T, N] float32.
    """
    cut_t = bootstrap_mask(rollout)
    v_t = np.zeros(rollout.r_t.shape, np.float32)
    for i in np.flatnonzero(cut_t.any(axis=1)):
        _, v, _ = net(torch.from_numpy(rollout.s_t[i]), after[i])
        v_t[i] = np.where(cut_t[i], v.numpy(), 0.0)
    return v_t


def bootstrap_values(net: torch.nn.Module, rollout: Rollout) -> np.ndarray:
    """Feed-forward nets: V(s_t; theta) [T, N] where a return bootstraps, else 0, in one pass
    without a graph over those states only."""
    T, N = rollout.a_tm1.shape[:2]
    v_t = np.zeros(T * N, np.float32)
    idx = np.flatnonzero(bootstrap_mask(rollout).reshape(-1))
    if idx.size:
        with torch.no_grad():
            _, v_cut, _ = net(torch.from_numpy(flat_batch(rollout.s_t)[idx]), None)
        v_t[idx] = v_cut.numpy()
    return v_t.reshape(T, N)


def actor_critic_outputs(net: torch.nn.Module, rollout: Rollout,
                         torso_dtype: torch.dtype | None = None):
    """logits [T, N, A] and values [T, N] with their graph, and the bootstrap values v_t [T, N]
    of :func:`actor_critic_bootstrap`.

    Feed-forward nets: one batched pass over the rollout's T * N states, in channels-last
    memory for image inputs, and the states that bootstrap a return in a second pass without
    a graph. Riding along in the gradient's batch they went through backward too (their
    values are detached, but a convolution's backward covers its whole batch): 0.83 of that
    gradient's time apart, 0.75 with channels-last convolutions (one core, a 5 x 8 Pong
    rollout, docs/performance.md). Recurrent nets unroll step by step.

    ``torso_dtype`` (``learner_precision`` = "bfloat16", feed-forward only): the torso of the
    gradient's pass under bfloat16 autocast; the bootstrap values stay float32.
    """
    T, N = rollout.a_tm1.shape[:2]
    if _recurrent(net):
        logits, values, after = unroll_actor_critic(net, rollout)
        return logits, values, actor_critic_bootstrap(net, rollout, after)
    lg, v, _ = net(gradient_batch(rollout), None, torso_dtype)
    return lg.reshape(T, N, -1), v.reshape(T, N), bootstrap_values(net, rollout)


def heads(net: torch.nn.Module, hidden: torch.Tensor):
    """The output heads over the last hidden layer's outputs: (logits, values) of a feed-
    forward actor-critic, or the Q-values of a Q-network."""
    if hasattr(net, "q_head"):
        return net.q_head(hidden)
    return net.policy_head(hidden), net.value_head(hidden).squeeze(-1)


def target_q_values(target: torch.nn.Module, algo: str, rollout: Rollout) -> np.ndarray:
    """Q(s_t, .; theta-) [T, N, A] where the method's targets read it; zeros elsewhere.

    n-step Q (Algorithm S2) bootstraps only where a return is cut and not terminal (the
    rollout's last step, time-limit cuts): about one state in t_max, so only those go through
    the target network. The one-step methods read every step's s_t.
    """
    T, N = rollout.a_tm1.shape[:2]
    s_t = flat_batch(rollout.s_t)
    with torch.no_grad():
        if algo != "n_step_q":
            return target(torch.from_numpy(s_t)).numpy().reshape(T, N, -1)
        idx = np.flatnonzero(bootstrap_mask(rollout).reshape(-1))
        if not idx.size:                          # every return ends in its episode
            return np.zeros((T, N, 1), np.float32)
        q_cut = target(torch.from_numpy(s_t[idx])).numpy()
    q_t = np.zeros((T * N, q_cut.shape[-1]), np.float32)
    q_t[idx] = q_cut
    return q_t.reshape(T, N, -1)


class AsyncLearner:
    """The gradient of one rollout, for any of the four methods, as the flat vector in pieces
    (one per parameter, see ``ParamLayout.grad_pieces``)."""

    def __init__(self, net: torch.nn.Module, target: torch.nn.Module | None, cfg: Config):
        self.net, self.target, self.cfg = net, target, cfg
        self.layout = ParamLayout.from_module(net)
        self.stats = LearnerStats()
        self.sq_norm = 0.0
        self._health = 0.0        # the last loss's entropy (A3C) or mean max Q (value methods)
        self.torso_dtype = torch.bfloat16 if cfg.learner_precision == "bfloat16" else None
        #: whether the gradient can come from the acting passes' activations (hpcrl.rl.reuse)
        self.reuses_acting = (cfg.learner_reuse_acting and self.torso_dtype is None
                              and not _recurrent(net)
                              and reusable_torso(getattr(net, "torso", None)))
        self._hidden: torch.Tensor | None = None    # the heads' input leaf of a reused pass

    def _hidden_leaf(self, acts: RecordedActivations) -> torch.Tensor:
        """The recorded last hidden layer as a leaf whose gradient the torso's backward reads."""
        self._hidden = acts.head_input.detach().requires_grad_()
        return self._hidden

    def loss(self, rollout: Rollout, a_next: np.ndarray | None = None,
             acts: RecordedActivations | None = None) -> torch.Tensor:
        """The rollout's loss: summed over its t_max steps, averaged over its N environments.

        The sum over time is the paper's: an actor-learner accumulates the gradients of its
        rollout's steps, and the learning rates were tuned that way. The mean over
        environments keeps the step of one push independent of ``envs_per_actor`` (as A2C
        and PAAC average over their environments): N environments give a gradient of lower
        variance, not an N times larger one, so learning rate, RMSProp's epsilon and the
        norm clip keep their meaning. With one environment it is the paper's loss exactly.

        ``acts``: the rollout's acting activations (:meth:`gradient` passes them where
        ``reuses_acting``): the heads run on the recorded hidden layer instead of a forward.
        """
        T, N = rollout.a_tm1.shape[:2]
        self._hidden = None
        if self.cfg.algo == "a3c":
            if acts is not None:
                logits, values = heads(self.net, self._hidden_leaf(acts))
                logits, values = logits.reshape(T, N, -1), values.reshape(T, N)
                v_t = bootstrap_values(self.net, rollout)
            else:
                logits, values, v_t = actor_critic_outputs(self.net, rollout, self.torso_dtype)
            returns = bootstrap_returns(rollout.r_t, rollout.discount_t,
                                        rollout_cuts(rollout.end_t), v_t, self.cfg.gamma)
            loss = a3c_gaussian_loss if rollout.a_tm1.ndim == 3 else a3c_loss
            out = loss(logits, values, torch.from_numpy(rollout.a_tm1),
                       torch.from_numpy(returns), self.cfg.entropy_beta, self.cfg.value_coef)
            self._health = float(out["entropy"].detach()) / (T * N)   # per agent step
            return out["total"] / N
        q_t = target_q_values(self.target, self.cfg.algo, rollout)
        y = value_targets(self.cfg.algo, rollout.r_t, rollout.discount_t, rollout.end_t,
                          rollout.a_tm1, q_t, self.cfg.gamma, a_next)
        q_tm1 = (heads(self.net, self._hidden_leaf(acts)) if acts is not None
                 else self.net(gradient_batch(rollout)))
        self._health = float(q_tm1.detach().max(dim=-1).values.mean())
        td = td_error(q_tm1, torch.from_numpy(rollout.a_tm1.reshape(-1)), y.reshape(-1))
        return dqn_loss(td, self.cfg.loss, reduction="sum") / N

    def gradient(self, rollout: Rollout, a_next: np.ndarray | None = None,
                 acts: RecordedActivations | None = None) -> list[np.ndarray] | None:
        """Norm-clipped gradient of `loss` in pieces (valid until the next call), or None if it
        is not finite.

        ``acts``: the activations of the passes that acted this rollout with the current
        parameters (the worker's recording); used where ``reuses_acting``, ignored otherwise.

        Backward writes fresh ``.grad`` tensors (``set_to_none``) that are pushed as they are:
        accumulating into a zeroed flat buffer instead costs a pass that zeroes the whole
        vector and an add where a fresh tensor is simply kept.
        """
        acts = acts if self.reuses_acting else None
        loss = self.loss(rollout, a_next, acts)
        value = float(loss.detach())
        if not np.isfinite(value):
            self.stats.dropped_nonfinite += 1
            return None
        self.net.zero_grad(set_to_none=True)
        loss.backward()
        if acts is not None:
            x = gradient_batch(rollout)
            torso_backward(self.net.torso, x, acts.outs, self._hidden.grad)
        grad = self.layout.grad_pieces(self.net)
        norm = clip_by_global_norm(grad, self.cfg.grad_clip_norm)
        if not np.isfinite(norm):
            self.stats.dropped_nonfinite += 1
            return None
        clip = self.cfg.grad_clip_norm
        clipped = min(norm, clip) if clip > 0 else norm
        self.sq_norm = clipped * clipped          # of the gradient returned; push tells the ps
        self.stats.add_loss(value, self._health, self.cfg.algo)
        self.stats.add_gradient(norm, clip)
        self.stats.updates += 1
        return grad

