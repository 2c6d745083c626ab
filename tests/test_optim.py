"""ShardOptimizer against a float64 loop over the papers' update formulas (no MPI)."""

import sys

import numpy as np
import pytest

from hpcrl.runtime.params.optim import KINDS, ShardOptimizer, fused_available, tensor_pieces
from tests.mpi.store_checks_reference import reference_updates


@pytest.fixture(params=["fused", "numpy"])
def path(request, monkeypatch):
    """Run a test on the fused C loop and on the numpy fallback."""
    if request.param == "fused":
        if not fused_available():
            pytest.fail("hpcrl.runtime.params._kernels is not built (pip install -e . with a C compiler)")
    else:
        monkeypatch.setenv("HPCRL_NO_KERNELS", "1")
    return request.param


@pytest.mark.parametrize("kind", KINDS)
def test_matches_reference(kind, path):
    rng = np.random.default_rng(0)
    n, ncl, lr = 50, 3, 0.1
    theta = rng.normal(size=n).astype(np.float32)
    grads = [(int(rng.integers(ncl)), rng.normal(size=n).astype(np.float32)) for _ in range(12)]
    opt = ShardOptimizer(kind, n, ncl, decay=0.9, eps=0.01, momentum=0.8)
    assert opt.fused == (path == "fused")
    a, b = theta.copy(), np.empty_like(theta)
    for c, g in grads:
        opt.step(a, g, b, lr, c)
        a, b = b, a
    ref = reference_updates(kind, theta, grads, lr, 0.9, 0.01, 0.8, ncl)
    np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-6)


def test_rmsprop_statistics_never_store_denormals(path):
    """A dead unit's statistic decays into the denormal range, where float operations are
    ~100x slower on x86: below FLT_MIN (1.18e-38) it is stored as 0, on both paths."""
    opt = ShardOptimizer("rmsprop_shared", 4, 1, decay=0.99, eps=0.1)
    acc = opt.statistics_for(0)
    bits = acc.view(np.uint32)       # set and read by bit pattern: a process running with
    bits[:] = [0x00100000, 4, 0x0DA24260, 0]    # FTZ/DAZ (e.g. torch.set_flush_denormal) hides them
    # 1.5e-39 and 5.6e-45 (denormal), 1e-30 (normal), 0
    grad = np.array([0.0, 0.0, 0.0, 1e-20], np.float32)   # 0.01 * g^2 = 1e-42: denormal
    theta = np.ones(4, np.float32)
    out = np.empty(4, np.float32)
    opt.step(theta, grad, out, 0.5, 0)
    np.testing.assert_array_equal(bits[[0, 1, 3]], 0)
    assert acc[2] == pytest.approx(0.99e-30, rel=1e-6)
    np.testing.assert_array_equal(out, 1.0)        # 0.5 * 1e-20 / sqrt(0.1) is below 1 ulp


def test_adagrad_by_hand(path):
    # G = 4 after g = 2; step = 0.5 * 2 / sqrt(4 + 0) = 0.5
    opt = ShardOptimizer("adagrad", 1, 1, eps=0.0)
    out = np.empty(1, np.float32)
    opt.step(np.array([1.0], np.float32), np.array([2.0], np.float32), out, 0.5, 0)
    assert out[0] == 0.5


def test_adagrad_accumulator_keeps_growing_past_float32(path):
    """G only grows: at G = 2^25 a float32 sum G + 1 rounds back to G (its spacing there is 4),
    so the step would stop shrinking. The float64 accumulator still adds every g^2."""
    opt = ShardOptimizer("adagrad", 2, 1, eps=0.0)
    assert np.float32(2 ** 25) + np.float32(1) == np.float32(2 ** 25)
    opt.state["G"][:] = 2.0 ** 25
    out = np.empty(2, np.float32)
    theta = np.zeros(2, np.float32)
    for _ in range(3):
        opt.step(theta, np.ones(2, np.float32), out, 1.0, 0)
    np.testing.assert_array_equal(opt.state["G"], 2.0 ** 25 + 3)
    # last step: 1 / sqrt(2^25 + 3), the step computed in float32 (a few ulp)
    np.testing.assert_allclose(out, -1 / np.sqrt(2.0 ** 25 + 3), rtol=3e-7)


def test_adagrad_warmup_starts_g_at_t0_mean_square_of_the_first_gradient(path):
    """t0 = 4, first g = [1, 3]: mean g^2 = 5, so G = 4 * 5 + g^2 = [21, 29]; the second
    gradient only adds its square."""
    opt = ShardOptimizer("adagrad", 2, 1, eps=0.0, warmup_updates=4)
    theta, out = np.zeros(2, np.float32), np.empty(2, np.float32)
    opt.step(theta, np.array([1.0, 3.0], np.float32), out, 0.5, 0)
    np.testing.assert_array_equal(opt.state["G"], [21.0, 29.0])
    np.testing.assert_array_equal(opt.state["G0"], [20.0, 20.0])   # kept: G - G0 is own G
    np.testing.assert_allclose(out, [-0.5 / np.sqrt(21), -1.5 / np.sqrt(29)], rtol=1e-6)
    opt.step(theta, np.array([2.0, 0.0], np.float32), out, 0.5, 0)
    np.testing.assert_array_equal(opt.state["G"], [25.0, 29.0])
    np.testing.assert_allclose(out, [-1.0 / 5.0, 0.0], rtol=1e-6)
    assert int(opt.state["n"]) == 2


def test_adagrad_warm_start_is_set_per_tensor_piece(path):
    """Pieces [1, 3] (the shard holds the end of one tensor and a whole second one), t0 = 2,
    first g = [2, 1, 1, 4]: G0 = 2 * 4 = 8 on the first, 2 * (1 + 1 + 16) / 3 = 12 on the
    other three; G = G0 + g^2 = [12, 13, 13, 28]."""
    opt = ShardOptimizer("adagrad", 4, 1, eps=0.0, warmup_updates=2, pieces=[1, 3])
    out = np.empty(4, np.float32)
    opt.step(np.zeros(4, np.float32), np.array([2.0, 1.0, 1.0, 4.0], np.float32), out, 1.0, 0)
    np.testing.assert_array_equal(opt.state["G0"], [8.0, 12.0, 12.0, 12.0])
    np.testing.assert_array_equal(opt.state["G"], [12.0, 13.0, 13.0, 28.0])
    np.testing.assert_allclose(out, -np.array([2 / 12 ** 0.5, 1 / 13 ** 0.5, 1 / 13 ** 0.5,
                                               4 / 28 ** 0.5]), rtol=1e-6)
    with pytest.raises(ValueError, match="do not split a shard of 4"):
        ShardOptimizer("adagrad", 4, 1, warmup_updates=2, pieces=[1, 2])


def test_tensor_pieces_of_a_shard_by_hand():
    """Tensors of 3, 5 and 2 floats (flat [0, 3), [3, 8), [8, 10)); shard [2, 9) holds 1 of
    the first, all 5 of the second and 1 of the third."""
    assert tensor_pieces([3, 5, 2], 2, 9) == [1, 5, 1]
    assert tensor_pieces([3, 5, 2], 3, 8) == [5]
    assert tensor_pieces([3, 5, 2], 0, 10) == [3, 5, 2]


def test_adagrad_warmup_step_is_about_lr_over_sqrt_t0_plus_t(path):
    """Gradients of one steady size: the t-th step per weight is lr / sqrt(t0 + t), the
    schedule that lets lr / sqrt(t0) be set to DQN's step per weight."""
    t0, lr = 100, 0.01
    opt = ShardOptimizer("adagrad", 3, 1, eps=1e-12, warmup_updates=t0)
    theta, out = np.zeros(3, np.float32), np.empty(3, np.float32)
    g = np.array([1e-4, -1e-4, 1e-4], np.float32)
    for t in range(1, 51):
        opt.step(theta, g, out, lr, 0)
        np.testing.assert_allclose(np.abs(out), lr / np.sqrt(t0 + t), rtol=1e-4)


def test_adagrad_warmup_happens_once_across_a_restore():
    """A restored shard that has taken updates does not warm up again; a checkpoint without
    the update count restores as warmed up when its G is nonzero."""
    opt = ShardOptimizer("adagrad", 2, 1, warmup_updates=10)
    opt.step(np.zeros(2, np.float32), np.ones(2, np.float32), np.empty(2, np.float32), 1.0, 0)
    other = ShardOptimizer("adagrad", 2, 1, warmup_updates=10)
    other.set_state(opt.get_state())
    other.step(np.zeros(2, np.float32), np.ones(2, np.float32), np.empty(2, np.float32), 1.0, 0)
    np.testing.assert_array_equal(other.state["G"], [12.0, 12.0])
    old = ShardOptimizer("adagrad", 2, 1, warmup_updates=10)
    old.set_state({"G": np.array([3.0, 0.0])})
    assert int(old.state["n"]) == 1 and not np.any(old.state["G0"])
    per_shard = ShardOptimizer("adagrad", 2, 1, warmup_updates=10)
    per_shard.set_state({"G": np.array([3.0, 1.0]), "n": np.int64(1), "G0": np.float64(0.5)})
    np.testing.assert_array_equal(per_shard.state["G0"], [0.5, 0.5])   # one number per shard
    fresh = ShardOptimizer("adagrad", 2, 1, warmup_updates=10)
    fresh.set_state({"G": np.zeros(2)})
    assert int(fresh.state["n"]) == 0
    with pytest.raises(ValueError, match="adagrad only"):
        ShardOptimizer("rmsprop_shared", 2, 1, warmup_updates=10)


def test_adagrad_restores_a_float32_accumulator():
    """Checkpoints written with a float32 G restore into the float64 one."""
    opt = ShardOptimizer("adagrad", 3, 1)
    opt.set_state({"G": np.array([1.5, 2.0, 0.0], np.float32)})
    assert opt.state["G"].dtype == np.float64
    np.testing.assert_array_equal(opt.state["G"], [1.5, 2.0, 0.0])


def test_shared_statistics_are_one_object():
    shared = ShardOptimizer("rmsprop_shared", 4, 3)
    assert shared.statistics_for(0) is shared.statistics_for(2)
    per = ShardOptimizer("rmsprop_per_client", 4, 3)
    assert per.statistics_for(0) is not per.statistics_for(1)
    assert not np.shares_memory(per.statistics_for(0), per.statistics_for(1))


def test_state_round_trip_and_shape_check():
    opt = ShardOptimizer("adagrad", 3, 1)
    opt.step(np.zeros(3, np.float32), np.ones(3, np.float32), np.empty(3, np.float32), 1.0, 0)
    other = ShardOptimizer("adagrad", 3, 1)
    other.set_state(opt.get_state())
    np.testing.assert_array_equal(other.state["G"], [1, 1, 1])
    assert int(other.state["n"]) == 1
    with pytest.raises(ValueError, match="shape"):
        ShardOptimizer("adagrad", 4, 1).set_state(opt.get_state())


# Each kernel: its buffer arguments (name, dtype, written) and its scalar arguments.
KERNEL_BUFFERS = {
    "scaled_step": ([("theta_in", np.float32, False), ("grad", np.float32, False),
                     ("acc", np.float32, True), ("theta_out", np.float32, True)],
                    (0.9, 0.1, 1.0, False)),
    "adagrad_step": ([("theta_in", np.float32, False), ("grad", np.float32, False),
                      ("acc", np.float64, True), ("theta_out", np.float32, True)], (0.1, 1.0)),
    "momentum_step": ([("theta_in", np.float32, False), ("grad", np.float32, False),
                       ("m", np.float32, True), ("theta_out", np.float32, True)], (0.9, 0.01)),
    "adam_step": ([("theta_in", np.float32, False), ("grad", np.float32, False),
                   ("m", np.float32, True), ("v", np.float32, True),
                   ("theta_out", np.float32, True)], (0.9, 0.999, 1e-8, 0.01)),
}


@pytest.mark.parametrize("kernel", sorted(KERNEL_BUFFERS))
def test_fused_rejects_wrong_buffers(kernel):
    """Every buffer argument of every kernel: a wrong dtype, size, a read-only output or a
    strided view is refused with its name, nothing is written, and no buffer stays held."""
    from hpcrl.runtime.params import _kernels

    specs, scalars = KERNEL_BUFFERS[kernel]
    fn = getattr(_kernels, kernel)
    good = [np.ones(4, dtype) for _, dtype, _ in specs]
    fn(*good, *scalars)                                        # the arguments as given work
    other = {np.float32: np.float64, np.float64: np.float32}
    for i, (name, dtype, written) in enumerate(specs):
        bad_cases = [(np.ones(4, other[dtype]), TypeError, f"{name} must be a contiguous"),
                     (np.ones(3, dtype), ValueError, "differ in size"),
                     (np.ones(8, dtype)[::2], (TypeError, ValueError, BufferError), None)]
        if written:
            read_only = np.ones(4, dtype)
            read_only.flags.writeable = False
            bad_cases.append((read_only, (TypeError, ValueError, BufferError), None))
        for bad, error, message in bad_cases:
            args = [b.copy() for b in good]
            args[i] = bad
            before = [a.copy() for a in args]
            counts = [sys.getrefcount(a) for a in args]
            with pytest.raises(error, match=message):
                fn(*args, *scalars)
            assert [sys.getrefcount(a) for a in args] == counts   # every buffer released
            for a, b in zip(args, before):
                np.testing.assert_array_equal(a, b)               # nothing written


@pytest.mark.parametrize("offset", range(4))
@pytest.mark.parametrize("n", [1, 3, 7, 50, 1003])
def test_fused_kernel_at_every_alignment(offset, n):
    """The C loop on views that start at any float offset and have odd lengths gives numpy's
    float32 numbers and writes nothing outside the view (a guard for vectorised variants)."""
    from hpcrl.runtime.params import _kernels

    rng = np.random.default_rng(n + offset)
    theta, g = rng.normal(size=(2, n)).astype(np.float32)
    acc = rng.random(n).astype(np.float32)
    out_buf = np.full(n + 8, 7.0, np.float32)
    out = out_buf[offset:offset + n]
    expect_acc = np.float32(0.9) * acc + np.float32(0.1) * (g * g)
    expect = theta - np.float32(0.01) * (g / np.sqrt(expect_acc + np.float32(1e-3)))
    _kernels.scaled_step(theta, g, acc, out, 0.9, 1e-3, 0.01, False)
    np.testing.assert_allclose(acc, expect_acc, rtol=1e-6)
    np.testing.assert_allclose(out, expect, rtol=1e-6, atol=1e-7)
    assert (out_buf[:offset] == 7).all() and (out_buf[offset + n:] == 7).all()   # no overrun


@pytest.mark.parametrize("offset", range(4))
@pytest.mark.parametrize("n", [1, 7, 1003])
def test_fused_momentum_at_every_alignment(offset, n):
    """The momentum loop on views that all start at any float offset: the numpy fallback's
    float32 numbers (1 - momentum rounded as numpy rounds it), nothing written outside the
    views; sizes that differ are refused."""
    from hpcrl.runtime.params import _kernels

    rng = np.random.default_rng(n + offset)
    bufs = rng.normal(size=(4, n + 8)).astype(np.float32)
    bufs[3] = 7.0
    theta, g, m, out = (b[offset:offset + n] for b in bufs)
    expect_m = np.float32(0.9) * m + np.float32(1.0 - 0.9) * g
    expect = theta - np.float32(0.01) * expect_m
    _kernels.momentum_step(theta, g, m, out, 0.9, 0.01)
    np.testing.assert_allclose(m, expect_m, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out, expect, rtol=1e-6, atol=1e-7)
    assert (bufs[3, :offset] == 7).all() and (bufs[3, offset + n:] == 7).all()
    with pytest.raises(ValueError, match="differ in size"):
        _kernels.momentum_step(theta, g, m[:-1] if n > 1 else m[:0], out, 0.9, 0.01)


def test_momentum_never_stores_denormals(path):
    """A unit without gradient decays its m by the momentum per step into the denormal range:
    below FLT_MIN (1.18e-38) it is stored as 0, on both paths, whatever its sign."""
    opt = ShardOptimizer("momentum", 4, 2, momentum=0.5)
    bits = opt.statistics_for(1).view(np.uint32)
    bits[:] = [0x00800000, 0x80800000, 0x0DA24260, 0]   # +-FLT_MIN, 1e-30, 0
    grad = np.zeros(4, np.float32)
    out = np.empty(4, np.float32)
    opt.step(np.ones(4, np.float32), grad, out, 0.5, 1)
    np.testing.assert_array_equal(bits[[0, 1, 3]], 0)       # 0.5 FLT_MIN: denormal -> 0
    assert opt.statistics_for(1)[2] == pytest.approx(0.5e-30, rel=1e-6)
    np.testing.assert_array_equal(opt.statistics_for(0), 0)   # the other client's m untouched
    np.testing.assert_array_equal(out, 1.0)


def _steps_from(opt, theta, grads, first, lr):
    """Steps t = first, first + 1, ... with grads[t - 1], alternating clients as the tests'
    own loops do; returns the final parameters."""
    a, b = theta.copy(), np.empty_like(theta)
    for t, g in enumerate(grads[first - 1:], start=first):
        opt.step(a, g, b, lr, t % 2)
        a, b = b, a
    return a


def test_rmsprop_bias_correction_by_hand(path):
    # decay 0.9, eps 0.01, lr 0.5, theta 1:
    #   g = 2: v = 0.1 * 4 = 0.4, c = 1 - 0.9 = 0.1, v / c = 4; step = 0.5 * 2 / sqrt(4.01)
    #   g = 1: v = 0.36 + 0.1 = 0.46, c = 1 - 0.81 = 0.19, v / c = 2.421053; step 0.5 / sqrt(2.431053)
    opt = ShardOptimizer("rmsprop_shared", 1, 1, decay=0.9, eps=0.01, bias_correction=True)
    a, b = np.array([1.0], np.float32), np.empty(1, np.float32)
    opt.step(a, np.array([2.0], np.float32), b, 0.5, 0)
    assert b[0] == pytest.approx(1 - 0.5 * 2 / np.sqrt(4.01), rel=1e-6)
    opt.step(b, np.array([1.0], np.float32), a, 0.5, 0)
    assert a[0] == pytest.approx(b[0] - 0.5 / np.sqrt(0.46 / 0.19 + 0.01), rel=1e-6)
    assert int(opt.get_state()["t"]) == 2


def test_rmsprop_bias_correction_matches_a_slow_loop_and_resumes(path):
    """Against Adam's second-moment correction written out in float64; a copy restored from
    get_state after 5 steps continues identically."""
    rng = np.random.default_rng(4)
    n, decay, eps, lr = 20, 0.99, 1e-5, 7e-4
    theta = rng.normal(size=n).astype(np.float32)
    grads = [rng.normal(scale=1e-3, size=n).astype(np.float32) for _ in range(10)]
    opt = ShardOptimizer("rmsprop_shared", n, 2, decay=decay, eps=eps, bias_correction=True)
    a, b = theta.copy(), np.empty_like(theta)
    ref, v = theta.astype(np.float64), np.zeros(n)
    for t, g in enumerate(grads, start=1):
        if t == 6:
            copy = ShardOptimizer("rmsprop_shared", n, 2, decay=decay, eps=eps,
                                  bias_correction=True)
            copy.set_state(opt.get_state())
            resumed_from = a.copy()
        opt.step(a, g, b, lr, t % 2)
        a, b = b, a
        v = decay * v + (1 - decay) * g.astype(np.float64) ** 2
        ref = ref - lr * g / np.sqrt(v / (1 - decay ** t) + eps)
        if t == 1:      # at most lr per weight, where the uncorrected rule steps up to 10 lr
            assert np.abs(ref - theta).max() <= lr
            np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(_steps_from(copy, resumed_from, grads, 6, lr), a)


def test_bias_correction_is_for_shared_rmsprop_only():
    with pytest.raises(ValueError, match="rmsprop_shared only"):
        ShardOptimizer("adagrad", 4, 1, bias_correction=True)


@pytest.mark.parametrize("kind", ["rmsprop_shared", "rmsprop_per_client"])
def test_rmsprop_initial_statistic_by_hand(kind, path):
    # TensorFlow's RMSProp: v starts at 1. decay 0.9, eps 0.01, lr 0.5, theta 1, g = 2:
    #   v = 0.9 * 1 + 0.1 * 4 = 1.3; step = 0.5 * 2 / sqrt(1.31) = 0.8737 (from v = 0: 1.56)
    #   g = 0.1: v = 1.17 + 0.001 = 1.171; step = 0.05 / sqrt(1.181)
    opt = ShardOptimizer(kind, 1, 2, decay=0.9, eps=0.01, initial=1.0)
    a, b = np.array([1.0], np.float32), np.empty(1, np.float32)
    opt.step(a, np.array([2.0], np.float32), b, 0.5, 1)
    assert b[0] == pytest.approx(1 - 1.0 / np.sqrt(1.31), rel=1e-6)
    opt.step(b, np.array([0.1], np.float32), a, 0.5, 1)
    assert a[0] == pytest.approx(b[0] - 0.05 / np.sqrt(1.181), rel=1e-6)
    # client 0's statistic (its own, per client) has not moved from 1
    assert opt.statistics_for(0)[0] == pytest.approx(1.171 if kind == "rmsprop_shared" else 1.0)


def test_rmsprop_initial_is_for_rmsprop_without_bias_correction():
    with pytest.raises(ValueError, match="RMSProp kinds only"):
        ShardOptimizer("adagrad", 4, 1, initial=1.0)
    with pytest.raises(ValueError, match="exclude each other"):
        ShardOptimizer("rmsprop_shared", 4, 1, initial=1.0, bias_correction=True)


def test_the_ps_builds_its_shard_optimizer_from_the_config():
    """make_optimizer (what a ps rank runs) hands rmsprop_initial, the decay and eps to the
    shard's optimizer: TensorFlow's RMSProp from a3c_pong.toml with two --set."""
    from types import SimpleNamespace

    from hpcrl.config import load_config
    from hpcrl.runtime.ps import make_optimizer
    from tests.util import ROOT

    cfg = load_config(ROOT / "configs/a3c_pong.toml",
                      ["rmsprop_bias_correction=false", "rmsprop_initial=1"])
    store = SimpleNamespace(shard=1, sizes=[3, 5],
                            spec=SimpleNamespace(ranges=[(0, 3), (3, 8)], n_clients=2))
    opt = make_optimizer(cfg, store)
    assert opt.kind == "rmsprop_shared" and not opt.bias_correction
    np.testing.assert_array_equal(opt.statistic(), np.ones(5, np.float32))
    assert (opt.decay, opt.eps) == (cfg.rmsprop_decay, cfg.optim_eps)


@pytest.mark.parametrize("start", ["tensor", "parameter"])
def test_adagrad_after_rmsprop_steps_matches_a_slow_loop_and_resumes(path, start):
    """adagrad_rmsprop_updates K = 3, t0 = 50, pieces [2, 3]: three bias-corrected RMSProp
    steps at lr / sqrt(t0), then G0 = t0 x each piece's mean of the corrected statistic
    ("tensor") or t0 x each parameter's own, its piece's mean where it had no gradient
    ("parameter"; the last parameter gets none in the RMSProp steps), and AdaGrad from
    there, written out in float64; a copy restored after 4 steps continues identically; `n`
    counts the AdaGrad updates only."""
    rng = np.random.default_rng(7)
    n, decay, eps, lr, t0, K, pieces = 5, 0.9, 1e-8, 0.05, 50, 3, [2, 3]
    theta = rng.normal(size=n).astype(np.float32)
    # the first gradient 100 times the later ones, as on Pong
    grads = [rng.normal(scale=1e-2 if t == 0 else 1e-4, size=n).astype(np.float32)
             for t in range(8)]
    for g in grads[:K]:
        g[-1] = 0.0
    opt = ShardOptimizer("adagrad", n, 2, decay=decay, eps=eps, warmup_updates=t0,
                         rmsprop_updates=K, pieces=pieces, rmsprop_start=start)
    a, b = theta.copy(), np.empty_like(theta)
    ref, v, G = theta.astype(np.float64), np.zeros(n), None
    for t, g in enumerate(grads, start=1):
        if t == 5:
            copy = ShardOptimizer("adagrad", n, 2, decay=decay, eps=eps, warmup_updates=t0,
                                  rmsprop_updates=K, pieces=pieces, rmsprop_start=start)
            copy.set_state(opt.get_state())
            resumed_from = a.copy()
        opt.step(a, g, b, lr, t % 2)
        a, b = b, a
        g64 = g.astype(np.float64)
        if t <= K:
            v = decay * v + (1 - decay) * g64 ** 2
            c = 1 - decay ** t
            ref = ref - lr / np.sqrt(t0) * g64 / np.sqrt(v / c + eps)
            np.testing.assert_array_equal(opt.statistic(), opt.state["v"])
            assert int(opt.state["n"]) == 0
        else:
            if G is None:
                vhat = v / (1 - decay ** K)
                G0 = np.concatenate([np.full(2, t0 * vhat[:2].mean()),
                                     np.full(3, t0 * vhat[2:].mean())])
                if start == "parameter":
                    assert vhat[-1] == 0
                    G0 = np.where(vhat > 0, t0 * vhat, G0)
                np.testing.assert_allclose(opt.state["G0"], G0, rtol=1e-6)
                G = opt.state["G0"].astype(np.float64)     # G0 is kept in float32
            G = G + g64 ** 2
            ref = ref - lr * g64 / np.sqrt(G + eps)
        np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-9)
    assert int(opt.state["n"]) == len(grads) - K and int(opt.state["k"]) == K
    np.testing.assert_allclose(opt.statistic(), G - opt.state["G0"], rtol=1e-5)
    np.testing.assert_array_equal(_steps_from(copy, resumed_from, grads, 5, lr), a)


def test_adagrad_rmsprop_updates_need_adagrad_with_a_warm_start():
    from hpcrl.config import ConfigError, load_config
    from tests.util import ROOT

    with pytest.raises(ValueError, match="rmsprop_updates needs adagrad"):
        ShardOptimizer("adagrad", 4, 1, rmsprop_updates=10)
    with pytest.raises(ValueError, match="rmsprop_updates needs adagrad"):
        ShardOptimizer("rmsprop_shared", 4, 1, rmsprop_updates=10)
    with pytest.raises(ConfigError, match="'adagrad_rmsprop_start' applies with"):
        load_config(ROOT / "configs/gorila_pong.toml", ["adagrad_rmsprop_start=parameter"])
    with pytest.raises(ConfigError, match="'adagrad_rmsprop_updates' needs optimizer 'adagrad'"):
        load_config(ROOT / "configs/gorila_pong.toml", ["adagrad_rmsprop_updates=100"])


def test_the_ps_hands_adagrad_rmsprop_updates_to_its_shard_optimizer():
    from types import SimpleNamespace

    from hpcrl.config import load_config
    from hpcrl.runtime.ps import make_optimizer
    from tests.util import ROOT

    cfg = load_config(ROOT / "configs/gorila_pong.toml",
                      ["optimizer=adagrad", "learning_rate=0.05", "optim_eps=1e-8",
                       "rmsprop_bias_correction=false", "adagrad_warmup_updates=50000",
                       "adagrad_rmsprop_updates=5000", "adagrad_rmsprop_start=parameter"])
    store = SimpleNamespace(shard=0, sizes=[5], spec=SimpleNamespace(ranges=[(0, 5)],
                                                                      n_clients=2))
    opt = make_optimizer(cfg, store, tensor_sizes=[2, 3])
    assert (opt.kind, opt.warmup_updates, opt.rmsprop_updates) == ("adagrad", 50000, 5000)
    assert opt.pieces == [2, 3] and opt.decay == cfg.rmsprop_decay
    assert opt.rmsprop_start == "parameter"


def test_adam_by_hand(path):
    # b1 0.9, b2 0.99, eps 0 (inside the root), lr 0.1, theta 1:
    #   g = 2:  m = 0.2, v = 0.04; m^ = 0.2 / 0.1 = 2, v^ = 0.04 / 0.01 = 4; step 0.1 * 2 / 2 = 0.1
    #   g = -1: m = 0.18 - 0.1 = 0.08, v = 0.0396 + 0.01 = 0.0496; m^ = 0.08 / 0.19,
    #           v^ = 0.0496 / 0.0199; step 0.1 * 0.421053 / sqrt(2.492462) = 0.0266702
    opt = ShardOptimizer("adam_shared", 1, 2, decay=0.99, momentum=0.9, eps=0.0)
    a, b = np.array([1.0], np.float32), np.empty(1, np.float32)
    opt.step(a, np.array([2.0], np.float32), b, 0.1, 0)
    assert b[0] == pytest.approx(0.9, rel=1e-6)
    opt.step(b, np.array([-1.0], np.float32), a, 0.1, 1)     # the other client: shared moments
    assert a[0] == pytest.approx(0.9 - 0.1 * (0.08 / 0.19) / np.sqrt(0.0496 / 0.0199), rel=1e-6)
    assert opt.state["m"][0] == pytest.approx(0.08, rel=1e-6) and int(opt.state["t"]) == 2
    assert opt.statistics_for(0) is opt.statistics_for(1) is opt.state["v"]


def test_adam_resumes_exactly(path):
    """A step after get_state / set_state into a fresh optimiser (a checkpoint's round trip)
    equals the step the first one takes: the moments and the count t travel together."""
    rng = np.random.default_rng(5)
    theta = rng.normal(size=9).astype(np.float32)
    grads = [rng.normal(size=9).astype(np.float32) for _ in range(6)]
    whole = ShardOptimizer("adam_shared", 9, 2, decay=0.999, momentum=0.9, eps=1e-8)
    end = _steps_from(whole, theta, grads, 1, 0.01)
    first = ShardOptimizer("adam_shared", 9, 2, decay=0.999, momentum=0.9, eps=1e-8)
    mid = _steps_from(first, theta, grads[:3], 1, 0.01)
    resumed = ShardOptimizer("adam_shared", 9, 2, decay=0.999, momentum=0.9, eps=1e-8)
    resumed.set_state(first.get_state())
    np.testing.assert_array_equal(_steps_from(resumed, mid, grads, 4, 0.01), end)


def test_adam_never_stores_denormals(path):
    """m and v of a unit without gradient decay into the denormal range: stored as 0 below
    FLT_MIN, on both paths."""
    opt = ShardOptimizer("adam_shared", 4, 1, decay=0.5, momentum=0.5, eps=0.1)
    m_bits, v_bits = opt.state["m"].view(np.uint32), opt.state["v"].view(np.uint32)
    m_bits[:] = [0x00800000, 0x80800000, 0x0DA24260, 0]   # +-FLT_MIN, 1e-30, 0
    v_bits[:] = [0x00800000, 0x00800000, 0x0DA24260, 0]
    out = np.empty(4, np.float32)
    opt.step(np.ones(4, np.float32), np.zeros(4, np.float32), out, 0.5, 0)
    np.testing.assert_array_equal(m_bits[[0, 1, 3]], 0)
    np.testing.assert_array_equal(v_bits[[0, 1, 3]], 0)
    assert opt.state["m"][2] == pytest.approx(0.5e-30, rel=1e-6)
    assert opt.state["v"][2] == pytest.approx(0.5e-30, rel=1e-6)


@pytest.mark.parametrize("offset", range(4))
@pytest.mark.parametrize("n", [1, 7, 1003])
def test_fused_adam_at_every_alignment(offset, n):
    """The Adam loop on views at any float offset: the numpy fallback's float32 numbers,
    nothing written outside the views; sizes that differ are refused."""
    from hpcrl.runtime.params import _kernels

    rng = np.random.default_rng(n + offset)
    bufs = rng.normal(size=(5, n + 8)).astype(np.float32)
    bufs[3] = np.abs(bufs[3])
    bufs[4] = 7.0
    theta, g, m, v, out = (b[offset:offset + n] for b in bufs)
    expect_m = np.float32(0.9) * m + np.float32(1.0 - 0.9) * g
    expect_v = np.float32(0.999) * v + np.float32(1.0 - 0.999) * (g * g)
    expect = theta - np.float32(0.01) * (expect_m / np.sqrt(expect_v + np.float32(1e-3)))
    _kernels.adam_step(theta, g, m, v, out, 0.9, 0.999, 1e-3, 0.01)
    np.testing.assert_allclose(m, expect_m, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v, expect_v, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out, expect, rtol=1e-6, atol=1e-7)
    assert (bufs[4, :offset] == 7).all() and (bufs[4, offset + n:] == 7).all()
    with pytest.raises(ValueError, match="differ in size"):
        _kernels.adam_step(theta, g, m, v[:-1] if n > 1 else v[:0], out, 0.9, 0.999, 1e-3, 0.01)
