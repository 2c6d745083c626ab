"""Reference and published Atari scores (package data in `hpcrl/data/`) and the score math:
human-normalised scores, final scores, milestones, spreads, summaries and comparisons."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from importlib import resources

import numpy as np

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


def band_index(frames: np.ndarray, band_frames: int, num_bands: int) -> np.ndarray:
    """Each record's band of ``band_frames`` global frames; the last of ``num_bands`` bands
    also takes anything beyond (the run's final frames)."""
    return np.minimum(np.asarray(frames, np.int64) // band_frames, num_bands - 1)


def band_means(frames: np.ndarray, values: np.ndarray, band_frames: int,
               num_bands: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean of the values recorded in each band of ``band_frames`` global frames, and how many.

    Band b holds the records with ``b * band_frames <= frames < (b + 1) * band_frames``; the
    last of the ``num_bands`` bands also takes anything beyond (the run's final frames). A
    learning curve read this way (the mean evaluation return per million frames, say) is how
    `docs/experiments/` tabulates runs: it neither hides a late collapse, as a final score
    does, nor depends on how many episodes ended between two log lines.

    Returns:
        (means, counts), each of length ``num_bands``; a band without records has mean NaN.
    """
    if band_frames < 1 or num_bands < 1:
        raise ValueError(f"band_frames and num_bands must be >= 1 (got {band_frames}, "
                         f"{num_bands})")
    values = np.asarray(values, np.float64)
    band = band_index(frames, band_frames, num_bands)
    finite = np.isfinite(values)
    counts = np.bincount(band[finite], minlength=num_bands)
    sums = np.bincount(band[finite], weights=values[finite], minlength=num_bands)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return means, counts


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
