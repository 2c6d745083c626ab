"""Bad input: one actionable line, non-zero exit on every rank within seconds, data untouched."""

import hashlib
import json
import shutil

import pytest

from hpcrl.io import checkpoint as ck
from hpcrl.io.metrics import read_metrics
from tests.util import run_mpi

pytestmark = pytest.mark.mpi
CARTPOLE = ["--config", "configs/gorila_cartpole.toml", "--set", "log_every_s=1"]


def run(tmp_path, *sets, n=4, env=None, timeout=120):
    args = ["-m", "hpcrl.run", *CARTPOLE, "--set", f"run_dir={tmp_path / 'run'}"]
    for s in sets:
        args += ["--set", s] if "=" in s else [s]
    return run_mpi(n, args, timeout=timeout, env=env)


def snapshot(d):
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def error_line(proc):
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcrl: error:")]
    assert len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def _template_run(tmp_path_factory):
    """A run that wrote checkpoint generations 1 (at 1500 frames) and 2 (at 3000); made once."""
    base = tmp_path_factory.mktemp("template")
    for total in (1500, 3000):
        proc, _ = run(base, f"total_frames={total}", "checkpoint_keep=5")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return base / "run"


@pytest.fixture
def finished_run(_template_run, tmp_path):
    """A private copy of the template run at tmp_path/run (tests damage it)."""
    shutil.copytree(_template_run, tmp_path / "run")
    return tmp_path / "run"


def test_unknown_algorithm(tmp_path):
    proc, wall = run(tmp_path, "algo=ppo")
    assert proc.returncode == 2 and wall < 30
    assert "key 'algo' must be one of gorila, one_step_q" in error_line(proc)


def test_unwritable_run_dir(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc, wall = run_mpi(3, ["-m", "hpcrl.run", *CARTPOLE, "--set",
                             f"run_dir={tmp_path}/afile/run"], timeout=60)
    assert proc.returncode == 2 and wall < 30
    assert f"run directory {tmp_path}/afile/run is not usable: Not a directory" in error_line(proc)


def test_run_dir_of_another_config_is_refused_then_moved_aside(finished_run, tmp_path):
    before = snapshot(finished_run)
    proc, _ = run(tmp_path, "game=Acrobot-v1")
    assert proc.returncode == 2
    assert "belongs to another run: it holds a run with game='CartPole-v1', not 'Acrobot-v1'" \
        in error_line(proc)
    assert snapshot(finished_run) == before
    proc, _ = run(tmp_path, "game=Acrobot-v1", "total_frames=500", "--force-new")
    assert proc.returncode == 0, proc.stderr[-2000:]
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(moved) == 1 and snapshot(moved[0]) == before


def test_unreadable_metrics_is_one_line_and_reset_metrics_continues(finished_run, tmp_path):
    garbage = b"not an HDF5 file " * 64
    (finished_run / "metrics.h5").write_bytes(garbage)
    before = snapshot(finished_run)
    proc, wall = run(tmp_path, "total_frames=4000", "checkpoint_keep=5")
    assert proc.returncode == 2 and wall < 60
    line = error_line(proc)
    assert f"{finished_run}/metrics.h5 is unreadable (" in line
    assert "pass --reset-metrics to move it aside and continue from checkpoint generation 2" in line
    assert snapshot(finished_run) == before
    proc, _ = run(tmp_path, "total_frames=4000", "checkpoint_keep=5", "--reset-metrics")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "continues from checkpoint generation 2 with fresh metrics" in proc.stdout
    assert "resuming from checkpoint generation 2 at frame 3,0" in proc.stdout
    aside = list(finished_run.glob("metrics.damaged-*.h5"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    episodes = read_metrics(finished_run / "metrics.h5")["episodes"]
    assert len(episodes["frames"]) > 0 and episodes["frames"].min() > 3000   # after the checkpoint


def test_truncated_newest_generation_falls_back(finished_run, tmp_path):
    path = ck.rank_file(finished_run / "checkpoints", 2, 1)
    path.write_bytes(path.read_bytes()[:200])
    proc, _ = run(tmp_path, "total_frames=4000", "checkpoint_keep=5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: skipping checkpoint generation 2" in proc.stdout
    assert "truncated" in proc.stdout
    assert "resuming from checkpoint generation 1 at frame" in proc.stdout
    # the damaged generation's number is not written into again: the final one is 3
    assert "[hpcrl] checkpoint generation 3 at frame 4," in proc.stdout, proc.stdout[-2000:]
    assert ck.latest_complete(finished_run / "checkpoints")[0] == 3


def test_every_generation_damaged_is_an_error(finished_run, tmp_path):
    for gen in (1, 2):
        path = ck.rank_file(finished_run / "checkpoints", gen, 0)
        data = bytearray(path.read_bytes())
        data[-50] ^= 0xFF
        path.write_bytes(bytes(data))
    before = snapshot(finished_run)
    proc, wall = run(tmp_path, "total_frames=4000")
    assert proc.returncode == 2 and wall < 60
    assert "no usable checkpoint in" in error_line(proc) and "(1, 2) is damaged" in error_line(proc)
    assert snapshot(finished_run) == before


def test_checkpoint_of_another_network_shape(finished_run, tmp_path):
    manifest_path = ck.gen_dir(finished_run / "checkpoints", 2) / ck.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["n_params"] += 1
    manifest_path.write_text(json.dumps(manifest))
    before = snapshot(finished_run)
    proc, _ = run(tmp_path, "total_frames=4000")
    assert proc.returncode == 2
    line = error_line(proc)
    assert "checkpoint generation 2 has" in line and "network parameters, this network has" in line
    assert snapshot(finished_run) == before


def test_other_world_size_is_explained(finished_run, tmp_path):
    before = snapshot(finished_run)
    proc, _ = run(tmp_path, "total_frames=4000", n=5)
    assert proc.returncode == 2
    line = error_line(proc)
    assert "written by a job with 4 ranks (1 ps, 3 actor-learner)" in line
    assert "this job has 5 (1 ps, 4 actor-learner)" in line
    assert snapshot(finished_run) == before


def test_disk_full_at_the_final_checkpoint_fails_the_run_and_keeps_the_previous_generation(
        finished_run, tmp_path):
    """The budget's final generation cannot be written: the final weights are not on disk, so
    the run is not "finished": status 3 (not requeued), metrics "failed", generation 2 intact,
    and the same command resumes from it once there is space."""
    before = snapshot(finished_run / "checkpoints" / "gen-000002")
    proc, _ = run(tmp_path, "total_frames=4000", "checkpoint_keep=5",
                  env={"HPCRL_CKPT_FAIL_RANK": "2"})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert ("hpcrl: error: checkpoint generation 3 not written (rank 2: No space left on device"
            in proc.stdout), proc.stdout[-2000:]
    assert "the run stops as failed with status 3, not requeued (generation 2 is the newest " \
        "kept" in proc.stdout
    root = finished_run / "checkpoints"
    assert ck.latest_complete(root)[0] == 2 and not ck.gen_dir(root, 3).exists()
    assert snapshot(root / "gen-000002") == before
    assert read_metrics(finished_run / "metrics.h5")["status"] == "failed"
    proc, _ = run(tmp_path, "total_frames=4000", "checkpoint_keep=5")     # space again
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ck.latest_complete(root)[0] == 3


def test_checkpoint_max_failures_in_a_row_stop_the_job(tmp_path):
    """Every periodic generation fails (rank 2's disk is full): a warning each time, and the
    second failure in a row (checkpoint_max_failures = 2) stops the job with status 3."""
    proc, _ = run(tmp_path, "total_frames=100000000", "checkpoint_every_min=0.02",
                  "checkpoint_max_failures=2", env={"HPCRL_CKPT_FAIL_RANK": "2"}, timeout=180)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("hpcrl: warning: checkpoint generation 1 not written (rank 2: No space left on "
            "device (injected)); no generation is kept; 1 of checkpoint_max_failures = 2 in a "
            "row") in proc.stdout
    assert ("hpcrl: error: checkpoint generation 2 not written (rank 2: No space left on "
            "device (injected)); 2 generations in a row failed (checkpoint_max_failures)"
            in proc.stdout)
    assert read_metrics(tmp_path / "run" / "metrics.h5")["status"] == "failed"
