"""`python -m hpcrl.analyze PATH [PATH ...]`: score tables and learning curves of hpcrl runs.

Reads every `metrics.h5` under the given run directories (laid out as
`results/<algo>/<game>/seed-<seed>/`), also while the runs are still being written or after
they crashed, and reports per game: seeds, frames reached, final score (the mean of the
final evaluation of the final weights, 30 episodes, as in Mnih et al. 2015, once the run has
one; until then the mean of the last N periodic evaluation episodes; training episodes, marked
`*`, when a run has no evaluation episodes), the human-normalised score

    HNS = (agent - random) / (human - random)             (Mnih et al. 2015; Nair et al. 2015)

and the published per-game scores of the columns asked for with `--compare`. The summary gives
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

The math (hns, final scores, spreads, summaries, restriction to common games) is in pure
functions of arrays and dicts; `load_run` and `main` do the I/O.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from hpcrl.io.metrics import MetricsError, read_metrics

METRICS_FILE = "metrics.h5"
DEFAULT_LAST_N = 30  # evaluation episodes averaged for the final score
DEFAULT_STALE_AFTER_S = 600.0  # a "running" run whose heartbeat is older is reported "stale"

# protocol -> (reference file, start condition of the episodes it normalises)
PROTOCOLS: dict[str, tuple[str, str]] = {
    "noop": ("atari_reference_scores.csv", "noop"),
    "human_starts": ("atari_reference_scores_human_starts.csv", "human_starts"),
    "nature2015": ("atari_reference_scores_nature2015.csv", "noop"),
}
DEFAULT_PROTOCOL_FOR_STARTS = {"noop": "noop", "human_starts": "human_starts"}
PUBLISHED_FILE = "published_agent_scores.csv"
OUR_STARTS = "noop"  # how hpcrl evaluates (human start states are not public)


# ---------------------------------------------------------------------------------------------
# Reference data (package data)
# ---------------------------------------------------------------------------------------------


def _read_csv(name: str) -> list[dict[str, str]]:
    text = resources.files("hpcrl").joinpath("data", name).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


@cache
def reference_scores(protocol: str) -> dict[str, tuple[float, float]]:
    """`{game: (random, human)}` of one protocol ("noop", "human_starts", "nature2015")."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {list(PROTOCOLS)}")
    rows = _read_csv(PROTOCOLS[protocol][0])
    return {r["game"]: (float(r["random"]), float(r["human"])) for r in rows}


@cache
def published_scores() -> dict[str, dict[str, float]]:
    """`{column: {game: raw score}}` of published_agent_scores.csv; empty cells left out."""
    rows = _read_csv(PUBLISHED_FILE)
    columns = [c for c in rows[0] if c != "game"]
    return {c: {r["game"]: float(r[c]) for r in rows if r[c].strip()} for c in columns}


def score_columns() -> list[str]:
    """Published columns that hold scores (not the `_std` columns)."""
    return [c for c in published_scores() if not c.endswith("_std")]


def column_starts(column: str) -> str:
    """Start condition of a published column, from its name: "noop" or "human_starts"."""
    if column not in score_columns():
        raise ValueError(f"unknown score column {column!r}; known: {', '.join(score_columns())}")
    return "human_starts" if "human_starts" in column else "noop"


def column_protocol(column: str, protocol: str) -> str:
    """Reference pair used to normalise a published column.

    The column's own start condition decides; `protocol` is used when it shares that start
    condition (e.g. `nature2015` for `dqn_nature_noop`), else the condition's default.
    """
    starts = column_starts(column)
    return protocol if PROTOCOLS[protocol][1] == starts else DEFAULT_PROTOCOL_FOR_STARTS[starts]


# ---------------------------------------------------------------------------------------------
# Pure math
# ---------------------------------------------------------------------------------------------


def hns(score, random, human):
    """Human-normalised score (agent - random) / (human - random); 1.0 = human, 0.0 = random.

    Works on floats and numpy arrays. Note video_pinball under human starts has human <
    random (the published pair), so its HNS falls as the score rises; it is kept as published
    because the papers' means include it.
    """
    if np.ndim(score) == 0:
        return (float(score) - random) / (human - random)
    return (np.asarray(score, np.float64) - random) / (human - random)


def normalise(scores: Mapping[str, float], protocol: str) -> dict[str, float]:
    """`{game: HNS}` for the games of `scores` that the protocol's reference table has."""
    ref = reference_scores(protocol)
    return {g: hns(s, *ref[g]) for g, s in scores.items() if g in ref and math.isfinite(s)}


def published_hns(column: str, protocol: str = "noop") -> dict[str, float]:
    """`{game: HNS}` of a published column, normalised as `column_protocol` says."""
    return normalise(published_scores()[column], column_protocol(column, protocol))


def final_score(frames: np.ndarray, returns: np.ndarray, last_n: int) -> tuple[float, int]:
    """Mean return of the last `last_n` episodes in frame order, and how many were averaged.

    Episodes of several ranks may be recorded slightly out of frame order, so they are sorted
    (stably) by their end frame first. No episodes: (nan, 0).
    """
    if len(returns) == 0:
        return float("nan"), 0
    order = np.argsort(np.asarray(frames), kind="stable")
    tail = np.asarray(returns, np.float64)[order][-last_n:]
    return float(np.mean(tail)), int(tail.size)


def milestones(frames: np.ndarray, returns: np.ndarray, wall_s: np.ndarray,
               thresholds: Sequence[float], window: int = 20) -> list[dict]:
    """When the mean of the last ``window`` episodes first reached each threshold.

    Args:
        frames, returns, wall_s: the episodes in the order they ended: global frames at the end,
            return, seconds since the run started (summed over restarts).
        thresholds: returns to reach, e.g. (-15, 0, 10, 18) for Pong.

    Returns:
        One dict per threshold: ``threshold``, ``frames`` and ``minutes`` at the episode that
        completed the first such window (None for both if never reached).
    """
    returns = np.asarray(returns, np.float64)
    out = []
    if len(returns) >= window:
        sums = np.convolve(returns, np.ones(window), "valid")
    else:
        sums = np.zeros(0)
    for t in thresholds:
        # integer returns sum exactly, so compare sums with window * t, not rounded means
        hit = np.flatnonzero(sums >= window * t)
        i = int(hit[0]) + window - 1 if hit.size else None
        out.append({"threshold": float(t),
                    "frames": int(frames[i]) if i is not None else None,
                    "minutes": float(wall_s[i]) / 60 if i is not None else None})
    return out


def milestone_table(runs: Sequence[RunResult], thresholds: Sequence[float],
                    window: int = 20) -> str:
    """Markdown: per run, M frames and minutes until the mean return of ``window`` episodes
    (evaluation episodes where the run evaluates, else training ones) first reached each
    threshold."""
    head = ["run", "episodes"] + [f"{t:+g}: M frames / min" for t in thresholds]
    body = []
    for run in runs:
        if run.status == "unreadable":
            continue
        cells = []
        for m in milestones(run.curve_frames, run.curve_returns, run.curve_wall_s, thresholds,
                            window):
            cells.append("never" if m["frames"] is None
                         else f"{m['frames'] / 1e6:.2f} / {m['minutes']:.1f}")
        body.append([run.path, run.score_source or "-"] + cells)
    return _markdown_table(head, body)


def spread(values: Iterable[float]) -> dict[str, float]:
    """Mean, sample standard deviation (ddof=1; 0 for one value), min and max of the finite
    values, and their number. No finite value: all nan, n = 0."""
    v = np.array([x for x in values if math.isfinite(x)], np.float64)
    if v.size == 0:
        return dict(n=0, mean=math.nan, std=math.nan, min=math.nan, max=math.nan)
    std = float(np.std(v, ddof=1)) if v.size > 1 else 0.0
    return dict(n=int(v.size), mean=float(v.mean()), std=std, min=float(v.min()),
                max=float(v.max()))


def hns_summary(hns_by_game: Mapping[str, float]) -> dict[str, float]:
    """Mean and median HNS over the games given, and the number of games above human (> 1)."""
    v = np.array([h for h in hns_by_game.values() if math.isfinite(h)], np.float64)
    if v.size == 0:
        return dict(num_games=0, mean=math.nan, median=math.nan, above_human=0)
    return dict(num_games=int(v.size), mean=float(v.mean()), median=float(np.median(v)),
                above_human=int(np.sum(v > 1.0)))


def common_games(*by_game: Mapping[str, float]) -> list[str]:
    """Sorted games that have a finite value in every mapping."""
    sets = [{g for g, x in d.items() if math.isfinite(x)} for d in by_game]
    return sorted(set.intersection(*sets)) if sets else []


def restrict(by_game: Mapping[str, float], games: Iterable[str]) -> dict[str, float]:
    """The entries of `by_game` for `games` only."""
    return {g: by_game[g] for g in games}


def compare_with_column(our_scores: Mapping[str, float], our_hns: Mapping[str, float],
                        their_scores: Mapping[str, float],
                        their_hns: Mapping[str, float]) -> dict:
    """Our runs against one published column, on the games both have (HNS and raw score).

    Returns:
      `num_games`, `games`, `wins` (games where our raw score is strictly higher: raw scores
      are compared because the two HNS may use different reference pairs), `ours_mean`,
      `ours_median`, `column_mean`, `column_median`: HNS of both over exactly those games.
    """
    games = common_games(our_hns, their_hns, our_scores, their_scores)
    ours = hns_summary(restrict(our_hns, games))
    theirs = hns_summary(restrict(their_hns, games))
    return dict(
        num_games=len(games),
        games=games,
        wins=sum(our_scores[g] > their_scores[g] for g in games),
        ours_mean=ours["mean"], ours_median=ours["median"],
        column_mean=theirs["mean"], column_median=theirs["median"],
    )


def run_status(stored: str, heartbeat_unix: float, now_unix: float, stale_after_s: float) -> str:
    """The stored status, or "stale" for a "running" run whose heartbeat is older than
    `stale_after_s` (its writer was killed without a chance to say so, e.g. SIGKILL)."""
    if stored == "running" and now_unix - heartbeat_unix > stale_after_s:
        return "stale"
    return stored


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def game_id(name: str) -> str:
    """ale-py snake_case id of an Atari game name ("ALE/SpaceInvaders-v5", "PongNoFrameskip-v4",
    "space_invaders" -> "space_invaders", "pong"); other names ("CartPole-v1") unchanged."""
    stem = re.sub(r"(NoFrameskip|Deterministic)?(-v\d+)?$", "", name.split("/")[-1])
    snake = _CAMEL.sub("_", stem).lower()
    return snake if snake in reference_scores("noop") else name


# ---------------------------------------------------------------------------------------------
# Runs (I/O)
# ---------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """What the analysis keeps of one run directory."""

    path: str
    algo: str
    game: str
    seed: int | None
    status: str  # running | finished | failed | preempted | stale | unreadable
    frames: int = 0  # largest global frame count recorded
    score: float = math.nan  # the final evaluation's mean, else of the last N episodes
    score_source: str = ""  # "final" | "eval" | "train" | "" (no episodes yet)
    num_episodes_used: int = 0
    error: str = ""
    curve_frames: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    curve_returns: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    curve_wall_s: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    train: dict = field(default_factory=dict, repr=False)  # the metrics' train columns


def _identity_from_path(path: Path) -> tuple[str, str, int | None]:
    """(algo, game, seed) from `<algo>/<game>/seed-<seed>/metrics.h5`; "?" where unknown."""
    run_dir = path.parent
    m = re.fullmatch(r"seed-(\d+)", run_dir.name)
    if not m:
        return "?", run_dir.name or "?", None
    return run_dir.parent.parent.name or "?", run_dir.parent.name or "?", int(m.group(1))


def load_run(path: Path, last_n: int, now_unix: float, stale_after_s: float) -> RunResult:
    """Reads one metrics file; an unreadable one becomes a RunResult with status "unreadable"."""
    try:
        data = read_metrics(path)
    except MetricsError as exc:
        algo, game, seed = _identity_from_path(path)
        return RunResult(str(path), algo, game, seed, "unreadable", error=str(exc))
    try:
        return _run_result(path, data, last_n, now_unix, stale_after_s)
    except (KeyError, ValueError, TypeError) as exc:  # attributes of the wrong kind
        algo, game, seed = _identity_from_path(path)
        return RunResult(str(path), algo, game, seed, "unreadable", error=f"{path}: {exc!r}")


def _run_result(path: Path, data: dict, last_n: int, now_unix: float,
                stale_after_s: float) -> RunResult:
    attrs = data["attrs"]
    source = "eval" if data["eval"]["frames"].size else "train"
    episodes = data["eval" if source == "eval" else "episodes"]
    score, n_used = final_score(episodes["frames"], episodes["return"], last_n)
    final = data["final"]["return"]
    if final.size:      # the final weights' own evaluation (hpcrl.runtime.final): all of it
        source, score, n_used = "final", float(np.mean(final)), int(final.size)
    frames = max([int(data[g]["frames"].max()) for g in ("episodes", "eval", "train", "final")
                  if data[g]["frames"].size] + [0])
    return RunResult(
        path=str(path),
        algo=str(attrs["algo"]),
        game=game_id(str(attrs["game"])),
        seed=int(attrs["seed"]),
        status=run_status(data["status"], data["heartbeat_unix"], now_unix, stale_after_s),
        frames=frames,
        score=score,
        score_source=source if n_used else "",
        num_episodes_used=n_used,
        curve_frames=episodes["frames"],
        curve_returns=episodes["return"],
        curve_wall_s=episodes["wall_time"],
        train=data["train"],
    )


def find_metrics_files(paths: Sequence[str | os.PathLike]) -> tuple[list[Path], list[str]]:
    """Every metrics.h5 at or below the given paths (sorted, unique), and the paths that do
    not exist."""
    found, missing = set(), []
    for p in map(Path, paths):
        if p.is_file():
            found.add(p)
        elif p.is_dir():
            found.update(Path(root) / METRICS_FILE for root, _, files in os.walk(p)
                         if METRICS_FILE in files)
        else:
            missing.append(str(p))
    return sorted(found), missing


# ---------------------------------------------------------------------------------------------
# Report (pure, on RunResults)
# ---------------------------------------------------------------------------------------------


def _status_text(runs: Sequence[RunResult]) -> str:
    """"finished" when all runs agree, else the seeds per status: "finished 0,1; failed 2"."""
    by_status: dict[str, list[str]] = {}
    for r in runs:
        by_status.setdefault(r.status, []).append("?" if r.seed is None else str(r.seed))
    if len(by_status) == 1:
        return next(iter(by_status))
    return "; ".join(f"{s} {','.join(seeds)}" for s, seeds in sorted(by_status.items()))


def game_rows(runs: Sequence[RunResult], protocol: str, columns: Sequence[str]) -> list[dict]:
    """One row per (algo, game): seeds, statuses, frames, score spread, HNS, published scores.

    HNS is that of the mean score over seeds (HNS is affine in the score, so this equals the
    mean of the seeds' HNS); `hns_per_seed` lists them.
    """
    ref = reference_scores(protocol)
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        groups.setdefault((run.algo, run.game), []).append(run)
    rows = []
    for (algo, game), group in sorted(groups.items()):
        group = sorted(group, key=lambda r: (r.seed is None, r.seed or 0))
        scored = [r for r in group if r.score_source]
        stats = spread(r.score for r in scored)
        sources = sorted({r.score_source for r in scored})
        pair = ref.get(game)
        rows.append(dict(
            algo=algo,
            game=game,
            seeds=[r.seed for r in group],
            num_runs=len(group),
            num_scored=stats["n"],
            status=_status_text(group),
            frames=[r.frames for r in group],
            score_source="+".join(sources),
            score_mean=stats["mean"], score_std=stats["std"],
            score_min=stats["min"], score_max=stats["max"],
            scores=[r.score for r in scored],
            episodes_used=[r.num_episodes_used for r in scored],
            hns=hns(stats["mean"], *pair) if pair and stats["n"] else math.nan,
            hns_per_seed=[hns(r.score, *pair) for r in scored] if pair else [],
            published={c: published_scores()[c].get(game, math.nan) for c in columns},
        ))
    return rows


def summary_rows(rows: Sequence[dict], protocol: str, columns: Sequence[str]) -> list[dict]:
    """Per algorithm: HNS mean / median / above-human over its games with a score, and, per
    compared column, wins and both sides' mean / median HNS restricted to the common games."""
    out = []
    for algo in sorted({r["algo"] for r in rows}):
        mine = [r for r in rows if r["algo"] == algo]
        our_scores = {r["game"]: r["score_mean"] for r in mine}
        our_hns = {r["game"]: r["hns"] for r in mine}
        entry = dict(algo=algo, protocol=protocol, **hns_summary(our_hns),
                     games=common_games(our_hns), comparisons=[])
        for column in columns:
            cmp = compare_with_column(our_scores, our_hns, published_scores()[column],
                                      published_hns(column, protocol))
            starts = column_starts(column)
            entry["comparisons"].append(dict(
                column=column, starts=starts, reference=column_protocol(column, protocol),
                flagged=starts != OUR_STARTS, **cmp))
        out.append(entry)
    return out


def hns_by_game(rows: Sequence[dict], algo: str) -> dict[str, list[float]]:
    """{game: HNS of each scored seed} of one algorithm (the input of :mod:`.stats`)."""
    out = {}
    for r in rows:
        values = [h for h in r["hns_per_seed"] if math.isfinite(h)]
        if r["algo"] == algo and values:
            out[r["game"]] = values
    return out


def aggregate_rows(rows: Sequence[dict], reps: int, seed: int = 0) -> list[dict]:
    """Per algorithm: IQM, median, mean and optimality gap of its HNS over games and seeds,
    each with a 95 % stratified-bootstrap interval (:func:`hpcrl.tools.stats.interval_estimates`)."""
    from hpcrl.tools import stats

    out = []
    for algo in sorted({r["algo"] for r in rows}):
        scores = hns_by_game(rows, algo)
        if scores:
            out.append(dict(algo=algo, num_games=len(scores),
                            num_runs=sum(len(v) for v in scores.values()), reps=reps,
                            **stats.interval_estimates(scores, reps=reps, seed=seed)))
    return out


def build_report(runs: Sequence[RunResult], protocol: str, columns: Sequence[str],
                 last_n: int) -> dict:
    """Everything the formatters print: settings, per-game rows, summaries, run list."""
    readable = [r for r in runs if r.status != "unreadable"]
    rows = game_rows(runs, protocol, columns)
    return dict(
        protocol=protocol,
        reference_file=PROTOCOLS[protocol][0],
        our_starts=OUR_STARTS,
        last_n=last_n,
        columns=[dict(column=c, starts=column_starts(c), reference=column_protocol(c, protocol))
                 for c in columns],
        games=rows,
        summary=summary_rows([r for r in rows if r["num_scored"]], protocol, columns),
        runs=[{f.name: getattr(r, f.name) for f in fields(r)
               if not f.name.startswith("curve_") and f.name != "train"} for r in runs],
        num_readable=len(readable),
    )


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def _num(x: float, digits: int = 1) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:,.{digits}f}"


def _pct(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _frames(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


def _starts_label(starts: str) -> str:
    return "noop" if starts == "noop" else "human starts!"


def _hns_header(protocol: str) -> str:
    flag = "!" if PROTOCOLS[protocol][1] != OUR_STARTS else ""
    return f"HNS [{protocol}{flag}]"


def _column_header(c: dict) -> str:
    return f"{c['column']} [{_starts_label(c['starts'])}]"


def _score_text(row: dict) -> str:
    if not row["num_scored"]:
        return "-"
    text = _num(row["score_mean"])
    if row["num_scored"] > 1:
        text += (f" ± {_num(row['score_std'])} "
                 f"[{_num(row['score_min'])}, {_num(row['score_max'])}]")
    return text + ("*" if "train" in row["score_source"] else "")


def _seeds_text(row: dict) -> str:
    n = f"{row['num_scored']}/{row['num_runs']}" if row["num_scored"] != row["num_runs"] else str(
        row["num_runs"])
    seeds = ",".join("?" if s is None else str(s) for s in row["seeds"])
    return f"{n} ({seeds})"


def _frames_text(row: dict) -> str:
    lo, hi = min(row["frames"]), max(row["frames"])
    return _frames(lo) if lo == hi else f"{_frames(lo)}-{_frames(hi)}"


def game_table(report: dict) -> tuple[list[str], list[list[str]]]:
    header = ["game", "algo", "seeds", "status", "frames", "score", _hns_header(report["protocol"])]
    header += [_column_header(c) for c in report["columns"]]
    body = []
    for row in report["games"]:
        line = [row["game"], row["algo"], _seeds_text(row), row["status"], _frames_text(row),
                _score_text(row), _pct(row["hns"])]
        line += [_num(row["published"][c["column"]]) for c in report["columns"]]
        body.append(line)
    return header, body


def summary_table(report: dict) -> tuple[list[str], list[list[str]]]:
    header = ["algo", "games", f"mean {_hns_header(report['protocol'])}", "median HNS",
              "above human"]
    body = [[s["algo"], str(s["num_games"]), _pct(s["mean"]), _pct(s["median"]),
             str(s["above_human"])] for s in report["summary"]]
    return header, body


def comparison_table(report: dict) -> tuple[list[str], list[list[str]]]:
    header = ["algo", "vs column", "games", "beats", "ours mean", "ours median", "column mean",
              "column median", "column reference"]
    body = []
    for s in report["summary"]:
        for c in s["comparisons"]:
            body.append([s["algo"], _column_header(c), str(c["num_games"]),
                         f"{c['wins']}/{c['num_games']}", _pct(c["ours_mean"]),
                         _pct(c["ours_median"]), _pct(c["column_mean"]),
                         _pct(c["column_median"]), c["reference"]])
    return header, body


def aggregate_table(report: dict) -> tuple[list[str], list[list[str]]]:
    def ci(a: dict) -> str:
        return f"{_pct(a['value'])} [{_pct(a['low'])}, {_pct(a['high'])}]"

    header = ["algo", "games", "runs", f"IQM {_hns_header(report['protocol'])}", "median",
              "mean", "optimality gap"]
    body = [[a["algo"], str(a["num_games"]), str(a["num_runs"]), ci(a["iqm"]), ci(a["median"]),
             ci(a["mean"]), ci(a["optimality_gap"])] for a in report["aggregates"]]
    return header, body


_LEFT_ALIGNED = {"game", "algo", "seeds", "status", "vs column", "column reference"}


def _text_table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(header, *body)]
    left = [h in _LEFT_ALIGNED for h in header]

    def fmt(cells):
        return "  ".join(c.ljust(w) if lft else c.rjust(w)
                         for c, w, lft in zip(cells, widths, left)).rstrip()

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths)] + [fmt(b) for b in body])


def _markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(c.replace("|", "\\|") for c in b) + " |"
                              for b in body])


def _notes(report: dict) -> list[str]:
    notes = [f"score: mean of each seed's final evaluation (source final), else of its last "
             f"{report['last_n']} evaluation episodes (eval), then mean ± std [min, max] over "
             f"seeds; * = training episodes (run has no evaluation episodes)",
             f"HNS = (score - random) / (human - random) with {report['reference_file']}; "
             f"published columns use the pair of their own start condition"]
    if PROTOCOLS[report["protocol"]][1] != OUR_STARTS or any(
            c["starts"] != OUR_STARTS for c in report["columns"]):
        notes.append("! human-start numbers: hpcrl evaluates with no-op starts (human start "
                     "states are not public), so these comparisons are not like for like")
    if report.get("aggregates"):
        notes.append(f"IQM: mean of the middle 50 % of all seed-game HNS; median, mean: of the "
                     f"per-game means; optimality gap: 1 - mean(min(HNS, 1)); [95 % stratified "
                     f"bootstrap interval over seeds, {report['aggregates'][0]['reps']:,} "
                     f"resamples] (Agarwal et al. 2021)")
    return notes


def format_report(report: dict, fmt: str) -> str:
    """The report as "text" (terminal), "markdown", "csv" (per-game table) or "json"."""
    if fmt == "json":
        return json.dumps(_json_safe(report), indent=2)
    if fmt == "csv":
        return _csv_text(report)
    table = _text_table if fmt == "text" else _markdown_table
    parts = [table(*game_table(report)), "", table(*summary_table(report))]
    if report["columns"]:
        parts += ["", table(*comparison_table(report))]
    if report.get("aggregates"):
        parts += ["", table(*aggregate_table(report))]
    bullet = "" if fmt == "text" else "- "
    parts += [""] + [bullet + n for n in _notes(report)]
    return "\n".join(parts) + "\n"


def _csv_text(report: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    hns_col = f"hns [{report['protocol']}]"
    writer.writerow(["game", "algo", "num_runs", "num_scored", "seeds", "status", "frames_min",
                     "frames_max", "score_source", "score_mean", "score_std", "score_min",
                     "score_max", hns_col] + [_column_header(c) for c in report["columns"]])
    for r in report["games"]:
        values = [r["game"], r["algo"], r["num_runs"], r["num_scored"],
                  " ".join(map(str, r["seeds"])), r["status"], min(r["frames"]), max(r["frames"]),
                  r["score_source"], r["score_mean"], r["score_std"], r["score_min"],
                  r["score_max"], r["hns"]] + [r["published"][c["column"]] for c in
                                               report["columns"]]
        writer.writerow(["" if isinstance(v, float) and not math.isfinite(v) else v
                         for v in values])
    return out.getvalue()


def _json_safe(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.generic):
        return _json_safe(x.item())
    return x


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` values (fewer at the start), at every index."""
    c = np.cumsum(np.concatenate([[0.0], np.asarray(values, np.float64)]))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def learning_curve(frames: np.ndarray, returns: np.ndarray,
                   window: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean return of the last `window` episodes, at each distinct end frame.

    Episodes that share an end frame (an evaluation batch recorded at one frame count) give
    one point, the value after all of them: with `window` = batch size, the batch mean.
    """
    order = np.argsort(frames, kind="stable")
    f = np.asarray(frames)[order]
    y = rolling_mean(np.asarray(returns)[order], window)
    last_of_each = np.r_[f[1:] != f[:-1], True]
    return f[last_of_each], y[last_of_each]


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


X_AXES = {"frames": "env frames", "hours": "wall-clock hours (summed over restarts)"}


def _curve(run: RunResult, window: int, x: str) -> tuple[np.ndarray, np.ndarray]:
    """A run's learning curve against frames or hours (the wall time of the same episodes)."""
    f, y = learning_curve(run.curve_frames, run.curve_returns, window)
    if x == "frames":
        return f.astype(np.float64), y
    order = np.argsort(run.curve_frames, kind="stable")
    frames_sorted, wall_sorted = run.curve_frames[order], run.curve_wall_s[order]
    last = np.searchsorted(frames_sorted, f, side="right") - 1    # the point's last episode
    return np.maximum.accumulate(wall_sorted[last]) / 3600, y


def plot_report(report: dict, runs: Sequence[RunResult], out_dir: str | os.PathLike,
                x: str = "frames") -> list[Path]:
    """Writes, per game, `curve_<game>.png` (per algo: the seeds' mean of the last N episodes'
    return with a 95 % bootstrap band over seeds, as far as every seed has reached; each seed a
    thin line; published scores of
    the compared columns as horizontal lines) and `train_<game>.png` (loss, frames/s and
    dropped gradients per run); then `hns_summary.png` (HNS per game and algo) and, with
    aggregates, `profile.png` (performance profiles). ``x``: "frames" or "hours". Returns
    the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    by_game: dict[str, list[RunResult]] = {}
    for run in runs:
        if run.status != "unreadable" and run.curve_returns.size:
            by_game.setdefault(run.game, []).append(run)
    for game, game_runs in sorted(by_game.items()):
        written.append(_plot_curves(plt, report, game, game_runs, x, out / f"curve_{game}.png"))
        if any(len(r.train.get("frames", ())) for r in game_runs):
            written.append(_plot_train(plt, game, game_runs, x, out / f"train_{game}.png"))
    rows = [r for r in report["games"] if math.isfinite(r["hns"])]
    if rows:
        written.append(_plot_hns_bars(plt, rows, report["protocol"], out / "hns_summary.png"))
    if report.get("aggregates"):
        written.append(_plot_profiles(plt, report, out / "profile.png"))
    return written


def _plot_curves(plt, report: dict, game: str, runs: list[RunResult], x: str, path: Path
                 ) -> Path:
    from hpcrl.tools.stats import mean_curve

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    algos = sorted({r.algo for r in runs})
    for i, algo in enumerate(algos):
        mine = sorted((r for r in runs if r.algo == algo), key=lambda r: r.seed or 0)
        curves = [_curve(r, report["last_n"], x) for r in mine]
        color = f"C{i}"
        if len(mine) == 1:
            ax.plot(*curves[0], color=color, label=f"{algo} seed {mine[0].seed} "
                    f"({mine[0].score_source or 'train'})")
            continue
        for cx, cy in curves:
            ax.plot(cx, cy, color=color, lw=0.6, alpha=0.35)
        grid = np.linspace(0, min(c[0][-1] for c in curves), 200)   # where every seed is
        mean, lo, hi = mean_curve([c[0] for c in curves], [c[1] for c in curves], grid)
        ax.plot(grid, mean, color=color, lw=2, label=f"{algo}: mean of {len(mine)} seeds")
        ax.fill_between(grid, lo, hi, color=color, alpha=0.2, lw=0)
    for i, c in enumerate(report["columns"]):
        value = published_scores()[c["column"]].get(game)
        if value is not None:
            ax.axhline(value, ls="--", lw=1, color=f"C{(i + 5) % 10}",
                       label=f"{_column_header(c)}: {value:,.1f}")
    ax.set(title=game, xlabel=X_AXES[x],
           ylabel=f"return (mean of last {report['last_n']} episodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


TRAIN_PANELS = (("loss", "loss (mean since the last report)"),
                ("frames_per_second", "env frames / s"),
                ("dropped", "gradients dropped (stale + outlier + non-finite)"))


def _plot_train(plt, game: str, runs: list[RunResult], x: str, path: Path) -> Path:
    fig, axes = plt.subplots(len(TRAIN_PANELS), 1, figsize=(7, 7), dpi=100, sharex=True)
    for run in sorted(runs, key=lambda r: (r.algo, r.seed or 0)):
        t = run.train
        if not len(t.get("frames", ())):
            continue
        xs = t["frames"] if x == "frames" else t["wall_time"] / 3600
        values = dict(t, dropped=t["dropped_stale"] + t["dropped_outlier"]
                      + t["dropped_nonfinite"])
        for ax, (column, _) in zip(axes, TRAIN_PANELS):
            ax.plot(xs, values[column], lw=1, label=f"{run.algo} seed {run.seed}")
    for ax, (_, label) in zip(axes, TRAIN_PANELS):
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_title(f"{game}: training")
    axes[0].legend(fontsize=7)
    axes[-1].set_xlabel(X_AXES[x])
    return _save(plt, fig, path)


def _plot_profiles(plt, report: dict, path: Path) -> Path:
    from hpcrl.tools.stats import performance_profile

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    top = max(max(r["hns_per_seed"] or [0.0]) for r in report["games"])
    taus = np.linspace(0, max(1.0, 1.1 * top), 201)
    for i, agg in enumerate(report["aggregates"]):
        scores = hns_by_game(report["games"], agg["algo"])
        profile, lo, hi = performance_profile(scores, taus)
        ax.plot(100 * taus, profile, color=f"C{i}", label=f"{agg['algo']} "
                f"({agg['num_games']} games, {agg['num_runs']} runs)")
        ax.fill_between(100 * taus, lo, hi, color=f"C{i}", alpha=0.2, lw=0)
    ax.axvline(100, color="k", ls="--", lw=1)
    ax.set(xlabel=f"HNS % [{report['protocol']}] threshold tau",
           ylabel="fraction of runs with HNS > tau", title="performance profile", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def _plot_hns_bars(plt, rows: list[dict], protocol: str, path: Path) -> Path:
    games = sorted({r["game"] for r in rows})
    algos = sorted({r["algo"] for r in rows})
    width = 0.8 / len(algos)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.4 * len(games) + 2), 4.5), dpi=100)
    for i, algo in enumerate(algos):
        hns_by_game = {r["game"]: r["hns"] for r in rows if r["algo"] == algo}
        offset = (i - (len(algos) - 1) / 2) * width
        x = [j + offset for j, g in enumerate(games) if g in hns_by_game]
        ax.bar(x, [100 * hns_by_game[g] for g in games if g in hns_by_game], width, label=algo)
    ax.axhline(100, color="k", ls="--", lw=1, label="human")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(games)), games, rotation=60, ha="right", fontsize=8)
    ax.set(ylabel=f"HNS % [{protocol}]", title="human-normalised score per game")
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


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
                   help="--stats: bootstrap resamples (default 10000)")
    p.add_argument("--milestones", metavar="R[,R...]", default="",
                   help="also print, per run, the frames and minutes until the mean return of 20 "
                        "episodes first reached each return R, e.g. --milestones=-15,0,10,18 for "
                        "Pong (with =, as the list starts with a minus)")
    p.add_argument("--stale-after", type=float, default=DEFAULT_STALE_AFTER_S, metavar="S",
                   help="report a running run as stale after S seconds without a heartbeat")
    args = p.parse_args(argv)
    if args.last < 1:
        p.error("--last must be >= 1")
    if args.reps < 1:
        p.error("--reps must be >= 1")
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
    sys.stdout.write(format_report(report, args.format))
    if args.milestones:
        sys.stdout.write("\n" + milestone_table(runs, args.milestones) + "\n")
    if args.plot:
        for path in plot_report(report, runs, args.plot, args.x):
            print(f"hpcrl.analyze: wrote {path}", file=sys.stderr)
    return 0 if report["num_readable"] else 1


if __name__ == "__main__":
    sys.exit(main())
