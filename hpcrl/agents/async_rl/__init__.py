"""The asynchronous methods (Mnih et al. 2016, "Asynchronous Methods for Deep RL").

Methods (``cfg.algo``), each over rollouts of ``t_max`` agent steps per environment:

* ``one_step_q`` (Algorithm 1): y = r + gamma max_a' Q(s', a'; theta-), gradients of the
  per-step losses accumulated over I_AsyncUpdate = t_max steps, then one push.
* ``one_step_sarsa`` (§4): y = r + gamma Q(s', a'; theta-) with a' the action actually taken
  in s' (for the last step of a rollout: the action chosen for the next rollout's first step).
* ``n_step_q`` (Algorithm S2): each state gets the longest n-step return available in the
  rollout, bootstrapped with max_a Q(s_T, a; theta-).
* ``a3c`` (Algorithm S3): n-step returns bootstrapped with V(s_T; theta), advantage R - V(s),
  entropy regularisation, feed-forward or LSTM, gradient global-norm clipping.

* :mod:`.rollout`: acting a rollout in N environments in lockstep.
* :mod:`.learner`: the rollout's loss and gradient (targets from :mod:`hpcrl.rl.losses`).
* :mod:`.worker`: the actor-learner rank as a worker of the client loop.
"""
