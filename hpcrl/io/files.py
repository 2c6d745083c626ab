"""Durable file operations shared by checkpoints, metrics and the run directory."""

from __future__ import annotations

import os
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
