"""The learning records a run prints at start (hpcrl/data/learning_records.toml): every config
and evidence file they name exists, and the line says what the record is and when a run's
settings leave the recorded recipe."""

from __future__ import annotations

import re

import pytest

from hpcrl.config import default_job_path, load_config
from hpcrl.games import resolve_game_id
from hpcrl.learning_records import DEFAULT_JOB_RECIPE, changed_recipe, load_records, record_line
from hpcrl.runtime.topology import Role, make_layout
from tests.util import ROOT


def test_every_record_names_a_shipped_config_its_game_and_existing_evidence():
    records = load_records()
    assert records, "no records"
    for name, games in records.items():
        path = None if name == "default" else ROOT / "configs" / f"{name}.toml"
        assert path is None or path.is_file(), name
        for game, entry in games.items():
            assert set(entry) == {"validated", "record", "evidence"}, (name, game)
            assert resolve_game_id(game) == (resolve_game_id(game)[0], game), (name, game)
            assert (ROOT / entry["evidence"]).is_file(), (name, entry["evidence"])
            # the config's own game, or another of its kind run with --set game=...
            # (a3c_mujoco.toml: InvertedPendulum-v5, Hopper-v5, ...)
            assert resolve_game_id(load_config(path).game)[0] == resolve_game_id(game)[0], \
                (name, game)


def test_a_config_run_on_another_game_reads_that_games_record():
    path = ROOT / "configs/a3c_mujoco.toml"
    line = record_line(path, load_config(path, ["game=Hopper-v5"]), "Hopper-v5")
    assert line.startswith("note: a3c_mujoco.toml on Hopper-v5 is not validated yet: ")
    assert "this run changes" not in line
    line = record_line(path, load_config(path, ["game=Ant-v5"]), "Ant-v5")
    assert line.startswith("note: a3c_mujoco.toml on Ant-v5 has no learning record")


def test_the_start_line():
    path = ROOT / "configs/a3c_cartpole.toml"
    line = record_line(path, load_config(path, ["seed=9", "total_frames=5"]), "CartPole-v1")
    assert line.startswith("a3c_cartpole.toml on CartPole-v1 learns: CI learning gate") and \
        line.endswith("(tests/test_async_learning.py)")
    line = record_line(path, load_config(path, ["learning_rate=0.1", "t_max=3"]), "CartPole-v1")
    assert line.endswith("; this run changes learning_rate, t_max, for which the record may "
                         "not hold")
    other = ROOT / "configs/gorila_global_replay.toml"
    assert record_line(other, load_config(other), "pong") == (
        "note: gorila_global_replay.toml on pong has no learning record: nothing yet shows "
        "that it learns (README, Paper settings)")
    paper = ROOT / "configs/gorila_paper.toml"
    assert record_line(paper, load_config(paper), "pong").startswith(
        "gorila_paper.toml on pong learns: validated at 1 ps + 2 bundles, the paper's 130-rank "
        "layout not run to a result: its update rule is gorila_pong's")
    assert record_line(None, load_config(default_job_path()), "alien").startswith(
        "note: the default job (gorila_pong.toml's recipe) on alien has no learning record")
    line = record_line(None, load_config(default_job_path(), ["seed=3", "n_step=1"]), "pong")
    assert line.startswith("the default job (gorila_pong.toml's recipe) on pong learns: ") and \
        line.endswith("this run changes n_step, for which the record may not hold")
    line = record_line(ROOT / "configs/a3c_pong.toml", load_config(ROOT / "configs/a3c_pong.toml"),
                       "pong")
    assert line.startswith("note: a3c_pong.toml on pong is not validated yet: ")
    line = record_line(ROOT / "configs/a3c_paper.toml", load_config(ROOT / "configs/a3c_paper.toml"),
                       "pong")
    assert line.startswith("a3c_paper.toml on pong learns: +18 within 24 M frames on 2 of 2 seeds")


def test_settings_outside_the_recipe_are_not_named():
    path = ROOT / "configs/a3c_pong.toml"
    cfg = load_config(path, ["seed=4", "run_dir=/tmp/x", "eval_every_frames=1000",
                             "checkpoint_every_min=1", "early_stop=true"])
    assert changed_recipe(path, cfg) == []


def test_the_default_job_is_the_recorded_gorila_pong_recipe_value_for_value():
    """Runs of either count for both, so the two files must not drift apart; and the default
    job is not the field defaults (the paper's AdaGrad, which has not learned Pong)."""
    job = load_config(default_job_path())
    assert job == load_config(ROOT / "configs" / f"{DEFAULT_JOB_RECIPE}.toml")
    assert job != load_config(None) and job.optimizer == "rmsprop_shared"
    assert load_records()[DEFAULT_JOB_RECIPE]["pong"]["validated"]


@pytest.mark.parametrize("world, n_ps, n_bundles", [(3, 1, 2), (4, 1, 3), (130, 30, 100)])
def test_the_default_job_layout_follows_the_world_size(world, n_ps, n_bundles):
    """-n 3 is the 2-core node's layout, -n 130 the paper's 30 ps + 100 bundles."""
    roles = make_layout(world, load_config(default_job_path())).roles
    assert roles.count(Role.PS) == n_ps and roles.count(Role.ACTOR_LEARNER) == n_bundles == \
        len(roles) - n_ps


def test_the_gorila_paper_record_carries_the_gorila_pong_record_of_its_rule():
    records = load_records()
    assert records["gorila_pong"]["pong"]["record"] in records["gorila_paper"]["pong"]["record"]


def test_the_gorila_paper_config_runs_the_recorded_rule_at_the_paper_layout():
    """gorila_paper.toml is validated through gorila_pong's runs at a reduced layout: the two
    may differ only in the layout and the per-bundle sizes its header states."""
    paper = load_config(ROOT / "configs/gorila_paper.toml")
    pong = load_config(ROOT / "configs/gorila_pong.toml")
    differ = {name for name in vars(paper) if getattr(paper, name) != getattr(pong, name)}
    assert differ == {"n_ps", "total_frames", "replay_capacity", "replay_min_fill",
                      "eval_every_frames"}
    roles = make_layout(130, paper).roles
    assert roles.count(Role.PS) == 30 and roles.count(Role.ACTOR_LEARNER) == 100


def _array_config(script: str) -> str:
    text = (ROOT / "slurm" / script).read_text()
    return re.search(r"HPCRL_DEFAULT_CONFIG=configs/(\w+)\.toml", text).group(1)


@pytest.mark.parametrize("script, game", [
    ("a3c_57games.sh", "pong"), ("gorila_49games.sh", "pong")])
def test_the_arrays_run_a_validated_config(script, game):
    entry = load_records().get(_array_config(script), {}).get(game)
    assert entry is not None and entry["validated"]
