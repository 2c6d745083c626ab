"""Chaos test: SIGKILL the whole job at random moments, restart it, check nothing is lost.

    python scripts/chaos.py --kills 20 [--config configs/gorila_cartpole.toml] [--np 4]
        [--total-frames 400000] [--run-dir /tmp/hpcrl-chaos] [--seed 0]

Each round starts ``mpiexec -n NP python -m hpcrl.run`` in its own process group with a
checkpoint every ~1 s, waits a random 6-20 s (start-up, stepping, checkpoint writes alike) and
kills the launcher and every process under it with SIGKILL at once (hydra's proxy and Open
MPI's prterun put the ranks in process groups of their own, so the launcher's group alone
would leave the ranks to a launcher that can no longer clean up). After every kill it checks
that every generation with a manifest is intact (no unreadable checkpoint file) and that the
newest complete generation never moves backwards in frames; after every restart that got as
far as deciding, that the job resumed from the newest complete generation. Finally the job runs
to its budget: it must exit 0, resume from the newest generation, and leave metrics.h5 finished
and holding every episode exactly once. Prints one line per round and a summary; exit status 0
when every check held.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpcrl.io import checkpoint as ck  # noqa: E402
from hpcrl.io.metrics import read_metrics  # noqa: E402
from tests.util import signal_tree  # noqa: E402


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def start(args, log: Path) -> subprocess.Popen:
    cmd = [mpiexec(), "-n", str(args.np), sys.executable, "-m", "hpcrl.run", "--config",
           args.config, "--set", f"run_dir={args.run_dir}", "--set",
           f"total_frames={args.total_frames}", "--set", "checkpoint_every_min=0.02",
           "--set", "log_every_s=1", "--set", f"seed={args.seed}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def newest(root: Path) -> tuple[int, int]:
    """(generation, frames) of the newest complete generation, (0, 0) if none."""
    found = ck.latest_complete(root, warn=lambda m: None)
    return (found[0], found[1]["frames"]) if found else (0, 0)


def check_generations(root: Path) -> None:
    for gen in ck.generations(root):
        if (ck.gen_dir(root, gen) / ck.MANIFEST).exists():
            ck.verify(root, gen)                  # raises on any damaged file


def check_episodes(run_dir: Path) -> None:
    root = run_dir / "checkpoints"
    gen, manifest = ck.latest_complete(root)
    states = [ck.read_state(ck.gen_dir(root, gen) / e["file"]) for e in manifest["files"]]
    total = int(states[0]["hdr/frames"])
    running = sum(int(st[k].sum()) for st in states for k in st
                  if k.endswith("episode_frames_so_far"))
    eps = read_metrics(run_dir / "metrics.h5")["episodes"]
    keys = list(zip(eps["rank"].tolist(), eps["frames"].tolist()))
    if len(keys) != len(set(keys)):
        raise AssertionError("duplicate episodes in metrics.h5")
    if int(eps["length"].sum()) + running != total:
        raise AssertionError(f"episodes + running frames = {int(eps['length'].sum()) + running}"
                             f" != frame counter {total}: episodes missing or doubled")


def check_resumed(text: str, gen: int, what: str) -> None:
    """The job's start-up decision, if it got that far, was to resume from generation ``gen``.

    A kill may land before rank 0 has decided (the job still starting): then there is nothing
    to check. Once decided, it must name the newest complete generation, or say "new
    parameters" only when there was none.
    """
    resumed = re.search(r"resuming from checkpoint generation (\d+)", text)
    fresh = "starting from new parameters" in text
    if not (resumed or fresh):
        return
    got = int(resumed.group(1)) if resumed else 0
    if got != gen:
        raise AssertionError(f"{what}: resumed from generation {got}, not the newest complete "
                             f"generation {gen}:\n" + text[-1500:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--config", default="configs/gorila_cartpole.toml")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--total-frames", type=int, default=400_000)   # outlasts 20 kills
    p.add_argument("--run-dir", default="/tmp/hpcrl-chaos")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-s", type=float, default=6.0)
    p.add_argument("--max-s", type=float, default=20.0)
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    root = run_dir / "checkpoints"
    rng = random.Random(args.seed)
    log = Path(str(run_dir) + ".log")
    prev_gen, prev_frames = newest(root)
    resumes = 0
    for k in range(1, args.kills + 1):
        job = start(args, log)
        wait = rng.uniform(args.min_s, args.max_s)
        time.sleep(wait)
        signal_tree(job.pid, signal.SIGKILL)   # the tree, read before the first kill
        job.wait()
        time.sleep(0.5)                                # let the ranks die
        text = log.read_text()
        check_resumed(text, prev_gen, f"round {k}")
        resumes += "resuming from checkpoint" in text
        check_generations(root)
        gen, frames = newest(root)
        if frames < prev_frames:
            raise AssertionError(f"round {k}: newest complete generation went back from "
                                 f"{prev_frames} to {frames} frames")
        print(f"round {k:>2}: killed after {wait:4.1f} s; newest complete generation {gen} at "
              f"{frames:,} frames (before: {prev_gen} at {prev_frames:,})", flush=True)
        prev_gen, prev_frames = gen, frames
        if frames >= args.total_frames and k < args.kills:
            raise AssertionError(f"round {k}: the run reached its budget of "
                                 f"{args.total_frames:,} frames before the last kill; later "
                                 "kills would only restart a finished run: raise --total-frames")
    job = start(args, log)
    rc = job.wait(timeout=1800)
    text = log.read_text()
    if rc != 0:
        raise AssertionError(f"final run exited {rc}:\n{text[-2000:]}")
    check_resumed(text, prev_gen, "final run")
    status = read_metrics(run_dir / "metrics.h5")["status"]
    if status != "finished":
        raise AssertionError(f"final status {status}")
    check_generations(root)
    check_episodes(run_dir)
    gen, frames = newest(root)
    print(f"chaos: {args.kills} kills, {resumes} resumes, final run exit 0 at {frames:,} frames "
          f"(generation {gen}); every check held", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
