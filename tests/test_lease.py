"""The run-directory lease: the takeover rule by hand, the lock between real processes, and two
real jobs on one run directory under mpiexec."""

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcrl.runtime import lease as lease_mod
from hpcrl.runtime.lease import LEASE_NAME, LOCK_NAME, LeaseLost, RunDirBusy, RunDirLease, \
    describe, plan, read_lease
from tests.util import ROOT, mpiexec_path, signal_tree, stop_signal

ME = dict(host="c001", pid=100, slurm_job="77", slurm_array=None, slurm_restart=0,
          token="me", beat=0, heartbeat_s=10.0, started=0.0, heartbeat=1000.0)


def holder(**kw):
    return {**dict(host="c042", pid=5678, slurm_job="1234", slurm_array="1234_7",
                   slurm_restart=0, token="t", beat=9, heartbeat_s=10.0, started=0.0,
                   heartbeat=997.0), **kw}


def alive(_pid):
    return True


def dead(_pid):
    return False


@pytest.mark.parametrize("lock, old, me, pid_alive, expect", [
    ("busy", holder(), ME, dead, ("busy", 0.0)),            # a held lock refuses
    ("busy", holder(heartbeat=0.0), ME, dead, ("busy", 0.0)),  # however old its heartbeat
    ("held", holder(), ME, alive, ("watch", 300.0)),        # another node's: watch its beat
    ("held", holder(heartbeat=1e9), ME, alive, ("watch", 300.0)),  # clocks are not compared
    ("held", holder(host="c001"), ME, alive, ("take", 0.0)),  # same host, lock free: gone
    ("unsupported", holder(), ME, alive, ("watch", 300.0)),
    ("unsupported", holder(host="c001"), ME, dead, ("take", 0.0)),   # no locks: the pid
    ("unsupported", holder(host="c001"), ME, alive, ("watch", 300.0)),  # stopped, not gone
    ("held", {"corrupt": True, "digest": "x"}, ME, alive, ("watch", 300.0)),
    # a requeue of this SLURM job: three of its predecessor's beats, even under its lock
    ("busy", holder(slurm_job="77"), dict(ME, slurm_restart=1), alive, ("watch", 30.0)),
    ("busy", holder(slurm_job="77", heartbeat_s=0.5), dict(ME, slurm_restart=2), alive,
     ("watch", 1.5)),
    # the same incarnation (a second srun step of one allocation) is another job
    ("busy", holder(slurm_job="77"), ME, alive, ("busy", 0.0)),
    ("held", holder(slurm_job="77"), ME, alive, ("watch", 300.0)),
    ("busy", holder(slurm_job="77", slurm_restart=3), dict(ME, slurm_restart=1), alive,
     ("busy", 0.0)),
])
def test_takeover_rule(lock, old, me, pid_alive, expect):
    p = plan(lock, old, me, stale_s=300.0, pid_alive=pid_alive)
    assert (p.action, p.watch_s) == expect


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
    first = read_lease(tmp_path)
    time.sleep(0.3)
    now = read_lease(tmp_path)
    assert now["beat"] >= first["beat"] + 2 and now["heartbeat"] > first["heartbeat"]
    assert now["token"] == first["token"] == lease.me["token"]
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
        assert b.returncode == 4, b.stdout + b.stderr
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


_CONTEND = """
import sys, time
from pathlib import Path
from hpcrl.runtime.lease import RunDirBusy, RunDirLease
run_dir, stale_s, hold_s = Path(sys.argv[1]), *map(float, sys.argv[2:4])
print("ready", flush=True)
sys.stdin.readline()                              # "go": sent to all contenders at once
try:
    lease = RunDirLease.acquire(run_dir, stale_s, warn=lambda *a, **k: None)
except RunDirBusy:
    print("busy", flush=True)
    sys.exit(0)
print("held", lease.me["token"], flush=True)
time.sleep(hold_s)
lease.check()
lease.release()
"""


def _contenders(run_dir, n, stale_s, hold_s, env):
    """``n`` processes that try to take ``run_dir``'s lease at the same instant."""
    procs = [subprocess.Popen([sys.executable, "-c", _CONTEND, str(run_dir), str(stale_s),
                               str(hold_s)], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return procs


def test_racing_starts_without_flock_one_wins_every_time(tmp_path):
    """Two jobs start on one directory at the same instant on a file system without locks:
    every time exactly one holds it. Half the repetitions race on a fresh directory (both
    create the lease), half on a lease left by a dead process (both break it)."""
    env = dict(os.environ, HPCRL_LEASE_NO_FLOCK="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
    for batch in range(4):                     # 5 directories at a time, 20 in all
        runs = {}
        for rep in range(5 * batch, 5 * batch + 5):
            run_dir = tmp_path / f"r{rep}"
            run_dir.mkdir()
            if rep % 2:
                (run_dir / LEASE_NAME).write_text(
                    '{"host": "%s", "pid": %s, "token": "dead", "beat": 4}\n'
                    % (__import__("socket").gethostname(), dead_pid))
            runs[run_dir] = _contenders(run_dir, 2, stale_s=2.0, hold_s=2.0, env=env)
        for run_dir, procs in runs.items():
            outs = [p.communicate(timeout=60) for p in procs]
            assert all(p.returncode == 0 for p in procs), outs
            said = sorted(out.split()[0] for out, _ in outs)
            assert said == ["busy", "held"], (run_dir.name, outs)
            assert not (run_dir / LEASE_NAME).exists()          # the winner released it
            assert not list(run_dir.glob(".hpcrl-lease*"))      # no marker or temp file left


_FROZEN = """
import os, sys, time
from pathlib import Path
from hpcrl.runtime.lease import LeaseLost, RunDirLease
run_dir = Path(sys.argv[1])
lease = RunDirLease.acquire(run_dir, float(sys.argv[2]))
lease.on_lost = lambda: os._exit(4)
print("held", flush=True)
n = 0
while True:
    try:
        lease.check()                     # as before a manifest, a prune, a metrics flush
    except LeaseLost:
        os._exit(4)
    n += 1
    (run_dir / "writes.tmp").write_text(str(n))
    os.replace(run_dir / "writes.tmp", run_dir / "writes")
    time.sleep(0.01)
"""


def test_frozen_holder_is_taken_over_and_stops_when_continued(tmp_path):
    """Without locks, a holder stopped (SIGSTOP) past the stale bound is taken over by a new
    job; continued, it finds the lease is no longer its own at its next check and stops with
    one line, writing nothing more than the write it was already past its check for."""
    env = dict(os.environ, HPCRL_LEASE_NO_FLOCK="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    a = subprocess.Popen([sys.executable, "-c", _FROZEN, str(tmp_path), "1.0"], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert a.stdout.readline().strip() == "held"
        time.sleep(0.3)
        a.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        writes = (tmp_path / "writes").read_text()
        assert int(writes) > 0
        notes = []
        os.environ["HPCRL_LEASE_NO_FLOCK"] = "1"
        try:
            t0 = time.monotonic()
            b = RunDirLease.acquire(tmp_path, 1.0, warn=lambda m, **k: notes.append(m))
            waited = time.monotonic() - t0
        finally:
            del os.environ["HPCRL_LEASE_NO_FLOCK"]
        assert 1.0 <= waited < 5.0, waited                 # watched it for the stale bound
        assert "did not change for run_dir_lease_s = 1 s" in notes[-1]
        a.send_signal(signal.SIGCONT)
        _, err = a.communicate(timeout=10)
        assert a.returncode == 4
        # A write whose check passed before SIGSTOP may land after SIGCONT (the check-then-
        # write window of one loop turn); nothing after the next check may.
        assert int((tmp_path / "writes").read_text()) in (int(writes), int(writes) + 1)
        b.check()                                              # b still holds it
        assert read_lease(tmp_path)["token"] == b.me["token"]
        b.release()
        assert not list(tmp_path.glob(".hpcrl-lease*"))       # A's beat file neither
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert err.count("no longer holds it") == 1, err


def test_a_beat_in_flight_at_a_take_over_leaves_the_successors_lease(tmp_path, monkeypatch):
    """Without locks, A's heartbeat thread stops (as under SIGSTOP) after its check that the
    lease is its own and before its beat's write; B watches A's beat stand still and takes
    over. When A's write lands, B still holds the lease (the beat goes to A's own file, never
    over the lease file), and A finds at its next beat that it lost the lease."""
    monkeypatch.setenv("HPCRL_LEASE_NO_FLOCK", "1")
    a = RunDirLease.acquire(tmp_path, 0.5)                  # beats every 0.05 s
    lost = []
    a.on_lost = lambda: lost.append(a.lost)
    paused, go = threading.Event(), threading.Event()
    checked = a._taken_over

    def check_then_freeze():
        why = checked()
        if why is None and not paused.is_set():
            paused.set()
            go.wait(30)
        return why

    a._taken_over = check_then_freeze
    a_beat = tmp_path / f".hpcrl-lease.beat-{a.me['token']}.json"
    try:
        assert paused.wait(5)
        b = RunDirLease.acquire(tmp_path, 0.5, warn=lambda *_a, **_k: None)
        assert read_lease(tmp_path)["token"] == b.me["token"]
        assert not a_beat.exists()                          # removed by B's take-over
    finally:
        go.set()
    deadline = time.monotonic() + 5
    while not lost:
        assert time.monotonic() < deadline, "A did not notice the take-over"
        time.sleep(0.02)
    assert "taken over" in lost[0]
    time.sleep(0.2)                                         # B beats a few times
    b.check()                                               # B still holds it
    assert read_lease(tmp_path)["token"] == b.me["token"]
    assert read_lease(tmp_path)["beat"] >= 2
    assert a_beat.exists()                                  # A's in-flight beat landed there
    b.release()                                             # sweeps A's stray beat file too
    assert not list(tmp_path.glob(".hpcrl-lease*"))
    a.release()                                             # a lost lease: nothing to remove


def test_beats_go_to_the_holders_own_file(tmp_path):
    """The lease file stays as created; the beat file named by the token carries the beat."""
    lease = RunDirLease.acquire(tmp_path, 0.5)
    created = (tmp_path / LEASE_NAME).read_bytes()
    time.sleep(0.3)
    assert (tmp_path / LEASE_NAME).read_bytes() == created
    beat = __import__("json").loads(
        (tmp_path / f".hpcrl-lease.beat-{lease.me['token']}.json").read_text())
    assert beat["token"] == lease.me["token"] and beat["beat"] >= 2
    assert read_lease(tmp_path)["beat"] == beat["beat"]
    lease.release()
    assert not list(tmp_path.glob(".hpcrl-lease*"))


def test_requeue_gets_through_while_the_old_lock_is_still_held(tmp_path, monkeypatch):
    """The previous start of this SLURM job (restart count 0) is frozen and still holds its
    lock (a failed node whose lock the lock manager has not released yet): a second start of
    the same allocation is refused at once, the requeue (restart count 1) takes over after
    three of the old heartbeat periods."""
    env = dict(os.environ, SLURM_JOB_ID="555", SLURM_RESTART_COUNT="0",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    a = subprocess.Popen([sys.executable, "-c", _HOLD.replace("300.0", "2.0"), str(tmp_path)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert a.stdout.readline().strip() == "held"
        monkeypatch.setenv("SLURM_JOB_ID", "555")
        monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
        with pytest.raises(RunDirBusy, match="in use by job 555"):
            RunDirLease.acquire(tmp_path, 2.0)            # another step, same incarnation
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        with pytest.raises(RunDirBusy):                   # the old start still beats
            RunDirLease.acquire(tmp_path, 2.0, warn=lambda *a, **k: None)
        a.send_signal(signal.SIGSTOP)
        notes = []
        t0 = time.monotonic()
        b = RunDirLease.acquire(tmp_path, 2.0, warn=lambda m, **k: notes.append(m))
        waited = time.monotonic() - t0
        assert 0.6 <= waited < 3.0, waited                # 3 periods of 0.2 s, not 2 s
        assert "previous start (restart 0) stopped beating" in notes[-1]
        assert read_lease(tmp_path)["slurm_restart"] == 1
        b.release()
    finally:
        a.kill()
        a.wait()


def test_requeue_retries_a_busy_directory_until_it_is_free(tmp_path, monkeypatch):
    holder_proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD.replace("time.sleep(60)", "time.sleep(2); lease.release()"),
         str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder_proc.stdout.readline().strip() == "held"
        notes = []
        lease = RunDirLease.acquire(tmp_path, 300.0, retry_s=30.0,
                                    warn=lambda m, **k: notes.append(m))
        assert any("trying again in" in n for n in notes)
        assert read_lease(tmp_path)["pid"] == os.getpid()
        lease.release()
    finally:
        holder_proc.kill()
        holder_proc.wait()


def test_release_leaves_a_successors_lease(tmp_path):
    lease = RunDirLease.acquire(tmp_path, 300.0)
    other = dict(read_lease(tmp_path), token="successor", pid=1)
    (tmp_path / LEASE_NAME).write_text(__import__("json").dumps(other))
    with pytest.raises(LeaseLost, match="taken over"):
        lease.check()
    lease.release()
    assert read_lease(tmp_path)["token"] == "successor"


def test_a_lease_lost_to_a_read_error_is_still_removed_at_the_end(tmp_path, monkeypatch):
    """A check that cannot read the lease file (ESTALE once) stops the job, but the file
    still names it: its end removes it, so the next start need not wait for it to go stale."""
    lease = RunDirLease.acquire(tmp_path, 300.0)
    real = lease_mod.read_lease

    def stale_handle(_run_dir):
        raise OSError(116, "Stale file handle")

    monkeypatch.setattr(lease_mod, "read_lease", stale_handle)
    with pytest.raises(LeaseLost, match="cannot be read"):
        lease.check()
    monkeypatch.setattr(lease_mod, "read_lease", real)
    lease.release()
    assert not list(tmp_path.glob(".hpcrl-lease*"))


def test_only_a_missing_lease_file_means_no_holder(tmp_path):
    (tmp_path / LEASE_NAME).mkdir()                   # unreadable, not absent
    with pytest.raises(OSError):
        read_lease(tmp_path)
    with pytest.raises(OSError):
        RunDirLease.acquire(tmp_path, 300.0)
    (tmp_path / LEASE_NAME).rmdir()
    (tmp_path / LEASE_NAME).write_text("{not json")
    assert read_lease(tmp_path)["corrupt"] is True


def test_a_heartbeat_that_cannot_be_written_loses_the_lease(tmp_path, monkeypatch):
    """Past half the stale bound without a written beat, others may take the directory over:
    the holder gives it up and says why."""
    lease = RunDirLease.acquire(tmp_path, 0.4)            # beats every 0.04 s
    lost = []
    lease.on_lost = lambda: lost.append(lease.lost)

    def full(*_a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lease_mod, "_write_json", full)
    deadline = time.monotonic() + 5
    while not lost:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert "could not be written" in lost[0] and "No space left" in lost[0]
    with pytest.raises(LeaseLost):
        lease.check()
    lease.release()


def test_a_lost_lease_is_announced_once_by_whichever_thread_sees_it_first(tmp_path, capfd):
    """The heartbeat thread and the main thread's checks race to find a take-over: one error
    line in all, and ``on_lost`` (the abort) only when the heartbeat thread saw it first."""
    for _ in range(5):
        lease = RunDirLease.acquire(tmp_path, 0.2)            # beats every 0.02 s
        calls = []
        lease.on_lost = lambda: calls.append(1)
        other = dict(read_lease(tmp_path), token="successor", pid=1)
        (tmp_path / LEASE_NAME).write_text(__import__("json").dumps(other))
        raised = 0
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            try:
                lease.check()
            except LeaseLost:
                raised += 1
        lease.release()
        err = capfd.readouterr().err
        assert err.count("no longer holds it") == 1, err
        assert raised > 0 and len(calls) <= 1
        (tmp_path / LEASE_NAME).unlink()


@pytest.mark.mpi
def test_frozen_job_taken_over_on_a_file_system_without_locks(tmp_path):
    """Real jobs, flock switched off: job A is frozen (SIGSTOP) past run_dir_lease_s; job B
    watches A's lease, takes it over and resumes A's checkpoint. A, continued, exits 4 with one
    line on rank 0 and writes nothing more; B carries the run on and checkpoints it."""
    run_dir = tmp_path / "r"
    cmd, env = _job(run_dir, "--set", "total_frames=100000000", "--set",
                    "checkpoint_every_min=0.02", "--set", "run_dir_lease_s=2")
    env["HPCRL_LEASE_NO_FLOCK"] = "1"
    with open(tmp_path / "a.log", "w") as log:
        a = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    b = None
    try:
        deadline = time.monotonic() + 90
        while not list(run_dir.glob("checkpoints/gen-*/MANIFEST.json")):
            assert a.poll() is None and time.monotonic() < deadline, "job A did not checkpoint"
            time.sleep(0.2)
        signal_tree(a.pid, signal.SIGSTOP)
        a_token = read_lease(run_dir)["token"]
        with open(tmp_path / "b.log", "w") as log:
            b = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while (read_lease(run_dir) or {"token": a_token})["token"] == a_token:
            # between B's unlink of the stale lease and its create there is no lease file
            assert b.poll() is None and time.monotonic() < deadline + 60, "B did not take over"
            time.sleep(0.1)
        b_gen = None
        while b_gen is None:                  # B resumed and wrote a generation of its own
            assert b.poll() is None and time.monotonic() < deadline + 120
            text = (tmp_path / "b.log").read_text()
            if "resuming from checkpoint generation" in text and "checkpoint generation" in \
                    text.split("resuming from checkpoint generation", 1)[1]:
                b_gen = True
            time.sleep(0.2)
        signal_tree(a.pid, signal.SIGCONT)
        assert a.wait(timeout=30) == 4
        a_log = (tmp_path / "a.log").read_text()
        assert a_log.count("no longer holds it") == 1, a_log
        assert b.poll() is None                          # B goes on
        time.sleep(2.0)
        b.send_signal(stop_signal())                     # the launcher forwards it to B's ranks
        assert b.wait(timeout=60) == 85
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                signal_tree(p.pid, signal.SIGKILL)
                p.wait()
    b_log = (tmp_path / "b.log").read_text()
    assert "its heartbeat did not change for run_dir_lease_s = 2 s" in b_log, b_log
    assert not (run_dir / LEASE_NAME).exists()
    from hpcrl.io.checkpoint import latest_complete
    from hpcrl.io.metrics import read_metrics

    assert latest_complete(run_dir / "checkpoints") is not None
    read_metrics(run_dir / "metrics.h5")
