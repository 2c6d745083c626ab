"""Resuming a checkpoint under another layout: pure functions, no MPI and no files.

A checkpoint generation holds one state per rank. Two kinds of state move differently:

* **Parameter-server shards** are slices of one flat vector (parameters, target parameters,
  element-wise optimiser statistics; per-client statistics are ``[n_clients, shard]``). Any
  number of ps ranks can hold them: a new shard is the concatenation of the pieces of the old
  shards that overlap its range (:func:`shard_pieces`, :func:`merge_pieces`). So ``n_ps`` and
  with it the world size may change between a checkpoint and its resume (a requeued job that
  got another allocation).
* **Worker states** (actors, learners, actor-learners, replay ranks, evaluators) are not
  divisible: a replay memory, an environment mid-episode, an exploration schedule with its
  sampled final epsilon, one row of per-client optimiser statistics. The worker sequence (the
  non-ps roles in rank order) must therefore be the same; worker ``k`` of the new job continues
  worker ``k`` of the old one wherever the ps ranks now sit (:func:`worker_source_rank`).
"""

from __future__ import annotations

import numpy as np

from hpcrl.runtime.topology import shard_ranges

PS = "ps"


def workers(roles: list[str]) -> list[str]:
    """The non-ps roles in rank order."""
    return [r for r in roles if r != PS]


def _counts(roles: list[str]) -> str:
    return ", ".join(f"{roles.count(r)} {r}" for r in dict.fromkeys(roles))


def layout_change_error(old_roles: list[str], new_roles: list[str]) -> str | None:
    """Why a checkpoint written with ``old_roles`` cannot resume under ``new_roles`` (None if it
    can: same workers, ps ranks anywhere and any number of them)."""
    if workers(old_roles) == workers(new_roles):
        return None
    return (f"was written by a job with {len(old_roles)} ranks ({_counts(old_roles)}); this job "
            f"has {len(new_roles)} ({_counts(new_roles)}). The number of ps ranks may change "
            "(shards are re-split) but the workers may not: each one's replay memory, "
            "environment and exploration state cannot be divided or invented. Resume with "
            f"{len(workers(old_roles))} workers ({_counts(workers(old_roles))}) plus any n_ps, "
            "or use another run_dir")


def worker_source_rank(old_roles: list[str], new_roles: list[str], rank: int) -> int:
    """The rank of the old job whose state worker ``rank`` of the new job continues."""
    assert new_roles[rank] != PS
    k = sum(1 for r in new_roles[:rank] if r != PS)
    return [i for i, r in enumerate(old_roles) if r != PS][k]


def shard_pieces(n_params: int, old_n_ps: int, new_n_ps: int,
                 new_shard: int) -> list[tuple[int, int, int]]:
    """The old-shard slices that make up ``new_shard``, in order, as
    ``(old shard, lo, hi)`` in the old shard's local coordinates."""
    a, b = shard_ranges(n_params, new_n_ps)[new_shard]
    pieces = []
    for j, (c, d) in enumerate(shard_ranges(n_params, old_n_ps)):
        lo, hi = max(a, c), min(b, d)
        if lo < hi:
            pieces.append((j, lo - c, hi - c))
    return pieces


def merge_pieces(pieces: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One shard state from the slices of old shard states (see :func:`shard_pieces`).

    Arrays are joined along their last axis (the parameter axis). Scalars (the ``hdr/*``
    counters) come from the first piece: its old shard starts where the new one does, so new
    shard 0 gets old shard 0's global counters (frames, steps, episodes, applied updates) and
    every shard keeps a version count that only grows.
    """
    first = pieces[0]
    out = {}
    for key, value in first.items():
        if np.ndim(value) == 0:
            out[key] = value
        else:
            out[key] = np.concatenate([p[key] for p in pieces], axis=-1)
    return out
