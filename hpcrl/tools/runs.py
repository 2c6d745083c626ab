"""Finding and loading hpcrl runs: the `metrics.h5` files under given paths, read into one
`RunResult` per run (identity, status, final score, learning curve, training columns)."""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcrl.io.metrics import MetricsError, read_metrics
from hpcrl.tools.scores import final_score, reference_scores

METRICS_FILE = "metrics.h5"
DEFAULT_STALE_AFTER_S = 600.0  # a "running" run whose heartbeat is older is reported "stale"


def run_status(stored: str, heartbeat_unix: float, now_unix: float, stale_after_s: float) -> str:
    """The stored status, or "stale" for a "running" run whose heartbeat is older than
    `stale_after_s` (its writer was killed without a chance to say so, e.g. SIGKILL)."""
    if stored == "running" and now_unix - heartbeat_unix > stale_after_s:
        return "stale"
    return stored


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def game_id(name: str) -> str:
    """ale-py snake_case id of an Atari game name ("ALE/SpaceInvaders-v5", "PongNoFrameskip-v4",
    "space_invaders" -> "space_invaders", "pong"); other names ("CartPole-v1") unchanged."""
    stem = re.sub(r"(NoFrameskip|Deterministic)?(-v\d+)?$", "", name.split("/")[-1])
    snake = _CAMEL.sub("_", stem).lower()
    return snake if snake in reference_scores("noop") else name


# ---------------------------------------------------------------------------------------------
# Runs (I/O)
# ---------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """What the analysis keeps of one run directory."""

    path: str
    algo: str
    game: str
    seed: int | None
    status: str  # running | finished | failed | preempted | stale | unreadable
    frames: int = 0  # largest global frame count recorded
    score: float = math.nan  # the final evaluation's mean, else of the last N episodes
    score_source: str = ""  # "final" | "eval" | "train" | "" (no episodes yet)
    num_episodes_used: int = 0
    error: str = ""
    curve_frames: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    curve_returns: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    curve_wall_s: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    train: dict = field(default_factory=dict, repr=False)  # the metrics' train columns
    train_episodes: dict = field(default_factory=dict, repr=False)  # episodes columns
    eval_episodes: dict = field(default_factory=dict, repr=False)  # eval columns


def _identity_from_path(path: Path) -> tuple[str, str, int | None]:
    """(algo, game, seed) from `<algo>/<game>/seed-<seed>/metrics.h5`; "?" where unknown."""
    run_dir = path.parent
    m = re.fullmatch(r"seed-(\d+)", run_dir.name)
    if not m:
        return "?", run_dir.name or "?", None
    return run_dir.parent.parent.name or "?", run_dir.parent.name or "?", int(m.group(1))


def load_run(path: Path, last_n: int, now_unix: float, stale_after_s: float) -> RunResult:
    """Reads one metrics file; an unreadable one becomes a RunResult with status "unreadable"."""
    try:
        data = read_metrics(path)
    except MetricsError as exc:
        algo, game, seed = _identity_from_path(path)
        return RunResult(str(path), algo, game, seed, "unreadable", error=str(exc))
    try:
        return _run_result(path, data, last_n, now_unix, stale_after_s)
    except (KeyError, ValueError, TypeError) as exc:  # attributes of the wrong kind
        algo, game, seed = _identity_from_path(path)
        return RunResult(str(path), algo, game, seed, "unreadable", error=f"{path}: {exc!r}")


def agent_name(attrs: dict) -> str:
    """The run's agent as the papers name them: its algo, ``a3c_lstm`` for A3C with the LSTM
    (Mnih et al. 2016 report A3C FF and A3C LSTM as two agents; the run's resolved config, TOML
    data, says which)."""
    algo = str(attrs["algo"])
    if algo == "a3c":
        try:
            if tomllib.loads(str(attrs.get("config", ""))).get("lstm") is True:
                return "a3c_lstm"
        except tomllib.TOMLDecodeError:
            pass
    return algo


def episode_wall_s(frames: np.ndarray, wall_s: np.ndarray, train_frames: np.ndarray,
                   train_wall_s: np.ndarray) -> np.ndarray:
    """Episodes' wall times summed over restarts, also in files whose episode clock restarted.

    Files written before the episode rows took the file's clock restarted it at every resume
    (the train rows always had it). Each episode gets the later of its own time and the train
    rows' clock at its frame count (linear between the rows, a log interval apart), which is
    its own time where that was right, to within the frame rate's change over one interval.
    """
    if not train_frames.size or not frames.size:
        return wall_s
    return np.maximum(wall_s, np.interp(frames, train_frames, train_wall_s))


def _run_result(path: Path, data: dict, last_n: int, now_unix: float,
                stale_after_s: float) -> RunResult:
    attrs = data["attrs"]
    source = "eval" if data["eval"]["frames"].size else "train"
    episodes = data["eval" if source == "eval" else "episodes"]
    score, n_used = final_score(episodes["frames"], episodes["return"], last_n)
    final = data["final"]["return"]
    if final.size:      # the final weights' own evaluation (hpcrl.runtime.final): all of it
        source, score, n_used = "final", float(np.mean(final)), int(final.size)
    frames = max([int(data[g]["frames"].max()) for g in ("episodes", "eval", "train", "final")
                  if data[g]["frames"].size] + [0])
    return RunResult(
        path=str(path),
        algo=agent_name(attrs),
        game=game_id(str(attrs["game"])),
        seed=int(attrs["seed"]),
        status=run_status(data["status"], data["heartbeat_unix"], now_unix, stale_after_s),
        frames=frames,
        score=score,
        score_source=source if n_used else "",
        num_episodes_used=n_used,
        curve_frames=episodes["frames"],
        curve_returns=episodes["return"],
        curve_wall_s=episode_wall_s(episodes["frames"], episodes["wall_time"],
                                    data["train"]["frames"], data["train"]["wall_time"]),
        train=data["train"],
        train_episodes=data["episodes"],
        eval_episodes=data["eval"],
    )


def find_metrics_files(paths: Sequence[str | os.PathLike]) -> tuple[list[Path], list[str]]:
    """Every metrics.h5 at or below the given paths (sorted, unique), and the paths that do
    not exist."""
    found, missing = set(), []
    for p in map(Path, paths):
        if p.is_file():
            found.add(p)
        elif p.is_dir():
            found.update(Path(root) / METRICS_FILE for root, _, files in os.walk(p)
                         if METRICS_FILE in files)
        else:
            missing.append(str(p))
    return sorted(found), missing
