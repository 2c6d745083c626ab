"""The entry points as users run them: bad input fails fast on every rank; dry-run; bench ps."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.util import ROOT, mpiexec_path, rank_pid, run_mpi, signal_tree, \
    start_mpi, wait_until_ranks_played, wait_until_reported


def test_dry_run_130_paper_layout():
    proc = subprocess.run([sys.executable, "-m", "hpcrl.run", "--config",
                           "configs/gorila_paper.toml", "--dry-run", "--world-size", "130"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "world size 130: 30 ps, 100 actor-learner" in out
    assert "ps             ranks 0,4,8,13,17,21,26," in out
    assert "in 30 shards of" in out and "shard  29 on rank  125" in out



def test_dry_run_without_a_world_size_says_which_option_it_needs():
    env = {k: v for k, v in os.environ.items() if k != "SLURM_NTASKS"}
    proc = subprocess.run([sys.executable, "-m", "hpcrl.run", "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("hpcrl: error: --dry-run needs --world-size N, the -n you "
                                   "will launch with (or SLURM_NTASKS inside an allocation)")
    proc = subprocess.run([sys.executable, "-m", "hpcrl.run", "--dry-run"], cwd=ROOT,
                          env=dict(env, SLURM_NTASKS="3"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "world size 3: 1 ps, 2 actor-learner" in proc.stdout


def test_without_a_config_the_default_job_runs_and_says_how_to_run_another_algorithm():
    proc = subprocess.run([sys.executable, "-m", "hpcrl.run", "--print-config"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and 'optimizer = "rmsprop_shared"' in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "hpcrl.run", "--print-config", "--set",
                           "algo=a3c"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("hpcrl: error: ") and proc.stderr.strip().endswith(
        "(without --config this is the default job, Gorila on Pong, configs/gorila_pong.toml's "
        "recipe; another algorithm starts from its own config, e.g. --config "
        "configs/a3c_pong.toml)")


def test_console_scripts_are_installed():
    bindir = Path(sys.executable).parent
    for name in ("hpcrl-run", "hpcrl-analyze", "hpcrl-play", "hpcrl-export", "hpcrl-diagnose"):
        script = bindir / name
        if not script.exists():
            pytest.skip(f"{script} missing: this environment was installed before the console "
                        "scripts existed (pip install -e . adds them)")
        proc = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (name, proc.stderr)


@pytest.mark.mpi
@pytest.mark.parametrize("args, fragment", [
    (["--set", "totl_frames=5"], "--set totl_frames: unknown key 'totl_frames'"),
    (["--set", "gamma=2"], "--set gamma: key 'gamma' must be <= 1.0, got 2"),
    (["--set", "n_ps=4"], "world size 4 cannot hold n_ps=4"),
    (["--set", "game=not_a_game"], "not_a_game"),
])
def test_bad_input_fails_on_every_rank_fast(args, fragment, tmp_path):
    proc, wall = run_mpi(4, ["-m", "hpcrl.run", *args, "--set", f"run_dir={tmp_path}/r"],
                         timeout=60)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpcrl: error:")]
    assert len(errors) == 1, proc.stderr          # printed once, by rank 0
    assert fragment in errors[0]
    assert "Traceback" not in proc.stderr
    assert wall < 30
    assert not (tmp_path / "r").exists()          # nothing written for a bad config


@pytest.mark.mpi
def test_bad_config_file_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('batch_size = "big"\n')
    proc, wall = run_mpi(3, ["-m", "hpcrl.run", "--config", str(bad)], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"hpcrl: error: {bad}: key 'batch_size' must be int, "
                                   "got str 'big'")


@pytest.mark.mpi
def test_world_size_one_is_a_layout_error():
    proc, _ = run_mpi(1, ["-m", "hpcrl.run"], timeout=60)
    assert proc.returncode == 2
    assert "world size 1 cannot hold n_ps=1" in proc.stderr


@pytest.mark.mpi
def test_bench_ps_prints_json_last_line():
    proc, _ = run_mpi(3, ["-m", "hpcrl.bench", "ps", "--floats", "200000", "--reps", "3",
                          "--idle-s", "1"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("param_floats", "pull_gbps", "push_gbps", "raw_get_gbps", "raw_accumulate_gbps",
                "pull_fraction", "push_fraction", "ps_idle_cpu_fraction"):
        assert key in result and result[key] > 0, key
    assert result["param_floats"] == 200000


@pytest.mark.mpi
@pytest.mark.parametrize("world, sets, fault_rank, role", [
    (4, [], 0, "ps"), (4, [], 2, "actor-learner"),
    # split mode, 6 ranks: ps 0, replay 1, learner 2, actors 3-5
    (6, ["--set", "mode=split", "--set", "n_learners=1"], 2, "learner"),
    (6, ["--set", "mode=split", "--set", "n_learners=1"], 4, "actor"),
])
def test_exception_on_any_rank_aborts_the_job(world, sets, fault_rank, role, tmp_path):
    proc, wall = run_mpi(world, ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
                                 "--set", f"run_dir={tmp_path}/r", *sets],
                         env={"HPCRL_FAULT_RANK": str(fault_rank)}, timeout=90)
    assert proc.returncode != 0
    assert f"hpcrl: rank {fault_rank} ({role}) on host" in proc.stderr
    assert f"RuntimeError: injected fault on rank {fault_rank}" in proc.stderr
    assert wall < 60


@pytest.mark.mpi
@pytest.mark.parametrize("hang_rank, role", [(0, "ps"), (3, "actor-learner")])
def test_watchdog_reports_a_hung_rank_and_ends_the_job(hang_rank, role, tmp_path):
    proc, wall = run_mpi(4, ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
                             "--set", f"run_dir={tmp_path}/r", "--set", "watchdog_s=4"],
                         env={"HPCRL_HANG_RANK": str(hang_rank)}, timeout=90)
    assert proc.returncode != 0
    first = [line for line in proc.stderr.splitlines() if "hpcrl: watchdog:" in line][0]
    assert f"rank {hang_rank} ({role})" in first and "made no progress" in first
    assert "time.sleep(1e9)" in proc.stderr            # where it is stuck
    assert wall < 4 + 30


@pytest.mark.mpi
def test_memory_guard_names_a_rank_whose_memory_runs_away_and_ends_the_job(tmp_path):
    """Rank 3 takes 1.5 GB after start-up (HPCRL_GROW_RANK) and keeps making progress, as a
    leaking rank does while its node swaps: its watchdog thread sees its memory over the
    pre-flight estimate + memory_guard_gb, names it with the array that holds the memory, and
    the job ends within seconds. A run of the same job without the growth finishes under the
    same tight bound (the estimate covers a real rank)."""
    sets = ["--set", "memory_guard_gb=0.5", "--set", "final_eval_episodes=0"]
    proc, wall = run_mpi(4, ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
                             "--set", f"run_dir={tmp_path}/r", "--set", "total_frames=10000000",
                             *sets], env={"HPCRL_GROW_RANK": "3:1.5"}, timeout=90)
    assert proc.returncode != 0
    first = [line for line in proc.stderr.splitlines() if "hpcrl: memory guard:" in line][0]
    assert "rank 3 (actor-learner)" in first and "over its bound of" in first
    assert "ndarray uint8 (1500000000,)" in proc.stderr       # the largest array it holds
    assert wall < 40
    proc, _ = run_mpi(4, ["-m", "hpcrl.run", "--config", "configs/gorila_cartpole.toml",
                          "--set", f"run_dir={tmp_path}/ok", "--set", "total_frames=20000",
                          *sets], timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "memory guard" not in proc.stderr


@pytest.mark.mpi
def test_a_frozen_rank_during_a_checkpoint_is_named(tmp_path):
    """Rank 2 (an actor-learner) is stopped, then rank 0 is asked for a checkpoint (SIGUSR2):
    rank 0 names rank 2, not the ranks that wait for it, and the job ends within watchdog_s."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcrl.run", "--config",
           "configs/a3c_cartpole.toml", "--set", f"run_dir={tmp_path}/r", "--set",
           "total_frames=100000000", "--set", "watchdog_s=10", "--set", "log_every_s=0.5"]
    job = start_mpi(cmd, env, tmp_path / "err.log", tmp_path / "out.log")
    try:
        wait_until_ranks_played(job, tmp_path / "r", {1, 2})
        os.kill(rank_pid(job.pid, 2), signal.SIGSTOP)
        t0 = time.monotonic()
        os.kill(rank_pid(job.pid, 0), signal.SIGUSR2)        # a checkpoint, on demand
        job.wait(timeout=60)
        wall = time.monotonic() - t0
    finally:
        signal_tree(job.pid, signal.SIGKILL)
        job.wait()
    stderr = (tmp_path / "err.log").read_text()
    assert job.returncode != 0
    first = [line for line in stderr.splitlines() if line.startswith("hpcrl:")][0]
    assert "checkpoint generation 1: waited 8 s for ranks that did not arrive: rank 2 " \
        "(actor-learner) on host" in first, stderr
    assert "rank 1" not in first
    assert wall < 10 + 5


@pytest.mark.mpi
def test_a_frozen_parameter_server_is_named_by_its_clients(tmp_path):
    """With 2 ps ranks, the one that is not rank 0 is stopped: the clients, whose pushes it no
    longer takes, name it (not themselves) and the job ends within watchdog_s + 10 s."""
    from hpcrl.config import load_config
    from hpcrl.runtime.topology import make_layout

    sets = ["--set", "n_ps=2", "--set", "watchdog_s=10"]
    layout = make_layout(4, load_config("configs/a3c_cartpole.toml", ["n_ps=2"]))
    frozen = [r for r in layout.ps_ranks if r != 0][0]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [mpiexec_path(), "-n", "4", sys.executable, "-m", "hpcrl.run", "--config",
           "configs/a3c_cartpole.toml", "--set", f"run_dir={tmp_path}/r", "--set",
           "total_frames=100000000", "--set", "log_every_s=0.5", *sets]
    job = start_mpi(cmd, env, tmp_path / "err.log")
    try:
        wait_until_reported(job, tmp_path / "r")
        os.kill(rank_pid(job.pid, frozen), signal.SIGSTOP)
        t0 = time.monotonic()
        job.wait(timeout=60)
        wall = time.monotonic() - t0
    finally:
        signal_tree(job.pid, signal.SIGKILL)
        job.wait()
    stderr = (tmp_path / "err.log").read_text()
    assert job.returncode != 0
    assert f"PeerStalled: rank {frozen} (ps, shard 1) has not taken rank " in stderr, stderr
    assert "hpcrl: watchdog" not in stderr.split("PeerStalled")[0]     # named first
    assert wall < 10 + 10 + 8                          # watchdog_s + the grace, + start of abort


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name: state, ppid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped counts as gone)."""
    try:
        return _stat(pid)[0] == "Z"
    except OSError:
        return True


@pytest.mark.mpi
def test_ranks_end_within_seconds_when_their_launcher_is_killed(tmp_path):
    """The ranks' parent (hydra's proxy, Open MPI's prterun) is SIGKILLed mid-run: nothing is
    left to kill them, yet every rank is gone within 10 s, not running its 1e8-frame budget."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcrl.run", "--config",
           "configs/a3c_cartpole.toml", "--set", f"run_dir={tmp_path}/r", "--set",
           "total_frames=100000000", "--set", "log_every_s=0.5"]
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    ranks = []
    try:
        wait_until_reported(job, tmp_path / "r")
        ranks = [rank_pid(job.pid, r) for r in range(3)]
        launchers = {int(_stat(p)[1]) for p in ranks}
        assert len(launchers) == 1 and job.pid not in ranks
        os.kill(launchers.pop(), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = [p for p in ranks if not _gone(p)]
    finally:
        signal_tree(job.pid, signal.SIGKILL)
        for p in ranks:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.wait()
    assert not alive, f"ranks still running 10 s after their launcher was killed: {alive}"


@pytest.mark.mpi
def test_checkpoint_on_demand_through_a_request_file(tmp_path):
    """`touch <run_dir>/checkpoint.request` writes a generation within seconds; the run goes on."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run_dir = tmp_path / "r"
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcrl.run", "--config",
           "configs/a3c_cartpole.toml", "--set", f"run_dir={run_dir}", "--set",
           "total_frames=100000000", "--set", "log_every_s=0.5"]
    job = start_mpi(cmd, env, tmp_path / "out.log", tmp_path / "out.log")
    try:
        wait_until_ranks_played(job, run_dir, {1, 2})
        assert not list(run_dir.glob("checkpoints/gen-*"))
        (run_dir / "checkpoint.request").touch()
        deadline = time.monotonic() + 15
        while not (run_dir / "checkpoints" / "gen-000001" / "MANIFEST.json").exists():
            assert job.poll() is None and time.monotonic() < deadline, "no generation written"
            time.sleep(0.2)
        time.sleep(1.0)
        assert job.poll() is None                                  # the run goes on
        assert not (run_dir / "checkpoint.request").exists()
    finally:
        signal_tree(job.pid, signal.SIGKILL)
        job.wait()
    assert "checkpoint requested through checkpoint.request" in (tmp_path / "out.log").read_text()


def test_print_config_reads_back_as_the_same_config(tmp_path):
    from hpcrl.config import load_config

    proc = subprocess.run([sys.executable, "-m", "hpcrl.run", "--print-config", "--config",
                           "configs/a3c_pong.toml", "--set", "seed=7", "--set", "t_max=20"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "t_max = 20  # rollout length in agent steps" in proc.stdout
    (tmp_path / "c.toml").write_text(proc.stdout)
    assert load_config(tmp_path / "c.toml") == load_config("configs/a3c_pong.toml",
                                                           ["seed=7", "t_max=20"])


def test_help_lists_config_keys_and_exit_codes():
    proc = subprocess.run([sys.executable, "-m", "hpcrl.run", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "85 checkpointed on SIGUSR1/SIGTERM" in proc.stdout.replace("\n", " ")
    assert "  learning_rate = " in proc.stdout and "  run_dir_lease_s = 300.0: " in proc.stdout


@pytest.mark.mpi
def test_runs_record_their_provenance(tmp_path):
    from hpcrl.io import checkpoint as ck
    from hpcrl.io.metrics import read_metrics

    proc, _ = run_mpi(3, ["-m", "hpcrl.run", "--config", "configs/a3c_cartpole.toml", "--set",
                          f"run_dir={tmp_path}/r", "--set", "total_frames=500"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import socket

    attrs = read_metrics(tmp_path / "r" / "metrics.h5")["attrs"]
    origin = json.loads(attrs["provenance"])
    manifest = ck.latest_complete(tmp_path / "r" / "checkpoints")[1]
    assert manifest["provenance"] == origin
    assert set(origin["versions"]) == {"hpcrl", "torch", "numpy", "ale-py", "gymnasium",
                                       "mpi4py", "h5py"}
    assert all(origin["versions"].values()) and origin["mpi_library"]
    assert origin["hosts"] == [socket.gethostname()] and origin["world_size"] == 3
    assert len(origin["git_commit"]) == 40 and isinstance(origin["git_dirty"], bool)


@pytest.mark.parametrize("what, args, keys", [
    ("actor", ["--steps", "20", "--blocks", "1"],
     ("bound_steps_per_s", "actor_steps_per_s", "fraction", "fraction_sync1")),
    ("learner", ["--updates", "3", "--blocks", "1", "--fill", "600"],
     ("learner_updates_per_s", "torch_updates_per_s", "fraction", "bytes_per_transition")),
])
def test_bench_actor_and_learner_print_json(what, args, keys):
    proc = subprocess.run([sys.executable, "-m", "hpcrl.bench", what, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == what and all(result[k] > 0 for k in keys)
    if what == "learner":
        assert result["bytes_per_transition"] < 7300      # 84x84 frames stored once


@pytest.mark.parametrize("algo,name,reference,variants", [
    ("a3c", "gradient", "bootstrap_in_batch", ("learner", "bootstrap_apart", "bfloat16_torso")),
    ("n_step_q", "gradient_n_step_q", "all_states_nchw", ("learner",))])
def test_bench_gradient_prints_its_ratios(algo, name, reference, variants):
    proc = subprocess.run([sys.executable, "-m", "hpcrl.bench", "gradient", "--algo", algo,
                           "--blocks", "2", "--reps", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == name and result["states"] == 40       # 5 steps x 8 envs
    ref = float(np.median(result["runs_ms"][reference]))
    for k in variants:
        assert result[f"{k}_ms"] == pytest.approx(np.median(result["runs_ms"][k]), abs=0.01)
        assert result[f"{k}_over_reference"] == pytest.approx(result[f"{k}_ms"] / ref, abs=2e-3)
    for ratio, num, den in (("reuse_over_rerun", "act_reuse", "act_rerun"),
                            ("per_channel_over_layout_change", "input_per_channel",
                             "input_layout_change"),
                            ("learner_over_per_channel", "input_learner", "input_per_channel")):
        assert result[ratio] == pytest.approx(result[f"{num}_ms"] / result[f"{den}_ms"],
                                              abs=2e-3)


def test_bench_gradient_a3c_lstm_prints_its_ratio():
    proc = subprocess.run([sys.executable, "-m", "hpcrl.bench", "gradient", "--algo", "a3c_lstm",
                           "--blocks", "2", "--reps", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "gradient_a3c_lstm" and result["states"] == 5  # 5 steps x 1 env
    for k in ("learner", "step_by_step", "act"):
        assert result[f"{k}_ms"] == pytest.approx(np.median(result["runs_ms"][k]), abs=0.01)
    assert result["learner_over_reference"] == pytest.approx(
        result["learner_ms"] / result["step_by_step_ms"], abs=2e-3)


def test_bench_env_prints_its_ratios():
    proc = subprocess.run([sys.executable, "-m", "hpcrl.bench", "env", "--envs", "2",
                           "--steps", "5", "--blocks", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "env" and result["envs"] == 2
    assert result["resize_c_over_pil"] == pytest.approx(
        result["resize_c_ms"] / result["resize_pil_ms"], rel=1e-9)
    assert result["step_c_over_pil"] == pytest.approx(
        result["step_c_ms_per_agent_step"] / result["step_pil_ms_per_agent_step"], rel=1e-9)
    assert result["step_c_over_emulator"] == pytest.approx(
        result["step_c_ms_per_agent_step"] / result["emulator_ms_per_agent_step"], rel=1e-9)
    assert result["emulator_ms_per_agent_step"] > 0


def test_raw_fraction_ceiling_by_hand():
    """40,000 emulator frames/s on 2 cores is 20,000 a core: 4 frames cost 0.2 ms; with 0.3 ms
    of network per agent step, emulation is 0.2 of 0.5 ms of it."""
    from hpcrl.bench.raw import raw_fraction_ceiling

    assert raw_fraction_ceiling(40_000, 2, 4, 0.3) == pytest.approx(0.4, rel=1e-12)
    assert raw_fraction_ceiling(40_000, 2, 4, 0.0) == pytest.approx(1.0, rel=1e-12)
    assert raw_fraction_ceiling(20_000, 1, 4, 0.2) == pytest.approx(0.5, rel=1e-12)


@pytest.mark.mpi
def test_bench_scaling_prints_json():
    """A short `bench scaling` (two real A3C Pong jobs of a few seconds each): the JSON contract
    that the README's figures come from. Speed itself is the benchmark's business, not a test's."""
    proc = subprocess.run([sys.executable, "-m", "hpcrl.bench", "scaling", "--algo", "a3c",
                           "--seconds", "2", "--warmup", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "scaling" and len(result["offline_bound_blocks_steps_per_s"]) == 4
    assert result["frames_per_s_1"] > 0 and result["frames_per_s_2"] > 0
    runs = result["frames_per_s_1_runs"]                    # jobs in the order 1, 2, 1
    assert len(runs) == 2 and result["frames_per_s_1"] == pytest.approx(np.mean(runs), rel=1e-3)
    assert result["speedup"] == pytest.approx(result["frames_per_s_2"] / result["frames_per_s_1"])
    assert result["fraction"] == pytest.approx(np.mean(result["fraction_runs"]), rel=1e-3)
    assert 0 < result["fraction"] < 1 and len(result["fraction_2"]) == 2    # in-process phases
    assert set(result["phase_ms_per_step_2"]) == {"env", "forward", "learn"}
    # one ps per job: a share of one core, and CPU per gradient it applied
    assert len(result["ps_cpu_fraction_1"]) == 2 and len(result["ps_cpu_fraction_2"]) == 1
    assert all(0 < f < 1 for f in result["ps_cpu_fraction_1"] + result["ps_cpu_fraction_2"])
    assert result["ps_cpu_ms_per_gradient_2"][0] > 0
    assert set(result["phase_ms_per_step"]) == {"env", "forward", "learn"}
    # the raw bound, timed 4 times around the 3 jobs: the 2-actor-learner job over its median
    assert len(result["raw_frames_per_s_runs"]) == 4 and result["raw_frames_per_s"] > 0
    assert result["raw_fraction"] == pytest.approx(
        result["frames_per_s_2"] / np.median(result["raw_frames_per_s_runs"]), rel=1e-3)
    assert result["raw_fraction_1"] == pytest.approx(
        result["frames_per_s_1"] / result["raw_frames_per_s"])
    assert 0 < result["raw_fraction"] < 1
