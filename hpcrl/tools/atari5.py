"""Estimate the 57-game median human-normalised score from a few games: Atari-5 (and its
Atari-3 and Atari-10 variants, from the same authors' code) of Aitchison, Sweetser and
Hutter, "Atari-5: Distilling the Arcade Learning Environment down to Five Games", ICML 2023
(arXiv 2210.02019).

The authors fit, over published algorithms with at least 40 of the 57 games, a linear model
without intercept from the log scores of a few games to the log of the 57-game median:

    log10(1 + median57) ~= sum_g  w_g * log10(1 + max(HNS_g, 0))        (HNS in percent)

and report about 10 % relative error for Atari-5. The weights below are the least-squares fit
on the authors' own published data set (``dataset.csv`` of github.com/maitchison/Atari-5, the
fit of its ``atari5.py``: ``LinearRegression(fit_intercept=False)``, "good" algorithms only),
recomputed for this module; ``docs/analysis.md`` ("Five games for 57") records how they were
checked.

Why it is useful here: a user with a small allocation runs five games (``HPCRL_GAMES=atari5``
in the SLURM scripts) instead of 57 and reads an estimate of the 57-game median with
``python -m hpcrl.analyze DIR --atari5``. The estimate is of the *median*; it says nothing of
the mean, and it inherits the published algorithms' evaluation protocols (mostly no-op starts).

Pure functions of ``{game: HNS}`` dicts (HNS as a fraction, 1.0 = human, as in the rest of
:mod:`hpcrl.tools`); the interval is a stratified bootstrap over seeds as in :mod:`.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from hpcrl.games import GAME_SETS

#: subset name -> {game id: weight}; games are ale-py ids, as everywhere in hpcrl.
WEIGHTS: dict[str, dict[str, float]] = {
    "atari5": {"battle_zone": 0.38198, "double_dunk": 0.06791, "name_this_game": 0.31080,
               "phoenix": 0.12413, "qbert": 0.08049},
    # the best three of the five (cheapest; less accurate)
    "atari3": {"battle_zone": 0.37056, "name_this_game": 0.51327, "phoenix": 0.10152},
    # the five plus five more (most accurate)
    "atari10": {"amidar": 0.08246, "bowling": 0.05590, "frostbite": 0.06913,
                "kung_fu_master": 0.09862, "riverraid": 0.04859, "battle_zone": 0.18882,
                "double_dunk": 0.08519, "name_this_game": 0.12870, "phoenix": 0.16433,
                "qbert": 0.05923},
}
#: relative error of the median estimate under 10-fold cross-validation (the authors' measure:
#: mean |log10 error| x ln 10), recomputed with the weights
RELATIVE_ERROR = {"atari5": 0.104, "atari3": 0.137, "atari10": 0.072}

assert all(set(w) == set(GAME_SETS[name]) for name, w in WEIGHTS.items())


def log_score(hns_fraction: float) -> float:
    """The regression's input: log10(1 + max(HNS in percent, 0))."""
    return math.log10(1.0 + max(100.0 * hns_fraction, 0.0))


def estimate_median(hns_by_game: Mapping[str, float], subset: str = "atari5") -> float:
    """The estimated 57-game median HNS (a fraction) from the subset's games' HNS.

    Raises:
        ValueError: unknown subset, or a game of the subset missing or not finite.
    """
    weights = subset_weights(subset)
    missing = [g for g in weights if not math.isfinite(hns_by_game.get(g, math.nan))]
    if missing:
        raise ValueError(f"{subset} needs a score on {', '.join(missing)}")
    log_median = sum(w * log_score(hns_by_game[g]) for g, w in weights.items())
    return (10.0 ** log_median - 1.0) / 100.0


def estimate_interval(hns_by_game: Mapping[str, Sequence[float]], subset: str = "atari5",
                      reps: int = 10_000, confidence: float = 0.95, seed: int = 0) -> dict:
    """The estimate from the per-game mean HNS over seeds, and its percentile interval from a
    stratified bootstrap over seeds (each game's seeds resampled with replacement, as in
    :func:`hpcrl.tools.stats.resample`; one game with one seed contributes no spread).

    Returns:
        ``{"value", "low", "high", "seeds": {game: n}}``.
    """
    from hpcrl.tools.stats import resample

    weights = subset_weights(subset)
    missing = [g for g in weights if not len(hns_by_game.get(g, ()))]
    if missing:
        raise ValueError(f"{subset} needs a score on {', '.join(missing)}")
    games = sorted(weights)
    per_game = [np.asarray(hns_by_game[g], np.float64) for g in games]
    boot = resample(per_game, reps, np.random.default_rng(seed))      # [reps, seeds] each
    w = np.array([weights[g] for g in games])
    logs = np.stack([np.log10(1.0 + np.maximum(100.0 * b.mean(axis=-1), 0.0)) for b in boot],
                    axis=-1)                                           # [reps, games]
    dist = (10.0 ** (logs @ w) - 1.0) / 100.0
    alpha = 100 * (1 - confidence) / 2
    value = estimate_median({g: float(a.mean()) for g, a in zip(games, per_game)}, subset)
    return {"value": value, "low": float(np.percentile(dist, alpha)),
            "high": float(np.percentile(dist, 100 - alpha)),
            "seeds": {g: int(a.size) for g, a in zip(games, per_game)}}


def subset_weights(subset: str) -> dict[str, float]:
    try:
        return WEIGHTS[subset]
    except KeyError:
        raise ValueError(f"unknown Atari subset {subset!r}; known: {', '.join(WEIGHTS)}") from None
