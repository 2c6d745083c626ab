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

import time

import numpy as np
import torch

from hpcrl import watchdog
from hpcrl.config import Config
from hpcrl.envs import make_env
from hpcrl.losses import dqn_loss, q_learning_td
from hpcrl.networks import ParamLayout
from hpcrl.params.store import FRAMES, TV, ParameterStore
from hpcrl.topology import Role
from hpcrl.policies import LinearSchedule, LossOutlierFilter, epsilon_greedy, learning_rate
from hpcrl.coord import STOP_BUDGET
from hpcrl.program import ClientLink, Context, build_network, env_kwargs, sub_state, with_prefix
from hpcrl.replay import (ReplayMemory, frame_layout, generator_state_from_array,
                          generator_state_to_array)


class GorilaLearner:
    """The DQN gradient of one minibatch, as a flat vector, plus the drop rules."""

    def __init__(self, net: torch.nn.Module, target: torch.nn.Module, cfg: Config):
        self.net, self.target, self.cfg = net, target, cfg
        self.layout = ParamLayout.from_module(net)
        self.grad = np.zeros(self.layout.size, np.float32)
        self.layout.bind_grads(net, self.grad)          # backward() writes the flat gradient
        self.outliers = LossOutlierFilter(cfg.outlier_k) if cfg.outlier_k > 0 else None
        self.loss_sum, self.loss_count, self.updates = 0.0, 0, 0
        self.dropped_outlier = self.dropped_nonfinite = 0

    def get_state(self) -> dict:
        state = {"loss_sum": np.float64(self.loss_sum), "loss_count": np.int64(self.loss_count),
                 "updates": np.int64(self.updates),
                 "dropped_outlier": np.int64(self.dropped_outlier),
                 "dropped_nonfinite": np.int64(self.dropped_nonfinite)}
        if self.outliers is not None:
            state.update(with_prefix("outliers", self.outliers.get_state()))
        return state

    def set_state(self, state: dict) -> None:
        self.loss_sum, self.loss_count = float(state["loss_sum"]), int(state["loss_count"])
        self.updates = int(state["updates"])
        self.dropped_outlier = int(state["dropped_outlier"])
        self.dropped_nonfinite = int(state["dropped_nonfinite"])
        if self.outliers is not None and sub_state(state, "outliers"):
            self.outliers.set_state(sub_state(state, "outliers"))

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
        if not np.isfinite(self.grad.sum(dtype=np.float64)):
            self.dropped_nonfinite += 1
            return None
        self.updates += 1
        return self.grad


def evaluate(net: torch.nn.Module, cfg: Config, seed: int, rng: np.random.Generator,
             policy=None) -> list:
    """``eval_episodes`` episodes with epsilon ``eval_epsilon``, no clipping, no life-loss
    terminals, no-op starts and the episode cap (Mnih et al. 2015 evaluation protocol).

    ``policy`` (``act(obs) -> actions``, ``episode_end(end)``) replaces epsilon-greedy on
    ``net``'s Q-values: A3C evaluates by sampling its actor-critic.

    Returns:
        (return, length in frames) of each episode.
    """
    env = make_env(cfg.game, 1, seed, **env_kwargs(cfg, training=False))
    obs, results = env.reset(), []
    while len(results) < cfg.eval_episodes:
        watchdog.beat()
        if policy is None:
            with torch.no_grad():
                q = net(torch.from_numpy(obs)).numpy()
            actions = epsilon_greedy(q, cfg.eval_epsilon, rng)
        else:
            actions = policy.act(obs)
        res = env.step(np.asarray(actions))
        if policy is not None:
            policy.episode_end(res.episode_end)
        if res.episode_end[0]:
            results.append((float(res.episode_return[0]), int(res.episode_frames[0])))
        obs = res.obs
    env.close()
    return results


class LocalReplaySink:
    """Where a bundle's actor writes: one local replay memory per environment."""

    def __init__(self, replays: list[ReplayMemory]):
        self.replays = replays

    def first(self, i: int, frame: np.ndarray) -> None:
        self.replays[i].add_first(frame)

    def add(self, i: int, action: int, reward: float, terminal: bool, frame: np.ndarray) -> None:
        self.replays[i].add(action, reward, terminal, frame)

    def flush(self) -> None:
        pass


class Actor:
    """Epsilon-greedy acting with a behaviour copy of the Q-network (Gorila's actor).

    Pulls the parameters every ``actor_sync_every`` agent steps, writes each step to ``sink``
    (local replay or a global-replay sender), reports finished episodes and runs the periodic
    evaluation between steps.
    """

    def __init__(self, cfg: Config, rank: int, store: ParameterStore, link: ClientLink, sink,
                 env=None, net: torch.nn.Module | None = None):
        self.cfg, self.rank, self.store, self.link, self.sink = cfg, rank, store, link, sink
        self.rng = np.random.default_rng(cfg.seed + 1000 * rank)
        self.env = env or make_env(cfg.game, cfg.envs_per_actor, cfg.seed + 1000 * rank,
                                   **env_kwargs(cfg, training=True))
        self.net = net or build_network(cfg, self.env.obs_shape, self.env.num_actions)
        self.layout = ParamLayout.from_module(self.net)
        self.theta = np.empty(self.layout.size, np.float32)
        self.layout.bind(self.net, self.theta)          # a pull into theta updates the net
        self.epsilon = LinearSchedule(cfg.epsilon_start, cfg.epsilon_end, cfg.epsilon_frames)
        self.image = len(self.env.obs_shape) == 3
        self.frames_per_step = self.env.frames_per_step * self.env.num_envs
        self.local_frames = self.steps = 0
        self.global_frames = store.read_word(0, FRAMES)   # > 0 after a resume
        # Actors evaluate between training steps only when no evaluator ranks do it.
        self.next_eval = (cfg.eval_every_frames or None) if cfg.n_evaluators == 0 else None
        self.obs = self.env.reset()
        for i in range(self.env.num_envs):
            sink.first(i, self._newest(self.obs[i]))
        self.sync()

    def get_state(self) -> dict:
        """Environment (emulators included), observation, RNG and schedule position."""
        return {**with_prefix("env", self.env.get_state()), "obs": self.obs.copy(),
                "rng": generator_state_to_array(self.rng),
                "local_frames": np.int64(self.local_frames), "steps": np.int64(self.steps),
                "next_eval": np.int64(-1 if self.next_eval is None else self.next_eval)}

    def set_state(self, state: dict) -> None:
        self.env.set_state(sub_state(state, "env"))
        self.obs = np.array(state["obs"])
        generator_state_from_array(self.rng, state["rng"])
        self.local_frames, self.steps = int(state["local_frames"]), int(state["steps"])
        self.next_eval = None if int(state["next_eval"]) < 0 else int(state["next_eval"])

    def restart_streams(self) -> None:
        """After a resume without replay contents: start new replay episodes at the current
        observation, so that stacking never reaches into frames that were not restored."""
        for i in range(self.env.num_envs):
            self.sink.first(i, self._newest(self.obs[i]))

    def _newest(self, obs: np.ndarray) -> np.ndarray:
        return obs[-1] if self.image else obs

    def sync(self) -> None:
        self.versions = self.store.pull(self.theta)

    def step(self) -> int:
        """One agent step in every environment; returns the global frame count after it."""
        if self.steps % self.cfg.actor_sync_every == 0 and self.steps:
            self.sync()
        with torch.no_grad():
            q = self.net(torch.from_numpy(self.obs)).numpy()
        actions = np.asarray(epsilon_greedy(q, self.epsilon.value(self.local_frames), self.rng))
        res = self.env.step(actions)
        self.steps += 1
        self.local_frames += self.frames_per_step
        self.global_frames = self.store.add_global(FRAMES, self.frames_per_step)
        for i in range(self.env.num_envs):
            self.sink.add(i, int(actions[i]), float(res.reward[i]), bool(res.terminal[i]),
                          res.last_frame[i])
            if res.episode_end[i]:
                self.sink.first(i, self._newest(res.obs[i]))
                self.link.episode(self.global_frames, float(res.episode_return[i]),
                                  int(res.episode_frames[i]))
        self.obs = res.obs
        if self.next_eval is not None and self.local_frames >= self.next_eval:
            self.next_eval += self.cfg.eval_every_frames
            seed = self.cfg.seed + 1000 * self.rank + self.steps
            for ret, length in evaluate(self.net, self.cfg, seed, self.rng):
                self.link.episode(self.global_frames, ret, length, eval_=True)
        return self.global_frames


class TargetTracker:
    """Keeps a learner's target network equal to the store's target copy (pulled on change)."""

    def __init__(self, store: ParameterStore, target: torch.nn.Module, layout: ParamLayout):
        self.store, self.target, self.layout = store, target, layout
        self.theta = np.empty(layout.size, np.float32)
        layout.bind(target, self.theta)
        self.version = -1

    def refresh(self) -> None:
        tv = self.store.read_word(0, TV)
        if tv != self.version:
            self.store.pull_target(self.theta)
            self.version = tv


def _send_stats(link: ClientLink, learner: GorilaLearner) -> None:
    link.stats(learner.loss_sum, learner.loss_count, learner.updates, learner.dropped_outlier,
               learner.dropped_nonfinite)


def _torch_rng_state() -> np.ndarray:
    return torch.get_rng_state().numpy().copy()


def _restore_common(ctx: Context, actor: "Actor | None", learner: "GorilaLearner | None") -> dict:
    """Restore what every Gorila client checkpoints; returns this rank's state (or {})."""
    state = ctx.state or {}
    if state:
        torch.set_rng_state(torch.from_numpy(np.array(state["torch_rng"])))
        if actor is not None:
            actor.set_state(sub_state(state, "actor"))
        if learner is not None:
            learner.set_state(sub_state(state, "learner"))
    return state


def _common_state(actor: "Actor | None", learner: "GorilaLearner | None") -> dict:
    state = {"torch_rng": _torch_rng_state()}
    if actor is not None:
        state.update(with_prefix("actor", actor.get_state()))
    if learner is not None:
        state.update(with_prefix("learner", learner.get_state()))
    return state


def run_bundle(ctx: Context) -> None:
    """Gorila bundled mode: act, store locally, learn and push until the frame budget is spent
    (or a coordinated checkpoint says stop)."""
    cfg, store = ctx.cfg, ctx.store
    torch.manual_seed(ctx.seed)
    link = ctx.link()
    n_env = cfg.envs_per_actor
    env = make_env(cfg.game, n_env, ctx.seed, **env_kwargs(cfg, training=True))
    stack, frame_shape, dtype = frame_layout(env.obs_shape)
    replays = [ReplayMemory(max(cfg.replay_capacity // n_env, 1), frame_shape, dtype, stack,
                            ctx.seed + i)
               for i in range(n_env)]
    actor = Actor(cfg, ctx.rank, store, link, LocalReplaySink(replays), env=env)
    target = build_network(cfg, env.obs_shape, env.num_actions)
    learner = GorilaLearner(actor.net, target, cfg)
    targets = TargetTracker(store, target, learner.layout)
    state = _restore_common(ctx, actor, learner)
    if state:
        if sub_state(state, "replay0") is not None:
            for i, replay in enumerate(replays):
                replay.set_state(sub_state(state, f"replay{i}"))
        else:
            actor.restart_streams()

    def checkpoint_state() -> dict:
        out = _common_state(actor, learner)
        if cfg.checkpoint_replay:
            for i, replay in enumerate(replays):
                out.update(with_prefix(f"replay{i}", replay.get_state()))
        return out

    min_fill = max(cfg.replay_min_fill // n_env, cfg.batch_size)
    rng = actor.rng
    while True:
        if ctx.coord.due():
            _send_stats(link, learner)
            if ctx.client_checkpoint(link, checkpoint_state):
                break
            actor.sync()                      # parameters may have moved during the pause
        if actor.global_frames >= cfg.total_frames:
            ctx.coord.request(STOP_BUDGET)    # the final generation, then stop
            continue
        actor.step()
        if actor.steps % cfg.update_every or min(r.size for r in replays) < min_fill:
            continue
        if learner.updates % cfg.learner_sync_every == 0:
            actor.sync()
        targets.refresh()
        grad = learner.gradient(replays[int(rng.integers(n_env))].sample(cfg.batch_size))
        if grad is not None:
            store.push(grad, actor.versions, learning_rate(cfg, actor.global_frames))
        if actor.steps % 64 == 0:
            _send_stats(link, learner)
    env.close()


def run_actor(ctx: Context) -> None:
    """Gorila split mode, actor: act and ship transitions to a global replay rank."""
    from hpcrl.replay_server import ChunkSender

    cfg = ctx.cfg
    torch.manual_seed(ctx.seed)
    link = ctx.link()
    replay_ranks = ctx.layout.ranks_of(Role.REPLAY)
    sink = ChunkSender(ctx.rcomm, replay_ranks, ctx.layout.index_in_role(ctx.rank))
    actor = Actor(cfg, ctx.rank, ctx.store, link, sink)
    if _restore_common(ctx, actor, None):
        sink.rows.clear()                     # the replay rank restored its own streams
    while True:
        if ctx.coord.due():
            if ctx.client_checkpoint(link, lambda: _common_state(actor, None), sink.marker):
                break
            actor.sync()
        if actor.global_frames >= cfg.total_frames:
            ctx.coord.request(STOP_BUDGET)
            continue
        actor.step()
    actor.env.close()


def run_learner(ctx: Context) -> None:
    """Gorila split mode, learner: sample global replay, compute and push DQN gradients."""
    from hpcrl.program import env_spec
    from hpcrl.replay_server import BatchClient

    cfg, store = ctx.cfg, ctx.store
    torch.manual_seed(ctx.seed)
    link = ctx.link()
    obs_shape, num_actions = env_spec(cfg)
    net = build_network(cfg, obs_shape, num_actions)
    target = build_network(cfg, obs_shape, num_actions)
    learner = GorilaLearner(net, target, cfg)
    targets = TargetTracker(store, target, learner.layout)
    theta = np.empty(learner.layout.size, np.float32)
    learner.layout.bind(net, theta)
    stack, frame_shape, dtype = frame_layout(obs_shape)
    client = BatchClient(ctx.rcomm, ctx.layout.ranks_of(Role.REPLAY), ctx.seed,
                         (stack,) + frame_shape, dtype)
    state = _restore_common(ctx, None, learner)
    if state:
        generator_state_from_array(client.rng, state["client_rng"])

    def checkpoint_state() -> dict:
        return {**_common_state(None, learner), "client_rng": generator_state_to_array(client.rng)}

    versions = None
    while True:
        if ctx.coord.due():
            _send_stats(link, learner)
            if ctx.client_checkpoint(link, checkpoint_state, client.marker):
                break
            versions = None
        if store.read_word(0, FRAMES) >= cfg.total_frames:
            ctx.coord.request(STOP_BUDGET)
            time.sleep(0.001)
            continue
        batch = client.sample(cfg.batch_size)
        if batch is None:                       # replay not filled yet
            time.sleep(0.01)
            continue
        if versions is None or learner.updates % cfg.learner_sync_every == 0:
            versions = store.pull(theta)
        targets.refresh()
        grad = learner.gradient(batch)
        if grad is not None:
            store.push(grad, versions, learning_rate(cfg, store.read_word(0, FRAMES)))
        if learner.updates % 64 == 0:
            _send_stats(link, learner)


def run_evaluator(ctx: Context) -> None:
    """Evaluator rank: every ``eval_every_frames`` global frames, pull the current parameters and
    play ``eval_episodes`` evaluation episodes (recorded in the ``eval`` group)."""
    from hpcrl.program import env_spec

    cfg, store = ctx.cfg, ctx.store
    torch.manual_seed(ctx.seed)
    rng = np.random.default_rng(ctx.seed)
    link = ctx.link()
    obs_shape, num_actions = env_spec(cfg)
    net = build_network(cfg, obs_shape, num_actions)
    layout = ParamLayout.from_module(net)
    theta = np.empty(layout.size, np.float32)
    layout.bind(net, theta)
    every = cfg.eval_every_frames or cfg.total_frames
    next_eval, rounds = every, 0
    if ctx.state:
        generator_state_from_array(rng, ctx.state["rng"])
        next_eval, rounds = int(ctx.state["next_eval"]), int(ctx.state["rounds"])

    def checkpoint_state() -> dict:
        return {"rng": generator_state_to_array(rng), "next_eval": np.int64(next_eval),
                "rounds": np.int64(rounds)}

    while True:
        if ctx.coord.due():
            if ctx.client_checkpoint(link, checkpoint_state):
                break
        frames = store.read_word(0, FRAMES)
        if frames >= cfg.total_frames:
            ctx.coord.request(STOP_BUDGET)
        if frames < next_eval or frames >= cfg.total_frames:
            time.sleep(0.05)
            continue
        store.pull(theta)
        for ret, length in evaluate(net, cfg, ctx.seed + rounds, rng):
            link.episode(frames, ret, length, eval_=True)
        rounds += 1
        next_eval = (frames // every + 1) * every
