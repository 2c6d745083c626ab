"""Checkpoints at any size: writing a generation may take longer than ``watchdog_s`` (hundreds
of GB on a shared file system). The phase has its own bound, derived from the generation's
size; within it the job goes on, past it rank 0 names the ranks that did not finish."""

import re
import threading
import time

import pytest

from hpcrl.io.metrics import read_metrics
from hpcrl.runtime import watchdog
from hpcrl.runtime.sizing import checkpoint_bound_s
from hpcrl.tools import runfiles
from tests.util import run_mpi


def test_checkpoint_bound_by_hand():
    # the Gorila paper layout's ~700 GB at 100 MB/s: 7,000 s beside watchdog_s = 300 s
    assert checkpoint_bound_s(700e9, 300.0, 100.0) == pytest.approx(7300.0)
    assert checkpoint_bound_s(1e6, 10.0, 100.0) == 20.0          # small: 2 x watchdog_s
    assert checkpoint_bound_s(0.0, 300.0, 1.0) == 600.0


def test_watchdog_waits_longer_only_inside_allow():
    fired = threading.Event()
    saved = watchdog.CURRENT
    try:
        watchdog.start(0.5, 0, "test", fired.set)
        with watchdog.allow(3.0):
            time.sleep(1.5)                 # three times the timeout: allowed
        assert not fired.is_set()
        time.sleep(2.0)                     # outside: reported and aborted
        assert fired.is_set()
    finally:
        watchdog.CURRENT = saved


def _job(tmp_path, delay):
    run_dir = tmp_path / "r"
    proc, wall = run_mpi(3, ["-m", "hpcrl.run", "--config", "configs/a3c_cartpole.toml",
                             "--set", f"run_dir={run_dir}", "--set", "total_frames=20000",
                             "--set", "watchdog_s=10", "--set", "final_eval_episodes=0",
                             "--set", "checkpoint_every_min=0.1"],
                         env={"HPCRL_CKPT_DELAY": f"2:{delay}"}, timeout=240)
    return run_dir, proc


@pytest.mark.mpi
def test_a_checkpoint_slower_than_the_watchdog_completes_and_the_job_goes_on(tmp_path):
    """Rank 2 takes 12 s to write its first generation (periodic, due after 6 s, or the
    budget's final one if the run is that fast), watchdog_s is 10 (the bound 20 s): the
    generation is written and the run ends with its final generation, finished."""
    run_dir, proc = _job(tmp_path, 12)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines()
            if ln.startswith("[hpcrl] checkpoint generation 1 at frame")][0]
    assert float(re.search(r"written in ([0-9.]+) s", line).group(1)) >= 12   # the slow one
    gen, manifest = runfiles.checkpoint_generation(run_dir)
    assert gen >= 1 and manifest["frames"] >= 20000          # the budget's final generation
    assert read_metrics(run_dir / "metrics.h5")["status"] == "finished"


@pytest.mark.mpi
def test_a_rank_stuck_in_a_checkpoint_is_named_after_the_bound(tmp_path):
    """Rank 2 stops inside its write: rank 0 names it once the bound (20 s) has passed, and
    the job ends non-zero instead of hanging."""
    run_dir, proc = _job(tmp_path, "stop")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert ("checkpoint generation 1: rank(s) 2 (actor-learner) did not finish writing "
            "within 20 s") in out, out[-3000:]
    from hpcrl.io import checkpoint as ck

    assert ck.latest_complete(run_dir / "checkpoints") is None     # no half generation used
