"""Tests for hpcrl.rl.losses (every target, return and loss the learners use) against
hand-worked numbers and slow loop references."""

import numpy as np
import pytest
import torch

from hpcrl.rl import losses
from hpcrl.rl.losses import (bootstrap_returns, n_step_q_targets, one_step_targets, rollout_cuts,
                             sarsa_next_actions, value_targets)

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
    y_sarsa = losses.one_step_targets(args["r_t"].numpy(), args["discount_t"].numpy(),
                                      q_t.detach().numpy(), 0.9, a_t=np.array([2, 1]))
    td_sarsa = losses.td_error(q_tm1, args["a_tm1"], y_sarsa)
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
    y_s = losses.one_step_targets(r_t.astype(np.float32), discount_t.astype(np.float32),
                                  q_t.astype(np.float32), gamma, a_t=a_t)
    td_s = losses.td_error(_t(q_tm1), _t(a_tm1, torch.int64), y_s)
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


def _returns_without_cuts(r, discount, bootstrap, gamma):
    """`bootstrap_returns` of one rollout with no episode end inside: only the last step
    bootstraps, from ``bootstrap`` (the value of the state after the rollout)."""
    boot = np.zeros(np.shape(r), np.float32)
    boot[-1] = bootstrap
    cuts = losses.rollout_cuts(np.zeros(np.shape(r), bool))
    return losses.bootstrap_returns(np.asarray(r), np.asarray(discount), cuts, boot, gamma)


def test_n_step_returns_by_hand_with_episode_end_inside():
    # gamma 0.5, r = [1, 2, 3, 4], episode ends after step 1 (discount_1 = 0), bootstrap 8:
    #   R_3 = 4 + 0.5 * 8 = 8;  R_2 = 3 + 0.5 * 8 = 7;  R_1 = 2 (terminal next state);
    #   R_0 = 1 + 0.5 * 2 = 2
    got = _returns_without_cuts(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 0.0, 1.0, 1.0]),
                                np.float32(8.0), 0.5)
    np.testing.assert_allclose(got, [2.0, 2.0, 7.0, 8.0])


def test_n_step_returns_batched_matches_reference():
    rng = np.random.default_rng(1)
    num_steps, batch, gamma = 7, 5, 0.9
    r = rng.normal(size=(num_steps, batch))
    discount = (rng.random((num_steps, batch)) < 0.7).astype(float)
    bootstrap = rng.normal(size=batch)
    got = _returns_without_cuts(r, discount, bootstrap, gamma)
    assert got.shape == (num_steps, batch) and got.dtype == np.float32
    for b in range(batch):
        expected = _reference_n_step_returns(r[:, b], discount[:, b], bootstrap[b], gamma)
        np.testing.assert_allclose(got[:, b], expected, rtol=1e-5, atol=1e-5)
        got_1d = _returns_without_cuts(r[:, b], discount[:, b], bootstrap[b], gamma)
        np.testing.assert_allclose(got_1d, expected, rtol=1e-5, atol=1e-5)


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
    returns = torch.from_numpy(_returns_without_cuts(r, discount, 0.3, 0.99))
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


# ------------------------------------------------------------------ targets of rollouts [T, N]
def col(*xs, dtype=np.float32):
    """A [T, 1] column (one environment)."""
    return np.array(xs, dtype)[:, None]


# ------------------------------------------------------------------------------ n-step returns
def test_n_step_q_targets_terminal_in_the_middle():
    # gamma 0.5; step 1 ends the episode at a terminal state (discount 0).
    #   step     0   1*  2   3
    #   r        1   2   3   4
    #   max q_t 10  20  30  40   (max_a Q(s_t, a; theta-))
    # R3 = 4 + .5 * 40 = 24; R2 = 3 + .5 * 24 = 15; R1 = 2 (terminal); R0 = 1 + .5 * 2 = 2
    q_t = np.stack([col(10, 20, 30, 40), col(0, 0, 0, 0)], axis=-1)     # [T, 1, 2]
    y = n_step_q_targets(col(1, 2, 3, 4), col(1, 0, 1, 1), col(0, 1, 0, 0, dtype=bool), q_t, 0.5)
    np.testing.assert_allclose(y[:, 0], [2, 2, 15, 24])


def test_n_step_returns_time_limit_in_the_middle_bootstraps_there():
    # Same rollout, but the episode is cut by the time limit at step 1 (discount 1): R1
    # bootstraps from its own s_t: R1 = 2 + .5 * 20 = 12; R0 = 1 + .5 * 12 = 7.
    y = bootstrap_returns(col(1, 2, 3, 4), col(1, 1, 1, 1), col(0, 1, 0, 1, dtype=bool),
                          col(10, 20, 30, 40), 0.5)
    np.testing.assert_allclose(y[:, 0], [7, 12, 15, 24])


def test_bootstrap_returns_matches_the_forward_sum_without_cuts_and_a_slow_loop():
    rng = np.random.default_rng(0)
    T, N, gamma = 6, 3, 0.9
    r = rng.normal(size=(T, N)).astype(np.float32)
    d = (rng.random((T, N)) > 0.2).astype(np.float32)
    boot = rng.normal(size=(T, N)).astype(np.float32)
    no_cuts = rollout_cuts(np.zeros((T, N), bool))
    ours = bootstrap_returns(r, d, no_cuts, boot, gamma)
    for n in range(N):
        ref = _reference_n_step_returns(r[:, n], d[:, n], boot[-1, n], gamma)
        np.testing.assert_allclose(ours[:, n], ref, rtol=1e-5, atol=1e-6)
    end = rng.random((T, N)) < 0.3
    ours = bootstrap_returns(r, d, rollout_cuts(end), boot, gamma)
    for n in range(N):                 # the paper's backward loop, restarting at every cut
        R = 0.0
        for i in reversed(range(T)):
            nxt = boot[i, n] if (end[i, n] or i == T - 1) else R
            R = r[i, n] + gamma * d[i, n] * nxt
            assert ours[i, n] == pytest.approx(R, rel=1e-6)


def test_rollout_cuts_marks_ends_and_last_step():
    end = np.array([[0, 1], [1, 0], [0, 0]], bool)
    np.testing.assert_array_equal(rollout_cuts(end), [[0, 1], [1, 0], [1, 1]])
    assert not end[-1].any()           # input untouched


# ------------------------------------------------------------------------------ one-step targets
Q_T_ROLLOUT = np.array([[1, 5], [3, 2], [0, 4]], np.float32)[:, None]     # [T=3, N=1, A=2]


def test_one_step_q_and_sarsa_targets_differ_by_the_action_taken():
    # gamma .9, r = 1, 0, 2, no terminal; actions taken a_tm1 = 1, 0, 0 and a' = 0 after.
    # Q-learning: y = r + .9 max q_t       = 1 + 4.5, 0 + 2.7, 2 + 3.6 = 5.5, 2.7, 5.6
    # Sarsa:      a_t = 0, 0, 0 (next actions): y = 1 + .9, 0 + 2.7, 2 + 0 = 1.9, 2.7, 2.0
    r, d = col(1, 0, 2), col(1, 1, 1)
    a_tm1, end = col(1, 0, 0, dtype=np.int64), col(0, 0, 0, dtype=bool)
    np.testing.assert_allclose(one_step_targets(r, d, Q_T_ROLLOUT, 0.9)[:, 0], [5.5, 2.7, 5.6], rtol=1e-6)
    a_t = sarsa_next_actions(a_tm1, np.array([0]), end, Q_T_ROLLOUT)
    np.testing.assert_array_equal(a_t[:, 0], [0, 0, 0])
    np.testing.assert_allclose(one_step_targets(r, d, Q_T_ROLLOUT, 0.9, a_t)[:, 0], [1.9, 2.7, 2.0],
                               rtol=1e-6)
    np.testing.assert_allclose(value_targets("one_step_sarsa", r, d, end, a_tm1, Q_T_ROLLOUT, 0.9,
                                             np.array([0])),
                               [[1.9], [2.7], [2.0]], rtol=1e-6)


def test_one_step_targets_with_an_episode_end_in_the_middle():
    # Step 1 ends the episode at a terminal: its target is r only (0), and the action taken
    # next (a_tm1[2] = 1) belongs to the new episode, so Sarsa must not use it (argmax instead,
    # unused at a terminal). a' = 1 for the last step: y2 = 2 + .9 * q_t[2][1] = 5.6.
    r, d = col(1, 0, 2), col(1, 0, 1)
    a_tm1, end = col(0, 0, 1, dtype=np.int64), col(0, 1, 0, dtype=bool)
    a_t = sarsa_next_actions(a_tm1, np.array([1]), end, Q_T_ROLLOUT)
    np.testing.assert_array_equal(a_t[:, 0], [0, 0, 1])
    np.testing.assert_allclose(one_step_targets(r, d, Q_T_ROLLOUT, 0.9, a_t)[:, 0], [1.9, 0.0, 5.6],
                               rtol=1e-6)
    np.testing.assert_allclose(one_step_targets(r, d, Q_T_ROLLOUT, 0.9)[:, 0], [5.5, 0.0, 5.6], rtol=1e-6)
