"""Exit statuses of ``python -m hpcrl.run`` (the SLURM scripts test them by number)."""

EXIT_FAILURE = 1     # an exception on some rank (job aborted)
EXIT_CONFIG = 2      # bad config, layout, game or run directory
EXIT_CHECKPOINT = 3  # checkpoints fail (disk full, quota): stopped; do not requeue, a restart
                     # would resume from the last good generation and fail the same way
EXIT_BUSY = 4        # the run directory is held by another live job (or was taken over by
                     # one): do not requeue, that job carries the run
EXIT_REQUEUE = 85    # stopped by SIGUSR1/SIGTERM after writing a checkpoint: requeue me
