"""Tests of hpcrl.games: the paper game sets, the CLI used by SLURM array jobs, id resolution."""

import subprocess
import sys

import ale_py
import pytest

from hpcrl.games import A3C_57, GORILA_49, game_at, resolve_game_id


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hpcrl.games", *args], capture_output=True, text=True)


def test_set_sizes_and_membership():
    assert len(GORILA_49) == len(set(GORILA_49)) == 49
    assert len(A3C_57) == len(set(A3C_57)) == 57
    extra = set(A3C_57) - set(GORILA_49)
    assert extra == {"berzerk", "defender", "phoenix", "pitfall", "skiing", "solaris", "surround",
                     "yars_revenge"}
    assert set(GORILA_49) < set(A3C_57)
    assert GORILA_49[7] == "battle_zone" and GORILA_49[-1] == "zaxxon"


def test_cli_index_and_list_for_both_sets():
    r = _cli("--set", "gorila49", "--index", "7")
    assert r.returncode == 0 and r.stdout == "battle_zone\n"
    r = _cli("--set", "a3c57", "--list")
    assert r.returncode == 0 and r.stdout.splitlines() == list(A3C_57)
    r = _cli("--set", "gorila49", "--list")
    assert r.stdout.splitlines() == list(GORILA_49)
    r = _cli("--set", "a3c57", "--index", "56")
    assert r.stdout.strip() == A3C_57[56] == "zaxxon"
    r = _cli("--list")
    ids = r.stdout.splitlines()
    assert r.returncode == 0 and "surround" in ids and "CartPole-v1" in ids


@pytest.mark.parametrize("args", [("--set", "gorila49", "--index", "49"),
                                  ("--set", "gorila49", "--index", "-1"),
                                  ("--set", "atari100", "--index", "0"),
                                  ("--set", "nope", "--list")])
def test_cli_errors_are_one_line_exit_2(args):
    r = _cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1


def test_game_at_range():
    assert game_at("a3c57", 0) == "alien"
    with pytest.raises(ValueError):
        game_at("a3c57", 57)


def test_every_id_loads_in_ale():
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    for game in A3C_57:
        assert resolve_game_id(game) == ("atari", game)
        ale = ale_py.ALEInterface()
        ale.loadROM(str(ale_py.roms.get_rom_path(game)))
        assert len(ale.getMinimalActionSet()) >= 2, game


@pytest.mark.parametrize("name,expected", [
    ("SpaceInvaders", "space_invaders"), ("ALE/MontezumaRevenge-v5", "montezuma_revenge"),
    ("JamesbondNoFrameskip-v4", "jamesbond"), ("Jamesbond", "jamesbond"),
    ("space_invaders", "space_invaders"), ("cartpole", "CartPole-v1")])
def test_resolve_aliases(name, expected):
    assert resolve_game_id(name)[1] == expected


def test_resolve_unknown_is_value_error():
    with pytest.raises(ValueError, match="--list"):
        resolve_game_id("pongg")


def test_array_index_to_game_and_seed_for_both_sets():
    from hpcrl.games import GAME_SETS, task_at

    for name in ("gorila49", "a3c57"):
        games = GAME_SETS[name]
        n = len(games)
        got = [task_at(name, i, 3) for i in range(3 * n)]
        # every (game, seed offset) once: offset 0 for all games first, then 1, then 2
        assert got == [(g, k) for k in range(3) for g in games]
        assert task_at(name, 5, 1) == (games[5], 0)
        with pytest.raises(ValueError, match=f"out of range for {name} with 3 seeds"):
            task_at(name, 3 * n, 3)
    assert task_at("a3c57", 2 * 57 + 36, 3) == ("pong", 2)
