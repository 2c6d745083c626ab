"""The loop of every client rank, written once for every worker of every algorithm.

Per iteration: poll the coordinator (which also feeds the watchdog); at a coordinated
checkpoint send the learner's counters, the marker to rank 0 and the worker's own markers,
wait until no gradient of this rank is in flight, write the state and stop or carry on; once
the job-wide frame budget is spent, ask for the final generation; otherwise one worker step,
and the learner's counters to rank 0 every ``STATS_EVERY`` steps. After the final generation
of a spent budget, the final evaluation (:mod:`hpcrl.runtime.final`).
"""

from __future__ import annotations

import time

from hpcrl.core import Worker
from hpcrl.runtime import final
from hpcrl.runtime.context import Context
from hpcrl.runtime.coord import STOP_BUDGET

STATS_EVERY = 64             # worker steps between two counter reports to rank 0
BUDGET_POLL_S = 1e-3         # sleep while the final checkpoint is being asked for


def run_client(ctx: Context, worker: Worker) -> None:
    """Drive ``worker`` until a coordinated checkpoint says stop (a spent budget or a signal)."""
    ctx.hand_over_state(worker.set_state)
    ctx.link.started()
    coord, link, total_frames = ctx.coord, ctx.link, ctx.cfg.total_frames
    steps = 0
    while True:
        if coord.due():
            _send_stats(ctx, worker)
            link.marker()
            worker.before_checkpoint()
            coord.client_ready()
            if coord.write(worker.get_state):
                break
            worker.after_checkpoint()
            continue
        if worker.global_frames() >= total_frames:
            coord.request(STOP_BUDGET)        # the final generation, then stop
            time.sleep(BUDGET_POLL_S)
            continue
        worker.step()
        steps += 1
        if steps % STATS_EVERY == 0:
            _send_stats(ctx, worker)
    if final.final_due(ctx):
        final.client_phase(ctx, worker)
    worker.close()


def _send_stats(ctx: Context, worker: Worker) -> None:
    stats = worker.stats()
    if stats is not None:
        ctx.link.stats(stats)
