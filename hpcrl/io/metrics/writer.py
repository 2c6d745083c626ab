"""The single writer of `metrics.h5` (the schema and the reasons for SWMR, `committed_rows` and
a new file at every open are in :mod:`hpcrl.io.metrics`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from hpcrl.io.files import check_space, fsync_dir, h5_os_error
from hpcrl.io.metrics.read import read_metrics
from hpcrl.io.metrics.schema import (
    _ADDED_COLUMNS, COLUMNS, GROUPS, IDENTITY_ATTRS, REQUIRED_ATTRS, SCHEMA_VERSION, STATUSES,
    MetricsError, _empty_columns)

_CHUNK_ROWS = 1024  # 8 KiB chunks for 8-byte columns: small files for short runs
_AUTO_FLUSH_ROWS = 100_000  # bound the writer's memory if the caller forgets to flush


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

    @property
    def wall_offset_s(self) -> float:
        """The file's clock when this process opened it: 0 for a new run, else the latest
        `wall_time` of the rows kept from earlier starts. Rows timed by another clock that
        started with this process (the workers' episodes) add it to be summed over restarts."""
        return self._wall_offset_s

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
