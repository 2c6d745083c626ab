"""Running a real job for a benchmark: the ``mpiexec`` command, the window of its own metrics
and phase clocks (``HPCRL_PHASE_TIMES_DIR``, :class:`hpcrl.runtime.profiling.PhaseClock`) that
a figure is read from, and the job ended with SIGTERM when the benchmark ends or dies."""

from __future__ import annotations

import time

import numpy as np

from hpcrl.runtime.profiling import PhaseClock

PHASES = PhaseClock.PHASES


def job_command(ranks: int, config: str, run_dir, launcher_args) -> list[str]:
    """mpiexec (the venv's when it has one) running ``config`` on ``ranks`` ranks with an
    endless budget, one metrics row per second, no periodic checkpoint and no periodic
    evaluation (a benchmark times training; the signal that ends it skips the final one)."""
    import sys
    from pathlib import Path

    mpiexec = Path(sys.executable).parent / "mpiexec"
    return [str(mpiexec) if mpiexec.exists() else "mpiexec", *launcher_args, "-n", str(ranks),
            sys.executable, "-m", "hpcrl.run", "--config", config,
            "--set", "total_frames=10000000000", "--set", f"run_dir={run_dir}",
            "--set", "checkpoint_every_min=0", "--set", "log_every_s=1",
            "--set", "eval_every_frames=0"]


def stop_with_parent() -> None:
    """In a benchmark's job launcher, before exec: SIGTERM it when the benchmark process dies
    (killed at a timeout, say), so its job checkpoints and ends instead of running on."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):     # not Linux: the job may outlive a killed benchmark
        pass


def measure_job(algo: str, n_workers: int, seconds: float, warmup: float, run_dir,
                 overrides: list[str] = (), launcher_args: list[str] = ()) -> dict:
    """Run the algorithm's Pong config with 1 ps + ``n_workers`` actor-learners; frames/s over
    the window after ``warmup`` seconds, from the job's own metrics (train rows)."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    from hpcrl.io.metrics import read_metrics

    cmd = [*job_command(n_workers + 1, f"configs/{algo}_pong.toml", run_dir, launcher_args),
           "--set", "n_ps=1",
           "--set", "checkpoint_replay=false"]
    for item in overrides:
        cmd += ["--set", item]
    times = Path(run_dir) / "phase_times"
    env = dict(os.environ, OMP_NUM_THREADS="1", HPCRL_PHASE_TIMES_DIR=str(times))
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           preexec_fn=stop_with_parent)
    # the window starts once every actor-learner writes its phase times: start-up (imports,
    # network, environments) takes seconds on a quiet machine and far longer on a loaded one
    deadline = time.monotonic() + 300
    while len(list(times.glob("rank-*.jsonl"))) < n_workers and time.monotonic() < deadline:
        if job.poll() is not None:
            raise RuntimeError(f"the benchmark job exited with status {job.returncode}")
        time.sleep(0.5)
    time.sleep(warmup + seconds + 1)
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=120)
    train = read_metrics(Path(run_dir) / "metrics.h5")["train"]
    t, f = train["wall_time"], train["frames"]
    start = np.searchsorted(t, t[-1] - seconds)      # the last `seconds` of the run
    return {"frames_per_s": float((f[-1] - f[start]) / max(t[-1] - t[start], 1e-9)),
            "window_s": float(t[-1] - t[start]),
            "phases": [_phase_window(path, seconds) for path in sorted(times.glob("rank-*.jsonl"))],
            "ps": [_ps_window(path, seconds) for path in sorted(times.glob("ps-rank-*.jsonl"))]}


def _window_rows(path, seconds: float) -> tuple[dict, dict]:
    """The first and last rows of a cumulative JSON Lines clock file (rows ``{"t", ...}``)
    that span its last ``seconds`` (at least two rows apart when it has two)."""
    import json

    rows = [json.loads(line) for line in open(path)]
    t = np.array([r["t"] for r in rows])
    first = min(int(np.searchsorted(t, t[-1] - seconds)), len(rows) - 2)
    return rows[max(first, 0)], rows[-1]


def phase_fraction(first: dict, last: dict) -> dict:
    """Agent steps/s between two :class:`PhaseClock` rows, its bound and their ratio."""
    steps = last["agent_steps"] - first["agent_steps"]
    busy = sum(last[f"{k}_s"] - first[f"{k}_s"] for k in PHASES)
    wall = last["t"] - first["t"]
    return {"steps_per_s": steps / wall, "bound_steps_per_s": steps / busy,
            "fraction": busy / wall, "window_s": wall,
            **{f"{k}_ms_per_step": 1e3 * (last[f"{k}_s"] - first[f"{k}_s"]) / steps
               for k in PHASES}}


def _phase_window(path, seconds: float) -> dict:
    """An actor-learner's in-process bound over the last ``seconds`` of its PhaseClock rows."""
    return phase_fraction(*_window_rows(path, seconds))


def _ps_window(path, seconds: float) -> dict:
    """A ps rank's share of one core and its CPU ms per applied gradient over the last
    ``seconds`` (``hpcrl.runtime.profiling.ps_cpu_clock`` rows)."""
    a, b = _window_rows(path, seconds)
    cpu, applied = b["cpu_s"] - a["cpu_s"], b["applied"] - a["applied"]
    return {"cpu_fraction": cpu / max(b["t"] - a["t"], 1e-9),
            "cpu_ms_per_gradient": 1e3 * cpu / max(applied, 1)}


def raw_seconds(seconds: float) -> float:
    """How long each timing of the raw bound runs: a sixth of a job's window, 2 s at least."""
    return max(2.0, seconds / 6)
