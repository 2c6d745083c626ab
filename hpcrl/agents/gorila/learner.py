"""The Gorila learner: the DQN gradient of one minibatch, as a flat vector, and the drop rules.

The loss is Nature DQN's (Mnih et al. 2015) with the target network theta-; the learner drops
gradients whose loss is an outlier (|loss| > running mean + k std, Nair et al. 2015 §4) or
non-finite, and counts both; the ps drops stale ones.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from hpcrl.config import Config
from hpcrl.core import LearnerStats, sub_state, with_prefix
from hpcrl.rl.losses import dqn_loss, q_learning_td
from hpcrl.rl.networks import q_values, scaled_channels_last
from hpcrl.rl.policies import LossOutlierFilter
from hpcrl.runtime.params.layout import ParamLayout


class GorilaLearner:
    """The DQN gradient of one minibatch, as a flat vector, plus the drop rules."""

    def __init__(self, net: torch.nn.Module, target: torch.nn.Module, cfg: Config):
        self.net, self.target, self.cfg = net, target, cfg
        self.layout = ParamLayout.from_module(net)
        self.grad = np.zeros(self.layout.size, np.float32)
        self.outliers = LossOutlierFilter(cfg.outlier_k) if cfg.outlier_k > 0 else None
        self.stats = LearnerStats()
        self.sq_norm = 0.0        # of the last gradient returned (handed to store.push)
        self.torso_dtype = torch.bfloat16 if cfg.learner_precision == "bfloat16" else None
        self._target_torso: torch.nn.Module | None = None    # the target torso in torso_dtype
        self._target_pulls: int | None = None                # ... as of this target pull

    def get_state(self) -> dict:
        state = self.stats.get_state()
        if self.outliers is not None:
            state.update(with_prefix("outliers", self.outliers.get_state()))
        return state

    def set_state(self, state: dict) -> None:
        self.stats.set_state(state)
        if self.outliers is not None and sub_state(state, "outliers"):
            self.outliers.set_state(sub_state(state, "outliers"))

    def _target_q(self, s_t: torch.Tensor, target_pulls: int | None) -> torch.Tensor:
        """The target network's Q-values. With a bfloat16 torso and ``target_pulls`` (the
        `TargetNetwork`'s pull count) its torso runs from a bfloat16 copy of the weights made
        once per pull, not cast by autocast at every update (the target changes every
        ``target_update_every`` updates; its 1.6 M-float hidden layer cast costs more than the
        layer's matmul at batch 32). The same values as under autocast, bit for bit."""
        if self.torso_dtype is None or target_pulls is None or s_t.dtype != self.torso_dtype:
            return q_values(self.target, s_t, self.torso_dtype)
        if self._target_torso is None:
            self._target_torso = copy.deepcopy(self.target.torso).to(self.torso_dtype)
            self._target_torso.requires_grad_(False)
            self._target_pulls = None
        if self._target_pulls != target_pulls:
            for mine, theirs in zip(self._target_torso.parameters(), self.target.torso.parameters()):
                mine.copy_(theirs)
            self._target_pulls = target_pulls
        return self.target.q_head(self._target_torso(s_t).float())

    def gradient(self, batch, target_pulls: int | None = None) -> np.ndarray | None:
        """Flat gradient of the DQN loss on ``batch``, or None if the rules drop it.

        ``target_pulls``: the `TargetNetwork`'s pull count, which lets a bfloat16 torso keep
        its target weights cast between pulls (`_target_q`); None casts them every time."""
        stats = self.stats
        s_tm1 = torch.from_numpy(batch.s_tm1)
        s_t = torch.from_numpy(batch.s_t)
        if s_tm1.ndim == 3 and s_tm1.shape[1] == 1:      # vector obs stored with stack 1
            s_tm1, s_t = s_tm1[:, 0], s_t[:, 0]
        elif s_tm1.ndim == 4:
            # channels-last images: oneDNN's convolutions run them faster on CPU (measured by
            # ``python -m hpcrl.bench learner``); the weights stay in the flat vector's layout.
            # In the torso's dtype: a bfloat16 batch is the one autocast would cast to.
            dtype = self.torso_dtype or torch.float32
            s_tm1, s_t = scaled_channels_last(s_tm1, dtype), scaled_channels_last(s_t, dtype)
        q_tm1 = q_values(self.net, s_tm1, self.torso_dtype)
        with torch.no_grad():
            q_t = self._target_q(s_t, target_pulls)
        td = q_learning_td(q_tm1, torch.from_numpy(batch.a_tm1), torch.from_numpy(batch.r_t),
                           torch.from_numpy(batch.discount_t), q_t, self.cfg.gamma)
        loss = dqn_loss(td, self.cfg.loss)
        value = float(loss.detach())
        if not np.isfinite(value):
            stats.dropped_nonfinite += 1
            return None
        stats.add_loss(value, float(q_tm1.detach().max(dim=-1).values.float().mean()), "gorila")
        if self.outliers is not None and not self.outliers.accept(value):
            stats.dropped_outlier += 1
            return None
        # backward() into fresh .grad tensors, then one copy into the flat gradient: a .grad
        # bound to the flat vector would need zeroing first and an add (two passes over the
        # 1.6 M-float hidden layer where one copy does)
        self.net.zero_grad(set_to_none=True)
        loss.backward()
        self.layout.grads_to_flat(self.net, self.grad)
        # Gorila clips no gradient. The squared norm (float32 BLAS dot) serves the train rows
        # and the push, which would otherwise compute it again, and the finiteness check: it is
        # finite where every element is and the sum of squares stays below float32's largest
        # value (a norm above 1.8e19 is dropped too, as the asynchronous methods' clip does);
        # a float64 sum for the check alone cost 5x the dot on a Nature-DQN gradient.
        with np.errstate(over="ignore", invalid="ignore"):    # counted below, not warned
            sq_norm = float(np.dot(self.grad, self.grad))
        if not np.isfinite(sq_norm):
            stats.dropped_nonfinite += 1
            return None
        self.sq_norm = sq_norm
        stats.add_gradient(float(np.sqrt(self.sq_norm)))
        stats.updates += 1
        return self.grad
