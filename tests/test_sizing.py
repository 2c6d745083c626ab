"""Pre-flight sizing: the arithmetic by hand, and real jobs refused for memory and for disk."""

import shutil
import subprocess
import sys

import numpy as np
import pytest

from hpcrl.config import load_config
from hpcrl.runtime import sizing
from hpcrl.runtime.topology import make_layout
from tests.util import ROOT, run_mpi

CARTPOLE = ["--config", "configs/gorila_cartpole.toml"]


def test_gorila_cartpole_by_hand():
    """1 ps + 3 bundles, replay 1,000 per bundle, one env each, 17,410 parameters."""
    cfg = load_config(ROOT / "configs/gorila_cartpole.toml", ["replay_capacity=1000"])
    layout = make_layout(4, cfg)
    t = sizing.summary(cfg, layout, (4,), 17_410, ["a", "b", "b", "b"])
    # a replay slot: 4 float32 (16 B) + 21 B of columns; 1,000 + 1 slots (stack 1)
    replay = 1001 * 37
    # ps: parameters and target double-buffered + 3 inboxes of (n + 2) floats, 19 header words
    windows = 4 * (4 * 17_410 + 3 * (17_410 + 2)) + 8 * (16 + 3)
    assert t["memory_parts"]["a"] == {"process": 80e6, "windows": windows,
                                      "optimizer": 12 * 17_410}   # AdaGrad: float64 G, float32 G0
    assert t["memory"]["b"] == 3 * (200e6 + replay)
    generation = 4 * 2 * 17_410 + 12 * 17_410 + 3 * replay        # params, target, G, G0
    assert t["generation_bytes"] == generation
    assert t["disk_bytes"] == generation * (2 + 1)                   # checkpoint_keep = 2


def test_paper_layout_replay_is_the_issue():
    """Gorila's paper layout: 100 bundles x 1 M Atari transitions of 84 x 84 bytes each."""
    cfg = load_config(ROOT / "configs/gorila_paper.toml")
    t = sizing.summary(cfg, make_layout(130, cfg), (4, 84, 84), 1_687_206)
    slot = 84 * 84 + 21
    assert t["memory_parts"]["one node"]["replay"] == 100 * (1_000_000 + 4) * slot
    assert 700e9 < t["generation_bytes"] < 710e9


def test_refusals_carry_the_arithmetic(tmp_path):
    cfg = load_config(ROOT / "configs/gorila_cartpole.toml", ["replay_capacity=1000"])
    t = sizing.summary(cfg, make_layout(4, cfg), (4,), 17_410, ["n1"] * 4)
    free = (1e12, "free")
    assert sizing.check(cfg, t, tmp_path, {"n1": (1e12, "MemAvailable")}, free) is None
    line = sizing.check(cfg, t, tmp_path, {"n1": (0.5e9, "SLURM_MEM_PER_NODE")}, free)
    assert line.startswith("the job needs 0.7 GB of memory on n1 (process 0.68 GB + windows")
    assert "SLURM_MEM_PER_NODE allows 0.5 GB: lower replay_capacity" in line
    line = sizing.check(cfg, t, tmp_path, {"n1": None}, (1000.0, "free"))
    assert "checkpoint_keep 2 + 1 generations x 0.00 GB" in line and "--set checkpoint_keep=1" in line
    assert "which has 0.0 GB free:" in line


def test_the_quota_bounds_the_disk_where_it_is_smaller(tmp_path):
    """The file system's free space or the quota's headroom, whichever is smaller, plus the
    bytes of the generations already on disk (pruned as new ones come)."""
    (tmp_path / "checkpoints" / "gen-000001").mkdir(parents=True)
    (tmp_path / "checkpoints" / "gen-000001" / "rank-0.h5").write_bytes(b"x" * 5000)
    quota = (1e6, "the user quota of uid 7 (quota)")
    assert sizing.free_disk_bytes(tmp_path, quota) == (1e6 + 5000,
                                                       "left under the user quota of uid 7 (quota)")
    fs_free = float(shutil.disk_usage(tmp_path).free)       # other writers move it a little
    for found in (sizing.free_disk_bytes(tmp_path), sizing.free_disk_bytes(tmp_path, (1e18, "q"))):
        assert found[1] == "free" and found[0] == pytest.approx(fs_free, rel=1e-3)


def test_memory_available_reads_slurm_first(monkeypatch):
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "1024")
    assert sizing.memory_available() == (2.0 ** 30, "SLURM_MEM_PER_NODE")


def test_dry_run_prints_the_paper_totals():
    proc = subprocess.run([sys.executable, "-m", "hpcrl.run", "--dry-run", "--world-size", "130",
                           "--config", "configs/gorila_paper.toml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # shared RMSProp: one float32 statistic per parameter = 6.7 MB over the 1,687,206
    assert "memory on one node: 730.81 GB (process 22.40, windows 0.70, optimizer 0.01, " \
        "replay 707.70)" in proc.stdout
    assert "checkpoints: 707.72 GB per generation, 2123.17 GB of disk" in proc.stdout


@pytest.mark.mpi
def test_a_job_that_cannot_fit_memory_is_refused(tmp_path):
    proc, wall = run_mpi(4, ["-m", "hpcrl.run", *CARTPOLE, "--set", f"run_dir={tmp_path}/r",
                             "--set", "replay_capacity=1000000000"], timeout=120)
    assert proc.returncode == 2 and wall < 60, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcrl: error:")][0]
    assert "the job needs 111.7 GB of memory on" in line and "replay 111.00 GB" in line


@pytest.mark.mpi
def test_a_job_whose_checkpoints_cannot_fit_the_disk_is_refused(tmp_path):
    """Replay small enough for memory (1 GB per bundle), more generations than the disk holds."""
    free = shutil.disk_usage(tmp_path).free
    capacity = 27_000_000                             # x 37 B = 1.0 GB per bundle
    generation = 3 * capacity * 37
    keep = int(free // generation) + 1
    proc, wall = run_mpi(4, ["-m", "hpcrl.run", *CARTPOLE, "--set", f"run_dir={tmp_path}/r",
                             "--set", f"replay_capacity={capacity}",
                             "--set", f"checkpoint_keep={keep}"], timeout=120)
    assert proc.returncode == 2 and wall < 60, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcrl: error:")][0]
    assert f"(checkpoint_keep {keep} + 1 generations x 3.00 GB)" in line, line


def test_anonymous_resident_memory_and_largest_buffers_see_a_new_array():
    from hpcrl.runtime.watchdog import anonymous_resident_bytes, largest_buffers

    before = anonymous_resident_bytes()
    held = np.ones(300_000_000, dtype=np.uint8)            # touched, so resident
    after = anonymous_resident_bytes()
    assert 0.95 * held.nbytes < after - before < 1.2 * held.nbytes
    assert largest_buffers(1) == [(3e8, "ndarray uint8 (300000000,)")]


def test_the_memory_reports_list_python_allocations_by_line_only_under_tracemalloc():
    import tracemalloc

    from hpcrl.runtime.watchdog import python_allocations

    assert not tracemalloc.is_tracing() and python_allocations() == ""
    tracemalloc.start()
    try:
        held = [bytes(1000) for _ in range(20_000)]          # 20 MB from this line
        text = python_allocations(3)
    finally:
        tracemalloc.stop()
    assert text.startswith("Python allocations by line (tracemalloc, ")
    first = text.splitlines()[1]
    assert "in 2000" in first and "test_sizing.py" in first, text   # 20,00x blocks, this file
    assert len(held) == 20_000
