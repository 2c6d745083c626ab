"""Gorila end to end under real mpiexec: Atari smoke run and the CartPole learning check."""

import numpy as np
import pytest

from hpcrl.io.metrics import read_metrics
from tests.util import run_mpi

pytestmark = pytest.mark.mpi


def first_frame_reaching(frames, returns, target, window=20):
    """Global frames at which the mean of the last `window` episode returns first >= target."""
    if len(returns) < window:
        return None
    sums = np.convolve(returns, np.ones(window), "valid")   # exact for integer returns
    hits = np.flatnonzero(sums >= target * window)
    return int(frames[hits[0] + window - 1]) if hits.size else None


def test_first_frame_reaching_by_hand():
    frames = np.arange(1, 6) * 10
    returns = np.array([0, 0, 10, 20, 30])
    # windows of 2: means 0, 5, 15, 25 -> first >= 15 is the window ending at episode 4 (frame 40)
    assert first_frame_reaching(frames, returns, 15, window=2) == 40
    assert first_frame_reaching(frames, returns, 99, window=2) is None


def assert_pong_metrics(m, algo, total_frames):
    """The metrics.h5 schema every algorithm writes (Gorila's; the A3C smoke run checks it too)."""
    assert m["status"] == "finished"
    assert m["attrs"]["algo"] == algo and m["attrs"]["game"] == "pong"
    assert f"total_frames = {total_frames}" in m["attrs"]["config"]
    for group in ("episodes", "eval", "train", "final"):
        assert group in m
    for col in ("frames", "return", "length", "rank", "wall_time"):
        assert col in m["episodes"]
    for col in ("updates", "loss", "dropped_stale", "dropped_outlier", "dropped_nonfinite",
                "frames_per_second"):
        assert col in m["train"]
    assert m["train"]["frames"][-1] >= total_frames
    assert_health_columns(m["train"], algo)


def assert_health_columns(train, algo):
    """The network-health columns of the train rows: where a gradient was measured, its norm
    and the share clipped; where a loss was, the policy entropy (A3C: in (0, log 18]) or the
    mean max Q (value methods), the other NaN. (A 20 k-frame Gorila smoke never fills its
    replay memories to learning: all NaN then.)"""
    measured = np.isfinite(train["grad_norm"])
    assert (train["grad_norm"][measured] > 0).all()
    clipped = train["clipped_fraction"][measured]
    assert ((clipped >= 0) & (clipped <= 1)).all()
    kept = train["clip_kept"][measured]             # 1 exactly where nothing was clipped
    assert ((kept > 0) & (kept <= 1)).all() and (kept[clipped == 0] == 1).all()
    assert (kept[clipped > 0] < 1).all()
    losses = np.isfinite(train["loss"])
    health, other = ("entropy", "max_q") if algo == "a3c" else ("max_q", "entropy")
    np.testing.assert_array_equal(np.isfinite(train[health]), losses)
    assert np.isnan(train[other]).all()
    if algo == "a3c":
        assert measured.any()
        assert ((train["entropy"][losses] > 0) & (train["entropy"][losses] <= np.log(18) + 1e-6)
                ).all()
    else:
        assert (clipped == 0).all()                     # Gorila clips no gradient


#: Final evaluation episodes of the Pong smoke runs: one per evaluating rank (30 untrained
#: Pong episodes would cost more than the run).
SMOKE_FINAL_EPISODES = 2


def pong_smoke_run(tmp_path, algo, n, total_frames=20000, sets=()):
    """``mpiexec -n n`` of configs/<algo>_pong.toml for ``total_frames``: exit 0 and the common
    metrics schema, a final evaluation of ``SMOKE_FINAL_EPISODES``; returns (run dir,
    metrics)."""
    run_dir = tmp_path / "pong"
    sets = [f"final_eval_episodes={SMOKE_FINAL_EPISODES}", *sets]
    proc, _ = run_mpi(n, ["-m", "hpcrl.run", "--config", f"configs/{algo}_pong.toml",
                          "--set", f"total_frames={total_frames}", "--set", f"run_dir={run_dir}",
                          *[a for kv in sets for a in ("--set", kv)]], timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = read_metrics(run_dir / "metrics.h5")
    assert_pong_metrics(m, algo, total_frames)
    assert len(m["final"]["return"]) == SMOKE_FINAL_EPISODES
    assert ((m["final"]["return"] >= -21) & (m["final"]["return"] <= 21)).all()
    return run_dir, m


def test_pong_smoke_writes_metrics(tmp_path):
    run_dir, m = pong_smoke_run(tmp_path, "gorila", 3)         # 1 ps + 2 bundles
    train = m["train"]
    assert (run_dir / "config.toml").exists()
    # the analysis tool on this real run: the final evaluation (no periodic one yet), Pong's
    # no-op pair
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hpcrl.analyze", str(run_dir), "--format", "json",
                          "--compare", "dqn_nature_noop"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["games"][0]
    returns = m["final"]["return"]
    expected_hns = (returns.mean() - (-20.7)) / (14.6 - (-20.7))   # Pong random -20.7, human 14.6
    assert (row["game"], row["algo"], row["status"], row["score_source"]) == \
        ("pong", "gorila", "finished", "final")
    assert row["frames"] == [int(train["frames"][-1])]
    assert row["score_mean"] == pytest.approx(returns.mean())
    assert row["hns"] == pytest.approx(expected_hns)
    assert row["published"] == {"dqn_nature_noop": 18.9}


RMSPROP = ["optimizer=rmsprop_shared", "learning_rate=0.00025", "optim_eps=1e-5",
           "rmsprop_decay=0.99"]


@pytest.mark.slow
@pytest.mark.parametrize("sets", [[], RMSPROP], ids=["adagrad", "rmsprop"])
def test_cartpole_learns_within_100k_agent_steps(sets, tmp_path):
    """Issue acceptance: mean of the last 20 training episodes >= 195 within 100,000 agent steps
    over all actors (CartPole: one agent step = one frame), with the config's AdaGrad (Gorila's
    rule, warm-started G) and with DQN's RMSProp. ``early_stop`` ends the run once rank 0 sees
    the mark, which the episodes on disk must confirm."""
    run_dir = tmp_path / "cp"
    args = ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
            "--set", f"run_dir={run_dir}", "--set", "early_stop=true"]
    for item in sets:
        args += ["--set", item]
    proc, wall = run_mpi(4, args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    eps = read_metrics(run_dir / "metrics.h5")["episodes"]
    reached = first_frame_reaching(eps["frames"], eps["return"], 195.0)
    print(f"gorila cartpole {sets}: reached 195 at frame {reached}, {len(eps['return'])} "
          f"episodes, {wall:.0f} s")
    assert reached is not None and reached <= 100_000


def test_adagrad_warm_start_is_per_tensor_on_every_ps_shard(tmp_path):
    """A real job with 2 ps ranks: each shard's saved G0 is one value per piece of a network
    tensor that falls in it (the pieces worked out here from the network and the shard ranges),
    positive wherever the first gradient was, and not one value for the whole shard."""
    from hpcrl.config import load_config
    from hpcrl.io import checkpoint as ckpt
    from hpcrl.runtime.params.optim import tensor_pieces
    from hpcrl.runtime.program import initial_network
    from hpcrl.runtime.topology import shard_ranges

    run_dir = tmp_path / "r"
    proc, _ = run_mpi(5, ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
                          "--set", "total_frames=3000", "--set", "n_ps=2",
                          "--set", f"run_dir={run_dir}"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    theta0, sizes, _ = initial_network(load_config("configs/gorila_cartpole.toml"))
    assert sum(sizes) == theta0.size
    root = run_dir / "checkpoints"
    gen, manifest = ckpt.latest_complete(root)
    ps_files = [f["file"] for f, role in zip(manifest["files"], manifest["roles"]) if role == "ps"]
    for shard, (lo, hi) in enumerate(shard_ranges(theta0.size, 2)):
        state = ckpt.read_state(ckpt.gen_dir(root, gen) / ps_files[shard])
        g0, pieces = state["opt/G0"], tensor_pieces(sizes, lo, hi)
        assert g0.shape == (hi - lo,) and int(state["opt/n"]) > 0
        starts = np.cumsum([0] + pieces[:-1])
        for a, k in zip(starts, pieces):
            assert np.all(g0[a:a + k] == g0[a]), (shard, a, k)
        values = g0[starts]
        assert len(pieces) > 1 and len(set(values.tolist())) > 1
        assert np.all(values > 0)


def test_global_replay_actors_and_learners_share_data():
    from tests.util import ROOT

    proc, _ = run_mpi(5, [str(ROOT / "tests" / "mpi" / "replay_checks.py")], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK global_replay" in proc.stdout


@pytest.mark.parametrize("world, sets, counts", [
    (4, [], "1 ps, 3 actor-learner"),
    (6, ["mode=split", "n_learners=1"], "1 ps, 1 learner, 3 actor, 1 replay"),
    (6, ["mode=split", "n_actors=1"], "1 ps, 3 learner, 1 actor, 1 replay"),
    (5, ["n_evaluators=0", "eval_every_frames=300", "eval_episodes=2"], "1 ps, 4 actor-learner"),
    (5, ["n_evaluators=1", "eval_every_frames=1000", "eval_episodes=2"],
     "1 ps, 3 actor-learner, 1 evaluator"),
])
def test_modes_start_and_stop_cleanly(world, sets, counts, tmp_path):
    run_dir = tmp_path / "r"
    args = ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
            "--set", "total_frames=4000", "--set", f"run_dir={run_dir}"]
    for s in sets:
        args += ["--set", s]
    proc, _ = run_mpi(world, args, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert counts in proc.stdout
    m = read_metrics(run_dir / "metrics.h5")
    assert m["status"] == "finished" and len(m["episodes"]["frames"]) > 0
    assert m["train"]["frames"][-1] >= 4000
    assert m["train"]["updates"][-1] > 0
    if "eval_every_frames=300" in sets:
        assert len(m["eval"]["frames"]) >= 2 * 4    # every actor-learner evaluated at least once
        assert set(m["eval"]["rank"]) == {1, 2, 3, 4}
    if "n_evaluators=1" in sets:                    # the evaluator (rank 4) every 1000 frames
        assert len(m["eval"]["frames"]) >= 2 and set(m["eval"]["rank"]) == {4}


@pytest.mark.parametrize("layout, every, floor", [
    # 3 learners alone apply ~2,000 updates in these 6,000 frames: they wait for the actor
    ("n_actors=1", 20, lambda frames: 0.8 * (frames // 20)),
    # 3 actors outrun 1 learner: they wait once they are head_start = fill 500 + 2 x 4 steps
    # ahead of 4 x the updates applied
    ("n_learners=1", 4, lambda frames: (frames - 508) // 4 - 1),
], ids=["learners_wait", "actors_wait"])
def test_split_mode_keeps_to_split_update_every(layout, every, floor, tmp_path):
    """Split mode with split_update_every = U (CartPole, 6,000 frames): the ps applies at
    most frames / U updates, plus two gradients per learner that passed the check before it
    was due (one in its inbox, and one computed meanwhile: push returns once the gradient is
    posted, and waits only before posting the next), whichever side is the faster one."""
    run_dir = tmp_path / "r"
    proc, _ = run_mpi(6, ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
                          "--set", "mode=split", "--set", layout, "--set", "total_frames=6000",
                          "--set", f"split_update_every={every}", "--set", f"run_dir={run_dir}"],
                      timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    train = read_metrics(run_dir / "metrics.h5")["train"]
    frames, updates = int(train["frames"][-1]), int(train["updates"][-1])
    assert floor(frames) <= updates <= frames // every + 2 * 3, (frames, updates)


def test_bundle_updates_keep_the_replay_ratio_whatever_the_environments():
    """One update per ``update_every`` agent steps summed over a bundle's environments: after
    s batched steps of n environments, s * n // every updates in all (worked out by hand)."""
    from hpcrl.agents.gorila.workers import updates_due

    assert [updates_due(s, 1, 4) for s in range(1, 9)] == [0, 0, 0, 1, 0, 0, 0, 1]
    assert [updates_due(s, 8, 8) for s in range(1, 5)] == [1, 1, 1, 1]
    assert [updates_due(s, 16, 8) for s in range(1, 4)] == [2, 2, 2]
    assert [updates_due(s, 3, 2) for s in range(1, 5)] == [1, 2, 1, 2]   # 3, 6, 9, 12 steps
    for n, every in ((1, 1), (3, 2), (5, 8), (8, 3)):
        assert sum(updates_due(s, n, every) for s in range(1, 101)) == 100 * n // every


def test_bundles_with_several_environments_update_per_agent_step(tmp_path):
    """A bundled job of 3 bundles x 4 CartPole environments at update_every 2 applies about
    one update per 2 agent steps of the whole job once the replays are filled (the steps
    before the fill owe none): (frames - 3 x fill) / 2, less the gradients still in flight
    and dropped ones, never more than frames / 2."""
    run_dir = tmp_path / "r"
    proc, _ = run_mpi(4, ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
                          "--set", "envs_per_actor=4", "--set", "total_frames=12000",
                          "--set", "replay_min_fill=400", "--set", f"run_dir={run_dir}"],
                      timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    train = read_metrics(run_dir / "metrics.h5")["train"]
    frames, updates = int(train["frames"][-1]), int(train["updates"][-1])
    dropped = int(train["dropped_stale"][-1])
    assert frames >= 12000
    assert 0.9 * (frames - 3 * 400) / 2 <= updates + dropped <= frames / 2, (frames, updates)


def test_split_pacing_rules_never_both_wait():
    """If both sides could wait at once the job would hang: check every small case."""
    from hpcrl.agents.gorila.workers import actors_ahead, learners_ahead

    for every in (1, 3, 8):
        for head in (0, 5, 40):
            for steps in range(0, 120):
                for applied in range(0, 60):
                    assert not (learners_ahead(applied, steps, every)
                                and actors_ahead(steps, applied, every, head))
    assert learners_ahead(5, 40, 8) and not learners_ahead(4, 40, 8)
    assert actors_ahead(20, 1, 4, 12) and not actors_ahead(19, 1, 4, 12)
    assert not actors_ahead(10 ** 6, 0, 4, 12)        # never before the first update


def test_learner_counts_outlier_and_nonfinite_drops():
    """GorilaLearner: a loss far above the running statistics is dropped and counted; a NaN
    batch is dropped as non-finite; neither touches the update count."""
    import torch

    from hpcrl.config import load_config
    from hpcrl.agents.gorila.learner import GorilaLearner
    from hpcrl.rl.networks import MLPQNetwork
    from hpcrl.rl.types import Transition

    torch.manual_seed(0)
    cfg = load_config(None, ["outlier_k=3"])
    net, target = MLPQNetwork(2, 2, hidden=(8,)), MLPQNetwork(2, 2, hidden=(8,))
    learner = GorilaLearner(net, target, cfg)
    learner.outliers.warmup = 5

    def batch(reward):
        s = np.zeros((4, 1, 2), np.float32)
        return Transition(s, np.zeros(4, np.int64), np.full(4, reward, np.float32),
                          np.ones(4, np.float32), s)

    for i in range(10):                                  # steady small losses
        assert learner.gradient(batch(0.01 * (i % 3))) is not None
    assert learner.gradient(batch(1e4)) is None          # |TD| ~ 1e4: far above mean + 3 std
    assert learner.gradient(batch(np.nan)) is None
    stats = learner.stats
    assert (stats.updates, stats.dropped_outlier, stats.dropped_nonfinite) == (10, 1, 1)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_learner_gradient_on_images_equals_a_plain_torch_reference(precision):
    """The learner feeds image batches channels-last (a speed-up on CPU): its flat gradient is
    the one of a plain float32 NCHW forward and backward of the same Huber DQN loss on the same
    n-step batch (discount gamma^(m-1) folded into discount_t). With ``learner_precision =
    bfloat16`` (torso under autocast) it is that gradient to bfloat16's resolution (8
    significant bits: relative error ~4e-3 per op), and not bit-for-bit the float32 one."""
    import torch

    from hpcrl.agents.gorila.learner import GorilaLearner
    from hpcrl.config import load_config
    from hpcrl.rl.networks import NatureQNetwork
    from hpcrl.rl.types import Transition
    from hpcrl.runtime.params.layout import ParamLayout

    torch.manual_seed(1)
    cfg = load_config(None, ["outlier_k=0", f"learner_precision={precision}"])
    net, target = NatureQNetwork((4, 84, 84), 6), NatureQNetwork((4, 84, 84), 6)
    ref_net = NatureQNetwork((4, 84, 84), 6)
    ref_net.load_state_dict(net.state_dict())
    rng = np.random.default_rng(2)
    s_tm1, s_t = (rng.integers(0, 256, (8, 4, 84, 84), dtype=np.uint8) for _ in range(2))
    a = rng.integers(6, size=8)
    r = rng.normal(size=8).astype(np.float32) * 3
    d = np.array([1, 0, 0.99, 1, 0.9801, 1, 0, 1], np.float32)
    grad = GorilaLearner(net, target, cfg).gradient(Transition(s_tm1, a, r, d, s_t)).copy()

    q = ref_net(torch.from_numpy(s_tm1))[torch.arange(8), torch.from_numpy(a)]
    with torch.no_grad():
        y = torch.from_numpy(r) + 0.99 * torch.from_numpy(d) * target(torch.from_numpy(s_t)).max(1).values
    torch.nn.functional.huber_loss(q, y, delta=1.0).backward()
    ref = torch.cat([p.grad.reshape(-1) for p in ref_net.parameters()]).numpy()
    if precision == "float32":
        np.testing.assert_allclose(grad, ref, rtol=1e-4, atol=1e-7)
        return
    # bfloat16 rounding compounds through four layers: 4-10 % relative error per torso tensor
    # on random networks and batches (measured), against ~160 % between the gradients of two
    # different minibatches, the noise SGD already carries; the float32 Q head's is ~0.5 %.
    rel = np.linalg.norm(grad - ref) / np.linalg.norm(ref)
    assert 1e-5 < rel < 0.15, rel
    layout = ParamLayout.from_module(net)
    for name, start, stop in zip(layout.names, layout.offsets, layout.offsets[1:] + (layout.size,)):
        err = np.linalg.norm(grad[start:stop] - ref[start:stop])
        assert err <= 0.15 * np.linalg.norm(ref[start:stop]), name
    other = Transition(s_t, a, r[::-1].copy(), d, s_tm1)            # another minibatch
    learner32 = GorilaLearner(ref_net, target, load_config(None, ["outlier_k=0"]))
    between = np.linalg.norm(learner32.gradient(other) - ref) / np.linalg.norm(ref)
    assert rel < 0.1 * between, (rel, between)


@pytest.mark.mpi
@pytest.mark.parametrize("unit, every", [("updates", 300), ("agent_steps", 300),
                                         ("agent_steps", 5)])
def test_target_period_counts_its_unit(unit, every, tmp_path):
    """With ``target_update_unit = updates`` the ps refreshes theta- every K applied updates
    (Gorila's N); with ``agent_steps`` every K global agent steps, asked for by the actor whose
    addition to the frame counter crosses the multiple (DQN's C): the number of refreshes at
    the final checkpoint is applied // K or frames // K (CartPole: one frame per agent step).
    K = 5 is below the steps an actor adds at once (FRAMES_ADDED_EVERY), so one addition
    crosses one or two multiples and must ask for as many refreshes."""
    from hpcrl.agents.gorila.actor import FRAMES_ADDED_EVERY
    from hpcrl.io import checkpoint as ckpt
    from hpcrl.tools.runfiles import checkpoint_generation

    assert FRAMES_ADDED_EVERY > 5
    run_dir = tmp_path / "r"
    proc, _ = run_mpi(4, ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
                          "--set", "total_frames=3000", "--set", f"run_dir={run_dir}",
                          "--set", f"target_update_every={every}",
                          "--set", f"target_update_unit={unit}"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    gen, manifest = checkpoint_generation(run_dir)
    ps = ckpt.read_state(ckpt.rank_file(run_dir / "checkpoints", gen, 0))     # rank 0: the ps
    refreshes, applied = int(ps["hdr/TV"]), int(ps["hdr/applied"])
    requests = int(ps["hdr/target_requests"])
    frames = int(manifest["frames"])
    assert frames >= 3000 and applied > 0
    if unit == "updates":
        assert (refreshes, requests) == (applied // every, 0)
    else:
        assert requests == frames // every and refreshes == requests
        assert applied // every != frames // every     # the two units differ in this run


def test_bfloat16_learner_batch_is_the_one_autocast_would_make(monkeypatch):
    """With ``learner_precision = bfloat16`` the learner builds its image batches in bfloat16
    (`scaled_channels_last(x, torch.bfloat16)`), the values autocast casts a float32 batch to:
    its gradient equals, bit for bit, the one from float32 batches that autocast casts."""
    import torch

    from hpcrl.agents.gorila import learner as learner_module
    from hpcrl.config import load_config
    from hpcrl.rl.networks import NatureQNetwork, scaled_channels_last
    from hpcrl.rl.types import Transition

    torch.manual_seed(4)
    cfg = load_config(None, ["outlier_k=0", "learner_precision=bfloat16"])
    net, target = NatureQNetwork((4, 84, 84), 6), NatureQNetwork((4, 84, 84), 6)
    rng = np.random.default_rng(5)
    s_tm1, s_t = (rng.integers(0, 256, (8, 4, 84, 84), dtype=np.uint8) for _ in range(2))
    batch = Transition(s_tm1, rng.integers(6, size=8), rng.normal(size=8).astype(np.float32),
                       np.full(8, 0.99, np.float32), s_t)
    seen = []
    real_q_values = learner_module.q_values

    def spy(net_, obs, torso_dtype=None):
        seen.append(obs.dtype)
        return real_q_values(net_, obs, torso_dtype)

    monkeypatch.setattr(learner_module, "q_values", spy)
    grad = learner_module.GorilaLearner(net, target, cfg).gradient(batch).copy()
    assert seen == [torch.bfloat16, torch.bfloat16]       # s_tm1 and s_t, made in bfloat16
    monkeypatch.setattr(learner_module, "scaled_channels_last",
                        lambda x, dtype: scaled_channels_last(x, torch.float32))
    floats = learner_module.GorilaLearner(net, target, cfg).gradient(batch).copy()
    assert seen[2:] == [torch.float32, torch.float32]
    assert np.array_equal(grad, floats)
    assert np.abs(grad).max() > 0


def test_bfloat16_target_torso_cast_once_per_pull_changes_no_bit():
    """With a bfloat16 torso the learner keeps the target's torso weights cast between target
    pulls (`target_pulls`): the gradient equals the one with autocast casting them at every
    update, bit for bit, before and after the target's weights change with a new pull count,
    and a changed target under an unchanged count would not be seen (the count is the key)."""
    import torch

    from hpcrl.agents.gorila.learner import GorilaLearner
    from hpcrl.config import load_config
    from hpcrl.rl.networks import NatureQNetwork
    from hpcrl.rl.types import Transition

    torch.manual_seed(6)
    cfg = load_config(None, ["outlier_k=0", "learner_precision=bfloat16"])
    net, target = NatureQNetwork((4, 84, 84), 6), NatureQNetwork((4, 84, 84), 6)
    rng = np.random.default_rng(7)
    s_tm1, s_t = (rng.integers(0, 256, (8, 4, 84, 84), dtype=np.uint8) for _ in range(2))
    batch = Transition(s_tm1, rng.integers(6, size=8), rng.normal(size=8).astype(np.float32),
                       np.full(8, 0.99, np.float32), s_t)
    cached, every_time = GorilaLearner(net, target, cfg), GorilaLearner(net, target, cfg)
    for pulls in (1, 1, 2):
        if pulls == 2:
            with torch.no_grad():
                for p in target.parameters():
                    p.mul_(1.5)
        got = cached.gradient(batch, pulls).copy()
        want = every_time.gradient(batch).copy()
        assert np.array_equal(got, want), pulls
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(2.0)
    stale, fresh = cached.gradient(batch, 2), every_time.gradient(batch)
    assert stale is not None and fresh is not None
    assert not np.array_equal(stale, fresh)


def test_learner_drops_a_gradient_whose_squared_norm_is_not_finite():
    """A finite loss whose gradient's float32 squared norm overflows (output weights of 1e30:
    the hidden layer's gradient is about 1e30 per element, its squares past float32's range)
    is dropped as non-finite; the same network with ordinary weights updates."""
    import torch

    from hpcrl.agents.gorila.learner import GorilaLearner
    from hpcrl.config import load_config
    from hpcrl.rl.networks import MLPQNetwork
    from hpcrl.rl.types import Transition

    torch.manual_seed(0)
    cfg = load_config(None, [])
    net, target = MLPQNetwork(2, 2, hidden=(8,)), MLPQNetwork(2, 2, hidden=(8,))
    learner = GorilaLearner(net, target, cfg)
    s = np.ones((4, 1, 2), np.float32)
    batch = Transition(s, np.zeros(4, np.int64), np.zeros(4, np.float32),
                       np.ones(4, np.float32), s)
    assert learner.gradient(batch) is not None
    with torch.no_grad():
        net.q_head.weight.fill_(1e30)
        net.torso[0].bias.fill_(1.0)                    # every hidden unit active
    assert learner.gradient(batch) is None
    assert (learner.stats.updates, learner.stats.dropped_nonfinite) == (1, 1)

