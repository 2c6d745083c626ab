"""Exit statuses of ``python -m hpcrl.run`` (the SLURM scripts test them by number)."""

EXIT_FAILURE = 1     # an exception on some rank (job aborted)
EXIT_CONFIG = 2      # bad config, layout, game or run directory
EXIT_CHECKPOINT = 3  # checkpoints fail (disk full, quota): stopped; do not requeue, a restart
                     # would resume from the last good generation and fail the same way
EXIT_BUSY = 4        # the run directory is held by another live job (or was taken over by
                     # one): do not requeue, that job carries the run
EXIT_REQUEUE = 85    # stopped by SIGUSR1/SIGTERM after writing a checkpoint: requeue me

ABORT_GRACE_S = 1.0  # seconds between a rank's last report and its MPI Abort


def abort_job(comm, status: int) -> None:
    """End the whole job from this rank: wait ABORT_GRACE_S, then ``comm.Abort(status)``.

    Abort kills every rank at once, and with them the launcher's forwarding of what they last
    wrote to stderr: the wait lets the one-line report that precedes every abort reach the
    user. A second Ctrl-C during the wait cuts the wait, never the Abort.
    """
    import time

    try:
        time.sleep(ABORT_GRACE_S)
    except BaseException:  # noqa: BLE001 - an interrupt must still abort the job
        pass
    comm.Abort(status)
