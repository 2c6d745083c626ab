#!/usr/bin/env bash
# Repeat a CartPole learning run N times with different seeds and report, for each, the global
# frame at which the mean of the last 20 episodes first reached 195 (or "never"): evaluation
# episodes where the run evaluates (the value methods' configs), training episodes otherwise.
# Usage: scripts/repeat_cartpole.sh CONFIG N [OUT_DIR] [extra --set args...]
#   e.g. scripts/repeat_cartpole.sh configs/n_step_q_cartpole.toml 10 /tmp/nq --set early_stop=true
# Seeds are SEED0, SEED0 + 1, ... (SEED0 defaults to 0).
set -u
config=$1; n=$2; out=${3:-/tmp/repeat_cartpole}; shift 3 || shift $#
mkdir -p "$out"
seed0=${SEED0:-0}
for seed in $(seq "$seed0" $((seed0 + n - 1))); do
    t0=$(date +%s)
    mpiexec -n 4 python -m hpcrl.run --config "$config" --set seed=$seed \
        --set run_dir="$out/seed-$seed" "$@" > "$out/seed-$seed.log" 2>&1
    rc=$?
    python - "$out/seed-$seed/metrics.h5" "$seed" "$rc" "$(( $(date +%s) - t0 ))" <<'PY'
import sys
import numpy as np
from hpcrl.io.metrics import read_metrics
path, seed, rc, wall = sys.argv[1:]
m = read_metrics(path)
kind = "eval" if len(m["eval"]["return"]) else "episodes"
r, f = m[kind]["return"], m[kind]["frames"]
sums = np.convolve(r, np.ones(20), "valid") if len(r) >= 20 else np.array([])
hit = np.flatnonzero(sums >= 195 * 20)        # sums of integer returns are exact
roll = sums / 20
reached = int(f[hit[0] + 19]) if hit.size else "never"
print(f"seed {seed}: exit {rc}, {kind}: reached 195 at frame {reached}, final mean(20) "
      f"{roll[-1] if roll.size else float('nan'):.1f}, episodes {len(r)}, wall {wall} s", flush=True)
PY
done
