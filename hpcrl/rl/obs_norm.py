"""Running normalisation of vector observations (continuous control), as a network layer.

MuJoCo's state vectors mix positions of order 1 with velocities of order 10 and more; a policy
network fed them raw learns slowly or not at all. Implementations of A2C/PPO on MuJoCo
normalise each coordinate by a running mean and standard deviation of the observations seen
in training and clip the result (Stable-Baselines3's ``VecNormalize``, clip 10; CleanRL's
continuous-action scripts; Andrychowicz et al. 2021, "What matters in on-policy RL", finds it
one of the choices that matter most). The asynchronous-methods paper does not mention it, so
it is a named option here (``obs_norm``).

The statistics live in the network as buffers (not parameters: the parameter servers do not
hold them and no gradient reaches them), so acting, the rollout's gradient, evaluation, and an
exported policy all normalise the same way. Each actor-learner keeps its own statistics of the
observations its environments produce (the ranks see one distribution, so they agree closely;
an exported policy takes the first actor-learner's), saved with the rank's checkpoint state.
Statistics are only updated by :meth:`ObsNormalizer.observe`, which the actor-learner calls
once per rollout, after the rollout's gradient, with the observations the rollout's steps
returned (the first of a new episode where one ended; the last of an ended episode is not
seen by the policy, so it is not counted): the gradient sees the states normalised as they
were when the policy acted. A forward pass never changes them, so evaluation does not.

The moments are merged batch by batch with Chan, Golub and LeVeque's parallel update (1979),
in float64: the mean and sum of squared deviations of all observations so far, exactly those
of the concatenated data up to rounding.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

#: Added to the variance inside the square root (a coordinate that never moves stays finite).
VAR_EPS = 1e-8


def merge_moments(count: float, mean: np.ndarray, m2: np.ndarray, batch: np.ndarray
                  ) -> tuple[float, np.ndarray, np.ndarray]:
    """The count, mean and sum of squared deviations (M2) of the data so far plus ``batch``
    ([B, D]), from those of the data so far (Chan et al. 1979): with n = count + B,
    delta = mean_B - mean, mean' = mean + delta B / n, M2' = M2 + M2_B + delta^2 count B / n.
    """
    batch = np.asarray(batch, np.float64)
    b = float(len(batch))
    if b == 0:
        return count, mean, m2
    batch = batch.reshape(len(batch), -1)
    batch_mean = batch.mean(axis=0)
    batch_m2 = ((batch - batch_mean) ** 2).sum(axis=0)
    n = count + b
    delta = batch_mean - mean
    return n, mean + delta * (b / n), m2 + batch_m2 + delta ** 2 * (count * b / n)


def variance(count: float, m2: np.ndarray) -> np.ndarray:
    """The population variance M2 / count; 1 before any observation (normalising is then
    the identity)."""
    return m2 / count if count > 0 else np.ones_like(m2)


class ObsNormalizer(nn.Module):
    """``clip((x - mean) / sqrt(var + 1e-8), -clip, clip)`` with the running moments of the
    observations passed to :meth:`observe` (see the module docstring). Before the first
    observation it passes ``x`` through unchanged (mean 0, variance 1, clipped)."""

    def __init__(self, obs_dim: int, clip: float = 10.0):
        super().__init__()
        self.clip = float(clip)
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("m2", torch.zeros(obs_dim, dtype=torch.float64))
        self._refresh()

    def _refresh(self) -> None:
        """The float32 shift and scale that forward uses, from the float64 moments."""
        var = variance(float(self.count), self.m2.numpy())
        self._shift = self.mean.float()
        self._scale = torch.from_numpy(1.0 / np.sqrt(var + VAR_EPS)).float()

    def observe(self, obs: np.ndarray) -> None:
        """Add a batch of training observations [B, D] to the statistics. Rows with a NaN or
        an infinity (an unstable simulation) are left out: one would poison the statistics,
        and with them every later forward pass, for the rest of the run."""
        obs = np.asarray(obs, np.float64)
        obs = obs[np.isfinite(obs.reshape(len(obs), -1)).all(axis=1)] if len(obs) else obs
        count, mean, m2 = merge_moments(float(self.count), self.mean.numpy(), self.m2.numpy(),
                                        obs)
        self.count.fill_(count)
        self.mean.copy_(torch.from_numpy(mean))
        self.m2.copy_(torch.from_numpy(m2))
        self._refresh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self._shift) * self._scale).clamp_(-self.clip, self.clip)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)      # load_state_dict: buffers, then
        self._refresh()                                     # the derived shift and scale

    def get_state(self) -> dict[str, np.ndarray]:
        """The moments, for a rank's checkpoint."""
        return {"count": self.count.numpy().copy(), "mean": self.mean.numpy().copy(),
                "m2": self.m2.numpy().copy()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        if np.shape(state["mean"]) != tuple(self.mean.shape):
            raise ValueError(f"observation statistics are for {np.shape(state['mean'])} "
                             f"coordinates, the network has {tuple(self.mean.shape)}")
        self.count.fill_(float(np.asarray(state["count"])))
        self.mean.copy_(torch.from_numpy(np.asarray(state["mean"], np.float64)))
        self.m2.copy_(torch.from_numpy(np.asarray(state["m2"], np.float64)))
        self._refresh()


def find_obs_normalizer(net: nn.Module) -> ObsNormalizer | None:
    """The network's observation normaliser, or None if it has none."""
    return next((m for m in net.modules() if isinstance(m, ObsNormalizer)), None)


class ReturnScaler:
    """Training rewards divided by the running standard deviation of the discounted return,
    clipped (``reward_norm``; not in the paper).

    Continuous-control rewards are not clipped to [-1, 1] as Atari's are: HalfCheetah's
    discounted returns reach hundreds, the value loss's gradient then dwarfs the policy's, and
    a global-norm clip (2.5 here) shrinks every gradient by a factor of hundreds to thousands
    (measured: median gradient norms of 10^3-10^4 before the clip). Dividing the rewards by
    the running standard deviation of each environment's discounted return keeps the values
    of order 1 whatever the task's reward scale: Stable-Baselines3's ``VecNormalize``
    (``norm_reward``), which this follows step for step: per environment
    R <- gamma R + r, the moments of all R so far updated with this step's, r / sqrt(var +
    1e-8) clipped to +-clip, R <- 0 where the episode ended. The moments start as those of a
    prior of weight 1e-4 with mean 0 and variance 1, as SB3's ``RunningMeanStd``, so the first
    steps are not divided by a variance of 0. Reported returns stay the raw ones.
    """

    PRIOR_COUNT = 1e-4

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0):
        self.gamma, self.clip = float(gamma), float(clip)
        self.returns = np.zeros(num_envs, np.float64)
        self.count, self.mean, self.m2 = self.PRIOR_COUNT, np.zeros(1), np.full(1, self.PRIOR_COUNT)

    def scale(self, rewards: np.ndarray, episode_end: np.ndarray) -> np.ndarray:
        """This step's rewards [N] scaled (float32); ``episode_end`` [N] restarts returns.

        A NaN or infinite reward (an unstable simulation) passes through as it came (the
        learner drops its gradient) but restarts that environment's return and stays out of
        the moments, which would otherwise be poisoned for the rest of the run."""
        rewards = np.asarray(rewards, np.float64)
        finite = np.isfinite(rewards)
        self.returns = self.returns * self.gamma + np.where(finite, rewards, 0.0)
        self.returns[~finite] = 0.0
        self.count, self.mean, self.m2 = merge_moments(self.count, self.mean, self.m2,
                                                       self.returns[finite, None])
        var = float(self.m2[0] / self.count)
        scaled = np.clip(rewards / np.sqrt(var + VAR_EPS), -self.clip, self.clip)
        self.returns[np.asarray(episode_end, bool)] = 0.0
        return scaled.astype(np.float32)

    def get_state(self) -> dict[str, np.ndarray]:
        return {"returns": self.returns.copy(), "count": np.float64(self.count),
                "mean": self.mean.copy(), "m2": self.m2.copy()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        if np.shape(state["returns"]) != self.returns.shape:
            raise ValueError(f"reward statistics are for {np.shape(state['returns'])[0]} "
                             f"environments, this rank has {len(self.returns)}")
        self.returns = np.array(state["returns"], np.float64)
        self.count = float(np.asarray(state["count"]))
        self.mean = np.array(state["mean"], np.float64).reshape(1)
        self.m2 = np.array(state["m2"], np.float64).reshape(1)
