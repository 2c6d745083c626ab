"""Watch a trained agent: play evaluation episodes with a run's checkpointed network.

    python -m hpcrl.play RUN_DIR [--episodes N] [--video out.mp4|out.gif] [--generation G]
                                 [--epsilon E] [--greedy] [--seed S] [--target]

One process, no MPI. Reads the newest complete checkpoint generation (or ``--generation``),
rebuilds the network and plays with the evaluation settings of the run's config: no reward
clipping, no life-loss terminals, up to ``noop_max`` no-op frames at each start, the episode cap
(Mnih et al. 2015, Methods). Q methods act epsilon-greedily at the run's ``eval_epsilon``
(``--epsilon`` to change it), A3C samples from its policy (``--greedy``: argmax), its LSTM state
reset at each episode. Prints each episode's return and length, their mean, and the run's own
final evaluation from ``metrics.h5`` when it has one; ``--video`` writes every agent step's
colour screen (the ``video`` extra: ``pip install 'hpcrl[video]'``).

Exit status: 0, or 1 with one line on stderr (not a run directory, no such generation, a
missing extra, a video path that cannot be written).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass
class Episode:
    """One played episode: its unclipped return, its length and what the agent saw and did."""

    episode_return: float
    frames: int
    agent_steps: int
    observations: list[np.ndarray] = field(default_factory=list, repr=False)
    actions: list = field(default_factory=list, repr=False)   # ints, or float lists (continuous)


def play(policy, env, episodes: int, *, on_frame=None, keep_observations: bool = False
         ) -> list[Episode]:
    """Play ``episodes`` episodes of ``env`` (one environment) with ``policy``.

    Args:
        on_frame: called with the colour screen before the first step and after every step.
        keep_observations: keep each step's observation and action (tests compare them).
    """
    obs, out = env.reset(), []
    steps, seen, acts = 0, [], []
    if on_frame:
        on_frame(env.render_rgb(0))
    while len(out) < episodes:
        action = policy.act(obs)
        if keep_observations:
            seen.append(obs[0].copy())
            acts.append(action[0].tolist() if np.ndim(action[0]) else int(action[0]))
        res = env.step(action)
        steps += 1
        policy.episode_end(res.episode_end)
        if on_frame:
            on_frame(env.render_rgb(0))
        if res.episode_end[0]:
            out.append(Episode(float(res.episode_return[0]), int(res.episode_frames[0]), steps,
                               seen, acts))
            steps, seen, acts = 0, [], []
        obs = res.obs
    return out


def run_final_evaluation(run_dir) -> str:
    """The run's own final evaluation (``metrics.h5`` group ``final``) as one line, or ""
    when the run has none (still running, preempted, or older than the group)."""
    from pathlib import Path

    from hpcrl.io.metrics import MetricsError, read_metrics

    try:
        final = read_metrics(Path(run_dir) / "metrics.h5")["final"]
    except MetricsError:
        return ""
    if not final["return"].size:
        return ""
    returns = final["return"]
    return (f"the run's final evaluation (metrics.h5): mean return {returns.mean():g} over "
            f"{returns.size} episodes at {int(final['frames'].max()):,} frames (min "
            f"{returns.min():g}, max {returns.max():g})")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hpcrl.play", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", help="a run directory (holds config.toml and checkpoints/)")
    p.add_argument("--episodes", type=int, default=1, help="episodes to play (default 1)")
    p.add_argument("--video", help="write the episodes as out.mp4 or out.gif")
    p.add_argument("--generation", type=int, help="checkpoint generation (default: newest)")
    p.add_argument("--epsilon", type=float, help="Q methods: epsilon (default: eval_epsilon)")
    p.add_argument("--greedy", action="store_true", help="A3C: argmax instead of sampling")
    p.add_argument("--seed", type=int, default=0, help="environment and action seed (default 0)")
    p.add_argument("--target", action="store_true", help="the target network's parameters")
    args = p.parse_args(argv)
    if args.episodes < 1:
        p.error("--episodes must be >= 1")
    if args.epsilon is not None and not 0.0 <= args.epsilon <= 1.0:
        p.error("--epsilon must lie in [0, 1]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from hpcrl.envs import env_kwargs, make_env
    from hpcrl.tools.policy import policy_from_run
    from hpcrl.tools.runfiles import RunFilesError
    from hpcrl.tools.video import VideoError, VideoWriter, check_video_path

    try:
        video = check_video_path(args.video) if args.video else None
        policy = policy_from_run(args.run_dir, args.generation, target=args.target,
                                 epsilon=args.epsilon, greedy=args.greedy, seed=args.seed)
        cfg, src = policy.config, policy.source
        print(f"{cfg.algo} on {cfg.game}: {args.run_dir}, checkpoint generation "
              f"{src.generation} at {src.frames:,} frames", flush=True)
        env = make_env(cfg.game, 1, args.seed, **env_kwargs(cfg, training=False))
        writer = None
        if video is not None:                       # play() renders right after the reset:
            writer = VideoWriter(video, env.render_fps)   # a missing renderer fails at once
        played = play(policy, env, args.episodes, on_frame=writer.append if writer else None)
        for i, ep in enumerate(played, 1):
            print(f"episode {i}: return {ep.episode_return:g}, {ep.frames:,} frames "
                  f"({ep.agent_steps:,} agent steps)", flush=True)
        if len(played) > 1:
            returns = [ep.episode_return for ep in played]
            print(f"mean return {np.mean(returns):g} over {len(played)} episodes "
                  f"(min {min(returns):g}, max {max(returns):g})")
        line = run_final_evaluation(args.run_dir)
        if line:
            print(line)
        if writer is not None:
            writer.close()
            print(f"video: {video} ({writer.frames} frames at {env.render_fps:g} fps)")
        env.close()
    except (RunFilesError, VideoError, OSError) as exc:
        print(f"hpcrl.play: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:                      # gymnasium's renderer without pygame
        print(f"hpcrl.play: {exc}; pip install 'hpcrl[video]'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
