"""Observation normalisation (obs_norm): the moment merge against numpy over the whole data,
the layer's output by hand, and that only `observe` moves the statistics."""

import numpy as np
import pytest
import torch

from hpcrl.config import ConfigError, load_config
from hpcrl.rl.networks import build_network
from hpcrl.rl.obs_norm import ObsNormalizer, ReturnScaler, find_obs_normalizer, merge_moments, \
    variance


def test_merged_moments_are_those_of_all_the_data():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 5.0, size=(b, 4)) * [1, 10, 0.1, 1e3] for b in (1, 7, 1, 30, 2)]
    count, mean, m2 = 0.0, np.zeros(4), np.zeros(4)
    for batch in batches:
        count, mean, m2 = merge_moments(count, mean, m2, batch)
    data = np.concatenate(batches)
    assert count == len(data)
    np.testing.assert_allclose(mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(variance(count, m2), data.var(axis=0), rtol=1e-10)


def test_an_empty_batch_changes_nothing_and_no_data_means_unit_variance():
    assert merge_moments(0.0, np.zeros(2), np.zeros(2), np.zeros((0, 2)))[0] == 0.0
    np.testing.assert_array_equal(variance(0.0, np.zeros(3)), np.ones(3))


def test_normalised_observation_by_hand():
    norm = ObsNormalizer(2, clip=10.0)
    x = torch.tensor([[3.0, 0.0]])
    torch.testing.assert_close(norm(x), x)                   # no data yet: the identity
    norm.observe(np.array([[0.0, 10.0], [2.0, 30.0]]))       # mean (1, 20), variance (1, 100)
    torch.testing.assert_close(norm(x), torch.tensor([[2.0, -2.0]]), rtol=1e-6, atol=1e-6)
    norm.clip = 1.5
    torch.testing.assert_close(norm(x), torch.tensor([[1.5, -1.5]]))


def test_forward_never_moves_the_statistics_and_state_dict_carries_them():
    norm = ObsNormalizer(3)
    norm.observe(np.arange(12.0).reshape(4, 3))
    before = norm.get_state()
    out = norm(torch.ones(5, 3))
    for key, value in norm.get_state().items():
        np.testing.assert_array_equal(value, before[key])
    other = ObsNormalizer(3)
    other.load_state_dict(norm.state_dict())                 # the exported file's path
    torch.testing.assert_close(other(torch.ones(5, 3)), out)
    third = ObsNormalizer(3)
    third.set_state(before)                                  # a checkpoint's path
    torch.testing.assert_close(third(torch.ones(5, 3)), out)
    with pytest.raises(ValueError, match="coordinates"):
        ObsNormalizer(2).set_state(before)


def _cfg(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


def test_the_gaussian_network_normalises_only_with_obs_norm(tmp_path):
    plain = _cfg(tmp_path, 'algo = "a3c"\ngame = "InvertedPendulum-v5"\n')
    normed = _cfg(tmp_path, 'algo = "a3c"\ngame = "InvertedPendulum-v5"\nobs_norm = true\n'
                            'obs_norm_clip = 5.0\n')
    assert find_obs_normalizer(build_network(plain, (4,), 1)) is None
    net = build_network(normed, (4,), 1)
    assert find_obs_normalizer(net).clip == 5.0
    # statistics are buffers: the parameter servers' flat vector is the same size
    assert sum(p.numel() for p in net.parameters()) == \
        sum(p.numel() for p in build_network(plain, (4,), 1).parameters())
    torch.manual_seed(0)
    obs = torch.randn(3, 4) * 100
    find_obs_normalizer(net).observe(obs.numpy())
    normalised = find_obs_normalizer(net)(obs)
    plain_net = build_network(plain, (4,), 1)
    plain_net.load_state_dict({k: v for k, v in net.state_dict().items()
                               if not k.startswith("obs_norm.")})
    torch.testing.assert_close(net(obs)[0], plain_net(normalised)[0])


def test_obs_norm_is_refused_outside_continuous_control(tmp_path):
    with pytest.raises(ConfigError, match="obs_norm"):
        _cfg(tmp_path, 'algo = "a3c"\ngame = "pong"\nobs_norm = true\n')


def test_observations_with_nan_or_inf_are_left_out():
    norm = ObsNormalizer(2)
    norm.observe(np.array([[1.0, 2.0], [np.nan, 0.0], [3.0, np.inf], [3.0, 4.0]]))
    state = norm.get_state()
    assert state["count"] == 2.0
    np.testing.assert_array_equal(state["mean"], [2.0, 3.0])
    assert torch.isfinite(norm(torch.ones(1, 2))).all()


class _ReferenceRunningMeanStd:
    """Stable-Baselines3's RunningMeanStd and VecNormalize reward path, written out plainly
    (the slow reference for ReturnScaler): a prior of weight 1e-4, mean 0, variance 1."""

    def __init__(self, num_envs, gamma, clip):
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4
        self.returns = [0.0] * num_envs
        self.gamma, self.clip = gamma, clip

    def update(self, xs):
        batch_mean = sum(xs) / len(xs)
        batch_var = sum((x - batch_mean) ** 2 for x in xs) / len(xs)
        n = self.count + len(xs)
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * len(xs) + delta ** 2 * self.count * len(xs) / n
        self.mean, self.var, self.count = self.mean + delta * len(xs) / n, m2 / n, n

    def step(self, rewards, dones):
        self.returns = [g * self.gamma + r for g, r in zip(self.returns, rewards)]
        self.update(self.returns)
        out = [max(-self.clip, min(self.clip, r / (self.var + 1e-8) ** 0.5)) for r in rewards]
        self.returns = [0.0 if d else g for g, d in zip(self.returns, dones)]
        return out


def test_reward_scaling_follows_the_reference_step_for_step():
    rng = np.random.default_rng(1)
    scaler, ref = ReturnScaler(3, 0.99, clip=10.0), _ReferenceRunningMeanStd(3, 0.99, 10.0)
    for _ in range(500):
        rewards = rng.normal(2.0, 5.0, 3) * 30        # HalfCheetah-like scale
        dones = rng.random(3) < 0.02
        np.testing.assert_allclose(scaler.scale(rewards, dones), ref.step(rewards, dones),
                                   rtol=1e-5)
    # the scaled rewards are of order 1 (the raw ones are of order 100)
    assert 0.05 < np.abs(scaler.scale(rng.normal(2.0, 5.0, 3) * 30, np.zeros(3, bool))).mean() < 3


def test_reward_scaling_state_round_trip_continues_exactly():
    rng = np.random.default_rng(2)
    a = ReturnScaler(2, 0.9)
    for _ in range(50):
        a.scale(rng.normal(size=2), rng.random(2) < 0.1)
    b = ReturnScaler(2, 0.9)
    b.set_state(a.get_state())
    for _ in range(20):
        r, d = rng.normal(size=2), rng.random(2) < 0.1
        np.testing.assert_array_equal(a.scale(r, d), b.scale(r, d))
    with pytest.raises(ValueError, match="environments"):
        ReturnScaler(3, 0.9).set_state(a.get_state())


def test_reward_norm_is_a3c_only_and_obs_norm_continuous_control_only(tmp_path):
    """reward_norm scales A3C's training rewards on any task (e.g. CartPole's returns of up to
    100 at gamma 0.99 for an LSTM's bounded output); obs_norm stays with continuous control,
    and neither goes with the value methods."""
    cfg = _cfg(tmp_path, 'algo = "a3c"\ngame = "CartPole-v1"\nreward_norm = true\n')
    assert cfg.reward_norm
    with pytest.raises(ConfigError, match="key 'reward_norm' applies to algo 'a3c' only"):
        _cfg(tmp_path, 'algo = "n_step_q"\ngame = "CartPole-v1"\nreward_norm = true\n')
    with pytest.raises(ConfigError, match="key 'obs_norm' applies to algo 'a3c' on a "
                                          "continuous-control task only"):
        _cfg(tmp_path, 'algo = "a3c"\ngame = "CartPole-v1"\nobs_norm = true\n')


def test_a_separate_value_network_shares_no_parameter_with_the_policy(tmp_path):
    """value_network = "separate" (the paper's S9): HalfCheetah's 17 observations, 6 actions,
    200 hidden units: the policy 17*200+200 + 200*12+12 = 6,012, the value 17*200+200 + 201 =
    3,801 parameters; the value's gradient reaches none of the policy's and vice versa."""
    cfg = _cfg(tmp_path, 'algo = "a3c"\ngame = "HalfCheetah-v5"\nmlp_hidden = 200\n'
                         'value_network = "separate"\ninit = "orthogonal"\n')
    net = build_network(cfg, (17,), 6)
    assert sum(p.numel() for p in net.parameters()) == 6_012 + 3_801
    policy, value, _ = net(torch.randn(4, 17))
    value.sum().backward()
    grads = {n for n, p in net.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads == {"value_torso.0.weight", "value_torso.0.bias", "value_head.weight",
                     "value_head.bias"}
    net.zero_grad(set_to_none=True)
    policy, _, _ = net(torch.randn(4, 17))
    policy.sum().backward()
    grads = {n for n, p in net.named_parameters() if p.grad is not None}
    assert grads == {"torso.0.weight", "torso.0.bias", "policy_head.weight", "policy_head.bias"}
    # orthogonal init reaches the value's hidden layer too (gain sqrt 2, zero biases)
    w = net.value_torso[0].weight.detach()
    assert torch.count_nonzero(net.value_torso[0].bias) == 0
    torch.testing.assert_close(w.T @ w, 2.0 * torch.eye(17), rtol=1e-4, atol=1e-4)
    with pytest.raises(ConfigError, match="value_network"):
        _cfg(tmp_path, 'algo = "a3c"\ngame = "HalfCheetah-v5"\nvalue_network = "separate"\n'
                       'lstm = true\n')
    with pytest.raises(ConfigError, match="value_network"):
        _cfg(tmp_path, 'algo = "a3c"\ngame = "pong"\nvalue_network = "separate"\n')


def test_a_non_finite_reward_does_not_poison_the_reward_statistics():
    scaler = ReturnScaler(2, 0.9)
    scaler.scale(np.array([1.0, 2.0]), np.zeros(2, bool))
    out = scaler.scale(np.array([np.nan, 2.0]), np.zeros(2, bool))
    assert np.isnan(out[0]) and np.isfinite(out[1])
    state = scaler.get_state()
    assert np.isfinite(state["mean"]).all() and np.isfinite(state["m2"]).all()
    assert state["returns"][0] == 0.0
    assert np.isfinite(scaler.scale(np.array([1.0, 1.0]), np.zeros(2, bool))).all()
