"""One job per run directory: an exclusive lease that rank 0 holds for the whole job.

Two jobs on one run directory (a double ``sbatch``, an array task resubmitted while it still
runs, two users sharing a results tree) would move each other's metrics aside and write the
same checkpoint generations. Rank 0 therefore takes a lease before it reads or writes anything
in the directory, in two layers, because cluster file systems differ:

* an ``fcntl.flock`` on ``.hpcrl-lock``: the kernel, or the file system's lock manager,
  releases it when the holder dies, however it died (crash, SIGKILL), so a dead job never
  blocks a restart on the same node;
* a lease file ``.hpcrl-lease.json`` (host, pid, SLURM job and array ids, start and heartbeat
  times, rewritten every ``stale_s / 10``): it names the holder in the refusal, and it guards
  file systems whose locks are node-local (e.g. Lustre mounted with ``localflock``) or not
  supported, where a second node would be granted the lock.

A lease in the file is taken over when (:func:`judge`) its job is this SLURM job (a requeue:
SLURM never runs two incarnations of one job), when it is this host's and the lock was free
(or, without locks, its pid is gone), or when its heartbeat is older than ``stale_s`` (its
holder, on another node, is presumed dead). A held lock always refuses: its holder is alive,
if perhaps frozen.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hpcrl.config import ConfigError
from hpcrl.io.files import replace_text

LOCK_NAME = ".hpcrl-lock"
LEASE_NAME = ".hpcrl-lease.json"


class RunDirBusy(ConfigError):
    """The run directory is leased by another live job."""


def identity(now: float | None = None) -> dict:
    """This process as a lease holder: host, pid, SLURM job (and array task) ids, times."""
    env = os.environ
    array = (f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
             if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID") else None)
    now = time.time() if now is None else now
    return dict(host=socket.gethostname(), pid=os.getpid(), slurm_job=env.get("SLURM_JOB_ID"),
                slurm_array=array, started=now, heartbeat=now)


def describe(holder: dict, now: float) -> str:
    """'job 1234_7 on node c042 (pid 5678, heartbeat 3 s ago)'."""
    job = holder.get("slurm_array") or holder.get("slurm_job")
    age = max(0.0, now - float(holder.get("heartbeat", now)))
    who = f"job {job} on node {holder.get('host')}" if job else f"a job on host {holder.get('host')}"
    return f"{who} (pid {holder.get('pid')}, heartbeat {age:.0f} s ago)"


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:           # exists, another user's
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


@dataclass(frozen=True)
class Verdict:
    """:func:`judge`'s answer: take the lease (with an optional warning) or refuse."""
    take: bool
    note: str | None = None


def judge(lock: str, old: dict | None, me: dict, now: float, stale_s: float,
          pid_alive=_pid_alive) -> Verdict:
    """Whether this job may take the lease.

    Args:
        lock: "held" (this process got the flock), "busy" (another holds it) or
            "unsupported" (the file system has no locks).
        old: the lease file's holder, or None when there is none.
        me: :func:`identity` of this process.
        now: time.time().
        stale_s: a heartbeat older than this is a dead holder's.
    """
    if lock == "busy":
        return Verdict(False)
    if old is None:
        return Verdict(True)
    if old.get("slurm_job") and old.get("slurm_job") == me.get("slurm_job"):
        return Verdict(True, f"continuing the lease of this SLURM job ({old['slurm_job']}, "
                             "requeued)")
    age = now - float(old.get("heartbeat", 0.0))
    # on one host the lock is the authority: granted means its holder is gone; without locks,
    # ask the kernel about the holder's pid
    if old.get("host") == me.get("host") and (lock == "held"
                                              or not pid_alive(int(old.get("pid", -1)))):
        return Verdict(True, f"taking over the lease of {describe(old, now)}: that process "
                             "is gone")
    if age > stale_s:
        return Verdict(True, f"taking over the lease of {describe(old, now)}: older than "
                             f"run_dir_lease_s = {stale_s:g}")
    return Verdict(False)


class RunDirLease:
    """Rank 0's lease on its run directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, run_dir: Path, fd: int, me: dict, heartbeat_s: float):
        self.run_dir, self._fd, self.me = run_dir, fd, me
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True,
                                        name="hpcrl-lease")
        self._thread.start()

    @classmethod
    def acquire(cls, run_dir: Path, stale_s: float, warn=print) -> "RunDirLease":
        """Take the lease on the existing directory ``run_dir`` or raise :class:`RunDirBusy`
        naming the holder. A refusal writes nothing (the lock file is opened, never written)."""
        fd, lock = _open_locked(run_dir / LOCK_NAME)
        try:
            old = read_lease(run_dir)
            now = time.time()
            me = identity(now)
            verdict = judge(lock, old, me, now, stale_s)
            if not verdict.take:
                holder = describe(old, now) if old else "another process (no lease file yet)"
                raise RunDirBusy(f"run directory {run_dir} is in use by {holder}; wait for it "
                                 "to end or stop it, or choose another --set run_dir=...")
        except BaseException:
            os.close(fd)
            raise
        if verdict.note:
            warn(f"[hpcrl] run directory {run_dir}: {verdict.note}", flush=True)
        return cls(run_dir, fd, me, heartbeat_s=max(0.05, stale_s / 10))

    def _write(self) -> None:
        self.me["heartbeat"] = time.time()
        replace_text(self.run_dir / LEASE_NAME, json.dumps(self.me) + "\n")

    def _beat(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            try:
                self._write()
            except OSError:           # a full or vanished disk: the job itself will say so
                pass

    def release(self) -> None:
        """End of the job: stop the heartbeat, remove the lease and lock files (while still
        holding the lock: a waiter that locked the unlinked file retries, see
        :func:`_open_locked`), drop the lock. The directory is left as the job found it."""
        self._stop.set()
        self._thread.join()
        for name in (LEASE_NAME, LOCK_NAME):
            try:
                (self.run_dir / name).unlink()
            except OSError:
                pass
        os.close(self._fd)


def _open_locked(path: Path) -> tuple[int, str]:
    """Open (creating) the lock file and try its lock: (fd, 'held' | 'busy' | 'unsupported').

    A lock taken on a file that its holder unlinked meanwhile (:meth:`RunDirLease.release`)
    guards nothing, so a held lock counts only if ``path`` still names the locked file."""
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            lock = _try_lock(fd)
            if lock != "held" or _same_file(fd, path):
                return fd, lock
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise OSError(errno.EAGAIN, f"{path} keeps being replaced")


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _try_lock(fd: int) -> str:
    """'held', 'busy' or 'unsupported' (a file system without flock)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return "busy"
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            return "unsupported"
        raise
    return "held"


def read_lease(run_dir: Path) -> dict | None:
    """The lease file's holder (JSON, nothing executed), or None if absent or unreadable."""
    try:
        data = json.loads((run_dir / LEASE_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
