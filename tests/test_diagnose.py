"""python -m hpcrl.diagnose: the share of each tensor whose ps optimiser statistic is 0, read from
a real checkpoint generation (HDF5 rank files + manifest, as the runs write them)."""

import json

import numpy as np
import pytest

from hpcrl.io import checkpoint as ckpt
from hpcrl.config import load_config, to_toml
from hpcrl.tools.diagnose import DiagnoseError, main, zero_fractions

# configs/a3c_cartpole.toml with 4 hidden units: tensors in the flat vector's order
TENSORS = [("torso.0.weight", 16), ("torso.0.bias", 4), ("torso.2.weight", 16),
           ("torso.2.bias", 4), ("policy_head.weight", 8), ("policy_head.bias", 2),
           ("value_head.weight", 4), ("value_head.bias", 1)]
N = sum(size for _, size in TENSORS)  # 55


def test_zero_fractions_by_hand():
    rows = zero_fractions([("a", 3), ("b", 2)], np.array([0, 1e-30, 0, 0, 0], np.float32))
    assert [(r["name"], r["size"], r["zero"]) for r in rows] == [
        ("a", 3, 2), ("b", 2, 2), ("all", 5, 4)]
    assert rows[0]["fraction"] == pytest.approx(2 / 3) and rows[2]["fraction"] == 0.8


def test_adaptive_share_against_eps_by_hand():
    # eps 0.01: statistics 0, 1e-4, 0.04, 1 -> two of four above eps; median of [0, 1e-4]
    # is 5e-5 (sqrt 7.07e-3), of [0.04, 1] is 0.52 (sqrt 0.721)
    rows = zero_fractions([("a", 2), ("b", 2)], np.array([0, 1e-4, 0.04, 1.0]), eps=0.01)
    assert [r["above_eps"] for r in rows] == [0.0, 1.0, 0.5]
    assert rows[0]["median_sqrt_stat"] == pytest.approx(5e-5 ** 0.5)
    assert rows[1]["median_sqrt_stat"] == pytest.approx(0.52 ** 0.5)


def test_per_client_statistics_count_only_when_zero_for_every_client():
    stat = np.array([[0, 1, 0, 0], [0, 0, 2, 0]], np.float32)   # [n_clients, n]
    (row, total) = zero_fractions([("w", 4)], stat)
    assert row["zero"] == 2 and total["zero"] == 2                # columns 0 and 3


def test_size_mismatch_is_an_error():
    with pytest.raises(DiagnoseError, match="3 statistics but the network has 4"):
        zero_fractions([("w", 4)], np.zeros(3, np.float32))


def _write_run(tmp_path, stat_name="v", n_ps=2, corrupt=False, corrupt_actor=False,
               counts=None, sets=(), g0=None, also_v=False):
    """A run directory with config.toml and one complete checkpoint generation: n_ps ps shards
    of the 55-float statistic (zeros: all of torso.0.bias, 8 of torso.2.weight's 16) and one
    actor-learner file."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config("configs/a3c_cartpole.toml", ["mlp_hidden=4", *sets])
    (run / "config.toml").write_text(to_toml(cfg))
    stat = np.ones(N, np.float32)
    stat[16:20] = 0.0                    # torso.0.bias: every unit of the first layer dead
    stat[20:28] = 0.0                    # half of torso.2.weight
    root = run / "checkpoints"
    files = []
    for i, part in enumerate(np.array_split(stat, n_ps)):
        state = {"params": np.zeros_like(part), f"opt/{stat_name}": part}
        if counts is not None:                  # AdaGrad's update count per shard
            state["opt/n"] = np.int64(counts[i])
        if also_v:              # adagrad_rmsprop_updates: RMSProp's statistic, all alive
            state["opt/v"] = np.ones_like(part)
        if g0 is not None:      # AdaGrad's warm start: per parameter, or one number per shard
            shard_g0 = g0[i] if np.ndim(g0[i]) else np.float64(g0[i])
            state["opt/G0"] = shard_g0
            state[f"opt/{stat_name}"] = part.astype(np.float64) + shard_g0
        files.append(ckpt.write_state(ckpt.rank_file(root, 1, i), state))
    files.append(ckpt.write_state(ckpt.rank_file(root, 1, n_ps), {"rng": np.zeros(2)}))
    if corrupt:
        ckpt.rank_file(root, 1, 0).write_bytes(b"not hdf5")
    if corrupt_actor:                    # same size, other bytes: only a hash would notice
        path = ckpt.rank_file(root, 1, n_ps)
        path.write_bytes(bytes(len(path.read_bytes())))
    ckpt.write_manifest(root, 1, files, {"roles": ["ps"] * n_ps + ["actor-learner"],
                                         "frames": 12345, "n_params": N})
    return run


def test_cli_reports_each_tensor_of_a_checkpoint(tmp_path, capsys):
    run = _write_run(tmp_path)
    assert main([str(run), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["generation"], report["frames"], report["statistic"]) == (1, 12345, "v")
    zero = {r["name"]: r["zero"] for r in report["tensors"]}
    assert zero == {"torso.0.bias": 4, "torso.2.weight": 8, "all": 12,
                    **{name: 0 for name, _ in TENSORS if name not in ("torso.0.bias",
                                                                     "torso.2.weight")}}
    assert main([str(run)]) == 0
    text = capsys.readouterr().out
    assert "torso.0.bias" in text and "100.0 %" in text and " 21.8 %" in text   # 12 / 55


def test_cli_on_an_adagrad_checkpoint_with_one_shard(tmp_path, capsys):
    assert main([str(_write_run(tmp_path, stat_name="G", n_ps=1)), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["statistic"] == "G" and report["tensors"][-1]["zero"] == 12
    # a3c_cartpole.toml's optim_eps (1e-5) against statistics of 1 (43 of 55) and 0 (12)
    assert report["optim_eps"] == 1e-5 and report["tensors"][-1]["above_eps"] == 43 / 55
    assert main([str(tmp_path / "run")]) == 0
    assert "statistic G is 0 (never a gradient;" in capsys.readouterr().out


def test_adagrad_rms_gradient_per_update_by_hand(tmp_path, capsys):
    """sqrt(G / (t0 + n)) per tensor, n from each shard: 55 statistics split 28 | 27 over two
    shards that applied 3 and 7 updates, t0 = 4. G = 1 except the 12 zeros in shard 0, so
    G / (t0 + n) is 1/7 on shard 0's 16 live values and 1/11 on shard 1's 27: the median of
    all 55 (12 zeros, 27 x 1/11, 16 x 1/7) is the 28th value, 1/11."""
    run = _write_run(tmp_path, stat_name="G", counts=[3, 7],
                     sets=["optimizer=adagrad", "adagrad_warmup_updates=4"])
    assert main([str(run), "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows["torso.0.weight"]["median_rms_grad"] == pytest.approx(7 ** -0.5)
    assert rows["value_head.bias"]["median_rms_grad"] == pytest.approx(11 ** -0.5)
    assert rows["all"]["median_rms_grad"] == pytest.approx(11 ** -0.5)
    assert main([str(run)]) == 0
    assert "median rms gradient per update" in capsys.readouterr().out


def test_adagrad_warm_start_per_shard_is_taken_off_by_hand(tmp_path, capsys):
    """Older checkpoints: one warm start per shard.

    Shards with warm starts G0 = 0.5 and 2.0, 3 and 7 updates, own G = 1 except the 12
    zeros of shard 0: the 12 are still "never a gradient"; own G / n is 1/3 on shard 0's 16
    live values and 1/7 on shard 1's 27 (median of all 55: 1/7); own G passes G0 + eps on
    shard 0 only (16 of 55)."""
    run = _write_run(tmp_path, stat_name="G", counts=[3, 7], g0=[0.5, 2.0],
                     sets=["optimizer=adagrad", "adagrad_warmup_updates=4"])
    assert main([str(run), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in report["tensors"]}
    assert report["warm_start"] is True
    assert rows["all"]["zero"] == 12 and rows["torso.0.bias"]["zero"] == 4
    assert rows["all"]["median_rms_grad"] == pytest.approx(7 ** -0.5)
    assert rows["torso.0.weight"]["median_rms_grad"] == pytest.approx(3 ** -0.5)
    assert rows["all"]["above_eps"] == pytest.approx(16 / 55)
    assert main([str(run)]) == 0
    text = capsys.readouterr().out
    assert "AdaGrad warm start G0" in text and "median sqrt(G0 + eps)" in text


def test_adagrad_warm_start_per_parameter_by_hand(tmp_path, capsys):
    """G0 per parameter, as the ps sets it (per tensor): 0.25 on torso.0.weight (the first 16
    floats), 4 elsewhere; own G = 1 except the 12 zeros; 5 updates on both shards. Own G
    passes G0 + eps (1e-5) on torso.0.weight only: 16 of 55; its floor's median sqrt is
    sqrt(0.25001), the others' sqrt(4.00001); own G / n = 0.2 on every live parameter."""
    g0 = np.full(N, 4.0, np.float32)
    g0[:16] = 0.25
    run = _write_run(tmp_path, stat_name="G", counts=[5, 5], g0=np.array_split(g0, 2),
                     sets=["optimizer=adagrad", "adagrad_warmup_updates=4"])
    assert main([str(run), "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows["all"]["above_eps"] == pytest.approx(16 / 55)
    assert rows["torso.0.weight"]["above_eps"] == 1.0 and rows["torso.2.bias"]["above_eps"] == 0
    assert rows["torso.0.weight"]["median_sqrt_floor"] == pytest.approx(0.25001 ** 0.5)
    assert rows["value_head.bias"]["median_sqrt_floor"] == pytest.approx(4.00001 ** 0.5)
    assert rows["torso.2.bias"]["median_rms_grad"] == pytest.approx(0.2 ** 0.5)
    assert rows["torso.0.bias"]["zero"] == 4


@pytest.mark.parametrize("counts, statistic, zero", [([0, 0], "v", 0), ([0, 3], "G", 12)])
def test_adagrad_after_rmsprop_steps_reads_v_until_the_first_adagrad_update(
        tmp_path, capsys, counts, statistic, zero):
    """adagrad_rmsprop_updates: a checkpoint holds RMSProp's v (here all alive) and AdaGrad's
    G (12 zeros). Before any shard's first AdaGrad update (n = 0 on all) G says nothing and
    diagnose reads v; after it, G."""
    run = _write_run(tmp_path, stat_name="G", counts=counts, also_v=True,
                     sets=["optimizer=adagrad", "adagrad_warmup_updates=4",
                           "adagrad_rmsprop_updates=10"])
    assert main([str(run), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["statistic"] == statistic and report["tensors"][-1]["zero"] == zero


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "not a run directory (no config.toml)"),
    (lambda p: _write_run(p, stat_name="m"), "keeps no per-parameter statistic"),
    (lambda p: _write_run(p, corrupt=True), "no complete checkpoint generation"),
])
def test_bad_run_directories_get_one_line_and_exit_1(tmp_path, capsys, make, message):
    assert main([str(make(tmp_path))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("hpcrl.diagnose: ")


def test_only_the_ps_files_are_verified(tmp_path, capsys):
    """The offline tools read the ps files only, so they hash only those: a damaged actor file
    (a Gorila generation's replay memories are gigabytes) neither blocks nor slows them."""
    assert main([str(_write_run(tmp_path, corrupt_actor=True)), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["generation"] == 1
