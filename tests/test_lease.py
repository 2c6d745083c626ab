"""The run-directory lease: the takeover rule by hand, the lock between real processes, and two
real jobs on one run directory under mpiexec."""

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrl.runtime.lease import LEASE_NAME, LOCK_NAME, RunDirBusy, RunDirLease, describe, judge, read_lease
from tests.util import ROOT, mpiexec_path, signal_tree

ME = dict(host="c001", pid=100, slurm_job="77", slurm_array=None, started=0.0, heartbeat=1000.0)


def holder(**kw):
    return {**dict(host="c042", pid=5678, slurm_job="1234", slurm_array="1234_7",
                   started=0.0, heartbeat=997.0), **kw}


def alive(_pid):
    return True


def dead(_pid):
    return False


@pytest.mark.parametrize("lock, old, pid_alive, take", [
    ("busy", None, alive, False),                       # a held lock always refuses
    ("busy", holder(heartbeat=0.0), dead, False),       # even with a stale lease file
    ("held", None, alive, True),                        # a fresh directory
    ("held", holder(), alive, False),                   # live holder on another node
    ("held", holder(heartbeat=1000 - 301), alive, True),  # its heartbeat is past 300 s
    ("held", holder(host="c001"), alive, True),         # same host, lock free: holder gone
    ("held", holder(slurm_job="77"), alive, True),      # this job, requeued
    ("unsupported", holder(), alive, False),
    ("unsupported", holder(host="c001"), dead, True),   # no locks: the pid decides
    ("unsupported", holder(host="c001"), alive, False),
])
def test_takeover_rule(lock, old, pid_alive, take):
    assert judge(lock, old, ME, now=1000.0, stale_s=300.0, pid_alive=pid_alive).take is take


def test_holder_is_named():
    assert describe(holder(), 1000.0) == "job 1234_7 on node c042 (pid 5678, heartbeat 3 s ago)"
    plain = holder(slurm_job=None, slurm_array=None, host="vm")
    assert describe(plain, 1000.0) == "a job on host vm (pid 5678, heartbeat 3 s ago)"


_HOLD = """
import sys, time
from pathlib import Path
from hpcrl.runtime.lease import RunDirLease
lease = RunDirLease.acquire(Path(sys.argv[1]), 300.0)
print("held", flush=True)
time.sleep(60)
"""


def _hold(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lock_between_processes_and_sigkilled_holder(tmp_path):
    holder_proc = _hold(tmp_path)
    try:
        lease = read_lease(tmp_path)
        assert lease["pid"] == holder_proc.pid
        with pytest.raises(RunDirBusy, match=f"in use by a job on host .*pid {holder_proc.pid}"):
            RunDirLease.acquire(tmp_path, 300.0)
    finally:
        holder_proc.kill()
        holder_proc.wait()
    # the holder died without cleaning up: its lease file stays, its lock went with it
    assert read_lease(tmp_path)["pid"] == holder_proc.pid
    notes = []
    lease = RunDirLease.acquire(tmp_path, 300.0, warn=lambda m, **kw: notes.append(m))
    assert read_lease(tmp_path)["pid"] == os.getpid()
    assert "that process is gone" in notes[0]
    lease.release()
    assert not (tmp_path / LEASE_NAME).exists() and not (tmp_path / LOCK_NAME).exists()


def test_heartbeat_is_rewritten(tmp_path):
    lease = RunDirLease.acquire(tmp_path, 0.5)          # heartbeat every 0.05 s
    first = read_lease(tmp_path)["heartbeat"]
    time.sleep(0.3)
    assert read_lease(tmp_path)["heartbeat"] > first
    lease.release()


def _digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _job(run_dir, *sets):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcrl.run", "--config",
            "configs/a3c_cartpole.toml", "--set", f"run_dir={run_dir}", "--set",
            "log_every_s=0.5", *sets], env


@pytest.mark.mpi
def test_second_job_on_a_live_run_directory_is_refused(tmp_path):
    """Job A runs; while it is stopped (so that it writes nothing) job B on the same directory
    must exit 2 within 10 s on every rank, naming A, and change no file. After A is SIGKILLed,
    job C resumes from A's checkpoint without waiting for A's lease to go stale."""
    run_dir = tmp_path / "r"
    cmd, env = _job(run_dir, "--set", "total_frames=100000000", "--set", "checkpoint_every_min=0.02")
    with open(tmp_path / "a.log", "w") as log:
        a = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not list(run_dir.glob("checkpoints/gen-*/MANIFEST.json")):
            assert a.poll() is None and time.monotonic() < deadline, "job A did not checkpoint"
            time.sleep(0.2)
        time.sleep(1.0)
        signal_tree(a.pid, signal.SIGSTOP)
        time.sleep(0.5)
        before = _digest(run_dir)
        t0 = time.monotonic()
        b = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        wall = time.monotonic() - t0
        assert b.returncode == 2, b.stdout + b.stderr
        assert wall < 10
        lines = [line for line in b.stderr.splitlines() if "is in use by" in line]
        assert len(lines) == 1, b.stderr          # rank 0 says it; every rank exits 2
        assert "heartbeat" in lines[0] and str(run_dir) in lines[0]
        assert _digest(run_dir) == before
        holder_pid = read_lease(run_dir)["pid"]
        signal_tree(a.pid, signal.SIGKILL)
        a.wait(timeout=30)
    finally:
        if a.poll() is None:
            signal_tree(a.pid, signal.SIGKILL)
            a.wait()
    assert read_lease(run_dir)["pid"] == holder_pid               # left behind by the kill
    cmd, env = _job(run_dir, "--set", "total_frames=1000")
    c = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "that process is gone" in c.stdout and "resuming from checkpoint" in c.stdout
    assert not (run_dir / LEASE_NAME).exists() and not (run_dir / LOCK_NAME).exists()


def test_a_zombie_holds_nothing():
    """A holder killed but not yet reaped (its parent died with it) is gone."""
    from hpcrl.runtime.lease import _pid_alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert _pid_alive(child.pid)
    child.kill()
    deadline = time.monotonic() + 10
    while _pid_alive(child.pid):                     # a zombie until waited for
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert Path(f"/proc/{child.pid}").exists()       # still in the process table
    child.wait()
