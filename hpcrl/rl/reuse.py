"""The rollout gradient from the acting passes' activations: no second forward over the rollout.

An asynchronous actor-learner (Mnih et al. 2016) runs its network forward over every state of
a rollout twice with the same parameters: once to act (batch N, no graph) and once more for
the gradient (batch T * N, with a graph). The second forward is not needed: the ReLU outputs
of the acting passes are exactly the activations the gradient's forward would compute, so the
gradient is the heads' backward (autograd, from the last hidden layer's outputs) followed by a
hand-written backward through the torso's convolutions and linear layers
(:func:`torso_backward`), the same kernels autograd calls. On one core it saves most of the
forward's share of the gradient (docs/performance.md).

Exactness needs the parameters of acting and learning to be the same: the worker records only
while it collects a rollout, and it pulls only after it pushed that rollout's gradient; a
recording that does not hold one pass per step (Sarsa's first action was chosen in the
rollout before) is not used (:func:`matching`). The gradient equals autograd's through the
same network to float32 rounding (``tests/test_reuse.py``).

Applies to torsos that are a ``nn.Sequential`` of Conv2d / Linear layers, each followed by a
ReLU (a Flatten between them), with an image (Conv2d) first layer: the networks of Mnih et al.
2013 and 2015. Anything else (LSTM, MLPs with input normalisation) learns by the plain re-run.
"""

from __future__ import annotations

import torch
from torch import nn

_CHANNELS_LAST = torch.channels_last


def reusable_torso(torso: nn.Module) -> bool:
    """Whether ``torso`` is a Sequential of (Conv2d | Linear) + ReLU pairs, Flatten allowed
    between them, whose first layer is a Conv2d (an image network)."""
    if not isinstance(torso, nn.Sequential):
        return False
    mods = [m for m in torso if not isinstance(m, nn.Flatten)]
    if len(mods) < 2 or len(mods) % 2 or not isinstance(mods[0], nn.Conv2d):
        return False
    pairs = zip(mods[::2], mods[1::2])
    return all(isinstance(w, (nn.Conv2d, nn.Linear)) and isinstance(r, nn.ReLU)
               and not r.inplace for w, r in pairs)


def weight_layers(torso: nn.Sequential) -> list[nn.Module]:
    return [m for m in torso if isinstance(m, (nn.Conv2d, nn.Linear))]


class ActivationRecorder:
    """Keeps the ReLU outputs of a torso's forward passes between :meth:`start` and
    :meth:`stop`, one list per pass (forward hooks on the torso's ReLUs, which record only
    outside autograd: acting passes, not a gradient's forward).
    """

    def __init__(self, torso: nn.Sequential):
        self.passes: list[list[torch.Tensor]] = []
        self._current: list[torch.Tensor] = []
        self.active = False
        relus = [m for m in torso if isinstance(m, nn.ReLU)]
        self.n_layers = len(relus)
        for relu in relus:
            relu.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        if not self.active or torch.is_grad_enabled():
            return
        self._current.append(output)
        if len(self._current) == self.n_layers:
            self.passes.append(self._current)
            self._current = []

    def start(self) -> None:
        self.passes, self._current, self.active = [], [], True

    def stop(self) -> list[list[torch.Tensor]]:
        self.active = False
        passes, self.passes, self._current = self.passes, [], []
        return passes


class RecordedActivations:
    """A rollout's recorded activations, batched as the gradient's [T * N, ...] batch.

    Attributes:
        outs: per weight layer, its ReLU outputs over the rollout, time-major; those that a
            convolution reads (an image output followed by another) in channels-last memory,
            the layout of the gradient's convolutions; the last image output, which the linear
            layer reads flattened, stays NCHW (its flatten needs no copy).
    """

    def __init__(self, passes: list[list[torch.Tensor]]):
        outs = [torch.cat(layer) for layer in zip(*passes)]
        self.outs = [o.contiguous(memory_format=_CHANNELS_LAST)
                     if o.dim() == 4 and nxt.dim() == 4 else o
                     for o, nxt in zip(outs, outs[1:])] + outs[-1:]

    @property
    def head_input(self) -> torch.Tensor:
        """The last hidden layer's outputs [T * N, hidden]: what the heads read."""
        return self.outs[-1]


def matching(passes: list[list[torch.Tensor]], steps: int, batch: int) -> bool:
    """Whether a recording holds exactly one pass of ``batch`` states per rollout step."""
    return len(passes) == steps and all(p[0].shape[0] == batch for p in passes)


def torso_backward(torso: nn.Sequential, x: torch.Tensor, outs: list[torch.Tensor],
                   grad_head_input: torch.Tensor) -> None:
    """Set ``.grad`` of every torso parameter to d loss / d parameter, given the torso's input
    ``x`` (float, scaled as the network scales it), each weight layer's ReLU output ``outs``
    and d loss / d (last ReLU output).

    Per layer, last to first: the ReLU's backward (``threshold_backward``: the gradient passes
    where the output is > 0, autograd's rule for ReLU), then a Linear's
    dW = g^T x, db = sum g, dx = g W, or a convolution's ``convolution_backward`` (the kernel
    autograd runs; the first layer's input gradient is not computed).
    """
    layers = weight_layers(torso)
    inputs = [x] + outs[:-1]
    g = grad_head_input
    for i in reversed(range(len(layers))):
        layer, inp = layers[i], inputs[i]
        g = torch.ops.aten.threshold_backward(g, outs[i], 0)
        if isinstance(layer, nn.Linear):
            flat = inp.reshape(inp.shape[0], -1)
            _set_grads(layer, g.t() @ flat, g.sum(0))
            g = (g @ layer.weight).reshape(inp.shape) if i else None
            continue
        if inp.dim() == 4:
            g = g.contiguous(memory_format=_CHANNELS_LAST)
        bias = None if layer.bias is None else [layer.out_channels]
        dx, dw, db = torch.ops.aten.convolution_backward(
            g, inp, layer.weight, bias, layer.stride, layer.padding, layer.dilation, False,
            [0] * len(layer.stride), layer.groups, [i > 0, True, bias is not None])
        _set_grads(layer, dw, db)
        g = dx


def _set_grads(layer: nn.Module, dw: torch.Tensor, db: torch.Tensor | None) -> None:
    """The gradients in the parameters' own (contiguous) layout, as autograd leaves them."""
    layer.weight.grad = dw.contiguous()
    if layer.bias is not None:
        layer.bias.grad = db.contiguous()
