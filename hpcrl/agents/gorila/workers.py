"""Gorila's client roles as workers of the one client loop (:mod:`hpcrl.runtime.client`).

* :class:`BundleWorker`: the paper's main configuration (§4): one rank holds an actor, its
  local replay memory and a learner. Every ``update_every`` agent steps (summed over the
  bundle's ``envs_per_actor`` environments), once the replay holds ``replay_min_fill``
  transitions, the learner refreshes its Q-network from the store (every
  ``learner_sync_every`` updates) and its target network when the ps has refreshed it,
  samples a minibatch (across its environments' memories, one per environment:
  :func:`hpcrl.rl.replay.sample_across`), computes the DQN gradient and pushes it, tagged with
  the parameter versions it was computed from. Actor and learner share one network object:
  the learner's pulls also refresh the behaviour policy.
* :class:`ActorWorker`, :class:`LearnerWorker`: split mode, with global replay ranks.
* :class:`EvaluatorWorker`: evaluation episodes every ``eval_every_frames`` global frames.
"""

from __future__ import annotations

import time

import numpy as np

from hpcrl.agents.base import TargetNetwork, WorkerBase, set_torch_rng_state, torch_rng_state
from hpcrl.agents.evaluation import EvaluationInterrupted, evaluate, final_evaluation, \
    interrupt_at_checkpoint
from hpcrl.agents.gorila.actor import FRAMES_ADDED_EVERY, Actor, LocalReplaySink
from hpcrl.agents.gorila.learner import GorilaLearner
from hpcrl.core import LearnerStats, sub_state, with_prefix
from hpcrl.envs import env_spec, make_env_from_config
from hpcrl.io.rngstate import generator_state_from_array, generator_state_to_array
from hpcrl.rl.networks import build_network
from hpcrl.rl.policies import learning_rate
from hpcrl.rl.replay import ReplayMemory, frame_layout, sample_across
from hpcrl.runtime.context import Context
from hpcrl.runtime.params.header import Word
from hpcrl.runtime.params.layout import bind_parameters
from hpcrl.runtime.replay_server import BatchClient, ChunkSender
from hpcrl.runtime.topology import Role

LEARNER_IDLE_S = 0.01       # a learner waits this long while global replay is filling
LEARNER_PACE_S = 0.002      # a split-mode actor or learner waits this long while it is ahead
                            # of the other side (split_update_every)
EVALUATOR_IDLE_S = 0.05     # an evaluator polls the frame counter this often


def _common_state(actor: Actor | None, learner: GorilaLearner | None) -> dict:
    state = {"torch_rng": torch_rng_state()}
    if actor is not None:
        state.update(with_prefix("actor", actor.get_state()))
    if learner is not None:
        state.update(with_prefix("learner", learner.get_state()))
    return state


def _restore_common(state: dict, actor: Actor | None, learner: GorilaLearner | None) -> None:
    set_torch_rng_state(state["torch_rng"])
    if actor is not None:
        actor.set_state(sub_state(state, "actor"))
    if learner is not None:
        learner.set_state(sub_state(state, "learner"))


def eval_slot(ctx: Context) -> tuple[int, int] | None:
    """(index, count) of this rank among the evaluating ranks, or None if it is not one."""
    ranks = ctx.layout.evaluating_ranks
    return (ranks.index(ctx.rank), len(ranks)) if ctx.rank in ranks else None


class BundleWorker(WorkerBase):
    """Gorila bundled mode: act, store locally, learn and push."""

    def __init__(self, ctx: Context):
        cfg = self.cfg = ctx.cfg
        self.store = ctx.store
        self.n_env = n_env = cfg.envs_per_actor
        self.env = make_env_from_config(cfg, n_env, ctx.seed, training=True)
        stack, frame_shape, dtype = frame_layout(self.env.obs_shape)
        self.replays = [ReplayMemory(max(cfg.replay_capacity // n_env, 1), frame_shape, dtype,
                                     stack, ctx.seed + i, n_step=cfg.n_step, gamma=cfg.gamma)
                        for i in range(n_env)]
        self.actor = Actor(cfg, ctx.rank, ctx.store, ctx.link, LocalReplaySink(self.replays),
                           env=self.env, eval_slot=eval_slot(ctx),
                           eval_interrupt=interrupt_at_checkpoint(ctx.coord.due),
                           frames_added_every=FRAMES_ADDED_EVERY)
        target = build_network(cfg, self.env.obs_shape, self.env.num_actions)
        self.learner = GorilaLearner(self.actor.net, target, cfg)
        self.target = TargetNetwork(ctx.store, target)
        self.min_fill = max(cfg.replay_min_fill // n_env, cfg.batch_size)

    def global_frames(self) -> int:
        return self.actor.global_frames

    def pull_final(self) -> None:
        self.actor.sync()

    def final_evaluation(self, episodes: int, seed: int, on_step) -> list[tuple[float, int]]:
        return final_evaluation(self.actor.net, self.actor.cfg, episodes, seed, on_step)

    def step(self) -> None:
        actor, cfg = self.actor, self.cfg
        actor.step()
        due = updates_due(actor.steps, self.n_env, cfg.update_every)
        if not due or min(r.size for r in self.replays) < self.min_fill:
            return
        for _ in range(due):
            if self.learner.stats.updates % cfg.learner_sync_every == 0:
                actor.sync()
            self.target.refresh()
            batch = sample_across(self.replays, cfg.batch_size, actor.rng)
            grad = self.learner.gradient(batch, self.target.pulls)
            if grad is not None:
                self.store.push(grad, actor.versions, learning_rate(cfg, actor.global_frames),
                                self.learner.sq_norm)

    def stats(self) -> LearnerStats:
        return self.learner.stats

    def before_checkpoint(self) -> None:
        self.actor.add_frames()               # the checkpoint's frame count is the job's

    def after_checkpoint(self) -> None:
        self.actor.after_checkpoint()

    def get_state(self) -> dict:
        out = _common_state(self.actor, self.learner)
        if self.cfg.checkpoint_replay:
            for i, replay in enumerate(self.replays):
                out.update(with_prefix(f"replay{i}", replay.get_state()))
        return out

    def set_state(self, state: dict) -> None:
        _restore_common(state, self.actor, self.learner)
        if sub_state(state, "replay0") is not None:
            for i, replay in enumerate(self.replays):
                replay.set_state(sub_state(state, f"replay{i}"))
        else:
            self.actor.restart_streams()

    def close(self) -> None:
        self.env.close()


def updates_due(acting_steps: int, n_env: int, every: int) -> int:
    """Learner updates a bundle owes after its ``acting_steps``-th batched acting step, at one
    update per ``every`` agent steps summed over its ``n_env`` environments: the replay ratio
    (``batch_size / every`` samples per stored transition) is then the same whatever the
    number of environments. With one environment, one update every ``every`` steps; with
    ``n_env`` a multiple of ``every``, ``n_env / every`` updates after every step."""
    return acting_steps * n_env // every - (acting_steps - 1) * n_env // every


def learners_ahead(applied: int, agent_steps: int, every: int) -> bool:
    """Split mode at one update per ``every`` global agent steps: whether the learners have
    applied their share of updates already (they wait)."""
    return applied >= agent_steps // every


def actors_ahead(agent_steps: int, applied: int, every: int, head_start: int) -> bool:
    """... whether the actors are more than ``head_start`` agent steps (the replay fill plus
    slack) ahead of the updates applied (they wait): the replay ratio then holds whichever
    side is faster. Never before the first update: the replay may need more steps to fill
    than ``head_start`` (episode starts, steps still in the actors' chunks). The two rules
    never hold at once (both would need applied >= steps // every > applied), so the two
    sides cannot wait for each other."""
    return applied > 0 and agent_steps >= head_start + (applied + 1) * every


class ActorWorker(WorkerBase):
    """Gorila split mode, actor: act and ship transitions to a global replay rank."""

    def __init__(self, ctx: Context):
        cfg = ctx.cfg
        self.sink = ChunkSender(ctx.rcomm, ctx.layout.ranks_of(Role.REPLAY),
                                ctx.layout.index_in_role(ctx.rank))
        self.actor = Actor(cfg, ctx.rank, ctx.store, ctx.link, self.sink,
                           eval_slot=eval_slot(ctx),
                           eval_interrupt=interrupt_at_checkpoint(ctx.coord.due))
        self.every = cfg.split_update_every
        n_learners = len(ctx.layout.ranks_of(Role.LEARNER))
        self.head_start = (cfg.replay_min_fill * len(ctx.layout.ranks_of(Role.REPLAY))
                           + 2 * self.every * max(n_learners, 1))
        self.applied = ctx.store.word(Word.APPLIED)

    def global_frames(self) -> int:
        return self.actor.global_frames

    def pull_final(self) -> None:
        self.actor.sync()

    def final_evaluation(self, episodes: int, seed: int, on_step) -> list[tuple[float, int]]:
        return final_evaluation(self.actor.net, self.actor.cfg, episodes, seed, on_step)

    def step(self) -> None:
        if self.every:
            steps = self.actor.global_frames // self.actor.env.frames_per_step
            if actors_ahead(steps, self.applied.read(), self.every, self.head_start):
                time.sleep(LEARNER_PACE_S)
                self.actor.add_frames()       # the learners pace on the counter: nothing
                return                        # of a waiting actor's stays unadded
        self.actor.step()

    def before_checkpoint(self) -> None:
        self.actor.add_frames()
        self.sink.marker()

    def after_checkpoint(self) -> None:
        self.actor.after_checkpoint()

    def get_state(self) -> dict:
        return _common_state(self.actor, None)

    def set_state(self, state: dict) -> None:
        _restore_common(state, self.actor, None)
        self.sink.rows.clear()                # the replay rank restored its own streams

    def close(self) -> None:
        self.actor.env.close()


class LearnerWorker(WorkerBase):
    """Gorila split mode, learner: sample global replay, compute and push DQN gradients."""

    def __init__(self, ctx: Context):
        cfg = self.cfg = ctx.cfg
        self.store = ctx.store
        self.frames = ctx.store.word(Word.FRAMES)
        obs_shape, num_actions = env_spec(cfg)
        net = build_network(cfg, obs_shape, num_actions)
        target = build_network(cfg, obs_shape, num_actions)
        self.learner = GorilaLearner(net, target, cfg)
        self.target = TargetNetwork(ctx.store, target)
        _, self.theta = bind_parameters(net)
        stack, frame_shape, dtype = frame_layout(obs_shape)
        self.client = BatchClient(ctx.rcomm, ctx.layout.ranks_of(Role.REPLAY), ctx.seed,
                                  (stack,) + frame_shape, dtype)
        self.versions = None
        self.applied = ctx.store.word(Word.APPLIED)
        self.frame_skip = cfg.frame_skip if len(obs_shape) == 3 else 1

    def global_frames(self) -> int:
        return self.frames.read()

    def _ahead_of_actors(self) -> bool:
        """With ``split_update_every`` = U: whether the ps has applied its updates for the
        global agent steps so far (the learners then wait for the actors)."""
        return (self.cfg.split_update_every > 0
                and learners_ahead(self.applied.read(), self.frames.read() // self.frame_skip,
                                   self.cfg.split_update_every))

    def step(self) -> None:
        if self._ahead_of_actors():
            time.sleep(LEARNER_PACE_S)
            return
        batch = self.client.sample(self.cfg.batch_size)
        if batch is None:                       # replay not filled yet
            time.sleep(LEARNER_IDLE_S)
            return
        if self.versions is None or self.learner.stats.updates % self.cfg.learner_sync_every == 0:
            self.versions = self.store.pull(self.theta)
        self.target.refresh()
        grad = self.learner.gradient(batch, self.target.pulls)
        if grad is not None:
            self.store.push(grad, self.versions, learning_rate(self.cfg, self.frames.read()),
                            self.learner.sq_norm)

    def stats(self) -> LearnerStats:
        return self.learner.stats

    def before_checkpoint(self) -> None:
        self.client.marker()

    def after_checkpoint(self) -> None:
        self.versions = None

    def get_state(self) -> dict:
        return {**_common_state(None, self.learner),
                "client_rng": generator_state_to_array(self.client.rng)}

    def set_state(self, state: dict) -> None:
        _restore_common(state, None, self.learner)
        generator_state_from_array(self.client.rng, state["client_rng"])


class EvaluatorWorker(WorkerBase):
    """Every ``eval_every_frames`` global frames, pull the current parameters and play
    ``eval_episodes`` evaluation episodes (recorded in the ``eval`` group)."""

    def __init__(self, ctx: Context):
        cfg = self.cfg = ctx.cfg
        self.store, self.link, self.seed = ctx.store, ctx.link, ctx.seed
        self.rng = np.random.default_rng(ctx.seed)
        self.net = build_network(cfg, *env_spec(cfg))
        _, self.theta = bind_parameters(self.net)
        self.frames_word = ctx.store.word(Word.FRAMES)
        self.eval_interrupt = interrupt_at_checkpoint(ctx.coord.due)
        self.every = cfg.eval_every_frames or cfg.total_frames
        self.next_eval, self.rounds, self.frames = self.every, 0, 0

    def global_frames(self) -> int:
        self.frames = self.frames_word.read()
        return self.frames

    def pull_final(self) -> None:
        self.store.pull(self.theta)

    def final_evaluation(self, episodes: int, seed: int, on_step) -> list[tuple[float, int]]:
        return final_evaluation(self.net, self.cfg, episodes, seed, on_step)

    def step(self) -> None:
        if self.frames < self.next_eval:
            time.sleep(EVALUATOR_IDLE_S)
            return
        self.store.pull(self.theta)
        try:
            results = evaluate(self.net, self.cfg, self.seed + self.rounds, self.rng,
                               on_step=self.eval_interrupt)
        except EvaluationInterrupted:           # again after the checkpoint, same seed
            return
        for ret, length in results:
            self.link.episode(self.frames, ret, length, eval_=True)
        self.rounds += 1
        self.next_eval = (self.frames // self.every + 1) * self.every

    def get_state(self) -> dict:
        return {"rng": generator_state_to_array(self.rng), "next_eval": np.int64(self.next_eval),
                "rounds": np.int64(self.rounds)}

    def set_state(self, state: dict) -> None:
        generator_state_from_array(self.rng, state["rng"])
        self.next_eval, self.rounds = int(state["next_eval"]), int(state["rounds"])
