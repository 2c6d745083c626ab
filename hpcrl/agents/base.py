"""Parts the workers of both families share: the defaults of the worker interface (a worker
that does not evaluate plays no final evaluation), the target
network that follows the store's target copy and when a client asks for its refresh, and
torch's RNG state in a checkpoint."""

from __future__ import annotations

import numpy as np
import torch

from hpcrl.core import LearnerStats, ParamSource
from hpcrl.runtime.params.layout import bind_parameters


class WorkerBase:
    """Defaults of :class:`hpcrl.core.Worker` for the parts a worker does not need: no learner
    counters, nothing to send before a checkpoint, nothing to refresh after it, nothing to
    close."""

    def stats(self) -> LearnerStats | None:
        return None

    def before_checkpoint(self) -> None:
        pass

    def after_checkpoint(self) -> None:
        pass

    def pull_final(self) -> None:
        pass

    def final_evaluation(self, episodes: int, seed: int, on_step) -> list[tuple[float, int]]:
        return []

    def close(self) -> None:
        pass


def target_refreshes_due(steps_after: int, num_steps: int, every: int) -> int:
    """How many multiples of ``every`` (DQN's C, the asynchronous methods' I_target) adding
    ``num_steps`` to the global step counter (now ``steps_after``) crossed: exactly one rank's
    addition crosses each multiple, so the ps is asked for exactly one refresh per multiple,
    however many steps each addition carries (a Gorila actor adds several agent steps at once,
    :data:`hpcrl.agents.gorila.actor.FRAMES_ADDED_EVERY`)."""
    return steps_after // every - (steps_after - num_steps) // every


class TargetNetwork:
    """Keeps ``net`` equal to the store's target copy theta-: pulls it when its version
    changes (refreshed every ``target_update_every`` applied updates or global agent steps,
    ``target_update_unit``)."""

    def __init__(self, store: ParamSource, net: torch.nn.Module):
        self.store, self.net = store, net
        _, self.theta = bind_parameters(net)
        self.version = -1
        self.pulls = 0          # pulls so far: `net`'s weights change only when this does

    def refresh(self) -> None:
        """Pull theta- when shard 0's target version changed, until every shard's agrees.

        Each ps shard refreshes its part on its own (a refresh request is served in the
        shard's own poll; shards whose versions drifted reach a multiple of N at different
        updates), so a pull right after shard 0 refreshed may read other shards' old rows:
        it is repeated at the next call until the shards' target versions are equal."""
        if self.store.target_version() != self.version:
            self.pulls += 1     # before: a pull that stopped halfway still changed the weights
            versions = np.asarray(self.store.pull_target(self.theta))
            self.version = int(versions[0]) if np.all(versions == versions[0]) else -1


def torch_rng_state() -> np.ndarray:
    return torch.get_rng_state().numpy().copy()


def set_torch_rng_state(state: np.ndarray) -> None:
    torch.set_rng_state(torch.from_numpy(np.array(state)))
