"""What a shipped config has been shown to learn (``hpcrl/data/learning_records.toml``), as the
one line ``python -m hpcrl.run`` prints at start: a user sees before the first frame whether
the job they launched is one that learns, and where the evidence is.

A record belongs to a config file (by name) and a game. Settings that do not change what is
learned or how (seed, run directory, budget, logging, checkpoints, evaluation, early stop)
may differ from the file's; any other ``--set`` is named, since the record may not hold for it.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from hpcrl.config import Config, default_job_path, load_config

RECORDS_FILE = "learning_records.toml"
#: The shipped config whose recipe the default job runs, value for value (a test holds them
#: equal): its records are the default job's, and runs of either count for both.
DEFAULT_JOB_RECIPE = "gorila_pong"
#: Fields a run may set without leaving the recorded recipe (records are kept per game, so a
#: run on another game reads that game's record, or none).
OUTSIDE_THE_RECIPE = frozenset({
    "game", "seed", "run_dir", "total_frames", "log_every_s", "early_stop", "early_stop_return",
    "eval_every_frames", "eval_episodes", "final_eval_episodes", "watchdog_s", "preflight",
    "run_dir_lease_s", "checkpoint_every_min", "checkpoint_keep", "checkpoint_replay",
    "checkpoint_max_failures", "checkpoint_min_mb_per_s", "checkpoint_quota_check",
    "async_progress", "lr_anneal_frames", "learner_reuse_acting", "malloc_mmap_threshold_kb"})


def load_records() -> dict[str, dict[str, dict]]:
    """``{config name: {game: {"validated", "record", "evidence"}}}``."""
    text = resources.files("hpcrl.data").joinpath(RECORDS_FILE).read_text()
    return tomllib.loads(text)


def config_name(path: str | Path | None) -> str:
    """``configs/a3c_pong.toml`` -> ``a3c_pong``; the default job (``None``) runs
    ``DEFAULT_JOB_RECIPE``'s recipe and answers that name."""
    return DEFAULT_JOB_RECIPE if path is None else Path(path).stem


def changed_recipe(path: str | Path | None, cfg: Config) -> list[str]:
    """Fields of ``cfg`` that differ from the file's (``None``: the default job's) own values
    and change the recipe."""
    base = load_config(default_job_path() if path is None else path)
    return sorted(name for name in vars(cfg) if name not in OUTSIDE_THE_RECIPE
                  and getattr(cfg, name) != getattr(base, name))


def record_line(path: str | Path | None, cfg: Config, game_id: str) -> str:
    """The start line: the record of this config on ``game_id`` (canonical id), or that there
    is none."""
    name = config_name(path)
    entry = load_records().get(name, {}).get(game_id)
    label = f"{name}.toml" if path is not None else f"the default job ({name}.toml's recipe)"
    if entry is None:
        line = (f"note: {label} on {game_id} has no learning record: nothing yet shows that it "
                "learns (README, Paper settings)")
    elif entry["validated"]:
        line = f"{label} on {game_id} learns: {entry['record']} ({entry['evidence']})"
    else:
        line = (f"note: {label} on {game_id} is not validated yet: {entry['record']} "
                f"({entry['evidence']})")
    changed = changed_recipe(path, cfg) if entry is not None else []
    if changed:
        line += f"; this run changes {', '.join(changed)}, for which the record may not hold"
    return line
