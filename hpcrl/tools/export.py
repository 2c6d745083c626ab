"""Export a run: its policy for torch, its metrics for TensorBoard or as CSV.

    python -m hpcrl.export torch RUN_DIR [-o policy.pt] [--generation G] [--target]
    python -m hpcrl.export tensorboard RUN_DIR [-o DIR] [--follow] [--every S]
    python -m hpcrl.export csv RUN_DIR [-o DIR]

``torch`` writes the network of the newest complete checkpoint (or ``--generation``) as a plain
``state_dict`` and a JSON beside it that says how to use it (algorithm, network, observation
shape, action set, preprocessing, the run's config); ``hpcrl.load_policy(path)`` loads both
back with ``torch.load(weights_only=True)``. Default output: ``RUN_DIR/policy.pt``.

``tensorboard`` writes the ``episodes``, ``eval``, ``train`` and ``final`` groups of
``metrics.h5`` as scalars against global env frames (``episodes/return``, ``train/loss``,
``train/frames_per_second``, ``train/dropped_stale``, the health figures ``train/grad_norm``,
``train/clipped_fraction``, ``train/clip_kept`` and ``train/entropy`` (A3C) or ``train/max_q``
(value methods),
``final/return`` per episode of the final evaluation and ``final/mean_return``, ...) into
``RUN_DIR/tensorboard``, with
the standard library only (:mod:`hpcrl.io.tbevents`: no torch, TensorFlow or protobuf, so it
starts in a second on a login node). It reads a live run safely (SWMR); ``--follow`` keeps appending new rows every ``--every`` seconds until the run is
no longer ``running`` (or its heartbeat is 10 minutes old). Each export replaces the event files
of the previous one in that directory. ``csv`` writes one file per group into ``RUN_DIR/csv``.

Exit status: 0, or 1 with one line on stderr.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path
from typing import Sequence

from hpcrl.io.metrics import COLUMNS, GROUPS, MetricsError, read_metrics
from hpcrl.io.tbevents import EventFileWriter
from hpcrl.tools.runs import DEFAULT_STALE_AFTER_S, run_status


class ExportError(RuntimeError):
    """One line: why the export cannot be written."""


def write_csv(metrics: dict, out_dir: Path) -> list[Path]:
    """One ``GROUP.csv`` per metrics group, the columns of ``COLUMNS`` in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for group in GROUPS:
        path, cols = out_dir / f"{group}.csv", metrics[group]
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(COLUMNS[group])
            for row in zip(*(cols[name].tolist() for name in COLUMNS[group])):
                w.writerow([repr(v) if isinstance(v, float) else v for v in row])
        paths.append(path)
    return paths


#: Scalars per group: every column but the x-axis and the bookkeeping ones.
NOT_SCALARS = {"frames", "wall_time", "rank"}
#: train columns that are NaN where they do not apply (max_q of A3C, entropy of the value
#: methods, all of them in files older than schema 3): such points are left out
HEALTH_TAGS = {"grad_norm", "clipped_fraction", "clip_kept", "entropy", "max_q", "dead_units",
               "dead_params"}


def scalar_tags(group: str) -> list[str]:
    return [name for name in COLUMNS[group] if name not in NOT_SCALARS]


class TensorBoardExport:
    """Appends a run's metrics rows to one TensorBoard event file, from where it stopped."""

    def __init__(self, out_dir: Path):
        self.writer = EventFileWriter(out_dir)
        self.rows = dict.fromkeys(GROUPS, 0)

    def append(self, metrics: dict) -> int:
        """Write the rows not written yet; returns how many rows that was."""
        start = float(metrics["attrs"].get("created_unix", 0.0))
        new = 0
        for group in GROUPS:
            cols = metrics[group]
            n = len(cols["frames"])
            first = min(self.rows[group], n)     # a resumed run rolled rows back: go on from n
            for i in range(first, n):
                step, wall = int(cols["frames"][i]), start + float(cols["wall_time"][i])
                for tag in scalar_tags(group):
                    value = float(cols[tag][i])
                    if math.isfinite(value) or tag not in HEALTH_TAGS:  # NaN: does not apply
                        self.writer.add_scalar(f"{group}/{tag}", value, step, wall)
            new += max(0, n - first)
            self.rows[group] = n
            if group == "final" and n > first:      # the final evaluation's score, one point
                self.writer.add_scalar("final/mean_return", float(cols["return"].mean()),
                                       int(cols["frames"].max()),
                                       start + float(cols["wall_time"].max()))
        self.writer.flush()
        return new

    def close(self) -> None:
        self.writer.close()


#: --follow gives up on a run whose status says running but whose heartbeat is older (its job
#: was killed without a chance to say so): what ``hpcrl.analyze`` calls a stale run.
STALE_AFTER_S = DEFAULT_STALE_AFTER_S
#: --follow: consecutive failed reads (a file locked for seconds, a torn SWMR read) tolerated.
FOLLOW_READ_RETRIES = 10


def _still_running(metrics: dict, now_unix: float) -> bool:
    return run_status(metrics["status"], metrics["heartbeat_unix"], now_unix,
                      STALE_AFTER_S) == "running"


def export_tensorboard(run_dir: Path, out_dir: Path, follow: bool = False, every_s: float = 30.0,
                       log=print) -> int:
    """Write (and with ``follow``, keep writing) the run's metrics as TensorBoard scalars,
    replacing an earlier export's event files in ``out_dir``."""
    metrics_path = run_dir / "metrics.h5"
    metrics = read_metrics(metrics_path)          # a missing file fails before a writer exists
    tb = TensorBoardExport(out_dir)
    total, failures = 0, 0
    try:
        while True:
            total += tb.append(metrics)
            if not follow or not _still_running(metrics, time.time()):
                break
            time.sleep(every_s)
            try:
                metrics, failures = read_metrics(metrics_path), 0
            except MetricsError:
                failures += 1
                if failures > FOLLOW_READ_RETRIES:
                    raise
    except KeyboardInterrupt:
        pass
    finally:
        tb.close()
    if follow and metrics["status"] == "running":
        log(f"tensorboard: {metrics_path} has had no heartbeat for over {STALE_AFTER_S:.0f} s; "
            "stopped following")
    log(f"tensorboard: {total:,} rows of {metrics_path} into {out_dir} "
        f"(tensorboard --logdir {out_dir})")
    return total


def _torch(args: argparse.Namespace) -> None:
    from hpcrl.tools.policy import export_torch, policy_from_run

    policy = policy_from_run(args.run_dir, args.generation, target=args.target)
    out = Path(args.output) if args.output else Path(args.run_dir) / "policy.pt"
    weights, meta = export_torch(policy, out)
    src = policy.source
    print(f"policy: {weights} and {meta} (generation {src.generation}, {src.frames:,} frames); "
          f"load with hpcrl.load_policy('{weights}')")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hpcrl.export", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("torch", help="the policy as a torch state_dict + JSON")
    t.add_argument("run_dir")
    t.add_argument("-o", "--output", help="weights file (default RUN_DIR/policy.pt)")
    t.add_argument("--generation", type=int, help="checkpoint generation (default: newest)")
    t.add_argument("--target", action="store_true", help="the target network's parameters")
    b = sub.add_parser("tensorboard", help="metrics as TensorBoard scalars")
    b.add_argument("run_dir")
    b.add_argument("-o", "--output", help="event file directory (default RUN_DIR/tensorboard)")
    b.add_argument("--follow", action="store_true", help="keep exporting while the run runs")
    b.add_argument("--every", type=float, default=30.0, help="--follow: seconds between reads")
    c = sub.add_parser("csv", help="metrics as one CSV file per group")
    c.add_argument("run_dir")
    c.add_argument("-o", "--output", help="directory (default RUN_DIR/csv)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = Path(args.run_dir)
    from hpcrl.tools.runfiles import RunFilesError

    try:
        if args.what == "torch":
            _torch(args)
        elif args.what == "tensorboard":
            export_tensorboard(run_dir, Path(args.output or run_dir / "tensorboard"),
                               args.follow, args.every)
        else:
            out = Path(args.output or run_dir / "csv")
            paths = write_csv(read_metrics(run_dir / "metrics.h5"), out)
            print("csv: " + ", ".join(map(str, paths)))
    except (ExportError, MetricsError, RunFilesError, OSError, ValueError) as exc:
        print(f"hpcrl.export: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

