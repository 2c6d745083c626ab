"""Benchmarks (``python -m hpcrl.bench ps|actor|learner|scaling|checkpoint|gradient|env``), kept
apart from the algorithms they measure. Each prints its figures, the last line one JSON object;
targets are ratios measured within one run (the machines are shared and noisy), never timed
tests.

* :mod:`.ps`: the parameter store against raw RMA on a window of the same size.
* :mod:`.agents`: the command line of the agents' benchmarks: :mod:`.components` (a Gorila
  actor and learner against their in-process bounds, a bundle's checkpoint write and read),
  :mod:`.a3c` (A3C scaling with 1 and 2 actor-learners, batched actor-learners),
  :mod:`.gorila` (the Gorila job against its compute bound), run as jobs by :mod:`.jobs`.
* :mod:`.raw`: the raw bound of every job benchmark, ALE alone on every core.
* :mod:`.gradient`: the A3C rollout gradient against its variants (one core).
* :mod:`.envstep`: the Atari environment step with the C and the PIL frame resize (one core).
"""
