"""How many bytes the run directory's disk quota still allows, where a quota tool says.

``statvfs`` (:func:`hpcrl.io.files.check_space`) sees a file system's free space, not the user,
group or project quota that a cluster's shared file systems enforce, and a write that runs
into a quota fails inside HDF5, whose state after that cannot be trusted (the run stops). So
the pre-flight and each checkpoint generation ask the quota tool first:

* Lustre (file system type ``lustre``): ``lfs quota -q -u UID``, ``-g GID`` and, where the
  directory has a project id (``lfs project -d``), ``-p PROJID`` on the mount point;
* any other file system (NFS, ext4, XFS), where ``quota`` (linux quota-tools) is installed:
  ``quota -w -p -u -f MOUNT`` and ``-g`` (it asks ``rpc.rquotad`` for NFS mounts).

The headroom is the hard limit minus the usage (the soft limit where no hard one is set; a
soft limit alone is exceeded for its grace period before writes fail), the smallest over
what was asked. A missing tool, a tool that fails or takes longer than ``TIMEOUT_S``, or no
limit at all gives ``None``: no quota is known and nothing is refused.

The parsers are pure functions of the tools' text output (columns: file system, used,
soft limit, hard limit, grace, ...; sizes in KiB; ``*`` marks a usage over a limit and ``[]``
an inexact value; a long file system name is printed on a line of its own).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

#: Longest wait for one quota command (``lfs quota`` asks every server of the file system).
TIMEOUT_S = 10.0
KIB = 1024


def _number(token: str) -> int | None:
    token = token.strip("[]*")
    return int(token) if token.isdigit() else None


def parse_quota_lines(text: str) -> list[tuple[int, int, int]]:
    """The ``(used, soft, hard)`` KiB triples of every file system row in the output of
    ``lfs quota`` or ``quota`` (headers and "none" lines are skipped)."""
    rows, pending_name = [], False
    for line in text.splitlines():
        tokens = line.split()
        if not tokens or line.lstrip().startswith(("Disk quotas", "Filesystem")):
            pending_name = False
            continue
        numbers = tokens if pending_name else tokens[1:]
        pending_name = len(tokens) == 1           # a long name: its numbers follow
        values = [_number(t) for t in numbers[:3]]
        if len(values) == 3 and None not in values:
            rows.append(tuple(values))
    return rows


def headroom_kib(used: int, soft: int, hard: int) -> int | None:
    """KiB that may still be written under one quota row; None when it sets no limit."""
    limit = hard or soft
    return None if limit == 0 else limit - used


def parse_project_id(text: str) -> int | None:
    """The project id in ``lfs project -d DIR`` output (``  1234 P /path``); 0 means none."""
    tokens = text.split()
    value = _number(tokens[0]) if tokens else None
    return value or None


def mount_of(path: Path, mounts_text: str) -> tuple[str, str] | None:
    """``(mount point, file system type)`` of the deepest mount in ``/proc/mounts`` text
    that holds ``path`` (already resolved)."""
    best = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, fields[2])
    return best


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # quota(1) exits 1 when a limit is exceeded and still prints the rows
    return out.stdout if out.returncode in (0, 1) else None


def _queries(path: Path, point: str, fstype: str) -> list[tuple[str, list[str]]]:
    uid, gid = os.getuid(), os.getgid()
    if fstype == "lustre" and shutil.which("lfs"):
        queries = [(f"the user quota of uid {uid} (lfs quota)",
                    ["lfs", "quota", "-q", "-u", str(uid), point]),
                   (f"the group quota of gid {gid} (lfs quota)",
                    ["lfs", "quota", "-q", "-g", str(gid), point])]
        project = parse_project_id(_run(["lfs", "project", "-d", str(path)]) or "")
        if project:
            queries.append((f"the project quota of project {project} (lfs quota)",
                            ["lfs", "quota", "-q", "-p", str(project), point]))
        return queries
    if shutil.which("quota"):
        return [(f"the user quota of uid {uid} (quota)",
                 ["quota", "-w", "-p", "-u", "-f", point]),
                (f"the group quotas of gid {gid}'s groups (quota)",
                 ["quota", "-w", "-p", "-g", "-f", point])]
    return []


def quota_headroom(path: str | os.PathLike) -> tuple[float, str] | None:
    """``(bytes, which quota)``: the smallest headroom of the quotas the tools report for
    ``path``'s file system, or None when none is known (no tool, no limit, no answer)."""
    path = Path(path).resolve()
    try:
        where = mount_of(path, Path("/proc/mounts").read_text())
    except OSError:
        return None
    if where is None:
        return None
    best = None
    for what, cmd in _queries(path, *where):
        for row in parse_quota_lines(_run(cmd) or ""):
            room = headroom_kib(*row)
            if room is not None and (best is None or room * KIB < best[0]):
                best = (float(max(room, 0) * KIB), what)
    return best
