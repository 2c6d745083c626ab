"""The final evaluation: once the frame budget is spent (or ``early_stop`` ends the run) and
the final checkpoint is written, the final weights play ``final_evaluation_episodes`` episodes
(30 in Mnih et al. 2015 and 2016), recorded in ``metrics.h5``'s ``final`` group.

Every rank takes part, in this order:

1. the evaluating ranks (:attr:`hpcrl.runtime.topology.Layout.evaluating_ranks`) pull the
   final parameters; a barrier over all ranks follows, so every pull has been served before
   the parameter servers move on;
2. each evaluating rank plays its share (:func:`hpcrl.runtime.topology.even_share`) and sends the episodes to rank
   0, telling it every ``ALIVE_EVERY_S`` that it still plays and, at the end, that it is done;
   rank 0 gathers them and names a rank it has not heard from for ``STALL_SHARE x
   watchdog_s`` (the job then aborts: no rank waits for a frozen peer);
3. all ranks wait for each other in a non-blocking barrier, beating their watchdogs: an
   evaluation of long episodes may take longer than ``watchdog_s``.

A signal stop (preemption) skips it: the job must exit within the signal's grace time. A
resume of a finished run writes a new final generation and plays the final evaluation again;
``MetricsWriter.rollback`` drops the earlier ``final`` rows.
"""

from __future__ import annotations

import time

from mpi4py import MPI

from hpcrl.runtime import hooks, watchdog
from hpcrl.runtime.context import Context
from hpcrl.runtime.coord import STOP_BUDGET
from hpcrl.runtime.params.header import Word
from hpcrl.runtime.topology import even_share

#: Offset of the final evaluation's environment seeds from the rank's seed (rank seeds are
#: ``seed + 1000 * rank``; a rank's training environments take ``rank seed + i``, i < 256).
FINAL_SEED_OFFSET = 500
#: Rank 0 names an evaluating rank it has not heard from for this share of ``watchdog_s``.
STALL_SHARE = 0.8
WAIT_POLL_S = 0.01


def final_due(ctx: Context) -> bool:
    """Whether the job ends with a final evaluation (the same answer on every rank)."""
    return ctx.coord.stop_code == STOP_BUDGET and ctx.cfg.final_eval_episodes > 0


def client_phase(ctx: Context, worker) -> None:
    """A client's part: pull, barrier, play and send its share, wait for everyone."""
    ranks = ctx.layout.evaluating_ranks
    evaluating = ctx.rank in ranks
    if evaluating:
        worker.pull_final()
        frames = ctx.store.word(Word.FRAMES).read()        # the final checkpoint's frames
    ctx.comm.Barrier()
    if evaluating:
        hooks.before_final_evaluation(ctx.rank)
        episodes = even_share(ctx.cfg.final_eval_episodes, ranks.index(ctx.rank), len(ranks))
        for ret, length in worker.final_evaluation(episodes, ctx.seed + FINAL_SEED_OFFSET,
                                                   ctx.link.alive):
            ctx.link.episode(frames, ret, length, final=True)
        ctx.link.final_done()
    wait_for_all(ctx.comm)


def server_phase(ctx: Context, reporter=None) -> None:
    """A ps or replay rank's part; rank 0 (``reporter``) gathers the episodes."""
    ctx.comm.Barrier()
    if reporter is not None:
        reporter.collect_final(ctx.layout.evaluating_ranks, STALL_SHARE * ctx.cfg.watchdog_s)
    wait_for_all(ctx.comm)


def wait_for_all(comm: MPI.Comm) -> None:
    """A barrier that keeps this rank's watchdog fed while others still evaluate."""
    request = comm.Ibarrier()
    while not request.Test():
        watchdog.beat()
        time.sleep(WAIT_POLL_S)
