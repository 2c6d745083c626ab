"""The run's metrics file, `<run_dir>/metrics.h5`: one writer, readable while the job runs.

One rank (the one that gathers episode and training statistics) owns a `MetricsWriter`; every
other process, including `python -m hpcrl.analyze` on a login node while the job runs, reads
through `read_metrics`. The PyPI h5py wheel has no parallel HDF5, so there is exactly one writer
per file, and the file is kept readable during the run with HDF5 single-writer/multiple-reader
(SWMR) mode.

Schema (other modules and the analysis depend on it):

    /                      attrs: algo, game, seed, config (resolved TOML text), hpcrl_version,
                                  schema_version, created_unix, started_unix, num_starts
    /episodes/<column>     1-D, one row per finished training episode (COLUMNS["episodes"])
    /eval/<column>         1-D, one row per periodic evaluation episode (same columns)
    /final/<column>        1-D, one row per episode of the final evaluation of the final
                           weights (same columns; schema 2; empty until the run ends)
    /train/<column>        1-D, one row per progress report, counters cumulative, and the
                           network's health since the previous report (schema 3)
    /status/state          scalar S16: running | finished | failed | preempted
    /status/heartbeat_unix scalar float64: time.time() at the last flush
    /status/committed_rows int64[4]: rows of (episodes, eval, train, final) that are complete

Schema 1 files (no `final` group, three row counts) read with an empty `final` group, schema
1 and 2 files without the health columns of `train` with those columns NaN; a resume rewrites
them as schema 3.

Why the status lives in datasets, not attributes: HDF5's SWMR documentation lists creating or
modifying attributes among the operations a SWMR writer may not do (readers get no consistency
guarantee for object-header changes). HDF5 2.0.0 as shipped in h5py 3.16 does not refuse it
(measured here), so nothing would catch the mistake; writing into an existing fixed-size dataset
is allowed, so status, heartbeat and row counts are tiny datasets. Attributes are written only
while the file is not yet in SWMR mode (at creation and at every resume).

Why `committed_rows`: a flush resizes and writes one column after the other. A reader that opens
the file between two column writes could see a resized column whose new rows are still fill
values. The writer therefore writes all columns, flushes, and only then raises
`committed_rows` and flushes again; readers cut every column to `committed_rows`, so they see
whole rows only, on a live file and on a crashed one.

Why every (re)open writes a new file: an HDF5 file whose SWMR writer died (SIGKILL, node failure)
keeps its "open for write" consistency flag; it can still be read in SWMR mode, but it cannot be
reopened for writing without the `h5clear` tool, which h5py does not expose. A SWMR reader that
holds the file open also blocks a writer's `r+` open (measured: `BlockingIOError`, errno 11).
So a resume reads the old file (SWMR read works after a crash), writes a complete new file to
`metrics.h5.tmp`, switches it to SWMR mode, and `os.replace`s it over the old one: the path
always holds a complete file, and readers holding the old inode do not block the writer.
To inspect a crashed run's file with `h5dump`, run `h5clear -s metrics.h5` first, or read it with
`read_metrics`.

Reading: `read_metrics` opens a cleanly closed file in plain read mode and a live or crashed one
in SWMR-read mode, with HDF5's metadata read attempts cut from 100 to 12: with the default, one
read of a corrupt crashed file took more than a minute here (checksum retries with back-off).
A lock held by another process is retried for about 2.5 s. Any failure is a `MetricsError`
naming the file.

Measured here (2 shared cores, local disk): `flush()` with new rows in all three groups about
4 ms, a heartbeat-only `flush()` 0.3 ms, `read_metrics` of a 200 KB live file about 7 ms.

On network filesystems without working `flock` (some NFS / Lustre mounts), set
`HDF5_USE_FILE_LOCKING=FALSE` for writer and readers.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import os
import time
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from hpcrl.io.files import check_space, fsync_dir, h5_os_error

SCHEMA_VERSION = 3

_EPISODE_COLUMNS = {
    "frames": np.int64,  # global env frames at the end of the episode
    "return": np.float64,  # undiscounted, unclipped episode return
    "length": np.int64,  # env frames in the episode
    "rank": np.int32,  # MPI rank that played the episode
    "wall_time": np.float64,  # seconds since the run started (summed over restarts)
}

COLUMNS: dict[str, dict[str, type]] = {
    "episodes": dict(_EPISODE_COLUMNS),
    "eval": dict(_EPISODE_COLUMNS),
    "final": dict(_EPISODE_COLUMNS),
    "train": {
        "frames": np.int64,  # global env frames at the report
        "updates": np.int64,  # cumulative parameter updates applied
        "loss": np.float64,  # mean loss since the previous report
        "dropped_stale": np.int64,  # cumulative gradients dropped as too stale (Gorila)
        "dropped_outlier": np.int64,  # cumulative gradients dropped as loss outliers (Gorila)
        "dropped_nonfinite": np.int64,  # cumulative gradients dropped as NaN/inf
        "frames_per_second": np.float64,  # env frames per second since the previous report
        "wall_time": np.float64,  # seconds since the run started (summed over restarts)
        # network health since the previous report (schema 3; NaN in older files and where a
        # figure does not apply):
        "grad_norm": np.float64,  # mean global gradient norm before clipping
        "clipped_fraction": np.float64,  # share of gradients clipped (grad_clip_norm)
        "entropy": np.float64,  # A3C: mean policy entropy per agent step, nats
        "max_q": np.float64,  # value methods: mean max_a Q(s, a) over the learners' states
        # at the report, from the ps ranks' optimiser statistics (as hpcrl.diagnose):
        "dead_units": np.float64,  # the worst layer's share of units without a gradient
        "dead_params": np.float64,  # share of all parameters without a gradient
    },
}
#: columns a file of an older schema may lack: read as NaN
_ADDED_COLUMNS = {"train": ("grad_norm", "clipped_fraction", "entropy", "max_q", "dead_units",
                            "dead_params")}
GROUPS: tuple[str, ...] = ("episodes", "eval", "train", "final")
STATUSES: tuple[str, ...] = ("running", "finished", "failed", "preempted")
REQUIRED_ATTRS: tuple[str, ...] = ("algo", "game", "seed", "config")
IDENTITY_ATTRS: tuple[str, ...] = ("algo", "game", "seed")

_CHUNK_ROWS = 1024  # 8 KiB chunks for 8-byte columns: small files for short runs
_AUTO_FLUSH_ROWS = 100_000  # bound the writer's memory if the caller forgets to flush
_LOCK_RETRIES = 20
_LOCK_SLEEP_S = 0.05
_READ_RETRIES = 3
_SWMR_READ_ATTEMPTS = 12  # HDF5 default for SWMR readers: 100 (minutes on a damaged file)


class MetricsError(Exception):
    """A metrics file is missing, unreadable, truncated, or does not follow the schema."""


def _empty_columns(group: str) -> dict[str, np.ndarray]:
    return {name: np.zeros(0, dtype) for name, dtype in COLUMNS[group].items()}


def _as_python(value: Any) -> Any:
    """HDF5 attribute value -> plain Python (str / int / float / list)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _is_lock_error(exc: OSError) -> bool:
    # h5py raises BlockingIOError (errno 11) with "unable to lock file"; other errors, e.g.
    # "truncated file: ... sblock->base_addr", must not be retried.
    return exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK) or "unable to lock" in str(exc)


@functools.cache
def _hdf5_library() -> ctypes.CDLL | None:
    """The libhdf5 that h5py is linked against (bundled in the wheel, or a system build)."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:  # the copy actually loaded, wherever it lies
            paths = [line.split()[-1] for line in maps if "/libhdf5" in line]
    except OSError:
        pass
    libs_dir = os.path.join(os.path.dirname(h5py.__file__), os.pardir, "h5py.libs")
    paths += glob.glob(os.path.join(libs_dir, "libhdf5-*.so*"))
    for path in dict.fromkeys(p for p in paths if "hdf5_hl" not in os.path.basename(p)):
        try:
            lib = ctypes.CDLL(path)
            lib.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
            return lib
        except (OSError, AttributeError):
            continue
    return None


def _open_swmr(path: str) -> h5py.File:
    """SWMR-read open with few metadata read attempts (a damaged file fails fast).

    A SWMR reader retries a metadata read whose checksum fails, because the writer may be
    rewriting that block. HDF5's default is 100 attempts with exponential back-off: on a
    truncated file one read took longer than 5 minutes here. h5py does not expose
    `H5Pset_metadata_read_attempts`, so it is called through ctypes on the libhdf5 that h5py
    loaded; a torn read of a live file is then retried by `read_metrics` (it reopens).
    """
    lib = _hdf5_library()
    if lib is None:  # cannot bound the retries: plain h5py (a damaged file may read slowly)
        return h5py.File(path, "r", swmr=True)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)
    if lib.H5Pset_metadata_read_attempts(fapl.id, _SWMR_READ_ATTEMPTS) < 0:
        return h5py.File(path, "r", swmr=True)
    flags = h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ
    return h5py.File(h5py.h5f.open(os.fsencode(path), flags, fapl=fapl))


def _open_once(path: str) -> h5py.File:
    """Plain read of a closed file; SWMR read of a file that is (or was, if it crashed) open.

    A file whose writer closed it opens in plain read mode, with no SWMR retry loops. A file
    held by a SWMR writer, or left by one that died, carries the "open for write" flag in its
    superblock and only opens in SWMR-read mode.
    """
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        if _is_lock_error(exc) or "truncated" in str(exc):
            raise
    return _open_swmr(path)


def _open_for_read(path: str) -> h5py.File:
    """Opens for reading, retrying while another process holds the file's lock.

    The lock is held only while a non-SWMR writer has the file open (the MetricsWriter
    never does on the final path, but other tools might), so a short retry loop (about
    2.5 s in all) rides it out.
    """
    if not os.path.exists(path):
        raise MetricsError(f"{path}: no such metrics file")
    last = None
    for attempt in range(_LOCK_RETRIES):
        try:
            return _open_once(path)
        except OSError as exc:
            if not _is_lock_error(exc):
                raise MetricsError(f"{path}: unreadable metrics file ({exc})") from None
            last = exc                       # `exc` itself is unbound after the except block
            time.sleep(_LOCK_SLEEP_S * (1 + attempt // 5))
    raise MetricsError(f"{path}: locked by another process for too long ({last})") from None


def _read_open_file(f: h5py.File) -> dict[str, Any]:
    attrs = {key: _as_python(f.attrs[key]) for key in f.attrs}
    missing = [key for key in IDENTITY_ATTRS if key not in attrs]
    if missing:
        raise MetricsError(f"missing attributes {missing}")
    # Row counts first: rows below them were complete on disk before the counts were written.
    committed = np.asarray(f["status/committed_rows"][()], dtype=np.int64)
    out: dict[str, Any] = {
        "attrs": attrs,
        "status": _as_python(f["status/state"][()]),
        "heartbeat_unix": float(f["status/heartbeat_unix"][()]),
    }
    for i, group in enumerate(GROUPS):
        if i >= len(committed) or group not in f:     # an older schema without the group
            out[group] = _empty_columns(group)
            continue
        num_rows = committed[i]
        datasets = {name: f[group][name] for name in COLUMNS[group]
                    if name in f[group] or name not in _ADDED_COLUMNS.get(group, ())}
        # A column shorter than committed_rows means a damaged file: cut all to the shortest.
        num_rows = min([int(num_rows)] + [ds.shape[0] for ds in datasets.values()])
        out[group] = {
            name: (np.asarray(datasets[name][:num_rows], dtype=dtype) if name in datasets
                   else np.full(num_rows, np.nan, dtype))
            for name, dtype in COLUMNS[group].items()
        }
    return out


def read_metrics(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a metrics file, complete rows only; safe on a file that is being written.

    Args:
      path: a `metrics.h5` file.

    Returns:
      `{"path", "attrs": {...}, "status": str, "heartbeat_unix": float, "episodes": {column:
      array}, "eval": {...}, "train": {...}, "final": {...}}`; columns as in `COLUMNS`, each group's columns of
      equal length (the rows the writer had committed at its last flush).

    Raises:
      MetricsError: missing, locked for longer than about 2.5 s, truncated, corrupt, or not
        following the schema. Never a raw h5py/OSError traceback.
    """
    path = os.fspath(path)
    error = ""
    for _ in range(_READ_RETRIES):  # a SWMR read can meet a block the writer is rewriting
        f = _open_for_read(path)
        try:
            with f:
                out = _read_open_file(f)
            out["path"] = path
            return out
        except MetricsError as exc:
            raise MetricsError(f"{path}: {exc}") from None
        except (OSError, KeyError, ValueError, TypeError, RuntimeError, AttributeError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, KeyError):  # schema problem: will not heal by retrying
                break
            time.sleep(_LOCK_SLEEP_S)
    raise MetricsError(f"{path}: unreadable metrics file ({error})")


def _chunk_bytes(chunk: Mapping[str, np.ndarray]) -> int:
    return sum(np.asarray(col).nbytes for col in chunk.values())


def _normalise_columns(group: str, columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Checks names and lengths; scalars are repeated over the rows (one row if all are).
    The health columns of ``train`` may be left out (NaN: not measured).

    `return_` is accepted for `return`, which Python cannot take as a keyword argument.
    """
    if group not in COLUMNS:
        raise ValueError(f"unknown metrics group {group!r}; expected one of {GROUPS}")
    columns = {("return" if k == "return_" else k): v for k, v in columns.items()}
    expected = COLUMNS[group]
    unknown = sorted(set(columns) - set(expected))
    if unknown:
        raise ValueError(
            f"unknown columns {unknown} for group {group!r}; expected {list(expected)}")
    optional = {"wall_time", *_ADDED_COLUMNS.get(group, ())}
    missing = sorted(set(expected) - set(columns) - optional)
    if missing:
        raise ValueError(f"missing columns {missing} for group {group!r}")
    columns.update({k: np.nan for k in _ADDED_COLUMNS.get(group, ()) if k not in columns})
    arrays = {k: np.asarray(v) for k, v in columns.items()}
    shapes = {k: a.shape for k, a in arrays.items()}
    lengths = {a.shape[0] for a in arrays.values() if a.ndim == 1}
    if any(a.ndim > 1 for a in arrays.values()) or len(lengths) > 1:
        raise ValueError(f"columns of {group!r} must be scalars or 1-D of one length, got {shapes}")
    n = lengths.pop() if lengths else 1
    return {k: np.broadcast_to(a, (n,)).astype(expected[k]) for k, a in arrays.items()}


class MetricsWriter:
    """The single writer of `metrics.h5` (see the module docstring for the schema).

    Call order:

        writer = MetricsWriter(run_dir / "metrics.h5", attrs, resume=restored)
        if restored:
            writer.rollback(checkpoint_frames)   # drop rows written after the checkpoint
        while training:
            writer.append("episodes", frames=f, **{"return": g}, length=n, rank=r)
            writer.append("train", frames=f, updates=u, loss=l, ...)
            writer.flush()                        # every few seconds; also the heartbeat
            ...                                   # flush() before writing a checkpoint
        writer.close("finished")                  # or "failed" / "preempted"

    `wall_time` may be omitted from `append`; it is then filled with `wall_time_s()`.
    Appended rows are buffered in memory and reach the file at `flush()`; `flush()` must
    precede every checkpoint, so that all episodes with frames <= the checkpoint's frames are
    on disk when `rollback` runs after a resume (no missing, no duplicate episodes).
    """

    def __init__(self, path: str | os.PathLike, attrs: Mapping[str, Any], resume: bool = False):
        """Creates (or, with `resume`, reopens) the file and marks the run `running`.

        Args:
          path: the `metrics.h5` path; its directory must exist.
          attrs: file attributes; must hold `algo`, `game`, `seed`, `config`;
            `hpcrl_version` defaults to the installed package version. Extra scalar or
            string attributes are stored too.
          resume: keep the rows of an existing file at `path` (a missing file starts empty).
            Without it an existing file is replaced.

        Raises:
          ValueError: a required attribute is missing.
          MetricsError: on resume, the old file is unreadable or belongs to another
            algo/game/seed.
        """
        self.path = os.fspath(path)
        missing = [key for key in REQUIRED_ATTRS if key not in attrs]
        if missing:
            raise ValueError(f"MetricsWriter attrs lack {missing}")
        self._attrs = dict(attrs)
        if "hpcrl_version" not in self._attrs:
            from hpcrl.version import __version__

            self._attrs["hpcrl_version"] = __version__
        data = {group: _empty_columns(group) for group in GROUPS}
        created_unix, num_starts = time.time(), 1
        if resume and os.path.exists(self.path):
            old = read_metrics(self.path)
            for key in IDENTITY_ATTRS:
                if str(old["attrs"].get(key)) != str(self._attrs[key]):
                    raise MetricsError(
                        f"{self.path}: resuming {key}={self._attrs[key]!r} into a file of "
                        f"{key}={old['attrs'].get(key)!r}"
                    )
            data = {group: old[group] for group in GROUPS}
            created_unix = float(old["attrs"].get("created_unix", created_unix))
            num_starts = int(old["attrs"].get("num_starts", 0)) + 1
        self._attrs.update(
            schema_version=SCHEMA_VERSION,
            created_unix=created_unix,
            started_unix=time.time(),
            num_starts=num_starts,
        )
        self._status = "running"
        self._buffers: dict[str, list[dict[str, np.ndarray]]] = {g: [] for g in GROUPS}
        #: the error of a write that failed inside HDF5, after which the library's state is
        #: undefined (seen: a retry that "succeeded" and wrote zeros, crashes at a later close)
        #: and this writer touches the file no more
        self.broken: OSError | None = None
        self._committed = np.zeros(len(GROUPS), np.int64)
        self._file: h5py.File | None = None
        self._write_new_file(data)

    # -- file (re)creation -------------------------------------------------------------------

    def _create_file(self, tmp: str, data: Mapping[str, Mapping[str, np.ndarray]]) -> h5py.File:
        """The new file at `tmp`, in SWMR mode and fsynced (closed again if that fails)."""
        f = h5py.File(tmp, "w", libver="latest")
        try:
            for key, value in self._attrs.items():
                f.attrs[key] = value
            for group in GROUPS:
                g = f.create_group(group)
                for name, dtype in COLUMNS[group].items():
                    g.create_dataset(
                        name,
                        data=np.asarray(data[group][name], dtype),
                        maxshape=(None,),
                        chunks=(_CHUNK_ROWS,),
                    )
            status = f.create_group("status")
            status.create_dataset("state", data=np.bytes_(self._status), dtype="S16")
            status.create_dataset("heartbeat_unix", data=np.float64(time.time()))
            committed = np.array([len(data[g]["frames"]) for g in GROUPS], np.int64)
            status.create_dataset("committed_rows", data=committed)
            status["committed_rows"].attrs["groups"] = ",".join(GROUPS)
            f.swmr_mode = True  # flushes everything written so far
            os.fsync(f.id.get_vfd_handle())  # durable before it replaces the only history
        except BaseException:
            with contextlib.suppress(Exception):
                f.close()
            raise
        return f

    def _write_new_file(self, data: Mapping[str, Mapping[str, np.ndarray]],
                        wall_now_s: float | None = None) -> None:
        """Writes `data` to `<path>.tmp`, switches it to SWMR, fsyncs it, then replaces `path`
        with it (the old file stays until the new one is durable). `wall_now_s`: the run's
        clock now, kept across the rewrite (default: the newest row's wall time)."""
        tmp = self.path + ".tmp"
        f, error = None, None
        try:
            f = self._create_file(tmp, data)
        except (OSError, RuntimeError) as exc:
            error = h5_os_error(exc)
        if error is not None:                  # raised here: no h5py object outlives it
            with contextlib.suppress(OSError):
                os.unlink(tmp)                 # a full disk: give the space back
            raise error
        os.replace(tmp, self.path)
        # Best effort: the rename is atomic either way, and a file system that refuses a
        # directory fsync must not end a training run over its metrics file.
        with contextlib.suppress(OSError):
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self._file = f
        self._committed = np.array([len(data[g]["frames"]) for g in GROUPS], np.int64)
        # Cached handles: an h5py path lookup costs about as much as the write itself.
        self._datasets = {g: {name: f[g][name] for name in COLUMNS[g]} for g in GROUPS}
        self._status_ds = {name: f["status"][name] for name in f["status"]}
        self._wall_offset_s = wall_now_s if wall_now_s is not None else max(
            [float(np.max(data[g]["wall_time"])) for g in GROUPS if len(data[g]["wall_time"])]
            + [0.0]
        )
        self._wall_start = time.monotonic()

    # -- public API --------------------------------------------------------------------------

    def wall_time_s(self) -> float:
        """Seconds since the run started, summed over restarts (continues the file's clock)."""
        return self._wall_offset_s + (time.monotonic() - self._wall_start)

    def append(self, group: str, **columns: Any) -> None:
        """Buffers one row (scalars) or many rows (1-D arrays of one length; scalars repeat).

        Args:
          group: "episodes", "eval", "train" or "final".
          **columns: every column of `COLUMNS[group]`; `wall_time` is optional. Python
            cannot spell `return=` as a keyword: pass `**{"return": x}` or `return_=x`.
        """
        self._check_open()
        arrays = _normalise_columns(group, columns)
        if "wall_time" not in arrays:
            n = len(next(iter(arrays.values())))
            arrays["wall_time"] = np.full(n, self.wall_time_s(), np.float64)
        self._buffers[group].append(arrays)
        if sum(len(b["frames"]) for b in self._buffers[group]) >= _AUTO_FLUSH_ROWS:
            with contextlib.suppress(OSError):   # kept buffered; the owner's flush reports it
                self.flush()

    def rows(self, group: str) -> int:
        """Rows of `group` appended so far (flushed or still buffered)."""
        buffered = sum(len(b["frames"]) for b in self._buffers[group])
        return int(self._committed[GROUPS.index(group)]) + buffered

    def flush(self) -> None:
        """Writes buffered rows, then commits row counts and the heartbeat (two HDF5 flushes).

        Raises:
            OSError: ENOSPC before anything was written, when the file system has less free
                space than the rows need (statvfs: a full disk): every buffered row is kept,
                and the next flush, once there is space, writes them all once. Or the write
                failed inside HDF5 (a quota, which statvfs does not see; HDF5's RuntimeError
                carries the errno): then the writer is ``broken``, every later flush raises
                at once, and the run must restart to continue the file.
        """
        self._check_open()
        if self.broken is not None:
            raise OSError(self.broken.errno, f"{self.broken.strerror}; metrics.h5 is not "
                                             "written again until the run restarts")
        check_space(os.path.dirname(os.path.abspath(self.path)),
                    2 * sum(_chunk_bytes(c) for g in GROUPS for c in self._buffers[g]),
                    "metrics.h5's new rows")
        error = None
        try:
            self._write_buffered()
        except (OSError, RuntimeError) as exc:
            error = h5_os_error(exc)
        if error is not None:
            # HDF5's state after a failed write is undefined (seen on a full tmpfs: a retry
            # that "succeeded" and left zeros; crashes at a later close): this writer touches
            # the file no more. Raised outside the handler, so that no traceback keeps h5py
            # objects of the failed write alive. The file on disk keeps its committed rows
            # (readers cut every column to them); a resume continues it from its checkpoint.
            self.broken = error
            raise error
        self._buffers = {g: [] for g in GROUPS}

    def _write_buffered(self) -> None:
        f = self._file
        committed = self._committed.copy()
        for i, group in enumerate(GROUPS):
            chunks = self._buffers[group]
            if not chunks:
                continue
            start = int(committed[i])
            stop = start + sum(len(c["frames"]) for c in chunks)
            for name, ds in self._datasets[group].items():
                ds.resize((stop,))
                ds[start:stop] = np.concatenate([c[name] for c in chunks])
            committed[i] = stop
        f.flush()  # column data first ...
        self._status_ds["committed_rows"][...] = committed
        self._status_ds["heartbeat_unix"][()] = time.time()
        f.flush()  # ... then the row counts that make it visible to readers
        self._committed = committed

    def set_status(self, status: str) -> None:
        """Flushes and records the run status (running / finished / failed / preempted)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        self._check_open()
        self._status = status
        if self.broken is None:
            error = None
            try:
                self._status_ds["state"][()] = np.bytes_(status)
            except (OSError, RuntimeError) as exc:
                error = h5_os_error(exc)
            if error is not None:
                self.broken = error
                raise error
        self.flush()

    def rollback(self, frames: int) -> dict[str, dict[str, np.ndarray]]:
        """Keeps only rows with `frames <= frames` in every group (after a resume), and no
        `final` rows at all; returns the kept columns of each group.

        The checkpoint being resumed was taken at `frames` global env frames; rows written
        after it would be played again and duplicated. The final evaluation follows the
        last checkpoint, so a resume from it plays the final evaluation again. Rows are selected by mask, not by
        position, because several ranks' episodes may arrive slightly out of frame order.
        Rewrites the file (see the module docstring): safe while readers hold it open.
        """
        self._check_open()
        self.flush()
        self._file.close()
        self._file = None
        old = read_metrics(self.path)
        kept = {}
        for group in GROUPS:
            keep = old[group]["frames"] <= int(frames)
            if group == "final":
                keep[:] = False
            kept[group] = {name: col[keep] for name, col in old[group].items()}
        self._write_new_file(kept)
        return kept

    def close(self, status: str = "finished") -> None:
        """Flushes, records the final status and closes (OSError if that fails: a writer whose
        write failed inside HDF5 leaves the file to the process's end). A second call does
        nothing."""
        if self._file is None:
            return
        try:
            self.set_status(status)
        finally:
            if self.broken is None:
                with contextlib.suppress(Exception):
                    self._file.close()
            self._datasets, self._status_ds, self._file = {}, {}, None

    def _check_open(self) -> None:
        if self._file is None:
            raise RuntimeError(f"MetricsWriter for {self.path} is closed")

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close("failed" if exc_type is not None else "finished")
