"""Aggregate scores over games with stratified-bootstrap confidence intervals (Agarwal et al.
2021, "Deep RL at the Edge of the Statistical Precipice"), in numpy.

Scores are human-normalised, one per (run, game): ``{game: [score of each seed]}``. A game may
have any number of runs (rliable wants the same number everywhere; with equal numbers the
estimators below are rliable's):

- **IQM**: the mean of the middle 50 % of all run-game scores (25 % trimmed from each end, the
  count trimmed rounded down, as ``scipy.stats.trim_mean``). Robust to the few games that
  dominate a mean, more efficient than a median.
- **median** and **mean**: of the per-game mean scores (the papers' "median HNS").
- **optimality gap**: how far below human (1.0) the run-game scores fall on average,
  ``1 - mean(min(score, 1))``; lower is better.
- **performance profile**: the share of run-game scores above each threshold tau.

The intervals resample runs with replacement *within* each game (stratified: the set of games
stays fixed), ``reps`` times, and take the percentiles of the aggregate's bootstrap
distribution (rliable's default "percentile" method, 95 %).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

#: Scores per game: each value a 1-D array of that game's runs.
ScoresByGame = Mapping[str, Sequence[float]]
DEFAULT_REPS = 10_000
DEFAULT_CONFIDENCE = 0.95


def trimmed_mean(x: np.ndarray, proportion: float = 0.25) -> np.ndarray:
    """Mean along the last axis after cutting ``int(proportion * n)`` values from each end."""
    x = np.sort(np.asarray(x, np.float64), axis=-1)
    n = x.shape[-1]
    k = int(proportion * n)
    return x[..., k:n - k].mean(axis=-1)


# Each aggregate takes the games' score arrays, each [..., runs of that game] (a leading
# bootstrap axis or none), and returns one value per leading index.

def iqm(per_game: Sequence[np.ndarray]) -> np.ndarray:
    """Interquartile mean over all runs of all games."""
    return trimmed_mean(np.concatenate(per_game, axis=-1), 0.25)


def median_of_means(per_game: Sequence[np.ndarray]) -> np.ndarray:
    return np.median(np.stack([g.mean(axis=-1) for g in per_game], axis=-1), axis=-1)


def mean_of_means(per_game: Sequence[np.ndarray]) -> np.ndarray:
    return np.stack([g.mean(axis=-1) for g in per_game], axis=-1).mean(axis=-1)


def optimality_gap(per_game: Sequence[np.ndarray], gamma: float = 1.0) -> np.ndarray:
    return gamma - np.minimum(np.concatenate(per_game, axis=-1), gamma).mean(axis=-1)


AGGREGATES: dict[str, Callable[[Sequence[np.ndarray]], np.ndarray]] = {
    "iqm": iqm, "median": median_of_means, "mean": mean_of_means,
    "optimality_gap": optimality_gap,
}


def _arrays(scores: ScoresByGame) -> list[np.ndarray]:
    arrays = [np.asarray(scores[g], np.float64) for g in sorted(scores)]
    if not arrays or any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError("scores need at least one game, each with at least one run")
    return arrays


def resample(per_game: Sequence[np.ndarray], reps: int, rng: np.random.Generator
             ) -> list[np.ndarray]:
    """``reps`` stratified bootstrap samples: per game, [reps, runs] drawn with replacement
    from that game's runs (games in the given order, one ``rng.integers`` call each)."""
    return [g[rng.integers(0, g.size, size=(reps, g.size))] for g in per_game]


def interval_estimates(scores: ScoresByGame, reps: int = DEFAULT_REPS,
                       confidence: float = DEFAULT_CONFIDENCE, seed: int = 0,
                       aggregates: Sequence[str] = tuple(AGGREGATES)) -> dict[str, dict]:
    """Point estimate and percentile interval of each aggregate.

    Returns:
        ``{name: {"value", "low", "high"}}``; one bootstrap sample serves every aggregate.
    """
    per_game = _arrays(scores)
    boot = resample(per_game, reps, np.random.default_rng(seed))
    alpha = 100 * (1 - confidence) / 2
    out = {}
    for name in aggregates:
        f = AGGREGATES[name]
        dist = f(boot)
        out[name] = {"value": float(f(per_game)), "low": float(np.percentile(dist, alpha)),
                     "high": float(np.percentile(dist, 100 - alpha))}
    return out


def performance_profile(scores: ScoresByGame, taus: np.ndarray, reps: int = 2_000,
                        confidence: float = DEFAULT_CONFIDENCE, seed: int = 0
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Share of run-game scores above each tau, with its percentile interval.

    Returns:
        (profile [T], low [T], high [T]).
    """
    per_game = _arrays(scores)
    taus = np.asarray(taus, np.float64)
    flat = np.concatenate(per_game)
    profile = (flat[:, None] > taus).mean(axis=0)
    boot = np.concatenate(resample(per_game, reps, np.random.default_rng(seed)), axis=-1)
    dist = (boot[:, :, None] > taus).mean(axis=1)                  # [reps, T]
    alpha = 100 * (1 - confidence) / 2
    return profile, np.percentile(dist, alpha, axis=0), np.percentile(dist, 100 - alpha, axis=0)


def mean_curve(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], grid: np.ndarray,
               reps: int = 2_000, confidence: float = DEFAULT_CONFIDENCE, seed: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The seeds' mean learning curve on ``grid`` and a bootstrap band over seeds.

    Each seed's curve (x ascending) is interpolated linearly onto ``grid``; a grid point past a
    seed's last x is left out for that seed (NaN), so a seed still running does not pull the
    mean down. The band resamples seeds with replacement at each grid point.

    Returns:
        (mean [G], low [G], high [G]); NaN where no seed reaches.
    """
    grid = np.asarray(grid, np.float64)
    curves = np.full((len(xs), grid.size), np.nan)
    for i, (x, y) in enumerate(zip(xs, ys)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.size:
            inside = (grid >= x[0]) & (grid <= x[-1])
            curves[i, inside] = np.interp(grid[inside], x, y)
    with warnings.catch_warnings():          # all-NaN columns (no seed reaches) stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(curves, axis=0)
        if len(xs) < 2:
            return mean, mean.copy(), mean.copy()
        idx = np.random.default_rng(seed).integers(0, len(xs), size=(reps, len(xs)))
        dist = np.nanmean(curves[idx], axis=1)                     # [reps, G]
        alpha = 100 * (1 - confidence) / 2
        return mean, np.nanpercentile(dist, alpha, axis=0), np.nanpercentile(dist, 100 - alpha,
                                                                             axis=0)
