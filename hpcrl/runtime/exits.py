"""Exit statuses of ``python -m hpcrl.run`` (the SLURM scripts test them by number)."""

EXIT_FAILURE = 1     # an exception on some rank (job aborted)
EXIT_CONFIG = 2      # bad config, layout, game or run directory
EXIT_REQUEUE = 85    # stopped by SIGUSR1/SIGTERM after writing a checkpoint: requeue me
