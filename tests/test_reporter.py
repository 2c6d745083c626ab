"""Rank 0's pure rules: the early-stop rule, the progress text of the log line and the final
evaluation's summary line, with numbers worked by hand."""

from hpcrl.runtime.reporter import early_stop_reason, final_summary, progress_text


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
