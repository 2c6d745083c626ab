"""A trained network outside the training job: rebuilt from a run's checkpoint, exported as a
plain torch ``state_dict`` with a JSON description, and loaded back.

    policy = policy_from_run("results/a3c/pong/seed-0")      # newest complete checkpoint
    export_torch(policy, "pong.pt")                          # pong.pt + pong.json
    policy = hpcrl.load_policy("pong.pt")                    # torch.load(weights_only=True)
    actions = policy.act(obs)                                # obs [N, *obs_shape]

``act`` follows the evaluation protocol of the run's algorithm (Mnih et al. 2015, Methods;
Mnih et al. 2016, §5): Q-networks act epsilon-greedily (``epsilon``, by default the run's
``eval_epsilon``), A3C samples from its softmax policy (``greedy=True`` takes the most probable
action), or acts with its Gaussian policy's mean on a continuous task, and carries its LSTM
state from call to call until ``episode_end``. Observations are
what the run's environment produces: for Atari [N, 4, 84, 84] uint8 (grayscale, max over the
last two of each 4 frames, stacked; the network divides by 255), for CartPole the raw state.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hpcrl.version import __version__
from hpcrl.config import Config, ConfigError, loads_config, to_toml
from hpcrl.games import continuous_id
from hpcrl.rl.acting import ActorCriticPolicy, FixedEpsilonPolicy, GaussianPolicy
from hpcrl.rl.networks import build_network
from hpcrl.runtime.params.layout import ParamLayout
from hpcrl.tools import runfiles

FORMAT = "hpcrl-policy"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Source:
    """Where the weights came from."""

    run_dir: str
    generation: int
    frames: int


class GreedyActorCriticPolicy(ActorCriticPolicy):
    """A3C's most probable action instead of a sample (the LSTM state carried the same way)."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits, _, self.state = self.forward(torch.from_numpy(obs), self.state)
        return np.argmax(logits.numpy(), axis=1)


class Policy:
    """A network with the run's acting rule (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, cfg: Config, obs_shape: tuple[int, ...],
                 action_ids: list[int], source: Source | None = None, *,
                 epsilon: float | None = None, greedy: bool = False, seed: int = 0):
        self.module, self.config = module.eval(), cfg
        self.obs_shape, self.action_ids, self.source = tuple(obs_shape), list(action_ids), source
        self.epsilon = cfg.eval_epsilon if epsilon is None else float(epsilon)
        self.greedy = greedy
        self.rng = np.random.default_rng(seed)
        self._acting, self._batch = None, 0

    @property
    def num_actions(self) -> int:
        return len(self.action_ids)

    @property
    def state(self):
        """The LSTM state (h, c), or None."""
        return self._acting.state if self._acting is not None else None

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Actions [N] (indices into ``action_ids``), or [N, D] floats for a continuous task,
        for observations [N, *obs_shape], by the evaluator's rules
        (:func:`hpcrl.agents.evaluation.evaluation_policy`)."""
        obs = np.ascontiguousarray(obs)
        if obs.shape[1:] != self.obs_shape:
            raise ValueError(f"observations must have shape [N, {', '.join(map(str, self.obs_shape))}]"
                             f", got {list(obs.shape)}")
        if self._batch != len(obs):                    # first call, or another batch size
            self._acting, self._batch = self._acting_rule(len(obs)), len(obs)
        return np.asarray(self._acting.act(obs))

    @property
    def continuous(self) -> bool:
        """Whether actions are float vectors [N, D] (a Gaussian policy) rather than indices."""
        return continuous_id(self.config.game) is not None

    def _acting_rule(self, num_envs: int):
        if self.config.algo != "a3c":
            return FixedEpsilonPolicy(self.module, self.epsilon, self.rng)
        if self.continuous:
            return GaussianPolicy(self.module, num_envs, self.rng, use_mean=True)
        kind = GreedyActorCriticPolicy if self.greedy else ActorCriticPolicy
        return kind(self.module, num_envs, self.rng)

    def episode_end(self, end: np.ndarray) -> None:
        """Zero the LSTM state of the environments whose episode ended."""
        if self._acting is not None:
            self._acting.episode_end(np.asarray(end, bool))

    def metadata(self) -> dict:
        """The JSON written beside an exported ``state_dict``: enough to use it elsewhere."""
        cfg = self.config
        meta = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "hpcrl_version": __version__,
            "algo": cfg.algo, "game": cfg.game, "lstm": cfg.lstm,
            "network": "actor-critic" if cfg.algo == "a3c" else "q",
            "obs_shape": list(self.obs_shape), "num_actions": self.num_actions,
            "action_ids": self.action_ids,
            "acting": ("the mean of the Gaussian policy: float actions [N, num_actions], "
                       "clipped to the task's bounds by its environment" if self.continuous else
                       "sample from softmax(logits); greedy: argmax" if cfg.algo == "a3c" else
                       f"epsilon-greedy on Q, epsilon {self.epsilon}"),
            "preprocessing": ({
                "frame_skip": cfg.frame_skip, "frame_stack": cfg.frame_stack,
                "frame": "grayscale, max of the last two frames of each skip, 84x84 (area), "
                         "uint8; the network divides by 255",
                "noop_max": cfg.noop_max, "sticky_prob": cfg.sticky_prob,
                "max_episode_frames": cfg.max_episode_frames,
            } if len(self.obs_shape) == 3 else {
                "observation": "the environment's state vector, float32, unscaled" + (
                    "; the network normalises it with the running statistics in its "
                    "obs_norm buffers: clip((x - mean) / sqrt(m2 / count + 1e-8), "
                    f"-{cfg.obs_norm_clip:g}, {cfg.obs_norm_clip:g})"
                    if cfg.obs_norm else ""),
                "max_episode_frames": cfg.max_episode_frames,
            }),
            "parameters": {n: list(p.shape) for n, p in self.module.named_parameters()},
            "config_toml": to_toml(cfg),
        }
        if self.source is not None:
            meta["source"] = vars(self.source)
        return meta


def _build(cfg: Config) -> tuple[torch.nn.Module, tuple[int, ...], list[int]]:
    from hpcrl.envs import make_env_from_config

    env = make_env_from_config(cfg, 1, cfg.seed, training=False)
    obs_shape, action_ids = tuple(env.obs_shape), env.action_ids
    env.close()
    return build_network(cfg, obs_shape, len(action_ids)), obs_shape, action_ids


def policy_from_run(run_dir: str | Path, generation: int | None = None, *, target: bool = False,
                    **acting) -> Policy:
    """The network of a run's checkpoint generation (the newest complete one by default).

    Args:
        target: the target network's parameters (Gorila's theta-) instead of the online ones.
        acting: ``epsilon``, ``greedy``, ``seed`` of :class:`Policy`.

    Raises:
        runfiles.RunFilesError: not a run directory, no such generation, a damaged file.
    """
    run_dir = Path(run_dir)
    cfg = runfiles.load_run_config(run_dir)
    if target and cfg.algo == "a3c":
        raise runfiles.RunFilesError(f"{run_dir}: A3C has no target network (its target rows "
                                     "hold the initial weights); leave out --target")
    gen, manifest = runfiles.checkpoint_generation(run_dir, generation)
    flat = runfiles.ps_array(run_dir, gen, manifest, "target" if target else "params")
    net, obs_shape, action_ids = _build(cfg)
    layout = ParamLayout.from_module(net)
    if flat.shape != (layout.size,):
        raise runfiles.RunFilesError(f"{run_dir}: generation {gen} holds {flat.size} parameters, "
                                     f"the run's network {layout.size}")
    layout.from_flat(net, np.ascontiguousarray(flat, np.float32))
    _load_obs_statistics(net, run_dir, gen, manifest)
    return Policy(net, cfg, obs_shape, action_ids, Source(str(run_dir), gen,
                                                          int(manifest["frames"])), **acting)


def _load_obs_statistics(net: torch.nn.Module, run_dir: Path, gen: int, manifest: dict) -> None:
    """obs_norm: the first actor-learner's observation statistics of the generation (each
    actor-learner keeps its own, from the same distribution; :mod:`hpcrl.rl.obs_norm`)."""
    from hpcrl.rl.obs_norm import find_obs_normalizer

    normalizer = find_obs_normalizer(net)
    if normalizer is None:
        return
    state = runfiles.first_rank_group(run_dir, gen, manifest, "actor-learner", "obs_norm")
    if state is None:
        raise runfiles.RunFilesError(f"{run_dir}: generation {gen} holds no observation "
                                     "statistics (obs_norm) for the run's network")
    normalizer.set_state(state)


def metadata_path(weights: Path) -> Path:
    return Path(weights).with_suffix(".json")


def export_torch(policy: Policy, path: str | Path) -> tuple[Path, Path]:
    """Write ``path`` (``torch.save`` of the ``state_dict``: tensors only) and the metadata JSON
    beside it (same name, ``.json``). Returns both paths."""
    path = Path(path)
    if path.suffix == ".json":
        raise ValueError(f"{path}: the weights file must not end in .json (its metadata does)")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().clone() for k, v in policy.module.state_dict().items()}, path)
    meta = metadata_path(path)
    meta.write_text(json.dumps({**policy.metadata(), "weights": path.name}, indent=1) + "\n")
    return path, meta


class PolicyFileError(RuntimeError):
    """An exported policy that cannot be loaded (one line: which file and why)."""


def load_policy(path: str | Path, **acting) -> Policy:
    """An exported policy (``path`` is the weights file or its JSON). Reads JSON and
    ``torch.load(weights_only=True)`` only: nothing in the files executes code.

    Args:
        acting: ``epsilon``, ``greedy``, ``seed`` of :class:`Policy`.
    """
    path = Path(path)
    meta_file = path if path.suffix == ".json" else metadata_path(path)
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as exc:
        raise PolicyFileError(f"{meta_file}: unreadable policy metadata ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or \
            meta.get("format_version") != FORMAT_VERSION:
        raise PolicyFileError(f"{meta_file}: not an {FORMAT} v{FORMAT_VERSION} file")
    weights = path if path.suffix != ".json" else meta_file.with_name(
        Path(str(meta.get("weights", meta_file.with_suffix(".pt").name))).name)
    try:
        cfg = loads_config(meta["config_toml"], str(meta_file))
        obs_shape, action_ids = tuple(meta["obs_shape"]), list(meta["action_ids"])
        net = build_network(cfg, obs_shape, int(meta["num_actions"]))
        src = Source(**meta["source"]) if meta.get("source") else None
    except ConfigError as exc:
        raise PolicyFileError(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyFileError(f"{meta_file}: incomplete policy metadata ({exc!r})") from None
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        net.load_state_dict(state)
    except (OSError, RuntimeError, ValueError, TypeError, EOFError, AttributeError,
            pickle.UnpicklingError) as exc:
        raise PolicyFileError(f"{weights}: cannot load the weights ({exc})".splitlines()[0]) \
            from None
    return Policy(net, cfg, obs_shape, action_ids, src, **acting)
