#!/usr/bin/env bash
# Repeat a CartPole learning run N times with different seeds and report, for each, the global
# frame at which the mean of the last 20 training episodes first reached 195 (or "never").
# Usage: scripts/repeat_cartpole.sh CONFIG N [OUT_DIR] [extra --set args...]
set -u
config=$1; n=$2; out=${3:-/tmp/repeat_cartpole}; shift 3 || shift $#
mkdir -p "$out"
for seed in $(seq 0 $((n - 1))); do
    t0=$(date +%s)
    mpiexec -n 4 python -m hpcrl.run --config "$config" --set seed=$seed \
        --set run_dir="$out/seed-$seed" "$@" > "$out/seed-$seed.log" 2>&1
    rc=$?
    python - "$out/seed-$seed/metrics.h5" "$seed" "$rc" "$(( $(date +%s) - t0 ))" <<'PY'
import sys
import numpy as np
from hpcrl.metrics import read_metrics
path, seed, rc, wall = sys.argv[1:]
e = read_metrics(path)["episodes"]
r, f = e["return"], e["frames"]
roll = np.convolve(r, np.ones(20) / 20, "valid") if len(r) >= 20 else np.array([])
hit = np.flatnonzero(roll >= 195)
reached = int(f[hit[0] + 19]) if hit.size else "never"
print(f"seed {seed}: exit {rc}, reached 195 at frame {reached}, final mean(20) "
      f"{roll[-1] if roll.size else float('nan'):.1f}, episodes {len(r)}, wall {wall} s", flush=True)
PY
done
