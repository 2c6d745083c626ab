"""Checkpoint, stop and resume under real mpiexec (Gorila bundled and A3C on CartPole, A3C's
Gaussian policy on MuJoCo's InvertedPendulum).

1. run with a large budget, send SIGTERM (SIGUSR1 under Open MPI) to mpiexec once some frames
   are done: every rank checkpoints, the job exits 85 (requeue me);
2. resume with a checkpoint forced at start: that generation must equal the one written at the
   signal, dataset by dataset (parameters, optimiser state, counters, replay, exploration, RNGs);
3. run on to twice the frames: metrics.h5 has no duplicate and no missing episode: per env, the
   episode lengths plus the running episode add up to the global frame counter exactly.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hpcrl.io import checkpoint as ck
from hpcrl.io.metrics import read_metrics
from tests.util import ROOT, mpiexec_path, stop_signal

pytestmark = pytest.mark.mpi


def launch(args, env_extra=None, n=4):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env_extra or {}))
    return subprocess.Popen([mpiexec_path(), "-n", str(n), sys.executable, "-m", "hpcrl.run", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def frames_in_metrics(path):
    try:
        train = read_metrics(path)["train"]
        return int(train["frames"][-1]) if len(train["frames"]) else 0
    except Exception:   # noqa: BLE001 - not created yet
        return 0


def states(root, gen):
    manifest = ck.verify(root, gen)
    return manifest, {e["file"]: ck.read_state(ck.gen_dir(root, gen) / e["file"])
                      for e in manifest["files"]}


def running_frames(generation_states):
    """The frames of the episodes running at a generation, summed over its rank files."""
    return sum(int(np.sum(st[k])) for st in generation_states.values() for k in st
               if k.endswith("episode_frames_so_far"))


@pytest.mark.parametrize("config, extra", [
    ("gorila_cartpole", []), ("a3c_cartpole", []),
    ("gorila_cartpole", ["--set", "envs_per_actor=3"]),     # a replay per environment
    ("a3c_cartpole", ["--set", "envs_per_actor=4"]),        # batched actor-learners
    ("a3c_mujoco", ["--set", "game=InvertedPendulum-v5", "--set", "envs_per_actor=2",
                    "--set", "eval_every_frames=0",       # float actions, MuJoCo's state,
                    "--set", "obs_norm=true",             # each rank's observation and
                    "--set", "reward_norm=true"]),        # return statistics
])
def test_sigterm_checkpoint_resume_exact(config, extra, tmp_path):
    run_dir = tmp_path / "run"
    common = ["--config", f"configs/{config}.toml", "--set", f"run_dir={run_dir}",
              "--set", "checkpoint_keep=10", "--set", "log_every_s=0.5", *extra]
    # 1. SIGTERM after >= 1500 frames
    proc = launch(common + ["--set", "total_frames=1000000"])
    deadline = time.time() + 120
    while frames_in_metrics(run_dir / "metrics.h5") < 1500 and time.time() < deadline:
        time.sleep(0.2)
    t_signal = time.time()
    proc.send_signal(stop_signal())
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 85, out[-3000:]
    assert time.time() - t_signal < 30
    assert "checkpoint generation 1" in out and "after the signal" in out
    assert read_metrics(run_dir / "metrics.h5")["status"] == "preempted"
    root = run_dir / "checkpoints"
    m1, s1 = states(root, 1)
    frames_s = m1["frames"]
    # 2. resume; generation 2 is forced before any step and must equal generation 1
    proc = launch(common + ["--set", f"total_frames={2 * frames_s}"],
                  {"HPCRL_CHECKPOINT_ON_START": "1"})
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert f"resuming from checkpoint generation 1 at frame {frames_s:,}" in out
    m2, s2 = states(root, 2)
    assert m2["frames"] == frames_s
    assert s1.keys() == s2.keys()
    for name in s1:
        assert s1[name].keys() == s2[name].keys(), name
        for key in s1[name]:
            np.testing.assert_array_equal(s1[name][key], s2[name][key], err_msg=f"{name}:{key}")
    # 3. the run went on to 2S; metrics have every episode exactly once
    last = max(ck.generations(root))
    m3, s3 = states(root, last)
    total = int(s3["rank-00000.h5"]["hdr/frames"])
    assert total >= 2 * frames_s and m3["frames"] == total
    eps = read_metrics(run_dir / "metrics.h5")["episodes"]
    assert int(eps["length"].sum()) + running_frames(s3) == total
    # The frame identity above is exact: a duplicated or missing episode breaks it. With one
    # env per rank, (rank, frame stamp) also names an episode; with several, episodes of two
    # envs may end at the same agent step and share a stamp.
    if not extra:
        keys = list(zip(eps["rank"].tolist(), eps["frames"].tolist()))
        assert len(keys) == len(set(keys))             # no duplicate after the rollback
    assert int(eps["frames"].max()) <= total
    # The episodes' clock is summed over restarts, as the train rows' is: each rank's episodes
    # end in frame order, so their wall times never go back (a clock restarted by the resume
    # would: the first start ran for seconds before the signal).
    for r in np.unique(eps["rank"]):
        mine = eps["rank"] == r
        wall = eps["wall_time"][mine][np.argsort(eps["frames"][mine], kind="stable")]
        assert np.all(np.diff(wall) >= 0), (r, wall)
    if config == "a3c_mujoco":
        # InvertedPendulum-v5 pays 1 per step but 0 for the step the pole falls: reported
        # returns are the raw ones (reward_norm scales only what the learner sees)
        assert set((eps["length"] - eps["return"]).tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("config, frames", [("gorila_cartpole", 20_000),
                                           ("a3c_cartpole", 40_000)])
def test_every_generation_is_the_metrics_rows_stamped_at_or_below_it(config, frames, tmp_path):
    # A resume from any generation keeps the episodes stamped at or below its frames
    # (MetricsWriter.rollback) and plays the running ones on from its states: for every
    # generation of a run checkpointing every ~0.3 s, those must add up to its frames exactly.
    # A rank stamps episodes with the counter's last value it saw plus its own frames since;
    # if that value is not read again after a checkpoint (its own addition before it may
    # precede the other ranks'), an episode ending within a few steps of the checkpoint is
    # stamped at or below its frames: 3 of 29 Gorila and 4 of 9 A3C generations were so.
    run_dir = tmp_path / "run"
    proc = launch(["--config", f"configs/{config}.toml", "--set", f"run_dir={run_dir}",
                   "--set", f"total_frames={frames}", "--set", "checkpoint_every_min=0.005",
                   "--set", "checkpoint_keep=1000", "--set", "log_every_s=5",
                   "--set", "final_eval_episodes=0"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    eps = read_metrics(run_dir / "metrics.h5")["episodes"]
    root = run_dir / "checkpoints"
    gens = ck.generations(root)
    assert len(gens) >= 8, out[-2000:]
    wrong = []
    for gen in gens:
        manifest, st = states(root, gen)
        counted = (int(eps["length"][eps["frames"] <= manifest["frames"]].sum())
                   + running_frames(st))
        if counted != manifest["frames"]:
            wrong.append((gen, manifest["frames"], counted))
    assert not wrong, wrong


def test_nonfinite_parameters_are_never_checkpointed(tmp_path):
    """Resume from a generation whose ps shard was poisoned with NaN (file and manifest hash
    rewritten, as a diverged run would leave them): every later generation is refused with a
    warning, so nothing with NaN/inf parameters is written by the job."""
    run_dir = tmp_path / "run"
    common = ["--config", "configs/gorila_cartpole.toml", "--set", f"run_dir={run_dir}",
              "--set", "checkpoint_keep=10"]
    proc = launch(common + ["--set", "total_frames=1000"])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    root = run_dir / "checkpoints"
    ps_file = ck.rank_file(root, 1, 0)
    state = ck.read_state(ps_file)
    state["params"][::7] = np.nan
    entry = ck.write_state(ps_file, state)
    manifest = ck.read_manifest(root, 1)
    manifest["files"] = [entry if e["file"] == entry["file"] else e for e in manifest["files"]]
    (ck.gen_dir(root, 1) / ck.MANIFEST).write_text(json.dumps(manifest))
    proc = launch(common + ["--set", "total_frames=2000"], {"HPCRL_CHECKPOINT_ON_START": "1"})
    out, _ = proc.communicate(timeout=120)
    # generation 2 (asked at start) is refused with a warning, the final one too: the run has
    # no final weights on disk, so it stops as failed (status 3, not requeued)
    assert proc.returncode == 3, out[-3000:]
    assert "shard 0 parameters hold NaN or inf; this generation is not written" in out
    assert "the run stops as failed with status 3" in out
    assert ck.generations(root) == [1]


def test_resume_with_more_then_fewer_ps_ranks(tmp_path):
    """A checkpoint of 1 ps + 3 bundles resumes as 3 ps + 3 bundles (shards re-split, bundles
    now at ranks 1, 3, 5), then as 2 ps + 3 bundles. The generation forced at each start equals
    the one before it: the shards concatenate to the same vectors, worker k's state is worker
    k's, and the run completes with every episode once."""
    run_dir = tmp_path / "run"
    common = ["--config", "configs/gorila_cartpole.toml", "--set", f"run_dir={run_dir}",
              "--set", "checkpoint_keep=10", "--set", "optimizer=momentum"]
    root = run_dir / "checkpoints"
    proc = launch(common + ["--set", "total_frames=1500"])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    steps = [(6, 3, 3000), (5, 2, 4500)]
    for n, n_ps, total in steps:
        before = max(ck.generations(root))
        m_old, s_old = states(root, before)
        proc = launch(common + ["--set", f"total_frames={total}", "--set", f"n_ps={n_ps}"],
                      {"HPCRL_CHECKPOINT_ON_START": "1"}, n=n)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-3000:]
        old_ps = m_old["roles"].count("ps")
        assert (f"resuming from checkpoint generation {before} at frame {m_old['frames']:,}, its "
                f"{old_ps} parameter shards re-split over {n_ps} ps ranks") in out
        m_new, s_new = states(root, before + 1)
        assert m_new["frames"] == m_old["frames"] and m_new["roles"].count("ps") == n_ps

        def files_of(manifest, role):
            return [f"rank-{r:05d}.h5" for r, x in enumerate(manifest["roles"]) if x == role]

        for key in ("params", "target", "opt/m"):
            joined_old = np.concatenate([s_old[f][key] for f in files_of(m_old, "ps")], axis=-1)
            joined_new = np.concatenate([s_new[f][key] for f in files_of(m_new, "ps")], axis=-1)
            np.testing.assert_array_equal(joined_old, joined_new, err_msg=key)
        for name in ("frames", "steps", "applied"):
            assert s_old["rank-00000.h5"][f"hdr/{name}"] == s_new["rank-00000.h5"][f"hdr/{name}"]
        workers_old = files_of(m_old, "actor-learner")
        workers_new = files_of(m_new, "actor-learner")
        assert len(workers_old) == len(workers_new) == 3
        for a, b in zip(workers_old, workers_new):
            assert s_old[a].keys() == s_new[b].keys()
            for key in s_old[a]:
                np.testing.assert_array_equal(s_old[a][key], s_new[b][key], err_msg=f"{b}:{key}")
    m3, s3 = states(root, max(ck.generations(root)))
    total = int(s3["rank-00000.h5"]["hdr/frames"])
    assert total >= 4500
    eps = read_metrics(run_dir / "metrics.h5")["episodes"]
    assert int(eps["length"].sum()) + running_frames(s3) == total


def test_a_signal_stop_whose_checkpoint_fails_is_not_requeued(tmp_path):
    """SIGTERM (a time limit) while rank 2's disk is full: the stop's generation cannot be
    written, so exit 85 (requeue me) would only resume from nothing and fail again: status 3
    and metrics "failed" instead."""
    run_dir = tmp_path / "run"
    proc = launch(["--config", "configs/gorila_cartpole.toml", "--set", f"run_dir={run_dir}",
                   "--set", "total_frames=100000000", "--set", "log_every_s=0.5"],
                  {"HPCRL_CKPT_FAIL_RANK": "2"})
    deadline = time.time() + 120
    while frames_in_metrics(run_dir / "metrics.h5") < 500 and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(stop_signal())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out[-3000:]
    assert ("hpcrl: error: checkpoint generation 1 not written (rank 2: No space left on "
            "device (injected)); the job was stopping: the run stops as failed") in out
    assert read_metrics(run_dir / "metrics.h5")["status"] == "failed"
    assert ck.latest_complete(run_dir / "checkpoints") is None


def anonymous_bytes(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssAnon:"):
            return float(line.split()[1]) * 1024
    raise LookupError(pid)


def test_a_resumed_bundle_holds_its_replay_once(tmp_path):
    """A Gorila bundle resumed from a checkpoint with a replay of ~25 k Pong transitions
    (~180 MB) holds about the anonymous memory it held before the signal: the replay read
    from the checkpoint is dropped once copied into the live memory (kept, it would add its
    whole size for the rest of the run: 7 GB for a bundle of 1 M transitions)."""
    from tests.util import rank_pid

    run_dir = tmp_path / "run"
    common = ["--config", "configs/gorila_pong.toml", "--set", f"run_dir={run_dir}",
              "--set", "replay_capacity=60000", "--set", "replay_min_fill=60000",  # act only
              "--set", "total_frames=10000000", "--set", "log_every_s=0.5",
              "--set", "eval_every_frames=0", "--set", "final_eval_episodes=0"]
    held = []
    for start in (1, 2):
        proc = launch(common, n=2)
        try:
            floor = 100_000 if start == 1 else frames_at_signal + 1
            deadline = time.time() + 120
            while frames_in_metrics(run_dir / "metrics.h5") < floor:
                assert proc.poll() is None and time.time() < deadline, "no progress"
                time.sleep(0.2)
            held.append(anonymous_bytes(rank_pid(proc.pid, 1)))
        finally:
            proc.send_signal(stop_signal())
            out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 85, out[-3000:]
        if start == 1:
            frames_at_signal = ck.verify(run_dir / "checkpoints", 1)["frames"]
    replay_bytes = frames_at_signal // 4 * 84 * 84
    assert replay_bytes > 150e6
    assert held[1] - held[0] < 0.4 * replay_bytes, (held, replay_bytes)
