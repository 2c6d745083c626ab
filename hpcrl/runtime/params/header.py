"""The int64 header words of every parameter-store shard, by name.

Each ps rank's header window holds these words, then one inbox flag per client (from
``FLAGS`` on). Protocol words (versions, seqlock, counters of applied and dropped gradients,
target requests) exist on every shard; the job-wide words (frames, steps, the checkpoint
protocol of :mod:`hpcrl.runtime.coord`) live on shard 0 only and are reached through
:meth:`hpcrl.runtime.params.store.ParameterStore.word`.
"""

from __future__ import annotations

import enum


class Word(enum.IntEnum):
    """Index of each header word. Checkpoints save them by name (``SAVED``), not by index."""

    # per shard: the parameter protocol (written by the shard's ps rank only)
    V = 0                # version of the parameters in row V % 2
    S = 1                # version being written (seqlock: readers of row (S % 2) retry)
    TV = 2               # version of the target network in row 2 + TV % 2
    TS = 3               # target version being written
    APPLIED = 4          # gradients applied
    STALE = 5            # gradients dropped as stale (older than max_staleness)
    NONFINITE = 6        # gradients dropped as NaN/inf
    DONE = 7             # clients that said they will push no more (plain shutdown)
    TARGET_REQ = 8       # target refreshes asked for by clients (async methods' I_target)
    # shard 0 only: job-wide counters
    FRAMES = 9           # environment frames, summed over all actors
    STEPS = 10           # agent steps, summed over all actor-learners (I_target's clock)
    # shard 0 only: coordinated checkpoints (hpcrl.runtime.coord)
    CKPT_REQ = 11        # the generation asked for (atomic max to generation + 1)
    CKPT_STOP = 12       # why the job stops after it: 0 go on, 1 budget spent, 2 signal
    CKPT_READY = 13      # clients that reached the checkpoint


#: First client inbox flag (0 = empty, else the version the gradient was computed from + 1).
FLAGS = 16

#: Words saved in checkpoints, by name (the job-wide ones matter on shard 0 only).
SAVED = {"V": Word.V, "TV": Word.TV, "applied": Word.APPLIED, "dropped_stale": Word.STALE,
         "dropped_nonfinite": Word.NONFINITE, "target_requests": Word.TARGET_REQ,
         "frames": Word.FRAMES, "steps": Word.STEPS}
