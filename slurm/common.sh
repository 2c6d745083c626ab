# Shared logic of the hpcrl SLURM array scripts (slurm/gorila_49games.sh, slurm/a3c_57games.sh).
# Sourced, not run. The calling script sets HPCRL_GAME_SET, HPCRL_DEFAULT_CONFIG and
# HPCRL_DEFAULT_NTASKS, then calls `hpcrl_array_main "$@"`.
#
# One array task = one game = one MPI job:
#   game     = python -m hpcrl.games --set $HPCRL_GAME_SET --index $SLURM_ARRAY_TASK_ID
#   run dir  = $HPCRL_RESULTS/{algo}/{game}/seed-{seed} (hpcrl substitutes the braces), i.e. it
#              does not depend on the job id, so a requeued task resumes the same run.
#   command  = LAUNCHER python -m hpcrl.run --config CONFIG --set game=GAME --set seed=SEED
#              --set run_dir=DIR [extra script arguments, passed through]
#
# Preemption / time limit (docs/cluster.md): the scripts ask for
# `--signal=B:USR1@<s> --requeue --open-mode=append`. B: delivers SIGUSR1 to this batch shell
# only, so the shell forwards it (and SIGTERM) to the launcher, which passes it on to every rank
# (mpich's hydra mpiexec and srun both forward SIGUSR1). A run that wrote a checkpoint on the
# signal exits with 85 (hpcrl.run.EXIT_REQUEUE); the shell then runs
# `scontrol requeue $SLURM_JOB_ID`, and the next start resumes from the run directory.
#
# Environment (all optional):
#   HPCRL_ROOT      repository root (default: $SLURM_SUBMIT_DIR, i.e. submit from the repo root)
#   HPCRL_PYTHON    python with hpcrl installed (default: $HPCRL_ROOT/.venv/bin/python if it
#                   exists, else python3 on PATH)
#   HPCRL_CONFIG    config file, relative to HPCRL_ROOT or absolute (default: per script)
#   HPCRL_SEED      seed (default 0)
#   HPCRL_GAMES     game set of the array (a set of `python -m hpcrl.games`: gorila49, a3c57,
#                   atari5, atari3, atari10; default: per script). atari5 with --array=0-4
#                   runs the five games whose scores estimate the 57-game median
#                   (python -m hpcrl.analyze RESULTS --atari5)
#   HPCRL_SEEDS     seeds per game: array index i runs game i % n with seed HPCRL_SEED + i / n,
#                   so --array=0-146 runs the 49 Gorila games x 3 seeds (default: one seed)
#   HPCRL_RESULTS   results root (default: results, relative to HPCRL_ROOT)
#   HPCRL_LAUNCHER  mpiexec (default: the mpich wheel's hydra mpiexec, which takes the nodes
#                   from the SLURM allocation and starts its proxies with srun) | srun (the
#                   cluster's MPI through SLURM's PMI: `srun --mpi=$HPCRL_SRUN_MPI`)
#   HPCRL_MPIEXEC   mpiexec to use (default: next to HPCRL_PYTHON, else mpiexec on PATH)
#   HPCRL_SRUN_MPI  srun --mpi plugin (default pmi2)
#   HPCRL_REQUEUE   0 = do not requeue on exit status 85 (default 1)
#   HPCRL_DRY_RUN   1 = print the game, run directory, rank layout and command, run nothing
#                   (works outside SLURM: set SLURM_ARRAY_TASK_ID or HPCRL_TASK_ID)
#   HPCRL_TASK_ID   array index when SLURM_ARRAY_TASK_ID is not set (dry runs)
#   HPCRL_NTASKS    rank count when SLURM_NTASKS is not set (dry runs; default: the script's)

HPCRL_EXIT_CONFIG=2
HPCRL_EXIT_CHECKPOINT=3
HPCRL_EXIT_BUSY=4
HPCRL_EXIT_REQUEUE=85

hpcrl_log() {
    printf '[hpcrl-slurm %s] %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2
}

hpcrl_die() {
    hpcrl_log "error: $*"
    exit "$HPCRL_EXIT_CONFIG"
}

# Sets HPCRL_PYTHON, HPCRL_CONFIG, HPCRL_SEED, HPCRL_RESULTS, HPCRL_LAUNCHER from the
# environment and defaults; checks that they are usable.
hpcrl_resolve_settings() {
    cd "$HPCRL_ROOT" || hpcrl_die "cannot cd to HPCRL_ROOT=$HPCRL_ROOT"
    if [ -z "${HPCRL_PYTHON:-}" ]; then
        if [ -x "$HPCRL_ROOT/.venv/bin/python" ]; then
            HPCRL_PYTHON=$HPCRL_ROOT/.venv/bin/python
        else
            HPCRL_PYTHON=$(command -v python3) || hpcrl_die "no python3 on PATH; set HPCRL_PYTHON"
        fi
    fi
    [ -x "$HPCRL_PYTHON" ] || hpcrl_die "HPCRL_PYTHON=$HPCRL_PYTHON is not executable"
    HPCRL_CONFIG=${HPCRL_CONFIG:-$HPCRL_DEFAULT_CONFIG}
    [ -f "$HPCRL_CONFIG" ] || hpcrl_die "config $HPCRL_CONFIG not found (cwd $HPCRL_ROOT)"
    HPCRL_SEED=${HPCRL_SEED:-0}
    case "$HPCRL_SEED" in ''|*[!0-9]*) hpcrl_die "HPCRL_SEED must be a non-negative integer" ;; esac
    HPCRL_RESULTS=${HPCRL_RESULTS:-results}
    HPCRL_LAUNCHER=${HPCRL_LAUNCHER:-mpiexec}
    HPCRL_SRUN_MPI=${HPCRL_SRUN_MPI:-pmi2}
    HPCRL_REQUEUE=${HPCRL_REQUEUE:-1}
}

# Prints the game of array index $1 from $HPCRL_GAME_SET (exit 2 with the reason otherwise).
hpcrl_game_for_index() {
    "$HPCRL_PYTHON" -m hpcrl.games --set "$HPCRL_GAME_SET" --index "$1"
}

# Fills the array HPCRL_CMD: launcher + python -m hpcrl.run + arguments. $1 = game, $2 = ntasks,
# the rest are passed through to hpcrl.run after the script's own --set options (so they win).
hpcrl_build_command() {
    local game=$1 ntasks=$2
    shift 2
    local run_args=(-m hpcrl.run --config "$HPCRL_CONFIG" --set "game=$game"
                    --set "seed=$HPCRL_SEED"
                    --set "run_dir=$HPCRL_RESULTS/{algo}/{game}/seed-{seed}" "$@")
    case "$HPCRL_LAUNCHER" in
        mpiexec)
            local mpiexec=${HPCRL_MPIEXEC:-}
            if [ -z "$mpiexec" ]; then
                mpiexec=$(dirname "$HPCRL_PYTHON")/mpiexec
                [ -x "$mpiexec" ] || mpiexec=$(command -v mpiexec) \
                    || hpcrl_die "no mpiexec next to $HPCRL_PYTHON or on PATH; set HPCRL_MPIEXEC"
            fi
            # Under SLURM hydra starts one proxy per node with `srun -n <nodes>`, so the ranks
            # inherit that step's SLURM_NTASKS (1 on one node); hand them the job's value, which
            # hpcrl.run checks against the MPI world size.
            HPCRL_CMD=("$mpiexec" -n "$ntasks")
            [ -n "${SLURM_NTASKS:-}" ] && HPCRL_CMD+=(-genv SLURM_NTASKS "$SLURM_NTASKS")
            HPCRL_CMD+=("$HPCRL_PYTHON" "${run_args[@]}") ;;
        srun)
            HPCRL_CMD=(srun "--mpi=$HPCRL_SRUN_MPI" --kill-on-bad-exit=1 "$HPCRL_PYTHON"
                       "${run_args[@]}") ;;
        *) hpcrl_die "HPCRL_LAUNCHER must be mpiexec or srun, got '$HPCRL_LAUNCHER'" ;;
    esac
}

# Runs "$@" in the background and waits for it, forwarding SIGUSR1 and SIGTERM that reach this
# shell (B:USR1 from --signal, SIGTERM at the time limit / scancel). Returns its exit status.
hpcrl_run_forwarding() {
    HPCRL_CHILD=
    HPCRL_INTERRUPTED=0
    "$@" &
    HPCRL_CHILD=$!
    local rc
    while :; do
        HPCRL_INTERRUPTED=0
        wait "$HPCRL_CHILD"
        rc=$?
        # wait returns early (status > 128) when a trapped signal arrives; wait again for the
        # real exit status (bash keeps it even if the child ended in the meantime).
        [ "$HPCRL_INTERRUPTED" -eq 1 ] || break
    done
    HPCRL_CHILD=
    return "$rc"
}

hpcrl_on_signal() {
    local sig=$1
    HPCRL_INTERRUPTED=1
    HPCRL_STOP_REQUESTED=1
    HPCRL_FIRST_SIGNAL=${HPCRL_FIRST_SIGNAL:-$sig}
    if [ -n "${HPCRL_CHILD:-}" ]; then
        hpcrl_log "received SIG$sig: forwarding to the launcher (pid $HPCRL_CHILD)"
        kill -s "$sig" "$HPCRL_CHILD" 2>/dev/null || true
    else
        hpcrl_log "received SIG$sig before the launch"
    fi
}

# Requeues this array task (exit status 85 = checkpoint written, resume later), unless the
# stop began with SIGTERM: SLURM's warning before a time limit or preemption is the SIGUSR1
# of --signal=B:USR1@<s>; a SIGTERM that comes first is a user's scancel.
hpcrl_requeue() {
    if [ "${HPCRL_FIRST_SIGNAL:-}" = TERM ]; then
        hpcrl_log "stopped by SIGTERM (scancel) with a checkpoint written: not requeueing;" \
            "submit the task again to resume from its run directory"
        exit "$HPCRL_EXIT_REQUEUE"
    fi
    if [ "$HPCRL_REQUEUE" != 1 ] || [ -z "${SLURM_JOB_ID:-}" ]; then
        hpcrl_log "exit status $HPCRL_EXIT_REQUEUE (checkpointed) but not requeueing" \
            "(HPCRL_REQUEUE=$HPCRL_REQUEUE, SLURM_JOB_ID=${SLURM_JOB_ID:-unset})"
        exit "$HPCRL_EXIT_REQUEUE"
    fi
    hpcrl_log "requeueing job $SLURM_JOB_ID; the next start resumes from the run directory"
    if scontrol requeue "$SLURM_JOB_ID"; then
        exit 0
    fi
    hpcrl_log "error: scontrol requeue $SLURM_JOB_ID failed (was the job submitted with --requeue?)"
    exit "$HPCRL_EXIT_REQUEUE"
}

hpcrl_array_main() {
    HPCRL_STOP_REQUESTED=0
    HPCRL_FIRST_SIGNAL=
    trap 'hpcrl_on_signal USR1' USR1
    trap 'hpcrl_on_signal TERM' TERM
    hpcrl_resolve_settings
    local index=${SLURM_ARRAY_TASK_ID:-${HPCRL_TASK_ID:-}}
    [ -n "$index" ] || hpcrl_die "no SLURM_ARRAY_TASK_ID: submit with sbatch --array=..., or set" \
        "HPCRL_TASK_ID (with HPCRL_DRY_RUN=1) to check one task"
    local ntasks=${SLURM_NTASKS:-${HPCRL_NTASKS:-$HPCRL_DEFAULT_NTASKS}}
    local game
    if [ -n "${HPCRL_SEEDS:-}" ]; then
        # HPCRL_SEEDS=N: index i runs game i % n with seed HPCRL_SEED + i / n
        local task offset
        task=$("$HPCRL_PYTHON" -m hpcrl.games --set "$HPCRL_GAME_SET" --index "$index" \
            --seeds "$HPCRL_SEEDS") || hpcrl_die "no (game, seed) for array index $index of set" \
            "$HPCRL_GAME_SET with HPCRL_SEEDS=$HPCRL_SEEDS"
        read -r game offset <<< "$task"
        HPCRL_SEED=$((HPCRL_SEED + offset))
    else
        game=$(hpcrl_game_for_index "$index") || hpcrl_die "no game for array index $index of" \
            "set $HPCRL_GAME_SET"
    fi
    hpcrl_build_command "$game" "$ntasks" "$@"

    hpcrl_log "job ${SLURM_JOB_ID:-none} (array ${SLURM_ARRAY_JOB_ID:-none}_$index)," \
        "restart ${SLURM_RESTART_COUNT:-0}, host $(hostname), nodes ${SLURM_JOB_NODELIST:-none}," \
        "$ntasks tasks"
    hpcrl_log "game $game (set $HPCRL_GAME_SET, index $index), config $HPCRL_CONFIG," \
        "seed $HPCRL_SEED, launcher $HPCRL_LAUNCHER, python $HPCRL_PYTHON"
    hpcrl_log "command: ${HPCRL_CMD[*]}"

    # Pre-flight: config, game and layout checked in one process before ranks are started;
    # prints the run directory and rank table into the log.
    local dry=("$HPCRL_PYTHON" -m hpcrl.run --config "$HPCRL_CONFIG" --set "game=$game"
               --set "seed=$HPCRL_SEED" --set "run_dir=$HPCRL_RESULTS/{algo}/{game}/seed-{seed}"
               "$@" --dry-run --world-size "$ntasks")
    "${dry[@]}" || hpcrl_die "pre-flight check failed (config, game or layout); not launching"
    if [ "${HPCRL_DRY_RUN:-0}" = 1 ]; then
        hpcrl_log "dry run: not launching"
        exit 0
    fi
    if [ "$HPCRL_STOP_REQUESTED" -eq 1 ]; then
        # Not requeued: with a time limit shorter than the --signal lead time SLURM signals at
        # once, and requeueing would loop forever without progress.
        hpcrl_log "error: stop signal before the launch (is --time shorter than the --signal" \
            "lead time, 900 s by default?); not launching, not requeueing"
        exit 1
    fi

    local t0=$SECONDS rc
    hpcrl_run_forwarding "${HPCRL_CMD[@]}"
    rc=$?
    hpcrl_log "launcher exited with status $rc after $((SECONDS - t0)) s"
    case "$rc" in
        "$HPCRL_EXIT_REQUEUE") hpcrl_requeue ;;
        "$HPCRL_EXIT_CHECKPOINT")
            hpcrl_log "checkpoints could not be written (disk full or quota?): the run stopped" \
                "as failed; not requeueing (free space, then submit the task again to resume)" ;;
        "$HPCRL_EXIT_BUSY")
            hpcrl_log "the run directory is held by another live job (or was taken over by one):" \
                "not requeueing; that job carries the run" ;;
    esac
    exit "$rc"
}
