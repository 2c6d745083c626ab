"""The rollout gradient from the acting passes' activations (hpcrl.rl.reuse) against autograd's
re-run gradient, on real Pong rollouts acted by the production policies."""

import copy

import numpy as np
import pytest
import torch

from hpcrl.agents.async_rl.learner import AsyncLearner
from hpcrl.agents.async_rl.rollout import collect_rollout
from hpcrl.config import Config, load_config
from hpcrl.envs import make_env
from hpcrl.rl.acting import ActorCriticPolicy, EpsilonGreedyPolicy
from hpcrl.rl.networks import NatureQNetwork, build_actor_critic, build_network
from hpcrl.rl.reuse import (ActivationRecorder, RecordedActivations, matching, reusable_torso,
                            torso_backward)

torch.set_num_threads(1)

T, N = 5, 4


class TorsoBatches:
    """The batch sizes the torso's forward sees (a hook on its first layer)."""

    def __init__(self, net):
        self.sizes = []
        net.torso[0].register_forward_hook(lambda m, i, o: self.sizes.append(o.shape[0]))


def _acted_rollout(net, policy, seed, first_actions=None):
    """A real Pong rollout of N environments acted by ``policy`` under a recorder."""
    env = make_env("pong", N, seed=seed, training=True)
    recorder = ActivationRecorder(net.torso)
    recorder.start()
    rollout, _ = collect_rollout(env, env.reset(), policy, T, None, first_actions)
    env.close()
    return rollout, recorder.stop()


def _gradients(net, target, cfg, rollout, passes):
    """(reused, re-run) gradients of the production learner, and the torso's batch sizes while
    the reused one was computed."""
    seen = TorsoBatches(net)
    reused = AsyncLearner(net, target, cfg)
    assert reused.reuses_acting
    g_reuse = np.concatenate(reused.gradient(rollout, None, RecordedActivations(passes)))
    sizes = list(seen.sizes)
    rerun = AsyncLearner(net, target, cfg.replace(learner_reuse_acting=False))
    assert not rerun.reuses_acting
    g_rerun = np.concatenate(rerun.gradient(rollout, None, RecordedActivations(passes)))
    return g_reuse, g_rerun, sizes


def _assert_same_gradient(g_reuse, g_rerun):
    assert np.abs(g_rerun).max() > 0
    np.testing.assert_allclose(g_reuse, g_rerun, rtol=1e-4, atol=1e-6 * np.abs(g_rerun).max())
    assert np.linalg.norm(g_reuse - g_rerun) < 1e-5 * np.linalg.norm(g_rerun)


def test_a3c_gradient_from_the_acting_passes_is_autograds():
    """configs/a3c_pong.toml's network and loss on a real Pong rollout: the gradient from the
    recorded acting activations equals the re-run one to float32 rounding, and the torso ran
    no forward over the rollout's states (only the bootstrap states' pass, N states)."""
    torch.manual_seed(0)
    cfg = load_config("configs/a3c_pong.toml", [f"envs_per_actor={N}", "grad_clip_norm=0"])
    net = build_actor_critic((4, 84, 84), 6, lstm=False, init="orthogonal")
    policy = ActorCriticPolicy(net, N, np.random.default_rng(1))
    rollout, passes = _acted_rollout(net, policy, seed=2)
    assert matching(passes, T, N)
    g_reuse, g_rerun, sizes = _gradients(net, None, cfg, rollout, passes)
    _assert_same_gradient(g_reuse, g_rerun)
    assert sizes == [N]                   # V(s_T) of each environment, no graph


@pytest.mark.parametrize("algo", ["n_step_q", "one_step_q"])
def test_value_method_gradient_from_the_acting_passes_is_autograds(algo):
    """The value methods' small network (Mnih et al. 2013) acting epsilon-greedily on real
    Pong frames: the same gradient from the recorded activations as from the re-run."""
    torch.manual_seed(3)
    cfg = load_config("configs/n_step_q_pong.toml", [f"algo={algo}", f"envs_per_actor={N}",
                                                     "grad_clip_norm=0"])
    net = build_network(cfg, (4, 84, 84), 6)
    target = copy.deepcopy(net)
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(0.9)
    policy = EpsilonGreedyPolicy(net, N, cfg.anneal_frames, 4, np.random.default_rng(4))
    policy.local_frames = cfg.anneal_frames          # mostly greedy: the net picks the actions
    rollout, passes = _acted_rollout(net, policy, seed=5)
    g_reuse, g_rerun, sizes = _gradients(net, target, cfg, rollout, passes)
    _assert_same_gradient(g_reuse, g_rerun)
    assert sizes == []


def test_a_rollout_whose_first_step_was_acted_before_is_not_matched():
    """Sarsa takes its first action from the previous rollout's last pass (before a pull), so
    its recording holds T - 1 passes and the worker re-runs the forward; passes under autograd
    (a gradient's forward) are never recorded."""
    torch.manual_seed(0)
    net = build_actor_critic((4, 84, 84), 6, lstm=False, init="orthogonal")
    policy = ActorCriticPolicy(net, N, np.random.default_rng(1))
    _, passes = _acted_rollout(net, policy, seed=2, first_actions=np.zeros(N, np.int64))
    assert len(passes) == T - 1 and not matching(passes, T, N)
    recorder = ActivationRecorder(net.torso)
    recorder.start()
    net(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))           # grad enabled: not an acting pass
    assert recorder.stop() == []


def test_torso_backward_equals_autograd_through_the_nature_network():
    """Three convolutions (strides 4, 2, 1), a flatten and the 512-unit layer: every torso
    parameter's gradient as autograd's, for an arbitrary gradient at the hidden layer."""
    torch.manual_seed(5)
    net = NatureQNetwork((4, 84, 84), 6)
    x = torch.rand(7, 4, 84, 84).contiguous(memory_format=torch.channels_last)
    outs = []
    hooks = [m.register_forward_hook(lambda m, i, o: outs.append(o.detach()))
             for m in net.torso if isinstance(m, torch.nn.ReLU)]
    hidden = net.torso(x)
    for h in hooks:
        h.remove()
    g = torch.randn_like(hidden)
    net.zero_grad()
    (hidden * g).sum().backward()
    ref = {name: p.grad.clone() for name, p in net.torso.named_parameters()}
    net.zero_grad(set_to_none=True)
    torso_backward(net.torso, x, outs, g)
    assert len(outs) == 4
    for name, p in net.torso.named_parameters():
        assert p.grad.is_contiguous()
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-4, atol=1e-6 * ref[name].abs().max())


def test_only_image_torsos_of_relu_layers_reuse():
    assert reusable_torso(NatureQNetwork((4, 84, 84), 6).torso)
    assert not reusable_torso(build_network(Config(algo="n_step_q", game="CartPole-v1"),
                                            (4,), 2).torso)          # an MLP (vector input)
    lstm = build_actor_critic((4, 84, 84), 6, lstm=True)
    assert not AsyncLearner(lstm, None, Config(algo="a3c", lstm=True)).reuses_acting
    ff = build_actor_critic((4, 84, 84), 6, lstm=False)
    assert AsyncLearner(ff, None, Config(algo="a3c")).reuses_acting
    assert not AsyncLearner(ff, None, Config(algo="a3c",
                                             learner_precision="bfloat16")).reuses_acting
