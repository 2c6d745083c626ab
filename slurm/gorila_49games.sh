#!/usr/bin/env bash
#SBATCH --job-name=gorila49
#SBATCH --array=0-48
#SBATCH --ntasks=130
#SBATCH --cpus-per-task=1
#SBATCH --time=2-00:00:00
#SBATCH --signal=B:USR1@900
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x_%A_%a.out
#
# Gorila (Nair et al. 2015) on the 49 games of the Nature DQN paper: one SLURM array task per
# game, each the paper layout of 130 MPI ranks (30 parameter servers + 100 actor/learner
# bundles, configs/gorila_paper.toml). Deviation from the paper: that config runs the update
# rule of configs/gorila_pong.toml (DQN's RMSProp at the ps, 3-step returns, one update per 8
# agent steps, final epsilon 0.01), not the paper's AdaGrad, which has not learned Pong in this
# project; its header names every deviation and the scaling from the 2 bundles the rule was run
# at (validated on Pong at 1 ps + 2 bundles, 3 of 3 seeds at +18 within 12 M frames:
# docs/experiments/gorila-pong.md). Submit from the repository root:
#
#   sbatch slurm/gorila_49games.sh                                  # all 49 games
#   HPCRL_GAMES=atari5 sbatch --array=0-4 slurm/gorila_49games.sh   # the 5 games of Atari-5
#   sbatch --array=32 slurm/gorila_49games.sh --set total_frames=200000000   # pong only
#   sbatch --ntasks=2 --overcommit --array=0-2 slurm/gorila_49games.sh --set n_ps=1 ...
#
# Arguments after the script name go to `python -m hpcrl.run` (after the script's own --set
# game/seed/run_dir, so they win). The array index picks the game:
#   python -m hpcrl.games --set gorila49 --index $SLURM_ARRAY_TASK_ID   (0 = alien, 32 = pong)
# Results: $HPCRL_RESULTS/gorila/<game>/seed-<seed> (default results/...), independent of the job
# id so that a requeued task resumes its run. Log: <job-name>_<array job id>_<index>.out,
# appended to across requeues.
#
# Resources: every #SBATCH line above is overridden by the same sbatch flag on the command line
# (--ntasks, --nodes, --time, --array, --signal ...), partition / account / time limit also by
# SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT. Sizing notes for the paper layout: each
# bundle holds a replay memory of replay_capacity transitions (1 M Atari frames, about 7 GB at
# uint8), so ask for memory per rank where the cluster enforces it (--mem-per-cpu) or lower
# replay_capacity; --nodes is left to SLURM. More tasks than cores (tests on a laptop-sized
# node): add --overcommit. The signal comes 900 s before the time limit: time to checkpoint.
#
# Script settings (environment, see slurm/common.sh for all): HPCRL_CONFIG (default
# configs/gorila_paper.toml), HPCRL_SEED (0), HPCRL_RESULTS (results), HPCRL_PYTHON (.venv/bin/
# python of the repo), HPCRL_LAUNCHER (mpiexec: the mpich wheel's, | srun: cluster MPI via
# srun --mpi=pmi2), HPCRL_ROOT (default: the submit directory), HPCRL_DRY_RUN=1 with
# HPCRL_TASK_ID=N to print task N's game, layout and command without running anything.
#
# Exit status: hpcrl.run's (1 failure, 2 config/layout, 3 checkpoints failed, 4 run directory
# held by another job: none of these is requeued); 85 (checkpoint written after SLURM's
# SIGUSR1) makes the script run `scontrol requeue $SLURM_JOB_ID` and exit 0; after a user's
# scancel (SIGTERM first) it exits 85 without requeueing.
set -uo pipefail

HPCRL_GAME_SET=${HPCRL_GAMES:-gorila49}
HPCRL_DEFAULT_CONFIG=configs/gorila_paper.toml
HPCRL_DEFAULT_NTASKS=130   # keep equal to the --ntasks line above (used by dry runs only)

_hpcrl_root() {
    local job_cmd="" d
    if [ -n "${HPCRL_ROOT:-}" ]; then
        d=$HPCRL_ROOT
        [ -f "$d/slurm/common.sh" ] || { echo "error: HPCRL_ROOT=$d has no slurm/common.sh" >&2; return 1; }
        (cd "$d" && pwd); return
    fi
    # sbatch runs a copy of this script from its spool directory: find the repository through
    # the submit directory or the job's original command path.
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        job_cmd=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.* Command=\([^ ]*\).*/\1/p')
    fi
    for d in "${SLURM_SUBMIT_DIR:-}" "${job_cmd:+$(dirname "$job_cmd")/..}" "$(dirname "${BASH_SOURCE[0]}")/.."; do
        if [ -n "$d" ] && [ -f "$d/slurm/common.sh" ]; then (cd "$d" && pwd); return; fi
    done
    echo "error: cannot find the hpcrl repository (slurm/common.sh); submit from its root or set HPCRL_ROOT" >&2
    return 1
}
HPCRL_ROOT=$(_hpcrl_root) || exit 2
# shellcheck source=slurm/common.sh
. "$HPCRL_ROOT/slurm/common.sh"
hpcrl_array_main "$@"
