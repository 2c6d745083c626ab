"""Crash-safe checkpoint generations in HDF5: one file per rank, a manifest written last.

Layout under ``<run_dir>/checkpoints/``::

    gen-000007/rank-00000.h5      one file per rank: {name: array} of that rank's state
    gen-000007/rank-00001.h5
    gen-000007/MANIFEST.json      written last by rank 0: files, sizes, SHA-256, counters, layout

A generation counts only if its manifest exists and every file it lists has the recorded size
and hash (dopamine writes its sentinel last for the same reason). Every file is written as
``*.tmp``, closed, fsynced, hashed, ``os.replace``d and the directory fsynced, so a crash at
any moment leaves either the old file or the new one (:func:`write_state`); ``checkpoints/``
is fsynced after the manifest, before older generations are pruned. The manifest is JSON and
the states are plain arrays: nothing read back executes code (no pickle).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io.files import check_space, fsync_dir, h5_os_error, replace_text

MANIFEST = "MANIFEST.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (reported with the path and the reason)."""


def gen_dir(root: Path, gen: int) -> Path:
    return Path(root) / f"gen-{gen:06d}"


def rank_file(root: Path, gen: int, rank: int) -> Path:
    return gen_dir(root, gen) / f"rank-{rank:05d}.h5"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _sync_and_hash(path: Path) -> str:
    """fsync a closed file and hash what it holds (one pass)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _write_h5(path: Path, state: dict) -> None:
    with h5py.File(path, "w") as f:
        for name, value in state.items():
            arr = np.asarray(value)
            if arr.dtype == object:
                raise TypeError(f"state entry {name!r} is not a plain array")
            f.create_dataset(name, data=arr)


def write_state(path: Path, state: dict, crash=lambda step: None) -> dict:
    """Write ``{name: array or scalar}`` durably; returns {file, bytes, sha256}.

    Order: write ``*.tmp`` and close it (HDF5 may still change the file at close), fsync it and
    hash what is on disk, rename, fsync the directory. A crash at any step leaves either no
    file under the final name or one that matches the hash the manifest will record.
    ``crash(step)``: the fault-injection point after each step (tests)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    check_space(path.parent, sum(np.asarray(v).nbytes for v in state.values()),
                f"{path.name}")
    error = None
    try:
        _write_h5(tmp, state)
    except (OSError, RuntimeError) as exc:
        error = h5_os_error(exc)
    if error is not None:        # raised here: no h5py object of the failed file outlives it
        with contextlib.suppress(OSError):
            os.unlink(tmp)                        # give a full disk its space back
        raise error
    crash("closed")
    digest = _sync_and_hash(tmp)
    crash("synced")
    os.replace(tmp, path)
    crash("renamed")
    fsync_dir(path.parent)
    crash("dir-synced")
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest}


def failed_inside_hdf5(exc: OSError) -> bool:
    """Whether ``exc`` (from :func:`write_state`) came from inside HDF5 (after which the
    library's state is undefined), not from the free-space check before it."""
    return "(HDF5: " in (exc.strerror or "")


def read_state(path: Path, cols: slice | None = None) -> dict[str, np.ndarray]:
    """Read a rank file back into RAM (replay included: random HDF5 reads are too slow).

    ``cols`` cuts every non-scalar dataset to ``[..., cols]`` on disk: a ps rank re-splitting
    shards reads only the part it will host.
    """
    def take(obj):
        return obj[()] if cols is None or obj.ndim == 0 else obj[..., cols]

    try:
        with h5py.File(path, "r") as f:
            out: dict[str, np.ndarray] = {}
            f.visititems(lambda name, obj: out.__setitem__(name, take(obj))
                         if isinstance(obj, h5py.Dataset) else None)
            return out
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint file ({exc})") from None


def write_manifest(root: Path, gen: int, files: list[dict], info: dict) -> None:
    """Rank 0, last: the generation becomes complete when this file appears. The manifest is
    written durably (:func:`replace_text`), then ``root`` is fsynced so that the generation's
    own directory entry survives a crash before anything older is pruned."""
    replace_text(gen_dir(root, gen) / MANIFEST,
                 json.dumps({"generation": gen, "files": files, **info}, indent=1))
    fsync_dir(root)


def read_manifest(root: Path, gen: int) -> dict:
    path = gen_dir(root, gen) / MANIFEST
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest ({exc})") from None


def generations(root: Path) -> list[int]:
    """Generation numbers present on disk (complete or not), ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    gens = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("gen-") and p.name[4:].isdigit():
            gens.append(int(p.name[4:]))
    return sorted(gens)


def verify(root: Path, gen: int, check_hash: bool = True, roles: set[str] | None = None
           ) -> dict:
    """The manifest of ``gen`` if every listed file is intact, else CheckpointError.

    ``roles``: check only the files of ranks with these roles (the offline tools read the ps
    files only, and hashing a Gorila generation's replay memories would read gigabytes)."""
    manifest = read_manifest(root, gen)
    try:
        entries = [e for e, role in zip(manifest["files"], manifest.get(
            "roles", [None] * len(manifest["files"]))) if roles is None or role in roles]
        entries = [(e["file"], e["bytes"], e["sha256"]) for e in entries]
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"{gen_dir(root, gen) / MANIFEST}: malformed manifest "
                              f"({exc!r})") from None
    for file, size, digest in entries:
        path = gen_dir(root, gen) / file
        try:
            if not path.exists():
                raise CheckpointError(f"{path}: missing")
            if path.stat().st_size != size:
                raise CheckpointError(f"{path}: truncated ({path.stat().st_size} of {size} bytes)")
            if check_hash and sha256(path) != digest:
                raise CheckpointError(f"{path}: corrupted (SHA-256 differs from the manifest)")
        except OSError as exc:            # EIO, ESTALE: this generation cannot be trusted
            raise CheckpointError(f"{path}: unreadable ({exc.strerror or exc})") from None
    return manifest


def latest_complete(root: Path, warn=print, roles: set[str] | None = None
                    ) -> tuple[int, dict] | None:
    """Newest generation whose manifest and files (of ``roles``, see :func:`verify`) are
    intact; older ones on failure, with a warning for each generation skipped."""
    for gen in reversed(generations(root)):
        if not (gen_dir(root, gen) / MANIFEST).exists():
            continue                               # never completed: does not count
        try:
            return gen, verify(root, gen, roles=roles)
        except CheckpointError as exc:
            warn(f"hpcrl: warning: skipping checkpoint generation {gen}: {exc}")
    return None


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete generations, and incomplete ones older than
    the newest complete one."""
    root = Path(root)
    for trash in root.glob(".trash-gen-*"):                # a prune killed half-way before
        shutil.rmtree(trash, ignore_errors=True)
    gens = generations(root)
    complete = [g for g in gens if (gen_dir(root, g) / MANIFEST).exists()]
    keep_set = set(complete[-keep:])
    newest = complete[-1] if complete else -1
    for g in gens:
        if g not in keep_set and g < newest:
            # Rename first (atomic), then delete: a job killed inside rmtree must not leave a
            # generation that still has its manifest but lacks files (seen in the 20-kill
            # chaos run: gen 145 kept MANIFEST.json and 1 of its 4 rank files).
            doomed = gen_dir(root, g)
            trash = root / f".trash-{doomed.name}"
            try:
                os.rename(doomed, trash)
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
