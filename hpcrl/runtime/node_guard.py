"""The node-wide memory guard: a job whose ranks on one node together run it out of memory.

The per-rank guard (:mod:`hpcrl.runtime.watchdog`, ``memory_guard_gb``) bounds each rank by
its own estimate plus a margin. Twenty ranks that each grow by a gigabyte stay under that
bound one by one and still pass the node's memory together; the kernel's OOM killer then ends
one of them and the job dies with nothing in its log but mpiexec's "killed by signal 9". This
guard watches the node instead: when the memory it has left (``MemAvailable``, or what the
rank's cgroup and those above it still allow, whichever is smallest) stays below
``memory_floor_gb`` for two readings, the job's rank on that node that holds the most above
its pre-flight estimate reports itself (its largest arrays and tensors, its stack) with every
rank's share of the node, and aborts the job. The other ranks on the node read the same
figures; if the memory stays short for :data:`FOLLOW_S` seconds (the culprit could not act,
being stopped, or no rank is above its estimate: the memory is held outside the job), any of
them aborts the job with the table. Peers are the ranks whose host name is this rank's, read
by pid from this rank's ``/proc``: ranks on one host share its process table.

Reading the figures is a few small ``/proc`` and cgroup files per second per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GB = 1e9

#: Seconds the node may stay under its floor before a rank other than the culprit aborts.
FOLLOW_S = 10.0
#: Readings in a row under the floor before the culprit aborts.
CONFIRM_READINGS = 2


@dataclass(frozen=True)
class Peer:
    """A rank of this job on this node, as the pre-flight knows it."""
    rank: int
    role: str
    pid: int
    estimate: float            # bytes: its pre-flight memory estimate


def anonymous_resident_bytes(pid: int | str = "self") -> float | None:
    """A process's anonymous resident memory (``RssAnon``: heap, arrays, tensors; not its
    mapped files or the MPI windows it shares with other ranks), or None when it cannot be
    read (off Linux, or the process has ended)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cgroup_headroom(limit: float, usage: float, inactive_file: float) -> float:
    """Bytes a cgroup can still take before its OOM killer acts: its limit less its usage,
    where the inactive page cache in the usage is reclaimed first and so counts as free."""
    return limit - usage + inactive_file


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _stat_value(text: str, key: str) -> float:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return float(value)
    return 0.0


def cgroup_dirs(root: Path = Path("/sys/fs/cgroup"),
                proc_cgroup: Path = Path("/proc/self/cgroup")) -> list[tuple[Path, bool]]:
    """This process's memory cgroup and every cgroup above it up to ``root``, as
    ``(directory, is_v2)``, innermost first: a SLURM job's limit sits on its job's cgroup
    (``.../job_N``), not at the top of the hierarchy. From ``/proc/self/cgroup``: the
    ``memory`` controller's line (v1, under ``root/memory``), else the ``0::`` line (v2)."""
    text = _read(proc_cgroup) or ""
    found = None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if "memory" in controllers.split(","):
            found = (root / "memory", path, False)
            break
        if controllers == "" and found is None and line.startswith("0::"):
            found = (root, path, True)
    if found is None:
        return []
    base, path, v2 = found
    parts = [p for p in path.split("/") if p]
    return [(base.joinpath(*parts[:k]), v2) for k in range(len(parts), -1, -1)]


def _cgroup_limits(directory: Path, v2: bool) -> tuple[float, float, float] | None:
    """``(limit, usage, inactive_file)`` of one memory cgroup, or None where it has no finite
    limit (or its files cannot be read)."""
    limit_f, usage_f, key = (("memory.max", "memory.current", "inactive_file") if v2 else
                             ("memory.limit_in_bytes", "memory.usage_in_bytes",
                              "total_inactive_file"))
    limit, usage = _read(directory / limit_f), _read(directory / usage_f)
    if limit is None or usage is None:
        return None
    limit = limit.strip()
    if not limit.isdigit() or int(limit) >= 2 ** 60:
        return None
    return (float(limit), float(usage),
            _stat_value(_read(directory / "memory.stat") or "", key))


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """The node's ``MemAvailable`` in bytes (free memory plus what the kernel can reclaim), or
    None off Linux."""
    for line in (_read(meminfo) or "").splitlines():
        if line.startswith("MemAvailable:"):
            return float(line.split()[1]) * 1024
    return None


def node_headroom(cgroups: list[tuple[Path, bool]] | None = None,
                  meminfo: Path = Path("/proc/meminfo")) -> tuple[float, str] | None:
    """``(bytes, where from)``: the memory this rank can still take, the smallest of the
    node's ``MemAvailable`` and the headroom (:func:`cgroup_headroom`) of each of its cgroups
    with a limit (``cgroups``: :func:`cgroup_dirs`, read now if None); None off Linux."""
    available = mem_available(meminfo)
    found = [] if available is None else [(available, "MemAvailable")]
    for directory, v2 in (cgroup_dirs() if cgroups is None else cgroups):
        limits = _cgroup_limits(directory, v2)
        if limits is not None:
            found.append((cgroup_headroom(*limits), f"the cgroup {directory.name or '/'}'s limit"))
    return min(found) if found else None


def culprit(held: dict[int, float], peers: list[Peer]) -> int | None:
    """The rank that holds the most above its estimate, of those whose memory could be read
    (``held``: rank -> bytes); None if none could or none is above its estimate (the memory
    is then held outside the job, or the estimates are short everywhere)."""
    grown = [(held[p.rank] - p.estimate, -p.rank) for p in peers if p.rank in held]
    return -max(grown)[1] if grown and max(grown)[0] > 0 else None


def table(held: dict[int, float], peers: list[Peer]) -> str:
    """One line: every rank's anonymous memory on the node, in GB, by rank."""
    return ", ".join(f"{p.rank} {held[p.rank] / GB:.2f}" for p in peers if p.rank in held)


def report(host: str, headroom: tuple[float, str], floor: float, held: dict[int, float],
           peers: list[Peer], who: int | None) -> str:
    """The first line of the guard's message: the node's memory, this job's share of it, and
    the rank named (``who``)."""
    total = sum(held.values())
    estimate = sum(p.estimate for p in peers if p.rank in held)
    named = "; none is above its estimate: the memory is held outside the job"
    if who is not None:
        peer = next(p for p in peers if p.rank == who)
        named = (f"; the most above its estimate is rank {who} ({peer.role}) with "
                 f"{held[who] / GB:.2f} GB (estimate {peer.estimate / GB:.2f} GB)")
    return (f"hpcrl: node memory guard: host {host} has {headroom[0] / GB:.2f} GB of memory "
            f"left ({headroom[1]}), under memory_floor_gb = {floor / GB:g}; this job's "
            f"{len(held)} ranks there hold {total / GB:.2f} GB of anonymous memory (pre-flight "
            f"estimate {estimate / GB:.2f} GB){named}; aborting the job before the kernel's OOM "
            "killer ends a rank without a word (--set memory_floor_gb=N moves the floor, 0 "
            f"turns it off). GB by rank: {table(held, peers)}\n")


class NodeGuard:
    """What a rank's watchdog thread asks once a period: is the node short, and is it this
    rank's turn to say so (:meth:`check`)."""

    def __init__(self, rank: int, floor: float, peers: list[Peer], headroom=None):
        self.rank, self.floor, self.peers = rank, floor, peers
        if headroom is None:
            cgroups = cgroup_dirs()                 # found once: a rank does not move
            headroom = lambda: node_headroom(cgroups)       # noqa: E731
        self.headroom = headroom
        self.short_since: float | None = None
        self.short_readings = 0

    def check(self, now: float) -> tuple[str, bool] | None:
        """None while the node has memory above the floor; else ``(message, is_culprit)``
        once this rank should abort the job: if it is the culprit, at the second reading in a
        row under the floor (one reading is not a trend); otherwise, once the node has been
        short for :data:`FOLLOW_S` seconds."""
        room = self.headroom()
        if room is None or room[0] >= self.floor:
            self.short_since, self.short_readings = None, 0
            return None
        if self.short_since is None:
            self.short_since = now
        self.short_readings += 1
        held = {p.rank: b for p in self.peers
                if (b := anonymous_resident_bytes(p.pid)) is not None}
        who = culprit(held, self.peers)
        mine = who == self.rank and self.short_readings >= CONFIRM_READINGS
        if not mine and now - self.short_since < FOLLOW_S:
            return None
        import socket

        return report(socket.gethostname(), room, self.floor, held, self.peers, who), \
            who == self.rank
