"""Launch real MPI jobs from tests: mpiexec from the same environment as this Python."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


#: The environment variable that holds a rank's number, by launcher (hydra, PMIx/Open MPI).
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")


def mpi_flavour() -> str:
    """"openmpi" or "mpich": which MPI the tests' mpiexec launches (asked once, without
    initialising MPI in the test process)."""
    global _FLAVOUR
    if _FLAVOUR is None:
        out = subprocess.run([mpiexec_path(), "--version"], capture_output=True, text=True)
        _FLAVOUR = "openmpi" if "Open MPI" in out.stdout + out.stderr or "prte" in (
            out.stdout + out.stderr).lower() else "mpich"
    return _FLAVOUR


_FLAVOUR: str | None = None


def stop_signal() -> int:
    """The signal that makes a job checkpoint and exit 85 when sent to its launcher: SIGTERM
    for MPICH's hydra (it forwards it); Open MPI's mpirun ends the ranks itself on SIGTERM and
    forwards only SIGUSR1/SIGUSR2."""
    import signal

    return signal.SIGUSR1 if mpi_flavour() == "openmpi" else signal.SIGTERM


def job_reported(run_dir: Path, frames: int = 1) -> bool:
    """Whether a running job's metrics.h5 already has a progress row of >= ``frames`` frames
    (launcher-agnostic: Open MPI holds a rank's partial stdout lines back)."""
    from hpcrl.io.metrics import read_metrics

    try:
        train = read_metrics(run_dir / "metrics.h5")["train"]
    except Exception:   # noqa: BLE001 - not created yet
        return False
    return len(train["frames"]) > 0 and int(train["frames"][-1]) >= frames


def wait_until_reported(job: subprocess.Popen, run_dir: Path, timeout_s: float = 60) -> None:
    """Block until the running ``job`` has written a progress row to ``run_dir``'s metrics."""
    deadline = time.monotonic() + timeout_s
    while not job_reported(run_dir):
        assert job.poll() is None and time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)


def wait_until_ranks_played(job: subprocess.Popen, run_dir: Path, ranks: set[int],
                            timeout_s: float = 120) -> None:
    """Block until the running ``job`` has recorded a training episode of each of ``ranks``:
    they have started (built their workers) and run. A rank still starting up is waited for
    longer at a checkpoint than one that runs (``STARTUP_WATCHDOG_SHARE``)."""
    from hpcrl.io.metrics import read_metrics

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            seen = set(read_metrics(run_dir / "metrics.h5")["episodes"]["rank"].tolist())
        except Exception:   # noqa: BLE001 - not created yet
            seen = set()
        if ranks <= seen:
            return
        assert job.poll() is None and time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)


def mpiexec_path() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


# Open MPI's launcher sometimes fails to start its PMIx server before any rank runs (a known
# intermittent launch failure of Open MPI on CI machines, e.g. lfortran/lfortran#8610): the
# job never started, so the launch is retried; nothing a rank does can print this.
LAUNCHER_FAILURES = ("The PMIx server's listener thread failed to start",)
LAUNCH_ATTEMPTS = 3


def launcher_failed(proc: subprocess.CompletedProcess) -> bool:
    """Whether the launcher itself failed before starting the job (see LAUNCHER_FAILURES)."""
    return proc.returncode != 0 and any(m in (proc.stdout or "") + (proc.stderr or "")
                                        for m in LAUNCHER_FAILURES)


def run_mpi(n: int, args: list[str], timeout: float = 120, cwd: Path | str = ROOT,
            env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``mpiexec -n n python ARGS``; returns (completed process, wall seconds of the
    launch that ran the job).

    A hang is a failure: the whole process group is killed at ``timeout``. A launch that the
    launcher itself failed to start (:func:`launcher_failed`) is retried, up to
    ``LAUNCH_ATTEMPTS`` launches in all.
    """
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    for _ in range(LAUNCH_ATTEMPTS):
        t0 = time.monotonic()
        proc = subprocess.run([mpiexec_path(), "-n", str(n), sys.executable, *args], cwd=cwd,
                              env=full_env, capture_output=True, text=True, timeout=timeout)
        if not launcher_failed(proc):
            break
    return proc, time.monotonic() - t0


#: Seconds after a launch within which the launcher fails, if it does (see LAUNCHER_FAILURES).
LAUNCH_CHECK_S = 2.0


def start_mpi(cmd: list[str], env: dict, err_path: Path,
              out_path: Path | None = None) -> subprocess.Popen:
    """Start ``cmd`` (an mpiexec command line) in the background, its stderr into ``err_path``
    and its stdout into ``out_path`` (the same file when they are equal; discarded if None).
    A launch that the launcher itself failed to start (a LAUNCHER_FAILURES line within
    LAUNCH_CHECK_S) is retried, up to LAUNCH_ATTEMPTS launches in all, as :func:`run_mpi`
    does for the jobs it runs to the end."""
    for _ in range(LAUNCH_ATTEMPTS):
        with contextlib.ExitStack() as files:
            err = files.enter_context(open(err_path, "w"))
            if out_path == err_path:                     # one file: stderr joins stdout
                out, err = err, subprocess.STDOUT
            else:
                out = (subprocess.DEVNULL if out_path is None
                       else files.enter_context(open(out_path, "w")))
            job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        try:
            job.wait(timeout=LAUNCH_CHECK_S)
        except subprocess.TimeoutExpired:
            return job                                   # running
        text = Path(err_path).read_text(errors="replace")
        if job.returncode == 0 or not any(m in text for m in LAUNCHER_FAILURES):
            return job
    return job


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
        if any(f"{var}={rank}".encode() in env for var in RANK_VARS):
            return p
    raise LookupError(f"no rank {rank} under pid {launcher_pid}")


@contextlib.contextmanager
def small_tmpfs(path: Path, size_mb: int):
    """A tmpfs of ``size_mb`` mounted at ``path`` for the block (a real small disk that fills
    up); the test is skipped, with the reason, where it cannot be mounted (not root, no mount
    permission in a container)."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                          capture_output=True, text=True) if shutil.which("mount") else None
    if proc is None or proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (" + (proc.stderr.strip()[:200] if proc else
                                                     "no mount command") + ")")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(path: Path) -> Path:
    """Fill the file system of ``path`` to the last byte with one file; returns the file."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for size in (1 << 20, 1 << 12, 1):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


class RecordsOutputs:
    """Mixin for an actor-critic policy class: keeps the network output it acted on at each
    step (logits, or a Gaussian's means and variances) in ``outputs``, to compare with the
    learner's unroll."""

    def __init__(self, *args):
        super().__init__(*args)
        self.outputs = []

    def act(self, obs):
        import torch

        with torch.no_grad():
            out, _, _ = self.net(torch.from_numpy(obs), self.state)
        self.outputs.append(out.numpy())
        return super().act(obs)
