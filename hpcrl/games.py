"""Game sets of the papers, and game-id resolution.

The sets:

* ``gorila49``: the 49 games of the Nature DQN paper (Mnih et al. 2015), which Gorila
  (Nair et al. 2015) also used.
* ``a3c57``: the 57 games of the A3C paper (Mnih et al. 2016): the 49 plus berzerk, defender,
  phoenix, pitfall, skiing, solaris, surround and yars_revenge.
* ``atari5``: battle_zone, double_dunk, name_this_game, phoenix and qbert, the five games of
  Atari-5 (Aitchison et al. 2023), whose scores estimate the 57-game median
  (``python -m hpcrl.analyze DIR --atari5``); ``atari3`` and ``atari10``: its cheaper and
  more accurate variants.

Ids are ale-py's snake_case ROM ids (``space_invaders``); the lists come from DQN Zoo's
``atari_data.py`` and the papers (provenance: ``hpcrl/data/README.md``).
SLURM array jobs pick one game per task::

    GAME=$(python -m hpcrl.games --set gorila49 --index "$SLURM_ARRAY_TASK_ID")

This module imports neither torch nor (at import time) ale-py, so the CLI is cheap.
"""

from __future__ import annotations

import argparse
import re
import sys

GORILA_49: tuple[str, ...] = (
    "alien", "amidar", "assault", "asterix", "asteroids", "atlantis", "bank_heist",
    "battle_zone", "beam_rider", "bowling", "boxing", "breakout", "centipede",
    "chopper_command", "crazy_climber", "demon_attack", "double_dunk", "enduro",
    "fishing_derby", "freeway", "frostbite", "gopher", "gravitar", "hero", "ice_hockey",
    "jamesbond", "kangaroo", "krull", "kung_fu_master", "montezuma_revenge", "ms_pacman",
    "name_this_game", "pong", "private_eye", "qbert", "riverraid", "road_runner", "robotank",
    "seaquest", "space_invaders", "star_gunner", "tennis", "time_pilot", "tutankham",
    "up_n_down", "venture", "video_pinball", "wizard_of_wor", "zaxxon",
)

A3C_EXTRA_8: tuple[str, ...] = (
    "berzerk", "defender", "phoenix", "pitfall", "skiing", "solaris", "surround", "yars_revenge",
)

A3C_57: tuple[str, ...] = tuple(sorted(GORILA_49 + A3C_EXTRA_8))

# Atari-5 (Aitchison, Sweetser and Hutter, ICML 2023): five games whose scores predict the
# 57-game median (the weights and the estimate: hpcrl/tools/atari5.py).
# Atari-3 is the best three of them, Atari-10 the five plus five more.
ATARI_5: tuple[str, ...] = ("battle_zone", "double_dunk", "name_this_game", "phoenix", "qbert")
ATARI_3: tuple[str, ...] = ("battle_zone", "name_this_game", "phoenix")
ATARI_10: tuple[str, ...] = ATARI_5 + ("amidar", "bowling", "frostbite", "kung_fu_master",
                                       "riverraid")

GAME_SETS: dict[str, tuple[str, ...]] = {"gorila49": GORILA_49, "a3c57": A3C_57,
                                         "atari5": ATARI_5, "atari3": ATARI_3,
                                         "atari10": ATARI_10}

# gymnasium classic-control tasks behind the same env interface (small MLP tests, CI).
CLASSIC_CONTROL: tuple[str, ...] = ("CartPole-v1", "Acrobot-v1")
# gymnasium tasks with continuous actions (A3C with a Gaussian policy, Mnih et al. 2016, §5.3):
# Pendulum needs nothing more; the MuJoCo tasks need the ``mujoco`` extra.
CONTINUOUS_CONTROL: tuple[str, ...] = (
    "Pendulum-v1", "MountainCarContinuous-v0", "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5", "Reacher-v5", "Swimmer-v5", "HalfCheetah-v5", "Hopper-v5",
    "Walker2d-v5", "Ant-v5", "Humanoid-v5")

LIST_HINT = "list valid ids with `python -m hpcrl.games --list` (Atari ids: ale_py.roms.get_all_rom_ids())"


def game_set(name: str) -> tuple[str, ...]:
    """The game ids of one named set (a key of :data:`GAME_SETS`).

    Raises:
        ValueError: unknown set name.
    """
    try:
        return GAME_SETS[name]
    except KeyError:
        raise ValueError(f"unknown game set {name!r}; known sets: {', '.join(GAME_SETS)}") from None


def game_at(set_name: str, index: int) -> str:
    """The ``index``-th game (0-based, as ``SLURM_ARRAY_TASK_ID``) of a set.

    Raises:
        ValueError: unknown set or index out of range (negative indices are refused too:
            an array task id is never negative, so one is a bug upstream).
    """
    games = game_set(set_name)
    if not 0 <= index < len(games):
        raise ValueError(f"index {index} out of range for {set_name} (0..{len(games) - 1})")
    return games[index]


def task_at(set_name: str, index: int, seeds: int = 1) -> tuple[str, int]:
    """(game, seed offset) of array index ``index`` when each game runs ``seeds`` seeds:
    index i is game i % n and seed offset i // n, so ``--array=0-146`` over the 49 games of
    gorila49 with 3 seeds runs every game with offset 0, then 1, then 2 (and ``--array=0-48``
    is exactly the one-seed array).

    Raises:
        ValueError: unknown set, ``seeds`` < 1, or index outside 0 .. n * seeds - 1.
    """
    games = game_set(set_name)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if not 0 <= index < len(games) * seeds:
        raise ValueError(f"index {index} out of range for {set_name} with {seeds} seeds "
                         f"(0..{len(games) * seeds - 1})")
    return games[index % len(games)], index // len(games)


def atari_rom_ids() -> list[str]:
    """All ROM ids that ale-py ships (imports ale-py on first use)."""
    from ale_py import roms

    return list(roms.get_all_rom_ids())


def all_game_ids() -> list[str]:
    """Every id `hpcrl.envs.make_env` accepts in canonical form: ROM ids, then classic and
    continuous control."""
    return atari_rom_ids() + list(CLASSIC_CONTROL) + list(CONTINUOUS_CONTROL)


def _camel_to_snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def continuous_id(game: str) -> str | None:
    """The gymnasium id of a continuous-control task (``halfcheetah`` -> ``HalfCheetah-v5``),
    or None for any other name (no emulator is loaded to tell)."""
    key = game.strip().lower()
    for cc in CONTINUOUS_CONTROL:
        if key in (cc.lower(), cc.split("-")[0].lower()):
            return cc
    return None


def resolve_game_id(game: str) -> tuple[str, str]:
    """Canonical ``(kind, id)`` for a user-given game name.

    Accepts ale-py ROM ids (``space_invaders``), gymnasium Atari names (``SpaceInvaders``,
    ``ALE/SpaceInvaders-v5``, ``SpaceInvadersNoFrameskip-v4``) and the classic-control ids
    (``CartPole-v1``, also ``cartpole``/``acrobot``) and the continuous-control ids
    (``HalfCheetah-v5``, also ``halfcheetah``).

    Returns:
        ``("atari", rom_id)``, ``("classic", gymnasium_id)`` or ``("continuous", gymnasium_id)``.

    Raises:
        ValueError: unknown id, with a one-line message saying how to list the valid ones.
    """
    key = game.strip()
    for cc in CLASSIC_CONTROL:
        if key.lower() in (cc.lower(), cc.split("-")[0].lower()):
            return "classic", cc
    if continuous_id(key) is not None:
        return "continuous", continuous_id(key)
    name = key.split("/")[-1]
    name = re.sub(r"(NoFrameskip|Deterministic)?-v\d+$", "", name)
    rom_ids = atari_rom_ids()
    # PascalCase names are rom_id.title() without underscores (ale_py.registration), so match
    # on that; this also maps "JamesBond"-style spellings the regex split would get wrong.
    by_pascal = {r.replace("_", ""): r for r in rom_ids}
    for candidate in (name, _camel_to_snake(name), name.lower()):
        if candidate in rom_ids:
            return "atari", candidate
    rom = by_pascal.get(name.lower().replace("_", ""))
    if rom is not None:
        return "atari", rom
    raise ValueError(f"unknown game id {game!r}; {LIST_HINT}")


def main(argv: list[str] | None = None) -> int:
    """CLI: print one game of a set, a whole set, or every valid id.

    Exit status 2 with a one-line message on stderr for a bad set name or index.
    """
    parser = argparse.ArgumentParser(prog="python -m hpcrl.games", description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="set_name", help=f"game set: {', '.join(GAME_SETS)}")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--index", type=int, help="print the game at this 0-based index of --set")
    parser.add_argument("--seeds", type=int, default=None,
                        help="with --index: each game runs this many seeds; print 'GAME OFFSET' "
                             "(the seed offset of that index, see task_at)")
    what.add_argument("--list", action="store_true",
                      help="print the games of --set one per line (all valid ids without --set)")
    args = parser.parse_args(argv)
    try:
        if args.list:
            games = game_set(args.set_name) if args.set_name else all_game_ids()
            print("\n".join(games))
        else:
            if not args.set_name:
                raise ValueError("--index needs --set")
            if args.seeds is None:
                print(game_at(args.set_name, args.index))
            else:
                print(*task_at(args.set_name, args.index, args.seeds))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
