"""python -m hpcrl.diagnose RUN --probe: the checkpoint's network played on the run's real game
(CartPole here), its ReLU units off and its LSTM cell's saturation, with weights chosen so that
every figure is known by hand."""

import json

import numpy as np
import pytest
import torch

from hpcrl.config import load_config, to_toml
from hpcrl.envs import env_spec
from hpcrl.io import checkpoint as ckpt
from hpcrl.rl.networks import build_network
from hpcrl.runtime.params.layout import ParamLayout
from hpcrl.tools.diagnose import main
from hpcrl.tools.probe import cell_saturation, units_off


def test_units_off_and_cell_saturation_by_hand():
    assert units_off(np.array([True, False, False, True])) == 0.5
    c = np.array([[0.5, -3.0], [2.5, 1.0]])
    f = np.array([[0.9, 0.99], [0.5, 0.96]])
    s = cell_saturation(c, f)
    assert s["c_rms"] == pytest.approx(np.sqrt((0.25 + 9 + 6.25 + 1) / 4))
    assert (s["c_max"], s["c_saturated"]) == (3.0, 0.5)
    assert s["forget_mean"] == pytest.approx(0.8375) and s["forget_open"] == 0.5


def _run_dir(tmp_path, lstm: bool, layer_norm: bool = False, statistic: str = "opt/v"):
    """A3C CartPole run directory whose one checkpoint holds weights set by hand: every torso
    weight and bias 0 (each ReLU's input is 0: no unit ever active); for the LSTM, zero
    weights, input, forget and cell gates saturated open (biases 30: sigmoid = tanh = 1 in
    float32) and the output gate at 0.5, so c counts the steps: c_t = c_(t-1) + 1."""
    sets = ["mlp_hidden=4"] + (["lstm=true", "lstm_init=orthogonal"] if lstm else []) + (
        ["lstm_layer_norm=true"] if layer_norm else [])
    cfg = load_config("configs/a3c_cartpole.toml", sets)
    net = build_network(cfg, *env_spec(cfg))
    with torch.no_grad():
        for p in net.torso.parameters():
            p.zero_()
        if lstm:
            n = net.lstm.hidden_size
            for p in net.lstm.parameters():
                p.zero_()
            net.lstm.bias_ih[:3 * n] = 30.0
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(cfg))
    flat = ParamLayout.from_module(net).to_flat(net)
    root = run / "checkpoints"
    files = [ckpt.write_state(ckpt.rank_file(root, 1, 0),
                              {"params": flat, statistic: np.ones_like(flat)}),
             ckpt.write_state(ckpt.rank_file(root, 1, 1), {"rng": np.zeros(2)})]
    ckpt.write_manifest(root, 1, files, {"roles": ["ps", "actor-learner"], "frames": 777,
                                         "n_params": flat.size})
    return run


def test_probe_finds_every_unit_off_in_a_zeroed_torso(tmp_path, capsys):
    run = _run_dir(tmp_path, lstm=False)
    assert main([str(run), "--probe", "20", "--probe-envs", "3", "--format", "json"]) == 0
    probe = json.loads(capsys.readouterr().out)["probe"]
    assert probe["units_off"] == {"torso.0": 1.0, "torso.2": 1.0}
    assert (probe["frames"], probe["agent_steps"], probe["envs"]) == (777, 20, 3)
    assert "lstm" not in probe
    assert main([str(run), "--probe", "20"]) == 0
    assert "    torso.2    100.0 %" in capsys.readouterr().out


def test_probe_runs_where_the_ps_keeps_no_statistic(tmp_path, capsys):
    """SGD with momentum at the ps keeps m, not RMSProp's v: the statistics table cannot be
    made, the probe still runs (and says why the table is missing)."""
    run = _run_dir(tmp_path, lstm=False, statistic="opt/m")
    assert main([str(run)]) == 1
    assert "keeps no per-parameter statistic" in capsys.readouterr().err
    assert main([str(run), "--probe", "20", "--probe-envs", "3", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["probe"]["units_off"] == {"torso.0": 1.0, "torso.2": 1.0}
    assert "the probe follows" in err


def test_probe_of_an_lstm_whose_cell_counts_the_steps(tmp_path, capsys):
    """6 agent steps (no CartPole episode ends sooner, so no state is zeroed): c = 1, ..., 6
    in every cell, |c| > 2 on 4 steps of 6, every forget gate 1."""
    run = _run_dir(tmp_path, lstm=True)
    assert main([str(run), "--probe", "6", "--probe-envs", "2", "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["probe"]["lstm"]
    assert s["c_rms"] == pytest.approx(np.sqrt(91 / 6), rel=1e-6)
    assert (s["c_max"], s["c_saturated"], s["forget_mean"], s["forget_open"]) == \
        (6.0, pytest.approx(4 / 6), 1.0, 1.0)
    assert main([str(run), "--probe", "6"]) == 0
    assert "LSTM cell state over every step: |c| rms 3.89, max 6.0; 66.7 % with tanh's" in \
        capsys.readouterr().out


def test_probe_of_a_layer_normalised_cell_reads_what_its_tanh_sees(tmp_path, capsys):
    """The same counting cell, layer-normalised (LN gains 1, biases 0, zero weights: every gate
    is its bias as above): c = 1, ..., 6 again, but all cells of a row are equal, so LN(c) = 0
    and no tanh is saturated."""
    run = _run_dir(tmp_path, lstm=True, layer_norm=True)
    assert main([str(run), "--probe", "6", "--probe-envs", "2", "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)["probe"]["lstm"]
    assert s["c_rms"] == pytest.approx(np.sqrt(91 / 6), rel=1e-6)
    assert (s["c_saturated"], s["forget_open"]) == (0.0, 1.0)


def test_probe_needs_a_positive_count(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--probe", "-1"])
    assert "--probe takes agent steps" in capsys.readouterr().err
