"""`python -m hpcrl.analyze PATH [PATH ...]`: score tables and learning curves of hpcrl runs.

Reads every `metrics.h5` under the given run directories (laid out as
`results/<algo>/<game>/seed-<seed>/`), also while the runs are still being written or after
they crashed, and reports per game: seeds, frames reached, final score (the mean of the
final evaluation of the final weights, 30 episodes, as in Mnih et al. 2015, once the run has
one; until then the mean of the last N periodic evaluation episodes; training episodes, marked
`*`, when a run has no evaluation episodes), the human-normalised score

    HNS = (agent - random) / (human - random)             (Mnih et al. 2015; Nair et al. 2015)

and the published per-game scores of the columns asked for with `--compare`. With `--atari5`
it also estimates the 57-game median HNS from the five games of Atari-5 (Aitchison et al.
2023; :mod:`hpcrl.tools.atari5`), for runs of only those games. With `--bands FRAMES` it
prints each run's curve in bands of FRAMES global frames (evaluation and training means,
entropy or max Q, dead units, frames/s), the form the tables of `docs/experiments/` take;
with `--milestones` when the mean of 20 episodes first reached given returns. The summary gives
mean and median HNS over the games present and, for each compared column, the column's mean and
median restricted to the same games: a 3-game run is never compared with a 57-game mean.

Evaluation protocols. Each published column was measured under one start condition, written
in its name (`_noop`: up to 30 no-op actions; `_human_starts`: 100 start states from human
play, Nair et al. 2015). The start states of human starts are not public, so hpcrl runs are
always evaluated with no-op starts; a comparison against a human-start column is printed, but
flagged with `!`. Each published column is normalised with the random/human pair of its own
start condition (`--protocol` if that matches, else `noop` / `human_starts`), as its paper did:
with `--protocol human_starts`, `gorila_human_starts` gives mean 215.2 % and median 71.3 % over
49 games, the Gorila row of Table 1 of the A3C paper. Reference data and provenance:
`hpcrl/data/README.md`.

The code is split by what it does: the reference and published scores and the score math
(pure functions of arrays and dicts: hns, final scores, spreads, summaries, restriction to
common games) are in :mod:`hpcrl.tools.scores`; finding and reading runs (`load_run`, the
I/O) in :mod:`hpcrl.tools.runs`; the report and its formats in :mod:`hpcrl.tools.report`; the
plots in :mod:`hpcrl.tools.plots`. This module holds the command line (`main`) and re-exports
the names used from here.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

# used by main, or re-exported: tests and users import these names from hpcrl.tools.analyze
from hpcrl.tools.atari5 import WEIGHTS as ATARI_SUBSETS
from hpcrl.tools.plots import X_AXES, _curve, learning_curve, plot_report, rolling_mean
from hpcrl.tools.report import (
    aggregate_rows,
    band_table,
    build_report,
    format_report,
    milestone_table,
    subset_rows,
)
from hpcrl.tools.runs import (
    DEFAULT_STALE_AFTER_S,
    METRICS_FILE,
    RunResult,
    find_metrics_files,
    game_id,
    load_run,
    run_status,
)
from hpcrl.tools.scores import (
    PROTOCOLS,
    column_protocol,
    column_starts,
    common_games,
    compare_with_column,
    final_score,
    hns,
    hns_summary,
    milestones,
    normalise,
    published_hns,
    published_scores,
    reference_scores,
    score_columns,
    spread,
)

DEFAULT_LAST_N = 30  # evaluation episodes averaged for the final score


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m hpcrl.analyze",
        description="Score tables (human-normalised, against published columns) and learning "
                    "curves of hpcrl runs; works on runs that are still being written.")
    p.add_argument("paths", nargs="+", help="run directories (results/<algo>/<game>/seed-<n>) "
                   "or trees of them, or metrics.h5 files")
    p.add_argument("--last", type=int, default=DEFAULT_LAST_N, metavar="N",
                   help="runs without a final evaluation: final score = mean of the last N "
                        "evaluation episodes (default 30)")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default="noop",
                   help="random/human pair for HNS (default noop)")
    p.add_argument("--compare", default="", metavar="COL[,COL...]",
                   help="published columns to compare with, e.g. dqn_nature_noop,gorila_noop,"
                        "a3c_ff_human_starts")
    p.add_argument("--format", choices=["text", "markdown", "csv", "json"], default="text")
    p.add_argument("--plot", metavar="DIR", help="write learning curves, training plots and an "
                   "HNS bar chart (and with --stats, performance profiles)")
    p.add_argument("--x", choices=list(X_AXES), default="frames",
                   help="x-axis of the plots: env frames (default) or wall-clock hours")
    p.add_argument("--stats", action="store_true",
                   help="IQM, median, mean and optimality gap of HNS over games and seeds, each "
                        "with a 95%% stratified-bootstrap interval (Agarwal et al. 2021)")
    p.add_argument("--reps", type=int, default=10_000, metavar="N",
                   help="--stats, --atari5: bootstrap resamples (default 10000)")
    p.add_argument("--atari5", nargs="?", const="atari5", default=None, metavar="SUBSET",
                   help="estimate the 57-game median HNS from the Atari-5 games (Aitchison et "
                        "al. 2023), with a bootstrap interval over seeds; SUBSET: "
                        + ", ".join(ATARI_SUBSETS) + " (default atari5)")
    p.add_argument("--milestones", metavar="R[,R...]", default="",
                   help="also print, per run, the frames and minutes until the mean return of 20 "
                        "episodes first reached each return R, e.g. --milestones=-15,0,10,18 for "
                        "Pong (with =, as the list starts with a minus)")
    p.add_argument("--bands", type=float, default=0, metavar="FRAMES",
                   help="also print, per run, its curve in bands of FRAMES global frames (e.g. "
                        "1e6): mean evaluation and training return, entropy or max Q, dead "
                        "units, frames/s")
    p.add_argument("--stale-after", type=float, default=DEFAULT_STALE_AFTER_S, metavar="S",
                   help="report a running run as stale after S seconds without a heartbeat")
    args = p.parse_args(argv)
    if args.last < 1:
        p.error("--last must be >= 1")
    if args.bands and (args.bands < 1 or args.bands != int(args.bands)):
        p.error(f"--bands takes a whole number of frames >= 1, not {args.bands:g}")
    args.bands = int(args.bands)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.atari5 is not None and args.atari5 not in ATARI_SUBSETS:
        p.error(f"--atari5 takes one of {', '.join(ATARI_SUBSETS)}, not {args.atari5!r}")
    args.columns = [c.strip() for c in args.compare.split(",") if c.strip()]
    try:
        args.milestones = [float(x) for x in args.milestones.split(",") if x.strip()]
    except ValueError:
        p.error(f"--milestones takes numbers separated by commas, not {args.milestones!r}")
    unknown = [c for c in args.columns if c not in score_columns()]
    if unknown:
        p.error(f"unknown --compare column(s) {', '.join(unknown)}; "
                f"known: {', '.join(score_columns())}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns 0, or 1 when no readable run was found (2: bad arguments)."""
    args = _parse_args(argv)
    files, missing = find_metrics_files(args.paths)
    for path in missing:
        print(f"hpcrl.analyze: no such path: {path}", file=sys.stderr)
    if not files:
        print(f"hpcrl.analyze: no runs found (no {METRICS_FILE} under "
              f"{', '.join(map(str, args.paths))})", file=sys.stderr)
        return 1
    now = time.time()
    runs = [load_run(f, args.last, now, args.stale_after) for f in files]
    for run in runs:
        if run.status == "unreadable":
            print(f"hpcrl.analyze: unreadable run: {run.error}", file=sys.stderr)
    report = build_report(runs, args.protocol, args.columns, args.last)
    if args.stats:
        report["aggregates"] = aggregate_rows(report["games"], args.reps)
        if not report["aggregates"]:
            print("hpcrl.analyze: --stats: no Atari game with a human-normalised score to "
                  "aggregate", file=sys.stderr)
        elif args.format == "csv":
            print("hpcrl.analyze: --stats: the csv format holds the per-game table only; "
                  "use --format json for the aggregates", file=sys.stderr)
    if args.atari5:
        report["subset"] = subset_rows(report["games"], args.atari5, args.reps)
        if args.format == "csv":
            print(f"hpcrl.analyze: --atari5: the csv format holds the per-game table only; "
                  "use --format json for the estimate", file=sys.stderr)
    sys.stdout.write(format_report(report, args.format))
    if args.milestones:
        sys.stdout.write("\n" + milestone_table(runs, args.milestones) + "\n")
    if args.bands:
        for run in runs:
            if run.status != "unreadable" and run.frames:
                sys.stdout.write("\n" + band_table(run, args.bands) + "\n")
    if args.plot:
        for path in plot_report(report, runs, args.plot, args.x):
            print(f"hpcrl.analyze: wrote {path}", file=sys.stderr)
    return 0 if report["num_readable"] else 1


if __name__ == "__main__":
    sys.exit(main())
