#!/usr/bin/env bash
# Run the Gorila paper layout (130 ranks: 30 parameter servers + 100 actor/learner bundles,
# configs/gorila_paper.toml) on this machine, oversubscribed, with CartPole and a small MLP and a
# budget of a few thousand frames, and measure what it costs:
#   * peak of the summed RSS of every process of the job (mpiexec and all its descendants),
#     sampled every 0.5 s from /proc. RSS counts shared pages (torch's libraries, the page cache of
#     the same .so files) once per process, so it overstates the machine's use;
#   * peak of the summed PSS (shared pages divided among their users; /proc/PID/smaps_rollup),
#     sampled every 2 s: what the job really holds;
#   * peak drop of MemAvailable below its value at the start (includes other users' changes);
#   * wall time and the exit status of mpiexec.
# Safety: if MemAvailable falls below GUARD_GIB (default 1.0), the job's process group is killed
# and the script says so (exit 3), so that a layout that does not fit cannot take the machine down.
#
# Usage: scripts/run_paper_layout.sh [extra --set args ...]
# Environment: RANKS (130), FRAMES (6000), OUT (/tmp/hpcrl_paper_layout), PYTHON (.venv/bin/python
# of the repo), MPIEXEC (next to PYTHON), GUARD_GIB (1.0), INTERVAL_S (0.5).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=$(command -v python3)
MPIEXEC=${MPIEXEC:-$(dirname "$PYTHON")/mpiexec}
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec)
RANKS=${RANKS:-130}
FRAMES=${FRAMES:-6000}
OUT=${OUT:-/tmp/hpcrl_paper_layout}
mkdir -p "$OUT"
rm -rf "$OUT/run"

cmd=("$MPIEXEC" -n "$RANKS" "$PYTHON" -m hpcrl.run --config configs/gorila_paper.toml
     --set game=CartPole-v1 --set network=mlp --set "total_frames=$FRAMES"
     --set replay_min_fill=32 --set replay_capacity=2000 --set eval_every_frames=0
     --set checkpoint_every_min=0 --set log_every_s=10 --set "run_dir=$OUT/run" "$@")
echo "run_paper_layout: ${cmd[*]}" >&2
echo "run_paper_layout: log in $OUT/job.log" >&2

OMP_NUM_THREADS=1 exec "$PYTHON" - "$OUT/job.log" "${GUARD_GIB:-1.0}" "${INTERVAL_S:-0.5}" \
    "${cmd[@]}" <<'PY'
import os
import signal
import subprocess
import sys
import time

log_path, guard_gib, interval_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
cmd = sys.argv[4:]
GIB = 1024.0 ** 3
PAGE = os.sysconf("SC_PAGE_SIZE")


def mem_available() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024.0
    return float("nan")


def descendants(root: int) -> list[int]:
    """root and every process below it, from the ppid field of /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def rss_bytes(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * PAGE
        except OSError:
            pass
    return float(total)


def pss_bytes(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return float(total)


avail0 = mem_available()
t0 = time.monotonic()
with open(log_path, "w") as log:
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    peak_rss = peak_pss = peak_drop = 0.0
    peak_procs = 0
    last_pss = 0.0
    guard_hit = False
    while job.poll() is None:
        pids = descendants(job.pid)
        peak_procs = max(peak_procs, len(pids))
        peak_rss = max(peak_rss, rss_bytes(pids))
        now = time.monotonic()
        if now - last_pss >= 2.0:
            peak_pss = max(peak_pss, pss_bytes(pids))
            last_pss = now
        avail = mem_available()
        peak_drop = max(peak_drop, avail0 - avail)
        if avail < guard_gib * GIB:
            guard_hit = True
            print(f"run_paper_layout: MemAvailable {avail / GIB:.2f} GiB < {guard_gib} GiB: "
                  "killing the job", file=sys.stderr, flush=True)
            os.killpg(job.pid, signal.SIGKILL)
            break
        time.sleep(interval_s)
    rc = job.wait()
wall = time.monotonic() - t0
print(f"run_paper_layout: exit status {rc}, wall {wall:.1f} s, peak processes {peak_procs}, "
      f"peak summed RSS {peak_rss / GIB:.2f} GiB, peak summed PSS {peak_pss / GIB:.2f} GiB, "
      f"peak MemAvailable drop {peak_drop / GIB:.2f} GiB (of {avail0 / GIB:.2f} GiB available "
      "at start)", flush=True)
sys.exit(3 if guard_hit else rc)
PY
