"""The algorithms: each family's actors, learners and the workers the client loop drives.

* :mod:`hpcrl.agents.gorila`: Gorila (Nair et al. 2015): bundles, split actors and learners.
* :mod:`hpcrl.agents.async_rl`: the asynchronous methods (Mnih et al. 2016): actor-learners.
* :mod:`hpcrl.agents.evaluation`: the evaluation protocol both families share.

:func:`make_worker` is the one place that maps (algorithm, role) to a worker. Importing this
package does not import torch; building a worker does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcrl.core import Worker
    from hpcrl.runtime.context import Context
    from hpcrl.runtime.topology import Role


def make_worker(ctx: "Context", role: "Role") -> "Worker":
    """The worker of a client rank, its torch generator seeded from the rank's seed."""
    import torch

    from hpcrl.runtime.topology import Role

    torch.manual_seed(ctx.seed)
    if ctx.cfg.algo != "gorila":
        if role != Role.ACTOR_LEARNER:
            raise ValueError(f"algo {ctx.cfg.algo!r} has no {role.value} role")
        from hpcrl.agents.async_rl.worker import ActorLearnerWorker

        return ActorLearnerWorker(ctx)
    from hpcrl.agents.gorila import workers

    cls = {Role.ACTOR_LEARNER: workers.BundleWorker, Role.ACTOR: workers.ActorWorker,
           Role.LEARNER: workers.LearnerWorker, Role.EVALUATOR: workers.EvaluatorWorker}[role]
    return cls(ctx)
