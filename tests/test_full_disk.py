"""A full disk during a run, injected and real (a small tmpfs): checkpoints and metrics.h5
flushes fail, the job stops as failed (status 3, not requeued) after the configured number of
failures with the newest complete generation readable, and the same command, once there is
space, resumes from it with no metrics row lost or repeated."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcrl.io import checkpoint as ck
from hpcrl.io.metrics import read_metrics
from tests.util import ROOT, fill_disk, mpiexec_path, signal_tree, small_tmpfs

pytestmark = pytest.mark.mpi


def _cmd(run_dir: Path, *sets: str) -> list[str]:
    cmd = [mpiexec_path(), "-n", "4", sys.executable, "-m", "hpcrl.run", "--config",
           "configs/gorila_cartpole.toml", "--set", f"run_dir={run_dir}", "--set",
           "log_every_s=0.5", "--set", "final_eval_episodes=0"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _env(**extra: str) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def _start(tmp_path: Path, run_dir: Path, log_every_s: str = "0.5", **env: str
           ) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "job.log"
    with open(log, "w") as fh:
        job = subprocess.Popen(_cmd(run_dir, "total_frames=100000000",
                                    "checkpoint_every_min=0.02", "checkpoint_keep=2",
                                    f"log_every_s={log_every_s}"),
                               cwd=ROOT, env=_env(**env), stdout=fh, stderr=subprocess.STDOUT)
    return job, log


def _wait_for_generation(job: subprocess.Popen, run_dir: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while ck.latest_complete(run_dir / "checkpoints", warn=lambda m: None) is None:
        assert job.poll() is None, "the job ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint generation"
        time.sleep(0.2)


def _wait(job: subprocess.Popen, timeout_s: float = 120) -> int:
    try:
        return job.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        signal_tree(job.pid, 9)
        job.wait()
        raise


def _resume_and_check(tmp_path: Path, run_dir: Path, env: dict | None = None) -> None:
    """Resume with space again: from the newest complete generation, and the metrics rows up
    to its frame are exactly those of the file the failed job left."""
    root = run_dir / "checkpoints"
    gen, manifest = ck.latest_complete(root)
    frames = manifest["frames"]
    before = read_metrics(run_dir / "metrics.h5")
    proc = subprocess.run(_cmd(run_dir, f"total_frames={frames + 3000}"), cwd=ROOT,
                          env=_env(**(env or {})), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resuming from checkpoint generation {gen} at frame {frames:,}" in proc.stdout
    after = read_metrics(run_dir / "metrics.h5")
    for group in ("episodes", "eval", "train"):
        old, new = before[group], after[group]
        keep_old, keep_new = old["frames"] <= frames, new["frames"] <= frames
        for name in ("frames", "return" if group != "train" else "updates", "wall_time"):
            np.testing.assert_array_equal(new[name][keep_new], old[name][keep_old],
                                          err_msg=f"{group}/{name} up to frame {frames}")
    assert np.all(np.diff(after["train"]["frames"]) > 0)      # no report twice
    assert after["status"] == "finished"


def test_metrics_flushes_that_keep_failing_stop_the_run_as_failed(tmp_path):
    """Injected: metrics.h5 cannot be written (the disk is "full"); 3 failed flushes in a row
    stop the run with a checkpoint, which fails too since its own flush fails: status 3."""
    run_dir, full = tmp_path / "run", tmp_path / "disk-full"
    job, log = _start(tmp_path, run_dir, HPCRL_METRICS_FULL_FILE=str(full))
    _wait_for_generation(job, run_dir)
    full.touch()
    assert _wait(job) == 3, log.read_text()[-3000:]
    text = log.read_text()
    assert text.count("hpcrl: warning: metrics.h5 not written (No space left on device "
                      "(injected)); its rows are kept in memory") == 2, text[-3000:]
    assert text.count("hpcrl: error: ") == 1, text[-3000:]                  # one line
    assert "hpcrl: error: metrics.h5 could not be written 3 times in a row" in text
    assert "not written (rank 0: metrics.h5: No space left on device (injected)); generation " \
        in text
    assert ck.latest_complete(run_dir / "checkpoints") is not None
    full.unlink()
    _resume_and_check(tmp_path, run_dir)


@pytest.mark.parametrize("log_every_s, first", [
    ("0.5", "metrics.h5 could not be written 3 times in a row"),   # flushes fail first
    ("600", "3 generations in a row failed"),                     # checkpoints fail first
])
def test_a_real_full_disk_stops_the_run_and_a_restart_resumes(tmp_path, log_every_s, first):
    """The run directory on a 64 MB tmpfs that is filled to the last byte after the first
    generation: with progress reports every 0.5 s the metrics flushes fail first, with none
    the periodic checkpoints (every 1.2 s) do; either way the job stops with status 3, the
    newest complete generation verifies, and after the filler is removed the same command
    resumes from it."""
    with small_tmpfs(tmp_path / "disk", 64) as disk:
        run_dir = disk / "run"
        job, log = _start(tmp_path, run_dir, log_every_s=log_every_s)
        _wait_for_generation(job, run_dir)
        filler = fill_disk(disk)
        assert _wait(job) == 3, log.read_text()[-3000:]
        text = log.read_text()
        assert "Traceback" not in text, text[-3000:]
        assert first in text and "the run stops as failed with status 3" in text, text[-3000:]
        assert text.count("hpcrl: error: ") == 1, text[-3000:]
        assert ck.latest_complete(run_dir / "checkpoints") is not None
        filler.unlink()
        _resume_and_check(tmp_path, run_dir)


def test_a_quota_that_runs_out_stops_the_run_before_a_write_fails(tmp_path):
    """A user quota (reported by a stand-in ``quota`` tool, see tests/test_quota.py) that the
    run directory outgrows: the next generations are not started ("Disk quota exceeded ...
    left under the user quota"), the third such failure stops the job with status 3 and no
    traceback, and once the quota is raised the same command resumes from the newest
    generation."""
    from tests.test_quota import stand_in_quota

    run_dir, limit = tmp_path / "run", tmp_path / "limit"
    run_dir.mkdir()
    limit.write_text("100000000")
    stand_in_quota(tmp_path / "bin", limit, run_dir)
    path = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    job, log = _start(tmp_path, run_dir, log_every_s="600", **path)
    _wait_for_generation(job, run_dir)
    limit.write_text("1")
    assert _wait(job) == 3, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    refused = (f"not written (rank 0: Disk quota exceeded: 0.0 MB left under the user quota of "
               f"uid {os.getuid()} (quota), ")
    assert text.count(refused) == 3 and text.count("hpcrl: error: ") == 1, text[-3000:]
    assert "3 generations in a row failed (checkpoint_max_failures): the run stops as failed " \
           "with status 3" in text
    assert ck.latest_complete(run_dir / "checkpoints") is not None
    limit.write_text("100000000")
    _resume_and_check(tmp_path, run_dir, path)


def test_a_quota_too_small_for_the_checkpoints_is_refused_at_the_start(tmp_path):
    """The pre-flight weighs the checkpoint generations against the quota's headroom where it
    is smaller than the free space: one line, status 2, nothing written."""
    from tests.test_quota import stand_in_quota

    run_dir, limit = tmp_path / "run", tmp_path / "limit"
    run_dir.mkdir()
    limit.write_text("1")
    stand_in_quota(tmp_path / "bin", limit, run_dir)
    proc = subprocess.run(_cmd(run_dir, "total_frames=3000"), cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=_env(
                              PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (f"which has 0.0 GB left under the user quota of uid {os.getuid()} (quota): --set "
            "checkpoint_keep=1") in proc.stderr, proc.stderr[-2000:]
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
