"""hpcrl.rl.lstm.LayerNormLSTMCell (lstm_layer_norm = true) against Ba et al. 2016's equations
written out in numpy float64, and its place in the run's network."""

import numpy as np
import pytest
import torch

from hpcrl.config import ConfigError, load_config
from hpcrl.rl.lstm import LayerNormLSTMCell, lstm_gates, tanh_input
from hpcrl.rl.networks import build_network
from tests.util import ROOT


def _ln(v, gain, bias, eps=1e-5):
    mu = v.mean(axis=-1, keepdims=True)
    var = ((v - mu) ** 2).mean(axis=-1, keepdims=True)
    return (v - mu) / np.sqrt(var + eps) * gain + bias


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def test_cell_matches_the_equations_written_out():
    """Random weights, LN gains and biases (not 1 and 0, so that each one counts), two steps."""
    torch.manual_seed(0)
    n_in, H, B = 5, 3, 4
    cell = LayerNormLSTMCell(n_in, H).double()
    with torch.no_grad():
        for ln in (cell.ln_ih, cell.ln_hh, cell.ln_c):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    P = {k: v.detach().numpy() for k, v in cell.named_parameters()}
    rng = np.random.default_rng(1)
    h, c = rng.normal(size=(B, H)), rng.normal(size=(B, H))
    th, tc = torch.from_numpy(h), torch.from_numpy(c)
    for _ in range(2):
        x = rng.normal(size=(B, n_in))
        z = (_ln(x @ P["weight_ih"].T, P["ln_ih.weight"], P["ln_ih.bias"])
             + _ln(h @ P["weight_hh"].T, P["ln_hh.weight"], P["ln_hh.bias"])
             + P["bias_ih"] + P["bias_hh"])
        i, f, g, o = np.split(z, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(_ln(c, P["ln_c.weight"], P["ln_c.bias"]))
        th, tc = cell(torch.from_numpy(x), (th, tc))
        np.testing.assert_allclose(tc.detach().numpy(), c, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(th.detach().numpy(), h, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lstm_gates(cell, torch.from_numpy(x), th).detach().numpy().shape,
                               (B, 4 * H))
    np.testing.assert_allclose(tanh_input(cell, tc).detach().numpy(),
                               _ln(c, P["ln_c.weight"], P["ln_c.bias"]), rtol=1e-10)


def test_plain_cell_gates_as_torch_computes_them():
    torch.manual_seed(2)
    cell = torch.nn.LSTMCell(4, 3)
    x, h, c = torch.randn(2, 4), torch.randn(2, 3), torch.randn(2, 3)
    i, f, g, o = lstm_gates(cell, x, h).chunk(4, dim=1)
    c1 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h1, c2 = cell(x, (h, c))
    torch.testing.assert_close(c1, c2)
    torch.testing.assert_close(torch.sigmoid(o) * torch.tanh(c1), h1)
    assert tanh_input(cell, c1) is c1


def test_cell_output_ignores_the_scale_of_c():
    """The point of the LN cell: a cell state 100 times larger gives (nearly) the same h."""
    torch.manual_seed(3)
    cell = LayerNormLSTMCell(4, 8)
    plain = torch.nn.LSTMCell(4, 8)
    with torch.no_grad():
        for each in (cell, plain):       # input gate shut, forget gate open: c' = c
            each.bias_ih[:8], each.bias_ih[8:16] = -50.0, 50.0
    x, h, c = torch.randn(2, 4), torch.zeros(2, 8), torch.randn(2, 8)
    torch.testing.assert_close(cell(x, (h, c))[0], cell(x, (h, 100 * c))[0],
                               atol=1e-4, rtol=0)
    assert (plain(x, (h, 100 * c))[0] - plain(x, (h, c))[0]).abs().max() > 0.05


def test_lstm_layer_norm_from_the_config():
    """The run's network gets the LN cell in the LSTM's place (the flat vector grows by the
    three LNs' gains and biases: 2 x (4 x 256) x 2 + 256 x 2), the orthogonal init and forget
    bias still apply; the key needs A3C LSTM."""
    plain = build_network(load_config(ROOT / "configs/a3c_lstm_pong.toml",
                                      ["lstm_init=orthogonal"]), (4, 84, 84), 6)
    cfg = load_config(ROOT / "configs/a3c_lstm_pong.toml",
                      ["lstm_init=orthogonal", "lstm_layer_norm=true"])
    net = build_network(cfg, (4, 84, 84), 6)
    assert isinstance(net.lstm, LayerNormLSTMCell)
    size = sum(p.numel() for p in net.parameters())
    assert size - sum(p.numel() for p in plain.parameters()) == 2 * 1024 * 2 + 2 * 256
    bias = (net.lstm.bias_ih + net.lstm.bias_hh).detach()
    assert torch.equal(bias[256:512], torch.ones(256)) and not bias[:256].any()
    w = net.lstm.weight_ih.detach()[:256].double()
    np.testing.assert_allclose(w @ w.T, np.eye(256), atol=1e-5)
    logits, value, state = net(torch.zeros(3, 4, 84, 84, dtype=torch.uint8),
                               net.initial_state(3))
    assert logits.shape == (3, 6) and value.shape == (3,) and state[1].shape == (3, 256)
    with pytest.raises(ConfigError, match="'lstm_layer_norm' applies to A3C LSTM only"):
        load_config(ROOT / "configs/a3c_pong.toml", ["lstm_layer_norm=true"])
