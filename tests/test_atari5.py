"""hpcrl.tools.atari5: the Atari-5 estimate of the 57-game median (Aitchison et al. 2023) by
hand, its bootstrap against a loop over the same draws, the published agents' own medians, and
`python -m hpcrl.analyze --atari5` on a synthetic run tree.

Reference pairs (noop, hpcrl/data/atari_reference_scores.csv):
    battle_zone (2360, 37187.5)  double_dunk (-18.6, -16.4)  name_this_game (2292.3, 8049)
    phoenix (761.4, 7242.6)      qbert (163.9, 13455)
"""

import json
import math
import statistics

import numpy as np
import pytest

from hpcrl.games import ATARI_5, game_set
from hpcrl.tools import atari5
from hpcrl.tools.analyze import main
from hpcrl.tools.scores import published_hns
from tests.test_analyze import _write_run

W_SUM = 0.38198 + 0.06791 + 0.31080 + 0.12413 + 0.08049      # 0.96531


def test_estimate_by_hand():
    # HNS 99 % everywhere: log10(1 + 99) = 2 per game, so log10(1 + median) = 2 * 0.96531
    assert atari5.estimate_median({g: 0.99 for g in ATARI_5}) == pytest.approx(
        (10 ** (2 * W_SUM) - 1) / 100)
    # 10^1.93062 = 85.24: 84.24 %
    assert atari5.estimate_median({g: 0.99 for g in ATARI_5}) == pytest.approx(0.8424, abs=1e-4)
    # one game at 999 % (log 3), the others below random (clipped to 0, log 0)
    scores = {g: -0.5 for g in ATARI_5} | {"battle_zone": 9.99}
    assert atari5.estimate_median(scores) == pytest.approx((10 ** (3 * 0.38198) - 1) / 100)
    assert atari5.estimate_median({g: 0.0 for g in ATARI_5}) == 0.0
    # Atari-3: only its three games count
    three = {"battle_zone": 0.99, "name_this_game": 0.99, "phoenix": 0.99, "qbert": math.nan}
    assert atari5.estimate_median(three, "atari3") == pytest.approx(
        (10 ** (2 * (0.37056 + 0.51327 + 0.10152)) - 1) / 100)


def test_missing_games_and_unknown_subsets_are_named():
    with pytest.raises(ValueError, match="atari5 needs a score on phoenix, qbert"):
        atari5.estimate_median({"battle_zone": 1.0, "double_dunk": 1.0, "name_this_game": 1.0})
    with pytest.raises(ValueError, match="phoenix"):
        atari5.estimate_median({g: (math.nan if g == "phoenix" else 1.0) for g in ATARI_5})
    with pytest.raises(ValueError, match="unknown Atari subset 'atari7'"):
        atari5.estimate_median({}, "atari7")


def test_subsets_are_game_sets_of_hpcrl_games():
    assert game_set("atari5") == ("battle_zone", "double_dunk", "name_this_game", "phoenix",
                                  "qbert")
    for name, weights in atari5.WEIGHTS.items():
        assert set(weights) == set(game_set(name))
    assert len(game_set("atari10")) == 10 and set(ATARI_5) < set(game_set("atari10"))


def test_interval_equals_a_loop_over_the_same_resamples():
    scores = {"battle_zone": [0.5, 0.7, 0.2], "double_dunk": [0.1], "name_this_game": [1.2, 1.0],
              "phoenix": [0.3, -0.1], "qbert": [0.9, 0.2, 0.4]}
    out = atari5.estimate_interval(scores, reps=200, seed=5)
    assert out["value"] == pytest.approx(atari5.estimate_median(
        {g: statistics.fmean(v) for g, v in scores.items()}))
    rng = np.random.default_rng(5)                  # the draws of stats.resample, games sorted
    idx = {g: rng.integers(0, len(scores[g]), size=(200, len(scores[g]))) for g in sorted(scores)}
    dist = [atari5.estimate_median({g: statistics.fmean(np.asarray(scores[g])[idx[g][r]])
                                    for g in scores}) for r in range(200)]
    assert out["low"] == pytest.approx(np.percentile(dist, 2.5))
    assert out["high"] == pytest.approx(np.percentile(dist, 97.5))
    assert out["seeds"] == {"battle_zone": 3, "double_dunk": 1, "name_this_game": 2, "phoenix": 2,
                            "qbert": 3}
    one_seed = atari5.estimate_interval({g: [0.4] for g in ATARI_5}, reps=50)
    assert one_seed["low"] == one_seed["high"] == pytest.approx(one_seed["value"])


# The published no-op columns with all 57 games: their Atari-5 estimate against their own
# 57-game median. Measured: relative errors -0.107 .. +0.136, mean |error| 0.089 (the authors
# report about 10 %). These agents were among the fit's algorithms.
NOOP_57 = ("dqn_noop_dueling_paper", "a3c_noop_noisynet_paper", "double_dqn_noop_dueling_paper",
           "dueling_noop", "prioritized_ddqn_noop_dueling_paper", "prioritized_dueling_noop")


def test_published_agents_estimate_their_own_57_game_median():
    errors = []
    for column in NOOP_57:
        h = published_hns(column, "noop")
        assert len(h) == 57, column
        direct = float(np.median(list(h.values())))
        errors.append(atari5.estimate_median(h) / direct - 1)
    assert max(abs(e) for e in errors) < 0.15, errors
    assert np.mean(np.abs(errors)) < 0.10, errors
    # DQN (no-op, dueling paper): median 79.1 %, estimate 89.8 %
    h = published_hns("dqn_noop_dueling_paper", "noop")
    assert atari5.estimate_median(h) == pytest.approx(0.898, abs=0.001)


def _score(game, hns_value):
    random, human = {"battle_zone": (2360.0, 37187.5), "double_dunk": (-18.6, -16.4),
                     "name_this_game": (2292.3, 8049.0), "phoenix": (761.4, 7242.6),
                     "qbert": (163.9, 13455.0)}[game]
    return random + hns_value * (human - random)


def test_analyze_atari5_on_a_run_tree(tmp_path, capsys):
    """Two seeds of each game at known HNS; one algorithm lacks qbert."""
    hns_of = {"battle_zone": (0.2, 0.4), "double_dunk": (0.0, 1.0), "name_this_game": (1.0, 1.2),
              "phoenix": (0.5, 0.5), "qbert": (0.9, 0.7)}
    for game, values in hns_of.items():
        for seed, value in enumerate(values):
            _write_run(tmp_path, "a3c", game, seed, eval_returns=[_score(game, value)] * 30)
        if game != "qbert":
            _write_run(tmp_path, "gorila", game, 0, eval_returns=[_score(game, values[0])] * 30)
    assert main([str(tmp_path), "--atari5", "--reps", "500", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    by_algo = {a["algo"]: a for a in report["subset"]}
    a3c = by_algo["a3c"]
    means = {g: sum(v) / 2 for g, v in hns_of.items()}     # 0.3, 0.5, 1.1, 0.5, 0.8
    assert a3c["hns"] == pytest.approx(means)
    assert a3c["estimate"]["value"] == pytest.approx(atari5.estimate_median(means))
    assert a3c["estimate"]["low"] <= a3c["estimate"]["value"] <= a3c["estimate"]["high"]
    assert a3c["direct_median"] is None                    # 5 games: no direct 57-game median
    assert by_algo["gorila"]["estimate"] is None and by_algo["gorila"]["missing"] == ["qbert"]
    assert main([str(tmp_path), "--atari5", "--reps", "100"]) == 0
    text = capsys.readouterr().out
    assert "atari5 est. median57" in text and "missing qbert" in text
    a3c_row = [line for line in text.splitlines() if line.startswith("a3c ")][-1]  # subset table
    assert f"{100 * a3c['estimate']['value']:.1f}% [" in a3c_row     # 2 seeds a game: interval
    assert "Aitchison et al. 2023" in text
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path), "--atari5=atari7"])
    assert exc.value.code == 2
    assert "--atari5 takes one of atari5, atari3, atari10" in capsys.readouterr().err


def test_analyze_atari5_with_one_seed_a_game_shows_no_interval(tmp_path, capsys):
    """One seed per game: the bootstrap has nothing to resample, so the table gives the
    estimate and says there is no interval rather than printing a point as one."""
    hns_of = {"battle_zone": 0.0, "double_dunk": 1.455, "name_this_game": 0.415,
              "phoenix": 0.686, "qbert": 0.079}
    for game, value in hns_of.items():
        _write_run(tmp_path, "a3c", game, 1, eval_returns=[_score(game, value)] * 30)
    assert main([str(tmp_path), "--atari5", "--reps", "100"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("a3c ")][-1]
    # by hand: 0.06791 log10(146.5) + 0.31080 log10(42.5) + 0.12413 log10(69.6)
    #          + 0.08049 log10(8.9) = 0.95832 -> 10^0.95832 - 1 = 8.08 %
    assert "8.1% (1 seed a game: no interval)" in row
    assert "[" not in row
