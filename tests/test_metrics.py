"""Tests of hpcrl.io.metrics: schema round trip, live SWMR reads, crash + resume, rollback, damage."""

import os
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from hpcrl.io.metrics import COLUMNS, GROUPS, MetricsError, MetricsWriter, read_metrics

ATTRS = dict(algo="a3c_ff", game="pong", seed=3, config='algo = "a3c_ff"\n')


def _train_row(frames, updates=0):
    return dict(
        frames=frames,
        updates=updates,
        loss=0.5,
        dropped_stale=1,
        dropped_outlier=2,
        dropped_nonfinite=0,
        frames_per_second=1000.0,
    )


def _run_child(code, *args):
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_round_trip_rows_columns_attrs_status(tmp_path):
    path = tmp_path / "metrics.h5"
    w = MetricsWriter(path, ATTRS, resume=False)
    w.append("episodes", frames=100, return_=-21.0, length=100, rank=1, wall_time=1.5)
    w.append(
        "episodes",
        frames=np.array([200, 300]),
        **{"return": [-20.0, -19.5]},
        length=[100, 100],
        rank=[2, 3],
        wall_time=[2.0, 3.0],
    )
    w.append("eval", frames=300, return_=-18.0, length=400, rank=0, wall_time=3.5)
    w.append("train", **_train_row(300, updates=7), wall_time=3.6)
    assert w.rows("episodes") == 3  # buffered rows count
    assert read_metrics(path)["episodes"]["frames"].size == 0  # ... but are not on disk yet
    w.flush()
    data = read_metrics(path)
    assert data["status"] == "running"
    assert abs(data["heartbeat_unix"] - time.time()) < 60
    assert data["attrs"]["algo"] == "a3c_ff" and data["attrs"]["seed"] == 3
    assert data["attrs"]["config"] == ATTRS["config"]
    assert data["attrs"]["hpcrl_version"]  # filled from the package
    assert data["attrs"]["num_starts"] == 1
    np.testing.assert_array_equal(data["episodes"]["frames"], [100, 200, 300])
    np.testing.assert_array_equal(data["episodes"]["return"], [-21.0, -20.0, -19.5])
    np.testing.assert_array_equal(data["episodes"]["rank"], [1, 2, 3])
    np.testing.assert_array_equal(data["episodes"]["wall_time"], [1.5, 2.0, 3.0])
    np.testing.assert_array_equal(data["eval"]["length"], [400])
    np.testing.assert_array_equal(data["train"]["updates"], [7])
    np.testing.assert_array_equal(data["train"]["dropped_outlier"], [2])
    for group in GROUPS:
        for name, dtype in COLUMNS[group].items():
            assert data[group][name].dtype == np.dtype(dtype), (group, name)
    w.close("finished")
    w.close("failed")  # second close: no effect
    assert read_metrics(path)["status"] == "finished"
    with h5py.File(path, "r") as f:  # a cleanly closed file opens without SWMR too
        assert f["episodes/frames"].shape == (3,)


def test_wall_time_filled_when_omitted(tmp_path):
    w = MetricsWriter(tmp_path / "metrics.h5", ATTRS)
    w.append("episodes", frames=1, return_=0.0, length=1, rank=0)
    time.sleep(0.05)
    w.append("episodes", frames=2, return_=0.0, length=1, rank=0)
    w.close()
    wall = read_metrics(tmp_path / "metrics.h5")["episodes"]["wall_time"]
    assert 0.0 <= wall[0] < wall[1] and wall[1] - wall[0] >= 0.05


def test_bad_input_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="lack"):
        MetricsWriter(tmp_path / "m.h5", dict(algo="x", game="pong", seed=0))
    w = MetricsWriter(tmp_path / "m.h5", ATTRS)
    with pytest.raises(ValueError, match="unknown columns"):
        w.append("episodes", frames=1, return_=0.0, length=1, rank=0, score=3)
    with pytest.raises(ValueError, match="missing columns"):
        w.append("train", frames=1)
    with pytest.raises(ValueError, match="one length"):
        w.append("episodes", frames=[1, 2], return_=[0.0], length=[1, 1], rank=[0, 0])
    with pytest.raises(ValueError, match="unknown metrics group"):
        w.append("losses", frames=1)
    with pytest.raises(ValueError, match="status"):
        w.set_status("done")
    w.close()
    with pytest.raises(RuntimeError, match="closed"):
        w.append("episodes", frames=1, return_=0.0, length=1, rank=0)


WRITER_CHILD = """
    import sys, time
    import numpy as np
    from hpcrl.io.metrics import MetricsWriter
    path, num_flushes = sys.argv[1], int(sys.argv[2])
    w = MetricsWriter(path, dict(algo="gorila", game="breakout", seed=0, config=""))
    print("ready", flush=True)
    for i in range(1, num_flushes + 1):
        for j in range(3):  # 3 episodes per flush; return and length are functions of frames
            f = (3 * (i - 1) + j + 1) * 10
            w.append("episodes", frames=f, return_=0.5 * f, length=f % 97 + 1, rank=f % 4)
        w.append("train", frames=30 * i, updates=i, loss=1.0 / i, dropped_stale=i,
                 dropped_outlier=2 * i, dropped_nonfinite=0, frames_per_second=30.0 * i)
        w.flush()
        time.sleep(0.004)
    w.close("finished")
"""


def _check_snapshot(data):
    ep = data["episodes"]
    n = ep["frames"].size
    assert all(col.size == n for col in ep.values())
    np.testing.assert_array_equal(ep["frames"], np.arange(1, n + 1) * 10)
    np.testing.assert_array_equal(ep["return"], 0.5 * ep["frames"])
    np.testing.assert_array_equal(ep["length"], ep["frames"] % 97 + 1)
    np.testing.assert_array_equal(ep["rank"], ep["frames"] % 4)
    tr = data["train"]
    m = tr["frames"].size
    assert n == 3 * m  # episodes and train rows of one flush become visible together
    np.testing.assert_array_equal(tr["updates"], np.arange(1, m + 1))
    np.testing.assert_array_equal(tr["dropped_outlier"], 2 * np.arange(1, m + 1))
    return n


def test_read_while_another_process_appends(tmp_path):
    path = tmp_path / "metrics.h5"
    num_flushes = 250
    child = _run_child(WRITER_CHILD, path, num_flushes)
    assert child.stdout.readline().strip() == "ready"
    seen = []
    while child.poll() is None:
        data = read_metrics(path)
        n = _check_snapshot(data)
        if data["status"] == "running":
            seen.append(n)
    assert child.wait() == 0, child.stderr.read()
    assert seen == sorted(seen)  # rows only ever grow
    intermediate = {n for n in seen if 0 < n < 3 * num_flushes}
    assert len(intermediate) >= 3, f"reader never saw the file mid-run: {sorted(set(seen))}"
    final = read_metrics(path)
    assert final["status"] == "finished"
    assert _check_snapshot(final) == 3 * num_flushes


CRASH_CHILD = """
    import os, signal, sys
    from hpcrl.io.metrics import MetricsWriter
    w = MetricsWriter(sys.argv[1], dict(algo="gorila", game="breakout", seed=0, config=""))
    for f in (100, 200, 300):
        w.append("episodes", frames=f, return_=float(f), length=10, rank=0)
    w.append("train", frames=300, updates=1, loss=0.1, dropped_stale=0, dropped_outlier=0,
             dropped_nonfinite=0, frames_per_second=1.0)
    w.flush()
    w.append("episodes", frames=400, return_=400.0, length=10, rank=0)  # never flushed
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_crash_then_resume_and_rollback(tmp_path):
    path = tmp_path / "metrics.h5"
    child = _run_child(CRASH_CHILD, path)
    assert child.wait() == -9
    # An HDF5 file whose SWMR writer died cannot be opened for writing (h5clear needed) ...
    with pytest.raises(OSError):
        h5py.File(path, "r+")
    # ... but read_metrics sees the flushed rows, and the run still says "running".
    data = read_metrics(path)
    assert data["status"] == "running"
    np.testing.assert_array_equal(data["episodes"]["frames"], [100, 200, 300])
    # Resume from a checkpoint taken at frame 200: episode 300 will be played again.
    attrs = dict(algo="gorila", game="breakout", seed=0, config="")
    w = MetricsWriter(path, attrs, resume=True)
    assert w.rows("episodes") == 3
    w.rollback(200)
    assert w.rows("episodes") == 2 and w.rows("train") == 0
    w.append("episodes", frames=300, return_=301.0, length=10, rank=1)
    w.close("finished")
    data = read_metrics(path)
    np.testing.assert_array_equal(data["episodes"]["frames"], [100, 200, 300])
    np.testing.assert_array_equal(data["episodes"]["return"], [100.0, 200.0, 301.0])
    assert data["attrs"]["num_starts"] == 2
    assert data["status"] == "finished"
    assert not os.path.exists(str(path) + ".tmp")


def test_a_swmr_file_shorter_than_its_recorded_end_is_read(tmp_path):
    """A SWMR writer records a flush's new end of file before the chunks it allocated reach
    the disk; a reader that comes in between, or finds the file of a writer that died there,
    sees a file shorter than its superblock says. A plain open rejects that as "truncated"
    (it checks the length before the "open for write" flag); the rows are all there."""
    path = tmp_path / "metrics.h5"
    child = _run_child(CRASH_CHILD, path)
    assert child.wait() == -9
    with h5py.File(path, "r", swmr=True) as f:  # where the last chunk holding a row begins
        last_row_at = max(f[group][name].id.get_chunk_info_by_coord((0,)).byte_offset
                          for group in ("episodes", "train") for name in f[group])
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.seek(size - 4096)
        assert fh.read() == bytes(4096)  # the last chunk's unused rows: never written
        fh.truncate(size - 4096)
    with pytest.raises(OSError, match="truncated"):
        h5py.File(path, "r")
    data = read_metrics(path)
    assert data["status"] == "running"
    np.testing.assert_array_equal(data["episodes"]["frames"], [100, 200, 300])
    np.testing.assert_array_equal(data["train"]["updates"], [1])
    with open(path, "r+b") as fh:  # now into a committed row: an error, not zeros
        fh.truncate(last_row_at + 4)
    with pytest.raises(MetricsError, match="committed rows past the end of the file"):
        read_metrics(path)


def test_rollback_masks_every_group_by_frames(tmp_path):
    path = tmp_path / "metrics.h5"
    w = MetricsWriter(path, ATTRS)
    # Episodes from 4 ranks arrive slightly out of frame order.
    w.append("episodes", frames=[10, 30, 20, 40, 25], return_=[1.0, 3.0, 2.0, 4.0, 2.5],
             length=[1, 1, 1, 1, 1], rank=[0, 1, 2, 3, 0], wall_time=[1.0, 2.0, 3.0, 4.0, 5.0])
    w.append("eval", frames=[20, 40], return_=[7.0, 8.0], length=[5, 5], rank=[0, 0],
             wall_time=[3.0, 6.0])
    w.append("train", **_train_row(np.array([10, 25, 40]), np.array([1, 2, 3])),
             wall_time=[1.0, 5.0, 6.0])
    w.rollback(25)  # flushes the buffered rows first
    data = read_metrics(path)
    np.testing.assert_array_equal(data["episodes"]["frames"], [10, 20, 25])
    np.testing.assert_array_equal(data["episodes"]["return"], [1.0, 2.0, 2.5])
    np.testing.assert_array_equal(data["episodes"]["rank"], [0, 2, 0])
    np.testing.assert_array_equal(data["eval"]["return"], [7.0])
    np.testing.assert_array_equal(data["train"]["updates"], [1, 2])
    assert [w.rows(g) for g in GROUPS] == [3, 1, 2, 0]
    assert w.wall_time_s() >= 5.0  # the clock continues from the kept rows
    w.append("episodes", frames=30, return_=3.5, length=1, rank=1)
    w.close()
    np.testing.assert_array_equal(read_metrics(path)["episodes"]["frames"], [10, 20, 25, 30])


def test_resume_refuses_another_run_and_missing_file_starts_empty(tmp_path):
    path = tmp_path / "metrics.h5"
    MetricsWriter(path, ATTRS).close()
    with pytest.raises(MetricsError, match="game"):
        MetricsWriter(path, dict(ATTRS, game="breakout"), resume=True)
    w = MetricsWriter(tmp_path / "other.h5", ATTRS, resume=True)
    assert w.rows("episodes") == 0
    w.close()


HOLDER_CHILD = """
    import sys, time, h5py
    f = h5py.File(sys.argv[1], "r", swmr=True)
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_reader_holding_the_file_does_not_block_resume(tmp_path):
    path = tmp_path / "metrics.h5"
    w = MetricsWriter(path, ATTRS)
    w.append("episodes", frames=10, return_=1.0, length=1, rank=0)
    w.close("preempted")
    holder = _run_child(HOLDER_CHILD, path, 5)
    assert holder.stdout.readline().strip() == "holding"
    try:
        w = MetricsWriter(path, ATTRS, resume=True)
        w.rollback(10)
        w.close()
    finally:
        holder.kill()
        holder.wait()
    assert read_metrics(path)["attrs"]["num_starts"] == 2


LOCKER_CHILD = """
    import sys, time, h5py
    f = h5py.File(sys.argv[1], "r+")  # a non-SWMR writer holds an exclusive lock
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    f.close()
"""


def test_read_retries_on_transient_lock(tmp_path):
    path = tmp_path / "metrics.h5"
    w = MetricsWriter(path, ATTRS)
    w.append("episodes", frames=10, return_=1.0, length=1, rank=0)
    w.close()
    locker = _run_child(LOCKER_CHILD, path, 0.4)
    assert locker.stdout.readline().strip() == "locked"
    with pytest.raises(OSError):  # what a reader without retries gets
        h5py.File(path, "r", swmr=True)
    data = read_metrics(path)  # retries until the lock is gone
    assert locker.wait() == 0
    np.testing.assert_array_equal(data["episodes"]["frames"], [10])


def test_damaged_files_raise_metrics_error(tmp_path):
    path = tmp_path / "metrics.h5"
    w = MetricsWriter(path, ATTRS)
    w.append("episodes", frames=np.arange(1, 2001), return_=np.ones(2000), length=np.ones(2000),
             rank=np.zeros(2000))
    w.close()
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)
    with pytest.raises(MetricsError, match="unreadable") as info:
        read_metrics(path)
    assert str(path) in str(info.value)
    (tmp_path / "garbage.h5").write_bytes(b"not an hdf5 file" * 100)
    with pytest.raises(MetricsError):
        read_metrics(tmp_path / "garbage.h5")
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f.attrs.update(algo="x", game="pong", seed=0)
        f["episodes/frames"] = [1]
    with pytest.raises(MetricsError, match="foreign.h5"):
        read_metrics(tmp_path / "foreign.h5")
    with pytest.raises(MetricsError, match="no such"):
        read_metrics(tmp_path / "missing.h5")
    with pytest.raises(MetricsError):  # resume does not silently discard a damaged run
        MetricsWriter(path, ATTRS, resume=True)


def test_corrupt_file_of_a_crashed_writer_fails_fast(tmp_path):
    """A crashed SWMR file can only be read in SWMR mode, where HDF5 by default retries every
    bad metadata checksum 100 times with back-off: this very file took > 60 s that way."""
    from hpcrl.io.metrics.read import _hdf5_library

    assert _hdf5_library() is not None  # the read-attempt bound is in force
    path = tmp_path / "metrics.h5"
    child = _run_child(CRASH_CHILD, path)
    assert child.wait() == -9
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:  # garbage over everything after the first 4 KiB
        fh.seek(4096)
        fh.write(b"\xab" * (size - 4096))
    start = time.monotonic()
    with pytest.raises(MetricsError, match="unreadable"):
        read_metrics(path)
    assert time.monotonic() - start < 10.0


def test_a_real_full_disk_keeps_rows_until_a_flush_succeeds(tmp_path):
    """metrics.h5 on a 4 MB tmpfs that fills up: the flush raises ENOSPC before HDF5 writes
    anything, every buffered row is kept, and once space is freed one flush writes them all,
    once each."""
    from tests.util import fill_disk, small_tmpfs

    with small_tmpfs(tmp_path / "disk", 4) as disk:
        path = disk / "metrics.h5"
        w = MetricsWriter(path, ATTRS, resume=False)
        w.append("train", **_train_row(1))
        w.flush()
        filler = fill_disk(disk)
        n = 20_000
        frames = np.arange(2, n + 2)
        w.append("episodes", frames=frames, return_=np.full(n, -20.0), length=np.full(n, 9),
                 rank=np.ones(n, np.int32))
        for attempt in range(2):                     # a retry on a still-full disk fails too
            with pytest.raises(OSError) as err:
                w.flush()
            assert err.value.errno == 28 and "MB free" in err.value.strerror, err.value
            assert w.rows("episodes") == n and w.broken is None
        filler.unlink()
        w.append("train", **_train_row(n + 2))
        w.close("finished")
        data = read_metrics(path)
        np.testing.assert_array_equal(data["episodes"]["frames"], frames)
        np.testing.assert_array_equal(data["train"]["frames"], [1, n + 2])
        assert data["status"] == "finished"


_QUOTA_WRITER = """
import sys
import numpy as np
from hpcrl.io.metrics import MetricsWriter, writer
from tests.util import fill_disk
writer.check_space = lambda *a: None          # a quota: statvfs sees free space
path = sys.argv[1]
w = MetricsWriter(path, dict(algo="a3c_ff", game="pong", seed=3, config="x"), resume=False)
w.append("train", frames=1, updates=0, loss=0.5, dropped_stale=1, dropped_outlier=2,
         dropped_nonfinite=0, frames_per_second=1.0)
w.flush()
filler = fill_disk(__import__("pathlib").Path(path).parent)
n = 20000
w.append("episodes", frames=np.arange(2, n + 2), return_=np.zeros(n), length=np.ones(n),
         rank=np.ones(n, np.int32))
for attempt in range(2):
    try:
        w.flush()
    except OSError as exc:
        print(attempt, exc.errno, w.broken is not None, exc.strerror, flush=True)
filler.unlink()
try:
    w.close("finished")
except OSError as exc:
    print("close", exc.errno, flush=True)
"""


def test_a_write_that_fails_inside_hdf5_stops_writing_and_a_resume_continues(tmp_path):
    """A quota (here: a full tmpfs with the statvfs check switched off) fails the write inside
    HDF5: OSError with the errno, the writer touches the file no more (HDF5's state is then
    undefined), and a resume reads the committed rows back and continues the file."""
    import os

    from tests.util import ROOT, small_tmpfs

    with small_tmpfs(tmp_path / "disk", 4) as disk:
        path = disk / "metrics.h5"
        proc = subprocess.run([sys.executable, "-c", _QUOTA_WRITER, str(path)],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        lines = proc.stdout.splitlines()
        assert proc.returncode == 0 and len(lines) == 3, proc.stdout + proc.stderr[-2000:]
        assert lines[0].startswith("0 28 True No space left on device")
        assert lines[1].startswith("1 28 True") and "until the run restarts" in lines[1]
        assert lines[2] == "close 28"
        w = MetricsWriter(path, ATTRS | dict(config="x"), resume=True)
        w.append("train", **_train_row(7))
        w.close("finished")
        data = read_metrics(path)
        np.testing.assert_array_equal(data["train"]["frames"], [1, 7])
        assert data["episodes"]["frames"].size == 0
