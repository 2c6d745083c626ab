"""``python -m hpcrl.bench ps|actor|learner|scaling|checkpoint|gradient|env``: benchmarks that
print their figures, the last line of each one JSON object (see :mod:`hpcrl.bench`)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from hpcrl.bench.ps import NATURE_DQN_FLOATS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcrl.bench")
    sub = p.add_subparsers(dest="what", required=True)
    ps = sub.add_parser("ps", help="parameter store vs raw RMA (run under mpiexec -n 4)")
    ps.add_argument("--floats", type=int, default=NATURE_DQN_FLOATS)
    ps.add_argument("--reps", type=int, default=30)
    ps.add_argument("--idle-s", type=float, default=10.0)
    ps.add_argument("--optimizer", default="adagrad")
    sub.add_parser("actor", help="one Gorila actor on Pong vs env step + forward",
                   add_help=False)
    sub.add_parser("learner", help="Gorila learner vs a pure torch loop", add_help=False)
    sub.add_parser("scaling", help="A3C frames/s with 1 and 2 actor-learners", add_help=False)
    sub.add_parser("checkpoint", help="one bundle's checkpoint write/read, Pong replay",
                   add_help=False)
    grad = sub.add_parser("gradient", help="the A3C (n-step Q, A3C LSTM) rollout gradient against "
                          "its variants")
    grad.add_argument("--algo", choices=("a3c", "n_step_q", "a3c_lstm"), default="a3c")
    grad.add_argument("--blocks", type=int, default=7)
    grad.add_argument("--reps", type=int, default=20)
    env = sub.add_parser("env", help="the Atari environment step with the C and the numpy + PIL preprocessing")
    env.add_argument("--envs", type=int, default=8)
    env.add_argument("--steps", type=int, default=200, help="batched steps per block")
    env.add_argument("--blocks", type=int, default=7)
    args, rest = p.parse_known_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.what == "ps":
        from hpcrl.bench.ps import bench_ps

        result = bench_ps(args.floats, args.reps, args.idle_s, args.optimizer)
    elif args.what == "env":
        from hpcrl.bench.envstep import bench_env_step

        result = bench_env_step(args.envs, args.steps, args.blocks)
    elif args.what == "gradient":
        from hpcrl.bench import gradient

        bench = {"a3c": gradient.bench_gradient, "n_step_q": gradient.bench_value_gradient,
                 "a3c_lstm": gradient.bench_lstm_gradient}[args.algo]
        result = bench(args.blocks, args.reps)
    else:
        from hpcrl.bench import agents

        result = agents.main(args.what, rest)
    if result is not None:
        for k, v in result.items():
            if k != "bench":
                print(f"{k:>24}: {v:.4g}" if isinstance(v, float) else f"{k:>24}: {v}")
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
