"""Durable file operations shared by checkpoints, metrics and the run directory."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path


def fsync_dir(directory: str | os.PathLike) -> None:
    """Flush a directory entry to disk, so that a rename inside it survives a crash.

    Raises:
        OSError: the directory cannot be opened or synced (callers decide whether that matters:
            a checkpoint generation is then not written, a metrics flush goes on).
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file, fsync, rename, fsync the
    directory. A crash leaves the old file or the new one, never a mix."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def h5_os_error(exc: Exception) -> OSError:
    """An HDF5 failure as the OSError it is. HDF5 reports a failed write on a real disk (ENOSPC,
    EDQUOT, EIO) as ``RuntimeError: ... errno = 28, error message = 'No space left on device'
    ...``; callers that handle OSError (a checkpoint generation not written, a metrics flush
    kept for later) need its errno. Always a new exception, without a traceback: raise it
    outside the ``except`` block, so that no frame of the failed write (and no h5py object of
    the failed file) stays alive with it."""
    text = str(exc)
    if isinstance(exc, OSError) and exc.errno is not None:
        code = exc.errno
    else:
        found = re.search(r"errno = (\d+)", text)
        code = int(found.group(1)) if found else errno.EIO
    if "errno = " not in text:                  # not an HDF5 message: keep its own words
        return OSError(code, exc.strerror if isinstance(exc, OSError) and exc.strerror
                       else os.strerror(code))
    first = (text.splitlines() or [""])[0][:120]
    return OSError(code, f"{os.strerror(code)} (HDF5: {first})")


#: Room beyond the data's own bytes that an HDF5 file needs (headers, chunk indexes).
HDF5_SLACK_BYTES = 1 << 20


def check_space(directory: str | os.PathLike, needed_bytes: float, what: str) -> None:
    """Raise ENOSPC before writing ``needed_bytes`` (plus HDF5's slack) into ``directory``
    when its file system has less free: HDF5's own state after a failed write is undefined,
    so a full disk is best found before it is touched. Quotas are not seen here (statvfs);
    those writes fail in HDF5 and are handled as failed writes.

    Raises:
        OSError: errno ENOSPC, saying how much is free and needed.
    """
    free = os.statvfs(directory)
    free_bytes = free.f_bavail * free.f_frsize
    need = needed_bytes * 1.05 + HDF5_SLACK_BYTES
    if free_bytes < need:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {free_bytes / 1e6:.1f} MB "
                                    f"free, {need / 1e6:.1f} MB needed for {what}")
