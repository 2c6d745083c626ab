"""Asynchronous actor-learners (Mnih et al. 2016, "Asynchronous Methods for Deep RL").

One rank = one actor-learner thread of the paper: it acts in its own environment(s) with a copy
of the shared parameters theta, computes the gradient of one rollout and hands it to the
parameter store, whose ps ranks apply it with the configured rule (shared RMSProp by default,
paper §S7). Nothing locks the parameters between actor-learners (Hogwild!, as in the paper):
a rank pulls theta after each push, so its gradient was computed from parameters that other
ranks may already have moved.

Methods (``cfg.algo``), each over rollouts of ``t_max`` agent steps per environment:

* ``one_step_q`` (Algorithm 1): y = r + gamma max_a' Q(s', a'; theta-), gradients of the
  per-step losses accumulated over I_AsyncUpdate = t_max steps, then one push.
* ``one_step_sarsa`` (§4): y = r + gamma Q(s', a'; theta-) with a' the action actually taken
  in s' (for the last step of a rollout: the action chosen for the next rollout's first step).
* ``n_step_q`` (Algorithm S2): each state gets the longest n-step return available in the
  rollout, bootstrapped with max_a Q(s_T, a; theta-).
* ``a3c`` (Algorithm S3): n-step returns bootstrapped with V(s_T; theta), advantage R - V(s),
  entropy regularisation, feed-forward or LSTM (state carried across rollouts, zeroed at
  episode ends), gradient global-norm clipping.

The value methods share a target network theta- that is refreshed every ``target_update_every``
*global* agent steps (the paper's I_target): every rank adds its steps to a shared counter and
the rank whose addition crosses a multiple asks the ps to copy theta into theta-; ranks pull
theta- when its version changes. Exploration: each environment samples its final epsilon from
{0.1, 0.01, 0.5} w.p. {0.4, 0.3, 0.3} and anneals to it from 1 over ``anneal_frames`` frames of
its rank (§8). The learning rate is annealed linearly to 0 over ``total_frames`` global frames
when ``lr_anneal`` (§8); each push carries it.

Differences from the paper, and why:

* Rollouts have a fixed length of ``t_max`` steps and may run across an episode end (the paper
  stops a rollout at a terminal state). Returns restart at the end (``rollout_cuts``), so each
  step's target is the paper's; only the grouping of steps into updates differs, which lets
  ``envs_per_actor`` environments step in lockstep with one batched forward pass.
* The one-step methods compute the t_max per-step gradients of one rollout in one batched
  backward pass. Theta does not change between pulls here, so the sum equals the paper's
  accumulation step by step.
* Value losses are ``hpcrl.losses.dqn_loss`` (Huber by default) summed over the rollout's
  transitions: the gradient of each transition is its TD error clipped to [-1, 1] (DQN error
  clipping) where the paper wrote the plain squared error.
* An episode cut by the time limit (not terminal) bootstraps from the state it was cut at,
  with V or Q of that state; for Sarsa, whose next action does not exist there, with the max.

The pure parts (targets, returns, action sampling, the LSTM unroll) are module functions; the
MPI loop is :func:`run_actor_learner`.
"""

from __future__ import annotations

import json
import math
import time
from typing import Callable, NamedTuple

import numpy as np
import torch

from hpcrl.config import Config
from hpcrl.envs import StepResult, make_env
from hpcrl.losses import a3c_loss, dqn_loss
from hpcrl.networks import ParamLayout, reset_lstm_state
from hpcrl.params.store import FRAMES, STEPS, TV
from hpcrl.policies import LinearSchedule, epsilon_greedy, learning_rate, sample_final_epsilon
from hpcrl.coord import STOP_BUDGET
from hpcrl.program import Context, build_network, env_kwargs, sub_state, with_prefix
from hpcrl.replay import generator_state_from_array, generator_state_to_array

VALUE_METHODS = ("one_step_q", "one_step_sarsa", "n_step_q")


# ---------------------------------------------------------------------------------------- rollouts
class Rollout(NamedTuple):
    """t_max agent steps of N environments, time-major ([T, N, ...]).

    Attributes:
        s_tm1: [T, N, *obs] observation in which a_tm1 was taken.
        a_tm1: [T, N] int64 actions.
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
                    first_actions: np.ndarray | None = None) -> tuple[Rollout, np.ndarray]:
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

    Returns:
        (rollout, obs after the last step).
    """
    state0 = None if policy.state is None else tuple(x.detach().clone() for x in policy.state)
    # Per step only what must happen per step; dtype conversions wait for the stacks at the end
    # (each numpy call costs 5-30 us here: the forward pass and the emulator leave it cold).
    s_tm1, a_tm1, r_t, terminal_t, end_t, s_t = [], [], [], [], [], []
    for i in range(num_steps):
        actions = first_actions if (i == 0 and first_actions is not None) else policy.act(obs)
        res = env.step(actions)
        s_tm1.append(obs)
        a_tm1.append(actions)
        r_t.append(res.reward)
        terminal_t.append(res.terminal)
        end_t.append(res.episode_end)             # a fresh array every step (both env kinds)
        if res.episode_end.any():          # auto-reset: res.obs is the next episode's start
            s_t.append(np.where(_expand(res.episode_end, obs.ndim),
                                next_obs_before_reset(obs, res.last_frame), res.obs))
            policy.episode_end(res.episode_end)
        else:
            s_t.append(res.obs)
        if on_step is not None:
            on_step(res)
        obs = res.obs
    discount_t = (~np.stack(terminal_t)).astype(np.float32)
    return Rollout(np.stack(s_tm1), np.stack(a_tm1).astype(np.int64, copy=False),
                   np.stack(r_t).astype(np.float32, copy=False), discount_t,
                   np.stack(end_t).astype(bool, copy=False), np.stack(s_t), state0), obs


def _expand(mask: np.ndarray, ndim: int) -> np.ndarray:
    return mask.reshape(mask.shape + (1,) * (ndim - 1))


# ---------------------------------------------------------------------------------------- targets
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


def value_targets(algo: str, rollout: Rollout, q_t: np.ndarray, gamma: float,
                  a_next: np.ndarray | None = None) -> np.ndarray:
    """The target of each transition of ``rollout`` for one of the value-based methods."""
    r_t, discount_t, end_t = rollout.r_t, rollout.discount_t, rollout.end_t
    if algo == "one_step_q":
        return one_step_targets(r_t, discount_t, q_t, gamma)
    if algo == "one_step_sarsa":
        a_t = sarsa_next_actions(rollout.a_tm1, a_next, end_t, q_t)
        return one_step_targets(r_t, discount_t, q_t, gamma, a_t)
    if algo == "n_step_q":
        return n_step_q_targets(r_t, discount_t, end_t, q_t, gamma)
    raise ValueError(f"not a value-based async method: {algo!r}")


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


def sample_from_logits(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One action per row from softmax(logits) by inverse CDF: the first action whose
    cumulative probability exceeds the row's uniform draw.

    Plain Python over the few actions of a row: right after a forward pass numpy's code is
    cold, and the ten numpy calls of a vectorised version took 95 us per step in the A3C Pong
    loop (12 us when timed alone), 4 % of the step.

    Args:
        logits: [N, A].
        u: [N] uniform draws in [0, 1).

    Returns:
        [N] int64.
    """
    actions = []
    for row, target in zip(logits.tolist(), u.tolist()):
        top = max(row)
        weights = [math.exp(x - top) for x in row]
        target *= sum(weights)
        a, cumulative = 0, weights[0]
        while cumulative <= target and a < len(weights) - 1:
            a += 1
            cumulative += weights[a]
        actions.append(a)
    return np.array(actions, np.int64)


def _recurrent(net: torch.nn.Module) -> bool:
    """Whether ``net`` carries an LSTM state between steps (A3C LSTM)."""
    return getattr(net, "lstm", None) is not None


def unroll_actor_critic(net: torch.nn.Module, rollout: Rollout):
    """Run the actor-critic over a rollout, as the actor did, keeping the graph.

    The LSTM state starts at ``rollout.state0`` and is zeroed after every episode end, exactly
    where the acting loop zeroed it, so the outputs equal those seen while acting (for the same
    parameters).

    Returns:
        logits [T, N, A], values [T, N], and the state after each step before any reset (a list
        of T states; None entries for feed-forward nets), which bootstraps V(s_t[i]).
    """
    T, N = rollout.a_tm1.shape
    if not _recurrent(net):
        # feed-forward: one batched pass over all T * N states (one backward graph, not T)
        lg, v, _ = net(torch.from_numpy(_flat_batch(rollout.s_tm1)), None)
        return lg.reshape(T, N, -1), v.reshape(T, N), [None] * T
    state = rollout.state0
    logits, values, after = [], [], []
    for i in range(rollout.s_tm1.shape[0]):
        lg, v, state = net(torch.from_numpy(rollout.s_tm1[i]), state)
        logits.append(lg)
        values.append(v)
        after.append(state)
        state = reset_lstm_state(state, rollout.end_t[i])
    return torch.stack(logits), torch.stack(values), after


@torch.no_grad()
def actor_critic_bootstrap(net: torch.nn.Module, rollout: Rollout, after: list) -> np.ndarray:
    """V(s_t[i]; theta) where step i's return bootstraps (cut and not terminal), else 0.

    Returns:
        [T, N] float32.
    """
    cut_t = rollout_cuts(rollout.end_t) & (rollout.discount_t > 0)
    v_t = np.zeros(rollout.r_t.shape, np.float32)
    for i in np.flatnonzero(cut_t.any(axis=1)):
        _, v, _ = net(torch.from_numpy(rollout.s_t[i]), after[i])
        v_t[i] = np.where(cut_t[i], v.numpy(), 0.0)
    return v_t


def actor_critic_outputs(net: torch.nn.Module, rollout: Rollout):
    """logits [T, N, A] and values [T, N] with their graph, and the bootstrap values v_t [T, N]
    of :func:`actor_critic_bootstrap`.

    Feed-forward nets get all three from one batched pass: the states that bootstrap a return
    ride along with the rollout's states and their values are detached (one forward call per
    rollout instead of two). Recurrent nets unroll step by step.
    """
    T, N = rollout.a_tm1.shape
    if _recurrent(net):
        logits, values, after = unroll_actor_critic(net, rollout)
        return logits, values, actor_critic_bootstrap(net, rollout, after)
    cut = (rollout_cuts(rollout.end_t) & (rollout.discount_t > 0)).reshape(-1)
    idx = np.flatnonzero(cut)
    x = _flat_batch(rollout.s_tm1)
    if idx.size:
        x = np.concatenate([x, _flat_batch(rollout.s_t)[idx]])
    lg, v, _ = net(torch.from_numpy(x), None)
    v_t = np.zeros(T * N, np.float32)
    v_t[idx] = v[T * N:].detach().numpy()
    return lg[:T * N].reshape(T, N, -1), v[:T * N].reshape(T, N), v_t.reshape(T, N)


# ---------------------------------------------------------------------------------------- policies
class EpsilonGreedyPolicy:
    """Epsilon-greedy on Q(s, .; theta) with the paper's per-thread final epsilons (§8).

    Each env samples its final epsilon from {0.1, 0.01, 0.5} and anneals to it linearly from 1
    over ``anneal_frames`` frames of this rank.
    """

    state = None

    def __init__(self, net: torch.nn.Module, num_envs: int, anneal_frames: int,
                 frames_per_step: int, rng: np.random.Generator):
        self.net, self.rng, self.frames_per_step = net, rng, frames_per_step
        self.final_epsilons = np.array([sample_final_epsilon(rng) for _ in range(num_envs)])
        self.schedules = [LinearSchedule(1.0, e, anneal_frames) for e in self.final_epsilons]
        self.local_frames = 0

    def epsilons(self) -> np.ndarray:
        return np.array([s.value(self.local_frames) for s in self.schedules])

    def act(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            q = self.net(torch.from_numpy(obs)).numpy()
        actions = epsilon_greedy(q, self.epsilons(), self.rng)
        self.local_frames += self.frames_per_step * obs.shape[0]
        return actions

    def episode_end(self, end: np.ndarray) -> None:
        pass


class ActorCriticPolicy:
    """Samples from softmax(logits) of the actor-critic; carries the LSTM state across steps
    and rollouts and zeroes it where an episode ended (A3C LSTM, §5.1)."""

    UNIFORMS_PER_DRAW = 256    # taken from rng in blocks: one call per step is 10 us, cold

    def __init__(self, net: torch.nn.Module, num_envs: int, rng: np.random.Generator):
        self.net, self.rng = net, rng
        self.state = net.initial_state(num_envs)
        self.uniforms, self.uniform_pos = np.zeros(0), 0

    def _next_uniforms(self, n: int) -> np.ndarray:
        if self.uniform_pos + n > len(self.uniforms):
            self.uniforms = self.rng.random(max(self.UNIFORMS_PER_DRAW, n))
            self.uniform_pos = 0
        self.uniform_pos += n
        return self.uniforms[self.uniform_pos - n:self.uniform_pos]

    def act(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits, _, self.state = self.net(torch.from_numpy(obs), self.state)
        return sample_from_logits(logits.numpy(), self._next_uniforms(obs.shape[0]))

    def episode_end(self, end: np.ndarray) -> None:
        self.state = reset_lstm_state(self.state, end)


# ---------------------------------------------------------------------------------------- learner
class AsyncLearner:
    """The gradient of one rollout, for any of the four methods, as the flat vector in pieces
    (one per parameter, see ``ParamLayout.grad_pieces``)."""

    def __init__(self, net: torch.nn.Module, target: torch.nn.Module | None, cfg: Config):
        self.net, self.target, self.cfg = net, target, cfg
        self.layout = ParamLayout.from_module(net)
        self.loss_sum, self.loss_count, self.updates, self.dropped_nonfinite = 0.0, 0, 0, 0
        self.sq_norm = 0.0

    def loss(self, rollout: Rollout, a_next: np.ndarray | None = None) -> torch.Tensor:
        """Summed loss of the rollout's transitions (the paper accumulates their gradients)."""
        if self.cfg.algo == "a3c":
            logits, values, v_t = actor_critic_outputs(self.net, rollout)
            returns = bootstrap_returns(rollout.r_t, rollout.discount_t,
                                        rollout_cuts(rollout.end_t), v_t, self.cfg.gamma)
            out = a3c_loss(logits, values, torch.from_numpy(rollout.a_tm1),
                           torch.from_numpy(returns), self.cfg.entropy_beta, self.cfg.value_coef)
            return out["total"]
        T, N = rollout.a_tm1.shape
        with torch.no_grad():
            q_t = self.target(torch.from_numpy(_flat_batch(rollout.s_t))).numpy()
        y = value_targets(self.cfg.algo, rollout, q_t.reshape(T, N, -1), self.cfg.gamma, a_next)
        q_tm1 = self.net(torch.from_numpy(_flat_batch(rollout.s_tm1)))
        q_a = q_tm1.gather(1, torch.from_numpy(rollout.a_tm1.reshape(-1, 1))).squeeze(1)
        td = torch.from_numpy(y.reshape(-1)) - q_a
        return dqn_loss(td, self.cfg.loss) * td.shape[0]

    def gradient(self, rollout: Rollout, a_next: np.ndarray | None = None
                 ) -> list[np.ndarray] | None:
        """Norm-clipped gradient of `loss` in pieces (valid until the next call), or None if it
        is not finite.

        Backward writes fresh ``.grad`` tensors (``set_to_none``) that are pushed as they are:
        accumulating into a zeroed flat buffer instead cost 0.45 ms more per A3C Pong rollout
        (zeroing 2.7 MB, then an add where a fresh tensor is simply kept).
        """
        loss = self.loss(rollout, a_next)
        value = float(loss.detach())
        if not np.isfinite(value):
            self.dropped_nonfinite += 1
            return None
        self.net.zero_grad(set_to_none=True)
        loss.backward()
        grad = self.layout.grad_pieces(self.net)
        norm = clip_by_global_norm(grad, self.cfg.grad_clip_norm)
        if not np.isfinite(norm):
            self.dropped_nonfinite += 1
            return None
        clipped = min(norm, self.cfg.grad_clip_norm) if self.cfg.grad_clip_norm > 0 else norm
        self.sq_norm = clipped * clipped          # of the gradient returned; push tells the ps
        self.loss_sum += value
        self.loss_count += 1
        self.updates += 1
        return grad


class PhaseClock:
    """Cumulative seconds one actor-learner spends in each phase of its bound.

    ``bench scaling`` divides an actor-learner's agent steps/s by its bound, 1 / (env step +
    batch-1 forward + rollout gradient / steps per rollout). Timed here, inside the running
    loop, the bound is measured in the same process and over the same seconds as the rate, so
    a machine that changes speed between two measurements cannot move the ratio (timings in a
    separate process moved by +-8 % from run to run). What the loop does beyond the three
    phases (pull, push, counters, rollout bookkeeping, action sampling) is the gap.

    Appends ``{"t", "agent_steps", "env_s", "forward_s", "learn_s"}`` (cumulative) to a JSON
    Lines file at most every ``every_s`` seconds of wall time.
    """

    PHASES = ("env", "forward", "learn")

    def __init__(self, path, every_s: float = 2.0):
        self._now, self.path, self.every_s = time.perf_counter, path, every_s
        self.seconds = dict.fromkeys(self.PHASES, 0.0)
        self._last_write = -float("inf")
        path.parent.mkdir(parents=True, exist_ok=True)

    def timed(self, phase: str, fn: Callable) -> Callable:
        """``fn`` wrapped so that its calls add to ``phase``."""
        def wrapper(*args, **kwargs):
            t0 = self._now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += self._now() - t0
        return wrapper

    def maybe_write(self, agent_steps: int, force: bool = False) -> None:
        if not force and self._now() - self._last_write < self.every_s:
            return
        self._last_write = self._now()
        row = {"t": time.time(), "agent_steps": agent_steps,
               **{f"{k}_s": v for k, v in self.seconds.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def phase_fraction(first: dict, last: dict) -> dict:
    """Agent steps/s between two :class:`PhaseClock` rows, its bound and their ratio."""
    steps = last["agent_steps"] - first["agent_steps"]
    busy = sum(last[f"{k}_s"] - first[f"{k}_s"] for k in PhaseClock.PHASES)
    wall = last["t"] - first["t"]
    return {"steps_per_s": steps / wall, "bound_steps_per_s": steps / busy,
            "fraction": busy / wall, "window_s": wall,
            **{f"{k}_ms_per_step": 1e3 * (last[f"{k}_s"] - first[f"{k}_s"]) / steps
               for k in PhaseClock.PHASES}}


def _flat_batch(x: np.ndarray) -> np.ndarray:
    """[T, N, *obs] -> [T * N, *obs]."""
    return x.reshape((-1,) + x.shape[2:])


def target_refresh_due(steps_after: int, num_steps: int, every: int) -> bool:
    """Whether adding ``num_steps`` to the global step counter (now ``steps_after``) crossed a
    multiple of ``every`` (I_target): exactly one rank's addition crosses each multiple."""
    return steps_after // every > (steps_after - num_steps) // every


# ---------------------------------------------------------------------------------------- MPI loop
def _policy_state(policy) -> dict:
    out = {"rng": generator_state_to_array(policy.rng)}
    if isinstance(policy, EpsilonGreedyPolicy):
        out.update(final_epsilons=policy.final_epsilons, local_frames=np.int64(policy.local_frames))
    else:
        out.update(uniforms=policy.uniforms.copy(), uniform_pos=np.int64(policy.uniform_pos))
        if policy.state is not None:                     # LSTM (h, c)
            out.update(h=policy.state[0].numpy().copy(), c=policy.state[1].numpy().copy())
    return out


def _set_policy_state(policy, state: dict) -> None:
    generator_state_from_array(policy.rng, state["rng"])
    if isinstance(policy, EpsilonGreedyPolicy):
        policy.final_epsilons = np.array(state["final_epsilons"])
        policy.schedules = [LinearSchedule(1.0, e, policy.schedules[0].duration)
                            for e in policy.final_epsilons]
        policy.local_frames = int(state["local_frames"])
    else:
        if "uniforms" in state:
            policy.uniforms = np.array(state["uniforms"], np.float64)
            policy.uniform_pos = int(state["uniform_pos"])
        if "h" in state:
            policy.state = (torch.from_numpy(np.array(state["h"])),
                            torch.from_numpy(np.array(state["c"])))


def evaluate(net: torch.nn.Module, cfg: Config, seed: int, rng: np.random.Generator) -> list:
    """Evaluation episodes (:func:`hpcrl.gorila.evaluate`): epsilon-greedy at ``eval_epsilon``
    on Q for the value methods (the DQN protocol: their training episodes mix in exploration up
    to epsilon 0.5, so they do not show what was learned), sampling from the policy for A3C
    (its LSTM state reset per episode)."""
    from hpcrl.gorila import evaluate as play

    policy = None if cfg.algo in VALUE_METHODS else ActorCriticPolicy(net, 1, rng)
    return play(net, cfg, seed, rng, policy)


def run_actor_learner(ctx: Context) -> None:
    """Act, compute the rollout gradient, push, pull; until the global frame budget is spent
    or a coordinated checkpoint says stop."""
    cfg, store = ctx.cfg, ctx.store
    torch.manual_seed(ctx.seed)
    rng = np.random.default_rng(ctx.seed)
    link = ctx.link()
    n_env = cfg.envs_per_actor
    env = make_env(cfg.game, n_env, ctx.seed, **env_kwargs(cfg, training=True))
    net = build_network(cfg, env.obs_shape, env.num_actions)
    value_method = cfg.algo in VALUE_METHODS
    target = build_network(cfg, env.obs_shape, env.num_actions) if value_method else None
    learner = AsyncLearner(net, target, cfg)
    layout = learner.layout
    theta = np.empty(layout.size, np.float32)
    theta_target = np.empty(layout.size, np.float32)
    layout.bind(net, theta)                                 # pulls write the nets directly
    if target is not None:
        layout.bind(target, theta_target)
    if value_method:
        policy = EpsilonGreedyPolicy(net, n_env, cfg.anneal_frames, env.frames_per_step, rng)
    else:
        policy = ActorCriticPolicy(net, n_env, rng)
    frames_per_step = env.frames_per_step * n_env
    global_frames = store.read_word(0, FRAMES)              # > 0 after a resume
    # The shared frame counter takes one atomic add per rollout, not per step (each is a
    # lock-protected RMA atomic on the ps; 3 ranks on 2 cores made them ~60 us apiece). An
    # episode is stamped with the last counter value this rank saw plus its own frames since.
    rollout_frames = 0

    def on_step(res: StepResult) -> None:
        nonlocal rollout_frames
        rollout_frames += frames_per_step
        for i in np.flatnonzero(res.episode_end):
            link.episode(global_frames + rollout_frames, float(res.episode_return[i]),
                         int(res.episode_frames[i]))

    obs = env.reset()
    a_next = None
    rollouts = 0
    frames_per_rollout = cfg.t_max * frames_per_step
    # This rank evaluates every eval_every_frames of its own frames (no evaluator ranks here).
    next_eval = cfg.eval_every_frames if cfg.eval_every_frames > 0 else -1
    if ctx.state:
        st = ctx.state
        env.set_state(sub_state(st, "env"))
        obs = np.array(st["obs"])
        _set_policy_state(policy, sub_state(st, "policy"))
        torch.set_rng_state(torch.from_numpy(np.array(st["torch_rng"])))
        a_next = np.array(st["a_next"]) if "a_next" in st else None
        rollouts = int(st["rollouts"])
        next_eval = int(st["next_eval"]) if "next_eval" in st else next_eval
        learner.loss_sum, learner.loss_count = float(st["loss_sum"]), int(st["loss_count"])
        learner.updates, learner.dropped_nonfinite = int(st["updates"]), int(st["dropped_nonfinite"])

    def checkpoint_state() -> dict:
        out = {**with_prefix("env", env.get_state()), "obs": obs.copy(),
               **with_prefix("policy", _policy_state(policy)),
               "torch_rng": torch.get_rng_state().numpy().copy(), "rollouts": np.int64(rollouts),
               "next_eval": np.int64(next_eval),
               "loss_sum": np.float64(learner.loss_sum), "loss_count": np.int64(learner.loss_count),
               "updates": np.int64(learner.updates),
               "dropped_nonfinite": np.int64(learner.dropped_nonfinite)}
        if a_next is not None:
            out["a_next"] = np.asarray(a_next)
        return out

    def send_stats() -> None:
        link.stats(learner.loss_sum, learner.loss_count, learner.updates, 0,
                   learner.dropped_nonfinite)

    clock = None
    if cfg.phase_times:
        clock = PhaseClock(ctx.run_dir / "phase_times" / f"rank-{ctx.rank}.jsonl")
        env.step = clock.timed("env", env.step)
        policy.net = clock.timed("forward", policy.net)
        learner.gradient = clock.timed("learn", learner.gradient)
    versions = store.pull(theta)
    target_version = -1
    while True:
        if ctx.coord.due():
            send_stats()
            if ctx.client_checkpoint(link, checkpoint_state):
                break
            versions = store.pull(theta)
        if global_frames >= cfg.total_frames:
            ctx.coord.request(STOP_BUDGET)
            continue
        if value_method:
            tv = store.read_word(0, TV)
            if tv != target_version:
                store.pull_target(theta_target)
                target_version = tv
        rollout, obs = collect_rollout(env, obs, policy, cfg.t_max, on_step, a_next)
        global_frames = store.add_global(FRAMES, rollout_frames)
        rollout_frames = 0
        if cfg.algo == "one_step_sarsa":
            a_next = policy.act(obs)              # a' in s_T, taken first in the next rollout
        grad = learner.gradient(rollout, a_next)
        if grad is not None:
            store.push(grad, versions, learning_rate(cfg, global_frames), learner.sq_norm)
        if value_method:                      # the shared step counter of I_target
            num_steps = cfg.t_max * n_env
            steps_after = store.add_global(STEPS, num_steps)
            if target_refresh_due(steps_after, num_steps, cfg.target_update_every):
                store.request_target_refresh()
        versions = store.pull(theta)
        rollouts += 1
        if clock is not None:
            clock.maybe_write(rollouts * cfg.t_max * n_env)
        if rollouts % 64 == 0:
            send_stats()
        if 0 <= next_eval <= rollouts * frames_per_rollout:
            for ret, length in evaluate(net, cfg, ctx.seed + next_eval, rng):
                link.episode(global_frames, ret, length, eval_=True)
            next_eval += cfg.eval_every_frames
    env.close()
