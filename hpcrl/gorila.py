"""Gorila actor/learner bundle (Nair et al. 2015, "Massively Parallel Methods for Deep RL").

A bundle is one rank holding an actor, its local replay memory and a learner (the paper's main
configuration, §4). The actor acts epsilon-greedily with a behaviour copy of the Q-network that it
pulls from the parameter store every ``actor_sync_every`` agent steps (1 = the paper's "before
every acting step"). Every ``update_every`` agent steps, once the replay holds
``replay_min_fill`` transitions, the learner refreshes its Q-network from the store (every
``learner_sync_every`` updates) and its target network from the store's target copy when the ps
has refreshed it, samples a minibatch, computes the DQN gradient and pushes it, tagged with the
parameter versions it was computed from, instead of applying it. The learner drops gradients
whose loss is an outlier (|loss| > running mean + k std) or non-finite, and counts both; the ps
drops stale ones.

Actor and learner share one network object: the learner's pulls also refresh the behaviour
policy, which only makes the actor's parameters fresher than ``actor_sync_every`` requires.
"""

from __future__ import annotations

import numpy as np
import torch

from hpcrl.config import Config
from hpcrl.envs import make_env
from hpcrl.losses import dqn_loss, q_learning_td
from hpcrl.networks import ParamLayout
from hpcrl.params.store import FRAMES, TV, ParameterStore
from hpcrl.policies import LinearSchedule, LossOutlierFilter, epsilon_greedy
from hpcrl.program import ClientLink, build_network, env_kwargs
from hpcrl.replay import ReplayMemory


class GorilaLearner:
    """The DQN gradient of one minibatch, as a flat vector, plus the drop rules."""

    def __init__(self, net: torch.nn.Module, target: torch.nn.Module, cfg: Config):
        self.net, self.target, self.cfg = net, target, cfg
        self.layout = ParamLayout.from_module(net)
        self.grad = np.zeros(self.layout.size, np.float32)
        self.outliers = LossOutlierFilter(cfg.outlier_k) if cfg.outlier_k > 0 else None
        self.loss_sum, self.loss_count, self.updates = 0.0, 0, 0
        self.dropped_outlier = self.dropped_nonfinite = 0

    def gradient(self, batch) -> np.ndarray | None:
        """Flat gradient of the DQN loss on ``batch``, or None if the rules drop it."""
        s_tm1 = torch.from_numpy(batch.s_tm1)
        s_t = torch.from_numpy(batch.s_t)
        if s_tm1.ndim == 3 and s_tm1.shape[1] == 1:      # vector obs stored with stack 1
            s_tm1, s_t = s_tm1[:, 0], s_t[:, 0]
        q_tm1 = self.net(s_tm1)
        with torch.no_grad():
            q_t = self.target(s_t)
        td = q_learning_td(q_tm1, torch.from_numpy(batch.a_tm1), torch.from_numpy(batch.r_t),
                           torch.from_numpy(batch.discount_t), q_t, self.cfg.gamma)
        loss = dqn_loss(td, self.cfg.loss)
        value = float(loss.detach())
        if not np.isfinite(value):
            self.dropped_nonfinite += 1
            return None
        self.loss_sum += value
        self.loss_count += 1
        if self.outliers is not None and not self.outliers.accept(value):
            self.dropped_outlier += 1
            return None
        self.net.zero_grad(set_to_none=False)
        loss.backward()
        self.layout.grads_to_flat(self.net, self.grad)
        if not np.isfinite(self.grad.sum(dtype=np.float64)):
            self.dropped_nonfinite += 1
            return None
        self.updates += 1
        return self.grad


def evaluate(net: torch.nn.Module, cfg: Config, seed: int, rng: np.random.Generator) -> list:
    """``eval_episodes`` episodes with epsilon ``eval_epsilon``, no clipping, no life-loss
    terminals, no-op starts and the episode cap (Mnih et al. 2015 evaluation protocol).

    Returns:
        (return, length in frames) of each episode.
    """
    env = make_env(cfg.game, 1, seed, **env_kwargs(cfg, training=False))
    obs, results = env.reset(), []
    while len(results) < cfg.eval_episodes:
        with torch.no_grad():
            q = net(torch.from_numpy(obs)).numpy()
        res = env.step(np.asarray(epsilon_greedy(q, cfg.eval_epsilon, rng)))
        if res.episode_end[0]:
            results.append((float(res.episode_return[0]), int(res.episode_frames[0])))
        obs = res.obs
    env.close()
    return results


def run_bundle(store: ParameterStore, cfg: Config, mcomm, rank: int) -> None:
    """Act, store, learn and push until the global frame budget is spent."""
    torch.manual_seed(cfg.seed + 1000 * rank)
    rng = np.random.default_rng(cfg.seed + 1000 * rank)
    link = ClientLink(mcomm, rank)
    n_env = cfg.envs_per_actor
    env = make_env(cfg.game, n_env, cfg.seed + 1000 * rank, **env_kwargs(cfg, training=True))
    net = build_network(cfg, env.obs_shape, env.num_actions)
    target = build_network(cfg, env.obs_shape, env.num_actions)
    learner = GorilaLearner(net, target, cfg)
    layout = learner.layout
    theta = np.empty(layout.size, np.float32)
    theta_target = np.empty(layout.size, np.float32)
    stack = env.obs_shape[0] if len(env.obs_shape) == 3 else 1
    frame_dtype = np.uint8 if len(env.obs_shape) == 3 else np.float32
    replays = [ReplayMemory(max(cfg.replay_capacity // n_env, 1), env.frame_shape, frame_dtype,
                            stack, cfg.seed + 1000 * rank + i) for i in range(n_env)]
    min_fill = max(cfg.replay_min_fill // n_env, cfg.batch_size)
    epsilon = LinearSchedule(cfg.epsilon_start, cfg.epsilon_end, cfg.epsilon_frames)

    obs = env.reset()
    for i, replay in enumerate(replays):
        replay.add_first(obs[i, -1] if stack > 1 else obs[i])
    versions = store.pull(theta)
    layout.from_flat(net, theta)
    target_version = -1
    frames_per_step = env.frames_per_step * n_env
    local_frames, step, global_frames = 0, 0, 0
    next_eval = cfg.eval_every_frames or None
    while global_frames < cfg.total_frames:
        if step % cfg.actor_sync_every == 0 and step:
            versions = store.pull(theta)
            layout.from_flat(net, theta)
        with torch.no_grad():
            q = net(torch.from_numpy(obs)).numpy()
        actions = epsilon_greedy(q, epsilon.value(local_frames), rng)
        res = env.step(np.asarray(actions))
        step += 1
        local_frames += frames_per_step
        global_frames = store.add_global(FRAMES, frames_per_step)
        for i, replay in enumerate(replays):
            replay.add(int(actions[i]), float(res.reward[i]), bool(res.terminal[i]),
                       res.last_frame[i])
            if res.episode_end[i]:
                replay.add_first(res.obs[i, -1] if stack > 1 else res.obs[i])
                link.episode(global_frames, float(res.episode_return[i]),
                             int(res.episode_frames[i]))
        obs = res.obs
        if next_eval is not None and local_frames >= next_eval:
            next_eval += cfg.eval_every_frames
            for ret, length in evaluate(net, cfg, cfg.seed + 1000 * rank + step, rng):
                link.episode(global_frames, ret, length, eval_=True)
        if step % cfg.update_every or min(r.size for r in replays) < min_fill:
            continue
        if learner.updates % cfg.learner_sync_every == 0:
            versions = store.pull(theta)
            layout.from_flat(net, theta)
        tv = store.read_word(0, TV)
        if tv != target_version:
            store.pull_target(theta_target)
            layout.from_flat(target, theta_target)
            target_version = tv
        grad = learner.gradient(replays[int(rng.integers(n_env))].sample(cfg.batch_size))
        if grad is not None:
            store.push(grad, versions, cfg.learning_rate)
        if step % 64 == 0:
            link.stats(learner.loss_sum, learner.loss_count, learner.updates,
                       learner.dropped_outlier, learner.dropped_nonfinite)
    link.stats(learner.loss_sum, learner.loss_count, learner.updates, learner.dropped_outlier,
               learner.dropped_nonfinite)
    env.close()
    store.done()
    link.end()
