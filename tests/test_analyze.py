"""Tests of hpcrl.analyze on synthetic run trees written through MetricsWriter.

Expected numbers are worked by hand from the reference tables (hpcrl/data/*.csv):

    noop (random, human):   pong (-20.7, 14.6)  breakout (1.7, 30.5)  berzerk (123.7, 2630.4)
    nature2015:             pong (-20.7, 9.3)   breakout (1.7, 31.8)  berzerk: not in the 49
    human_starts:           pong (-18.0, 15.5)  breakout (1.6, 27.9)  berzerk (196.1, 2237.5)
    dqn_nature_noop:        pong 18.9  breakout 401.2  berzerk: empty (not in the 49)
    a3c_ff_human_starts:    pong 5.6   breakout 681.9  berzerk 817.9

Synthetic tree (final score = mean of the last 30 evaluation episodes):

    a3c/pong/seed-0,1,2       eval: 10 early episodes at -21, then 30 at 18 / 20 / 16
    a3c/breakout/seed-0       no eval; training: 20 episodes at 0, then 30 at 30.5 (= human)
    a3c/berzerk/seed-0        eval: 30 at 1377.05 (= halfway between random and human)
    gorila/pong/seed-0        eval: 30 at 10
"""

import csv
import io
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hpcrl.tools import analyze
from hpcrl.tools.analyze import (
    column_protocol,
    column_starts,
    common_games,
    compare_with_column,
    final_score,
    game_id,
    hns,
    hns_summary,
    learning_curve,
    main,
    normalise,
    published_hns,
    published_scores,
    reference_scores,
    rolling_mean,
    run_status,
    spread,
)
from hpcrl.io.metrics import MetricsWriter

PONG_HNS = (18.0 + 20.7) / (14.6 + 20.7)  # mean of seeds 18, 20, 16
BREAKOUT_HNS = (30.5 - 1.7) / (30.5 - 1.7)  # = 1
BERZERK_SCORE = 123.7 + 0.5 * (2630.4 - 123.7)  # 1377.05
BERZERK_HNS = 0.5


def _write_run(root, algo, game, seed, eval_returns=(), train_returns=(), status="finished"):
    """A run whose episode i (eval or training) ends at frame 1000 * (i + 1)."""
    run_dir = Path(root) / algo / game / f"seed-{seed}"
    run_dir.mkdir(parents=True)
    w = MetricsWriter(run_dir / "metrics.h5", dict(algo=algo, game=game, seed=seed, config=""))
    for group, returns in (("eval", eval_returns), ("episodes", train_returns)):
        if len(returns):
            frames = 1000 * np.arange(1, len(returns) + 1)
            w.append(group, frames=frames, return_=np.asarray(returns, float), length=1000, rank=0)
    w.append("train", frames=50_000, updates=10, loss=0.1, dropped_stale=0, dropped_outlier=0,
             dropped_nonfinite=0, frames_per_second=1e4)
    if status == "running":
        w.flush()
    else:
        w.close(status)
    return run_dir


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    for seed, final in ((0, 18.0), (1, 20.0), (2, 16.0)):
        _write_run(root, "a3c", "pong", seed, eval_returns=[-21.0] * 10 + [final] * 30,
                   status="failed" if seed == 2 else "finished")
    _write_run(root, "a3c", "breakout", 0, train_returns=[0.0] * 20 + [30.5] * 30)
    _write_run(root, "a3c", "berzerk", 0, eval_returns=[BERZERK_SCORE] * 30)
    _write_run(root, "gorila", "pong", 0, eval_returns=[10.0] * 30)
    return root


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _json_report(capsys, *argv):
    code, out, err = _cli(capsys, "--format", "json", *argv)
    assert code == 0, err
    report = json.loads(out)
    report["by_key"] = {(g["algo"], g["game"]): g for g in report["games"]}
    report["summary_by_algo"] = {s["algo"]: s for s in report["summary"]}
    return report


# --- pure math ---------------------------------------------------------------------------------


def test_hns_formula_and_protocol_choice():
    assert hns(14.6, -20.7, 14.6) == 1.0 and hns(-20.7, -20.7, 14.6) == 0.0
    assert hns(18.0, -20.7, 14.6) == pytest.approx(38.7 / 35.3)
    np.testing.assert_allclose(hns(np.array([-20.7, 14.6]), -20.7, 14.6), [0.0, 1.0])
    assert reference_scores("noop")["pong"] == (-20.7, 14.6)
    assert reference_scores("nature2015")["pong"] == (-20.7, 9.3)
    assert reference_scores("human_starts")["pong"] == (-18.0, 15.5)
    # The same score under the three protocols:
    assert normalise({"assault": 742.0}, "noop")["assault"] == pytest.approx(1.0)
    assert normalise({"assault": 742.0}, "nature2015")["assault"] == pytest.approx(
        (742.0 - 222.4) / (1496.4 - 222.4))
    assert normalise({"assault": 742.0}, "human_starts")["assault"] == pytest.approx(
        (742.0 - 166.9) / (628.9 - 166.9))
    # Games outside a reference table (nature2015 has the 49) and non-finite scores drop out.
    assert normalise({"berzerk": 500.0, "pong": math.nan}, "nature2015") == {}
    assert len(reference_scores("noop")) == 57 and len(reference_scores("nature2015")) == 49
    with pytest.raises(ValueError, match="protocol"):
        reference_scores("sticky")


def test_published_columns_carry_their_start_condition():
    assert column_starts("dqn_nature_noop") == "noop"
    assert column_starts("dqn_noop_dueling_paper") == "noop"
    assert column_starts("dqn_human_starts_gorila_paper") == "human_starts"
    assert column_starts("a3c_ff_human_starts") == "human_starts"
    with pytest.raises(ValueError, match="unknown score column"):
        column_starts("dqn_nature_noop_std")  # a spread, not a score
    # A column is normalised with the pair of its own start condition ...
    assert column_protocol("a3c_ff_human_starts", "noop") == "human_starts"
    assert column_protocol("gorila_noop", "human_starts") == "noop"
    # ... and with --protocol when that shares the start condition.
    assert column_protocol("dqn_nature_noop", "nature2015") == "nature2015"
    assert published_scores()["dqn_nature_noop"]["pong"] == 18.9
    assert "berzerk" not in published_scores()["dqn_nature_noop"]  # empty cell


def test_final_score_uses_last_n_in_frame_order():
    frames = np.array([10, 40, 20, 30, 50])  # rank 1's episode at 40 arrived early
    returns = np.array([1.0, 4.0, 2.0, 3.0, 5.0])
    assert final_score(frames, returns, 2) == (4.5, 2)
    assert final_score(frames, returns, 3) == (4.0, 3)
    assert final_score(frames, returns, 30) == (3.0, 5)  # fewer episodes than N: all of them
    score, n = final_score(np.zeros(0), np.zeros(0), 30)
    assert math.isnan(score) and n == 0


def test_spread_over_seeds():
    s = spread([18.0, 20.0, 16.0, math.nan])
    assert s == dict(n=3, mean=18.0, std=2.0, min=16.0, max=20.0)  # sample std: sqrt(8 / 2)
    assert spread([5.0])["std"] == 0.0
    assert spread([])["n"] == 0


def test_summary_and_restriction_to_common_games():
    ours_hns = {"pong": 1.2, "breakout": 0.5, "berzerk": 3.0}
    ours = {"pong": 20.0, "breakout": 16.1, "berzerk": 7644.8}
    theirs = {"pong": 21.0, "breakout": 5.0}  # no berzerk: it must not enter either mean
    theirs_hns = {"pong": 1.5, "breakout": 0.1}
    assert hns_summary(ours_hns) == dict(num_games=3, mean=pytest.approx(4.7 / 3), median=1.2,
                                         above_human=2)
    assert common_games(ours_hns, theirs_hns) == ["breakout", "pong"]
    cmp = compare_with_column(ours, ours_hns, theirs, theirs_hns)
    assert cmp["games"] == ["breakout", "pong"] and cmp["num_games"] == 2
    assert cmp["wins"] == 1  # breakout 16.1 > 5.0; pong 20 < 21
    assert cmp["ours_mean"] == pytest.approx(0.85) and cmp["ours_median"] == pytest.approx(0.85)
    assert cmp["column_mean"] == pytest.approx(0.8) and cmp["column_median"] == pytest.approx(0.8)


def test_gorila_49_games_human_starts_matches_a3c_table1():
    """Recomputing from the shipped per-game table gives the A3C paper's Gorila row."""
    gorila = published_hns("gorila_human_starts", "human_starts")
    summary = hns_summary(gorila)
    assert summary["num_games"] == 49
    assert round(100 * summary["mean"], 1) == 215.2
    assert round(100 * summary["median"], 1) == 71.3
    # A slow reference: the formula, game by game, straight from the CSV rows.
    rows = {r["game"]: r for r in csv.DictReader(
        io.StringIO((Path(analyze.__file__).parents[1] / "data"
                     / "atari_reference_scores_human_starts.csv").read_text()))}
    values = []
    for game, score in published_scores()["gorila_human_starts"].items():
        random, human = float(rows[game]["random"]), float(rows[game]["human"])
        values.append((score - random) / (human - random))
    assert len(values) == 49 and sum(values) / 49 == pytest.approx(summary["mean"])
    # The column is normalised with human starts whatever --protocol says.
    assert published_hns("gorila_human_starts", "noop") == gorila
    # Gorila's headline: it beats the DQN baseline on 41 of 49 games under human starts.
    dqn = "dqn_human_starts_gorila_paper"
    cmp = compare_with_column(published_scores()["gorila_human_starts"], gorila,
                              published_scores()[dqn], published_hns(dqn, "human_starts"))
    assert (cmp["wins"], cmp["num_games"]) == (41, 49)


def test_small_helpers():
    assert run_status("running", 1000.0, 1100.0, 600.0) == "running"
    assert run_status("running", 1000.0, 1700.0, 600.0) == "stale"
    assert run_status("finished", 0.0, 1e9, 600.0) == "finished"
    assert game_id("ALE/SpaceInvaders-v5") == "space_invaders"
    assert game_id("PongNoFrameskip-v4") == "pong"
    assert game_id("montezuma_revenge") == "montezuma_revenge"
    assert game_id("ALE/UpNDown-v5") == "up_n_down"
    assert game_id("CartPole-v1") == "CartPole-v1"  # not Atari: kept, HNS left empty
    np.testing.assert_allclose(rolling_mean(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1, 2, 4, 6])
    # Two evaluation batches of 2 episodes at frames 100 and 200, one arriving late:
    x, y = learning_curve(np.array([100, 200, 100, 200]), np.array([1.0, 5.0, 3.0, 7.0]), 2)
    np.testing.assert_array_equal(x, [100, 200])
    np.testing.assert_allclose(y, [2.0, 6.0])


# --- command line on a synthetic tree ----------------------------------------------------------


def test_report_numbers_on_synthetic_tree(tree, capsys):
    report = _json_report(capsys, tree, "--compare", "dqn_nature_noop,a3c_ff_human_starts")
    pong = report["by_key"]["a3c", "pong"]
    assert pong["seeds"] == [0, 1, 2] and pong["num_scored"] == 3
    assert pong["status"] == "failed 2; finished 0,1"
    assert pong["scores"] == [18.0, 20.0, 16.0]  # the 10 early -21s are outside the last 30
    assert (pong["score_mean"], pong["score_std"], pong["score_min"], pong["score_max"]) == (
        18.0, 2.0, 16.0, 20.0)
    assert pong["hns"] == pytest.approx(PONG_HNS)
    assert pong["hns_per_seed"] == pytest.approx([(s + 20.7) / 35.3 for s in (18, 20, 16)])
    assert pong["frames"] == [50_000, 50_000, 50_000]
    assert pong["published"] == {"dqn_nature_noop": 18.9, "a3c_ff_human_starts": 5.6}
    breakout = report["by_key"]["a3c", "breakout"]
    assert breakout["score_source"] == "train" and breakout["score_mean"] == 30.5
    assert breakout["hns"] == pytest.approx(BREAKOUT_HNS)
    assert report["by_key"]["a3c", "berzerk"]["published"]["dqn_nature_noop"] is None

    a3c = report["summary_by_algo"]["a3c"]
    assert a3c["num_games"] == 3 and a3c["above_human"] == 1  # pong 109.6 %; breakout = 100 %
    assert a3c["mean"] == pytest.approx((PONG_HNS + BREAKOUT_HNS + BERZERK_HNS) / 3)
    assert a3c["median"] == pytest.approx(1.0)
    dqn, a3c_ff = a3c["comparisons"]
    # dqn_nature_noop has no berzerk: both means over pong and breakout only.
    assert dqn["games"] == ["breakout", "pong"] and not dqn["flagged"]
    assert dqn["wins"] == 0  # 18 < 18.9, 30.5 < 401.2
    assert dqn["ours_mean"] == pytest.approx((PONG_HNS + BREAKOUT_HNS) / 2)
    dqn_hns = [(18.9 + 20.7) / 35.3, (401.2 - 1.7) / 28.8]
    assert dqn["column_mean"] == pytest.approx(sum(dqn_hns) / 2)
    assert dqn["column_median"] == pytest.approx(sum(dqn_hns) / 2)
    # a3c_ff_human_starts: all three games, human-start pairs, flagged.
    assert a3c_ff["flagged"] and a3c_ff["reference"] == "human_starts"
    assert a3c_ff["num_games"] == 3 and a3c_ff["wins"] == 2  # pong 18 > 5.6, berzerk > 817.9
    ff_hns = [(5.6 + 18.0) / 33.5, (681.9 - 1.6) / 26.3, (817.9 - 196.1) / 2041.4]
    assert a3c_ff["column_mean"] == pytest.approx(sum(ff_hns) / 3)
    assert a3c_ff["column_median"] == pytest.approx(ff_hns[0])
    gorila = report["summary_by_algo"]["gorila"]
    assert gorila["num_games"] == 1 and gorila["mean"] == pytest.approx(30.7 / 35.3)
    assert gorila["comparisons"][0]["wins"] == 0 and gorila["comparisons"][1]["wins"] == 1


def test_last_n_and_nature2015_protocol(tree, capsys):
    report = _json_report(capsys, tree, "--last", "40", "--protocol", "nature2015")
    pong = report["by_key"]["a3c", "pong"]
    # seed 0: (10 * -21 + 30 * 18) / 40 = 8.25; seed 1: 9.75; seed 2: 6.75
    assert pong["scores"] == pytest.approx([8.25, 9.75, 6.75])
    assert pong["hns"] == pytest.approx((8.25 + 20.7) / (9.3 + 20.7))
    # breakout training, last 40 of 20 x 0 + 30 x 30.5: (10 * 0 + 30 * 30.5) / 40 = 22.875
    breakout = report["by_key"]["a3c", "breakout"]
    assert breakout["score_mean"] == 22.875
    assert breakout["hns"] == pytest.approx((22.875 - 1.7) / (31.8 - 1.7))
    assert report["by_key"]["a3c", "berzerk"]["hns"] is None  # not one of nature2015's 49
    assert report["summary_by_algo"]["a3c"]["num_games"] == 2


def test_text_markdown_and_csv_outputs(tree, capsys):
    cols = "dqn_nature_noop,a3c_ff_human_starts"
    code, text, _ = _cli(capsys, tree, "--compare", cols)
    assert code == 0
    assert "HNS [noop]" in text and "dqn_nature_noop [noop]" in text
    assert "a3c_ff_human_starts [human starts!]" in text
    assert "30.5*" in text  # breakout's score comes from training episodes
    assert "18.0 ± 2.0 [16.0, 20.0]" in text and "109.6%" in text
    code, md, _ = _cli(capsys, tree, "--compare", cols, "--format", "markdown")
    assert code == 0 and "| game | algo |" in md and "|---|" in md
    code, out, _ = _cli(capsys, tree, "--compare", cols, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["algo"], r["game"]) for r in rows] == [
        ("a3c", "berzerk"), ("a3c", "breakout"), ("a3c", "pong"), ("gorila", "pong")]
    pong = rows[2]
    assert float(pong["score_mean"]) == 18.0 and float(pong["score_std"]) == 2.0
    assert float(pong["hns [noop]"]) == pytest.approx(PONG_HNS)
    assert float(pong["a3c_ff_human_starts [human starts!]"]) == 5.6
    assert rows[0]["dqn_nature_noop [noop]"] == ""  # berzerk: not reported
    assert rows[1]["score_source"] == "train"


def test_unknown_compare_column_is_refused(tree, capsys):
    with pytest.raises(SystemExit) as info:
        main([str(tree), "--compare", "dqn_nature_noop_std"])
    assert info.value.code == 2
    assert "unknown --compare column" in capsys.readouterr().err


def test_empty_directory_exits_1_with_one_line(tmp_path, capsys):
    (tmp_path / "results" / "a3c").mkdir(parents=True)
    code, out, err = _cli(capsys, tmp_path / "results")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "no runs found" in err
    code, _, err = _cli(capsys, tmp_path / "nowhere")
    assert code == 1 and "no such path" in err


def test_truncated_file_is_reported_and_others_analysed(tmp_path, capsys):
    _write_run(tmp_path, "a3c", "pong", 0, eval_returns=[20.0] * 30)
    bad = _write_run(tmp_path, "a3c", "breakout", 0, eval_returns=np.arange(3000.0))
    size = os.path.getsize(bad / "metrics.h5")
    with open(bad / "metrics.h5", "r+b") as fh:
        fh.truncate(size // 2)
    code, out, err = _cli(capsys, tmp_path)
    assert code == 0
    assert "unreadable run" in err and "breakout" in err and "Traceback" not in err + out
    lines = {line.split()[0]: line for line in out.splitlines() if line[:1].isalpha()}
    assert "unreadable" in lines["breakout"]
    assert "20.0" in lines["pong"] and "finished" in lines["pong"]
    report = _json_report(capsys, tmp_path)
    assert report["by_key"]["a3c", "breakout"]["status"] == "unreadable"
    assert report["summary_by_algo"]["a3c"]["num_games"] == 1


def test_running_and_stale_runs(tmp_path, capsys):
    _write_run(tmp_path, "a3c", "pong", 0, eval_returns=[20.0] * 30, status="running")
    _write_run(tmp_path, "a3c", "pong", 1, eval_returns=[10.0] * 30, status="preempted")
    report = _json_report(capsys, tmp_path)
    assert report["by_key"]["a3c", "pong"]["status"] == "preempted 1; running 0"
    time.sleep(0.05)
    report = _json_report(capsys, tmp_path, "--stale-after", "0.01")
    assert report["by_key"]["a3c", "pong"]["status"] == "preempted 1; stale 0"
    assert report["by_key"]["a3c", "pong"]["score_mean"] == 15.0


LIVE_WRITER = """
    import sys, time
    from hpcrl.io.metrics import MetricsWriter
    w = MetricsWriter(sys.argv[1], dict(algo="a3c", game="pong", seed=0, config=""))
    print("ready", flush=True)
    for i in range(1, 401):
        w.append("eval", frames=1000 * i, return_=0.01 * i, length=1000, rank=0)
        w.flush()
        time.sleep(0.005)
    w.close("finished")
"""


def test_analysis_of_a_run_being_written(tmp_path, capsys):
    run_dir = tmp_path / "a3c" / "pong" / "seed-0"
    run_dir.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LIVE_WRITER),
                              str(run_dir / "metrics.h5")], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    seen = set()
    while child.poll() is None:
        report = _json_report(capsys, tmp_path)
        pong = report["by_key"]["a3c", "pong"]
        n = pong["frames"][0] // 1000  # episodes on disk
        if n == 0:
            continue
        k = min(30, n)  # the score is the mean of 0.01 * i over the last k episodes
        assert pong["score_mean"] == pytest.approx(0.01 * (2 * n - k + 1) / 2)
        if pong["status"] == "running":
            seen.add(n)
    assert child.wait() == 0
    assert len([n for n in seen if n < 400]) >= 2, seen
    final = _json_report(capsys, tmp_path)["by_key"]["a3c", "pong"]
    assert final["status"] == "finished" and final["score_mean"] == pytest.approx(0.01 * 385.5)


def test_plot_writes_non_blank_pngs(tree, tmp_path, capsys):
    import matplotlib.image

    out_dir = tmp_path / "plots"
    code, _, err = _cli(capsys, tree, "--compare", "dqn_nature_noop", "--plot", out_dir)
    assert code == 0
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == ["curve_berzerk.png", "curve_breakout.png", "curve_pong.png",
                     "hns_summary.png", "train_berzerk.png", "train_breakout.png",
                     "train_pong.png"]
    for name in names:
        image = matplotlib.image.imread(out_dir / name)
        if name.startswith("train_"):
            assert image.shape[:2] == (1200, 700)   # 7 x 12 inches: six panels
        elif name.startswith("curve_"):
            assert image.shape[:2] == (450, 700)  # 7 x 4.5 inches at 100 dpi
        else:
            assert image.shape[0] == 450 and image.shape[1] >= 600
        rgb = image[..., :3]
        non_white = np.mean(np.any(rgb < 0.9, axis=-1))
        assert 0.01 < non_white < 0.9, (name, non_white)  # drawn on, but not a solid block
        assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 10  # lines, text, colours
    assert err.count("wrote") == 7


def test_stats_and_hours_plots_with_performance_profiles(tree, tmp_path, capsys):
    import matplotlib.image

    out_dir = tmp_path / "plots"
    code, out, err = _cli(capsys, tree, "--stats", "--reps", "500", "--x", "hours",
                          "--plot", out_dir)
    assert code == 0 and "IQM HNS [noop]" in out and "stratified bootstrap" in out
    assert (out_dir / "profile.png").exists() and err.count("wrote") == 8
    image = matplotlib.image.imread(out_dir / "profile.png")[..., :3]
    assert 0.01 < np.mean(np.any(image < 0.9, axis=-1)) < 0.9


def test_stats_numbers_on_synthetic_tree(tree, capsys):
    report = _json_report(capsys, tree, "--stats", "--reps", "2000")
    agg = {a["algo"]: a for a in report["aggregates"]}
    a3c = agg["a3c"]
    # run-game HNS: pong 3 seeds, breakout 1.0, berzerk 0.5; IQM of 5 cuts one from each end
    pong = [(s + 20.7) / 35.3 for s in (18, 20, 16)]
    assert (a3c["num_games"], a3c["num_runs"]) == (3, 5)
    assert a3c["iqm"]["value"] == pytest.approx(np.mean(sorted(pong + [1.0, 0.5])[1:4]))
    assert a3c["median"]["value"] == pytest.approx(1.0)
    assert a3c["mean"]["value"] == pytest.approx((PONG_HNS + 1.0 + 0.5) / 3)
    assert a3c["optimality_gap"]["value"] == pytest.approx(0.1)   # 1 - (0.5 + 4 x 1) / 5
    for name in ("iqm", "median", "mean", "optimality_gap"):
        assert a3c[name]["low"] <= a3c[name]["value"] <= a3c[name]["high"]
    gorila = agg["gorila"]                   # one run of one game: nothing to resample
    assert gorila["iqm"]["low"] == gorila["iqm"]["high"] == pytest.approx(30.7 / 35.3)


def test_curve_against_hours_uses_the_wall_time_of_the_same_episodes():
    run = analyze.RunResult("r", "a3c", "pong", 0, "finished",
                            curve_frames=np.array([100, 200, 100, 300]),
                            curve_returns=np.array([1.0, 5.0, 3.0, 7.0]),
                            curve_wall_s=np.array([3600.0, 7200.0, 3700.0, 9000.0]))
    x, y = analyze._curve(run, 2, "hours")
    np.testing.assert_allclose(x, [3700 / 3600, 2.0, 2.5])     # the batch at 100 ends at 3700 s
    np.testing.assert_allclose(y, [2.0, 4.0, 6.0])
    assert analyze._curve(run, 2, "frames")[0].tolist() == [100, 200, 300]


def test_episode_clock_restarted_by_a_resume_takes_the_train_rows_clock():
    from hpcrl.tools.runs import episode_wall_s

    # A resume at 200 frames (1,000 s) restarted the episodes' clock: 300 and 400 ended 50 and
    # 500 s after it. The train rows kept the file's clock: 1,000 s at 200 frames, 2,000 s at
    # 400, so 1,500 s at 300 by interpolation and 2,000 s at 400.
    got = episode_wall_s(np.array([100, 200, 300, 400]), np.array([480.0, 1000.0, 50.0, 500.0]),
                         np.array([0, 200, 400]), np.array([0.0, 1000.0, 2000.0]))
    np.testing.assert_allclose(got, [500.0, 1000.0, 1500.0, 2000.0])
    # A right clock is kept where it is later than the rows' (and without rows, as it is)
    assert episode_wall_s(np.array([100]), np.array([520.0]), np.array([0, 200]),
                          np.array([0.0, 1000.0])).tolist() == [520.0]
    assert episode_wall_s(np.array([100]), np.array([3.0]), np.zeros(0),
                          np.zeros(0)).tolist() == [3.0]


def test_milestones_by_hand():
    # 25 episodes: 20 at -21, then -1, +19, +19, +19, +19. Window 4 for a short hand count:
    # windows ending at episode 21 (-21 x 3, -1): mean -16.0; at 22 (-21, -21, -1, 19): -6.0;
    # at 23 (-21, -1, 19, 19): 4.0; at 24 (-1, 19, 19, 19): 14.0; at 25: 19.0.
    returns = [-21.0] * 20 + [-1.0, 19.0, 19.0, 19.0, 19.0]
    frames = 1000 * np.arange(1, 26)
    wall = 60.0 * np.arange(1, 26)
    got = analyze.milestones(frames, returns, wall, [-16, 0, 10, 18, 20], window=4)
    assert [(m["frames"], m["minutes"]) for m in got] == [
        (21_000, 21.0), (23_000, 23.0), (24_000, 24.0), (25_000, 25.0), (None, None)]
    assert analyze.milestones(frames[:3], returns[:3], wall[:3], [0], window=4)[0]["frames"] is None


def test_milestones_on_the_command_line(tree, capsys):
    code, out, _ = _cli(capsys, tree / "a3c" / "breakout", "--milestones", "0,30")
    assert code == 0
    row = [line for line in out.splitlines() if "breakout" in line and "| train |" in line][0]
    # training returns 0 x 20 then 30.5 x 30, one per 1,000 frames: the mean of 20 passes 0 at
    # the 20th episode, 30 at the 40th
    assert "| 0.02 / " in row and "| 0.04 / " in row


def test_a3c_lstm_runs_are_their_own_agent():
    """The papers report A3C FF and A3C LSTM as two agents: so do the tables and curves."""
    from hpcrl.tools.runs import agent_name

    assert agent_name({"algo": "a3c", "config": 'algo = "a3c"\nlstm = true\n'}) == "a3c_lstm"
    assert agent_name({"algo": "a3c", "config": "lstm = false\n"}) == "a3c"
    assert agent_name({"algo": "a3c", "config": "not [toml"}) == "a3c"
    assert agent_name({"algo": "n_step_q", "config": "lstm = true\n"}) == "n_step_q"


def test_band_means_by_hand():
    from hpcrl.tools.scores import band_means

    frames = np.array([100, 900, 1000, 1500, 2500, 9999])
    values = np.array([1.0, 3.0, 5.0, np.nan, 7.0, 11.0])
    # bands of 1,000 frames: [1, 3] | [5] (the NaN skipped) | [7, 11]: the last of 3 bands
    # also takes frame 9,999
    means, counts = band_means(frames, values, 1000, 3)
    np.testing.assert_array_equal(means, [2.0, 5.0, 9.0])
    np.testing.assert_array_equal(counts, [2, 1, 2])
    means, counts = band_means(frames, values, 1000, 4)
    np.testing.assert_array_equal(means, [2.0, 5.0, 7.0, 11.0])
    means, counts = band_means(np.array([100, 2500]), np.array([1.0, 2.0]), 1000, 3)
    assert means[0] == 1.0 and math.isnan(means[1]) and means[2] == 2.0
    np.testing.assert_array_equal(counts, [1, 0, 1])
    with pytest.raises(ValueError):
        band_means(frames, values, 0, 3)


def test_bands_on_the_command_line(tree, capsys):
    code, out, _ = _cli(capsys, tree / "a3c" / "pong" / "seed-0", "--bands", "1e4")
    assert code == 0
    lines = out.splitlines()
    # evaluation episode i (1..40) ends at frame 1,000 i: -21 for i <= 10, then 18; the train
    # row at 50,000 frames makes the run 50 k frames long: 5 bands of 10 k, the last to 50 k
    head = [line for line in lines if "k frames" in line][0]
    assert head.endswith("| 0-10 | 10-20 | 20-30 | 30-40 | 40-50.00 |")
    evaluation = [line for line in lines if line.startswith("| evaluation mean")][0]
    # band 0: episodes 1-9 at -21; band 1: episode 10 at -21 and 11-19 at 18: 141 / 10
    assert evaluation == ("| evaluation mean (episodes) | -21.00 (9) | 14.10 (10) | 18.00 (10) "
                          "| 18.00 (10) | 18.00 (1) |")
    assert [line for line in lines if line.startswith("| frames/s")][0] == (
        "| frames/s | - | - | - | - | 10000 |")
    assert not any(line.startswith("| training mean") or line.startswith("| dead units")
                   for line in lines)  # no training episodes, no health columns written
    with pytest.raises(SystemExit) as exc:
        main([str(tree), "--bands", "0.5"])
    assert exc.value.code == 2
