"""One job per run directory: an exclusive lease that rank 0 holds for the whole job.

Two jobs on one run directory (a double ``sbatch``, an array task resubmitted while it still
runs, two users sharing a results tree) would move each other's metrics aside and write the
same checkpoint generations. Rank 0 therefore takes a lease before it reads or writes anything
in the directory, in two layers, because cluster file systems differ:

* an ``fcntl.flock`` on ``.hpcrl-lock``: where the file system's locks reach every node, the
  lock manager releases it when the holder dies, however it died, so a restart after a crash
  needs no wait; where locks are node-local (Lustre ``localflock``, NFS ``local_lock=flock``)
  or missing (Lustre ``noflock``, NFSv3 ``nolock``) it guards one node only;
* a lease file ``.hpcrl-lease.json`` that does not depend on locks. It is created atomically
  (a complete temporary file hard-linked to the name: ``link`` fails if the name exists, on
  NFS too) and names its holder (host, pid, SLURM job, array task and restart count) and a
  random token. The holder never rewrites it: its beat counter, incremented every
  ``heartbeat_s``, goes to a beat file of its own, ``.hpcrl-lease.beat-<token>.json``, which
  :func:`read_lease` reads with it. So a holder frozen after it checked its lease and before
  it wrote its beat, and taken over meanwhile, writes that beat into its own file when it
  continues, not over its successor's lease. Before each beat, each checkpoint manifest, each
  prune and each metrics file replacement the holder checks that the token in the lease file
  is still its own; if not (its lease was judged stale and taken over, e.g. after it was
  frozen), it stops at once with one line, writing nothing more.

Whether a lease is stale is judged by watching it, never by comparing clocks across nodes: a
holder is presumed dead when its beat counter did not change for ``stale_s`` of the watcher's
own clock (:func:`plan`). Shortcuts, where the answer is certain: on the holder's own host a
free lock (or, without locks, a pid that is gone) means the holder is gone; a SLURM requeue
(same job id, higher ``SLURM_RESTART_COUNT``) takes over from its previous incarnation once
that one's beat has stopped for three of its periods, even while a dead node's lock is still
held. A stale lease is broken under a marker file named by its token, so of two jobs that
judged it stale at once exactly one takes it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hpcrl.config import ConfigError
from hpcrl.runtime import hooks

LOCK_NAME = ".hpcrl-lock"
LEASE_NAME = ".hpcrl-lease.json"
BREAK_PREFIX = ".hpcrl-lease.break-"
#: The holder's beat file is BEAT_PREFIX + token + ".json" (only the holder writes it).
BEAT_PREFIX = ".hpcrl-lease.beat-"
#: A requeued incarnation takes over when its predecessor's beat stopped this many periods.
REQUEUE_STOPPED_BEATS = 3
#: The longest heartbeat period: a live holder is recognised within about this long.
MAX_HEARTBEAT_S = 10.0
#: Polling period while watching another job's lease.
WATCH_POLL_S = 0.05


class RunDirBusy(ConfigError):
    """The run directory is leased by another live job."""


class LeaseLost(RuntimeError):
    """This job's lease was taken over (or cannot be renewed): it must stop writing."""


def heartbeat_period(stale_s: float) -> float:
    """Seconds between beats: a tenth of the stale bound, at most :data:`MAX_HEARTBEAT_S`."""
    return max(0.02, min(MAX_HEARTBEAT_S, stale_s / 10))


def identity(heartbeat_s: float, now: float | None = None) -> dict:
    """This process as a lease holder: host, pid, SLURM job (array task, restart count), a
    fresh random token, the beat counter and period, and wall times (for people only)."""
    env = os.environ
    array = (f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
             if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID") else None)
    now = time.time() if now is None else now
    try:
        restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        restart = 0
    return dict(host=socket.gethostname(), pid=os.getpid(), slurm_job=env.get("SLURM_JOB_ID"),
                slurm_array=array, slurm_restart=restart, token=secrets.token_hex(16), beat=0,
                heartbeat_s=heartbeat_s, started=now, heartbeat=now)


def describe(holder: dict, now: float) -> str:
    """'job 1234_7 on node c042 (pid 5678, heartbeat 3 s ago)'. The age is by this host's
    clock: for people, never for decisions."""
    if holder.get("corrupt"):
        return "an unreadable lease file"
    job = holder.get("slurm_array") or holder.get("slurm_job")
    age = max(0.0, now - float(holder.get("heartbeat", now)))
    who = f"job {job} on node {holder.get('host')}" if job else f"a job on host {holder.get('host')}"
    return f"{who} (pid {holder.get('pid')}, heartbeat {age:.0f} s ago)"


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (a zombie does not; a stopped one does)."""
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
class Plan:
    """:func:`plan`'s answer. ``action``: "take" (the holder is gone), "watch" (take it if its
    beat does not change for ``watch_s``) or "busy" (a live holder: refuse)."""
    action: str
    watch_s: float = 0.0
    note: str = ""


def plan(lock: str, old: dict, me: dict, stale_s: float, pid_alive=_pid_alive) -> Plan:
    """What to do about an existing lease ``old`` (pure: the rule, by hand in the tests).

    Args:
        lock: "held" (this process got the flock), "busy" (another holds it) or
            "unsupported" (no locks here, or ``HPCRL_LEASE_NO_FLOCK``).
        old: the lease file's holder (``{"corrupt": True}`` for an unreadable file).
        me: :func:`identity` of this process.
        stale_s: ``run_dir_lease_s``: a beat unchanged this long is a dead holder's.
    """
    same_host = not old.get("corrupt") and old.get("host") == me.get("host")
    if same_host and lock == "held":
        return Plan("take", note="that process is gone")
    if same_host and lock == "unsupported" and not pid_alive(int(old.get("pid", -1))):
        return Plan("take", note="that process is gone")
    if (old.get("slurm_job") and old.get("slurm_job") == me.get("slurm_job")
            and int(old.get("slurm_restart", 0)) < int(me.get("slurm_restart", 0))):
        period = float(old.get("heartbeat_s") or heartbeat_period(stale_s))
        return Plan("watch", min(stale_s, REQUEUE_STOPPED_BEATS * period),
                    note=f"this SLURM job's previous start (restart "
                         f"{old.get('slurm_restart', 0)}) stopped beating")
    if lock == "busy":
        return Plan("busy")
    return Plan("watch", stale_s, note=f"its heartbeat did not change for run_dir_lease_s = "
                                       f"{stale_s:g} s")


def _key(holder: dict) -> tuple:
    """What changes when a holder beats (or another holder takes over)."""
    return (holder.get("token"), holder.get("beat"), holder.get("digest"))


class RunDirLease:
    """Rank 0's lease on its run directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, run_dir: Path, me: dict, fd: int, lock: str, stale_s: float):
        self.run_dir, self.me, self._fd, self._lock = run_dir, me, fd, lock
        self.stale_s = stale_s
        #: why the lease was lost (None while it is held)
        self.lost: str | None = None
        self._lost_lock = threading.Lock()
        #: called once, from the heartbeat thread, when the lease is lost (program: abort)
        self.on_lost = None
        self._last_ok = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="hpcrl-lease")
        self._thread.start()

    # -- taking it ---------------------------------------------------------------------------

    @classmethod
    def acquire(cls, run_dir: Path, stale_s: float, warn=print, retry_s: float = 0.0
                ) -> "RunDirLease":
        """Take the lease on the existing directory ``run_dir`` or raise :class:`RunDirBusy`
        naming the holder. A live holder is recognised within about one of its heartbeat
        periods; a holder presumed dead costs a wait of up to ``stale_s``. ``retry_s``: keep
        trying a busy directory this long, with back-off (a requeue whose predecessor is still
        being cleaned up). A refusal writes nothing but the lock file."""
        me = identity(heartbeat_period(stale_s))
        deadline, backoff = time.monotonic() + retry_s, 1.0
        while True:
            fd, lock = _open_locked(run_dir / LOCK_NAME)
            try:
                taken, holder = _take(run_dir, lock, me, stale_s, warn)
            except BaseException:
                os.close(fd)
                raise
            if taken:
                return cls(run_dir, me, fd, lock, stale_s)
            os.close(fd)
            if time.monotonic() + backoff > deadline:
                raise RunDirBusy(f"run directory {run_dir} is in use by {holder}; wait for it "
                                 "to end or stop it, or choose another --set run_dir=...")
            warn(f"[hpcrl] run directory {run_dir} is in use by {holder}; trying again in "
                 f"{backoff:.0f} s", flush=True)
            time.sleep(backoff)
            backoff = min(2 * backoff, 60.0)

    # -- holding it --------------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless the lease file still carries this job's token (call
        before anything that would overwrite another job's files). The loss is announced once,
        by whichever of this call and the heartbeat thread sees it first."""
        if self.lost:
            raise LeaseLost(self.lost)
        why = self._taken_over()
        if why is not None:
            self._mark_lost(why)
            raise LeaseLost(why)

    def _taken_over(self) -> str | None:
        """Why this job no longer holds the lease, or None while it does."""
        try:
            cur = read_lease(self.run_dir)
        except OSError as exc:
            return f"its lease file cannot be read ({exc.strerror or exc})"
        if cur is None or cur.get("token") != self.me["token"]:
            who = describe(cur, time.time()) if cur else "nobody (the file is gone)"
            return f"its lease was taken over; the lease file now names {who}"
        return None

    def _renew(self) -> None:
        """One beat, into this job's own beat file: the lease file, which a successor may
        have taken over since the last check, is never rewritten."""
        self.me["beat"] += 1
        self.me["heartbeat"] = time.time()
        _write_json(_beat_path(self.run_dir, self.me["token"]),
                    {k: self.me[k] for k in ("token", "beat", "heartbeat")})
        self._last_ok = time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(self.me["heartbeat_s"]):
            if self.lost:                   # the main thread's check found it first
                return None
            why = self._taken_over()
            if why is not None:
                return self._lose(why)
            try:
                self._renew()
            except OSError as exc:
                # Past half the stale bound a watcher may already count this job as dead.
                failing_s = time.monotonic() - self._last_ok
                if failing_s > self.stale_s / 2:
                    return self._lose(f"its heartbeat could not be written for {failing_s:.0f} s "
                                      f"({exc.strerror or exc})")
        return None

    def _mark_lost(self, why: str) -> bool:
        """Record the loss and print its one error line; False if it was already recorded."""
        with self._lost_lock:
            if self.lost:
                return False
            self.lost = why
        sys.stderr.write(f"hpcrl: error: run directory {self.run_dir}: this job no longer holds "
                         f"it: {why}; stopping without writing anything more there\n")
        sys.stderr.flush()
        return True

    def _lose(self, why: str) -> None:
        """The heartbeat thread found the loss: announce it and stop the job (``on_lost``)."""
        if self._mark_lost(why) and self.on_lost is not None:
            self.on_lost()

    def release(self) -> None:
        """End of the job: stop the heartbeat; if the lease file still names this job, remove
        it and then every beat file (a predecessor's last in-flight beat and a beat killed
        half-written included), else only this job's own beat file; then the lock file while
        holding its lock (a waiter that locked the unlinked file retries, see
        :func:`_open_locked`), and drop the lock. The beat file goes last, so that a job
        frozen in here still looks alive to a watcher until its lease file is gone."""
        self._stop.set()
        self._thread.join()
        try:
            cur = read_lease(self.run_dir)
        except OSError:
            cur = None
        if cur is not None and cur.get("token") == self.me["token"]:
            _unlink(self.run_dir / LEASE_NAME)
            for stray in self.run_dir.glob(BEAT_PREFIX + "*"):
                _unlink(stray)
        _unlink(_beat_path(self.run_dir, self.me["token"]))
        if self._lock == "held":
            _unlink(self.run_dir / LOCK_NAME)
        os.close(self._fd)


def _take(run_dir: Path, lock: str, me: dict, stale_s: float, warn) -> tuple[bool, str]:
    """One attempt: (True, "") if this job now holds the lease, else (False, who holds it)."""
    for _ in range(20):
        if lock != "busy" and _create(run_dir, me):
            return True, ""
        old = read_lease(run_dir)
        if old is None:
            if lock == "busy":
                return False, "another process (no lease file yet)"
            continue                               # released meanwhile: try again
        p = plan(lock, old, me, stale_s)
        who = describe(old, time.time())
        if p.action == "busy":
            return False, who
        if p.action == "watch":
            warn(f"[hpcrl] run directory {run_dir}: watching the lease of {who} for up to "
                 f"{p.watch_s:.0f} s", flush=True)
            if not _unchanged_for(run_dir, old, p.watch_s):
                return False, describe(read_lease(run_dir) or old, time.time())
        if _break(run_dir, old, me):
            warn(f"[hpcrl] run directory {run_dir}: taking over the lease of {who}: {p.note}",
                 flush=True)
            return True, ""
    return False, "other jobs taking it over at the same time"


def _unchanged_for(run_dir: Path, old: dict, watch_s: float) -> bool:
    """Whether the lease keeps ``old``'s token and beat for ``watch_s`` (this host's clock)."""
    end = time.monotonic() + watch_s
    while time.monotonic() < end:
        time.sleep(WATCH_POLL_S)
        cur = read_lease(run_dir)
        if cur is None or _key(cur) != _key(old):
            return False
    return True


def _break(run_dir: Path, old: dict, me: dict) -> bool:
    """Replace the stale lease ``old`` with this job's. Only the job that creates the marker
    named by ``old``'s token may; it re-checks ``old`` under the marker, so a lease that beat
    or changed hands meanwhile is left alone. A marker left by a breaker that died is removed
    after a second look finds the same one."""
    marker = run_dir / (BREAK_PREFIX + hashlib.sha256(repr(_key(old)).encode()).hexdigest()[:16])
    if not _link_new(marker, me):
        try:
            first = marker.stat().st_ino
            time.sleep(1.0)
            if marker.stat().st_ino == first and _key(read_lease(run_dir) or {}) == _key(old):
                _unlink(marker)                   # its maker died half-way
        except OSError:
            pass
        return False
    try:
        cur = read_lease(run_dir)
        if cur is not None and _key(cur) != _key(old):
            return False
        _unlink(run_dir / LEASE_NAME)
        if not _create(run_dir, me):
            return False
        if _token_ok(old.get("token")):
            _unlink(_beat_path(run_dir, old["token"]))
        return True
    finally:
        _unlink(marker)


def _create(run_dir: Path, me: dict) -> bool:
    """Create the lease file as this job's if none exists (atomic, also on NFS)."""
    return _link_new(run_dir / LEASE_NAME, me)


def _link_new(path: Path, content: dict) -> bool:
    """Create ``path`` holding ``content`` (JSON) only if it does not exist: the complete file
    is written under a private name, then hard-linked (``link`` never replaces)."""
    tmp = path.with_name(f"{path.name}.{content['token']}.tmp")
    try:
        _write_file(tmp, content)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        _unlink(tmp)


def _write_json(path: Path, content: dict) -> None:
    """Replace ``path`` atomically (a private temporary file, then ``rename``)."""
    tmp = path.with_name(f"{path.name}.{content['token']}.tmp")
    try:
        _write_file(tmp, content)
        os.replace(tmp, path)
    except OSError:
        _unlink(tmp)                  # a full disk: leave nothing behind
        raise


def _write_file(path: Path, content: dict) -> None:
    with open(path, "w") as fh:
        fh.write(json.dumps(content) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


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
    """'held', 'busy' or 'unsupported' (a file system without flock, or simulated one)."""
    if hooks.flock_disabled():
        return "unsupported"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return "busy"
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            return "unsupported"
        raise
    return "held"


def _token_ok(token) -> bool:
    """Whether ``token`` (read from disk) is one :func:`identity` makes, safe in a file name."""
    return isinstance(token, str) and 0 < len(token) <= 64 and \
        all(c in "0123456789abcdef" for c in token)


def _beat_path(run_dir: Path, token: str) -> Path:
    return run_dir / f"{BEAT_PREFIX}{token}.json"


def read_lease(run_dir: Path) -> dict | None:
    """The lease file's holder (JSON, nothing executed) with its latest beat and heartbeat
    from the holder's beat file where there is one; None only if there is no lease file.
    An unparsable file is ``{"corrupt": True, "digest": ...}`` (a holder judged by watching
    it). Any other error (ESTALE, EIO, EACCES) raises OSError: it says nothing about a
    holder."""
    try:
        raw = (run_dir / LEASE_NAME).read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return {"corrupt": True, "digest": hashlib.sha256(raw).hexdigest()}
    if _token_ok(data.get("token")):
        try:
            beat = json.loads(_beat_path(run_dir, data["token"]).read_bytes())
        except (FileNotFoundError, ValueError):   # no beat yet, or an earlier version's lease
            beat = None
        if isinstance(beat, dict) and beat.get("token") == data["token"]:
            data.update({k: beat[k] for k in ("beat", "heartbeat") if k in beat})
    return data
