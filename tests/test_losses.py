"""Tests for hpcrl.losses against hand-worked numbers and slow loop references."""

import numpy as np
import pytest
import torch

from hpcrl import losses

torch.set_num_threads(1)


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def test_huber_by_hand():
    # delta 1: 0.5 x^2 inside, |x| - 0.5 outside. delta 2: 0.5 x^2 inside, 2 (|x| - 1) outside.
    x = _t([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0])
    np.testing.assert_allclose(losses.huber(x).numpy(), [2.5, 0.5, 0.125, 0.0, 0.125, 0.5, 2.5])
    np.testing.assert_allclose(losses.huber(x, delta=2.0).numpy(),
                               [4.0, 0.5, 0.125, 0.0, 0.125, 0.5, 4.0])
    x.requires_grad_(True)
    losses.huber(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [-1.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.0])


# A hand-worked batch of two, gamma 0.9:
#   q_tm1 = [[1, 2, 3], [4, 5, 6]], a_tm1 = [2, 0], r_t = [1, -1], discount_t = [1, 0]
#   q_t   = [[10, 0, 5], [7, 8, 9]], a_t = [2, 1]
# Q-learning targets: 1 + 0.9 * 10 = 10,  -1 + 0.9 * 0 * 9 = -1  -> td = [10 - 3, -1 - 4] = [7, -5]
# Sarsa targets:      1 + 0.9 * 5  = 5.5,  -1 + 0     = -1         -> td = [2.5, -5]
Q_TM1 = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
Q_T = [[10.0, 0.0, 5.0], [7.0, 8.0, 9.0]]


def test_q_learning_and_sarsa_targets_by_hand():
    q_tm1 = _t(Q_TM1).requires_grad_(True)
    q_t = _t(Q_T).requires_grad_(True)
    args = dict(a_tm1=_t([2, 0], torch.int64), r_t=_t([1.0, -1.0]), discount_t=_t([1.0, 0.0]))
    td_q = losses.q_learning_td(q_tm1, q_t=q_t, gamma=0.9, **args)
    td_sarsa = losses.sarsa_td(q_tm1, q_t=q_t, a_t=_t([2, 1], torch.int64), gamma=0.9, **args)
    np.testing.assert_allclose(td_q.detach().numpy(), [7.0, -5.0], rtol=1e-6)
    np.testing.assert_allclose(td_sarsa.detach().numpy(), [2.5, -5.0], rtol=1e-6)
    # The target is a constant: gradients reach q_tm1 only, at the chosen actions.
    (td_q.sum() + td_sarsa.sum()).backward()
    assert q_t.grad is None
    np.testing.assert_allclose(q_tm1.grad.numpy(), [[0, 0, -2], [-2, 0, 0]])


def test_q_learning_td_matches_loop_reference():
    rng = np.random.default_rng(0)
    q_tm1, q_t = rng.normal(size=(2, 16, 5))
    a_tm1, a_t = rng.integers(0, 5, (2, 16))
    r_t = rng.normal(size=16)
    discount_t = (rng.random(16) < 0.8).astype(float)
    gamma = 0.97
    td_q = losses.q_learning_td(_t(q_tm1), _t(a_tm1, torch.int64), _t(r_t), _t(discount_t),
                                _t(q_t), gamma)
    td_s = losses.sarsa_td(_t(q_tm1), _t(a_tm1, torch.int64), _t(r_t), _t(discount_t), _t(q_t),
                           _t(a_t, torch.int64), gamma)
    for b in range(16):
        # y = r + gamma max_a' Q(s', a'; theta^-) (0 beyond a terminal)   (Mnih 2015 eq. 2)
        y_q = r_t[b] + (gamma * max(q_t[b]) if discount_t[b] else 0.0)
        # y = r + gamma Q(s', a'; theta^-), a' the action taken            (Mnih 2016 §4)
        y_s = r_t[b] + (gamma * q_t[b][a_t[b]] if discount_t[b] else 0.0)
        assert td_q[b].item() == pytest.approx(y_q - q_tm1[b][a_tm1[b]], abs=1e-5)
        assert td_s[b].item() == pytest.approx(y_s - q_tm1[b][a_tm1[b]], abs=1e-5)


def test_dqn_loss_kinds_share_the_clipped_gradient():
    td_values = [-3.0, -0.5, 0.25, 2.0]
    grads = {}
    for kind in ("huber", "clip"):
        td = _t(td_values).requires_grad_(True)
        loss = losses.dqn_loss(td, kind)
        loss.backward()
        grads[kind] = td.grad.numpy()
        if kind == "huber":  # mean of [2.5, 0.125, 0.03125, 1.5]
            assert loss.item() == pytest.approx((2.5 + 0.125 + 0.03125 + 1.5) / 4)
        else:  # mean of 0.5 td^2 = [4.5, 0.125, 0.03125, 2.0]
            assert loss.item() == pytest.approx((4.5 + 0.125 + 0.03125 + 2.0) / 4)
    # d/d td of the mean = clip(td, -1, 1) / B.
    expected = np.array([-1.0, -0.5, 0.25, 1.0]) / 4
    np.testing.assert_allclose(grads["huber"], expected)
    np.testing.assert_allclose(grads["clip"], expected)
    with pytest.raises(ValueError):
        losses.dqn_loss(_t([1.0]), "mse")


def _reference_n_step_returns(r, discount, bootstrap, gamma):
    """Mnih 2016 Alg. S3: R <- V(s_T) (0 if terminal); for i = t-1..t_start: R <- r_i + gamma R.

    Written as the forward sum instead of the backward recursion, to be an independent check:
    R_i = sum_{k=i}^{j} gamma^(k-i) r_k + gamma^(T-i) bootstrap [if no episode end in i..T-1],
    where j is the first step at or after i whose discount is 0 (its next state is terminal),
    or T - 1 if there is none.
    """
    num_steps = len(r)
    out = np.zeros(num_steps)
    for i in range(num_steps):
        total, ended = 0.0, False
        for k in range(i, num_steps):
            total += gamma ** (k - i) * r[k]
            if discount[k] == 0:
                ended = True
                break
        if not ended:
            total += gamma ** (num_steps - i) * bootstrap
        out[i] = total
    return out


def test_n_step_returns_by_hand_with_episode_end_inside():
    # gamma 0.5, r = [1, 2, 3, 4], episode ends after step 1 (discount_1 = 0), bootstrap 8:
    #   R_3 = 4 + 0.5 * 8 = 8;  R_2 = 3 + 0.5 * 8 = 7;  R_1 = 2 (terminal next state);
    #   R_0 = 1 + 0.5 * 2 = 2
    got = losses.n_step_returns(_t([1.0, 2.0, 3.0, 4.0]), _t([1.0, 0.0, 1.0, 1.0]), _t(8.0), 0.5)
    np.testing.assert_allclose(got.numpy(), [2.0, 2.0, 7.0, 8.0])


def test_n_step_returns_batched_matches_reference():
    rng = np.random.default_rng(1)
    num_steps, batch, gamma = 7, 5, 0.9
    r = rng.normal(size=(num_steps, batch))
    discount = (rng.random((num_steps, batch)) < 0.7).astype(float)
    bootstrap = rng.normal(size=batch)
    value = _t(bootstrap).requires_grad_(True)
    got = losses.n_step_returns(_t(r), _t(discount), value, gamma)
    assert got.shape == (num_steps, batch) and not got.requires_grad
    for b in range(batch):
        expected = _reference_n_step_returns(r[:, b], discount[:, b], bootstrap[b], gamma)
        np.testing.assert_allclose(got[:, b].numpy(), expected, rtol=1e-5, atol=1e-5)
        got_1d = losses.n_step_returns(_t(r[:, b]), _t(discount[:, b]), _t(bootstrap[b]), gamma)
        np.testing.assert_allclose(got_1d.numpy(), expected, rtol=1e-5, atol=1e-5)


def _reference_a3c(logits, values, actions, returns, beta, value_coef):
    """Loop over Mnih 2016 Algorithm S3, summing per-step terms:
    policy  -= log pi(a_i|s_i) (R_i - V(s_i));  value += (R_i - V(s_i))^2;
    entropy += -sum_a pi(a|s_i) log pi(a|s_i)."""
    policy = value = entropy = 0.0
    for i in range(len(actions)):
        z = logits[i] - np.max(logits[i])
        log_pi = z - np.log(np.sum(np.exp(z)))
        advantage = returns[i] - values[i]
        policy -= log_pi[actions[i]] * advantage
        value += advantage ** 2
        entropy -= np.sum(np.exp(log_pi) * log_pi)
    return dict(policy=policy, value=value, entropy=entropy,
                total=policy + value_coef * value - beta * entropy)


def test_a3c_loss_matches_reference_and_gradients():
    rng = np.random.default_rng(2)
    num_steps, num_actions = 5, 4
    logits_np = rng.normal(size=(num_steps, num_actions))
    values_np = rng.normal(size=num_steps)
    actions_np = rng.integers(0, num_actions, num_steps)
    r = rng.normal(size=num_steps)
    discount = np.array([1.0, 1.0, 0.0, 1.0, 1.0])  # Episode ends inside the rollout.
    returns = losses.n_step_returns(_t(r), _t(discount), _t(0.3), 0.99)
    returns_np = _reference_n_step_returns(r, discount, 0.3, 0.99)
    np.testing.assert_allclose(returns.numpy(), returns_np, rtol=1e-5)

    logits = _t(logits_np).requires_grad_(True)
    values = _t(values_np).requires_grad_(True)
    out = losses.a3c_loss(logits, values, _t(actions_np, torch.int64), returns,
                          entropy_beta=0.01, value_coef=0.5)
    expected = _reference_a3c(logits_np, values_np, actions_np, returns_np, 0.01, 0.5)
    for key in ("total", "policy", "value", "entropy"):
        assert out[key].item() == pytest.approx(expected[key], rel=1e-5, abs=1e-5), key
    out["total"].backward()
    # Value gradient: 0.5 d(R - V)^2/dV = -(R - V); the policy term must not reach V.
    np.testing.assert_allclose(values.grad.numpy(), -(returns_np - values_np), rtol=1e-5, atol=1e-6)
    # Logit gradient of -log pi(a) A - beta H: (pi - onehot(a)) A - beta dH/dlogits, with
    # dH/dz_k = -pi_k (log pi_k + H).
    pi = np.exp(logits_np) / np.exp(logits_np).sum(axis=1, keepdims=True)
    onehot = np.eye(num_actions)[actions_np]
    entropy = -(pi * np.log(pi)).sum(axis=1, keepdims=True)
    d_entropy = -pi * (np.log(pi) + entropy)
    advantage = (returns_np - values_np)[:, None]
    np.testing.assert_allclose(logits.grad.numpy(), (pi - onehot) * advantage - 0.01 * d_entropy,
                               rtol=1e-4, atol=1e-6)

    mean = losses.a3c_loss(_t(logits_np), _t(values_np), _t(actions_np, torch.int64), returns,
                           reduction="mean")
    assert mean["total"].item() == pytest.approx(expected["total"] / num_steps, rel=1e-5)


def test_a3c_loss_batched_rollout_equals_sum_of_columns():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 3, 6))
    values, returns = rng.normal(size=(2, 4, 3))
    actions = rng.integers(0, 6, (4, 3))
    batched = losses.a3c_loss(_t(logits), _t(values), _t(actions, torch.int64), _t(returns))
    columns = [losses.a3c_loss(_t(logits[:, b]), _t(values[:, b]), _t(actions[:, b], torch.int64),
                               _t(returns[:, b])) for b in range(3)]
    for key in batched:
        assert batched[key].item() == pytest.approx(sum(c[key].item() for c in columns), rel=1e-5)
