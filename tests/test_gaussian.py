"""The Gaussian policy's math (Mnih et al. 2016, supplementary §9) against hand-worked numbers
and a slow float64 reference written from the formulas, gradients included."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hpcrl.rl.gaussian import a3c_gaussian_loss, gaussian_entropy, gaussian_log_prob, \
    mean_action, sample_gaussian, split_policy


def test_log_prob_and_entropy_by_hand():
    # N(0, 1) at 0: -1/2 log(2 pi) = -0.918939; N(1, 4) at 3: -1/2 (4/4 + log 4 + log 2 pi)
    a = torch.tensor([[0.0, 3.0]])
    mean, var = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 4.0]])
    expected = -0.5 * math.log(2 * math.pi) - 0.5 * (1.0 + math.log(4.0) + math.log(2 * math.pi))
    assert gaussian_log_prob(a, mean, var).item() == pytest.approx(expected, rel=1e-6)
    # 1/2 (log(2 pi e))  +  1/2 (log(2 pi e 4)) = 1.418939 + 2.112086
    assert gaussian_entropy(var).item() == pytest.approx(1.4189385 + 2.1120857, rel=1e-6)


def _reference_loss(out, values, actions, returns, beta, value_coef):
    """Step by step in float64 Python: the paper's accumulation written out."""
    total = 0.0
    for o, v, a, r in zip(out, values, actions, returns):
        d = len(a)
        mu, var = o[:d], o[d:]
        log_p = sum(-0.5 * ((a[k] - mu[k]) ** 2 / var[k] + math.log(2 * math.pi * var[k]))
                    for k in range(d))
        entropy = sum(0.5 * (math.log(2 * math.pi * var[k]) + 1) for k in range(d))
        total += -log_p * (r - v) + value_coef * (r - v) ** 2 - beta * entropy
    return total


def test_loss_and_gradients_match_the_slow_reference():
    rng = np.random.default_rng(3)
    T, D = 5, 3
    mu = rng.standard_normal((T, D))
    var = rng.uniform(0.2, 2.0, (T, D))
    values, returns = rng.standard_normal(T), rng.standard_normal(T)
    actions = mu + np.sqrt(var) * rng.standard_normal((T, D))
    out = torch.tensor(np.concatenate([mu, var], 1), dtype=torch.float64, requires_grad=True)
    v = torch.tensor(values, requires_grad=True)
    loss = a3c_gaussian_loss(out, v, torch.tensor(actions), torch.tensor(returns), 1e-2, 0.5)
    ref = _reference_loss(out.detach().numpy(), values, actions, returns, 1e-2, 0.5)
    assert loss["total"].item() == pytest.approx(ref, rel=1e-12)
    loss["total"].backward()
    # gradients of the reference by central differences (the advantage is a constant there)
    eps = 1e-6
    flat = out.detach().numpy().copy()
    for t in range(T):
        for k in range(2 * D):
            up, down = flat.copy(), flat.copy()
            up[t, k] += eps
            down[t, k] -= eps
            num = (_reference_loss(up, values, actions, returns, 1e-2, 0.5)
                   - _reference_loss(down, values, actions, returns, 1e-2, 0.5)) / (2 * eps)
            assert out.grad[t, k].item() == pytest.approx(num, rel=1e-5, abs=1e-8)
    # the value gradient is the squared error's only: d/dV 0.5 (R - V)^2 = -(R - V)
    np.testing.assert_allclose(v.grad.numpy(), -(returns - values), rtol=1e-12)


def test_time_major_batches_and_the_split():
    out = torch.arange(12, dtype=torch.float32).reshape(2, 1, 6) + 1.0   # [T, N, 2 D]
    mean, var = split_policy(out)
    assert mean.shape == var.shape == (2, 1, 3) and var[1, 0, 0].item() == 10.0
    loss = a3c_gaussian_loss(out, torch.zeros(2, 1), mean.clone(), torch.zeros(2, 1))
    # a = mu, A = 0: only the entropy term remains
    assert loss["policy"].item() == 0.0 and loss["value"].item() == 0.0
    assert loss["total"].item() == pytest.approx(-1e-4 * gaussian_entropy(var).sum().item())


def test_sampling_and_the_mean_action():
    out = np.array([[1.0, -2.0, 4.0, 0.25]], np.float32)       # mu (1, -2), var (4, 0.25)
    z = np.array([[0.5, -2.0]], np.float32)
    np.testing.assert_allclose(sample_gaussian(out, z), [[1.0 + 2.0 * 0.5, -2.0 + 0.5 * -2.0]])
    np.testing.assert_array_equal(mean_action(out), [[1.0, -2.0]])
    draws = sample_gaussian(np.repeat(out, 20000, 0),
                            np.random.default_rng(0).standard_normal((20000, 2)))
    np.testing.assert_allclose(draws.mean(0), [1.0, -2.0], atol=0.05)
    np.testing.assert_allclose(draws.var(0), [4.0, 0.25], rtol=0.05)
