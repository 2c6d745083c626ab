"""The node memory guard (hpcrl.runtime.node_guard): the node's headroom from /proc/meminfo
and the cgroup files, the rank it names, when each rank aborts, and a real job whose ranks
stay under their own bounds but run the node short."""

import os
import subprocess
import sys

import pytest

from hpcrl.runtime import node_guard
from hpcrl.runtime.node_guard import FOLLOW_S, NodeGuard, Peer, culprit, node_headroom
from tests.util import run_mpi

GB = 1e9
MEMINFO = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\n" \
          "MemAvailable:    6000000 kB\n"          # 6,144,000,000 bytes available


def write(root, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_headroom_counts_inactive_page_cache_as_free():
    # 8 GB limit, 6 GB charged of which 1 GB is inactive file cache: 3 GB before the OOM killer.
    assert node_guard.cgroup_headroom(8e9, 6e9, 1e9) == 3e9


def test_the_rank_s_cgroups_are_read_from_proc_self_cgroup_innermost_first(tmp_path):
    v1 = "5:devices:/\n4:memory:/slurm/uid_0/job_7/step_0\n0::/\n"
    (tmp_path / "v1").write_text(v1)
    root = tmp_path / "cg"
    assert node_guard.cgroup_dirs(root, tmp_path / "v1") == [
        (root / "memory/slurm/uid_0/job_7/step_0", False), (root / "memory/slurm/uid_0/job_7", False),
        (root / "memory/slurm/uid_0", False), (root / "memory/slurm", False), (root / "memory", False)]
    (tmp_path / "v2").write_text("0::/system.slice/job_7\n")
    assert node_guard.cgroup_dirs(root, tmp_path / "v2") == [
        (root / "system.slice/job_7", True), (root / "system.slice", True), (root, True)]
    assert node_guard.cgroup_dirs(root, tmp_path / "missing") == []


@pytest.mark.parametrize("files, expected", [
    ({}, (6_144_000_000.0, "MemAvailable")),                              # no cgroup files
    ({"job/memory.max": "max\n", "job/memory.current": "100\n",          # v2, no limit
      "memory.max": "max\n", "memory.current": "100\n"}, (6_144_000_000.0, "MemAvailable")),
    ({"job/memory.max": "4000000000\n", "job/memory.current": "3000000000\n",  # 4 - 3 + 0.5
      "job/memory.stat": "anon 2000000000\ninactive_file 500000000\n"},
     (1.5e9, "the cgroup job's limit")),
    ({"job/memory.max": "4000000000\n", "job/memory.current": "1000000000\n",  # 3 GB, but
      "memory.max": "2000000000\n", "memory.current": "1500000000\n"},         # above: 0.5
     (0.5e9, "the cgroup cg's limit")),
])
def test_node_headroom_is_the_smallest_of_memavailable_and_the_cgroups(tmp_path, files, expected):
    write(tmp_path / "cg", files)
    (tmp_path / "meminfo").write_text(MEMINFO)
    cgroups = [(tmp_path / "cg/job", True), (tmp_path / "cg", True)]
    assert node_headroom(cgroups, tmp_path / "meminfo") == pytest.approx(expected)


def test_node_headroom_reads_cgroup_v1_files(tmp_path):
    write(tmp_path / "memory/job", {"memory.limit_in_bytes": "5000000000\n",   # 5 - 4.5 + 0.7
                                    "memory.usage_in_bytes": "4500000000\n",
                                    "memory.stat": "inactive_file 1\ntotal_inactive_file 700000000\n"})
    write(tmp_path / "memory", {"memory.limit_in_bytes": "9223372036854771712\n",   # no limit
                                "memory.usage_in_bytes": "100\n"})
    (tmp_path / "meminfo").write_text(MEMINFO)
    cgroups = [(tmp_path / "memory/job", False), (tmp_path / "memory", False)]
    assert node_headroom(cgroups, tmp_path / "meminfo") == pytest.approx(
        (1.2e9, "the cgroup job's limit"))


def test_node_headroom_on_this_machine_is_below_its_memory():
    room, where = node_headroom()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < room < total and where in ("MemAvailable", "the cgroup's limit")


def test_the_culprit_is_the_rank_most_above_its_estimate_not_the_largest():
    peers = [Peer(0, "ps", 1, 0.2 * GB), Peer(1, "actor-learner", 2, 3.0 * GB),
             Peer(2, "actor-learner", 3, 0.3 * GB), Peer(3, "actor-learner", 4, 0.3 * GB)]
    held = {0: 0.3 * GB, 1: 3.2 * GB, 2: 1.4 * GB}      # rank 3's memory could not be read
    assert culprit(held, peers) == 2                    # +1.1 GB, against +0.2 and +0.1
    assert culprit({}, peers) is None
    assert culprit({0: 0.1 * GB, 1: 2.0 * GB}, peers) is None      # none above its estimate
    assert node_guard.table(held, peers) == "0 0.30, 1 3.20, 2 1.40"


@pytest.fixture
def holder():
    """Another process holding 300 MB of anonymous memory, as a grown peer rank does."""
    proc = subprocess.Popen([sys.executable, "-c", "import numpy, sys, time; "
                             "a = numpy.ones(300_000_000, dtype=numpy.uint8); "
                             "print('ready', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc.pid
    proc.kill()
    proc.wait()


def test_the_culprit_aborts_at_its_second_reading_and_the_others_after_follow_s(holder):
    me = os.getpid()
    mine = node_guard.anonymous_resident_bytes(me)
    short = lambda: (0.5 * GB, "MemAvailable")             # noqa: E731 - below a 1 GB floor
    roomy = lambda: (2.0 * GB, "MemAvailable")             # noqa: E731
    # The holder is 300 MB above an estimate of 0; this process is below its estimate.
    peers = [Peer(0, "ps", me, mine + GB), Peer(1, "actor-learner", holder, 0.0)]
    assert NodeGuard(1, GB, peers, roomy).check(0.0) is None
    holders = NodeGuard(1, GB, peers, short)
    assert holders.check(0.0) is None                     # one reading is not a trend
    message, is_culprit = holders.check(1.0)
    assert is_culprit
    assert message.startswith("hpcrl: node memory guard: host ")
    assert "has 0.50 GB of memory left (MemAvailable), under memory_floor_gb = 1;" in message
    assert "the most above its estimate is rank 1 (actor-learner) with 0.3" in message
    follower = NodeGuard(0, GB, peers, short)             # this process's view
    assert follower.check(100.0) is None
    assert follower.check(100.0 + FOLLOW_S - 0.5) is None
    message, is_culprit = follower.check(100.0 + FOLLOW_S)
    assert not is_culprit and "rank 1 (actor-learner)" in message
    follower.headroom = roomy                             # memory came back:
    assert follower.check(200.0) is None                  # the clock restarts
    follower.headroom = short
    assert follower.check(201.0) is None


def test_memory_held_outside_the_job_aborts_after_follow_s_and_says_so():
    me = os.getpid()
    peers = [Peer(0, "ps", me, node_guard.anonymous_resident_bytes(me) + GB)]
    guard = NodeGuard(0, GB, peers, lambda: (0.5 * GB, "MemAvailable"))
    assert guard.check(0.0) is None and guard.check(1.0) is None
    message, is_culprit = guard.check(FOLLOW_S)
    assert not is_culprit
    assert "none is above its estimate: the memory is held outside the job" in message


@pytest.mark.mpi
def test_ranks_under_their_own_bounds_that_run_the_node_short_are_stopped(tmp_path):
    """Rank 3 takes 3 GB after start-up, well under its own bound (estimate + 10 GB), as each
    of many ranks that grow together does; the node's floor is set 2.5 GB below what the
    machine has free before the job starts, so the node stays above it with the job's ranks at
    rest (0.6 GB here) and goes below it as rank 3 grows. Rank 3 names itself (as it fills its
    array: its figure is under 3 GB) with the array that holds the memory, and the job ends within seconds. The same job without the growth
    finishes under the same floor."""
    free = node_headroom()[0]
    sets = ["--set", "memory_guard_gb=10", "--set", "final_eval_episodes=0",
            "--set", f"memory_floor_gb={(free - 2.5 * GB) / GB:.3f}"]
    cmd = ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml"]
    proc, wall = run_mpi(4, [*cmd, "--set", f"run_dir={tmp_path}/r",
                             "--set", "total_frames=10000000", *sets],
                         env={"HPCRL_GROW_RANK": "3:3"}, timeout=90)
    assert proc.returncode != 0
    first = [ln for ln in proc.stderr.splitlines() if "hpcrl: node memory guard:" in ln][0]
    assert "this job's 4 ranks there hold" in first, first
    assert "the most above its estimate is rank 3 (actor-learner) with " in first, first
    assert "Largest arrays and tensors of rank 3:" in proc.stderr
    assert "ndarray uint8 (3000000000,)" in proc.stderr
    assert "hpcrl: memory guard: rank" not in proc.stderr          # not the per-rank guard
    assert wall < 40
    proc, _ = run_mpi(4, [*cmd, "--set", f"run_dir={tmp_path}/ok", "--set", "total_frames=20000",
                          *sets], timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "memory guard" not in proc.stderr


def test_an_error_inside_the_node_guard_turns_it_off_not_the_watchdog(capsys):
    from hpcrl.runtime.watchdog import Watchdog

    def broken():
        raise OSError("injected: /proc/meminfo unreadable")

    dog = Watchdog(3600.0, 5, "actor-learner", abort=lambda: None)
    dog.node_guard = NodeGuard(5, GB, [], broken)
    assert dog._check_node() is None
    assert dog.node_guard is None and dog._thread.is_alive()
    err = capsys.readouterr().err
    assert "hpcrl: warning: rank 5: node memory guard off after an error" in err
    assert "injected: /proc/meminfo unreadable" in err
