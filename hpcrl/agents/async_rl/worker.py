"""The actor-learner of the asynchronous methods as a worker of the one client loop.

One rank = one actor-learner thread of Mnih et al. 2016: it acts in its own environment(s)
with a copy of the shared parameters theta, computes the gradient of one rollout and hands it
to the parameter store, whose ps ranks apply it with the configured rule (shared RMSProp by
default, paper §S7). Nothing locks the parameters between actor-learners (Hogwild!, as in the
paper): a rank pulls theta after each push, so its gradient was computed from parameters that
other ranks may already have moved.

The value methods share a target network theta- refreshed every ``target_update_every``
*global* agent steps (the paper's I_target): every rank adds its steps to a shared counter and
the rank whose addition crosses a multiple asks the ps to copy theta into theta-; ranks pull
theta- when its version changes. Exploration: each environment samples its final epsilon from
{0.1, 0.01, 0.5} and anneals to it from 1 over ``anneal_frames`` frames of its rank (§8). The
learning rate is annealed linearly to 0 over ``total_frames`` global frames when ``lr_anneal``
(§8); each push carries it.
"""

from __future__ import annotations

import numpy as np

from hpcrl.agents.async_rl.learner import VALUE_METHODS, AsyncLearner
from hpcrl.agents.async_rl.rollout import collect_rollout
from hpcrl.agents.base import TargetNetwork, WorkerBase, set_torch_rng_state, \
    target_refreshes_due, torch_rng_state
from hpcrl.agents.evaluation import EvaluationInterrupted, evaluate, final_evaluation, \
    first_evaluation, interrupt_at_checkpoint
from hpcrl.core import LearnerStats, sub_state, with_prefix
from hpcrl.envs import StepResult, make_env_from_config
from hpcrl.rl.acting import ActorCriticPolicy, EpsilonGreedyPolicy, GaussianPolicy
from hpcrl.rl.networks import build_network
from hpcrl.rl.obs_norm import ReturnScaler, find_obs_normalizer
from hpcrl.rl.policies import learning_rate
from hpcrl.rl.reuse import ActivationRecorder, RecordedActivations, matching
from hpcrl.runtime import hooks
from hpcrl.runtime.context import Context
from hpcrl.runtime.params.header import Word
from hpcrl.runtime.params.layout import bind_parameters
from hpcrl.runtime.profiling import NullClock, PhaseClock


class ActorLearnerWorker(WorkerBase):
    """Act a rollout, compute its gradient, push, pull (one worker step per rollout)."""

    def __init__(self, ctx: Context):
        cfg = self.cfg = ctx.cfg
        self.store, self.link, self.seed = ctx.store, ctx.link, ctx.seed
        self.rng = np.random.default_rng(ctx.seed)
        self.n_env = n_env = cfg.envs_per_actor
        times = hooks.phase_times_dir()
        self.clock = PhaseClock(times / f"rank-{ctx.rank}.jsonl") if times else NullClock()
        self.env = env = make_env_from_config(cfg, n_env, ctx.seed, training=True)
        self.reward_scaler = (ReturnScaler(n_env, cfg.gamma) if cfg.reward_norm else None)
        self.env_step = self.clock.timed("env", self._env_step if cfg.reward_norm else env.step)
        self.net = net = build_network(cfg, env.obs_shape, env.num_actions)
        self.value_method = cfg.algo in VALUE_METHODS
        target = build_network(cfg, env.obs_shape, env.num_actions) if self.value_method else None
        self.learner = AsyncLearner(net, target, cfg)
        self.gradient = self.clock.timed("learn", self.learner.gradient)
        _, self.theta = bind_parameters(net)                 # pulls write the net directly
        self.target = TargetNetwork(ctx.store, target) if target is not None else None
        forward = self.clock.timed("forward", net)
        if self.value_method:
            self.policy = EpsilonGreedyPolicy(net, n_env, cfg.anneal_frames, env.frames_per_step,
                                              self.rng, forward=forward,
                                              final_epsilon_high=cfg.final_epsilon_high)
        elif getattr(env, "continuous", False):
            self.policy = GaussianPolicy(net, n_env, self.rng, forward=forward)
        else:
            self.policy = ActorCriticPolicy(net, n_env, self.rng, forward=forward)
        self.frames_per_step = env.frames_per_step * n_env
        self.frames, self.steps = ctx.store.word(Word.FRAMES), ctx.store.word(Word.STEPS)
        self.frames_seen = self.frames.read()                # > 0 after a resume
        # The shared frame counter takes one atomic add per rollout, not per step (each is a
        # lock-protected RMA atomic on the ps). An episode is stamped with the last counter
        # value this rank saw plus its own frames since.
        self.rollout_frames = 0
        self.obs = env.reset()
        # obs_norm: the statistics of the observations the training environments produce,
        # updated once per rollout after its gradient, so that the gradient sees the
        # observations normalised as they were when the policy acted on them
        self.obs_norm = find_obs_normalizer(net)
        self.new_obs: list[np.ndarray] = []
        if self.obs_norm is not None:
            self.obs_norm.observe(self.obs)
        self.a_next = None
        self.rollouts = 0
        # This rank evaluates every eval_every_frames of its own frames (no evaluator ranks),
        # staggered against the other actor-learners.
        evaluating = ctx.layout.evaluating_ranks
        self.next_eval = (first_evaluation(cfg.eval_every_frames, evaluating.index(ctx.rank),
                                           len(evaluating))
                          if cfg.eval_every_frames > 0 and ctx.rank in evaluating else -1)
        self.eval_interrupt = interrupt_at_checkpoint(ctx.coord.due)
        # The acting passes' activations feed the gradient (hpcrl.rl.reuse): recorded only
        # while a rollout is collected, which no pull interrupts (the same parameters).
        self.recorder = ActivationRecorder(net.torso) if self.learner.reuses_acting else None
        self.versions = ctx.store.pull(self.theta)

    def _recorded(self) -> RecordedActivations | None:
        """This rollout's acting activations, if every step of it was acted in it (Sarsa's
        first action was chosen in the rollout before, so its rollouts re-run)."""
        if self.recorder is None:
            return None
        passes = self.recorder.stop()
        return (RecordedActivations(passes) if matching(passes, self.cfg.t_max, self.n_env)
                else None)

    def global_frames(self) -> int:
        return self.frames_seen

    def _env_step(self, actions, **kwargs) -> StepResult:
        """One step of the environments, the training rewards scaled (``reward_norm``)."""
        res = self.env.step(actions, **kwargs)
        return res._replace(reward=self.reward_scaler.scale(res.reward, res.episode_end))

    def _on_step(self, res: StepResult) -> None:
        self.rollout_frames += self.frames_per_step
        if self.obs_norm is not None:
            self.new_obs.append(res.obs)
        for i in np.flatnonzero(res.episode_end):
            self.link.episode(self.frames_seen + self.rollout_frames,
                              float(res.episode_return[i]), int(res.episode_frames[i]))

    def step(self) -> None:
        cfg, store = self.cfg, self.store
        if self.target is not None:
            self.target.refresh()
        if self.recorder is not None:
            self.recorder.start()
        rollout, self.obs = collect_rollout(self.env, self.obs, self.policy, cfg.t_max,
                                            self._on_step, self.a_next, step=self.env_step)
        acts = self._recorded()
        self.frames_seen = self.frames.add(self.rollout_frames)
        self.rollout_frames = 0
        if cfg.algo == "one_step_sarsa":
            self.a_next = self.policy.act(self.obs)   # a' in s_T, taken first in the next rollout
        grad = self.gradient(rollout, self.a_next, acts)
        if self.new_obs:
            self.obs_norm.observe(np.concatenate(self.new_obs))
            self.new_obs.clear()
        if grad is not None:
            store.push(grad, self.versions, learning_rate(cfg, self.frames_seen),
                       self.learner.sq_norm)
        if self.value_method:                          # the shared step counter of I_target
            num_steps = cfg.t_max * self.n_env
            due = target_refreshes_due(self.steps.add(num_steps), num_steps,
                                       cfg.target_update_every)
            if due:
                store.request_target_refresh(due)
        if grad is not None and cfg.wait_own_update > 0:
            store.wait_consumed(timeout_s=cfg.wait_own_update)
        self.versions = store.pull(self.theta)
        self.rollouts += 1
        self.clock.maybe_write(self.rollouts * cfg.t_max * self.n_env)
        if 0 <= self.next_eval <= self.rollouts * cfg.t_max * self.frames_per_step:
            try:
                results = evaluate(self.net, cfg, self.seed + self.next_eval, self.rng,
                                   on_step=self.eval_interrupt)
            except EvaluationInterrupted:       # after the checkpoint, from the same seed
                return
            for ret, length in results:
                self.link.episode(self.frames_seen, ret, length, eval_=True)
            self.next_eval += cfg.eval_every_frames

    def stats(self) -> LearnerStats:
        return self.learner.stats

    def after_checkpoint(self) -> None:
        # The counter again: this rank's last addition may have come before other ranks' of
        # the checkpoint, and an episode stamped at or below the checkpoint's frames would be
        # kept by a resume's metrics rollback (MetricsWriter.rollback) and played again.
        self.frames_seen = self.frames.read()
        self.versions = self.store.pull(self.theta)

    def pull_final(self) -> None:
        self.versions = self.store.pull(self.theta)

    def final_evaluation(self, episodes: int, seed: int, on_step) -> list[tuple[float, int]]:
        return final_evaluation(self.net, self.cfg, episodes, seed, on_step)

    def get_state(self) -> dict:
        out = {**with_prefix("env", self.env.get_state()), "obs": self.obs.copy(),
               **with_prefix("policy", self.policy.get_state()),
               **with_prefix("learner", self.learner.stats.get_state()),
               "torch_rng": torch_rng_state(), "rollouts": np.int64(self.rollouts),
               "next_eval": np.int64(self.next_eval)}
        if self.a_next is not None:
            out["a_next"] = np.asarray(self.a_next)
        if self.obs_norm is not None:
            out.update(with_prefix("obs_norm", self.obs_norm.get_state()))
        if self.reward_scaler is not None:
            out.update(with_prefix("reward_norm", self.reward_scaler.get_state()))
        return out

    def set_state(self, state: dict) -> None:
        self.env.set_state(sub_state(state, "env"))
        self.obs = np.array(state["obs"])
        self.policy.set_state(sub_state(state, "policy"))
        # Checkpoints written before the counters moved under "learner/" hold them at the top.
        self.learner.stats.set_state(sub_state(state, "learner") or state)
        set_torch_rng_state(state["torch_rng"])
        self.a_next = np.array(state["a_next"]) if "a_next" in state else None
        self.rollouts = int(state["rollouts"])
        self.next_eval = int(state["next_eval"])
        if self.obs_norm is not None:
            saved = sub_state(state, "obs_norm")
            if saved is None:   # find_resume refuses this; a checkpoint from before obs_norm
                raise ValueError("the checkpoint holds no observation statistics: it was "
                                 "written with obs_norm = false")
            self.obs_norm.set_state(saved)
        saved = sub_state(state, "reward_norm")
        if self.reward_scaler is not None and saved is not None:   # else: fresh statistics
            self.reward_scaler.set_state(saved)

    def close(self) -> None:
        self.env.close()
