"""Continuous control (Mnih et al. 2016, §5.3): the env behind the Atari interface, float
actions through rollouts and the learner's loss, Gaussian acting and evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcrl.agents.async_rl.learner import AsyncLearner
from hpcrl.agents.async_rl.rollout import collect_rollout
from hpcrl.agents.evaluation import evaluate, evaluation_policy
from hpcrl.config import ConfigError, load_config
from hpcrl.envs import ContinuousControlEnv, make_env
from hpcrl.games import resolve_game_id
from hpcrl.rl.acting import GaussianPolicy
from hpcrl.rl.gaussian import a3c_gaussian_loss
from hpcrl.rl.losses import bootstrap_returns, rollout_cuts
from hpcrl.rl.networks import MLPGaussianActorCritic, build_network
from tests.util import ROOT, RecordsOutputs

mujoco = pytest.importorskip("mujoco", reason="the MuJoCo tasks need the mujoco extra")

CONFIG = ROOT / "configs/a3c_mujoco.toml"


def test_ids_resolve_and_value_methods_are_refused():
    assert resolve_game_id("halfcheetah") == ("continuous", "HalfCheetah-v5")
    assert resolve_game_id("Pendulum-v1") == ("continuous", "Pendulum-v1")
    with pytest.raises(ConfigError, match="continuous actions, which only algo 'a3c'"):
        load_config(ROOT / "configs/n_step_q_cartpole.toml", ["game=Hopper-v5"])


@pytest.mark.parametrize("game", ["Pendulum-v1", "InvertedPendulum-v5", "Hopper-v5"])
def test_a_restored_state_replays_every_step_exactly(game):
    """Physics (MuJoCo's full integration state, or the classic task's vector), RNGs and
    episode counters: the same actions after set_state give the same steps, resets included."""
    env = make_env(game, 2, seed=7, training=True, clip_rewards=False)
    assert isinstance(env, ContinuousControlEnv) and env.frames_per_step == 1
    env.reset()
    rng = np.random.default_rng(0)
    draw = lambda: rng.uniform(-3, 3, (2, env.action_dim)).astype(np.float32)  # noqa: E731
    for _ in range(20):
        env.step(draw())
    saved = env.get_state()
    actions = [draw() for _ in range(300)]
    first = [env.step(a) for a in actions]
    env.set_state(saved)
    second = [env.step(a) for a in actions]
    assert any(r.episode_end.any() for r in first) or game == "Hopper-v5"
    for x, y in zip(first, second):
        for field in x._fields:
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field), err_msg=field)


def test_actions_are_clipped_to_the_bounds_and_checked():
    env = make_env("Pendulum-v1", 1, seed=1, training=False)
    env.reset()
    assert env.action_low.tolist() == [-2.0] and env.action_high.tolist() == [2.0]
    physics = env.get_state()["physics_0"]
    big, at_bound = env.step(np.array([[50.0]], np.float32)), None
    env.set_state({**env.get_state(), "physics_0": physics})
    at_bound = env.step(np.array([[2.0]], np.float32))
    np.testing.assert_array_equal(big.obs, at_bound.obs)           # 50 acts as 2
    with pytest.raises(ValueError, match=r"shape \(1, 1\)"):
        env.step(np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="finite"):
        env.step(np.array([[np.nan]], np.float32))


def test_the_learner_loss_is_the_gaussian_a3c_loss_of_the_rollout():
    """Float actions [T, N, D] through collect_rollout, and AsyncLearner's loss equal to the
    Gaussian loss of the same outputs and n-step returns, averaged over environments."""
    cfg = load_config(CONFIG, ["game=Hopper-v5", "envs_per_actor=3", "t_max=4"])
    env = make_env("Hopper-v5", 3, seed=2, training=True, clip_rewards=False)
    torch.manual_seed(0)
    net = build_network(cfg, env.obs_shape, env.num_actions)
    assert isinstance(net, MLPGaussianActorCritic) and env.num_actions == 3
    policy = GaussianPolicy(net, 3, np.random.default_rng(1))
    rollout, _ = collect_rollout(env, env.reset(), policy, 4)
    assert rollout.a_tm1.shape == (4, 3, 3) and rollout.a_tm1.dtype == np.float32
    loss = AsyncLearner(net, None, cfg).loss(rollout)
    with torch.no_grad():
        out, v, _ = net(torch.from_numpy(rollout.s_tm1.reshape(12, -1)))
        v_t = np.zeros((4, 3), np.float32)
        cuts = rollout_cuts(rollout.end_t) & (rollout.discount_t > 0)
        v_last = net(torch.from_numpy(rollout.s_t[-1]))[1].numpy()
        v_t[-1] = np.where(cuts[-1], v_last, 0.0)
        returns = bootstrap_returns(rollout.r_t, rollout.discount_t, rollout_cuts(rollout.end_t),
                                    v_t, cfg.gamma)
        expected = a3c_gaussian_loss(out.reshape(4, 3, 6), v.reshape(4, 3),
                                     torch.from_numpy(rollout.a_tm1), torch.from_numpy(returns),
                                     cfg.entropy_beta, cfg.value_coef)["total"] / 3
    assert not cuts[:-1].any()                        # no episode ended inside these 4 steps
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_variances_are_positive_and_the_state_independent_option_learns_one_per_dim():
    torch.manual_seed(0)
    net = MLPGaussianActorCritic(5, 2, hidden=16)
    out, value, _ = net(torch.randn(4, 5) * 100)
    assert out.shape == (4, 4) and value.shape == (4,) and (out[:, 2:] >= 1e-4).all()
    fixed = MLPGaussianActorCritic(5, 2, hidden=16, std="state_independent", min_var=0.0)
    with torch.no_grad():
        fixed.log_std.copy_(torch.tensor([0.0, np.log(0.5)]))
    out, _, _ = fixed(torch.randn(3, 5))
    np.testing.assert_allclose(out[:, 2:].detach().numpy(), [[1.0, 0.25]] * 3, rtol=1e-6)


def test_gaussian_policy_resumes_its_draws_and_evaluation_uses_the_mean():
    cfg = load_config(CONFIG, ["game=Pendulum-v1", "envs_per_actor=2"])
    torch.manual_seed(0)
    net = build_network(cfg, (3,), 1)
    obs = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    policy = GaussianPolicy(net, 2, np.random.default_rng(5))
    policy.act(obs)
    saved = {k: np.copy(v) for k, v in policy.get_state().items()}
    a = [policy.act(obs) for _ in range(300)]                 # past one block of draws
    policy.set_state(saved)
    b = [policy.act(obs) for _ in range(300)]
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    assert np.std(np.stack(a)[:, 0, 0]) > 0.1
    greedy = evaluation_policy(net, cfg, 2, np.random.default_rng(0))
    with torch.no_grad():
        mean = net(torch.from_numpy(obs))[0][:, :1].numpy()
    np.testing.assert_array_equal(greedy.act(obs), mean)
    results = evaluate(net, cfg, 11, np.random.default_rng(0), episodes=2)
    assert [length for _, length in results] == [200, 200]        # Pendulum's limit


class _RecordingGaussianPolicy(RecordsOutputs, GaussianPolicy):
    pass


def test_the_gaussian_lstm_unrolls_as_it_acted_across_episode_ends():
    """The recurrent Gaussian policy (128 LSTM cells): over rollouts that run across Pendulum's
    200-step time limit, the learner's unroll from each rollout's state0 gives the outputs the
    policy acted on (state carried between rollouts, zeroed at the episode end), and the
    gradient reaches the LSTM."""
    from hpcrl.agents.async_rl.learner import unroll_actor_critic

    cfg = load_config(CONFIG, ["game=Pendulum-v1", "envs_per_actor=2", "lstm=true",
                               "t_max=30"])
    env = make_env("Pendulum-v1", 2, seed=4, training=True, clip_rewards=False)
    torch.manual_seed(0)
    net = build_network(cfg, env.obs_shape, env.num_actions)
    assert net.lstm is not None and net.lstm.hidden_size == 128
    policy = _RecordingGaussianPolicy(net, 2, np.random.default_rng(3))
    obs, rollouts = env.reset(), []
    for _ in range(8):                                 # 240 steps: one episode end per env
        rollout, obs = collect_rollout(env, obs, policy, 30)
        rollouts.append(rollout)
    assert sum(int(r.end_t.sum()) for r in rollouts) == 2
    acted = np.stack(policy.outputs)
    for k, rollout in enumerate(rollouts):
        with torch.no_grad():
            out, _, _ = unroll_actor_critic(net, rollout)
        np.testing.assert_allclose(out.numpy(), acted[30 * k:30 * (k + 1)], rtol=1e-5, atol=1e-6)
    learner = AsyncLearner(net, None, cfg.replace(grad_clip_norm=0.0))
    grad = learner.gradient(rollouts[-1])
    lstm_grads = [g for g, name in zip(grad, learner.layout.names) if name.startswith("lstm.")]
    assert lstm_grads and all(np.abs(g).max() > 0 for g in lstm_grads)


def test_a_mujoco_warning_is_said_once_and_writes_no_log_file(tmp_path, monkeypatch, capfd):
    """gymnasium's HalfCheetah-v5 model warns at every load (settotalmass is deprecated): one
    line per process on stderr, not one per environment, and no MUJOCO_LOG.TXT."""
    from hpcrl.envs import continuous

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(continuous, "_SAID", set())
    for _ in range(3):
        env = make_env("HalfCheetah-v5", 2, 0, training=False)
        env.reset()
        env.close()
    err = capfd.readouterr().err
    assert err.count("hpcrl: MuJoCo warning (said once per rank): compiler attribute "
                     "'settotalmass' is deprecated") == 1, err
    assert "WARNING:" not in err
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
