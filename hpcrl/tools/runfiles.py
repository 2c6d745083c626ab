"""What the offline tools read from a run directory: its config and the parameter servers'
arrays of one complete checkpoint generation (only the ps files are verified: hashing a
Gorila generation's replay memories would read gigabytes on a login node).

Only data is read: ``config.toml`` (TOML), ``MANIFEST.json`` (JSON) and HDF5 arrays. The ps
ranks' files hold one shard each, in the manifest's file order, which is the order of the flat
parameter vector (see :mod:`hpcrl.runtime.params.layout`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io import checkpoint as ckpt
from hpcrl.runtime.reshard import PS  # the ps role name in a manifest's roles


class RunFilesError(RuntimeError):
    """One line for the user: what is wrong with the run directory or the generation asked."""


def load_run_config(run_dir: Path):
    """The run's resolved config (``config.toml``, written at its start)."""
    from hpcrl.config import ConfigError, load_config

    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        raise RunFilesError(f"{run_dir}: not a run directory (no config.toml)")
    try:
        return load_config(path)
    except ConfigError as exc:
        raise RunFilesError(str(exc)) from None


def checkpoint_generation(run_dir: Path, generation: int | None = None) -> tuple[int, dict]:
    """(generation, manifest): the one asked for, verified, or the newest complete one."""
    root = Path(run_dir) / "checkpoints"
    if generation is None:
        found = ckpt.latest_complete(root, warn=lambda msg: print(msg, file=sys.stderr),
                                     roles={PS})
        if found is None:
            raise RunFilesError(f"{run_dir}: no complete checkpoint generation under {root}")
    else:
        if generation not in ckpt.generations(root):
            have = ", ".join(map(str, ckpt.generations(root))) or "none"
            raise RunFilesError(f"{run_dir}: no checkpoint generation {generation} (on disk: "
                                f"{have})")
        try:
            found = generation, ckpt.verify(root, generation, roles={PS})
        except ckpt.CheckpointError as exc:
            raise RunFilesError(str(exc)) from None
    gen, manifest = found
    if not isinstance(manifest, dict) or not {"files", "roles", "frames"} <= manifest.keys():
        raise RunFilesError(f"{ckpt.gen_dir(root, gen)}: manifest lacks files, roles or frames")
    return gen, manifest


def ps_arrays(run_dir: Path, gen: int, manifest: dict, name: str) -> list[np.ndarray]:
    """Dataset ``name`` of every ps rank's file of generation ``gen``, one array per shard in
    rank order (a shard's scalar, such as an update count, as a 0-d array)."""
    gdir = ckpt.gen_dir(Path(run_dir) / "checkpoints", gen)
    files = [e["file"] for e, role in zip(manifest["files"], manifest["roles"]) if role == PS]
    if not files:
        raise RunFilesError(f"{gdir}: the manifest lists no ps rank files")
    parts = []
    for file in files:
        try:
            with h5py.File(gdir / file, "r") as f:
                if name not in f:
                    raise RunFilesError(f"{gdir / file}: no dataset {name!r}")
                parts.append(f[name][...])
        except OSError as exc:
            raise RunFilesError(f"{gdir / file}: unreadable ({exc})") from None
    return parts


def ps_array(run_dir: Path, gen: int, manifest: dict, name: str) -> np.ndarray:
    """Dataset ``name`` of every ps rank's file of generation ``gen``, concatenated along the
    last axis: the whole flat vector (``params``, ``target``, ``opt/v``, ...)."""
    return np.concatenate(ps_arrays(run_dir, gen, manifest, name), axis=-1)


def has_dataset(run_dir: Path, gen: int, manifest: dict, name: str) -> bool:
    """Whether the first ps rank's file of ``gen`` holds dataset ``name``."""
    gdir = ckpt.gen_dir(Path(run_dir) / "checkpoints", gen)
    first = next((e["file"] for e, role in zip(manifest["files"], manifest["roles"])
                  if role == PS), None)
    if first is None:
        raise RunFilesError(f"{gdir}: the manifest lists no ps rank files")
    try:
        with h5py.File(gdir / first, "r") as f:
            return name in f
    except OSError as exc:
        raise RunFilesError(f"{gdir / first}: unreadable ({exc})") from None


def first_rank_group(run_dir: Path, gen: int, manifest: dict, role: str, group: str
                     ) -> dict[str, np.ndarray] | None:
    """The datasets under ``group/`` in the file of the first rank with ``role`` in generation
    ``gen`` (e.g. the first actor-learner's observation statistics), or None if it has none."""
    gdir = ckpt.gen_dir(Path(run_dir) / "checkpoints", gen)
    file = next((e["file"] for e, r in zip(manifest["files"], manifest["roles"]) if r == role),
                None)
    if file is None:
        raise RunFilesError(f"{gdir}: the manifest lists no {role} rank files")
    try:
        with h5py.File(gdir / file, "r") as f:
            if group not in f:
                return None
            return {name: ds[...] for name, ds in f[group].items()}
    except OSError as exc:
        raise RunFilesError(f"{gdir / file}: unreadable ({exc})") from None
