"""The SLURM array scripts (slurm/*.sh): static checks and dry runs always; a real job array on a
single-node SLURM (scripts/slurm_local.sh, run by .ci/run) when sbatch, squeue and sinfo answer.

The requeue path (SIGUSR1 -> checkpoint -> exit 85 -> scontrol requeue -> resume) is tested in
tests/test_slurm_requeue.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrl.games import A3C_57, GORILA_49
from hpcrl.io.metrics import read_metrics
from tests.util import ROOT

SCRIPTS = ["slurm/common.sh", "slurm/gorila_49games.sh", "slurm/a3c_57games.sh",
           "scripts/slurm_local.sh", "scripts/run_paper_layout.sh"]
ARRAY_TIMEOUT_S = 210.0   # three tiny Atari runs, one at a time, on 2 shared cores: ~100 s


def _slurm_unavailable_reason() -> str | None:
    """Why the live SLURM test cannot run here, or None when it can."""
    missing = [tool for tool in ("sbatch", "squeue", "sinfo", "scancel") if shutil.which(tool) is None]
    if missing:
        return f"no SLURM here ({', '.join(missing)} not on PATH; CI starts one with scripts/slurm_local.sh)"
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                              timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s (slurmctld not running?)"
    states = proc.stdout.split()
    if proc.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mix", "alloc") for s in states):
        return (f"SLURM does not answer or has no usable node (sinfo exit {proc.returncode}, "
                f"states {states}, {proc.stderr.strip()[:200]!r})")
    return None


_NO_SLURM = _slurm_unavailable_reason()
requires_slurm = pytest.mark.skipif(_NO_SLURM is not None, reason=str(_NO_SLURM))


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without SLURM_* (the tests may run inside a job) plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", HPCRL_ROOT=str(ROOT), HPCRL_PYTHON=sys.executable, **extra)
    return env


def _dry_run(script: str, task_id: int, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120,
                          env=_clean_env(HPCRL_DRY_RUN="1", HPCRL_TASK_ID=str(task_id), **env))


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", script], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_gorila_dry_run_picks_game_layout_and_run_dir(tmp_path):
    proc = _dry_run("slurm/gorila_49games.sh", 2, "--set", "total_frames=1000",
                    HPCRL_RESULTS=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert GORILA_49[2] == "assault"
    assert "game assault (set gorila49, index 2)" in proc.stderr
    assert "world size 130: 30 ps, 100 actor-learner" in proc.stdout      # paper layout default
    assert f"run dir {tmp_path}/gorila/assault/seed-0" in proc.stdout
    command = next(line for line in proc.stderr.splitlines() if "command:" in line)
    assert "mpiexec -n 130 " in command
    # the user's extra arguments come after the script's --set options, so they win
    assert command.endswith("--set game=assault --set seed=0 --set "
                            f"run_dir={tmp_path}/{{algo}}/{{game}}/seed-{{seed}} --set total_frames=1000")
    assert "dry run: not launching" in proc.stderr
    assert not any(tmp_path.iterdir())                                    # nothing written


def test_a3c_dry_run_alphabetical_set_and_srun_launcher(tmp_path):
    pong = A3C_57.index("pong")
    assert pong == 36                          # sorted alphabetically, unlike the Gorila 49
    proc = _dry_run("slurm/a3c_57games.sh", pong, HPCRL_RESULTS=str(tmp_path),
                    HPCRL_LAUNCHER="srun", HPCRL_SEED="3")
    assert proc.returncode == 0, proc.stderr
    assert "game pong (set a3c57, index 36)" in proc.stderr
    assert "world size 20: 4 ps, 16 actor-learner" in proc.stdout         # A3C's 16 threads
    assert f"run dir {tmp_path}/a3c/pong/seed-3" in proc.stdout
    assert "command: srun --mpi=pmi2 --kill-on-bad-exit=1 " in proc.stderr


def test_seeds_per_game_pick_game_and_seed_from_the_index(tmp_path):
    # HPCRL_SEEDS=3, index 51 = 49 + 2: the third game, seed 5 + 1
    proc = _dry_run("slurm/gorila_49games.sh", 51, HPCRL_RESULTS=str(tmp_path),
                    HPCRL_SEEDS="3", HPCRL_SEED="5")
    assert proc.returncode == 0, proc.stderr
    assert f"game {GORILA_49[2]} (set gorila49, index 51)" in proc.stderr
    assert f"run dir {tmp_path}/gorila/{GORILA_49[2]}/seed-6" in proc.stdout
    proc = _dry_run("slurm/gorila_49games.sh", 147, HPCRL_SEEDS="3")
    assert proc.returncode == 2 and "out of range for gorila49 with 3 seeds" in proc.stderr


def test_hpcrl_games_runs_another_set_with_the_same_script(tmp_path):
    """HPCRL_GAMES=atari5 (sbatch --array=0-4): index 4 is qbert, the fifth Atari-5 game; an
    index past the set is refused with its range."""
    proc = _dry_run("slurm/a3c_57games.sh", 4, HPCRL_RESULTS=str(tmp_path), HPCRL_GAMES="atari5")
    assert proc.returncode == 0, proc.stderr
    assert "game qbert (set atari5, index 4)" in proc.stderr
    assert f"run dir {tmp_path}/a3c/qbert/seed-0" in proc.stdout
    proc = _dry_run("slurm/gorila_49games.sh", 5, HPCRL_GAMES="atari5")
    assert proc.returncode == 2 and "out of range for atari5 (0..4)" in proc.stderr


# The scripts' own signal, exit-status and requeue functions, with a launcher that exits as
# hpcrl.run does and a stand-in `scontrol` that records the requeue.
_STOP_HARNESS = r"""
source slurm/common.sh
scontrol() { echo "scontrol $*"; }
SLURM_JOB_ID=42 HPCRL_REQUEUE=1 HPCRL_STOP_REQUESTED=0 HPCRL_FIRST_SIGNAL=
trap 'hpcrl_on_signal USR1' USR1
trap 'hpcrl_on_signal TERM' TERM
echo ready
hpcrl_run_forwarding bash -c "trap 'exit $1' USR1 TERM; sleep 30 >/dev/null 2>&1 & wait"
rc=$?
case "$rc" in
    85) hpcrl_requeue ;;
    3|4) hpcrl_log "status $rc: not requeueing" ;;
esac
exit "$rc"
"""


@pytest.mark.parametrize("sig, status, requeued, exit_status", [
    ("USR1", 85, True, 0),        # SLURM's warning before the time limit: requeue
    ("TERM", 85, False, 85),      # a user's scancel: checkpointed, not requeued
    ("USR1", 3, False, 3),        # checkpoints failed: never requeued
    ("USR1", 4, False, 4),        # another job holds the run directory
])
def test_stop_signal_and_exit_status_decide_the_requeue(sig, status, requeued, exit_status):
    proc = subprocess.Popen(["bash", "-c", _STOP_HARNESS, "harness", str(status)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    proc.send_signal(getattr(__import__("signal"), f"SIG{sig}"))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == exit_status, out + err
    assert ("scontrol requeue 42" in out) is requeued, out + err
    if sig == "TERM":
        assert "stopped by SIGTERM (scancel)" in err


def test_bad_index_and_bad_launcher_fail_with_a_reason():
    proc = _dry_run("slurm/gorila_49games.sh", 49)
    assert proc.returncode == 2
    assert "index 49 out of range for gorila49 (0..48)" in proc.stderr
    proc = _dry_run("slurm/gorila_49games.sh", 0, HPCRL_LAUNCHER="mpirun")
    assert proc.returncode == 2
    assert "HPCRL_LAUNCHER must be mpiexec or srun" in proc.stderr


def _wait_for_job(job_id: str, timeout_s: float) -> bool:
    """Polls squeue until the job (all array tasks) has left the queue; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i %T"],
                              capture_output=True, text=True, timeout=30)
        # squeue exits non-zero with "Invalid job id" once a finished job has been purged.
        if not proc.stdout.strip():
            return True
        time.sleep(2)
    return False


def _logs(log_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(log_dir.glob("*.out")))


@requires_slurm
@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_gorila_array_three_games_on_slurm(tmp_path):
    """sbatch the Gorila array script for tasks 0-2 with a tiny budget on 2 ranks (1 ps + 1
    bundle); each task must train its own game (alien, amidar, assault) to the end."""
    results, logs = tmp_path / "results", tmp_path / "logs"
    logs.mkdir()
    cmd = ["sbatch", "--parsable", "--array=0-2%1", "--ntasks=2", "--overcommit",
           "--time=15", "--signal=B:USR1@30", "--job-name=hpcrl-test-gorila",
           f"--output={logs}/%x_%A_%a.out", "slurm/gorila_49games.sh",
           "--set", "n_ps=1", "--set", "total_frames=2000", "--set", "replay_min_fill=100",
           "--set", "replay_capacity=1000", "--set", "eval_every_frames=0",
           "--set", "final_eval_episodes=0",   # 30 Atari episodes of an untrained net: minutes
           "--set", "checkpoint_every_min=0", "--set", "log_every_s=2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=_clean_env(HPCRL_RESULTS=str(results)))
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    try:
        finished = _wait_for_job(job_id, ARRAY_TIMEOUT_S)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    assert finished, f"array job {job_id} still queued after {ARRAY_TIMEOUT_S} s\n{_logs(logs)}"

    for index, game in enumerate(["alien", "amidar", "assault"]):
        log = logs / f"hpcrl-test-gorila_{job_id}_{index}.out"
        assert log.exists(), _logs(logs)
        text = log.read_text()
        assert f"game {game} (set gorila49, index {index})" in text, text[-3000:]
        assert "launcher exited with status 0" in text, text[-3000:]
        metrics = read_metrics(results / "gorila" / game / "seed-0" / "metrics.h5")
        assert metrics["attrs"]["game"] == game
        assert metrics["attrs"]["algo"] == "gorila"
        assert metrics["status"] == "finished", text[-3000:]
        assert metrics["train"]["frames"].size > 0 and metrics["train"]["frames"][-1] >= 2000
