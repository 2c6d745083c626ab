"""Plots of an analysis report: learning curves per game, training columns, HNS per game and
performance profiles (matplotlib, imported only when plotting)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hpcrl.tools.report import _column_header, hns_by_game
from hpcrl.tools.runs import RunResult
from hpcrl.tools.scores import published_scores


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` values (fewer at the start), at every index."""
    c = np.cumsum(np.concatenate([[0.0], np.asarray(values, np.float64)]))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def learning_curve(frames: np.ndarray, returns: np.ndarray,
                   window: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean return of the last `window` episodes, at each distinct end frame.

    Episodes that share an end frame (an evaluation batch recorded at one frame count) give
    one point, the value after all of them: with `window` = batch size, the batch mean.
    """
    order = np.argsort(frames, kind="stable")
    f = np.asarray(frames)[order]
    y = rolling_mean(np.asarray(returns)[order], window)
    last_of_each = np.r_[f[1:] != f[:-1], True]
    return f[last_of_each], y[last_of_each]


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


X_AXES = {"frames": "env frames", "hours": "wall-clock hours (summed over restarts)"}


def _curve(run: RunResult, window: int, x: str) -> tuple[np.ndarray, np.ndarray]:
    """A run's learning curve against frames or hours (the wall time of the same episodes)."""
    f, y = learning_curve(run.curve_frames, run.curve_returns, window)
    if x == "frames":
        return f.astype(np.float64), y
    order = np.argsort(run.curve_frames, kind="stable")
    frames_sorted, wall_sorted = run.curve_frames[order], run.curve_wall_s[order]
    last = np.searchsorted(frames_sorted, f, side="right") - 1    # the point's last episode
    return np.maximum.accumulate(wall_sorted[last]) / 3600, y


def plot_report(report: dict, runs: Sequence[RunResult], out_dir: str | os.PathLike,
                x: str = "frames") -> list[Path]:
    """Writes, per game, `curve_<game>.png` (per algo: the seeds' mean of the last N episodes'
    return with a 95 % bootstrap band over seeds, as far as every seed has reached; each seed a
    thin line; published scores of
    the compared columns as horizontal lines) and `train_<game>.png` (loss, frames/s and
    dropped gradients per run); then `hns_summary.png` (HNS per game and algo) and, with
    aggregates, `profile.png` (performance profiles). ``x``: "frames" or "hours". Returns
    the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    by_game: dict[str, list[RunResult]] = {}
    for run in runs:
        if run.status != "unreadable" and run.curve_returns.size:
            by_game.setdefault(run.game, []).append(run)
    for game, game_runs in sorted(by_game.items()):
        written.append(_plot_curves(plt, report, game, game_runs, x, out / f"curve_{game}.png"))
        if any(len(r.train.get("frames", ())) for r in game_runs):
            written.append(_plot_train(plt, game, game_runs, x, out / f"train_{game}.png"))
    rows = [r for r in report["games"] if math.isfinite(r["hns"])]
    if rows:
        written.append(_plot_hns_bars(plt, rows, report["protocol"], out / "hns_summary.png"))
    if report.get("aggregates"):
        written.append(_plot_profiles(plt, report, out / "profile.png"))
    return written


def _plot_curves(plt, report: dict, game: str, runs: list[RunResult], x: str, path: Path
                 ) -> Path:
    from hpcrl.tools.stats import mean_curve

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    algos = sorted({r.algo for r in runs})
    for i, algo in enumerate(algos):
        mine = sorted((r for r in runs if r.algo == algo), key=lambda r: r.seed or 0)
        curves = [_curve(r, report["last_n"], x) for r in mine]
        color = f"C{i}"
        if len(mine) == 1:
            ax.plot(*curves[0], color=color, label=f"{algo} seed {mine[0].seed} "
                    f"({mine[0].score_source or 'train'})")
            continue
        for cx, cy in curves:
            ax.plot(cx, cy, color=color, lw=0.6, alpha=0.35)
        grid = np.linspace(0, min(c[0][-1] for c in curves), 200)   # where every seed is
        mean, lo, hi = mean_curve([c[0] for c in curves], [c[1] for c in curves], grid)
        ax.plot(grid, mean, color=color, lw=2, label=f"{algo}: mean of {len(mine)} seeds")
        ax.fill_between(grid, lo, hi, color=color, alpha=0.2, lw=0)
    for i, c in enumerate(report["columns"]):
        value = published_scores()[c["column"]].get(game)
        if value is not None:
            ax.axhline(value, ls="--", lw=1, color=f"C{(i + 5) % 10}",
                       label=f"{_column_header(c)}: {value:,.1f}")
    ax.set(title=game, xlabel=X_AXES[x],
           ylabel=f"return (mean of last {report['last_n']} episodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


TRAIN_PANELS = (("loss", "loss (mean since the last report)"),
                ("frames_per_second", "env frames / s"),
                ("dropped", "gradients dropped (stale + outlier + non-finite)"),
                ("grad_norm", "gradient norm before clipping"),
                ("health", "policy entropy (A3C) / mean max Q"),
                ("dead_units", "worst layer's share of dead units"))


def _plot_train(plt, game: str, runs: list[RunResult], x: str, path: Path) -> Path:
    fig, axes = plt.subplots(len(TRAIN_PANELS), 1, figsize=(7, 12), dpi=100, sharex=True)
    for run in sorted(runs, key=lambda r: (r.algo, r.seed or 0)):
        t = run.train
        if not len(t.get("frames", ())):
            continue
        xs = t["frames"] if x == "frames" else t["wall_time"] / 3600
        values = dict(t, dropped=t["dropped_stale"] + t["dropped_outlier"]
                      + t["dropped_nonfinite"],
                      health=t["entropy"] if run.algo.startswith("a3c") else t["max_q"])
        for ax, (column, _) in zip(axes, TRAIN_PANELS):
            ax.plot(xs, values[column], lw=1, label=f"{run.algo} seed {run.seed}")
    for ax, (_, label) in zip(axes, TRAIN_PANELS):
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_title(f"{game}: training")
    axes[0].legend(fontsize=7)
    axes[-1].set_xlabel(X_AXES[x])
    return _save(plt, fig, path)


def _plot_profiles(plt, report: dict, path: Path) -> Path:
    from hpcrl.tools.stats import performance_profile

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    top = max(max(r["hns_per_seed"] or [0.0]) for r in report["games"])
    taus = np.linspace(0, max(1.0, 1.1 * top), 201)
    for i, agg in enumerate(report["aggregates"]):
        scores = hns_by_game(report["games"], agg["algo"])
        profile, lo, hi = performance_profile(scores, taus)
        ax.plot(100 * taus, profile, color=f"C{i}", label=f"{agg['algo']} "
                f"({agg['num_games']} games, {agg['num_runs']} runs)")
        ax.fill_between(100 * taus, lo, hi, color=f"C{i}", alpha=0.2, lw=0)
    ax.axvline(100, color="k", ls="--", lw=1)
    ax.set(xlabel=f"HNS % [{report['protocol']}] threshold tau",
           ylabel="fraction of runs with HNS > tau", title="performance profile", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def _plot_hns_bars(plt, rows: list[dict], protocol: str, path: Path) -> Path:
    games = sorted({r["game"] for r in rows})
    algos = sorted({r["algo"] for r in rows})
    width = 0.8 / len(algos)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.4 * len(games) + 2), 4.5), dpi=100)
    for i, algo in enumerate(algos):
        hns_by_game = {r["game"]: r["hns"] for r in rows if r["algo"] == algo}
        offset = (i - (len(algos) - 1) / 2) * width
        x = [j + offset for j, g in enumerate(games) if g in hns_by_game]
        ax.bar(x, [100 * hns_by_game[g] for g in games if g in hns_by_game], width, label=algo)
    ax.axhline(100, color="k", ls="--", lw=1, label="human")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(games)), games, rotation=60, ha="right", fontsize=8)
    ax.set(ylabel=f"HNS % [{protocol}]", title="human-normalised score per game")
    ax.legend(fontsize=8)
    return _save(plt, fig, path)
