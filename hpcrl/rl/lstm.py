"""The layer-normalised LSTM cell (``lstm_layer_norm = true``) and the gate arithmetic that
:mod:`hpcrl.tools.probe` reads from either kind of cell.

LN-LSTM (Ba, Kiros and Hinton 2016, "Layer Normalization", §6 and its supplement, eqs. 20-22):

    (i, f, g, o) = LN(W_ih x) + LN(W_hh h) + b       (each LN over the 4H gate pre-activations)
    c' = sigmoid(f) c + sigmoid(i) tanh(g)
    h' = sigmoid(o) tanh(LN(c'))                     (LN over the H cells)

with a gain (1) and a bias (0) per LN. Why here: in A3C LSTM on Pong a third of the plain
cell's forget gates run to 1 within 1 M frames and those cells integrate their input over the
episode to |c| in the hundreds (``python -m hpcrl.diagnose RUN --probe``,
docs/experiments/a3c-lstm-pong.md); tanh(c) saturates and the gates and the layers before the
LSTM get no gradient. The gradient of the loss with respect to f is dL/dc x c_(t-1), so it grows
with |c|, and RMSProp's normalised steps turn it into steps of about the learning rate either
way. After LN(c') the output no longer depends on the cells' scale, so a growing |c| neither
saturates tanh nor feeds the forget gates' gradient. A deviation from the paper's A3C LSTM (a
plain LSTM cell); no shipped config uses it (its Pong screen still lost the fc layer).

Gate order and parameter names follow ``torch.nn.LSTMCell`` (input, forget, cell, output;
``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``), so the same initialisations apply.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LayerNormLSTMCell(nn.Module):
    """An LSTM cell with layer normalisation (module docstring); ``forward(x, (h, c))`` returns
    ``(h', c')`` as ``nn.LSTMCell`` does."""

    def __init__(self, input_size: int, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(4 * hidden_size))
        self.bias_hh = nn.Parameter(torch.empty(4 * hidden_size))
        self.ln_ih = nn.LayerNorm(4 * hidden_size, eps=eps)
        self.ln_hh = nn.LayerNorm(4 * hidden_size, eps=eps)
        self.ln_c = nn.LayerNorm(hidden_size, eps=eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's LSTMCell default for weights and biases, U(+-1/sqrt(H)); LN gains 1,
        biases 0."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh):
            nn.init.uniform_(p, -bound, bound)
        for ln in (self.ln_ih, self.ln_hh, self.ln_c):
            ln.reset_parameters()

    def gates(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Pre-activations [B, 4H] of the input, forget, cell and output gates."""
        return (self.ln_ih(x @ self.weight_ih.T) + self.ln_hh(h @ self.weight_hh.T)
                + self.bias_ih + self.bias_hh)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = state
        i, f, g, o = self.gates(x, h).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(self.ln_c(c)), c


def lstm_gates(cell: nn.Module, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Gate pre-activations [B, 4H] of ``nn.LSTMCell`` or :class:`LayerNormLSTMCell`."""
    if isinstance(cell, LayerNormLSTMCell):
        return cell.gates(x, h)
    return x @ cell.weight_ih.T + h @ cell.weight_hh.T + cell.bias_ih + cell.bias_hh


def tanh_input(cell: nn.Module, c: torch.Tensor) -> torch.Tensor:
    """What the cell's output tanh sees: c, or LN(c) in a layer-normalised cell."""
    return cell.ln_c(c) if isinstance(cell, LayerNormLSTMCell) else c
