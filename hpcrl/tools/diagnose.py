"""How much of a run's network can still learn, read from its newest checkpoint.

A ReLU unit whose input is negative for every observation passes no gradient, to its own
weights or to the units feeding it, and nothing brings it back: a "dead" unit. A3C on Pong
can lose most of its units this way within the first million frames (docs/experiments), and then trains for days at a return of -21 with nothing in the metrics to say so.

The parameter servers keep one optimiser statistic per parameter: RMSProp's
v <- a v + (1 - a) g^2 (Mnih et al. 2016, S7; Tieleman & Hinton 2012), AdaGrad's
G <- G + g^2 (Gorila). After a parameter's gradient has been exactly 0 for a few thousand
applied updates, v has decayed below the smallest normal float and the ps kernel stores 0
(it runs with flush-to-zero); G is 0 only if the parameter never had a gradient. So the
fraction of statistics at exactly 0 per tensor is the fraction of that tensor that no longer
learns, and it needs neither an environment nor a forward pass. Under per-client RMSProp a
parameter counts only when every client's statistic is 0.

Read the biases first: a unit's bias has a gradient whenever the unit is active and something
downstream still learns, so a bias at 0 is a dead unit (a conv bias: a dead channel). A weight
at 0 is a dead unit, or an input that is always 0: most of the first fully connected layer's
inputs in Pong are background positions where the conv features never fire, so that tensor sits
near 40 % on a healthy network (measured at 0.75 M frames) and is no alarm by itself.

    python -m hpcrl.diagnose RUN_DIR [--format text|json] [--probe AGENT_STEPS]

``--probe`` also plays the run's game with the checkpoint's network and reports what the
activations show (:mod:`hpcrl.tools.probe`: units off, LSTM cell saturation).

Reads the run's ``config.toml`` (TOML, data only) and the ps ranks' HDF5 files of the newest
complete checkpoint generation; builds the network (torch) only to name the tensors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from hpcrl.io import checkpoint as ckpt
from hpcrl.tools import runfiles

STATISTICS = ("G", "v")  # AdaGrad, RMSProp (shared or per client) and Adam's second moment
WHAT_ZERO_MEANS = {"v": "no gradient for thousands of updates", "G": "never a gradient"}


class DiagnoseError(RuntimeError):
    """One line for the user: what is wrong with the run directory."""


def zero_fractions(tensors: Sequence[tuple[str, int]], stat: np.ndarray,
                   eps: float | np.ndarray | None = None,
                   mean_sq: np.ndarray | None = None) -> list[dict]:
    """Per tensor, the share of its parameters whose statistic is exactly 0, and (given the
    optimiser's ``eps``) the share above eps with the median sqrt(statistic).

    The update is lr g / sqrt(stat + eps): where stat > eps the rule adapts the step to each
    parameter; where stat < eps it is plain SGD at a rate of about lr / sqrt(eps) (Gorila's
    AdaGrad with eps 0.1 and gradients of 1e-4 stays there for the whole run).

    Args:
        tensors: (name, number of parameters) in the flat vector's order.
        stat: [n] statistics, or [n_clients, n] per-client statistics (a parameter counts
            as zero only when it is zero for every client).
        eps: the floor the statistic competes with inside the square root: the optimiser's
            eps, or per parameter (AdaGrad with a warm start: the parameter's G0 + eps, with
            ``stat`` its own G - G0).
        mean_sq: AdaGrad only, [n] each parameter's mean squared gradient per update:
            (G - G0) / updates with the shard's warm start G0 saved, G / (t0 + updates)
            without.

    Returns:
        [{"name", "size", "zero", "fraction"[, "above_eps", "median_sqrt_stat"]
        [, "median_sqrt_floor"][, "median_rms_grad"]}], one per tensor, then one named "all"
        ("median_sqrt_floor" where the floor differs between parameters).
    """
    stat2 = np.atleast_2d(stat)
    zero = ~np.any(stat2 != 0, axis=0)
    n = sum(size for _, size in tensors)
    if zero.size != n:
        raise DiagnoseError(f"the checkpoint holds {zero.size} statistics but the network has "
                            f"{n} parameters; was the config changed after the run?")
    per_parameter = np.ndim(eps) > 0
    floor = None if eps is None else np.broadcast_to(np.asarray(eps, np.float64), (n,))
    bounds = np.cumsum([0] + [size for _, size in tensors])
    spans = [(name, lo, hi) for (name, _), lo, hi in zip(tensors, bounds[:-1], bounds[1:])]
    rows = []
    for name, lo, hi in spans + [("all", 0, n)]:
        count = int(np.count_nonzero(zero[lo:hi]))
        row = {"name": name, "size": int(hi - lo), "zero": count,
               "fraction": count / (hi - lo) if hi > lo else 0.0}
        if eps is not None and hi > lo:
            part = stat2[:, lo:hi]
            row["above_eps"] = float(np.mean(part > floor[lo:hi]))
            row["median_sqrt_stat"] = float(np.sqrt(np.median(part)))
            if per_parameter:
                row["median_sqrt_floor"] = float(np.sqrt(np.median(floor[lo:hi])))
        if mean_sq is not None and hi > lo:
            row["median_rms_grad"] = float(np.sqrt(np.median(mean_sq[lo:hi])))
        rows.append(row)
    return rows


def _ps_statistics(run_dir: Path) -> tuple[int, dict, list[np.ndarray], str]:
    """(generation, manifest, the statistic of each ps shard, its name) of the newest
    complete checkpoint."""
    gen, manifest = runfiles.checkpoint_generation(run_dir)
    name = next((s for s in STATISTICS
                 if runfiles.has_dataset(run_dir, gen, manifest, f"opt/{s}")), None)
    if name == "G" and runfiles.has_dataset(run_dir, gen, manifest, "opt/v") and not any(
            int(n) for n in runfiles.ps_arrays(run_dir, gen, manifest, "opt/n")):
        name = "v"          # adagrad_rmsprop_updates: still in the RMSProp steps
    if name is None:
        raise DiagnoseError(f"{run_dir}: the ps optimiser keeps no per-parameter statistic "
                            "(RMSProp v or AdaGrad G) to inspect")
    return gen, manifest, runfiles.ps_arrays(run_dir, gen, manifest, f"opt/{name}"), name


def _adagrad_parts(run_dir: Path, gen: int, manifest: dict, G: list[np.ndarray], eps: float,
                   warmup: int):
    """AdaGrad, from the shards' ``G``: (each parameter's own G - G0, its floor G0 + eps, its
    own mean squared gradient per update, True) from a checkpoint that saved the warm start G0
    (per parameter, or one number per shard in older ones) and the update count n; (G, eps,
    G / (t0 + n), False) from one that saved n only; None from older ones."""
    if not runfiles.has_dataset(run_dir, gen, manifest, "opt/n"):
        return None
    n = [int(k) for k in runfiles.ps_arrays(run_dir, gen, manifest, "opt/n")]
    if not runfiles.has_dataset(run_dir, gen, manifest, "opt/G0"):
        mean_sq = np.concatenate([g / max(k + warmup, 1) for g, k in zip(G, n)])
        return np.concatenate(G), eps, mean_sq, False
    G0 = [np.broadcast_to(np.asarray(x, np.float64), g.shape)
          for x, g in zip(runfiles.ps_arrays(run_dir, gen, manifest, "opt/G0"), G)]
    own = [g - g0 for g, g0 in zip(G, G0)]
    floor = np.concatenate([g0 + eps for g0 in G0])
    mean_sq = np.concatenate([o / max(k, 1) for o, k in zip(own, n)])
    return np.concatenate(own), floor, mean_sq, True


def _tensors(cfg) -> list[tuple[str, int]]:
    from hpcrl.envs import env_spec
    from hpcrl.rl.networks import build_network

    net = build_network(cfg, *env_spec(cfg))
    return [(n, p.numel()) for n, p in net.named_parameters()]


def diagnose_run(run_dir: str | Path) -> dict:
    """The report of ``python -m hpcrl.diagnose`` as a dict (see ``zero_fractions``)."""
    run_dir = Path(run_dir)
    cfg = runfiles.load_run_config(run_dir)
    gen, manifest, shards, name = _ps_statistics(run_dir)
    stat = np.concatenate(shards, axis=-1)
    tensors = _tensors(cfg)
    floor, mean_sq, warm = cfg.optim_eps, None, False
    parts = (_adagrad_parts(run_dir, gen, manifest, shards, cfg.optim_eps,
                            cfg.adagrad_warmup_updates) if name == "G" else None)
    if parts is not None:
        stat, floor, mean_sq, warm = parts
    report = {"run_dir": str(run_dir), "generation": gen, "frames": int(manifest["frames"]),
              "algo": cfg.algo, "game": cfg.game, "optimizer": cfg.optimizer, "statistic": name,
              "optim_eps": cfg.optim_eps, "warm_start": warm,
              "tensors": zero_fractions(tensors, stat, floor, mean_sq)}
    return report


def format_text(report: dict) -> str:
    lines = [f"{report['run_dir']}: {report['algo']} on {report['game']}, checkpoint generation "
             f"{report['generation']} at {report['frames']:,} frames",
             f"share of parameters whose {report['optimizer']} statistic {report['statistic']} "
             f"is 0 ({WHAT_ZERO_MEANS[report['statistic']]}; a bias at 0 is a dead unit):"]
    width = max(len(r["name"]) for r in report["tensors"])
    eps = report.get("optim_eps")
    if report.get("warm_start"):
        lines.append("  (AdaGrad warm start G0: the statistic below is each parameter's own "
                     "G - G0, and it is adaptive where that passes its G0 + eps)")
        head = (f"  {'':<{width}} {'parameters':>12} {'at 0':>8}   above G0 + eps  "
                f"median sqrt(stat)   median sqrt(G0 + eps)")
    elif eps is not None:
        head = (f"  {'':<{width}} {'parameters':>12} {'at 0':>8}   above eps {eps:g} "
                f"(adaptive)   median sqrt(stat) vs sqrt(eps) {eps ** 0.5:.3g}")
    if eps is not None:
        if "median_rms_grad" in report["tensors"][0]:
            head += "   median rms gradient per update"
        lines.append(head)
    for r in report["tensors"]:
        line = f"  {r['name']:<{width}} {r['size']:>12,} {100 * r['fraction']:6.1f} %"
        if "median_sqrt_floor" in r:
            line += (f"   {100 * r['above_eps']:6.1f} %       {r['median_sqrt_stat']:<17.3g}"
                     f"   {r['median_sqrt_floor']:<21.3g}")
        elif "above_eps" in r:
            line += f"   {100 * r['above_eps']:6.1f} %{'':14}   {r['median_sqrt_stat']:<36.3g}"
        if "median_rms_grad" in r:
            line += f"   {r['median_rms_grad']:.3g}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcrl.diagnose", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", help="a run directory (holds config.toml and checkpoints/)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("--probe", type=int, default=0, metavar="AGENT_STEPS",
                   help="also play this many agent steps of the run's game with the "
                        "checkpoint's network: ReLU units off, LSTM cell saturation "
                        "(hpcrl.tools.probe)")
    p.add_argument("--probe-envs", type=int, default=8, metavar="N",
                   help="--probe: environments stepped together (default 8)")
    args = p.parse_args(argv)
    if args.probe < 0 or args.probe_envs < 1:
        p.error("--probe takes agent steps >= 0 and --probe-envs environments >= 1")
    try:
        try:
            report = diagnose_run(args.run_dir)
        except DiagnoseError as exc:       # SGD or momentum at the ps: the probe still reads
            if not args.probe:
                raise
            print(f"hpcrl.diagnose: {exc}; the probe follows", file=sys.stderr)
            report = {}
        if args.probe:
            from hpcrl.tools.probe import probe_run

            report["probe"] = probe_run(args.run_dir, args.probe, args.probe_envs)
    except (DiagnoseError, runfiles.RunFilesError, ckpt.CheckpointError, OSError) as exc:
        print(f"hpcrl.diagnose: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        sys.stdout.write(json.dumps(report) + "\n")
        return 0
    if "tensors" in report:
        sys.stdout.write(format_text(report))
    if "probe" in report:
        from hpcrl.tools.probe import format_probe

        sys.stdout.write(format_probe(report["probe"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
