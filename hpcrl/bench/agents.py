"""``python -m hpcrl.bench actor|learner|scaling|checkpoint``: the agents' benchmarks, each
comparing the real code path with its bound measured in the same process or run:
:mod:`.components` (actor, learner, checkpoint), :mod:`.a3c` (A3C scaling and batched
actor-learners), :mod:`.gorila` (the Gorila job against its compute bound); the last two run
real jobs through :mod:`.jobs`."""

from __future__ import annotations

import argparse


def main(what: str, argv: list[str]) -> dict:
    from hpcrl.bench.a3c import bench_batched, bench_scaling
    from hpcrl.bench.components import bench_actor, bench_checkpoint, bench_learner
    from hpcrl.bench.gorila import bench_gorila_scaling

    p = argparse.ArgumentParser(prog=f"python -m hpcrl.bench {what}")
    p.add_argument("--game", default="pong")
    p.add_argument("--steps", type=int, default=400, help="actor: agent steps per block")
    p.add_argument("--updates", type=int, default=20, help="learner: updates per block")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--fill", type=int, default=5000, help="learner: replay transitions")
    p.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                   help="learner: the learner's learner_precision (the plain loop: float32)")
    p.add_argument("--algo", default="a3c", help="scaling: algorithm (its <algo>_pong config)")
    p.add_argument("--seconds", type=float, default=60.0, help="scaling: measured window")
    p.add_argument("--warmup", type=float, default=15.0, help="scaling: seconds skipped")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="scaling: config overrides for both jobs (e.g. optimizer=sgd)")
    p.add_argument("--launcher-args", default="",
                   help="scaling: extra mpiexec arguments, e.g. '-bind-to core'")
    p.add_argument("--envs-per-actor", type=int, default=1,
                   help="scaling: > 1 compares actor-learners stepping this many environments "
                   "each with one environment each (same layout, same run)")
    p.add_argument("--actor-learners", type=int, default=2,
                   help="scaling with --envs-per-actor: actor-learner ranks per job")
    p.add_argument("--ranks", type=int, default=3,
                   help="scaling --algo gorila: ranks of the job (default 3: 1 ps + 2 bundles)")
    p.add_argument("--runs", type=int, default=1,
                   help="scaling --algo gorila: jobs, each between two timings of the bound")
    p.add_argument("--transitions", type=int, default=100_000, help="checkpoint: replay size")
    p.add_argument("--dir", default=None, help="checkpoint: where to write (default: tmp)")
    args = p.parse_args(argv)
    if what == "checkpoint":
        return bench_checkpoint(args.transitions, args.dir)
    if what == "scaling" and args.algo == "gorila":
        return bench_gorila_scaling(args.ranks, args.runs, args.seconds, args.warmup, args.set,
                                    args.launcher_args.split())
    if what == "scaling" and args.envs_per_actor > 1:
        return bench_batched(args.algo, args.envs_per_actor, args.actor_learners, args.seconds,
                             args.warmup, args.set, args.launcher_args.split())
    if what == "scaling":         # one environment per actor-learner, whatever the config says
        return bench_scaling(args.algo, args.seconds, args.warmup,
                             ["envs_per_actor=1", *args.set], args.launcher_args.split())
    if what == "actor":
        return bench_actor(args.game, args.steps, args.blocks)
    if what == "learner":
        return bench_learner(args.game, args.updates, args.blocks, args.fill, args.precision)
    raise SystemExit(f"unknown benchmark {what!r}: choose ps, actor or learner")
