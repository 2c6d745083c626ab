"""Config parsing: types, ranges, unknown keys, overrides, the resolved TOML round trip."""

import tomllib

import pytest

from hpcrl.config import Config, ConfigError, load_config, parse_override, to_toml
from tests.util import ROOT


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_are_gorila_pong_bundled():
    cfg = load_config(None)
    assert (cfg.algo, cfg.game, cfg.mode, cfg.optimizer) == ("gorila", "pong", "bundled", "adagrad")


def test_file_and_overrides(tmp_path):
    p = write(tmp_path, 'game = "CartPole-v1"\ntotal_frames = 1000\nlearning_rate = 1\n')
    cfg = load_config(p, ["total_frames=2000", "algo=a3c", "lstm=true"])
    assert cfg.game == "CartPole-v1" and cfg.total_frames == 2000 and cfg.algo == "a3c"
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg.lstm is True


@pytest.mark.parametrize("text, fragment", [
    ("totl_frames = 5\n", "unknown key 'totl_frames'"),
    ('total_frames = "many"\n', "key 'total_frames' must be int, got str 'many'"),
    ("total_frames = 1.5\n", "key 'total_frames' must be int"),
    ("total_frames = true\n", "key 'total_frames' must be int"),
    ("gamma = 1.5\n", "key 'gamma' must be <= 1.0, got 1.5"),
    ("batch_size = 0\n", "key 'batch_size' must be >= 1, got 0"),
    ('algo = "ppo"\n', "key 'algo' must be one of gorila, one_step_q"),
    ("[env]\ngame = 'pong'\n", "key 'env' is a table"),
    ("total_frames = \n", "not valid TOML"),
    ("epsilon_end = 0.9\nepsilon_start = 0.5\n", "key 'epsilon_end' (0.9) must be <= "),
    ("malloc_mmap_threshold_kb = 64\n", "key 'malloc_mmap_threshold_kb' must be 0 (glibc's own "
     "rule) or at least 128"),
])
def test_bad_file_is_one_line_naming_file_and_key(tmp_path, text, fragment):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    msg = str(err.value)
    assert fragment in msg and msg.startswith(str(p)) and "\n" not in msg


def test_bad_override_names_the_key():
    with pytest.raises(ConfigError, match=r"^--set gamma: key 'gamma' must be <= 1.0"):
        load_config(None, ["gamma=2"])
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["gamma"])


def test_missing_file():
    with pytest.raises(ConfigError, match="nope.toml: config file not found"):
        load_config("nope.toml")


def test_parse_override_reads_toml_values_and_bare_strings():
    assert parse_override("seed=3") == ("seed", 3)
    assert parse_override("game=space_invaders") == ("game", "space_invaders")
    assert parse_override("lstm=false") == ("lstm", False)


def test_resolved_toml_round_trips(tmp_path):
    cfg = load_config(None, ["game=breakout", "seed=7", "learning_rate=0.001"])
    text = to_toml(cfg)
    assert all(line.count("#") >= 1 for line in text.splitlines()[1:])
    p = write(tmp_path, text)
    assert load_config(p) == cfg


def test_every_field_has_a_doc():
    import dataclasses
    for f in dataclasses.fields(Config):
        assert f.metadata["doc"], f.name


def test_shipped_configs_parse():
    import pathlib
    files = sorted(pathlib.Path(__file__).parent.parent.glob("configs/*.toml"))
    assert files
    for f in files:
        load_config(f)
        tomllib.loads(f.read_text())


def test_init_applies_to_every_algo():
    assert load_config(None, ["algo=a3c", "init=orthogonal"]).init == "orthogonal"
    assert load_config(None, ["init=orthogonal"]).init == "orthogonal"
    with pytest.raises(ConfigError, match="init"):
        load_config(None, ["algo=a3c", "init=xavier"])


def test_rmsprop_bias_correction_applies_to_shared_rmsprop_only():
    cfg = load_config(None, ["optimizer=rmsprop_shared", "rmsprop_bias_correction=true"])
    assert cfg.rmsprop_bias_correction
    with pytest.raises(ConfigError, match=r"^config: key 'rmsprop_bias_correction' applies to "
                                          r"optimizer 'rmsprop_shared' only \(got 'adagrad'; "):
        load_config(None, ["rmsprop_bias_correction=true"])
    with pytest.raises(ConfigError, match=r"adam_shared always corrects"):
        load_config(None, ["optimizer=adam_shared", "rmsprop_bias_correction=true"])


def test_rmsprop_initial_applies_to_rmsprop_without_bias_correction():
    path = ROOT / "configs/a3c_pong.toml"
    cfg = load_config(path, ["rmsprop_bias_correction=false", "rmsprop_initial=1"])
    assert cfg.rmsprop_initial == 1.0
    with pytest.raises(ConfigError, match=r"keys 'rmsprop_initial' and 'rmsprop_bias_correction' "
                                          r"exclude each other"):
        load_config(path, ["rmsprop_initial=1"])
    with pytest.raises(ConfigError, match=r"^config: key 'rmsprop_initial' applies to the "
                                          r"RMSProp optimizers only \(got 'adagrad'\)"):
        load_config(None, ["rmsprop_initial=1"])


@pytest.mark.parametrize("sets, message", [
    (["algo=a3c", "optimizer=rmsprop_shared", "n_step=3"], "key 'n_step' applies to algo 'gorila'"),
    (["split_update_every=4"], "key 'split_update_every' applies to Gorila's split mode"),
])
def test_keys_of_one_method_are_refused_elsewhere(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets)
    # the same keys where they apply
    load_config(None, ["adagrad_warmup_updates=10", "n_step=3", "mode=split",
                       "split_update_every=4"])
    # like momentum and rmsprop_decay, the AdaGrad key is ignored by the other rules, so a
    # config file's AdaGrad settings do not block --set optimizer=...
    load_config("configs/gorila_cartpole.toml", ["optimizer=rmsprop_shared"])


def test_optim_eps_must_be_positive():
    """0 inside AdaGrad's or RMSProp's square root divides by 0 where a statistic is 0."""
    with pytest.raises(ConfigError, match=r"^--set optim_eps: key 'optim_eps' must be > 0.0, got 0.0"):
        load_config(None, ["optim_eps=0"])
    assert load_config(None, ["optim_eps=1e-8"]).optim_eps == 1e-8
