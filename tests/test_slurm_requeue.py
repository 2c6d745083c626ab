"""The SLURM requeue path end to end (docs/cluster.md), on a single-node SLURM
(scripts/slurm_local.sh; skipped with the reason when sbatch, squeue and sinfo do not answer):

    --signal=B:USR1@<s> -> batch shell forwards SIGUSR1 to mpiexec -> every rank -> coordinated
    checkpoint -> exit 85 -> `scontrol requeue` -> next start resumes from the run directory

One array task (alien) of slurm/gorila_49games.sh on 2 ranks (1 ps + 1 bundle) with a frame
budget that one start cannot spend before the signal. What the timings rest on (measured here):

- SLURM sends the --signal warning from a 30 s periodic check that may fire up to 30 s before
  `time limit - lead`: with --time=4 --signal=B:USR1@170 the first start is signalled 40-70 s
  after it began (seen: 51 s), later starts about 55 s after theirs. A start needs about 15 s
  (pre-flight, torch import, MPI start) before its ranks handle SIGUSR1, so the signal must not
  come earlier (a signal before the launch ends the task with status 1, by design of
  slurm/common.sh; one during rank start-up would kill the ranks).
- A requeued job waits about 2 minutes (reason BeginTime: SLURM's credential expiry + 1 s), so
  the test runs `scontrol update JobId=<id> StartTime=now`, but only 2 s after it saw the job
  pending: a restart allocated within the same second as the requeue is refused by slurmd ("Job
  credential revoked"; seen here: the task then ends with status 1 and leaves the queue).
- 2 ranks on alien run at very different rates from one machine (and one version of the code)
  to the next: 55-130 frames/s on a loaded 2-core machine, ~1,300 frames/s on an idle one, so
  SLURM's timed signal (40-70 s in) may come long after a first start has spent any budget
  that a slow machine can finish within the test's limit. So the test also sends the same
  signal itself, the way B: does (`scancel --batch --signal=USR1`), as soon as the first
  start's log shows a frames line (its ranks are past start-up and handle SIGUSR1): the first
  start is always signalled a few seconds into learning, whichever signal comes first, and
  the budget of 16,000 frames is several times what a fast machine spends by then. Which of
  the two signalled the first start is in the failure messages and the -s output.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from hpcrl.io import checkpoint as ck
from hpcrl.io.metrics import read_metrics
from tests.test_slurm import _clean_env, _slurm_unavailable_reason
from tests.util import ROOT

TOTAL_FRAMES = 16_000       # several times what a first start runs before the test's signal
JOB_TIMEOUT_S = 260.0       # seen: 72-90 s for two starts, 145 s for three (at 7,000 frames)
REQUEUE_SETTLE_S = 2.0      # wait after a requeue before StartTime=now (credential revocation)
POLL_S = 0.5

_NO_SLURM = _slurm_unavailable_reason()

_FRAMES_LINE = re.compile(r"^\[hpcrl\] frames\s+([\d,]+) \|", re.M)
_CKPT_LINE = re.compile(r"^\[hpcrl\] checkpoint generation (\d+) at frame ([\d,]+): .*"
                        r", ([\d.]+) s after the signal$", re.M)
_RESUME_LINE = re.compile(r"^\[hpcrl\] resuming from checkpoint generation (\d+) "
                          r"at frame ([\d,]+)$", re.M)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _squeue(job_id: str) -> list[tuple[str, str, str]]:
    """(job id, state, reason) of every queue entry of the job; [] once it has left."""
    proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r"],
                          capture_output=True, text=True, timeout=30)
    # squeue exits non-zero with "Invalid job id" once a finished job has been purged.
    return [tuple(line.split("|")) for line in proc.stdout.splitlines() if line.strip()]


class RequeueDriver:
    """Polls one job until it leaves the queue: restarts it at once after each requeue, and
    signals its first start itself once that start logs frames, unless SLURM already has."""

    def __init__(self, job_id: str, log: Path):
        self.job_id, self.log = job_id, log
        self.pending_since: float | None = None
        self.start_time_updates = 0
        self.guard_fired_at: int | None = None
        self.states: list[str] = []

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def _kick_requeued(self, entries) -> None:
        begin = [e for e in entries if e[1] == "PENDING" and e[2] == "BeginTime"]
        if not begin:
            self.pending_since = None
            return
        now = time.monotonic()
        if self.pending_since is None:
            self.pending_since = now
        elif now - self.pending_since >= REQUEUE_SETTLE_S:
            for entry_id, _, _ in begin:
                subprocess.run(["scontrol", "update", f"JobId={entry_id}", "StartTime=now"],
                               capture_output=True, timeout=30)
            self.start_time_updates += 1
            self.pending_since = now          # again in REQUEUE_SETTLE_S if it did not start

    def _guard_first_start(self) -> None:
        if self.guard_fired_at is not None:
            return
        text = self.text()
        if "received SIGUSR1" in text or "restart 1," in text:
            self.guard_fired_at = -1          # SLURM signalled first start itself: guard retired
            return
        frames = [_int(m) for m in _FRAMES_LINE.findall(text)]
        if frames:
            subprocess.run(["scancel", "--batch", "--signal=USR1", self.job_id],
                           capture_output=True, timeout=30)
            self.guard_fired_at = frames[-1]

    def run(self, timeout_s: float) -> bool:
        """True once the job has left the queue, False at the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            entries = _squeue(self.job_id)
            if not entries:
                return True
            state = ",".join(f"{s}/{r}" for _, s, r in entries)
            if not self.states or self.states[-1] != state:
                self.states.append(state)
            self._kick_requeued(entries)
            if any(s == "RUNNING" for _, s, _ in entries):
                self._guard_first_start()
            time.sleep(POLL_S)
        return False

    def summary(self) -> str:
        source = ("not needed (SLURM's --signal came first)" if self.guard_fired_at == -1
                  else "never armed" if self.guard_fired_at is None
                  else f"test sent SIGUSR1 at {self.guard_fired_at:,} frames")
        return (f"job {self.job_id}: states {' -> '.join(self.states)}; StartTime=now updates "
                f"{self.start_time_updates}; first-start guard: {source}")


@pytest.mark.skipif(_NO_SLURM is not None, reason=str(_NO_SLURM))
@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_gorila_task_is_signalled_checkpoints_requeues_and_resumes(tmp_path):
    results, logs = tmp_path / "results", tmp_path / "logs"
    logs.mkdir()
    cmd = ["sbatch", "--parsable", "--array=0", "--ntasks=2", "--overcommit",
           "--time=4", "--signal=B:USR1@170", "--job-name=hpcrl-test-requeue",
           f"--output={logs}/%x_%A_%a.out", "slurm/gorila_49games.sh",
           "--set", "n_ps=1", "--set", f"total_frames={TOTAL_FRAMES}",
           "--set", "replay_capacity=2000", "--set", "replay_min_fill=200",
           "--set", "eval_every_frames=0", "--set", "checkpoint_every_min=0",
           "--set", "final_eval_episodes=0",   # 30 Atari episodes of an untrained net: minutes
           "--set", "log_every_s=1"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=_clean_env(HPCRL_RESULTS=str(results)))
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    driver = RequeueDriver(job_id, logs / f"hpcrl-test-requeue_{job_id}_0.out")
    try:
        finished = driver.run(JOB_TIMEOUT_S)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    text = driver.text()
    why = f"{driver.summary()}; {time.monotonic() - t0:.0f} s\n{text[-6000:]}"
    assert finished, f"job still queued after {JOB_TIMEOUT_S:.0f} s: {why}"

    # The log (appended to across starts): signal, checkpoint after it, requeue, resume, end.
    assert "received SIGUSR1: forwarding to the launcher" in text, why
    after_signal = [(int(g), _int(f)) for g, f, _ in _CKPT_LINE.findall(text)]
    assert after_signal, f"no checkpoint written after a signal: {why}"
    assert "launcher exited with status 85" in text, why
    assert f"requeueing job {job_id}" in text, why
    resumes = [(int(g), _int(f)) for g, f in _RESUME_LINE.findall(text)]
    assert resumes, f"no start resumed from a checkpoint: {why}"
    # every resume starts from the generation (and frame) written on the signal before it
    assert set(resumes) <= set(after_signal), why
    exits = re.findall(r"launcher exited with status (\d+) after", text)
    assert exits[-1:] == ["0"] and set(exits) <= {"0", "85"}, (exits, why)

    run_dir = results / "gorila" / "alien" / "seed-0"
    metrics = read_metrics(run_dir / "metrics.h5")
    assert metrics["status"] == "finished", why
    assert metrics["attrs"]["num_starts"] >= 2, why
    assert metrics["attrs"]["num_starts"] == len(resumes) + 1, why
    train_frames = metrics["train"]["frames"]
    assert train_frames.size > 0 and train_frames[-1] >= TOTAL_FRAMES, why
    # The rows of the preempted start after its checkpoint were rolled back on resume: the
    # frame counter never goes back across a restart boundary.
    assert np.all(np.diff(train_frames) >= 0), (train_frames, why)
    episode_frames = metrics["episodes"]["frames"]
    assert np.all(np.diff(episode_frames) >= 0), (episode_frames, why)   # one actor: in order

    ckpt_root = run_dir / "checkpoints"
    gens = ck.generations(ckpt_root)
    assert gens, why
    manifests = {gen: ck.verify(ckpt_root, gen) for gen in gens}     # raises if damaged
    assert max(gens) > max(g for g, _ in after_signal), "no final generation at the budget"
    assert manifests[max(gens)]["frames"] >= TOTAL_FRAMES, why
    print(driver.summary(), f"; {time.monotonic() - t0:.0f} s; starts "
          f"{metrics['attrs']['num_starts']}; resumes {resumes}", flush=True)
