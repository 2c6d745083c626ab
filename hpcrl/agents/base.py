"""Parts the workers of both families share: the defaults of the worker interface, the target
network that follows the store's target copy, and torch's RNG state in a checkpoint."""

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

    def close(self) -> None:
        pass


class TargetNetwork:
    """Keeps ``net`` equal to the store's target copy theta-: pulls it when its version
    changes (Gorila: the ps refreshes every ``target_update_every`` updates; the asynchronous
    value methods: every I_target global steps)."""

    def __init__(self, store: ParamSource, net: torch.nn.Module):
        self.store, self.net = store, net
        _, self.theta = bind_parameters(net)
        self.version = -1

    def refresh(self) -> None:
        version = self.store.target_version()
        if version != self.version:
            self.store.pull_target(self.theta)
            self.version = version


def torch_rng_state() -> np.ndarray:
    return torch.get_rng_state().numpy().copy()


def set_torch_rng_state(state: np.ndarray) -> None:
    torch.set_rng_state(torch.from_numpy(np.array(state)))
