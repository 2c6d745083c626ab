"""hpcrl: Gorila (Nair et al. 2015) and the asynchronous methods (Mnih et al. 2016) over MPI."""

from hpcrl.version import __version__

__all__ = ["__version__", "load_policy"]


def load_policy(path, **acting):
    """An exported policy (``python -m hpcrl.export torch``): a torch module with ``act(obs)``.

    See :func:`hpcrl.tools.policy.load_policy`; imported here lazily, so that ``import hpcrl``
    does not import torch.
    """
    from hpcrl.tools.policy import load_policy as _load

    return _load(path, **acting)
