"""The analysis report of a set of runs (per-game rows, summaries against published columns,
aggregates) and its formats: text, markdown, csv and json tables."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import fields

import numpy as np

from hpcrl.tools.runs import RunResult
from hpcrl.tools.scores import (
    OUR_STARTS,
    PROTOCOLS,
    band_index,
    band_means,
    column_protocol,
    column_starts,
    common_games,
    compare_with_column,
    hns,
    hns_summary,
    milestones,
    published_hns,
    published_scores,
    reference_scores,
    spread,
)


# ---------------------------------------------------------------------------------------------
# Report (pure, on RunResults)
# ---------------------------------------------------------------------------------------------


def _status_text(runs: Sequence[RunResult]) -> str:
    """"finished" when all runs agree, else the seeds per status: "finished 0,1; failed 2"."""
    by_status: dict[str, list[str]] = {}
    for r in runs:
        by_status.setdefault(r.status, []).append("?" if r.seed is None else str(r.seed))
    if len(by_status) == 1:
        return next(iter(by_status))
    return "; ".join(f"{s} {','.join(seeds)}" for s, seeds in sorted(by_status.items()))


def game_rows(runs: Sequence[RunResult], protocol: str, columns: Sequence[str]) -> list[dict]:
    """One row per (algo, game): seeds, statuses, frames, score spread, HNS, published scores.

    HNS is that of the mean score over seeds (HNS is affine in the score, so this equals the
    mean of the seeds' HNS); `hns_per_seed` lists them.
    """
    ref = reference_scores(protocol)
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        groups.setdefault((run.algo, run.game), []).append(run)
    rows = []
    for (algo, game), group in sorted(groups.items()):
        group = sorted(group, key=lambda r: (r.seed is None, r.seed or 0))
        scored = [r for r in group if r.score_source]
        stats = spread(r.score for r in scored)
        sources = sorted({r.score_source for r in scored})
        pair = ref.get(game)
        rows.append(dict(
            algo=algo,
            game=game,
            seeds=[r.seed for r in group],
            num_runs=len(group),
            num_scored=stats["n"],
            status=_status_text(group),
            frames=[r.frames for r in group],
            score_source="+".join(sources),
            score_mean=stats["mean"], score_std=stats["std"],
            score_min=stats["min"], score_max=stats["max"],
            scores=[r.score for r in scored],
            episodes_used=[r.num_episodes_used for r in scored],
            hns=hns(stats["mean"], *pair) if pair and stats["n"] else math.nan,
            hns_per_seed=[hns(r.score, *pair) for r in scored] if pair else [],
            published={c: published_scores()[c].get(game, math.nan) for c in columns},
        ))
    return rows


def summary_rows(rows: Sequence[dict], protocol: str, columns: Sequence[str]) -> list[dict]:
    """Per algorithm: HNS mean / median / above-human over its games with a score, and, per
    compared column, wins and both sides' mean / median HNS restricted to the common games."""
    out = []
    for algo in sorted({r["algo"] for r in rows}):
        mine = [r for r in rows if r["algo"] == algo]
        our_scores = {r["game"]: r["score_mean"] for r in mine}
        our_hns = {r["game"]: r["hns"] for r in mine}
        entry = dict(algo=algo, protocol=protocol, **hns_summary(our_hns),
                     games=common_games(our_hns), comparisons=[])
        for column in columns:
            cmp = compare_with_column(our_scores, our_hns, published_scores()[column],
                                      published_hns(column, protocol))
            starts = column_starts(column)
            entry["comparisons"].append(dict(
                column=column, starts=starts, reference=column_protocol(column, protocol),
                flagged=starts != OUR_STARTS, **cmp))
        out.append(entry)
    return out


def hns_by_game(rows: Sequence[dict], algo: str) -> dict[str, list[float]]:
    """{game: HNS of each scored seed} of one algorithm (the input of :mod:`.stats`)."""
    out = {}
    for r in rows:
        values = [h for h in r["hns_per_seed"] if math.isfinite(h)]
        if r["algo"] == algo and values:
            out[r["game"]] = values
    return out


def aggregate_rows(rows: Sequence[dict], reps: int, seed: int = 0) -> list[dict]:
    """Per algorithm: IQM, median, mean and optimality gap of its HNS over games and seeds,
    each with a 95 % stratified-bootstrap interval (:func:`hpcrl.tools.stats.interval_estimates`)."""
    from hpcrl.tools import stats

    out = []
    for algo in sorted({r["algo"] for r in rows}):
        scores = hns_by_game(rows, algo)
        if scores:
            out.append(dict(algo=algo, num_games=len(scores),
                            num_runs=sum(len(v) for v in scores.values()), reps=reps,
                            **stats.interval_estimates(scores, reps=reps, seed=seed)))
    return out


def subset_rows(rows: Sequence[dict], subset: str, reps: int, seed: int = 0) -> list[dict]:
    """Per algorithm: the Atari-5 (or -3 / -10) estimate of the 57-game median HNS with its
    bootstrap interval over seeds (:mod:`hpcrl.tools.atari5`), the subset games' HNS, the games
    still missing, and, where the algorithm has 49 or more games, their directly computed
    median beside it."""
    from hpcrl.tools import atari5

    weights = atari5.subset_weights(subset)
    out = []
    for algo in sorted({r["algo"] for r in rows}):
        scores = hns_by_game(rows, algo)
        entry = dict(algo=algo, subset=subset, reps=reps,
                     hns={g: float(np.mean(scores[g])) if g in scores else math.nan
                          for g in weights},
                     missing=[g for g in weights if g not in scores], estimate=None,
                     num_games=len(scores), direct_median=math.nan)
        if not entry["missing"]:
            entry["estimate"] = atari5.estimate_interval(scores, subset, reps=reps, seed=seed)
        if len(scores) >= 49:
            entry["direct_median"] = float(np.median([np.mean(v) for v in scores.values()]))
        out.append(entry)
    return out


def build_report(runs: Sequence[RunResult], protocol: str, columns: Sequence[str],
                 last_n: int) -> dict:
    """Everything the formatters print: settings, per-game rows, summaries, run list."""
    readable = [r for r in runs if r.status != "unreadable"]
    rows = game_rows(runs, protocol, columns)
    return dict(
        protocol=protocol,
        reference_file=PROTOCOLS[protocol][0],
        our_starts=OUR_STARTS,
        last_n=last_n,
        columns=[dict(column=c, starts=column_starts(c), reference=column_protocol(c, protocol))
                 for c in columns],
        games=rows,
        summary=summary_rows([r for r in rows if r["num_scored"]], protocol, columns),
        runs=[{f.name: getattr(r, f.name) for f in fields(r) if f.repr}  # not the arrays
              for r in runs],
        num_readable=len(readable),
    )


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def _num(x: float, digits: int = 1) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:,.{digits}f}"


def _pct(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _frames(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


def _starts_label(starts: str) -> str:
    return "noop" if starts == "noop" else "human starts!"


def _hns_header(protocol: str) -> str:
    flag = "!" if PROTOCOLS[protocol][1] != OUR_STARTS else ""
    return f"HNS [{protocol}{flag}]"


def _column_header(c: dict) -> str:
    return f"{c['column']} [{_starts_label(c['starts'])}]"


def _score_text(row: dict) -> str:
    if not row["num_scored"]:
        return "-"
    text = _num(row["score_mean"])
    if row["num_scored"] > 1:
        text += (f" ± {_num(row['score_std'])} "
                 f"[{_num(row['score_min'])}, {_num(row['score_max'])}]")
    return text + ("*" if "train" in row["score_source"] else "")


def _seeds_text(row: dict) -> str:
    n = f"{row['num_scored']}/{row['num_runs']}" if row["num_scored"] != row["num_runs"] else str(
        row["num_runs"])
    seeds = ",".join("?" if s is None else str(s) for s in row["seeds"])
    return f"{n} ({seeds})"


def _frames_text(row: dict) -> str:
    lo, hi = min(row["frames"]), max(row["frames"])
    return _frames(lo) if lo == hi else f"{_frames(lo)}-{_frames(hi)}"


def game_table(report: dict) -> tuple[list[str], list[list[str]]]:
    header = ["game", "algo", "seeds", "status", "frames", "score", _hns_header(report["protocol"])]
    header += [_column_header(c) for c in report["columns"]]
    body = []
    for row in report["games"]:
        line = [row["game"], row["algo"], _seeds_text(row), row["status"], _frames_text(row),
                _score_text(row), _pct(row["hns"])]
        line += [_num(row["published"][c["column"]]) for c in report["columns"]]
        body.append(line)
    return header, body


def summary_table(report: dict) -> tuple[list[str], list[list[str]]]:
    header = ["algo", "games", f"mean {_hns_header(report['protocol'])}", "median HNS",
              "above human"]
    body = [[s["algo"], str(s["num_games"]), _pct(s["mean"]), _pct(s["median"]),
             str(s["above_human"])] for s in report["summary"]]
    return header, body


def comparison_table(report: dict) -> tuple[list[str], list[list[str]]]:
    header = ["algo", "vs column", "games", "beats", "ours mean", "ours median", "column mean",
              "column median", "column reference"]
    body = []
    for s in report["summary"]:
        for c in s["comparisons"]:
            body.append([s["algo"], _column_header(c), str(c["num_games"]),
                         f"{c['wins']}/{c['num_games']}", _pct(c["ours_mean"]),
                         _pct(c["ours_median"]), _pct(c["column_mean"]),
                         _pct(c["column_median"]), c["reference"]])
    return header, body


def aggregate_table(report: dict) -> tuple[list[str], list[list[str]]]:
    def ci(a: dict) -> str:
        return f"{_pct(a['value'])} [{_pct(a['low'])}, {_pct(a['high'])}]"

    header = ["algo", "games", "runs", f"IQM {_hns_header(report['protocol'])}", "median",
              "mean", "optimality gap"]
    body = [[a["algo"], str(a["num_games"]), str(a["num_runs"]), ci(a["iqm"]), ci(a["median"]),
             ci(a["mean"]), ci(a["optimality_gap"])] for a in report["aggregates"]]
    return header, body


def subset_table(report: dict) -> tuple[list[str], list[list[str]]]:
    subset = report["subset"][0]["subset"]
    games = list(report["subset"][0]["hns"])
    header = ["algo"] + games + [f"{subset} est. median57", "games", "median (direct)"]
    body = []
    for a in report["subset"]:
        est = a["estimate"]
        est_text = _estimate_text(est) if est else "missing " + ", ".join(a["missing"])
        body.append([a["algo"]] + [_pct(a["hns"][g]) for g in games]
                    + [est_text, str(a["num_games"]), _pct(a["direct_median"])])
    return header, body


def _estimate_text(est: dict) -> str:
    """The estimate with its interval over seeds; with one seed a game there is nothing to
    resample, and a point "interval" would read as a certain estimate."""
    if max(est["seeds"].values()) < 2:
        return f"{_pct(est['value'])} (1 seed a game: no interval)"
    return f"{_pct(est['value'])} [{_pct(est['low'])}, {_pct(est['high'])}]"


def milestone_table(runs: Sequence[RunResult], thresholds: Sequence[float],
                    window: int = 20) -> str:
    """Markdown: per run, M frames and minutes until the mean return of ``window`` episodes
    (evaluation episodes where the run evaluates, else training ones) first reached each
    threshold."""
    head = ["run", "episodes"] + [f"{t:+g}: M frames / min" for t in thresholds]
    body = []
    for run in runs:
        if run.status == "unreadable":
            continue
        cells = []
        for m in milestones(run.curve_frames, run.curve_returns, run.curve_wall_s, thresholds,
                            window):
            cells.append("never" if m["frames"] is None
                         else f"{m['frames'] / 1e6:.2f} / {m['minutes']:.1f}")
        body.append([run.path, run.score_source or "-"] + cells)
    return _markdown_table(head, body)


def band_table(run: RunResult, band_frames: int) -> str:
    """Markdown: one run's learning curve in bands of ``band_frames`` global frames (columns):
    the mean evaluation and training return with their episode counts, the train rows' mean
    policy entropy (A3C) or max Q (value methods) and frames/s, and the worst layer's share of
    dead units at the band's last train row. The last band runs to the run's last frame."""
    num_bands = max(1, round(run.frames / band_frames))
    scale = 1e6 if band_frames % 1_000_000 == 0 else 1e3
    unit = "M" if scale == 1e6 else "k"
    labels = [f"{b * band_frames / scale:g}-{(b + 1) * band_frames / scale:g}"
              for b in range(num_bands)]
    labels[-1] = f"{(num_bands - 1) * band_frames / scale:g}-{run.frames / scale:.2f}"

    def episode_row(name: str, columns: dict) -> list[str] | None:
        if not columns or not columns["frames"].size:
            return None
        means, counts = band_means(columns["frames"], columns["return"], band_frames, num_bands)
        return [name] + [f"{m:.2f} ({n})" if n else "-" for m, n in zip(means, counts)]

    def train_row(name: str, column: str, fmt: str, last: bool = False) -> list[str] | None:
        train = run.train
        if not train or column not in train or not np.isfinite(train[column]).any():
            return None
        if last:  # the band's last finite reading
            band = band_index(train["frames"], band_frames, num_bands)
            cells = []
            for b in range(num_bands):
                vals = train[column][(band == b) & np.isfinite(train[column])]
                cells.append(format(vals[-1], fmt) if vals.size else "-")
            return [name] + cells
        means, counts = band_means(train["frames"], train[column], band_frames, num_bands)
        return [name] + [format(m, fmt) if n else "-" for m, n in zip(means, counts)]

    rows = [episode_row("evaluation mean (episodes)", run.eval_episodes),
            episode_row("training mean (episodes)", run.train_episodes),
            train_row("policy entropy, nats", "entropy", ".3f"),
            train_row("max Q", "max_q", ".3f"),
            train_row("dead units, worst layer (band end)", "dead_units", ".3f", last=True),
            train_row("frames/s", "frames_per_second", ".0f")]
    head = [f"{run.path}: {unit} frames"] + labels
    return _markdown_table(head, [r for r in rows if r is not None])


_LEFT_ALIGNED = {"game", "algo", "seeds", "status", "vs column", "column reference"}


def _text_table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(header, *body)]
    left = [h in _LEFT_ALIGNED for h in header]

    def fmt(cells):
        return "  ".join(c.ljust(w) if lft else c.rjust(w)
                         for c, w, lft in zip(cells, widths, left)).rstrip()

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths)] + [fmt(b) for b in body])


def _markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(c.replace("|", "\\|") for c in b) + " |"
                              for b in body])


def _notes(report: dict) -> list[str]:
    notes = [f"score: mean of each seed's final evaluation (source final), else of its last "
             f"{report['last_n']} evaluation episodes (eval), then mean ± std [min, max] over "
             f"seeds; * = training episodes (run has no evaluation episodes)",
             f"HNS = (score - random) / (human - random) with {report['reference_file']}; "
             f"published columns use the pair of their own start condition"]
    if PROTOCOLS[report["protocol"]][1] != OUR_STARTS or any(
            c["starts"] != OUR_STARTS for c in report["columns"]):
        notes.append("! human-start numbers: hpcrl evaluates with no-op starts (human start "
                     "states are not public), so these comparisons are not like for like")
    if report.get("aggregates"):
        notes.append(f"IQM: mean of the middle 50 % of all seed-game HNS; median, mean: of the "
                     f"per-game means; optimality gap: 1 - mean(min(HNS, 1)); [95 % stratified "
                     f"bootstrap interval over seeds, {report['aggregates'][0]['reps']:,} "
                     f"resamples] (Agarwal et al. 2021)")
    if report.get("subset"):
        from hpcrl.tools.atari5 import RELATIVE_ERROR

        a = report["subset"][0]
        err = RELATIVE_ERROR.get(a["subset"])
        notes.append(f"{a['subset']}: 57-game median HNS estimated from the subset's games, "
                     f"log10(1 + median) = sum w_g log10(1 + max(HNS_g, 0)), HNS in percent "
                     f"(Aitchison et al. 2023"
                     + (f"; about {100 * err:.0f} % relative error" if err else "")
                     + f"); [95 % stratified bootstrap interval over seeds, {a['reps']:,} "
                     f"resamples]; direct median: over all of an algorithm's games, shown with "
                     f"49 or more")
    return notes


def format_report(report: dict, fmt: str) -> str:
    """The report as "text" (terminal), "markdown", "csv" (per-game table) or "json"."""
    if fmt == "json":
        return json.dumps(_json_safe(report), indent=2)
    if fmt == "csv":
        return _csv_text(report)
    table = _text_table if fmt == "text" else _markdown_table
    parts = [table(*game_table(report)), "", table(*summary_table(report))]
    if report["columns"]:
        parts += ["", table(*comparison_table(report))]
    if report.get("aggregates"):
        parts += ["", table(*aggregate_table(report))]
    if report.get("subset"):
        parts += ["", table(*subset_table(report))]
    bullet = "" if fmt == "text" else "- "
    parts += [""] + [bullet + n for n in _notes(report)]
    return "\n".join(parts) + "\n"


def _csv_text(report: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    hns_col = f"hns [{report['protocol']}]"
    writer.writerow(["game", "algo", "num_runs", "num_scored", "seeds", "status", "frames_min",
                     "frames_max", "score_source", "score_mean", "score_std", "score_min",
                     "score_max", hns_col] + [_column_header(c) for c in report["columns"]])
    for r in report["games"]:
        values = [r["game"], r["algo"], r["num_runs"], r["num_scored"],
                  " ".join(map(str, r["seeds"])), r["status"], min(r["frames"]), max(r["frames"]),
                  r["score_source"], r["score_mean"], r["score_std"], r["score_min"],
                  r["score_max"], r["hns"]] + [r["published"][c["column"]] for c in
                                               report["columns"]]
        writer.writerow(["" if isinstance(v, float) and not math.isfinite(v) else v
                         for v in values])
    return out.getvalue()


def _json_safe(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.generic):
        return _json_safe(x.item())
    return x
