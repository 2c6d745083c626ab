"""The reinforcement-learning math, free of MPI: losses, targets and returns (their one home),
networks, exploration and schedules, behaviour policies, and the replay memory.

``losses``, ``networks`` and ``acting`` import torch; ``policies``, ``replay`` and ``types``
do not (replay ranks use them).
"""
