"""The raw bound of a job benchmark: what the machine's cores emulate when they do nothing
else. Every core runs one process of ALE alone (the job's game, random actions of its minimal
set, a reset at game over, no preprocessing, no network), all at the same time, and their
emulator frames/s are summed. A job's frames/s over this is ``raw_fraction``: the share of the
machine's raw emulation that the job turns into training, measured in the same run as the
job, so that a slow day moves both alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

#: Emulator frames between two looks at the clock.
FRAMES_PER_CHECK = 1000


def ale_loop(game: str, seconds: float, seed: int) -> dict:
    """Emulator frames/s of this process for ``seconds``: ALE alone (see the module
    docstring)."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", seed)
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(str(ale_py.roms.get_rom_path(game)))
    actions = ale.getMinimalActionSet()
    rng = np.random.default_rng(seed)
    frames, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for a in rng.integers(len(actions), size=FRAMES_PER_CHECK).tolist():
            ale.act(actions[a])
            if ale.game_over():
                ale.reset_game()
        frames += FRAMES_PER_CHECK
    return {"frames_per_s": frames / (time.perf_counter() - t0)}


def n_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def concurrent_raw_frames(game: str, seconds: float, n_procs: int | None = None) -> float:
    """Emulator frames/s of ``n_procs`` (default: every core) :func:`ale_loop` processes run
    at the same time, summed."""
    code = ("import json, sys; from hpcrl.bench.raw import ale_loop; "
            "print(json.dumps(ale_loop(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))))")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code, game, str(seconds), str(i)],
                              stdout=subprocess.PIPE, text=True, env=env)
             for i in range(n_procs or n_cores())]
    rates = [json.loads(p.communicate()[0].strip().splitlines()[-1])["frames_per_s"]
             for p in procs]
    return float(sum(rates))


def raw_fraction_ceiling(raw_frames_per_s: float, cores: int, frames_per_step: int,
                         network_ms_per_step: float) -> float:
    """The ``raw_fraction`` a job could reach with its network as it is: its environment step
    at the cost of its emulator frames alone (the raw bound's rate per core: no preprocessing,
    no Python around the emulator, no parameter server, no bookkeeping) and the network's
    acting forward and gradient (``network_ms_per_step``, per agent step on one core, as timed
    inside the job) added. The share of such an agent step that is emulation: what the
    network's arithmetic leaves room for on these cores, whatever the rest of the job costs."""
    emulator_ms_per_step = 1e3 * frames_per_step * cores / raw_frames_per_s
    return emulator_ms_per_step / (emulator_ms_per_step + network_ms_per_step)


def raw_figures(job_frames_per_s: float, raws: list[float]) -> dict:
    """The JSON figures: the raw bound (median of its timings around the jobs), each timing,
    and the job's frames/s as a fraction of the bound."""
    raw = float(np.median(raws))
    return {"raw_frames_per_s": raw, "raw_frames_per_s_runs": [round(r, 1) for r in raws],
            "raw_fraction": job_frames_per_s / raw}
