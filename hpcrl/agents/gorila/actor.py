"""The Gorila actor (Nair et al. 2015, §3): epsilon-greedy acting with a behaviour copy of the
Q-network, pulled from the parameter store every ``actor_sync_every`` agent steps (1 = the
paper's "before every acting step"), each step written to a replay sink."""

from __future__ import annotations

import numpy as np
import torch

from hpcrl.agents.base import target_refreshes_due
from hpcrl.agents.evaluation import EvaluationInterrupted, evaluate, first_evaluation
from hpcrl.config import Config
from hpcrl.core import sub_state, with_prefix
from hpcrl.envs import make_env_from_config
from hpcrl.io.rngstate import generator_state_from_array, generator_state_to_array
from hpcrl.rl.networks import build_network
from hpcrl.rl.policies import LinearSchedule, epsilon_greedy_lazy
from hpcrl.rl.replay import ReplayMemory
from hpcrl.runtime.context import ClientLink, rank_seed
from hpcrl.runtime.params.header import Word
from hpcrl.runtime.params.layout import bind_parameters
from hpcrl.runtime.params.store import ParameterStore

#: A bundle's batched acting steps between two additions of its frames to the job's frame
#: counter (and before every checkpoint). Each addition is an MPI atomic on shard 0, about 4 %
#: of a bundle's time when made every step (docs/performance.md). Between additions the actor
#: counts its own frames on top of the counter's last value (``global_frames``); a target
#: refresh timed in global agent steps is asked for by the addition that crosses its multiple,
#: so refreshes come one per ``target_update_every`` added steps, each at most the other
#: actors' unadded steps (fewer than this many batched steps each) late. Split-mode actors add
#: every step: their learners pace on the counter (``split_update_every``).
FRAMES_ADDED_EVERY = 8


class LocalReplaySink:
    """Where a bundle's actor writes: one local replay memory per environment."""

    def __init__(self, replays: list[ReplayMemory]):
        self.replays = replays

    def first(self, i: int, frame: np.ndarray) -> None:
        self.replays[i].add_first(frame)

    def add(self, i: int, action: int, reward: float, terminal: bool, frame: np.ndarray) -> None:
        self.replays[i].add(action, reward, terminal, frame)


class Actor:
    """Epsilon-greedy acting with a behaviour copy of the Q-network (Gorila's actor).

    Pulls the parameters every ``actor_sync_every`` agent steps, writes each step to ``sink``
    (local replay or a global-replay sender), reports finished episodes and runs the periodic
    evaluation between steps (``eval_slot``: this rank's index among the ``count`` evaluating
    ranks, or None where evaluator ranks evaluate).
    """

    def __init__(self, cfg: Config, rank: int, store: ParameterStore, link: ClientLink, sink,
                 env=None, net: torch.nn.Module | None = None,
                 eval_slot: tuple[int, int] | None = (0, 1), eval_interrupt=None,
                 frames_added_every: int = 1):
        self.cfg, self.rank, self.store, self.link, self.sink = cfg, rank, store, link, sink
        self.frames_added_every = frames_added_every     # batched steps between additions
        #: ``on_step`` of the periodic evaluations: gives one up when a checkpoint is due
        #: (:func:`hpcrl.agents.evaluation.interrupt_at_checkpoint`)
        self.eval_interrupt = eval_interrupt
        self.seed = rank_seed(cfg.seed, rank)
        self.rng = np.random.default_rng(self.seed)
        self.env = env or make_env_from_config(cfg, cfg.envs_per_actor, self.seed, training=True)
        self.net = net or build_network(cfg, self.env.obs_shape, self.env.num_actions)
        _, self.theta = bind_parameters(self.net)     # a pull into theta updates the net
        self.epsilon = LinearSchedule(cfg.epsilon_start, cfg.epsilon_end, cfg.epsilon_frames)
        self.image = len(self.env.obs_shape) == 3
        self.frames_per_step = self.env.frames_per_step * self.env.num_envs
        self.frames = store.word(Word.FRAMES)
        self.local_frames = self.steps = 0
        self.unadded_frames = 0                  # this actor's, not yet in the job's counter
        self.counted_frames = self.frames.read()  # the counter's last value (> 0 after a resume)
        self.target_in_steps = not cfg.target_period_in_updates()
        # Actors evaluate between training steps only when no evaluator ranks do it
        # (eval_slot None), each (index, count) of the evaluating ranks staggered.
        self.next_eval = (first_evaluation(cfg.eval_every_frames, *eval_slot)
                          if cfg.eval_every_frames and eval_slot is not None else None)
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

    def after_checkpoint(self) -> None:
        """Read the counter again (every frame of the checkpoint is in it, the checkpoint's
        frames or more) and pull the parameters, which may have moved during the pause.

        The counter's last value this actor saw, from its own addition before the checkpoint,
        may fall short of the checkpoint's frames by the other actors' additions after it; an
        episode ending soon after would then be stamped at or below them, and a resume from
        this checkpoint, which keeps the metrics rows stamped at or below its frames
        (:meth:`hpcrl.io.metrics.writer.MetricsWriter.rollback`), would keep that episode
        and play it again."""
        self.counted_frames = self.frames.read()
        self.sync()

    @property
    def global_frames(self) -> int:
        """The job's frames as this actor sees them: the counter's last value and its own
        unadded frames."""
        return self.counted_frames + self.unadded_frames

    def add_frames(self) -> int:
        """Add this actor's unadded frames to the job's counter (every ``frames_added_every``
        steps, and before a checkpoint, which must find none unadded) and ask for the target
        refreshes that the addition's agent steps crossed; returns the counter's new value."""
        added, self.unadded_frames = self.unadded_frames, 0
        self.counted_frames = self.frames.add(added)
        if self.target_in_steps:                     # the period counted in global agent steps
            skip = self.env.frames_per_step
            due = target_refreshes_due(self.counted_frames // skip, added // skip,
                                       self.cfg.target_update_every)
            if due:
                self.store.request_target_refresh(due)
        return self.counted_frames

    def q_values(self) -> np.ndarray:
        """Q(s, .) of the current observations, [num_envs, A]: run only when some environment
        acts greedily this step (:func:`hpcrl.rl.policies.epsilon_greedy_lazy`)."""
        with torch.no_grad():
            return self.net(torch.from_numpy(self.obs)).numpy()

    def step(self) -> int:
        """One agent step in every environment; returns the global frame count after it as this
        actor sees it (the counter's last value and its own unadded frames)."""
        if self.steps % self.cfg.actor_sync_every == 0 and self.steps:
            self.sync()
        actions = epsilon_greedy_lazy(self.q_values, self.env.num_envs, self.env.num_actions,
                                      self.epsilon.value(self.local_frames), self.rng)
        res = self.env.step(actions)
        self.steps += 1
        self.local_frames += self.frames_per_step
        self.unadded_frames += self.frames_per_step
        if self.steps % self.frames_added_every == 0:
            self.add_frames()
        for i in range(self.env.num_envs):
            self.sink.add(i, int(actions[i]), float(res.reward[i]), bool(res.terminal[i]),
                          res.last_frame[i])
            if res.episode_end[i]:
                self.sink.first(i, self._newest(res.obs[i]))
                self.link.episode(self.global_frames, float(res.episode_return[i]),
                                  int(res.episode_frames[i]))
        self.obs = res.obs
        if self.next_eval is not None and self.local_frames >= self.next_eval:
            try:
                results = evaluate(self.net, self.cfg, self.seed + self.steps, self.rng,
                                   on_step=self.eval_interrupt)
            except EvaluationInterrupted:       # again after the checkpoint
                return self.global_frames
            self.next_eval += self.cfg.eval_every_frames
            for ret, length in results:
                self.link.episode(self.global_frames, ret, length, eval_=True)
        return self.global_frames
