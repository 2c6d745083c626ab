"""Batched environments: Atari (ale-py), gymnasium classic control and continuous control
(MuJoCo) behind one interface.

Atari preprocessing is the standard DQN one (Mnih et al. 2015, "Human-level control through
deep reinforcement learning", Methods), also used by Gorila (Nair et al. 2015) and A3C
(Mnih et al. 2016):

* frame skip 4: the agent picks an action every 4th emulator frame and the action repeats;
* the observed frame is the pixel-wise max of the last two emulator frames of the skip
  (removes the flicker of sprites drawn on alternate frames);
* grayscale (ALE's luminance palette), resized to 84x84 with a box filter (`resize_84x84`);
* the agent sees a stack of the 4 newest frames (newest last); at reset the stack is zeros
  plus the first frame, so no frame of the previous episode leaks in;
* each episode starts with U{0..noop_max} no-op emulator frames (noop_max=30), the
  "no-op starts" evaluation protocol;
* episodes are cut at 108,000 emulator frames (30 minutes of play);
* for training only: rewards clipped to [-1, 1] and the loss of a life is a terminal
  transition (the game goes on; only the bootstrap is cut). Unclipped returns of whole games
  are always reported;
* optional sticky actions (repeat the previous action with probability 0.25 at every emulator
  frame, Machado et al. 2018, "Revisiting the ALE"), off by default as in the 2015/2016 papers.

Backend choice (measured on this project's 2-core machine, Pong, random actions, one core, CPU
time of the whole process; the other core was busy with other work, so +-10 %):

====================================================  =========  ==========
backend                                               1 env      8 envs
====================================================  =========  ==========
ale_py.ALEInterface driven from Python (this module)  2.75 k/s   3.0 k/s
ale_py.vector_env.AtariVectorEnv, num_threads=1       2.75 k/s   3.15 k/s
====================================================  =========  ==========

(agent steps/s; one agent step = 4 emulator frames). Emulation is about 60 % of a step
(~37-55 us per emulator frame), so the backends differ little. The direct driver is kept: it
ties with one env per actor (the Gorila and A3C layouts), runs on the calling thread (the
vector env adds a worker thread, and `num_threads=0` would start one per core), gives exact
control of the semantics above (life-loss terminals that do not reset the game, the frame
before an auto-reset, exact episode frame counts when a game ends inside a frame skip) and can
save and restore complete emulator states with their RNGs (`get_state`), which the vector env
cannot. `gymnasium.wrappers.AtariPreprocessing` needs OpenCV, which is not installed.

Importing this module does not import torch (parameter-server and replay ranks stay small).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcrl.envs.atari import AtariEnv, resize_84x84
from hpcrl.envs.base import StepResult
from hpcrl.envs.classic import ClassicControlEnv
from hpcrl.envs.continuous import ContinuousControlEnv
from hpcrl.games import resolve_game_id

if TYPE_CHECKING:
    from hpcrl.config import Config

__all__ = ["StepResult", "AtariEnv", "ClassicControlEnv", "ContinuousControlEnv", "make_env",
           "make_env_from_config",
           "env_spec", "resize_84x84"]


def make_env(game: str, num_envs: int, seed: int, *, training: bool, frame_skip: int = 4,
             stack: int = 4, noop_max: int = 30, sticky_prob: float = 0.0,
             max_episode_frames: int = 108_000, clip_rewards: bool = True,
             terminal_on_life_loss: bool = True
             ) -> AtariEnv | ClassicControlEnv | ContinuousControlEnv:
    """Build N environments of one game with DQN preprocessing (see the module docstring).

    Args:
        game: ale-py ROM id (``pong``, ``space_invaders``; ``Pong`` and ``ALE/Pong-v5`` work
            too), a classic-control id (``CartPole-v1``, ``Acrobot-v1``) or a
            continuous-control one (``HalfCheetah-v5``, ``Pendulum-v1``).
        num_envs: environments stepped together (one batched forward pass per step).
        seed: seeds every emulator, the no-op starts and sticky actions; different ranks
            should pass different seeds.
        training: enables reward clipping and life-loss terminals (if their flags are set);
            evaluation envs pass False.
        frame_skip: emulator frames per agent step (Atari only).
        stack: frames per observation (Atari only).
        noop_max: most no-op frames at the start of an episode (Atari only).
        sticky_prob: probability of repeating the previous action at each emulator frame
            (Machado et al. 2018 use 0.25; Atari only).
        max_episode_frames: episode cap in emulator frames (108,000 = 30 min of play).
        clip_rewards: clip training rewards to [-1, 1] (only when training).
        terminal_on_life_loss: a lost life is a training terminal (only when training).

    Raises:
        ValueError: unknown game id (the message says how to list the valid ones).
    """
    kind, game_id = resolve_game_id(game)
    if kind == "classic":
        return ClassicControlEnv(game_id, num_envs, seed, training=training,
                                 max_episode_frames=max_episode_frames, clip_rewards=clip_rewards)
    if kind == "continuous":
        return ContinuousControlEnv(game_id, num_envs, seed, training=training,
                                    max_episode_frames=max_episode_frames,
                                    clip_rewards=clip_rewards)
    return AtariEnv(game_id, num_envs, seed, training=training, frame_skip=frame_skip, stack=stack,
                    noop_max=noop_max, sticky_prob=sticky_prob, max_episode_frames=max_episode_frames,
                    clip_rewards=clip_rewards, terminal_on_life_loss=terminal_on_life_loss)


def env_kwargs(cfg: "Config", training: bool) -> dict:
    """`make_env`'s keyword arguments from a run's config."""
    return dict(training=training, frame_skip=cfg.frame_skip, stack=cfg.frame_stack,
                noop_max=cfg.noop_max, sticky_prob=cfg.sticky_prob,
                max_episode_frames=cfg.max_episode_frames, clip_rewards=cfg.clip_rewards,
                terminal_on_life_loss=cfg.terminal_on_life_loss)


def make_env_from_config(cfg: "Config", num_envs: int, seed: int, training: bool
                         ) -> AtariEnv | ClassicControlEnv:
    """The run's game with the run's preprocessing (training or evaluation settings)."""
    return make_env(cfg.game, num_envs, seed, **env_kwargs(cfg, training))


def env_spec(cfg: "Config") -> tuple[tuple[int, ...], int]:
    """(observation shape, number of actions) of the run's game."""
    env = make_env_from_config(cfg, 1, cfg.seed, training=False)
    spec = (tuple(env.obs_shape), int(env.num_actions))
    env.close()
    return spec
