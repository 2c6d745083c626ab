"""The small interfaces the parts of hpcrl meet at (in the manner of acme's ``core.py``).

* :class:`ParamSource`: where a client's parameters come from and its gradients go (the
  sharded store of :mod:`hpcrl.runtime.params.store`).
* :class:`Worker`: what the one client loop (:func:`hpcrl.runtime.client.run_client`) drives
  on every client rank; each algorithm family provides its workers (:mod:`hpcrl.agents`).
* :class:`Policy`: a behaviour policy over a network (:mod:`hpcrl.rl.acting`).
* :class:`LearnerStats`: the counters a learner reports to rank 0 and checkpoints.

State travels as flat ``{name: array}`` dicts (HDF5 checkpoints, no pickle); parts nest
theirs under a prefix with :func:`with_prefix` / :func:`sub_state`.

Nothing here imports torch or MPI.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Protocol

import numpy as np


class ParamSource(Protocol):
    """The shared parameters as a client sees them: versioned pulls, tagged pushes."""

    def pull(self, out: np.ndarray) -> np.ndarray:
        """Fill ``out`` with a consistent copy; returns the version of each shard read."""

    def pull_target(self, out: np.ndarray) -> np.ndarray:
        """Fill ``out`` with the target network's copy; returns its versions."""

    def target_version(self) -> int:
        """Changes whenever the target copy is refreshed."""

    def push(self, grad, versions: np.ndarray, lr: float, sq_norm: float | None = None) -> None:
        """Hand over one gradient computed from ``versions``, to be applied with ``lr``."""


class Worker(Protocol):
    """One client rank's work, between the checkpoints and the budget check of the loop."""

    def global_frames(self) -> int:
        """Job-wide frames as this worker last saw them (the budget is in frames)."""

    def step(self) -> None:
        """One unit of work: an agent step, a rollout, an update or an evaluation round."""

    def stats(self) -> "LearnerStats | None":
        """The learner's counters, or None for a worker that does not learn."""

    def before_checkpoint(self) -> None:
        """Everything sent before the checkpoint has been sent (e.g. replay markers)."""

    def after_checkpoint(self) -> None:
        """Carry on after a checkpoint (parameters may have moved during the pause)."""

    def get_state(self) -> dict:
        """Everything needed to continue exactly (flat dict of arrays)."""

    def set_state(self, state: dict) -> None:
        """Continue from a ``get_state`` of a worker built with the same config."""

    def pull_final(self) -> None:
        """After the final checkpoint: pull the final parameters into the network that
        :meth:`final_evaluation` plays with (nothing for a worker that does not evaluate)."""

    def final_evaluation(self, episodes: int, seed: int,
                         on_step: Callable[[], None]) -> list[tuple[float, int]]:
        """Play ``episodes`` evaluation episodes with the pulled final parameters, on
        environments seeded from ``seed``; (return, length in frames) of each."""

    def close(self) -> None:
        """Release environments."""


class Policy(Protocol):
    """Chooses actions for N environments; ``state`` is the LSTM state or None."""

    state: object

    def act(self, obs: np.ndarray) -> np.ndarray:
        """[N, *obs] -> [N] int64 actions (advances the recurrent state, if any)."""

    def episode_end(self, end: np.ndarray) -> None:
        """Forget the recurrent state of the environments whose episode ended."""

    def get_state(self) -> dict:
        """RNG position and recurrent state (flat dict of arrays)."""

    def set_state(self, state: dict) -> None:
        ...


@dataclass
class LearnerStats:
    """What a learner counts; reported to rank 0 (``train`` rows) and checkpointed.

    Attributes:
        loss_sum, loss_count: summed loss of the gradients computed, and how many.
        updates: gradients handed to the store.
        dropped_outlier: gradients dropped by Gorila's loss-outlier rule.
        dropped_nonfinite: gradients dropped because their loss or norm was NaN/inf.
        grad_norm_sum, grad_norm_count: summed global L2 norm of the gradients before any
            clipping, and how many were measured.
        grad_clipped: gradients whose norm was clipped (``grad_clip_norm``).
        grad_cut_sum: summed norm the clip removed, norm - grad_clip_norm where it clipped:
            1 - this / ``grad_norm_sum`` is the share of the gradients' norm let through
            (exactly 1 over an interval without a clipped gradient).
        entropy_sum: A3C: summed mean policy entropy per agent step (nats) of each loss
            (a policy collapsing to one action takes it towards 0); ``loss_count`` divides it.
        max_q_sum: value methods: summed mean max_a Q(s, a) over each loss's states (values
            running away upwards or downwards); ``loss_count`` divides it.
    """

    loss_sum: float = 0.0
    loss_count: int = 0
    updates: int = 0
    dropped_outlier: int = 0
    dropped_nonfinite: int = 0
    grad_norm_sum: float = 0.0
    grad_norm_count: int = 0
    grad_clipped: int = 0
    grad_cut_sum: float = 0.0
    entropy_sum: float = 0.0
    max_q_sum: float = 0.0

    def add_loss(self, loss: float, health: float, algo: str) -> None:
        """One loss, with its health figure: the policy entropy per step (``algo`` "a3c") or
        the mean max Q (the value methods)."""
        self.loss_sum += loss
        self.loss_count += 1
        if algo == "a3c":
            self.entropy_sum += health
        else:
            self.max_q_sum += health

    def add_gradient(self, norm: float, clip: float = 0.0) -> None:
        """One gradient's global norm before clipping at ``clip`` (0: no clip)."""
        clipped = 0.0 < clip < norm
        self.grad_norm_sum += norm
        self.grad_norm_count += 1
        self.grad_clipped += clipped
        if clipped:
            self.grad_cut_sum += norm - clip

    def as_row(self) -> np.ndarray:
        """float64 [len(STATS_FIELDS)] in field order (the message to rank 0)."""
        return np.array([getattr(self, f.name) for f in fields(self)], np.float64)

    def get_state(self) -> dict:
        return {f.name: (np.float64 if f.type in (float, "float") else np.int64)(
            getattr(self, f.name)) for f in fields(self)}

    def set_state(self, state: dict) -> None:
        """Counters a checkpoint lacks (older checkpoints: the health sums; the asynchronous
        learners kept no outlier count before LearnerStats) start at 0."""
        for f in fields(self):
            kind = float if f.type in (float, "float") else int
            setattr(self, f.name, kind(state.get(f.name, 0)))


#: Field names of a `LearnerStats` row, in order.
STATS_FIELDS = tuple(f.name for f in fields(LearnerStats))


def with_prefix(prefix: str, state: dict) -> dict:
    """``{prefix/name: value}``: a part's state inside its owner's flat state dict."""
    return {f"{prefix}/{k}": v for k, v in state.items()}


def sub_state(state: dict | None, prefix: str) -> dict | None:
    """The entries of a flat state dict under ``prefix/``, prefix removed (None if none)."""
    if state is None:
        return None
    out = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + "/")}
    return out or None
