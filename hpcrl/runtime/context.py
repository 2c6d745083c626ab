"""What a role's loop is given (:class:`Context`) and a client's channel to rank 0."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mpi4py import MPI

from hpcrl.config import Config
from hpcrl.core import STATS_FIELDS, LearnerStats
from hpcrl.runtime import watchdog
from hpcrl.runtime.coord import Coordinator
from hpcrl.runtime.params.store import ParameterStore
from hpcrl.runtime.topology import Layout

# Messages from clients to rank 0 (float64 rows on a dedicated communicator).
TAG_EPISODE, TAG_STATS, TAG_CKPT, TAG_FINAL, TAG_ALIVE, TAG_STARTED = 11, 12, 14, 15, 16, 17
#: kind 0 training, 1 periodic evaluation, 2 final evaluation (EPISODE_GROUPS[kind])
EPISODE_FIELDS = ("kind", "frames", "return", "length", "rank", "wall_time")
EPISODE_GROUPS = ("episodes", "eval", "final")
#: A client playing the final evaluation tells rank 0 it is alive at most this often.
ALIVE_EVERY_S = 10.0
ROW_FLOATS = max(len(EPISODE_FIELDS), len(STATS_FIELDS))


def rank_seed(base_seed: int, rank: int) -> int:
    """The seed of one rank's environments, RNGs and torch: ``seed + 1000 * rank``, so that
    every rank of a job, and every job seed, draws different streams."""
    return base_seed + 1000 * rank


class ClientLink:
    """A client's side of the reporting channel to rank 0."""

    def __init__(self, mcomm: MPI.Comm, rank: int):
        self.mcomm, self.rank = mcomm, rank
        self.t0 = time.monotonic()
        self._alive_at = 0.0

    def episode(self, frames: int, ret: float, length: int, eval_: bool = False,
                final: bool = False) -> None:
        kind = 2 if final else 1 if eval_ else 0
        row = np.array([kind, frames, ret, length, self.rank, time.monotonic() - self.t0],
                       np.float64)
        self.mcomm.Send(row, 0, TAG_EPISODE)

    def alive(self) -> None:
        """During the final evaluation: this client still plays (rate-limited)."""
        now = time.monotonic()
        if now - self._alive_at >= ALIVE_EVERY_S:
            self._alive_at = now
            self.mcomm.Send(np.zeros(1), 0, TAG_ALIVE)

    def started(self) -> None:
        """This client has built its worker (torch imported, environments made)."""
        self.mcomm.Send(np.zeros(1), 0, TAG_STARTED)

    def final_done(self) -> None:
        """Every final-evaluation episode of this client has been sent."""
        self.mcomm.Send(np.zeros(1), 0, TAG_FINAL)

    def stats(self, stats: LearnerStats) -> None:
        self.mcomm.Send(stats.as_row(), 0, TAG_STATS)

    def marker(self) -> None:
        """Everything this client reported so far precedes the coming checkpoint."""
        self.mcomm.Send(np.zeros(1), 0, TAG_CKPT)


@dataclass
class Context:
    """Everything a role's loop needs, built once by :func:`hpcrl.runtime.program.run`."""

    comm: MPI.Comm
    cfg: Config
    layout: Layout
    rank: int
    store: ParameterStore
    mcomm: MPI.Comm            # clients -> rank 0: episodes, statistics, checkpoint markers
    rcomm: MPI.Comm            # actors/learners <-> global replay ranks
    run_dir: Path
    coord: Coordinator
    state: dict | None         # this rank's state from the checkpoint being resumed
    resume_frames: int | None  # global frames of that checkpoint
    opt: object = None         # ps ranks: the shard optimiser
    hosts: list | None = None  # rank 0: every rank's host name, by rank
    provenance: dict | None = None   # rank 0: versions, MPI, git, hosts, SLURM ids
    tensors: tuple = ()        # the network's (name, size) in the flat vector's order
    memory_bound: float | None = None  # the memory guard's bound in bytes (None: off)
    link: ClientLink = field(init=False)

    def __post_init__(self) -> None:
        self.link = ClientLink(self.mcomm, self.rank)

    def hand_over_state(self, set_state) -> None:
        """Give the resumed state (if any) to ``set_state`` and drop it here, then arm the
        memory guard. A Gorila bundle's replay memory is read into RAM from its checkpoint
        and copied into the live memory: kept here, that second copy (7 GB for a bundle of
        1 M transitions) would stay resident for the whole run. Until this point both copies
        are, so the guard, which counts one, starts now."""
        if self.state is not None:
            set_state(self.state)
            self.state = None
        watchdog.bound_memory(self.memory_bound)

    @property
    def seed(self) -> int:
        return rank_seed(self.cfg.seed, self.rank)
