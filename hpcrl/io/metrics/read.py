"""Reading `metrics.h5`, complete rows only, on a closed, live or crashed file (see
:mod:`hpcrl.io.metrics` for why SWMR, the bounded metadata read attempts and the lock retries)."""

from __future__ import annotations

import ctypes
import errno
import functools
import glob
import os
import time
from typing import Any

import h5py
import numpy as np

from hpcrl.io.metrics.schema import (
    _ADDED_COLUMNS, COLUMNS, GROUPS, IDENTITY_ATTRS, MetricsError, _as_python, _empty_columns)

_LOCK_RETRIES = 20
_LOCK_SLEEP_S = 0.05
_READ_RETRIES = 3
_SWMR_READ_ATTEMPTS = 12  # HDF5 default for SWMR readers: 100 (minutes on a damaged file)


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


def _open_once(path: str) -> tuple[h5py.File, bool]:
    """Plain read of a closed file; SWMR read of a file that is (or was, if it crashed) open.

    A file whose writer closed it opens in plain read mode, with no SWMR retry loops. A file
    held by a SWMR writer, or left by one that died, carries the "open for write" flag in its
    superblock and only opens in SWMR-read mode.

    A plain open checks the file's length against the superblock's end-of-file address
    before it checks that flag, so a SWMR-written file can fail it as "truncated": the writer
    records a flush's new end before the chunks that flush allocated reach the disk, and a
    writer that dies there leaves it so. Such a file is opened in SWMR mode, which does not
    check the length (it reads zeros past the end of any file), and the second value,
    True, tells the caller to check that every committed row lies inside the file.
    """
    try:
        return h5py.File(path, "r"), False
    except OSError as exc:
        if _is_lock_error(exc):
            raise
        shorter = "truncated" in str(exc)
    return _open_swmr(path), shorter


def _open_for_read(path: str) -> tuple[h5py.File, bool]:
    """Opens for reading (see `_open_once`), retrying while another process holds the lock;
    any other OSError is raised as it is (`read_metrics` retries it a few times).

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
                raise                        # damaged, or a live file's torn read: the caller's
            last = exc                       # `exc` itself is unbound after the except block
            time.sleep(_LOCK_SLEEP_S * (1 + attempt // 5))
    raise MetricsError(f"{path}: locked by another process for too long ({last})") from None


def _check_rows_inside(ds: h5py.Dataset, num_rows: int, file_size: int) -> None:
    """ValueError unless the bytes of rows [0, num_rows) all lie inside the file.

    Committed rows are on disk before their count is (the writer flushes twice), so a
    committed row past the end of the file means a truncated file, not a live one.
    """
    if ds.chunks is None:                     # contiguous (not written by MetricsWriter)
        extents = [(ds.id.get_offset(), ds.id.get_storage_size())] if num_rows else []
    else:
        rows_per_chunk, filtered = ds.chunks[0], ds.id.get_create_plist().get_nfilters() > 0
        extents = []
        for first_row in range(0, num_rows, rows_per_chunk):
            info = ds.id.get_chunk_info_by_coord((first_row,))
            rows = min(rows_per_chunk, num_rows - first_row)  # a chunk's tail may be unused
            extents.append((info.byte_offset,
                            info.size if filtered else rows * ds.dtype.itemsize))
    for offset, size in extents:
        if offset is None or offset + size > file_size:
            raise ValueError(f"{ds.name}: committed rows past the end of the file "
                             f"({file_size} bytes): the file is truncated")


def _read_open_file(f: h5py.File, check_inside: bool = False) -> dict[str, Any]:
    """The committed rows of an open file; with `check_inside`, each row's chunk is first
    checked to lie inside the file (see `_open_once`)."""
    attrs = {key: _as_python(f.attrs[key]) for key in f.attrs}
    missing = [key for key in IDENTITY_ATTRS if key not in attrs]
    if missing:
        raise MetricsError(f"missing attributes {missing}")
    # Row counts first: rows below them were complete on disk before the counts were written.
    committed = np.asarray(f["status/committed_rows"][()], dtype=np.int64)
    # After the counts, and of the file held open (a resume may have replaced the path's).
    file_size = os.fstat(f.id.get_vfd_handle()).st_size if check_inside else None
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
        if file_size is not None:
            for ds in datasets.values():
                _check_rows_inside(ds, num_rows, file_size)
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
        try:
            f, shorter = _open_for_read(path)
        except OSError as exc:             # a torn open of a live file, or a damaged file
            error = f"{type(exc).__name__}: {exc}"
            time.sleep(_LOCK_SLEEP_S)
            continue
        try:
            with f:
                out = _read_open_file(f, check_inside=shorter)
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
