"""hpcrl.tools.stats: aggregates worked out by hand, the stratified bootstrap against a slow
per-resample loop on the same draws, intervals whose bounds follow by hand, and (when rliable
is installed) rliable's estimators."""

import numpy as np
import pytest

from hpcrl.tools import stats


def test_iqm_cuts_a_quarter_from_each_end_rounded_down():
    assert stats.trimmed_mean(np.arange(1, 9)) == 4.5              # 3, 4, 5, 6
    assert stats.trimmed_mean(np.array([5, 1, 100, 2, 3])) == 10 / 3  # int(1.25) = 1: 2, 3, 5
    assert stats.trimmed_mean(np.array([7.0, -1.0, 2.0])) == 8 / 3   # int(0.75) = 0: all
    # across games: all run-game scores together, [1, 2, 3] + [10, 20, 30, 40, 50] -> n = 8,
    # 2 cut from each end of 1 2 3 10 20 30 40 50: mean(3, 10, 20, 30) = 15.75
    assert stats.iqm([np.array([1.0, 2, 3]), np.array([10.0, 20, 30, 40, 50])]) == 15.75


def test_median_mean_and_optimality_gap_by_hand():
    games = [np.array([0.2, 0.4]), np.array([1.0, 3.0]), np.array([0.5, 0.7])]  # means .3 2 .6
    assert stats.median_of_means(games) == pytest.approx(0.6)
    assert stats.mean_of_means(games) == pytest.approx(2.9 / 3)
    # min(x, 1): .2 .4 1 1 .5 .7 -> mean 3.8 / 6
    assert stats.optimality_gap(games) == pytest.approx(1 - 3.8 / 6)


def test_bootstrap_aggregates_equal_a_loop_over_the_same_resamples():
    scores = {"a": [0.1, 0.5, 2.0], "b": [1.2, 0.3], "c": [0.9, 0.8, 0.7, 3.0]}
    per_game = [np.array(scores[g]) for g in sorted(scores)]
    boot = stats.resample(per_game, 50, np.random.default_rng(3))
    ref = np.random.default_rng(3)
    idx = [ref.integers(0, g.size, size=(50, g.size)) for g in per_game]  # same calls, same order
    for name, f in stats.AGGREGATES.items():
        fast = f(boot)
        for r in range(50):
            sample = [g[i[r]] for g, i in zip(per_game, idx)]
            assert fast[r] == pytest.approx(f(sample)), name


def test_one_run_per_game_leaves_nothing_to_resample():
    out = stats.interval_estimates({"a": [0.3], "b": [1.5], "c": [0.9]}, reps=200)
    for a in out.values():
        assert a["low"] == a["high"] == pytest.approx(a["value"])
    assert out["median"]["value"] == pytest.approx(0.9)


def test_interval_of_two_runs_spans_them():
    # one game, runs a and b: a resample's mean is a (p 1/4), (a+b)/2 (1/2) or b (1/4), so the
    # 2.5th and 97.5th percentiles are a and b
    out = stats.interval_estimates({"g": [0.2, 1.0]}, reps=4000, seed=1)
    assert out["mean"]["value"] == pytest.approx(0.6)
    assert (out["mean"]["low"], out["mean"]["high"]) == (pytest.approx(0.2), pytest.approx(1.0))
    assert out == stats.interval_estimates({"g": [0.2, 1.0]}, reps=4000, seed=1)  # seeded


def test_interval_of_a_fixed_seed():
    scores = {"pong": [1.02, 1.05, 1.08], "breakout": [0.2, 3.1, 1.4]}
    out = stats.interval_estimates(scores, reps=10_000, seed=0)
    assert out["iqm"]["value"] == pytest.approx(np.mean([1.02, 1.05, 1.08, 1.4]))
    assert out["iqm"]["low"] <= out["iqm"]["value"] <= out["iqm"]["high"]
    assert stats.interval_estimates(scores, reps=10_000, seed=0) == out          # seeded
    # the interval of seed 0 (numpy's PCG64 stream); the median's and the mean's are equal
    # here because the mean and the median of two per-game means coincide
    assert (out["iqm"]["low"], out["iqm"]["high"]) == (pytest.approx(0.625),
                                                       pytest.approx(2.075))
    assert (out["median"]["low"], out["median"]["high"]) == (pytest.approx(0.63),
                                                             pytest.approx(2.07))
    assert (out["optimality_gap"]["low"], out["optimality_gap"]["high"]) == (
        0.0, pytest.approx(0.4))


def test_performance_profile_by_hand():
    profile, lo, hi = stats.performance_profile({"a": [0.5, 1.5], "b": [2.5]}, [0.0, 1.0, 2.0, 3.0])
    assert profile.tolist() == [1.0, 2 / 3, 1 / 3, 0.0]
    assert lo[0] == hi[0] == 1.0 and lo[-1] == hi[-1] == 0.0


def test_mean_curve_over_seeds_leaves_out_a_seed_that_has_not_reached():
    grid = np.array([0.0, 5.0, 10.0, 20.0])
    mean, lo, hi = stats.mean_curve([np.array([0.0, 10.0]), np.array([0.0, 20.0])],
                                    [np.array([0.0, 10.0]), np.array([2.0, 22.0])], grid)
    assert mean.tolist() == [1.0, 6.0, 11.0, 22.0]        # at 20 only the second seed
    assert lo[1] <= mean[1] <= hi[1] and lo[3] == hi[3] == 22.0


def test_rliable_agrees_when_installed():
    rly = pytest.importorskip("rliable.metrics")
    library = pytest.importorskip("rliable.library")
    rng = np.random.default_rng(7)
    matrix = rng.gamma(2.0, 0.5, size=(5, 8))                       # 5 runs x 8 games
    scores = {f"g{j}": matrix[:, j] for j in range(8)}
    ours = stats.interval_estimates(scores, reps=20_000, seed=0)
    theirs = {"iqm": rly.aggregate_iqm, "median": rly.aggregate_median,
              "mean": rly.aggregate_mean, "optimality_gap": rly.aggregate_optimality_gap}
    for name, f in theirs.items():
        point, ci = library.get_interval_estimates({"x": matrix}, lambda m: np.array([f(m)]),
                                                   reps=20_000)
        assert ours[name]["value"] == pytest.approx(float(point["x"][0]))
        width = ci["x"][1, 0] - ci["x"][0, 0]
        assert ours[name]["low"] == pytest.approx(ci["x"][0, 0], abs=0.05 * width)
        assert ours[name]["high"] == pytest.approx(ci["x"][1, 0], abs=0.05 * width)
