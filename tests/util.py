"""Launch real MPI jobs from tests: mpiexec from the same environment as this Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mpiexec_path() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def run_mpi(n: int, args: list[str], timeout: float = 120, cwd: Path | str = ROOT,
            env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``mpiexec -n n python ARGS``; returns (completed process, wall seconds).

    A hang is a failure: the whole process group is killed at ``timeout``.
    """
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    t0 = time.monotonic()
    proc = subprocess.run([mpiexec_path(), "-n", str(n), sys.executable, *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (hydra's proxy puts the ranks in their own process group)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def signal_tree(pid: int, sig: int) -> None:
    for p in process_tree(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of MPI rank ``rank`` among the launcher's descendants (by PMI_RANK)."""
    for p in process_tree(launcher_pid):
        try:
            env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env:
            return p
    raise LookupError(f"no rank {rank} under pid {launcher_pid}")
