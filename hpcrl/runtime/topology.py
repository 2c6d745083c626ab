"""Which MPI rank plays which role: a pure function of (world size, config).

Gorila (Nair et al. 2015, Fig. 2) has parameter servers, learners, actors and replay memory;
its main configuration bundles one actor, its local replay and one learner per machine. The
asynchronous methods (Mnih et al. 2016) have only actor-learners and shared parameters. Both map
onto MPI ranks here; nothing in this module touches MPI, so the rank table can be printed and
tested without a launcher (``python -m hpcrl.run --dry-run --world-size 130``).

Parameter-server ranks are spread evenly over the rank range (rank ``i * world // n_ps``)
rather than packed at the front: with the usual block mapping of ranks to nodes, spreading puts
the shards on different nodes, so no single node's network port carries every shard's traffic.
Rank 0 is always a ps rank; it also writes the metrics file (it needs no torch, and its loop
is idle most of the time).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hpcrl.config import Config


class Role(str, enum.Enum):
    PS = "ps"
    LEARNER = "learner"
    ACTOR = "actor"
    ACTOR_LEARNER = "actor-learner"
    REPLAY = "replay"
    EVALUATOR = "evaluator"


#: Roles that pull parameters from (or push gradients to) the store.
CLIENT_ROLES = (Role.LEARNER, Role.ACTOR, Role.ACTOR_LEARNER, Role.EVALUATOR)
#: Roles that build a network (and so import torch). ps and replay ranks must not.
TORCH_ROLES = CLIENT_ROLES


class LayoutError(ValueError):
    """The world size cannot hold the requested layout."""


@dataclass(frozen=True)
class Layout:
    """Role of every rank. ``roles[r]`` is the role of rank ``r``."""

    roles: tuple[Role, ...]

    @property
    def world_size(self) -> int:
        return len(self.roles)

    def ranks_of(self, *roles: Role) -> tuple[int, ...]:
        return tuple(r for r, role in enumerate(self.roles) if role in roles)

    @property
    def ps_ranks(self) -> tuple[int, ...]:
        return self.ranks_of(Role.PS)

    @property
    def client_ranks(self) -> tuple[int, ...]:
        """Ranks that talk to the parameter store, in rank order; index = client id."""
        return self.ranks_of(*CLIENT_ROLES)

    def index_in_role(self, rank: int) -> int:
        return self.ranks_of(self.roles[rank]).index(rank)

    @property
    def evaluating_ranks(self) -> tuple[int, ...]:
        """Ranks that play evaluation episodes, in rank order: the evaluator ranks if the layout
        has any, else every rank that acts (actors, bundles, actor-learners)."""
        return self.ranks_of(Role.EVALUATOR) or self.ranks_of(Role.ACTOR, Role.ACTOR_LEARNER)

    def role_names(self) -> list[str]:
        """``roles`` as strings, as checkpoint manifests record them."""
        return [r.value for r in self.roles]

    def counts(self) -> dict[str, int]:
        return {role.value: len(self.ranks_of(role)) for role in Role if self.ranks_of(role)}


def even_share(total: int, index: int, count: int) -> int:
    """Member ``index`` of ``count``'s part of ``total`` (episodes, environments) split as
    evenly as possible, the first members one more."""
    return total // count + (1 if index < total % count else 0)


def derive_n_ps(world_size: int) -> int:
    """Gorila's paper ratio, 30 ps per 130 processes, with at least one."""
    return max(1, (world_size * 30) // 130)


def ps_positions(world_size: int, n_ps: int) -> list[int]:
    """Ranks hosting shards: spread evenly, rank 0 first."""
    return [(i * world_size) // n_ps for i in range(n_ps)]


def make_layout(world_size: int, cfg: Config) -> Layout:
    """Assign a role to every rank.

    Raises:
        LayoutError: one line saying what does not fit and how to fix it.
    """
    if world_size < 1:
        raise LayoutError(f"world size must be >= 1, got {world_size}")
    n_ps = cfg.n_ps or derive_n_ps(world_size)
    rest = world_size - n_ps - cfg.n_evaluators
    if rest < 1:
        raise LayoutError(
            f"world size {world_size} cannot hold n_ps={n_ps} + n_evaluators={cfg.n_evaluators} "
            f"+ at least one worker; launch with mpiexec -n {n_ps + cfg.n_evaluators + 1} or more, "
            "or lower n_ps")
    if cfg.mode == "bundled":
        workers = [Role.ACTOR_LEARNER] * rest
    else:
        workers = _split_workers(world_size, rest, cfg)
    workers += [Role.EVALUATOR] * cfg.n_evaluators
    ps_at = set(ps_positions(world_size, n_ps))
    it = iter(workers)
    return Layout(tuple(Role.PS if r in ps_at else next(it) for r in range(world_size)))


def _split_workers(world_size: int, rest: int, cfg: Config) -> list[Role]:
    n_replay, n_act, n_learn = cfg.n_replay, cfg.n_actors, cfg.n_learners
    if n_replay < 1:
        raise LayoutError("mode 'split' needs n_replay >= 1 (learners sample global replay)")
    free = rest - n_replay
    if n_act == 0 and n_learn == 0:
        n_learn = 1
    if n_act == 0:
        n_act = free - n_learn
    elif n_learn == 0:
        n_learn = free - n_act
    if n_act < 1 or n_learn < 1 or n_replay + n_act + n_learn != rest:
        raise LayoutError(
            f"world size {world_size} cannot hold mode 'split' with n_ps={world_size - rest - cfg.n_evaluators}, "
            f"n_replay={n_replay}, n_actors={cfg.n_actors or 'rest'}, "
            f"n_learners={cfg.n_learners or 'rest'}, n_evaluators={cfg.n_evaluators}: "
            f"{rest} ranks are left for replay, actors and learners")
    return [Role.REPLAY] * n_replay + [Role.LEARNER] * n_learn + [Role.ACTOR] * n_act


def shard_ranges(n_params: int, n_ps: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) ranges, as ``np.array_split``: the first ``n % k`` get one more."""
    if n_ps < 1 or n_params < n_ps:
        raise LayoutError(f"cannot split {n_params} parameters into {n_ps} shards")
    base, extra = divmod(n_params, n_ps)
    ranges, start = [], 0
    for i in range(n_ps):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def _compress(ranks: tuple[int, ...]) -> str:
    """1,2,3,5 -> '1-3,5'."""
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)


def format_table(layout: Layout, n_params: int) -> str:
    """The rank table that ``--dry-run`` prints: role counts, ranks per role, shards."""
    lines = [f"world size {layout.world_size}: " +
             ", ".join(f"{n} {role}" for role, n in layout.counts().items())]
    for role in Role:
        ranks = layout.ranks_of(role)
        if ranks:
            lines.append(f"  {role.value:<14} ranks {_compress(ranks)}")
    ranges = shard_ranges(n_params, len(layout.ps_ranks))
    sizes = [b - a for a, b in ranges]
    lines.append(f"parameters: {n_params} float32 ({n_params * 4 / 1e6:.1f} MB) in "
                 f"{len(ranges)} shards of {min(sizes)}-{max(sizes)} floats")
    for i, (rank, (a, b)) in enumerate(zip(layout.ps_ranks, ranges)):
        lines.append(f"  shard {i:>3} on rank {rank:>4}: [{a}, {b}) {b - a} floats")
    return "\n".join(lines)
