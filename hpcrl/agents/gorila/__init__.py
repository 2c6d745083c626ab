"""Gorila (Nair et al. 2015, "Massively Parallel Methods for Deep Reinforcement Learning").

* :mod:`.actor`: epsilon-greedy acting with a behaviour copy of the Q-network.
* :mod:`.learner`: the DQN gradient of a minibatch and Gorila's drop rules.
* :mod:`.workers`: the four client roles (bundle, actor, learner, evaluator) as workers.
"""
