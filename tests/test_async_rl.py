"""Asynchronous methods (Mnih et al. 2016): the one-step accumulation against a per-step loop, the LSTM reset through the rollout code, and one
short real run per method under mpiexec."""

import copy
import json

import numpy as np
import pytest
import torch

from hpcrl.agents.async_rl.learner import (AsyncLearner, actor_critic_bootstrap,
                                           actor_critic_outputs, clip_by_global_norm,
                                           target_q_values, unroll_actor_critic)
from hpcrl.agents.base import target_refreshes_due
from hpcrl.agents.async_rl.rollout import Rollout, collect_rollout, next_obs_before_reset
from hpcrl.bench.jobs import phase_fraction
from hpcrl.config import Config
from hpcrl.envs import make_env
from hpcrl.rl.acting import ActorCriticPolicy, EpsilonGreedyPolicy
from hpcrl.rl.losses import huber, value_targets
from hpcrl.rl.networks import build_actor_critic, build_q_network
from hpcrl.rl.policies import sample_from_logits
from hpcrl.runtime.profiling import PhaseClock
from tests.util import RecordsOutputs, run_mpi

torch.set_num_threads(1)


def col(*xs, dtype=np.float32):
    """A [T, 1] column (one environment)."""
    return np.array(xs, dtype)[:, None]


def test_one_step_gradient_equals_per_step_accumulation():
    """Algorithm 1 accumulates d(y - Q(s, a))^2 step by step; one batched backward must match."""
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    net = build_q_network((4,), 2, kind="mlp", hidden=8)
    target = copy.deepcopy(net)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(0.1)
    cfg = Config(algo="one_step_q", gamma=0.9, grad_clip_norm=0.0, loss="huber")
    T = 5
    s_tm1 = rng.normal(size=(T, 1, 4)).astype(np.float32)
    s_t = rng.normal(size=(T, 1, 4)).astype(np.float32)
    a = rng.integers(0, 2, (T, 1))
    r = rng.normal(size=(T, 1)).astype(np.float32) * 3
    d = col(1, 1, 0, 1, 1)
    rollout = Rollout(s_tm1, a, r, d, d == 0, s_t)
    grad = np.concatenate(AsyncLearner(net, target, cfg).gradient(rollout))
    net.zero_grad()
    for i in range(T):                       # the paper's loop, one transition at a time
        with torch.no_grad():
            y = r[i, 0] + 0.9 * d[i, 0] * target(torch.from_numpy(s_t[i])).max()
        q = net(torch.from_numpy(s_tm1[i]))[0, a[i, 0]]
        huber(y - q).backward()              # gradients accumulate in .grad
    ref = np.concatenate([p.grad.numpy().ravel() for p in net.parameters()])
    np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ A3C pieces
def test_actor_critic_bootstrap_only_at_cuts_that_are_not_terminal():
    torch.manual_seed(0)
    net = build_actor_critic((4,), 2, lstm=False, hidden=8)
    rng = np.random.default_rng(0)
    s_t = rng.normal(size=(3, 2, 4)).astype(np.float32)
    end = np.array([[1, 1], [0, 0], [0, 0]], bool)
    d = np.array([[0, 1], [1, 1], [1, 0]], np.float32)   # env 0 terminal at 0; env 1 cut at 0
    rollout = Rollout(s_t, np.zeros((3, 2), np.int64), np.zeros((3, 2), np.float32), d, end, s_t)
    v_t = actor_critic_bootstrap(net, rollout, [None] * 3)
    with torch.no_grad():
        v = net(torch.from_numpy(s_t.reshape(6, 4)))[1].numpy().reshape(3, 2)
    np.testing.assert_allclose(v_t, [[0, v[0, 1]], [0, 0], [v[2, 0], 0]], rtol=1e-6)


def test_one_pass_outputs_equal_unroll_plus_bootstrap():
    """The feed-forward fast path (bootstrap states batched with the rollout's) gives the same
    logits, values and bootstrap values as the two-pass reference."""
    torch.manual_seed(0)
    net = build_actor_critic((4,), 3, lstm=False, hidden=8)
    rng = np.random.default_rng(1)
    s_tm1 = rng.normal(size=(3, 2, 4)).astype(np.float32)
    s_t = rng.normal(size=(3, 2, 4)).astype(np.float32)
    end = np.array([[1, 1], [0, 0], [0, 0]], bool)
    d = np.array([[0, 1], [1, 1], [1, 0]], np.float32)
    rollout = Rollout(s_tm1, np.zeros((3, 2), np.int64), np.zeros((3, 2), np.float32), d, end,
                      s_t)
    logits, values, v_t = actor_critic_outputs(net, rollout)
    ref_logits, ref_values, after = unroll_actor_critic(net, rollout)
    ref_v_t = actor_critic_bootstrap(net, rollout, after)
    np.testing.assert_allclose(logits.detach().numpy(), ref_logits.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), ref_values.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(v_t, ref_v_t, rtol=1e-5)
    assert v_t[0, 0] == 0 and v_t[2, 1] == 0 and v_t[0, 1] != 0 and v_t[2, 0] != 0


class RecordingPolicy(RecordsOutputs, ActorCriticPolicy):
    pass


def test_lstm_state_reset_at_episode_ends_through_rollout_code():
    torch.manual_seed(0)
    net = build_actor_critic((4,), 2, lstm=True, hidden=8)
    env = make_env("CartPole-v1", 2, seed=3, training=True)
    policy = RecordingPolicy(net, 2, np.random.default_rng(0))
    obs = env.reset()
    first, obs = collect_rollout(env, obs, policy, 40, None)
    assert first.end_t.any()                       # random CartPole episodes last ~20 steps
    second, obs = collect_rollout(env, obs, policy, 40, None)
    acted = np.stack(policy.outputs)                # [80, 2, A]
    for k, rollout in enumerate((first, second)):
        with torch.no_grad():
            logits, _, _ = unroll_actor_critic(net, rollout)
        np.testing.assert_allclose(logits.numpy(), acted[40 * k:40 * (k + 1)], rtol=1e-5,
                                   atol=1e-6)
    # After an end, the next step starts from a zero state: same output as a fresh net call.
    i, n = map(int, np.argwhere(first.end_t[:-1])[0])
    with torch.no_grad():
        fresh, _, _ = net(torch.from_numpy(first.s_tm1[i + 1, n:n + 1]), None)
    np.testing.assert_allclose(acted[i + 1, n], fresh[0].numpy(), rtol=1e-5, atol=1e-6)
    # Across rollouts the state is carried, not reset (unless the last step ended an episode).
    h0 = second.state0[0]
    for n in range(2):
        assert (h0[n].abs().sum() > 0) != bool(first.end_t[-1, n])
    env.close()


class AlwaysLeft:
    """A policy that pushes every CartPole cart left: episodes end within about 10 steps."""

    state = None

    def act(self, obs):
        return np.zeros(len(obs), np.int64)

    def episode_end(self, end):
        pass


class RandomActions:
    """Uniform random actions from a seeded stream (the same stream for two identical envs)."""

    state = None

    def __init__(self, num_actions, seed):
        self.num_actions, self.rng = num_actions, np.random.default_rng(seed)

    def act(self, obs):
        return self.rng.integers(0, self.num_actions, len(obs))

    def episode_end(self, end):
        pass


def test_atari_rollouts_written_into_their_storage_equal_stacked_ones():
    """Where the env writes its observations into the rollout's storage (AtariEnv's ``out``),
    the rollouts are those of fresh observation arrays stacked at the end, field for field,
    across episode ends too (a frame cap of 120 frames: an episode every 30 agent steps), and
    s_t is s_tm1 shifted by one where no episode ended, without a copy."""
    from hpcrl.envs.atari import AtariEnv

    envs = [AtariEnv("breakout", 3, 4, training=True, max_episode_frames=120) for _ in range(2)]
    envs[1].obs_into = False                               # fresh arrays, stacked
    policies = [RandomActions(envs[0].num_actions, 8) for _ in range(2)]
    obs = [env.reset() for env in envs]
    ends = shared = 0
    for _ in range(14):
        got, want = [], []
        for k in range(2):
            rollout, obs[k] = collect_rollout(envs[k], obs[k], policies[k], 5, None)
            (got if k == 0 else want).append(rollout)
        for field in Rollout._fields[:-1]:
            np.testing.assert_array_equal(getattr(got[0], field), getattr(want[0], field))
        np.testing.assert_array_equal(obs[0], obs[1])
        ends += int(got[0].end_t.any())
        if not got[0].end_t.any():
            assert np.shares_memory(got[0].s_t, got[0].s_tm1)
            shared += 1
    assert ends >= 2 and shared >= 2
    with pytest.raises(ValueError, match="fresh"):
        envs[0].step(np.zeros(3, np.int64), out=obs[0])    # the previous step's observation
    for env in envs:
        env.close()


def test_collect_rollout_keeps_pre_reset_state_at_episode_ends():
    env = make_env("CartPole-v1", 1, seed=0, training=True)

    obs = env.reset()
    rollout, _ = collect_rollout(env, obs, AlwaysLeft(), 30, None)
    i = int(np.flatnonzero(rollout.end_t[:, 0])[0])
    assert rollout.discount_t[i, 0] == 0 and rollout.discount_t[:i, 0].all()
    assert abs(rollout.s_t[i, 0, 2]) > 0.2        # pole angle past the 12 degree limit
    assert abs(rollout.s_tm1[i + 1, 0]).max() <= 0.05   # a fresh reset state
    np.testing.assert_array_equal(rollout.s_t[:i, 0], rollout.s_tm1[1:i + 1, 0])
    env.close()


def test_next_obs_before_reset_for_stacks_and_vectors():
    obs = np.arange(2 * 3 * 1 * 1).reshape(2, 3, 1, 1)   # env 0: frames 0,1,2; env 1: 3,4,5
    last = np.array([[[9]], [[8]]])
    np.testing.assert_array_equal(next_obs_before_reset(obs, last)[:, :, 0, 0],
                                  [[1, 2, 9], [4, 5, 8]])
    vec = np.ones((2, 4))
    np.testing.assert_array_equal(next_obs_before_reset(vec, 2 * vec), 2 * vec)


def test_sample_from_logits_frequencies():
    rng = np.random.default_rng(0)
    logits = np.log(np.tile([[0.2, 0.5, 0.3]], (30000, 1)))
    freq = np.bincount(sample_from_logits(logits, rng.random(30000)), minlength=3) / 30000
    np.testing.assert_allclose(freq, [0.2, 0.5, 0.3], atol=0.01)
    assert sample_from_logits(np.array([[0.0, -1e9]]), np.array([0.999999]))[0] == 0


def test_sample_from_logits_inverse_cdf_by_hand():
    # p = [0.2, 0.5, 0.3] (logits shifted by 7: softmax does not care): CDF 0.2, 0.7, 1.0
    logits = np.tile(np.log([[0.2, 0.5, 0.3]]) + 7, (6, 1)).astype(np.float32)
    u = np.array([0.0, 0.19, 0.21, 0.69, 0.71, 0.9999])
    np.testing.assert_array_equal(sample_from_logits(logits, u), [0, 0, 1, 1, 2, 2])


def test_actor_critic_policy_state_resumes_its_uniform_stream():
    """Actions after a restore equal those of the uninterrupted policy, across the refill of
    its block of uniforms (256 draws)."""
    torch.manual_seed(0)
    net = build_actor_critic((4,), 3, lstm=False, hidden=8)
    obs = np.random.default_rng(5).normal(size=(2, 4)).astype(np.float32)
    first = ActorCriticPolicy(net, 2, np.random.default_rng(1))
    for _ in range(100):
        first.act(obs)
    saved = first.get_state()
    expected = [first.act(obs) for _ in range(200)]
    second = ActorCriticPolicy(net, 2, np.random.default_rng(99))
    second.set_state(saved)
    np.testing.assert_array_equal([second.act(obs) for _ in range(200)], expected)


def test_epsilon_greedy_policy_state_resumes_its_actions_and_schedules():
    """Actions after a restore equal those of the uninterrupted policy: RNG, sampled final
    epsilons and the annealing position all travel in the state."""
    torch.manual_seed(0)
    net = build_q_network((4,), 3, kind="mlp", hidden=8)
    obs = np.random.default_rng(5).normal(size=(3, 4)).astype(np.float32)
    first = EpsilonGreedyPolicy(net, 3, 400, 1, np.random.default_rng(1))
    for _ in range(50):
        first.act(obs)
    saved = first.get_state()
    expected = [first.act(obs) for _ in range(100)]
    second = EpsilonGreedyPolicy(net, 3, 400, 1, np.random.default_rng(99))
    second.set_state(saved)
    np.testing.assert_array_equal(second.final_epsilons, first.final_epsilons)
    np.testing.assert_array_equal([second.act(obs) for _ in range(100)], expected)
    np.testing.assert_allclose(second.epsilons(), first.epsilons())


def test_clip_by_global_norm():
    g = np.array([3, 4], np.float32)
    assert clip_by_global_norm(g, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(g, [0.6, 0.8], rtol=1e-6)
    g = np.array([3, 4], np.float32)
    clip_by_global_norm(g, 0.0)
    np.testing.assert_array_equal(g, [3, 4])
    pieces = [np.array([3], np.float32), np.array([], np.float32), np.array([12, 4], np.float32)]
    assert clip_by_global_norm(pieces, 6.5) == pytest.approx(13.0)       # sqrt(9 + 144 + 16)
    np.testing.assert_allclose(np.concatenate(pieces), [1.5, 6.0, 2.0], rtol=1e-6)


def test_target_refreshes_due_once_per_multiple():
    every, total, due = 10, 0, []
    for n in (4, 4, 4, 4, 4, 30, 0, 9):       # counter: 4 8 12 16 20 50 50 59
        total += n
        due.append(target_refreshes_due(total, n, every))
    assert due == [0, 0, 1, 0, 1, 3, 0, 0]    # 10; 20; 30, 40 and 50


# ------------------------------------------------------------------------------ real MPI runs
@pytest.mark.mpi
@pytest.mark.parametrize("algo, extra", [("one_step_q", []), ("one_step_sarsa", []),
                                         ("n_step_q", []), ("a3c", ["--set", "lstm=true"])])
def test_short_run_under_mpi(algo, extra, tmp_path):
    from hpcrl.io.metrics import read_metrics

    run_dir = tmp_path / "r"
    proc, _ = run_mpi(3, ["-m", "hpcrl.run", "--config", f"configs/{algo}_cartpole.toml",
                          "--set", "total_frames=3000", "--set", f"run_dir={run_dir}", *extra],
                      timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = read_metrics(run_dir / "metrics.h5")
    episodes = m["episodes"]
    assert len(episodes["return"]) > 10
    assert m["train"]["frames"][-1] >= 3000             # the whole budget was used
    assert (episodes["return"] >= 8).all()              # CartPole returns are >= 8 steps
    train = m["train"]
    measured = np.isfinite(train["grad_norm"])
    assert measured.any() and (train["grad_norm"][measured] > 0).all()
    clipped = train["clipped_fraction"][measured]
    assert ((clipped >= 0) & (clipped <= 1)).all()
    kept = train["clip_kept"][measured]             # 1 exactly where nothing was clipped
    assert ((kept > 0) & (kept <= 1)).all() and (kept[clipped == 0] == 1).all()
    assert (kept[clipped > 0] < 1).all()
    health, other = ("entropy", "max_q") if algo == "a3c" else ("max_q", "entropy")
    assert np.isfinite(train[health][measured]).all() and np.isnan(train[other]).all()
    if algo == "a3c":                                   # two actions: at most log 2 nats
        assert ((train["entropy"][measured] > 0) & (train["entropy"][measured] <= np.log(2)
                                                    + 1e-6)).all()


# ------------------------------------------------------------------------------ phase timing
def test_phase_fraction_by_hand():
    first = {"t": 100.0, "agent_steps": 1000, "env_s": 1.0, "forward_s": 1.0, "learn_s": 1.0}
    last = {"t": 110.0, "agent_steps": 5000, "env_s": 4.0, "forward_s": 3.0, "learn_s": 4.0}
    out = phase_fraction(first, last)     # 4000 steps in 10 s; busy 3 + 2 + 3 = 8 s
    assert out["steps_per_s"] == pytest.approx(400.0)
    assert out["bound_steps_per_s"] == pytest.approx(500.0)
    assert out["fraction"] == pytest.approx(0.8)
    assert out["env_ms_per_step"] == pytest.approx(0.75)
    assert out["forward_ms_per_step"] == pytest.approx(0.5)


def test_phase_clock_adds_wrapped_calls_and_writes_rows(tmp_path):
    ticks = iter([10.0, 10.5,   # env call: 0.5 s
                  11.0, 11.25,  # forward call: 0.25 s
                  12.0, 14.0,   # env call that raises: 2 s still counted
                  14.0, 14.0,   # maybe_write: due (nothing written yet); stamps 14.0
                  15.0])        # maybe_write 1 s later: not due (every 2 s)
    clock = PhaseClock(tmp_path / "pt" / "rank-1.jsonl", every_s=2.0)
    clock._now = lambda: next(ticks)
    assert clock.timed("env", lambda x: x + 1)(1) == 2
    assert clock.timed("forward", lambda: "q")() == "q"

    def boom():
        raise RuntimeError("env died")
    with pytest.raises(RuntimeError):
        clock.timed("env", boom)()
    assert clock.seconds == {"env": 2.5, "forward": 0.25, "learn": 0.0}
    clock.maybe_write(agent_steps=40)
    clock.maybe_write(agent_steps=45)
    rows = [json.loads(line) for line in open(tmp_path / "pt" / "rank-1.jsonl")]
    assert len(rows) == 1 and rows[0]["agent_steps"] == 40 and rows[0]["env_s"] == 2.5


# ------------------------------------------------------------------------------ batched rollouts
@pytest.mark.parametrize("algo", ["a3c", "n_step_q"])
def test_more_environments_with_the_same_data_do_not_change_the_step(algo):
    """The loss sums over time and averages over environments: a rollout of 2 environments
    that saw the same transitions gives the gradient (and the loss) of 1 environment."""
    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    cfg = Config(algo=algo, gamma=0.9, grad_clip_norm=0.0, entropy_beta=0.01, value_coef=0.5)
    if algo == "a3c":
        net, target = build_actor_critic((4,), 2, lstm=False, hidden=8), None
    else:
        net = build_q_network((4,), 2, kind="mlp", hidden=8)
        target = copy.deepcopy(net)
    T = 5
    one = Rollout(rng.normal(size=(T, 1, 4)).astype(np.float32), rng.integers(0, 2, (T, 1)),
                  rng.normal(size=(T, 1)).astype(np.float32), col(1, 1, 0, 1, 1),
                  col(0, 0, 1, 0, 0, dtype=bool), rng.normal(size=(T, 1, 4)).astype(np.float32))
    two = Rollout(*(np.repeat(x, 2, axis=1) for x in one[:6]))
    learner = AsyncLearner(net, target, cfg)
    g1 = np.concatenate(learner.gradient(one)).copy()
    g2 = np.concatenate(learner.gradient(two)).copy()
    assert np.abs(g1).sum() > 0
    np.testing.assert_allclose(g2, g1, rtol=1e-5, atol=1e-7)
    assert learner.stats.loss_sum == pytest.approx(2 * float(learner.loss(one).detach()), rel=1e-5)


def test_batched_rollout_ends_an_episode_in_one_env_only():
    """Two CartPole envs in lockstep: where one episode ends and the other goes on, only the
    ended env's next observation is a reset, and each env's targets are those of its own
    column alone (returns restart in the ended env only)."""
    env = make_env("CartPole-v1", 2, seed=4, training=True)

    rollout, _ = collect_rollout(env, env.reset(), AlwaysLeft(), 30, None)
    env.close()
    only_0 = np.flatnonzero(rollout.end_t[:-1, 0] & ~rollout.end_t[:-1, 1])
    assert only_0.size, rollout.end_t.T           # both envs' episodes end at different steps
    i = int(only_0[0])
    np.testing.assert_array_equal(rollout.s_t[i, 1], rollout.s_tm1[i + 1, 1])   # env 1 goes on
    assert abs(rollout.s_t[i, 0, 2]) > 0.2                 # env 0 fell: pole past 12 degrees
    assert abs(rollout.s_tm1[i + 1, 0]).max() <= 0.05      # and restarted
    q_t = np.random.default_rng(0).normal(size=(30, 2, 2)).astype(np.float32)
    both = value_targets("n_step_q", rollout.r_t, rollout.discount_t, rollout.end_t,
                         rollout.a_tm1, q_t, 0.99)
    for n in range(2):
        alone = value_targets("n_step_q", rollout.r_t[:, n:n + 1], rollout.discount_t[:, n:n + 1],
                              rollout.end_t[:, n:n + 1], rollout.a_tm1[:, n:n + 1],
                              q_t[:, n:n + 1], 0.99)
        np.testing.assert_array_equal(both[:, n], alone[:, 0])


def test_target_network_pulls_again_until_every_shard_has_refreshed():
    """Shards serve a refresh each in their own poll: a pull that finds shard 1 still on the old
    target (versions [1, 0]) is repeated at the next step, and stops once they agree."""
    from hpcrl.agents.base import TargetNetwork

    class TwoShards:                      # what TargetNetwork reads of a 2-shard ParameterStore
        def __init__(self):
            self.tv, self.pulls = [0, 0], 0

        def target_version(self):
            return self.tv[0]

        def pull_target(self, out):
            self.pulls += 1
            out[:] = self.tv[0]
            return np.array(self.tv)

    store = TwoShards()
    target = TargetNetwork(store, torch.nn.Linear(2, 1))
    target.refresh()
    assert (store.pulls, target.version) == (1, 0)
    target.refresh()
    assert store.pulls == 1                               # nothing changed: no pull
    assert target.pulls == store.pulls                    # its count follows every pull
    store.tv = [1, 0]                                     # shard 0 refreshed, shard 1 not yet
    target.refresh()
    target.refresh()
    assert (store.pulls, target.version) == (3, -1)       # pulled at each step meanwhile
    assert target.pulls == 3
    store.tv = [1, 1]
    target.refresh()
    target.refresh()
    assert (store.pulls, target.version) == (4, 1)
    assert target.pulls == 4


def test_one_pass_outputs_on_frames_equal_unroll_plus_bootstrap():
    """The conv network's fast path (channels-last batch, bootstrap states in a pass of their
    own) gives the reference's logits, values, bootstrap values and gradient."""
    torch.manual_seed(0)
    net = build_actor_critic((4, 84, 84), 6, lstm=False, init="orthogonal")
    rng = np.random.default_rng(2)
    s_tm1 = rng.integers(0, 256, (5, 3, 4, 84, 84), dtype=np.uint8)
    s_t = rng.integers(0, 256, (5, 3, 4, 84, 84), dtype=np.uint8)
    end = np.zeros((5, 3), bool)
    end[1, 0] = end[2, 2] = True
    d = np.ones((5, 3), np.float32)
    d[1, 0] = 0                                       # env 0 terminal at 1; env 2 cut at 2
    rollout = Rollout(s_tm1, rng.integers(0, 6, (5, 3)), np.ones((5, 3), np.float32), d, end,
                      s_t)
    logits, values, v_t = actor_critic_outputs(net, rollout)
    ref_logits, ref_values, after = unroll_actor_critic(net, rollout)
    ref_v_t = actor_critic_bootstrap(net, rollout, after)
    np.testing.assert_allclose(logits.detach().numpy(), ref_logits.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(values.detach().numpy(), ref_values.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(v_t, ref_v_t, rtol=1e-5, atol=1e-6)
    assert v_t[1, 0] == 0 and v_t[2, 2] != 0 and (v_t[4] != 0).all() and v_t[0, 0] == 0
    grads = []
    for lg, v in ((logits, values), (ref_logits, ref_values)):
        net.zero_grad()
        (lg.logsumexp(-1).sum() + v.square().sum()).backward()
        grads.append(np.concatenate([p.grad.numpy().ravel() for p in net.parameters()]))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-5 * np.abs(grads[1]).max())


@pytest.mark.parametrize("n_env", [1, 3])
def test_the_lstm_unroll_on_frames_equals_the_net_stepped_one_state_at_a_time(n_env):
    """A3C LSTM's unroll passes a rollout's frames through the torso in one batch and steps
    only the LSTM: logits, values, the states after each step and the gradient equal the
    network called step by step on each state (from state0, zeroed after episode ends)."""
    torch.manual_seed(0)
    net = build_actor_critic((4, 84, 84), 6, lstm=True, init="orthogonal",
                             lstm_init="orthogonal")
    rng = np.random.default_rng(5)
    T = 5
    s_tm1 = rng.integers(0, 256, (T, n_env, 4, 84, 84), dtype=np.uint8)
    end = np.zeros((T, n_env), bool)
    end[1, 0] = True                                  # env 0's episode ends at step 1
    state0 = tuple(torch.from_numpy(rng.normal(size=(n_env, 256)).astype(np.float32))
                   for _ in range(2))
    rollout = Rollout(s_tm1, rng.integers(0, 6, (T, n_env)), np.ones((T, n_env), np.float32),
                      np.ones((T, n_env), np.float32), end, s_tm1, state0=state0)
    logits, values, after = unroll_actor_critic(net, rollout)
    ref_logits, ref_values, ref_after, state = [], [], [], state0
    for i in range(T):                                # the acting loop's calls
        lg, v, state = net(torch.from_numpy(s_tm1[i]), state)
        ref_logits.append(lg)
        ref_values.append(v)
        ref_after.append(state)
        state = tuple(torch.where(torch.from_numpy(end[i])[:, None], 0.0, x) for x in state)
    ref_logits, ref_values = torch.stack(ref_logits), torch.stack(ref_values)
    close = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits.detach().numpy(), ref_logits.detach().numpy(), **close)
    np.testing.assert_allclose(values.detach().numpy(), ref_values.detach().numpy(), **close)
    for (h, c), (ref_h, ref_c) in zip(after, ref_after):
        np.testing.assert_allclose(h.detach().numpy(), ref_h.detach().numpy(), **close)
        np.testing.assert_allclose(c.detach().numpy(), ref_c.detach().numpy(), **close)
    grads = []
    for lg, v in ((logits, values), (ref_logits, ref_values)):
        net.zero_grad()
        (lg.logsumexp(-1).sum() + v.square().sum()).backward()
        grads.append(np.concatenate([p.grad.numpy().ravel() for p in net.parameters()]))
    assert np.abs(grads[1]).max() > 0
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-5 * np.abs(grads[1]).max())


def test_n_step_q_gradient_on_frames_equals_algorithm_s2_step_by_step():
    """n-step Q's fast path (the target network only on the states that bootstrap, a
    channels-last batch) against Algorithm S2 written out per environment and step: returns
    accumulated backwards from max_a Q(s_t, a; theta-) at each cut, one transition's Huber
    loss at a time, summed over steps and averaged over environments."""
    torch.manual_seed(5)
    net = build_q_network((4, 84, 84), 6, kind="small", init="orthogonal")
    target = copy.deepcopy(net)
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(1.5)
    rng = np.random.default_rng(6)
    T, N, gamma = 5, 3, 0.9
    s_tm1 = rng.integers(0, 256, (T, N, 4, 84, 84), dtype=np.uint8)
    s_t = rng.integers(0, 256, (T, N, 4, 84, 84), dtype=np.uint8)
    end = np.zeros((T, N), bool)
    end[1, 0] = end[2, 2] = True
    d = np.ones((T, N), np.float32)
    d[1, 0] = 0                                   # env 0 terminal at 1; env 2 cut at 2 (time limit)
    a = rng.integers(0, 6, (T, N))
    r = rng.choice([-1.0, 0.0, 1.0], (T, N)).astype(np.float32)
    rollout = Rollout(s_tm1, a, r, d, end, s_t)
    cfg = Config(algo="n_step_q", gamma=gamma, grad_clip_norm=0.0, loss="huber")

    q_t = target_q_values(target, "n_step_q", rollout)
    bootstraps = {(4, 0), (4, 1), (4, 2), (2, 2)}     # the last step and the time-limit cut
    for i in range(T):
        for n in range(N):
            row = q_t[i, n]
            if (i, n) in bootstraps:
                np.testing.assert_allclose(
                    row, target(torch.from_numpy(s_t[i, n:n + 1])).detach().numpy()[0], rtol=1e-5,
                    atol=1e-6)
            else:
                assert not row.any()
    grad = np.concatenate(AsyncLearner(net, target, cfg).gradient(rollout))

    net.zero_grad()
    for n in range(N):
        R = 0.0
        for i in reversed(range(T)):
            with torch.no_grad():
                boot = float(target(torch.from_numpy(s_t[i, n:n + 1])).max())
            R = r[i, n] + gamma * d[i, n] * (boot if (i == T - 1 or end[i, n]) else R)
            q = net(torch.from_numpy(s_tm1[i, n:n + 1]))[0, a[i, n]]
            (huber(R - q) / N).backward()
    ref = np.concatenate([p.grad.numpy().ravel() for p in net.parameters()])
    np.testing.assert_allclose(grad, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def test_bfloat16_torso_gradient_is_the_float32_one_to_bfloat16_resolution():
    """learner_precision = bfloat16 for A3C: the rollout gradient (torso under autocast, heads,
    loss and bootstrap values in float32) against the float32 one on the same Pong-shaped
    rollout; close to bfloat16's resolution, and not bit-for-bit the float32 one."""
    from hpcrl.config import load_config
    from hpcrl.runtime.params.layout import ParamLayout

    torch.manual_seed(3)
    net = build_actor_critic((4, 84, 84), 6, lstm=False, init="orthogonal")
    rng = np.random.default_rng(4)
    s = rng.integers(0, 256, (6, 5, 8, 4, 84, 84), dtype=np.uint8)   # s_tm1[:5], s_t[1:]
    end = np.zeros((5, 8), bool)
    end[2, 3] = True
    rollout = Rollout(s[0, :5], rng.integers(0, 6, (5, 8)),
                      rng.choice([-1.0, 0.0, 1.0], (5, 8)).astype(np.float32),
                      np.ones((5, 8), np.float32), end, s[1, :5])
    grads = {}
    for precision in ("float32", "bfloat16"):
        cfg = load_config("configs/a3c_pong.toml", [f"learner_precision={precision}",
                                                    "grad_clip_norm=0"])
        grads[precision] = np.concatenate(AsyncLearner(net, None, cfg).gradient(rollout))
    ref, low = grads["float32"], grads["bfloat16"]
    # measured on three random networks and rollouts: 2.5-4.5 % relative error over the whole
    # gradient, 2-8 % per torso tensor, at most 1.4 % per float32 head tensor
    rel = np.linalg.norm(low - ref) / np.linalg.norm(ref)
    assert 1e-5 < rel < 0.1, rel
    layout = ParamLayout.from_module(net)
    for name, start, stop in zip(layout.names, layout.offsets, layout.offsets[1:] + (layout.size,)):
        err = np.linalg.norm(low[start:stop] - ref[start:stop]) / np.linalg.norm(ref[start:stop])
        assert err < 0.15, (name, err)


@pytest.mark.parametrize("sets", [["algo=n_step_q"], ["algo=a3c", "lstm=true"]])
def test_bfloat16_learner_refused_where_it_does_not_apply(sets):
    from hpcrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="learner_precision.*gorila.*feed-forward 'a3c'"):
        load_config(None, [*sets, "learner_precision=bfloat16"])
