"""Rank 0's gatherer: episodes and learner counters from every client into ``metrics.h5``,
plus a progress line every ``log_every_s`` seconds; and the early-stop rule it feeds."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
from mpi4py import MPI

from hpcrl.version import __version__
from hpcrl.config import Config, to_toml
from hpcrl.core import STATS_FIELDS
from hpcrl.io.metrics import MetricsWriter
from hpcrl.runtime import hooks
from hpcrl.runtime import watchdog
from hpcrl.runtime.context import EPISODE_FIELDS, EPISODE_GROUPS, ROW_FLOATS, TAG_CKPT, \
    TAG_EPISODE, TAG_FINAL, TAG_STARTED, TAG_STATS
from hpcrl.runtime.params.store import ParameterStore
from hpcrl.runtime.topology import Layout

EARLY_STOP_WINDOW = 20       # episodes averaged by the early-stop rule
RATE_WINDOW_S = 300.0        # the time left is estimated at the rate of about the last 5 min
#: The train row's counters that say whether a row would repeat the last one.
ROW_KEY = ("frames", "updates", "dropped_stale", "dropped_outlier", "dropped_nonfinite")


def early_stop_reason(train_returns: list[float], eval_returns: list[float],
                      threshold: float, window: int = EARLY_STOP_WINDOW) -> str | None:
    """``early_stop``: why the run should end now, or None. The mean of the last ``window``
    evaluation episodes (training episodes when nothing evaluates) must reach ``threshold``."""
    kind, returns = (("evaluation", eval_returns) if eval_returns else ("training", train_returns))
    if len(returns) < window or np.mean(returns[-window:]) < threshold:
        return None
    return (f"mean return of the last {window} {kind} episodes "
            f"{np.mean(returns[-window:]):.1f} >= {threshold}")


def interval_means(before: dict | None, now: dict, algo: str) -> dict[str, float]:
    """The ``train`` row's means since the previous report, from the learners' summed
    counters (:class:`hpcrl.core.LearnerStats`) then and now: loss, grad_norm,
    clipped_fraction, clip_kept and entropy (A3C) or max_q (value methods); NaN without a
    gradient in between, for the figure that does not apply, and for every figure without earlier
    counters (``before`` None: the first report after a resume, whose restored counters hold
    the run's whole history)."""
    def per(total: str, count: str) -> float:
        n = now[count] - before[count] if before is not None else 0
        return (now[total] - before[total]) / n if n else float("nan")

    nan = float("nan")
    return {"loss": per("loss_sum", "loss_count"),
            "grad_norm": per("grad_norm_sum", "grad_norm_count"),
            "clipped_fraction": per("grad_clipped", "grad_norm_count"),
            "clip_kept": 1.0 - per("grad_cut_sum", "grad_norm_sum"),
            "entropy": per("entropy_sum", "loss_count") if algo == "a3c" else nan,
            "max_q": per("max_q_sum", "loss_count") if algo != "a3c" else nan}


#: The ps count their zero statistics after this many applied updates: before, a statistic
#: at 0 may just not have seen its first gradient.
HEALTH_AFTER_UPDATES = 100
#: ln of the smallest normal float32 (1.2e-38): the ps kernel flushes smaller values to 0
_LN_TINY = 87.3
#: optimisers whose statistic is 0 exactly where no gradient arrives (RMSProp's v, AdaGrad's G)
STATISTIC_OPTIMIZERS = ("rmsprop_shared", "rmsprop_per_client", "adagrad", "adam_shared")


def dead_warn_after_updates(cfg: Config) -> int:
    """Applied updates after which a statistic at 0 can be a unit that *lost* its gradient:
    RMSProp's v decays by ``rmsprop_decay`` per update without one and reads 0 once below the
    smallest float, after about 87.3 / -ln(decay) updates (8,700 at 0.99); AdaGrad's G never
    decays (0 = never a gradient), so its count means the same from the start."""
    if cfg.optimizer == "adagrad" or cfg.rmsprop_decay >= 1.0:
        return HEALTH_AFTER_UPDATES
    if cfg.rmsprop_decay <= 0.0:
        return HEALTH_AFTER_UPDATES + 1
    return HEALTH_AFTER_UPDATES + int(np.ceil(_LN_TINY / -np.log(cfg.rmsprop_decay)))


def dead_shares(zero_counts: np.ndarray, tensors: tuple) -> dict:
    """From per-tensor counts of zero statistics: ``dead_units``, the largest share among the
    bias tensors (a bias without a gradient is a dead unit: the worst layer's share of dead
    units), ``dead_params``, the share of all parameters, and ``layers``, each bias tensor's
    share by name; as ``hpcrl.diagnose`` reads them from a checkpoint."""
    sizes = np.array([size for _, size in tensors], np.float64)
    shares = np.asarray(zero_counts, np.float64) / np.maximum(sizes, 1)
    layers = {name: float(share) for (name, _), share in zip(tensors, shares) if "bias" in name}
    return {"dead_units": max(layers.values()) if layers else np.nan,
            "dead_params": float(np.sum(zero_counts) / max(sizes.sum(), 1)),
            "layers": layers}


class CollapseWatch:
    """Says when a run that learned is losing it: the mean of the last ``window`` training
    returns falls back to halfway between the first window's mean and the best one so far,
    after the best had risen clearly (more than twice the spread of its own window) above the
    first. Once per fall: it re-arms when the mean is back at three quarters of the way.

    Why: an A3C Pong run fell from +17 to -20 for 13 episodes and recovered, and runs whose
    units die keep training at -21 for days; neither said anything while it happened.
    """

    def __init__(self, window: int = EARLY_STOP_WINDOW):
        self.window = window
        self.first: float | None = None
        self.best, self.best_spread = -np.inf, 0.0
        self.armed = True

    def update(self, returns: list[float]) -> str | None:
        """The warning's text when the fall happens now, else None."""
        if len(returns) < self.window:
            return None
        return self._judge(returns[-self.window:])

    def catch_up(self, returns: list[float]) -> None:
        """Judge the returns of earlier starts (a resume) at every episode, without warning:
        first, best and the arming carry on as if this watch had seen them live."""
        for end in range(self.window, len(returns) + 1):
            self._judge(returns[end - self.window:end])

    def _judge(self, window_returns: list[float]) -> str | None:
        recent = np.asarray(window_returns, np.float64)
        mean = float(recent.mean())
        if self.first is None:
            self.first = mean
        if mean > self.best:
            self.best, self.best_spread = mean, float(recent.std())
        gain = self.best - self.first
        if gain <= 2 * self.best_spread:
            return None
        if self.armed and mean <= self.first + gain / 2:
            self.armed = False
            return (f"the mean return of the last {self.window} training episodes fell to "
                    f"{mean:.2f} from a best of {self.best:.2f} (first {self.window}: "
                    f"{self.first:.2f}): the run may be losing what it learned; see the train "
                    "rows' grad_norm and entropy/max_q and python -m hpcrl.diagnose RUN_DIR")
        if not self.armed and mean >= self.first + 0.75 * gain:
            self.armed = True
        return None


class RecentRate:
    """Frames and seconds over about the last ``window_s`` seconds of log lines, for the time
    left.

    A start's average rate is the wrong one for a job whose speed changes: a Gorila job fills
    its replay memories before its learners begin, at about 3x the frames/s it keeps once they
    do: at 0.66 M frames of a 12 M-frame Pong job, the average since the start gave 0:42:47
    left while the job ran 2,611 frames/s, 72 min's worth. So, as tqdm smooths its rate, the
    estimate uses a recent window: the oldest sample kept is the newest one at least
    ``window_s`` old, so the window spans ``window_s`` or more once the start is that old (and
    covers the periodic evaluations, which pause acting for tens of seconds every few
    minutes).
    """

    def __init__(self, t0: float, frames0: int, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque([(t0, frames0)])

    def update(self, now: float, frames: int) -> tuple[int, float]:
        """Add a sample; return (frames, seconds) over the window ending at it."""
        self.samples.append((now, frames))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()
        t_old, f_old = self.samples[0]
        return frames - f_old, now - t_old


def progress_text(frames: int, total_frames: int, frames_in_window: int,
                  seconds_in_window: float) -> str:
    """The share of the frame budget done and the time left at the rate of a recent window
    (:class:`RecentRate`), as "37.5% of 24,000,000, 1:02:03 left" (tqdm-style; "?" before
    any frame)."""
    done = min(frames / total_frames, 1.0)
    if frames_in_window <= 0 or seconds_in_window <= 0:
        return f"{100 * done:.1f}% of {total_frames:,}, ? left"
    left_s = int(max(total_frames - frames, 0) * seconds_in_window / frames_in_window)
    return (f"{100 * done:.1f}% of {total_frames:,}, "
            f"{left_s // 3600}:{left_s // 60 % 60:02d}:{left_s % 60:02d} left")


def final_summary(rows: list[tuple[float, float]], seconds: float) -> str:
    """The log line of the final evaluation: episodes, mean return and its spread, cost."""
    if not rows:
        return "final evaluation: no episodes"
    returns = np.array([r for r, _ in rows])
    frames = int(sum(n for _, n in rows))
    return (f"final evaluation: {len(rows)} episodes, mean return {returns.mean():.2f} "
            f"(std {returns.std():.2f}, min {returns.min():g}, max {returns.max():g}), "
            f"{frames:,} frames in {seconds:.1f} s ({frames / max(seconds, 1e-9):,.0f} "
            "frames/s over the evaluating ranks)")


class Reporter:
    """Rank 0's gatherer: episodes and learner statistics from all clients into metrics.h5,
    plus a progress line every ``log_every_s`` seconds."""

    def __init__(self, mcomm: MPI.Comm, store: ParameterStore, cfg: Config, layout: Layout,
                 run_dir: Path, resume_frames: int | None = None,
                 hosts: list[str] | None = None, provenance: dict | None = None,
                 tensors: tuple = ()):
        self.mcomm, self.store, self.cfg = mcomm, store, cfg
        self.clients = layout.client_ranks
        attrs = dict(algo=cfg.algo, game=cfg.game, seed=cfg.seed, config=to_toml(cfg),
                     hpcrl_version=__version__, provenance=json.dumps(provenance or {}))
        path = run_dir / "metrics.h5"
        resume = resume_frames is not None and path.exists()
        if path.exists() and not resume:                 # a start that never checkpointed
            old = run_dir / f"metrics.old-{int(time.time())}.h5"
            os.replace(path, old)
            print(f"hpcrl: warning: {run_dir} has metrics but no checkpoint; starting over, the "
                  f"old metrics are kept as {old.name}", flush=True)
        self.writer = MetricsWriter(path, attrs, resume=resume)
        #: the counters of the last train row (None: no row yet), so that the end of a run
        #: does not write the same row twice
        self.reported: tuple | None = None
        #: training and evaluation returns in arrival order: the log line's means, early
        #: stop and the collapse watch read them; a resume continues them from metrics.h5
        self.returns: list[float] = []
        self.eval_returns: list[float] = []
        if resume:
            kept = self.writer.rollback(resume_frames)            # rows after the checkpoint
            train = kept["train"]                                  # happen again
            if len(train["frames"]):
                self.reported = tuple(int(train[name][-1]) for name in ROW_KEY)
            self.returns = kept["episodes"]["return"].tolist()
            self.eval_returns = kept["eval"]["return"].tolist()
        self.markers = 0
        self.resume_frames = resume_frames or 0
        self.stats = {r: np.zeros(len(STATS_FIELDS)) for r in self.clients}
        #: the learners' counters at the previous report (None: not yet after a resume)
        self.stats_at_report = (None if resume_frames is not None
                                else dict.fromkeys(STATS_FIELDS, 0.0))
        self.collapse = CollapseWatch()
        self.collapse.catch_up(self.returns)
        #: the network's (name, size) in the flat order; the layers already said half dead
        self.tensors = tuple(tensors)
        self.half_dead: set[str] = set()
        self.final_rows: list[tuple[float, float]] = []     # (return, length) of each
        self.final_done: set[int] = set()      # clients whose final evaluation is complete
        self.episodes = 0
        self.t0 = time.monotonic()
        self.last_report = (self.t0, self.resume_frames)
        self.recent = RecentRate(self.t0, self.resume_frames)
        if resume:
            self.episodes = self.writer.rows("episodes")
        self.buf = np.zeros(ROW_FLOATS)
        self.tty = sys.stdout.isatty()
        self.roles, self.hosts = layout.role_names(), hosts
        self.marked: set[int] = set()          # clients whose checkpoint marker arrived
        self.heard = {r: time.monotonic() for r in self.clients}   # last message of each
        self.started: set[int] = set()         # clients that have built their workers
        #: the run directory's lease check (LeaseLost: another job holds it), before flushes
        self.guard = None
        #: metrics.h5 flushes that failed in a row (a full disk, a quota), the last error, how
        #: many end the run, and the call that stops it (a checkpoint, then status 3)
        self.flush_failures, self.flush_error = 0, ""
        self.max_flush_failures = cfg.checkpoint_max_failures
        self.request_failed_stop = None

    def drain(self) -> None:
        status = MPI.Status()
        while self.mcomm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            src, tag = status.Get_source(), status.Get_tag()
            self.mcomm.Recv(self.buf, src, tag)
            self.heard[src] = time.monotonic()
            if tag == TAG_EPISODE:
                row = dict(zip(EPISODE_FIELDS, self.buf))
                row["wall_time"] += self.writer.wall_offset_s   # the worker's clock: this start
                group = EPISODE_GROUPS[int(row["kind"])]
                self.writer.append(group, **{k: row[k] for k in EPISODE_FIELDS[1:]})
                if group == "episodes":
                    self.returns.append(row["return"])
                    self.episodes += 1
                elif group == "eval":
                    self.eval_returns.append(row["return"])
                else:
                    self.final_rows.append((row["return"], row["length"]))
            elif tag == TAG_FINAL:
                self.final_done.add(src)
            elif tag == TAG_STARTED:
                self.started.add(src)
            elif tag == TAG_STATS:
                self.stats[src] = self.buf[:len(STATS_FIELDS)].copy()
            elif tag == TAG_CKPT:
                self.markers += 1
                self.marked.add(src)

    def tick(self) -> None:
        self.drain()
        now = time.monotonic()
        if now - self.last_report[0] >= self.cfg.log_every_s:
            self.report(now)

    def _totals(self) -> tuple[dict, dict]:
        """The ps counters and the learners' summed counters."""
        total = np.sum(list(self.stats.values()), axis=0)
        return self.store.counters(), dict(zip(STATS_FIELDS, total))

    @staticmethod
    def _row_key(c: dict, s: dict) -> tuple:
        """A train row's counters, in ROW_KEY's order."""
        return (int(c["frames"]), int(c["applied"]), int(c["dropped_stale"]),
                int(s["dropped_outlier"]), int(c["dropped_nonfinite"] + s["dropped_nonfinite"]))

    def report(self, now: float) -> None:
        c, s = self._totals()
        means = interval_means(self.stats_at_report, s, self.cfg.algo)
        self.stats_at_report = s
        t_prev, f_prev = self.last_report
        fps = (c["frames"] - f_prev) / max(now - t_prev, 1e-9)
        self.last_report = (now, c["frames"])
        dead = self.dead_shares(c["applied"])
        key = self._row_key(c, s)          # the row's counters, as ROW_KEY orders them
        self.writer.append("train", frames=c["frames"], updates=c["applied"],
                           dropped_stale=c["dropped_stale"],
                           dropped_outlier=key[3], dropped_nonfinite=key[4],
                           frames_per_second=fps, dead_units=dead["dead_units"],
                           dead_params=dead["dead_params"], **means)  # wall_time: the file's
        self.reported = key
        self.flush()
        for warning in [self.collapse.update(self.returns)] + self.dead_warnings(dead,
                                                                                 c["applied"]):
            if warning:
                print(f"hpcrl: warning: {warning}", flush=True)
        recent = np.mean(self.returns[-20:]) if self.returns else float("nan")
        evals = (f"eval(last 20) {np.mean(self.eval_returns[-20:]):8.2f} | "
                 if self.eval_returns else "")
        line = (f"frames {c['frames']:>11,} | {fps:8.0f} frames/s | episodes {self.episodes:>6} | "
                f"return(last 20) {recent:8.2f} | {evals}updates {c['applied']:>9,} | dropped stale "
                f"{c['dropped_stale']} outlier {int(s['dropped_outlier'])} nonfinite "
                f"{c['dropped_nonfinite'] + int(s['dropped_nonfinite'])}")
        progress = progress_text(c["frames"], self.cfg.total_frames,
                                 *self.recent.update(now, c["frames"]))
        if self.tty:
            done = min(c["frames"] / self.cfg.total_frames, 1.0)
            bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
            print(f"\r[{bar}] {progress} | {line}", end="", flush=True)
        else:
            print(f"[hpcrl] {line} | {progress}", flush=True)

    def dead_shares(self, applied: int) -> dict:
        """The ps ranks' latest counts of zero optimiser statistics as shares (see
        :func:`dead_shares`); NaN before :data:`HEALTH_AFTER_UPDATES` updates (every statistic
        starts at 0) and for optimisers without one."""
        if not self.tensors or applied < HEALTH_AFTER_UPDATES or self.cfg.optimizer not in \
                STATISTIC_OPTIMIZERS:
            return {"dead_units": np.nan, "dead_params": np.nan, "layers": {}}
        return dead_shares(self.store.zero_statistics(), self.tensors)

    def dead_warnings(self, dead: dict, applied: int) -> list[str]:
        """Once per layer: it has passed half dead (once a statistic at 0 can mean a unit that
        lost its gradient, :func:`dead_warn_after_updates`)."""
        after = dead_warn_after_updates(self.cfg)
        if applied < after:
            return []
        out = []
        for name, share in dead["layers"].items():
            if share >= 0.5 and name not in self.half_dead:
                self.half_dead.add(name)
                out.append(f"{100 * share:.0f} % of the units of {name} no longer learn (their "
                           f"optimiser statistic is 0: no gradient for about "
                           f"{after - HEALTH_AFTER_UPDATES:,} updates or more); "
                           "a network losing its units rarely recovers: see python -m "
                           "hpcrl.diagnose RUN_DIR, and lower the learning rate or change the "
                           "init (docs/experiments/a3c-pong-dead-units.md)")
        return out

    def before_checkpoint(self) -> None:
        """Drain every client's messages up to its checkpoint marker, then flush: the file then
        holds exactly the episodes played before the checkpoint."""
        while self.markers < len(self.clients):
            self.drain()
            time.sleep(1e-4)
        self.markers = 0
        self.marked.clear()
        return None if self.flush(counted=False) else f"metrics.h5: {self.flush_error}"

    def flush(self, counted: bool = True) -> bool:
        """Write the buffered rows to metrics.h5; whether that worked. A failed flush (a full
        disk, a quota) keeps every row buffered for the next one and prints a warning; after
        ``checkpoint_max_failures`` failures in a row the run is stopped as failed, with a
        checkpoint (whose own flush must succeed for it to count: a resume then neither loses
        nor repeats rows). A checkpoint's flush is not ``counted``: its failure fails the
        generation, which the checkpoint's own count reports."""
        if self.guard is not None:
            self.guard()
        try:
            hooks.metrics_flush_fails(self.writer.path)
            self.writer.flush()
        except OSError as exc:
            self.flush_error = exc.strerror or str(exc)
            if not counted:
                return False
            self.flush_failures += 1
            if self.writer.broken is not None:        # failed inside HDF5: no retry helps
                self.flush_failures = max(self.flush_failures, self.max_flush_failures)
            if self.flush_failures == self.max_flush_failures and self.request_failed_stop:
                times = ("" if self.writer.broken is not None else
                         f" {self.flush_failures} times in a row")
                print(f"hpcrl: error: metrics.h5 could not be written{times} "
                      f"({self.flush_error}); the run stops as failed with "
                      "status 3 after a checkpoint, not requeued (free space or raise the "
                      "quota, then run the same command to resume)", flush=True)
                self.request_failed_stop()
            elif self.flush_failures < self.max_flush_failures:
                print(f"hpcrl: warning: metrics.h5 not written ({self.flush_error}); its rows "
                      f"are kept in memory and written at the next flush ({self.flush_failures} "
                      f"of {self.max_flush_failures} failures in a row)", flush=True)
            return False
        if self.flush_failures:
            print(f"[hpcrl] metrics.h5 written again after {self.flush_failures} failed "
                  "flushes; no row lost", flush=True)
            self.flush_failures = 0
        return True

    def still_starting(self) -> bool:
        """Whether a client that has not arrived at the checkpoint is still building its
        worker (importing torch can take minutes on a shared file system)."""
        self.drain()
        return any(r not in self.started and r not in self.marked for r in self.clients)

    def not_arrived(self) -> str:
        """The clients whose checkpoint marker has not come (a coordinated checkpoint waits for
        them): rank, role, host and when rank 0 last heard from each."""
        self.drain()
        now = time.monotonic()
        host = (lambda r: self.hosts[r]) if self.hosts else (lambda r: "?")
        return "; ".join(f"rank {r} ({self.roles[r]}) on host {host(r)}, last heard from "
                         f"{now - self.heard[r]:.0f} s ago"
                         for r in self.clients if r not in self.marked)

    def collect_final(self, ranks: tuple[int, ...], stall_s: float) -> None:
        """Gather the final evaluation's episodes until each of ``ranks`` said it is done;
        prints their summary. A rank not heard from (episode or alive message) for
        ``stall_s`` is named in a RuntimeError: rank 0 does not wait for a frozen peer."""
        t0 = time.monotonic()
        for r in ranks:
            self.heard[r] = t0
        while not self.final_done.issuperset(ranks):
            self.drain()
            watchdog.beat()
            now = time.monotonic()
            silent = [r for r in ranks if r not in self.final_done
                      and now - self.heard[r] > stall_s]
            if silent:
                self.flush()
                host = (lambda r: self.hosts[r]) if self.hosts else (lambda r: "?")
                raise RuntimeError("final evaluation: no word from " + "; ".join(
                    f"rank {r} ({self.roles[r]}) on host {host(r)} for "
                    f"{now - self.heard[r]:.0f} s" for r in silent))
            time.sleep(1e-3)
        self.flush()
        print(f"[hpcrl] {final_summary(self.final_rows, time.monotonic() - t0)}", flush=True)

    def finish(self, status: str = "finished") -> None:
        self.drain()
        # Only if a counter moved since the last row, which then says it all (its wall time
        # may come before the final evaluation's).
        if self._row_key(*self._totals()) != self.reported:
            self.report(time.monotonic())
        if self.tty:
            print(flush=True)
        try:
            self.writer.close(status)
        except OSError as exc:           # a run stopping as failed said so already
            level = "warning" if status == "failed" else "error"
            print(f"hpcrl: {level}: metrics.h5 could not be closed ({exc.strerror or exc}); a "
                  "resume continues it from the newest checkpoint", flush=True)
