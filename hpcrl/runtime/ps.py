"""The loops of the ranks that need no network: parameter servers and global replay.

Neither imports torch (about 155 MB per process; a 130-rank job on shared nodes cannot
afford it), and both check that nothing did.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

from hpcrl.config import Config
from hpcrl.runtime import final, hooks
from hpcrl.runtime.context import Context
from hpcrl.runtime.coord import STOP_BUDGET, STOP_FAILED, STOP_SIGNAL
from hpcrl.runtime.params.header import Word
from hpcrl.runtime.params.optim import ShardOptimizer, tensor_pieces
from hpcrl.runtime.params.server import ShardServer
from hpcrl.runtime.params.store import ParameterStore
from hpcrl.runtime.profiling import ps_cpu_clock
from hpcrl.runtime.reporter import Reporter, early_stop_reason
from hpcrl.runtime.topology import Role

#: A file of this name in the run directory asks for a checkpoint now (rank 0 polls for it).
CHECKPOINT_REQUEST = "checkpoint.request"
REQUEST_POLL_S = 1.0
#: a ps counts its zero optimiser statistics (network health) at least this often
HEALTH_EVERY_S = 10.0


def make_optimizer(cfg: Config, store: ParameterStore,
                   tensor_sizes: Sequence[int] | None = None) -> ShardOptimizer:
    """The update rule of this ps rank's shard; ``tensor_sizes`` (the network's tensors in
    the flat vector's order) let AdaGrad's warm start be set per tensor."""
    lo, hi = store.spec.ranges[store.shard]
    pieces = None if tensor_sizes is None else tensor_pieces(tensor_sizes, lo, hi)
    return ShardOptimizer(cfg.optimizer, store.sizes[store.shard], store.spec.n_clients,
                          decay=cfg.rmsprop_decay, eps=cfg.optim_eps, momentum=cfg.momentum,
                          bias_correction=cfg.rmsprop_bias_correction,
                          initial=cfg.rmsprop_initial,
                          warmup_updates=(cfg.adagrad_warmup_updates
                                          if cfg.optimizer == "adagrad" else 0),
                          rmsprop_updates=cfg.adagrad_rmsprop_updates,
                          rmsprop_start=cfg.adagrad_rmsprop_start, pieces=pieces)


def assert_no_torch(role: str) -> None:
    """ps and replay ranks must not import torch: ~155 MB each, and 130 ranks share a node's
    memory with their replay."""
    if "torch" in sys.modules:
        raise RuntimeError(f"a {role} rank imported torch; it must not (memory per rank)")


def run_ps(ctx: Context) -> None:
    """Apply or drop gradients until a coordinated checkpoint says stop; rank 0 also gathers
    the metrics and applies the early-stop rule."""
    assert_no_torch("ps")
    cfg = ctx.cfg
    # Counted in applied updates (Gorila's N), the ps refreshes the target itself; counted in
    # global agent steps, the client whose step crosses a multiple asks (request_target_refresh).
    target_every = cfg.target_update_every if cfg.target_period_in_updates() else 0
    server = ShardServer(ctx.store, ctx.opt, max_staleness=cfg.max_staleness,
                         target_update_every=target_every,
                         health_every_s=min(cfg.log_every_s, HEALTH_EVERY_S))
    reporter = (Reporter(ctx.mcomm, ctx.store, cfg, ctx.layout, ctx.run_dir, ctx.resume_frames,
                         ctx.hosts, ctx.provenance, ctx.tensors) if ctx.rank == 0 else None)
    if reporter:
        ctx.coord.not_arrived = reporter.not_arrived
        ctx.coord.still_starting = reporter.still_starting
        reporter.guard = ctx.coord.guard
        reporter.request_failed_stop = lambda: ctx.coord.request(STOP_FAILED)
    on_tick = _rank0_tick(ctx, reporter) if reporter else None
    times = hooks.phase_times_dir()
    if times is not None:
        on_tick = ps_cpu_clock(times / f"ps-rank-{ctx.rank}.jsonl", lambda: server.version,
                               on_tick)
    stop = server.serve(idle_sleep_s=cfg.ps_idle_sleep_ms / 1e3, on_tick=on_tick, coord=ctx.coord,
                        before_write=reporter.before_checkpoint if reporter else None)
    if final.final_due(ctx):
        final.server_phase(ctx, reporter)
    if reporter:
        reporter.finish({STOP_SIGNAL: "preempted", STOP_FAILED: "failed"}.get(stop, "finished"))


def _rank0_tick(ctx: Context, reporter: Reporter):
    """Rank 0's tick: gather metrics, then (``early_stop``) end the run like a spent budget
    once the rule holds. After a resume its windows hold the returns that metrics.h5 kept
    (those up to the checkpoint), so a resume that switches early_stop on stops at once
    where the rule already held."""
    stopped = False
    frames = ctx.store.word(Word.FRAMES)
    request = ctx.run_dir / CHECKPOINT_REQUEST
    next_look = 0.0

    def tick() -> None:
        nonlocal stopped, next_look
        reporter.tick()
        if time.monotonic() >= next_look:
            next_look = time.monotonic() + REQUEST_POLL_S
            _take_checkpoint_request(ctx, request)
        if not ctx.cfg.early_stop or stopped:
            return
        reason = early_stop_reason(reporter.returns, reporter.eval_returns,
                                   ctx.cfg.early_stop_return)
        if reason:
            stopped = True
            print(f"[hpcrl] early stop: {reason} at frame {frames.read():,}",
                  flush=True)
            ctx.coord.request(STOP_BUDGET)
    return tick


def _take_checkpoint_request(ctx: Context, request: Path) -> None:
    """A file ``checkpoint.request`` in the run directory asks for a checkpoint generation now
    (the run goes on): it reaches the job from any shell on any node, whatever the launcher
    (hydra's mpiexec does not forward SIGUSR2 to the ranks). Rank 0 removes it and asks."""
    try:
        request.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        print(f"hpcrl: warning: cannot remove {request} ({exc.strerror or exc}); "
              "checkpoint requests through it are ignored", flush=True)
        return
    print(f"[hpcrl] checkpoint requested through {request.name}", flush=True)
    ctx.coord.request()


def run_replay(ctx: Context) -> None:
    """A global replay rank: serves its actors' streams to all learners."""
    assert_no_torch("replay")
    from hpcrl.envs import env_spec
    from hpcrl.rl.replay import frame_layout
    from hpcrl.runtime.replay_server import ReplayServer

    cfg, layout = ctx.cfg, ctx.layout
    stack, frame_shape, frame_dtype = frame_layout(env_spec(cfg)[0])
    replays = layout.ranks_of(Role.REPLAY)
    me = replays.index(ctx.rank)
    n_actors = len(layout.ranks_of(Role.ACTOR))
    n_streams = sum(1 for a in range(n_actors) if a % len(replays) == me) * cfg.envs_per_actor
    n_peers = n_actors + len(layout.ranks_of(Role.LEARNER))
    server = ReplayServer(ctx.rcomm, cfg.replay_capacity, cfg.replay_min_fill, frame_shape,
                          frame_dtype, stack, n_streams, n_peers, ctx.seed, n_step=cfg.n_step,
                          gamma=cfg.gamma)
    ctx.hand_over_state(server.set_state)
    server.serve(coord=ctx.coord, save_replay=cfg.checkpoint_replay)
    if final.final_due(ctx):
        final.server_phase(ctx)
