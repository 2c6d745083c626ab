"""Where a run's numbers came from: package versions, the MPI library, the git commit, hosts
and SLURM ids, recorded by rank 0 in ``metrics.h5`` (attribute ``provenance``, JSON; the
latest start's) and in every checkpoint manifest.

Versions are read from the installed distributions' metadata (``importlib.metadata``), so a ps
rank records torch's version without importing torch.
"""

from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("hpcrl", "torch", "numpy", "ale-py", "gymnasium", "mpi4py", "h5py")
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
              "SLURM_CLUSTER_NAME", "SLURM_RESTART_COUNT")


def versions() -> dict[str, str | None]:
    """Installed version of each of PACKAGES (None where not installed)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(source: Path | None = None) -> dict[str, str | bool | None]:
    """The commit and whether the tree had uncommitted changes, when hpcrl runs from a git
    checkout (an installed wheel has none: both None)."""
    source = source or Path(__file__).resolve().parents[2]
    if not (source / ".git").exists():
        return {"git_commit": None, "git_dirty": None}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(source), *args], capture_output=True,
                                  text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def provenance(mpi_library: str, hosts: list[str] | None) -> dict:
    """Everything above as one JSON-able dict (rank 0 calls it once per start)."""
    return {"versions": versions(), "mpi_library": mpi_library, **git_state(),
            "hosts": sorted(set(hosts or [])), "world_size": len(hosts or []),
            "slurm": {k: os.environ[k] for k in SLURM_VARS if k in os.environ}}
