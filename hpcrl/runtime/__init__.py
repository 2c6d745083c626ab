"""MPI plumbing: wiring of the roles, the one client loop, rank 0's reporter, the run directory
and resume, topology, coordinated checkpoints, the watchdog and global replay ranks.

Nothing here imports torch at module level, and nothing here knows an algorithm: the agents
(:mod:`hpcrl.agents`) hand the runtime a worker per client rank.
"""
