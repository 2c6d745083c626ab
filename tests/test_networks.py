"""Tests of hpcrl.rl.networks and hpcrl.runtime.params.layout: parameter counts by hand, shapes, flat round trips, LSTM resets."""

import time

import numpy as np
import pytest
import torch

from hpcrl.runtime.params.layout import ParamLayout
from hpcrl.rl.networks import (A3CNetwork, MLPActorCritic, MLPQNetwork, NatureQNetwork,
                            build_actor_critic, build_q_network, num_params, reset_lstm_state,
                            scale_input, scaled_channels_last)

torch.set_num_threads(1)


def test_nature_dqn_parameter_count_by_hand():
    # Input 4x84x84. Conv sizes: (84-8)/4+1 = 20, (20-4)/2+1 = 9, (9-3)/1+1 = 7.
    # conv1 4*32*8*8 + 32   =     8,224
    # conv2 32*64*4*4 + 64  =    32,832
    # conv3 64*64*3*3 + 64  =    36,928
    # fc    64*7*7*512 + 512 = 1,606,144   (3136 inputs)
    # q     512*6 + 6       =     3,078
    # total                 = 1,687,206
    net = NatureQNetwork((4, 84, 84), 6)
    assert num_params(net) == 8_224 + 32_832 + 36_928 + 1_606_144 + 3_078 == 1_687_206
    assert ParamLayout.from_module(net).size == 1_687_206


def test_the_async_value_methods_small_network_has_the_papers_layers():
    """Mnih et al. 2016, §8: the value methods use the network of Mnih et al. 2013 (A3C's
    torso) with one Q-value per action: conv 16 8x8/4, conv 32 4x4/2, fc 256."""
    from hpcrl.config import load_config
    from hpcrl.rl.networks import SmallQNetwork, build_network
    from tests.util import ROOT

    net = build_q_network((4, 84, 84), 6, kind="small")
    assert isinstance(net, SmallQNetwork)
    convs = [m for m in net.torso if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (16, (8, 8), (4, 4)), (32, (4, 4), (2, 2))]
    # conv1 4,112 + conv2 8,224 + fc 32*9*9*256 + 256 = 663,808 + q 256*6 + 6 = 1,542
    assert num_params(net) == 4_112 + 8_224 + 663_808 + 1_542 == 677_686
    assert net(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape == (2, 6)
    for algo in ("one_step_q", "one_step_sarsa", "n_step_q"):
        cfg = load_config(ROOT / f"configs/{algo}_pong.toml")
        assert cfg.network == "small" and isinstance(build_network(cfg, (4, 84, 84), 6),
                                                     SmallQNetwork), algo


def test_a3c_parameter_count_by_hand():
    # conv1 4*16*64 + 16 = 4,112; (84-8)/4+1 = 20; conv2 16*32*16 + 32 = 8,224; (20-4)/2+1 = 9
    # fc 32*9*9*256 + 256 = 663,808; policy 256*6 + 6 = 1,542; value 256 + 1 = 257
    ff = 4_112 + 8_224 + 663_808 + 1_542 + 257
    assert num_params(A3CNetwork((4, 84, 84), 6)) == ff == 677_943
    # LSTMCell(256, 256): 4 gates * (256*256 input + 256*256 hidden + 256 + 256 biases)
    assert num_params(A3CNetwork((4, 84, 84), 6, lstm=True)) == ff + 4 * (2 * 256 * 256 + 2 * 256)


def test_output_shapes_and_uint8_scaling():
    q = build_q_network((4, 84, 84), 6)
    assert isinstance(q, NatureQNetwork)
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    out = q(x)
    assert out.shape == (3, 6) and out.dtype == torch.float32
    torch.testing.assert_close(out, q(x.float() / 255.0))   # scaled by 1/255 inside
    assert isinstance(build_q_network((4,), 2), MLPQNetwork)
    assert build_q_network((4,), 2)(torch.zeros(5, 4)).shape == (5, 2)
    with pytest.raises(ValueError):
        build_q_network((4,), 2, kind="dueling")
    for lstm in (False, True):
        ac = build_actor_critic((4, 84, 84), 6, lstm=lstm)
        assert isinstance(ac, A3CNetwork)
        logits, value, state = ac(x, ac.initial_state(3))
        assert logits.shape == (3, 6) and value.shape == (3,)
        assert (state is None) == (not lstm)
        if lstm:
            assert state[0].shape == state[1].shape == (3, 256)
        mlp = build_actor_critic((4,), 2, lstm=lstm)
        assert isinstance(mlp, MLPActorCritic)
        logits, value, _ = mlp(torch.zeros(5, 4))
        assert logits.shape == (5, 2) and value.shape == (5,)


def test_lstm_state_carries_over_and_reset_zeroes_only_ended_rows():
    torch.manual_seed(0)
    net = MLPActorCritic(4, 2, lstm=True)
    obs = torch.randn(3, 4)
    _, _, s1 = net(obs)
    _, v_cont, _ = net(obs, s1)
    _, v_fresh, _ = net(obs, net.initial_state(3))
    assert not torch.allclose(v_cont, v_fresh)      # the state matters
    h, c = reset_lstm_state(s1, np.array([False, True, False]))
    torch.testing.assert_close(h[[0, 2]], s1[0][[0, 2]], rtol=0, atol=0)
    torch.testing.assert_close(c[[0, 2]], s1[1][[0, 2]], rtol=0, atol=0)
    assert not h[1].any() and not c[1].any() and s1[0][1].any()
    _, v_reset, _ = net(obs, (h, c))
    assert v_reset[1] == v_fresh[1] and v_reset[0] == v_cont[0]
    assert reset_lstm_state(None, np.array([True])) is None


def test_flat_round_trip_is_exact_and_fast():
    torch.manual_seed(0)
    net = NatureQNetwork((4, 84, 84), 6)
    layout = ParamLayout.from_module(net)
    flat = np.random.default_rng(0).standard_normal(layout.size).astype(np.float32)
    t0 = time.perf_counter()
    layout.from_flat(net, flat)
    back = layout.to_flat(net)
    assert time.perf_counter() - t0 < 0.5          # per-parameter memcpy, not per element
    np.testing.assert_array_equal(back, flat)
    # Order = module.parameters(); the first conv weight is flat[:8192] in C order.
    np.testing.assert_array_equal(net.torso[0].weight.detach().numpy().ravel(), flat[:8192])
    np.testing.assert_array_equal(net.q_head.bias.detach().numpy(), flat[-6:])
    out = np.zeros(layout.size, np.float32)
    assert layout.to_flat(net, out) is out
    with pytest.raises(ValueError):
        layout.from_flat(net, flat.astype(np.float64))
    with pytest.raises(ValueError):
        layout.from_flat(MLPQNetwork(4, 2), flat)


def test_grads_to_flat_zeros_for_missing_grads():
    torch.manual_seed(0)
    net = MLPActorCritic(4, 2)
    layout = ParamLayout.from_module(net)
    logits, _, _ = net(torch.randn(8, 4))
    logits.sum().backward()                        # the value head gets no gradient
    out = np.full(layout.size, 7.0, np.float32)
    layout.grads_to_flat(net, out)
    for name, p, o in zip(layout.names, net.parameters(), layout.offsets):
        seg = out[o:o + p.numel()]
        if name.startswith("value_head"):
            assert p.grad is None and not seg.any()
        else:
            np.testing.assert_array_equal(seg, p.grad.numpy().ravel())
    assert layout.names[-2:] == ("value_head.weight", "value_head.bias")


def test_bind_makes_parameters_and_grads_views_of_flat_buffers():
    import numpy as np
    import torch

    from hpcrl.rl.networks import MLPQNetwork
    from hpcrl.runtime.params.layout import ParamLayout

    torch.manual_seed(0)
    net, ref = MLPQNetwork(4, 2, hidden=(8,)), MLPQNetwork(4, 2, hidden=(8,))
    layout = ParamLayout.from_module(net)
    theta = np.empty(layout.size, np.float32)
    before = layout.to_flat(net)
    layout.bind(net, theta)
    np.testing.assert_array_equal(theta, before)         # values kept
    theta[:] = np.arange(layout.size, dtype=np.float32) / 100
    np.testing.assert_array_equal(layout.to_flat(net), theta)   # writes to flat reach the net
    layout.from_flat(ref, theta)
    grad = np.full(layout.size, 7.0, np.float32)
    layout.bind_grads(net, grad)
    assert np.all(grad == 0)
    x = torch.linspace(-1, 1, 12).view(3, 4)
    for _ in range(2):                                   # zero, backward, twice: no accumulation
        net.zero_grad(set_to_none=False)
        net(x).pow(2).sum().backward()
    ref.zero_grad()
    ref(x).pow(2).sum().backward()
    np.testing.assert_allclose(grad, layout.grads_to_flat(ref, np.empty_like(grad)), rtol=1e-6)


def test_orthogonal_init_by_layer():
    """init="orthogonal": W W^T = gain^2 I for every layer with no more rows than columns
    (torso sqrt 2, policy head 0.01, value head 1), every bias 0; torch's default otherwise."""
    torch.manual_seed(0)
    net = build_actor_critic((4, 84, 84), 6, lstm=False, init="orthogonal")
    layers = [m for m in net.torso if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    gains = [2.0] * len(layers) + [1e-4, 1.0]
    for layer, gain2 in zip(layers + [net.policy_head, net.value_head], gains):
        w = layer.weight.detach().reshape(layer.weight.shape[0], -1).double()
        assert w.shape[0] <= w.shape[1]                   # 16x256, 32x256, 256x2592, 6x256, 1x256
        np.testing.assert_allclose(w @ w.T, gain2 * np.eye(w.shape[0]), atol=1e-5 * gain2)
        assert not layer.bias.detach().any()
    default = build_actor_critic((4, 84, 84), 6, lstm=False)
    assert default.policy_head.bias.detach().any()        # torch's U(+-1/sqrt(fan_in)) biases
    with pytest.raises(ValueError, match="unknown init 'xavier'"):
        build_actor_critic((4,), 2, lstm=False, init="xavier")


def test_orthogonal_lstm_init_gate_by_gate():
    """lstm_init="orthogonal": each of the four gate blocks of both weight matrices is
    orthogonal (256x256 recurrent blocks: W W^T = I; 256x256 input blocks of the A3C torso's
    256 features: W W^T = I), biases 0 but the forget gate's 1 (its sigmoid starts at 0.73, not
    0.5); the torso keeps its own init; the default keeps torch's LSTM init."""
    torch.manual_seed(0)
    net = build_actor_critic((4, 84, 84), 6, lstm=True, init="orthogonal", lstm_init="orthogonal")
    cell, h = net.lstm, 256
    for weight in (cell.weight_ih, cell.weight_hh):
        assert weight.shape == (4 * h, 256)
        for gate in range(4):
            w = weight.detach()[gate * h:(gate + 1) * h].double()
            np.testing.assert_allclose(w @ w.T, np.eye(h), atol=1e-5)
    bias = (cell.bias_ih + cell.bias_hh).detach()
    assert torch.equal(bias[h:2 * h], torch.ones(h))
    assert not bias[:h].any() and not bias[2 * h:].any()
    assert not net.value_head.bias.detach().any()           # init="orthogonal" still applied
    default = build_actor_critic((4, 84, 84), 6, lstm=True, init="orthogonal")
    assert default.lstm.bias_hh.detach().any()              # torch's U(+-1/16) biases
    with pytest.raises(ValueError, match="unknown lstm_init 'xavier'"):
        build_actor_critic((4,), 2, lstm=True, lstm_init="xavier")


def test_lstm_forget_bias_from_the_config_reaches_the_cell():
    """lstm_forget_bias = 0 (OpenAI Baselines' LSTM): the run's network (build_network, as
    the actor-learners build it) has every gate bias 0; the key needs lstm_init =
    orthogonal."""
    from hpcrl.config import ConfigError, load_config
    from hpcrl.rl.networks import build_network
    from tests.util import ROOT

    cfg = load_config(ROOT / "configs/a3c_lstm_pong.toml",
                      ["lstm_init=orthogonal", "lstm_forget_bias=0.0"])
    net = build_network(cfg, (4, 84, 84), 6)
    assert not (net.lstm.bias_ih + net.lstm.bias_hh).detach().any()
    cfg = load_config(ROOT / "configs/a3c_lstm_pong.toml",
                      ["lstm_init=orthogonal", "lstm_forget_bias=2.0"])
    bias = build_network(cfg, (4, 84, 84), 6).lstm.bias_ih.detach()
    assert torch.equal(bias[256:512], torch.full((256,), 2.0)) and not bias[:256].any()
    with pytest.raises(ConfigError, match="'lstm_forget_bias' applies with lstm_init"):
        load_config(ROOT / "configs/a3c_lstm_pong.toml",
                    ["lstm_init=torch", "lstm_forget_bias=0.0"])


def test_orthogonal_init_of_the_value_methods_network():
    """init = "orthogonal" for n-step Q (the small network): each conv and linear layer of the
    torso orthogonal with gain sqrt 2 (W W^T = 2 I over the flattened rows, the rows being
    fewer than the columns), the Q head with gain 1, every bias 0; torch's default keeps
    nonzero biases."""
    from hpcrl.config import load_config
    from hpcrl.rl.networks import build_network
    from tests.util import ROOT

    torch.manual_seed(0)
    cfg = load_config(ROOT / "configs/n_step_q_pong.toml", ["init=orthogonal"])
    net = build_network(cfg, (4, 84, 84), 6)
    layers = [m for m in net.torso if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(layers) == 3
    for module, gain in [(m, 2.0) for m in layers] + [(net.q_head, 1.0)]:
        w = module.weight.detach().reshape(module.weight.shape[0], -1).double()
        np.testing.assert_allclose(w @ w.T, gain * np.eye(w.shape[0]), atol=1e-5)
        assert not module.bias.detach().any()
    default = build_network(load_config(ROOT / "configs/n_step_q_pong.toml"), (4, 84, 84), 6)
    assert default.q_head.bias.detach().any()


def test_scaled_channels_last_is_scale_input_in_channels_last_memory():
    """The learners' image batch: the same floats as ``scale_input``, bit for bit, element
    (b, c, y, x) read from channel c of frame b (not a transposed or shuffled copy), in
    channels-last memory; float input is only re-laid out."""
    frames = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (5, 4, 84, 84),
                                                                 dtype=np.uint8))
    out = scaled_channels_last(frames)
    assert out.dtype == torch.float32 and out.shape == (5, 4, 84, 84)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, scale_input(frames))
    assert float(out[2, 3, 10, 70]) == np.float32(int(frames[2, 3, 10, 70])) * np.float32(1 / 255)
    assert out.stride() == (84 * 84 * 4, 1, 84 * 4, 4)
    floats = torch.rand(2, 3, 5, 7)
    again = scaled_channels_last(floats)
    assert again.is_contiguous(memory_format=torch.channels_last) and torch.equal(again, floats)


@pytest.mark.parametrize("path", ["c", "python"])
@pytest.mark.parametrize("shape", [(5, 4, 84, 84), (3, 2, 6, 9), (1, 1, 84, 84)])
def test_scaled_channels_last_paths_give_torch_values_in_either_dtype(monkeypatch, path, shape):
    """The C pass (a table made by ``scale_input``) and the per-channel copies give the same
    values as ``scale_input`` then ``.to(dtype)``, bit for bit, in float32 and in bfloat16 (the
    values autocast would cast the float batch to), for stacks of 4 frames (the C pass's
    unrolled loop) and other depths; every pixel value appears."""
    from hpcrl.rl import networks

    if path == "c" and networks._stack_channels_last is None:
        pytest.fail("hpcrl.envs._frames is not built (pip install -e . with a C compiler)")
    if path == "python":     # no extension, or one built before it had stack_channels_last
        monkeypatch.setattr(networks, "_stack_channels_last", None)
    rng = np.random.default_rng(sum(shape))
    frames = rng.integers(0, 256, shape, dtype=np.uint8)
    frames.reshape(-1)[:256] = np.arange(256)
    frames = torch.from_numpy(frames)
    for dtype in (torch.float32, torch.bfloat16):
        out = scaled_channels_last(frames, dtype)
        want = scale_input(frames).to(dtype)
        assert out.dtype == dtype and out.shape == frames.shape
        assert out.is_contiguous(memory_format=torch.channels_last)
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(out.contiguous().view(bits), want.contiguous().view(bits))
    # element (b, c, y, x) comes from channel c of stack b
    b, c, y, x = shape[0] - 1, shape[1] - 1, shape[2] // 2, shape[3] - 1
    assert float(scaled_channels_last(frames)[b, c, y, x]) == \
        np.float32(int(frames[b, c, y, x])) * np.float32(1 / 255)
    # strided views of a batch (every other stack, every other frame) read as copies would
    for view in (frames[::2], frames[:, ::2], frames.permute(0, 1, 3, 2)):
        assert torch.equal(scaled_channels_last(view, torch.bfloat16),
                           scale_input(view).to(torch.bfloat16))


def test_stack_channels_last_refuses_what_it_cannot_read():
    from hpcrl.rl import networks

    if networks._stack_channels_last is None:
        pytest.fail("hpcrl.envs._frames is not built (pip install -e . with a C compiler)")
    fn = networks._stack_channels_last
    src = np.zeros((2, 4, 10), np.uint8)
    table = np.zeros(256, np.int32)
    fn(src, table, np.zeros((2, 10, 4), np.int32))
    with pytest.raises(ValueError):
        fn(src, table, np.zeros((2, 4, 10), np.int32))              # not [n, p, c]
    with pytest.raises(TypeError):
        fn(src, table, np.zeros((2, 10, 4), np.int16))              # items of another type
    with pytest.raises(TypeError):
        fn(src, table, np.zeros((2, 10, 4), np.float32))            # ... of the same size
    with pytest.raises(TypeError):
        fn(src, table.astype(">i4"), np.zeros((2, 10, 4), ">i4"))   # not native order
    unaligned = np.frombuffer(bytearray(2 * 10 * 4 * 4 + 1), np.uint8)[1:].view(np.int32)
    with pytest.raises(TypeError):
        fn(src, table, unaligned.reshape(2, 10, 4))
    with pytest.raises(TypeError):
        fn(src, np.zeros(255, np.int32), np.zeros((2, 10, 4), np.int32))   # a short table
    with pytest.raises(TypeError):
        fn(src, np.zeros(256, np.int8), np.zeros((2, 10, 4), np.int8))     # 1-byte items
    with pytest.raises(TypeError):
        fn(src.astype(np.int16), table, np.zeros((2, 10, 4), np.int32))    # not uint8
    with pytest.raises((TypeError, ValueError, BufferError)):
        fn(src, table, np.zeros((2, 10, 4), np.int32)[:, ::-1])            # not contiguous
    read_only = np.zeros((2, 10, 4), np.int32)
    read_only.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        fn(src, table, read_only)
