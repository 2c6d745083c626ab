"""Rank 0's pure rules: the early-stop rule, the progress text of the log line and the final
evaluation's summary line, with numbers worked by hand."""

from hpcrl.runtime.reporter import RecentRate, early_stop_reason, final_summary, progress_text


def test_progress_text_by_hand():
    # 6 M of 24 M frames, 2 M of them in the 1,000 s since this start: 18 M left at 2,000
    # frames/s is 9,000 s = 2:30:00
    assert progress_text(6_000_000, 24_000_000, 2_000_000, 1000.0) == \
        "25.0% of 24,000,000, 2:30:00 left"
    assert progress_text(0, 1000, 0, 0.0) == "0.0% of 1,000, ? left"
    assert progress_text(1200, 1000, 1200, 3.0) == "100.0% of 1,000, 0:00:00 left"


def test_early_stop_uses_evaluation_episodes_once_there_are_any():
    assert early_stop_reason([20.0] * 20, [], 18.0).startswith("mean return of the last 20 training")
    assert early_stop_reason([20.0] * 20, [17.0] * 20, 18.0) is None
    assert early_stop_reason([], [17.0] + [18.0] * 20, 18.0) == \
        "mean return of the last 20 evaluation episodes 18.0 >= 18.0"
    assert early_stop_reason([], [18.0] * 19, 18.0) is None


def test_final_summary_by_hand():
    line = final_summary([(1.0, 100), (3.0, 300)], 2.0)
    assert line == ("final evaluation: 2 episodes, mean return 2.00 (std 1.00, min 1, max 3), "
                    "400 frames in 2.0 s (200 frames/s over the evaluating ranks)")
    assert final_summary([], 1.0) == "final evaluation: no episodes"


class _Counters:
    """The ps counters a Reporter reads (a stand-in for the RMA store: no MPI windows)."""

    def __init__(self):
        self.c = {"frames": 0, "applied": 0, "dropped_stale": 0, "dropped_nonfinite": 0}

    def counters(self):
        return dict(self.c)

    def zero_statistics(self):
        import numpy as np

        return np.zeros(0, np.int64)


def _reporter(tmp_path, store, resume_frames=None):
    from mpi4py import MPI

    from hpcrl.config import load_config
    from hpcrl.runtime.reporter import Reporter
    from hpcrl.runtime.topology import make_layout
    from tests.util import ROOT

    cfg = load_config(ROOT / "configs/gorila_cartpole.toml")
    return Reporter(MPI.COMM_SELF, store, cfg, make_layout(3, cfg), tmp_path,
                    resume_frames=resume_frames)


def test_the_end_of_a_run_writes_a_train_row_only_if_a_counter_moved(tmp_path, capsys):
    """finish() after a report at the same counters adds no row; after frames, updates or a
    drop count moved it adds one; a resumed start compares with the last row it kept."""
    from hpcrl.io.metrics import read_metrics

    store = _Counters()
    rep = _reporter(tmp_path, store)
    store.c.update(frames=100, applied=7)
    rep.report(1.0)
    rep.finish()                                      # nothing moved: no second row
    assert list(read_metrics(tmp_path / "metrics.h5")["train"]["frames"]) == [100]

    rep = _reporter(tmp_path, store, resume_frames=100)
    rep.finish()                                      # the kept row already says it all
    assert list(read_metrics(tmp_path / "metrics.h5")["train"]["frames"]) == [100]

    rep = _reporter(tmp_path, store, resume_frames=100)
    store.c.update(dropped_stale=1)                   # a late gradient dropped after the budget
    rep.finish()
    train = read_metrics(tmp_path / "metrics.h5")["train"]
    assert list(train["frames"]) == [100, 100] and list(train["dropped_stale"]) == [0, 1]

    rep = _reporter(tmp_path, store, resume_frames=100)
    store.c.update(frames=180, applied=9)
    rep.report(2.0)
    store.c.update(frames=200)
    rep.finish()
    assert list(read_metrics(tmp_path / "metrics.h5")["train"]["frames"]) == [100, 100, 180, 200]
    capsys.readouterr()


def test_a_resume_continues_the_return_windows_from_the_kept_rows(tmp_path, capsys):
    """After a resume the log line's means, early stop and the collapse watch read the
    returns of the rows kept in metrics.h5 (those up to the checkpoint), not an empty window:
    a run at +18 in evaluation before a preemption must not wait for 20 new evaluation
    episodes, nor fall back to its training returns meanwhile."""
    store = _Counters()
    rep = _reporter(tmp_path, store)
    for i in range(25):
        rep.writer.append("episodes", frames=10 * i, return_=float(i), length=100, rank=1)
    for i in range(20):
        rep.writer.append("eval", frames=10 * i, return_=18.0 + (i % 2), length=100, rank=1)
    rep.writer.append("eval", frames=500, return_=-21.0, length=100, rank=1)  # after the ckpt
    store.c.update(frames=240, applied=3)
    rep.report(1.0)
    rep.writer.close("preempted")

    rep = _reporter(tmp_path, store, resume_frames=240)
    assert rep.returns == [float(i) for i in range(25)]
    assert rep.eval_returns == [18.0 + (i % 2) for i in range(20)]
    assert early_stop_reason(rep.returns, rep.eval_returns, 18.0) == \
        "mean return of the last 20 evaluation episodes 18.5 >= 18.0"
    capsys.readouterr()


def test_the_time_left_follows_the_recent_rate_not_the_starts_average():
    # a Gorila-like start: 400 k frames of replay fill in the first 50 s (8,000 frames/s),
    # then 2,000 frames/s; log lines every 50 s, a window of 300 s
    rate = RecentRate(t0=100.0, frames0=1_000_000, window_s=300.0)
    assert rate.update(150.0, 1_400_000) == (400_000, 50.0)       # younger than the window
    frames = 1_400_000
    for now in range(200, 401, 50):                                # 200 .. 400: 5 lines
        frames += 100_000
        got = rate.update(float(now), frames)
    # at t = 400 the newest sample at least 300 s old is the start's (t = 100)
    assert got == (frames - 1_000_000, 300.0) and frames == 1_900_000
    frames += 100_000
    # at t = 450 the newest sample at least 300 s old is t = 150's: only the 2,000 frames/s
    assert rate.update(450.0, frames) == (600_000, 300.0)
    assert [t for t, _ in rate.samples] == [150.0, 200.0, 250.0, 300.0, 350.0, 400.0, 450.0]
    # 10 M of 12 M frames to go at 2,000 frames/s: 5,000 s = 1:23:20, where the start's
    # average (1,000,000 frames in 350 s: 2,857 frames/s) would say 3,500 s = 0:58:20
    assert progress_text(2_000_000, 12_000_000, 600_000, 300.0).endswith("1:23:20 left")
    assert progress_text(2_000_000, 12_000_000, 1_000_000, 350.0).endswith("0:58:20 left")
