"""After training: python -m hpcrl.play, python -m hpcrl.export (torch, tensorboard, csv) and
hpcrl.load_policy, on real short CartPole runs (real MPI ranks, real checkpoints, real metrics
files), videos read back with the libraries that wrote them."""

import json
import re
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import hpcrl
from hpcrl.envs import env_kwargs, make_env
from hpcrl.io.metrics import COLUMNS, MetricsWriter, read_metrics
from hpcrl.rl.obs_norm import find_obs_normalizer
from hpcrl.tools import export, play, runfiles
from hpcrl.tools.policy import PolicyFileError, export_torch, policy_from_run
from hpcrl.tools.video import VideoError, check_video_path
from tests.util import ROOT, run_mpi

RUNS = {"a3c": "configs/a3c_cartpole.toml", "a3c_lstm": "configs/a3c_lstm_cartpole.toml",
        "n_step_q": "configs/n_step_q_cartpole.toml"}
#: runs of the fixture that are not CartPole (the parametrised tests above take RUNS only)
#: InvertedPendulum-v5 with the network's observation statistics (obs_norm)
OTHER_RUNS = {"a3c_mujoco": ("configs/a3c_mujoco.toml", ["--set", "obs_norm=true"])}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One short run per kind of network (actor-critic, LSTM actor-critic, Q), each ending
    with its final checkpoint."""
    out = {}
    runs = {**{name: (config, []) for name, config in RUNS.items()}, **OTHER_RUNS}
    for name, (config, sets) in runs.items():
        run = tmp_path_factory.mktemp(name) / "run"
        proc, _ = run_mpi(3, ["-m", "hpcrl.run", "--config", config, *sets, "--set",
                              "total_frames=3000", "--set", f"run_dir={run}", "--set", "seed=5",
                              "--set", "eval_every_frames=0"], timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = run
    return out


def _played(policy, episodes=2, seed=3):
    env = make_env(policy.config.game, 1, seed, **env_kwargs(policy.config, training=False))
    return play.play(policy, env, episodes, keep_observations=True)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", list(RUNS))
def test_exported_policy_acts_as_play_does_on_the_same_observations(runs, tmp_path, kind):
    run = runs[kind]
    policy = policy_from_run(run, seed=11)
    episodes = _played(policy)
    weights, meta_path = export_torch(policy_from_run(run), tmp_path / "policy.pt")
    meta = json.loads(meta_path.read_text())
    assert (meta["algo"], meta["game"], meta["obs_shape"], meta["action_ids"]) == (
        policy.config.algo, "CartPole-v1", [4], [0, 1])
    assert meta["source"]["generation"] == runfiles.checkpoint_generation(run)[0]
    # the exported tensors are the checkpoint's ps parameters, in the flat vector's order
    gen, manifest = runfiles.checkpoint_generation(run)
    flat = runfiles.ps_array(run, gen, manifest, "params")
    state = torch.load(weights, weights_only=True)
    assert np.array_equal(np.concatenate([t.numpy().ravel() for t in state.values()]), flat)
    by_json = hpcrl.load_policy(meta_path).module.state_dict()      # the JSON names the weights
    assert all(torch.equal(by_json[k], v) for k, v in state.items())
    loaded = hpcrl.load_policy(weights, seed=11)    # same acting seed: same sampled actions
    for ep in episodes:
        actions = [int(loaded.act(obs[None])[0]) for obs in ep.observations]
        loaded.episode_end(np.array([True]))
        assert actions == ep.actions and len(actions) == ep.agent_steps


@pytest.mark.mpi
def test_a_continuous_policy_exports_loads_and_plays_its_mean_action(runs, tmp_path, capsys):
    """A3C's Gaussian policy on InvertedPendulum-v5: play and the exported file act with the
    policy's mean, float actions [1, 1]; play's summary line comes out."""
    run = runs["a3c_mujoco"]
    policy = policy_from_run(run)
    (episode,) = _played(policy, episodes=1)
    weights, meta_path = export_torch(policy, tmp_path / "pendulum.pt")
    meta = json.loads(meta_path.read_text())
    assert (meta["game"], meta["obs_shape"], meta["num_actions"]) == ("InvertedPendulum-v5",
                                                                     [4], 1)
    assert meta["acting"].startswith("the mean of the Gaussian policy")
    loaded = hpcrl.load_policy(weights)
    # the observation statistics come with the weights: the first actor-learner's, from the
    # checkpoint, in the network's buffers
    gen, manifest = runfiles.checkpoint_generation(run)
    saved = runfiles.first_rank_group(run, gen, manifest, "actor-learner", "obs_norm")
    for p in (policy, loaded):
        stats = find_obs_normalizer(p.module).get_state()
        assert stats["count"] == saved["count"] > 0
        np.testing.assert_array_equal(stats["mean"], saved["mean"])
        np.testing.assert_array_equal(stats["m2"], saved["m2"])
    first = episode.observations[0][None]
    with torch.no_grad():
        mean = policy.module(torch.from_numpy(first))[0][:, :1].numpy()
    np.testing.assert_array_equal(loaded.act(first), mean)
    assert loaded.act(first).dtype == np.float32 and loaded.act(first).shape == (1, 1)
    for obs, action in zip(episode.observations, episode.actions):
        assert loaded.act(obs[None])[0].tolist() == action
    assert play.main([run.as_posix(), "--episodes", "2"]) == 0
    assert "mean return" in capsys.readouterr().out


@pytest.mark.mpi
def test_a_resume_must_keep_obs_norm_as_the_checkpoint_was_written(runs):
    """The observation statistics are part of the network but not of its parameters: the
    manifest records obs_norm, and a job with the other value is refused (one line, on every
    rank), also where the run directory's config.toml is gone."""
    from mpi4py import MPI

    from hpcrl.config import ConfigError
    from hpcrl.runtime.rundir import find_resume
    from hpcrl.runtime.topology import make_layout

    run = runs["a3c_mujoco"]
    cfg = runfiles.load_run_config(run)
    n_params = sum(p.numel() for p in policy_from_run(run).module.parameters())
    layout = make_layout(3, cfg)
    found, _ = find_resume(MPI.COMM_SELF, run, layout, n_params, obs_norm=True)
    assert found is not None
    with pytest.raises(ConfigError, match="was written with obs_norm = true"):
        find_resume(MPI.COMM_SELF, run, layout, n_params, obs_norm=False)


@pytest.mark.mpi
def test_lstm_state_is_carried_within_an_episode_and_reset_at_its_end(runs):
    policy = policy_from_run(runs["a3c_lstm"], greedy=True)
    obs = np.array([[0.01, 0.2, -0.03, -0.1]], np.float32)
    policy.act(obs)
    h1 = policy.state[0].clone()
    policy.act(obs)
    assert not torch.equal(policy.state[0], h1)          # the state moved on
    policy.episode_end(np.array([True]))
    assert torch.count_nonzero(policy.state[0]) == 0


@pytest.mark.mpi
def test_play_prints_each_episode_and_writes_a_gif_and_an_mp4(runs, tmp_path, capsys):
    pytest.importorskip("pygame")
    import imageio.v2 as imageio
    import imageio_ffmpeg
    from PIL import Image

    for suffix in (".gif", ".mp4"):
        video = tmp_path / f"cartpole{suffix}"
        assert play.main([str(runs["a3c"]), "--episodes", "2", "--video", str(video)]) == 0
        out = capsys.readouterr().out
        steps = [int(s.replace(",", "")) for s in re.findall(r"\(([\d,]+) agent steps\)", out)]
        assert len(steps) == 2 and "mean return" in out
        n = sum(steps) + 1                                  # the first screen, then each step
        if suffix == ".gif":
            # pillow merges identical consecutive frames and adds up their delays (a pole at
            # rest for a step), so the frames' delays, 20 ms each at 50 fps, count them
            with Image.open(video) as img:
                assert img.size == (600, 400) and img.n_frames <= n
                delays = []
                for i in range(img.n_frames):
                    img.seek(i)
                    delays.append(img.info["duration"])
                assert sum(delays) == 20 * n
                img.seek(img.n_frames // 2)
                frame = np.asarray(img.convert("RGB"))
        else:
            assert imageio_ffmpeg.count_frames_and_secs(str(video))[0] == n
            with imageio.get_reader(video) as reader:
                frame = reader.get_data(n // 2)
            assert frame.shape == (400, 600, 3)
        assert frame.std() > 10                             # a cart and a pole on white


def test_video_paths_and_missing_extras_get_one_line(tmp_path, monkeypatch):
    with pytest.raises(VideoError, match="must end in .mp4 or .gif"):
        check_video_path(tmp_path / "x.avi")
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)   # as if not installed
    with pytest.raises(VideoError, match=r"pip install 'hpcrl\[video\]'"):
        check_video_path(tmp_path / "x.mp4")


@pytest.mark.mpi
def test_bad_run_directories_and_generations_get_one_line_and_exit_1(runs, tmp_path, capsys):
    assert play.main([str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == f"hpcrl.play: {tmp_path}: not a run directory " \
                                              "(no config.toml)"
    from hpcrl.io import checkpoint as ckpt

    on_disk = ", ".join(map(str, ckpt.generations(runs["a3c"] / "checkpoints")))
    assert export.main(["torch", str(runs["a3c"]), "--generation", "999"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"hpcrl.export: {runs['a3c']}: no checkpoint generation 999 (on disk: "
                   f"{on_disk})")
    assert play.main([str(runs["a3c"]), "--target"]) == 1
    assert "A3C has no target network" in capsys.readouterr().err


def test_a_policy_file_that_is_not_ours_is_refused(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"format": "something-else"}))
    torch.save({}, tmp_path / "p.pt")
    with pytest.raises(PolicyFileError, match="not an hpcrl-policy v1 file"):
        hpcrl.load_policy(tmp_path / "p.pt")
    (tmp_path / "p.json").write_text(json.dumps({"format": "hpcrl-policy",
                                                 "format_version": 1}))
    with pytest.raises(PolicyFileError, match="incomplete policy metadata"):
        hpcrl.load_policy(tmp_path / "p.pt")


@pytest.mark.mpi
@pytest.mark.parametrize("damage", [b"", b"not a torch file at all"])
def test_damaged_weights_are_one_line(runs, tmp_path, damage):
    weights, _ = export_torch(policy_from_run(runs["a3c"]), tmp_path / "policy.pt")
    weights.write_bytes(damage)
    with pytest.raises(PolicyFileError, match="cannot load the weights"):
        hpcrl.load_policy(weights)


def _read_events(directory):
    """{tag: [(step, value)]} of every TensorBoard event file under ``directory``: the TFRecord
    framing (length, masked CRC, data, masked CRC) checked with tensorboardX's CRC, each record
    parsed with its Event protocol buffer (protobuf's own decoder)."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    scalars = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, pos, first = path.read_bytes(), 0, True
        while pos < len(data):
            header = data[pos:pos + 8]
            (length,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == masked_crc32c(header)
            body = data[pos + 12:pos + 12 + length]
            assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == \
                masked_crc32c(body)
            event = Event.FromString(body)
            if first:
                assert event.file_version == "brain.Event:2"
                first = False
            pos += 16 + length
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_crc32c_check_value_and_torch_free_export(tmp_path):
    from hpcrl.io.tbevents import crc32c

    assert crc32c(b"123456789") == 0xE3069283          # the CRC-32C check value
    run = tmp_path / "run"
    run.mkdir()
    _metrics_file(run / "metrics.h5", EPISODES, TRAIN)
    code = ("import sys; from hpcrl.tools import export; "
            f"assert export.main(['tensorboard', {str(run)!r}]) == 0; "
            f"assert export.main(['csv', {str(run)!r}]) == 0; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _metrics_file(path, episodes, train):
    with MetricsWriter(path, {"algo": "a3c", "game": "pong", "seed": 0, "config": ""}) as w:
        for row in episodes:
            w.append("episodes", **row)
        for row in train:
            w.append("train", **row)
        w.flush()
        return read_metrics(path)


EPISODES = [dict(frames=100 * i, **{"return": -21.0 + i}, length=90 + i, rank=1,
                 wall_time=0.5 * i) for i in range(1, 6)]
TRAIN = [dict(frames=200 * i, updates=10 * i, loss=1.0 / i, dropped_stale=i, dropped_outlier=0,
              dropped_nonfinite=0, frames_per_second=1000.0 + i, wall_time=float(i),
              grad_norm=2.0 * i, clipped_fraction=0.25, clip_kept=0.9, entropy=1.5 - 0.5 * i)
         for i in range(1, 4)]                  # max_q left out: NaN, as for A3C


def test_tensorboard_scalars_equal_the_hdf5_values_and_a_second_pass_adds_only_new_rows(
        tmp_path):
    tb = export.TensorBoardExport(tmp_path / "tb")
    assert tb.append(_metrics_file(tmp_path / "m.h5", EPISODES[:3], TRAIN)) == 6
    assert tb.append(_metrics_file(tmp_path / "m2.h5", EPISODES, TRAIN)) == 2   # 2 new episodes
    tb.close()
    scalars = _read_events(tmp_path / "tb")
    assert scalars["episodes/return"] == [(100 * i, -21.0 + i) for i in range(1, 6)]
    assert scalars["episodes/length"] == [(100 * i, 90 + i) for i in range(1, 6)]
    assert scalars["train/loss"] == [(200 * i, np.float32(1.0 / i)) for i in range(1, 4)]
    assert scalars["train/dropped_stale"] == [(200 * i, i) for i in range(1, 4)]
    assert scalars["train/entropy"] == [(200 * i, 1.5 - 0.5 * i) for i in range(1, 4)]
    assert scalars["train/grad_norm"] == [(200 * i, 2.0 * i) for i in range(1, 4)]
    assert scalars["train/clip_kept"] == [(200 * i, np.float32(0.9)) for i in range(1, 4)]
    # every train column but the axes, and those NaN in every row (not measured here): no
    # points rather than NaN points
    assert {t.split("/")[1] for t in scalars if t.startswith("train/")} == set(
        COLUMNS["train"]) - {"frames", "wall_time", "max_q", "dead_units", "dead_params"}


def test_tensorboard_follow_ends_when_the_run_is_no_longer_running(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _metrics_file(run / "metrics.h5", EPISODES, TRAIN)    # closed: status "finished"
    assert export.main(["tensorboard", str(run), "--follow", "--every", "0.01"]) == 0
    assert len(_read_events(run / "tensorboard")["episodes/return"]) == 5
    assert export.main(["tensorboard", str(run)]) == 0    # again: replaces, no duplicates
    assert len(_read_events(run / "tensorboard")["episodes/return"]) == 5


WRITER = """
import sys, time
from hpcrl.io.metrics import MetricsWriter
w = MetricsWriter(sys.argv[1], {"algo": "a3c", "game": "pong", "seed": 0, "config": ""})
for i in range(1, 11):
    w.append("episodes", frames=100 * i, return_=float(i), length=90, rank=1)
    w.flush()
    if i == 1:
        open(sys.argv[1] + ".started", "w").close()
    time.sleep(0.15)
w.close()
"""


def test_tensorboard_follow_keeps_up_with_a_live_run_until_it_finishes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.h5"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not (run / "metrics.h5.started").exists():
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        assert read_metrics(path)["status"] == "running"
        assert export.main(["tensorboard", str(run), "--follow", "--every", "0.05"]) == 0
    finally:
        assert writer.wait(timeout=30) == 0
    assert _read_events(run / "tensorboard")["episodes/return"] == [
        (100 * i, float(i)) for i in range(1, 11)]


def test_csv_holds_every_column_exactly(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    metrics = _metrics_file(run / "metrics.h5", EPISODES, TRAIN)
    assert export.main(["csv", str(run)]) == 0
    import csv

    for group in ("episodes", "train", "eval"):
        with open(run / "csv" / f"{group}.csv") as fh:
            rows = list(csv.reader(fh))
        assert rows[0] == list(COLUMNS[group])
        for j, name in enumerate(rows[0]):
            col = np.array([float(r[j]) for r in rows[1:]])
            assert np.array_equal(col, metrics[group][name].astype(float), equal_nan=True)
