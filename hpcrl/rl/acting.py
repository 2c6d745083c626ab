"""Behaviour policies over a network: what actors and evaluators act with (torch).

Each policy has ``act(obs) -> actions``, ``episode_end(end)``, ``state`` (the LSTM state or
None) and ``get_state`` / ``set_state`` (its RNG position, exploration schedule and recurrent
state), so a checkpoint continues the action stream exactly. ``forward`` is the network call
(the network itself by default; a benchmark passes a timed wrapper).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from hpcrl.io.rngstate import generator_state_from_array, generator_state_to_array
from hpcrl.rl.gaussian import mean_action, sample_gaussian
from hpcrl.rl.networks import reset_lstm_state
from hpcrl.rl.policies import LinearSchedule, epsilon_greedy, epsilon_greedy_lazy, \
    sample_final_epsilon, sample_from_logits


class EpsilonGreedyPolicy:
    """Epsilon-greedy on Q(s, .; theta) with the asynchronous methods' per-thread final
    epsilons (Mnih et al. 2016, §8).

    Each env samples its final epsilon from {0.1, 0.01, 0.5} and anneals to it linearly from 1
    over ``anneal_frames`` frames of this rank. The forward runs at every step, exploring or
    not: the learner takes its gradient from these acting passes' activations
    (``hpcrl.rl.reuse``), and a rollout with a pass missing would re-run the forward.
    """

    state = None

    def __init__(self, net: torch.nn.Module, num_envs: int, anneal_frames: int,
                 frames_per_step: int, rng: np.random.Generator,
                 forward: Callable | None = None, final_epsilon_high: float = 0.5):
        self.net, self.rng, self.frames_per_step = net, rng, frames_per_step
        self.forward = forward or net
        self.anneal_frames = anneal_frames
        self.final_epsilons = np.array([sample_final_epsilon(rng, final_epsilon_high)
                                        for _ in range(num_envs)])
        self.schedules = [LinearSchedule(1.0, e, anneal_frames) for e in self.final_epsilons]
        self.local_frames = 0

    def epsilons(self) -> np.ndarray:
        return np.array([s.value(self.local_frames) for s in self.schedules])

    def act(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            q = self.forward(torch.from_numpy(obs)).numpy()
        actions = epsilon_greedy(q, self.epsilons(), self.rng)
        self.local_frames += self.frames_per_step * obs.shape[0]
        return actions

    def episode_end(self, end: np.ndarray) -> None:
        pass

    def get_state(self) -> dict:
        return {"rng": generator_state_to_array(self.rng), "final_epsilons": self.final_epsilons,
                "local_frames": np.int64(self.local_frames)}

    def set_state(self, state: dict) -> None:
        generator_state_from_array(self.rng, state["rng"])
        self.final_epsilons = np.array(state["final_epsilons"])
        self.schedules = [LinearSchedule(1.0, e, self.anneal_frames) for e in self.final_epsilons]
        self.local_frames = int(state["local_frames"])


class FixedEpsilonPolicy:
    """Epsilon-greedy on Q with one fixed epsilon: the DQN evaluation protocol (0.05)."""

    state = None

    def __init__(self, net: torch.nn.Module, epsilon: float, rng: np.random.Generator):
        self.net, self.epsilon, self.rng = net, epsilon, rng
        self.num_actions = net.q_head.out_features        # every Q-network's last layer

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Actions for ``obs`` [B, ...]; the forward runs only when some row acts greedily."""
        def q_values():
            with torch.no_grad():
                return self.net(torch.from_numpy(obs)).numpy()
        return epsilon_greedy_lazy(q_values, obs.shape[0], self.num_actions, self.epsilon,
                                   self.rng)

    def episode_end(self, end: np.ndarray) -> None:
        pass

    def get_state(self) -> dict:
        return {"rng": generator_state_to_array(self.rng)}

    def set_state(self, state: dict) -> None:
        generator_state_from_array(self.rng, state["rng"])


class ActorCriticPolicy:
    """Samples from softmax(logits) of the actor-critic; carries the LSTM state across steps
    and rollouts and zeroes it where an episode ended (A3C LSTM, Mnih et al. 2016, §5.1)."""

    UNIFORMS_PER_DRAW = 256    # drawn from rng in blocks: one call per step costs ~10 us, cold

    def __init__(self, net: torch.nn.Module, num_envs: int, rng: np.random.Generator,
                 forward: Callable | None = None):
        self.net, self.rng = net, rng
        self.forward = forward or net
        self.state = net.initial_state(num_envs)
        self.uniforms, self.uniform_pos = np.zeros(0), 0

    def _draw_block(self, n: int) -> np.ndarray:
        """A fresh block of draws (uniforms here; standard normals for a Gaussian policy)."""
        return self.rng.random(n)

    def _next_uniforms(self, n: int) -> np.ndarray:
        if self.uniform_pos + n > len(self.uniforms):
            self.uniforms = self._draw_block(max(self.UNIFORMS_PER_DRAW, n))
            self.uniform_pos = 0
        self.uniform_pos += n
        return self.uniforms[self.uniform_pos - n:self.uniform_pos]

    def act(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits, _, self.state = self.forward(torch.from_numpy(obs), self.state)
        return sample_from_logits(logits.numpy(), self._next_uniforms(obs.shape[0]))

    def episode_end(self, end: np.ndarray) -> None:
        self.state = reset_lstm_state(self.state, end)

    def get_state(self) -> dict:
        out = {"rng": generator_state_to_array(self.rng), "uniforms": self.uniforms.copy(),
               "uniform_pos": np.int64(self.uniform_pos)}
        if self.state is not None:                     # LSTM (h, c)
            out.update(h=self.state[0].numpy().copy(), c=self.state[1].numpy().copy())
        return out

    def set_state(self, state: dict) -> None:
        generator_state_from_array(self.rng, state["rng"])
        if "uniforms" in state:
            self.uniforms = np.array(state["uniforms"], np.float64)
            self.uniform_pos = int(state["uniform_pos"])
        if "h" in state:
            self.state = (torch.from_numpy(np.array(state["h"])),
                          torch.from_numpy(np.array(state["c"])))


class GaussianPolicy(ActorCriticPolicy):
    """Draws continuous actions from N(mu, sigma^2) of a Gaussian actor-critic (Mnih et al.
    2016, supplementary §9); with ``use_mean`` acts with the mean (evaluation). Standard
    normals come from ``rng`` in blocks, as the softmax policy's uniforms do."""

    def __init__(self, net: torch.nn.Module, num_envs: int, rng: np.random.Generator,
                 forward: Callable | None = None, use_mean: bool = False):
        super().__init__(net, num_envs, rng, forward)
        self.use_mean = use_mean

    def _draw_block(self, n: int) -> np.ndarray:
        return self.rng.standard_normal(n)

    def act(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out, _, self.state = self.forward(torch.from_numpy(obs), self.state)
        out = out.numpy()
        if self.use_mean:
            return mean_action(out)
        d = out.shape[1] // 2
        return sample_gaussian(out, self._next_uniforms(out.shape[0] * d).reshape(-1, d))
