"""Tests for hpcrl.rl.policies: schedules, epsilon-greedy, final epsilons, the loss-outlier filter."""

import math

import numpy as np
import pytest

from hpcrl.rl.policies import (LinearSchedule, LossOutlierFilter, epsilon_greedy,
                                epsilon_greedy_lazy, learning_rate, linear_lr,
                                sample_final_epsilon)


def test_linear_schedule_by_hand():
    # 1.0 -> 0.1 over 1000 frames: slope -0.0009 per frame.
    schedule = LinearSchedule(1.0, 0.1, 1000)
    assert schedule.value(0) == 1.0
    assert schedule.value(250) == pytest.approx(0.775)
    assert schedule.value(500) == pytest.approx(0.55)
    assert schedule.value(1000) == pytest.approx(0.1)
    assert schedule.value(5000) == pytest.approx(0.1)
    assert schedule(-10) == 1.0
    # Starting at frame 100, rising 0 -> 2 over 50 frames.
    late = LinearSchedule(0.0, 2.0, 50, begin_frame=100)
    assert [late(f) for f in (0, 100, 110, 125, 150, 151)] == pytest.approx(
        [0.0, 0.0, 0.4, 1.0, 2.0, 2.0])
    jump = LinearSchedule(1.0, 0.5, 0, begin_frame=10)
    assert (jump(9), jump(10)) == (1.0, 0.5)


def test_linear_lr_by_hand():
    assert linear_lr(0.01, 0, 1000) == 0.01
    assert linear_lr(0.01, 250, 1000) == pytest.approx(0.0075)
    assert linear_lr(0.01, 1000, 1000) == 0.0
    assert linear_lr(0.01, 1200, 1000) == 0.0


def test_learning_rate_anneals_over_its_own_horizon():
    from hpcrl.config import Config

    cfg = Config(learning_rate=0.01, lr_anneal=True, total_frames=1000)
    assert learning_rate(cfg, 250) == pytest.approx(0.0075)            # horizon = total_frames
    longer = cfg.replace(lr_anneal_frames=4000)                         # 1/16 of the way at 250
    assert learning_rate(longer, 250) == pytest.approx(0.01 * (1 - 250 / 4000))
    assert learning_rate(longer, 1000) == pytest.approx(0.0075)
    assert learning_rate(cfg.replace(lr_anneal=False), 999) == 0.01


def test_learning_rate_warms_up_then_anneals():
    from hpcrl.config import Config

    cfg = Config(learning_rate=0.01, lr_warmup_frames=100)
    assert learning_rate(cfg, 0) == 0.0
    assert learning_rate(cfg, 25) == pytest.approx(0.0025)
    assert learning_rate(cfg, 100) == 0.01
    assert learning_rate(cfg, 5000) == 0.01
    both = cfg.replace(lr_anneal=True, total_frames=1000)                # 0.01 * 0.95 * 0.5 at 50
    assert learning_rate(both, 50) == pytest.approx(0.01 * (1 - 50 / 1000) * 0.5)
    assert learning_rate(both, 400) == pytest.approx(0.01 * 0.6)


def _frequencies(actions, num_actions):
    return np.bincount(actions, minlength=num_actions) / len(actions)


def _assert_close_to(freq, probs, n):
    # 5 binomial standard deviations per action; fixed seeds make this deterministic.
    bound = 5 * np.sqrt(np.asarray(probs) * (1 - np.asarray(probs)) / n) + 1e-12
    assert np.all(np.abs(freq - probs) <= bound), (freq, probs)


def test_epsilon_greedy_frequencies():
    n = 40_000
    rng = np.random.default_rng(0)
    # Greedy action 1; epsilon 0.3 over 3 actions: P = [0.1, 0.7 + 0.1, 0.1].
    q = np.tile([1.0, 3.0, 2.0], (n, 1))
    actions = epsilon_greedy(q, 0.3, rng)
    assert actions.dtype == np.int64 and actions.shape == (n,)
    _assert_close_to(_frequencies(actions, 3), [0.1, 0.8, 0.1], n)
    # epsilon 0: always greedy; epsilon 1: uniform.
    assert np.all(epsilon_greedy(q, 0.0, rng) == 1)
    _assert_close_to(_frequencies(epsilon_greedy(q, 1.0, rng), 3), [1 / 3] * 3, n)


def test_epsilon_greedy_breaks_ties_uniformly():
    n = 40_000
    rng = np.random.default_rng(1)
    q = np.tile([2.0, 5.0, 5.0, 1.0], (n, 1))
    # epsilon 0: actions 1 and 2 half of the time each, never 0 or 3.
    _assert_close_to(_frequencies(epsilon_greedy(q, 0.0, rng), 4), [0.0, 0.5, 0.5, 0.0], n)
    # epsilon 0.2: 0.2 / 4 = 0.05 each from exploring, plus 0.8 / 2 = 0.4 for each tied action.
    _assert_close_to(_frequencies(epsilon_greedy(q, 0.2, rng), 4), [0.05, 0.45, 0.45, 0.05], n)
    # All equal (a fresh network): uniform, not always action 0.
    _assert_close_to(_frequencies(epsilon_greedy(np.zeros((n, 4)), 0.0, rng), 4), [0.25] * 4, n)


def test_epsilon_greedy_single_and_per_row_epsilon():
    rng = np.random.default_rng(2)
    action = epsilon_greedy(np.array([0.0, 1.0, -1.0]), 0.0, rng)
    assert isinstance(action, int) and action == 1
    n = 20_000
    q = np.tile([0.0, 1.0], (n, 1))
    epsilons = np.where(np.arange(n) % 2 == 0, 0.0, 1.0)  # Even rows greedy, odd rows uniform.
    actions = epsilon_greedy(q, epsilons, rng)
    assert np.all(actions[0::2] == 1)
    _assert_close_to(_frequencies(actions[1::2], 2), [0.5, 0.5], n // 2)
    # Same seed, same actions.
    a = epsilon_greedy(q[:100], 0.5, np.random.default_rng(7))
    b = epsilon_greedy(q[:100], 0.5, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)


def _eager_epsilon_greedy(q, epsilon, rng):
    """The rule as it reads on paper, Q-values always at hand: explore draws, uniform actions,
    tie-breaking draws, then the masked choice; returns the actions and the explore mask."""
    batch, num_actions = q.shape
    explore = rng.random(batch) < np.asarray(epsilon)
    uniform = rng.integers(0, num_actions, batch)
    tie_draws = rng.random((batch, num_actions))
    greedy = [max((a for a in range(num_actions) if q[i, a] == q[i].max()),
                  key=lambda a: tie_draws[i, a]) for i in range(batch)]
    return np.where(explore, uniform, greedy), explore


@pytest.mark.parametrize("batch, epsilon", [(1, 0.9), (1, 0.05), (8, 0.6), (8, "per row"),
                                            (3, 1.0), (3, 0.0)])
def test_lazy_epsilon_greedy_reads_q_only_when_some_row_is_greedy(batch, epsilon):
    """The same actions and generator position as the eager rule, step after step, with
    Q-values full of ties; Q is asked for exactly on the steps where some row acts greedily
    (never at epsilon 1, every step at 0)."""
    if epsilon == "per row":
        epsilon = np.linspace(0.5, 1.0, batch)
    values = np.random.default_rng(0)
    lazy_rng, eager_rng = np.random.default_rng(7), np.random.default_rng(7)
    asked = needed = 0
    steps = 400
    for _ in range(steps):
        q = values.integers(0, 3, (batch, 4)).astype(np.float32)

        def q_values(q=q):
            nonlocal asked
            asked += 1
            return q
        actions = epsilon_greedy_lazy(q_values, batch, 4, epsilon, lazy_rng)
        expected, explore = _eager_epsilon_greedy(q, epsilon, eager_rng)
        np.testing.assert_array_equal(actions, expected)
        assert actions.dtype == np.int64
        needed += not explore.all()
    assert lazy_rng.random() == eager_rng.random()
    assert asked == needed
    if np.all(np.asarray(epsilon) == 1.0):
        assert asked == 0
    if np.all(np.asarray(epsilon) == 0.0):
        assert asked == steps
    if batch == 1 and epsilon == 0.9:
        assert 0.05 * steps < asked < 0.2 * steps


def test_evaluation_policy_runs_the_network_only_when_it_acts_greedily():
    """FixedEpsilonPolicy (the evaluation protocol's epsilon): no forward at epsilon 1, one per
    step at 0, whose actions are the network's argmax."""
    import torch

    from hpcrl.rl.acting import FixedEpsilonPolicy
    from hpcrl.rl.networks import MLPQNetwork

    torch.manual_seed(0)
    net = MLPQNetwork(3, 5, hidden=(8,))
    calls = []
    net.register_forward_hook(lambda *_: calls.append(1))
    obs = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    FixedEpsilonPolicy(net, 1.0, np.random.default_rng(2)).act(obs)
    assert calls == []
    actions = FixedEpsilonPolicy(net, 0.0, np.random.default_rng(2)).act(obs)
    assert calls == [1]
    with torch.no_grad():
        np.testing.assert_array_equal(actions, net(torch.from_numpy(obs)).argmax(1).numpy())


def test_sample_final_epsilon_distribution():
    rng = np.random.default_rng(3)
    n = 30_000
    draws = np.array([sample_final_epsilon(rng) for _ in range(n)])
    values = [0.1, 0.01, 0.5]
    assert set(np.unique(draws).tolist()) == set(values)
    observed = np.array([np.sum(draws == v) for v in values])
    expected = n * np.array([0.4, 0.3, 0.3])
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    assert chi2 < 13.8  # 2 degrees of freedom, p = 0.001.
    # A wrong distribution (uniform) would be far outside that bound.
    uniform = np.full(3, n / 3)
    assert float(np.sum((uniform - expected) ** 2 / expected)) > 100


def test_final_epsilon_high_replaces_the_half_random_environments():
    """The config's final_epsilon_high takes the place of 0.5 in each environment's draw,
    through the policy the value methods' workers build (same rng: the same environments)."""
    import torch

    from hpcrl.rl.acting import EpsilonGreedyPolicy

    net = torch.nn.Linear(4, 2)
    paper = EpsilonGreedyPolicy(net, 64, 1000, 4, np.random.default_rng(5))
    capped = EpsilonGreedyPolicy(net, 64, 1000, 4, np.random.default_rng(5),
                                 final_epsilon_high=0.1)
    assert set(paper.final_epsilons.tolist()) == {0.1, 0.01, 0.5}
    half = paper.final_epsilons == 0.5
    np.testing.assert_array_equal(capped.final_epsilons[half], 0.1)
    np.testing.assert_array_equal(capped.final_epsilons[~half], paper.final_epsilons[~half])


def _reference_filter(losses, k_std, warmup, window):
    """Loop reference: keep the list of values fed to the statistics and recompute them.

    mean/std are the population statistics of the fed values weighted as alpha_n =
    max(1/n, 1/window) (plain mean/std when window is None); a rejected loss feeds the
    threshold it exceeded; non-finite losses feed nothing.
    """
    fed, decisions = [], []
    for loss in losses:
        x = abs(loss)
        if not math.isfinite(x):
            decisions.append(False)
            continue
        if len(fed) < warmup:
            fed.append(x)
            decisions.append(True)
            continue
        mean, var = 0.0, 0.0
        for n, value in enumerate(fed, start=1):  # Same weights, written as a separate loop.
            alpha = 1.0 / n if window is None else max(1.0 / n, 1.0 / window)
            mean, var = (mean + alpha * (value - mean),
                         (1 - alpha) * (var + alpha * (value - mean) ** 2))
        threshold = mean + k_std * math.sqrt(var)
        decisions.append(x <= threshold)
        fed.append(x if x <= threshold else threshold)
    return decisions


def test_outlier_filter_hand_worked():
    # k = 1, warm-up 3, cumulative statistics.
    #   1, 3, 2: warm-up, accepted. mean 2, var ((-1)^2 + 1^2 + 0) / 3 = 2/3, std 0.8165
    #   -2.5: |loss| 2.5 <= 2 + 0.8165: accepted. Stats of [1, 3, 2, 2.5]: mean 2.125,
    #         var (1.265625 + 0.765625 + 0.015625 + 0.140625) / 4 = 0.546875, threshold 2.8645
    #   10: rejected; fed as 2.8645 -> stats of [1, 3, 2, 2.5, 2.8645]: mean 2.27291
    #   nan, inf: rejected, stats unchanged.
    filt = LossOutlierFilter(k_std=1.0, warmup=3, window=None)
    assert [filt.accept(x) for x in (1.0, 3.0, 2.0)] == [True, True, True]
    assert filt.mean == pytest.approx(2.0) and filt.std == pytest.approx(math.sqrt(2 / 3))
    assert filt.accept(-2.5)
    assert filt.mean == pytest.approx(2.125)
    assert filt.std ** 2 == pytest.approx(0.546875)
    assert filt.threshold == pytest.approx(2.125 + math.sqrt(0.546875))
    assert not filt.accept(10.0)
    fed = [1.0, 3.0, 2.0, 2.5, 2.125 + math.sqrt(0.546875)]
    assert filt.mean == pytest.approx(np.mean(fed)) and filt.std == pytest.approx(np.std(fed))
    assert not filt.accept(float("nan"))
    assert not filt.accept(float("inf"))
    assert filt.mean == pytest.approx(np.mean(fed))
    assert (filt.num_accepted, filt.num_rejected, filt.num_nonfinite) == (4, 3, 2)


def test_outlier_filter_rejects_nonfinite_even_in_warmup_and_when_off():
    for filt in (LossOutlierFilter(k_std=3.0, warmup=10), LossOutlierFilter(k_std=0.0, warmup=0)):
        assert not filt.accept(float("nan"))
        assert not filt.accept(-float("inf"))
        assert filt.accept(1.0) and filt.accept(1e6)  # Warm-up / test off: any finite loss.
        assert filt.num_nonfinite == 2


@pytest.mark.parametrize("window", [None, 20])
def test_outlier_filter_matches_reference(window):
    rng = np.random.default_rng(4)
    losses = np.abs(rng.normal(1.0, 0.3, 300))
    losses[rng.integers(0, 300, 15)] *= 20  # Spikes.
    losses[150:] *= 1.5  # A genuine upward drift.
    losses[[40, 200]] = np.nan
    filt = LossOutlierFilter(k_std=3.0, warmup=10, window=window)
    got = [filt.accept(x) for x in losses]
    assert got == _reference_filter(losses.tolist(), 3.0, 10, window)
    assert filt.num_accepted + filt.num_rejected == 300
    assert 15 <= filt.num_rejected < 60  # The spikes (and NaNs) go; the drift does not lock out.


def test_outlier_filter_adapts_to_a_persistent_shift():
    # With winsorised updates a 10x shift is rejected at first, then accepted again.
    filt = LossOutlierFilter(k_std=3.0, warmup=20, window=50)
    rng = np.random.default_rng(5)
    for x in rng.normal(1.0, 0.1, 200):
        filt.accept(x)
    shifted = [filt.accept(x) for x in rng.normal(10.0, 1.0, 2000)]
    assert not shifted[0]
    assert all(shifted[-100:])


def test_outlier_filter_state_round_trip():
    rng = np.random.default_rng(6)
    losses = np.abs(rng.normal(1.0, 0.5, 100))
    a = LossOutlierFilter(k_std=2.0, warmup=5, window=30)
    for x in losses[:60]:
        a.accept(x)
    b = LossOutlierFilter(k_std=2.0, warmup=5, window=30)
    b.set_state({k: np.array(v) for k, v in a.get_state().items()})
    assert [a.accept(x) for x in losses[60:]] == [b.accept(x) for x in losses[60:]]
    state_a, state_b = a.get_state(), b.get_state()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        np.testing.assert_array_equal(state_a[key], state_b[key], err_msg=key)
    assert a.num_rejected > 0  # The round trip covered a rejection.
