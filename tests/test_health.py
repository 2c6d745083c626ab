"""Network health in the train rows: the learners' counters, the reporter's interval means,
the collapse warning, and metrics files of older schemas (real runs: tests/test_async_rl.py
and tests/test_gorila.py assert the columns of real jobs)."""

import math

import h5py
import numpy as np
import pytest

from hpcrl.core import STATS_FIELDS, LearnerStats
from hpcrl.io.metrics import COLUMNS, MetricsWriter, read_metrics
from hpcrl.runtime.reporter import CollapseWatch, interval_means


def test_learner_stats_count_losses_and_gradients_and_survive_a_checkpoint():
    s = LearnerStats()
    s.add_loss(2.0, 0.5, "a3c")          # entropy 0.5
    s.add_loss(4.0, 0.7, "a3c")
    s.add_gradient(3.0, clip=2.5)        # clipped: 2.5 of its 3.0 let through
    s.add_gradient(1.0, clip=2.5)
    s.add_gradient(4.0)                  # no clip
    assert (s.loss_sum, s.loss_count, s.entropy_sum, s.max_q_sum) == (6.0, 2, 1.2, 0.0)
    assert (s.grad_norm_sum, s.grad_norm_count, s.grad_clipped, s.grad_cut_sum) == (8.0, 3, 1, 0.5)
    q = LearnerStats()
    q.add_loss(1.0, 12.5, "one_step_q")  # max Q 12.5
    assert (q.entropy_sum, q.max_q_sum) == (0.0, 12.5)
    state = s.get_state()
    assert state["grad_clipped"].dtype == np.int64 and state["entropy_sum"].dtype == np.float64
    back = LearnerStats()
    back.set_state(state)
    assert back == s
    np.testing.assert_array_equal(back.as_row(), s.as_row())
    assert len(s.as_row()) == len(STATS_FIELDS)
    old = LearnerStats()                 # a checkpoint written before the health counters
    old.set_state({"loss_sum": np.float64(1.5), "loss_count": np.int64(3), "updates": 3})
    assert (old.loss_sum, old.loss_count, old.updates, old.grad_norm_count) == (1.5, 3, 3, 0)


def test_interval_means_by_hand():
    before = dict.fromkeys(STATS_FIELDS, 0.0) | dict(loss_sum=10.0, loss_count=5,
                                                     grad_norm_sum=6.0, grad_norm_count=3,
                                                     grad_clipped=1, grad_cut_sum=1.0,
                                                     entropy_sum=4.0)
    now = dict(before, loss_sum=16.0, loss_count=8, grad_norm_sum=14.0, grad_norm_count=7,
               grad_clipped=2, grad_cut_sum=3.0, entropy_sum=5.5, max_q_sum=9.0)
    m = interval_means(before, now, "a3c")
    # 3 losses summing 6, 4 gradients summing 8 norm with 1 clipped and 6 of the 8 let through,
    # entropy 1.5 over 3 losses
    assert m["loss"] == 2.0 and m["grad_norm"] == 2.0 and m["clipped_fraction"] == 0.25
    assert m["clip_kept"] == 0.75
    assert m["entropy"] == 0.5 and math.isnan(m["max_q"])
    q = interval_means(before, now, "n_step_q")
    assert q["max_q"] == 3.0 and math.isnan(q["entropy"])
    idle = interval_means(now, now, "a3c")            # no gradient since the last report
    assert all(math.isnan(v) for v in idle.values())


def test_collapse_warned_once_per_fall_and_again_after_a_recovery():
    watch = CollapseWatch(window=4)
    returns = [-21.0] * 4                              # first window -21
    assert watch.update(returns[:3]) is None           # not a full window yet
    said = []
    for r in [-21] * 4 + [17] * 4 + [-21, -21] + [-21] * 2 + [17] * 4 + [-21] * 4:
        returns.append(float(r))
        said.append(watch.update(returns))
    falls = [i for i, text in enumerate(said) if text]
    # best +17; halfway at -2: the mean of the last 4 reaches -2 once two -21s are in
    # (17, 17, -21, -21 -> -2), again only after a recovery to 3/4 (+7.5) and a new fall
    assert len(falls) == 2, said
    assert "fell to -2.00 from a best of 17.00 (first 4: -21.00)" in said[falls[0]]
    assert watch.update(returns) is None               # still down: no repeat


def test_a_resumed_watch_warns_of_a_fall_as_the_live_one_does():
    """After a resume the watch catches up on the kept returns: a run that had risen from -21
    to +17 before the stop is warned of a fall after it (an empty watch would take the last
    returns before the stop as its first window and stay silent)."""
    before = [-21.0] * 4 + [-10.0] * 4 + [17.0] * 4        # up to the checkpoint
    after = [17.0, -21.0, -21.0, -21.0]                     # the fall, after the resume
    live, resumed = CollapseWatch(window=4), CollapseWatch(window=4)
    returns = []
    for r in before:
        returns.append(r)
        assert live.update(returns) is None
    resumed.catch_up(list(before))
    assert (resumed.first, resumed.best) == (live.first, live.best) == (-21.0, 17.0)
    said_live, said_resumed = [], []
    for r in after:
        returns.append(r)
        said_live.append(live.update(returns))
        said_resumed.append(resumed.update(returns))
    assert said_resumed == said_live and sum(map(bool, said_live)) == 1
    empty = CollapseWatch(window=4)                     # without catch_up: silent
    assert not any(empty.update(before + after[:k + 1]) for k in range(len(after)))


def test_no_warning_for_a_run_that_never_rose_clearly():
    watch = CollapseWatch()                            # the reporter's: 20 episodes
    rng = np.random.default_rng(0)
    # noise around 0 (sd 5): the best of ~2,000 window means is about 4 above the first, less
    # than twice the spread of its window (about 10)
    returns = list(rng.normal(0.0, 5.0, 2000))
    assert not any(watch.update(returns[:n]) for n in range(1, 2001))
    assert watch.best - watch.first < 2 * watch.best_spread


def _train_row(i):
    return dict(frames=100 * i, updates=i, loss=1.0, dropped_stale=0, dropped_outlier=0,
                dropped_nonfinite=0, frames_per_second=10.0)


def test_health_columns_of_older_files_read_as_nan_and_a_resume_adds_them(tmp_path):
    path = tmp_path / "metrics.h5"
    attrs = dict(algo="a3c", game="pong", seed=0, config="")
    w = MetricsWriter(path, attrs)
    w.append("train", **_train_row(1), grad_norm=2.0, entropy=1.7)   # clipped, max_q left out
    w.close("preempted")
    m = read_metrics(path)
    assert m["train"]["grad_norm"].tolist() == [2.0] and m["train"]["entropy"].tolist() == [1.7]
    assert np.isnan(m["train"]["max_q"]).all() and np.isnan(m["train"]["clipped_fraction"]).all()
    with h5py.File(path, "r+") as f:                   # as a schema-2 file: no health columns
        for name in ("grad_norm", "clipped_fraction", "entropy", "max_q", "clip_kept"):
            del f["train"][name]
        f.attrs["schema_version"] = 2
    m = read_metrics(path)
    assert set(m["train"]) == set(COLUMNS["train"]) and np.isnan(m["train"]["grad_norm"]).all()
    assert m["train"]["loss"].tolist() == [1.0]
    w = MetricsWriter(path, attrs, resume=True)
    w.append("train", **_train_row(2), grad_norm=3.0)
    w.close()
    m = read_metrics(path)
    assert m["attrs"]["schema_version"] == 4
    assert np.isnan(m["train"]["grad_norm"][0]) and m["train"]["grad_norm"][1] == 3.0
    with pytest.raises(ValueError, match="missing columns"):
        MetricsWriter(tmp_path / "m2.h5", attrs).append("train", frames=1, updates=1)


# --------------------------------------------------------------- dead units, counted live
def test_a_shards_pieces_of_the_tensors_and_their_zero_counts_by_hand():
    from hpcrl.runtime.params.server import health_layout, zero_counts

    sizes = (4, 2, 6, 3)                         # flat: [0, 4) [4, 6) [6, 12) [12, 15)
    assert health_layout(sizes, 0, 5) == (0, [4, 1])
    assert health_layout(sizes, 5, 10) == (1, [1, 4])
    assert health_layout(sizes, 12, 15) == (3, [3])
    assert health_layout((), 0, 0) == (0, [])
    stat = np.array([0, 1, 0, 0, 5, 0, 0, 0, 2], np.float32)        # pieces 3, 2, 4
    assert zero_counts(stat, [3, 2, 4]).tolist() == [2, 1, 3]
    per_client = np.array([[0, 1, 0, 0], [3, 0, 0, 0]], np.float32)  # 0 only if 0 for all
    assert zero_counts(per_client, [2, 2]).tolist() == [0, 2]


def test_dead_shares_are_diagnoses_fractions():
    from hpcrl.runtime.reporter import dead_shares
    from hpcrl.tools.diagnose import zero_fractions

    tensors = (("conv.weight", 8), ("conv.bias", 4), ("fc.weight", 6), ("fc.bias", 2))
    rng = np.random.default_rng(1)
    stat = rng.random(20).astype(np.float32)
    stat[[0, 1, 8, 9, 10, 18]] = 0                 # conv.weight 2, conv.bias 3, fc.bias 1
    counts = [2, 3, 0, 1]
    out = dead_shares(np.array(counts), tensors)
    assert out["layers"] == {"conv.bias": 0.75, "fc.bias": 0.5}
    assert out["dead_units"] == 0.75 and out["dead_params"] == 6 / 20
    rows = {r["name"]: r["fraction"] for r in zero_fractions(tensors, stat)}
    assert rows["conv.bias"] == out["layers"]["conv.bias"] and rows["all"] == out["dead_params"]


def test_the_half_dead_warning_waits_until_a_zero_statistic_means_a_lost_gradient():
    from hpcrl.config import Config
    from hpcrl.runtime.reporter import dead_warn_after_updates

    # v decays by 0.99 per update without a gradient: below 1.2e-38 after 87.3 / 0.01005
    # = 8,687 updates (plus the 100 before any count)
    assert dead_warn_after_updates(Config(optimizer="rmsprop_shared")) == 100 + 8687
    assert dead_warn_after_updates(Config(optimizer="rmsprop_shared", rmsprop_decay=0.5)) == \
        100 + 126                                   # 87.3 / ln 2 = 125.9
    assert dead_warn_after_updates(Config(optimizer="adagrad")) == 100   # G never decays


@pytest.mark.mpi
def test_a_real_run_counts_dead_units_as_diagnose_does_and_warns_when_it_dies(tmp_path):
    """A3C CartPole made to die: a learning rate of 3 (not annealed) and RMSProp decay 0.5,
    under which a statistic at 0 means a unit without a gradient for 126 updates. The last
    train row (written after the final checkpoint) holds exactly diagnose's fractions of that
    checkpoint, the log warns that a layer passed half dead, and the rows before 100 applied
    updates are NaN."""
    from hpcrl.tools.diagnose import diagnose_run
    from tests.util import run_mpi

    run_dir = tmp_path / "r"
    proc, _ = run_mpi(3, ["-m", "hpcrl.run", "--config", "configs/a3c_cartpole.toml",
                          "--set", "total_frames=20000", "--set", f"run_dir={run_dir}",
                          "--set", "learning_rate=3", "--set", "lr_anneal=false",
                          "--set", "rmsprop_decay=0.5", "--set", "log_every_s=0.5",
                          "--set", "final_eval_episodes=0"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    train = read_metrics(run_dir / "metrics.h5")["train"]
    report = diagnose_run(run_dir)
    rows = {r["name"]: r["fraction"] for r in report["tensors"]}
    biases = [f for name, f in rows.items() if "bias" in name]
    assert train["dead_units"][-1] == pytest.approx(max(biases), abs=1e-12)
    assert train["dead_params"][-1] == pytest.approx(rows["all"], abs=1e-12)
    assert np.isnan(train["dead_units"][train["updates"] < 100]).all()
    assert max(biases) >= 0.5, rows
    assert "hpcrl: warning: " in proc.stdout and "no longer learn" in proc.stdout, \
        proc.stdout[-3000:]


def test_interval_means_without_earlier_counters_are_nan():
    """The first report after a resume: the restored counters hold the run's whole history."""
    now = dict.fromkeys(STATS_FIELDS, 0.0) | dict(loss_sum=16.0, loss_count=8)
    assert all(math.isnan(v) for v in interval_means(None, now, "a3c").values())
