"""Typed, frozen run configuration read from flat TOML files.

One flat table of fields, as dopamine's gin files and dqn_zoo's flags are flat: every field has one
comment (its ``doc``) that states its unit. Two time units are used and never mixed:

* **frames**: Atari emulator frames (4 per agent step with the standard frame skip). Budgets,
  schedules and reporting follow Mnih et al. 2015 / dqn_zoo and count frames.
* **agent steps**: one action chosen by an agent (one environment step after frame skip).
  Sync periods and rollout lengths count agent steps. For classic-control tasks one agent step is
  one frame.

Validation happens before MPI does any communication and before torch is imported, so a bad
config fails on every rank within a second with one line that names the file and the key.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALGOS = ("gorila", "one_step_q", "one_step_sarsa", "n_step_q", "a3c")
MODES = ("bundled", "split")
OPTIMIZERS = ("sgd", "momentum", "adagrad", "rmsprop_shared", "rmsprop_per_client",
              "adam_shared")


class ConfigError(ValueError):
    """A config problem, reported as one line that names the file and the key."""


def _f(default: Any, doc: str, *, lo: float | None = None, hi: float | None = None,
       gt: float | None = None, choices: tuple | None = None) -> Any:
    """A field with its doc and its allowed values: ``lo <= value <= hi``, ``value > gt``."""
    return field(default=default, metadata={"doc": doc, "lo": lo, "hi": hi, "gt": gt,
                                            "choices": choices})


@dataclass(frozen=True)
class Config:
    """All settings of one run. Field defaults: Gorila on Pong in bundled mode with the paper's
    update rule (Nair et al. 2015: AdaGrad, lr 0.0025, 1-step targets) and sizes for a small
    node; configs/gorila_paper.toml says which values are the paper's. The default job
    (``default_job_path()``) and each config file override some of them."""

    # --- what to run -------------------------------------------------------------------------
    algo: str = _f("gorila", "algorithm: gorila | one_step_q | one_step_sarsa | n_step_q | a3c",
                   choices=ALGOS)
    game: str = _f("pong", "ale-py ROM id (snake_case, e.g. space_invaders), CartPole-v1 / "
                   "Acrobot-v1, or a continuous-control task (HalfCheetah-v5, Pendulum-v1; "
                   "algo a3c only)")
    seed: int = _f(0, "base seed; rank r uses seed + 1000 * r", lo=0)
    total_frames: int = _f(50_000_000, "training budget in env frames, summed over all actors", lo=1)
    run_dir: str = _f("results/{algo}/{game}/seed-{seed}",
                      "run directory; {algo}, {game}, {seed} are substituted")

    # --- layout (see hpcrl.runtime.topology) -----------------------------------------------
    mode: str = _f("bundled", "bundled: actor+replay+learner per rank (Gorila's main setup); "
                   "split: separate actors, learners and global replay ranks", choices=MODES)
    n_ps: int = _f(0, "parameter-server ranks; 0 = derive from world size (30 per 130 ranks, >= 1)",
                   lo=0)
    n_actors: int = _f(0, "split mode: actor ranks; 0 = all ranks left over", lo=0)
    n_learners: int = _f(0, "split mode: learner ranks; 0 = all ranks left over", lo=0)
    n_replay: int = _f(1, "split mode: global replay ranks (capacity grows with their number)", lo=0)
    n_evaluators: int = _f(0, "evaluator ranks; 0 = actors evaluate between training episodes", lo=0)

    # --- environment -------------------------------------------------------------------------
    envs_per_actor: int = _f(1, "environments per actor rank, stepped with one batched forward",
                             lo=1, hi=256)
    frame_skip: int = _f(4, "env frames per agent step (Atari; max-pool over the last two)",
                         lo=1, hi=16)
    frame_stack: int = _f(4, "frames stacked into one observation (Atari)", lo=1, hi=16)
    noop_max: int = _f(30, "up to this many random no-op agent steps at episode start", lo=0)
    sticky_prob: float = _f(0.0, "sticky-action probability (0.25 in Machado et al. 2018)",
                            lo=0.0, hi=1.0)
    max_episode_frames: int = _f(108_000, "episode cap in env frames (30 minutes of play)", lo=1)
    clip_rewards: bool = _f(True, "clip training rewards to [-1, 1] (returns stay unclipped)")
    terminal_on_life_loss: bool = _f(True, "treat a lost life as terminal in training only")

    # --- learning (shared) -------------------------------------------------------------------
    gamma: float = _f(0.99, "discount factor", lo=0.0, hi=1.0)
    optimizer: str = _f("adagrad", "update rule applied by the ps ranks", choices=OPTIMIZERS)
    learning_rate: float = _f(0.0025, "learning rate (Gorila: AdaGrad; A3C: RMSProp)", lo=0.0)
    lr_anneal: bool = _f(False, "anneal the learning rate linearly to 0 over total_frames (Mnih 2016)")
    lr_anneal_frames: int = _f(0, "with lr_anneal: global frames over which the learning rate "
                               "reaches 0; 0 = total_frames", lo=0)
    lr_warmup_frames: int = _f(0, "global frames over which the learning rate rises linearly "
                               "from 0 (then anneals, with lr_anneal); not in the papers: the "
                               "first updates' large gradients move whole layers at once "
                               "(docs/experiments/a3c-lstm-pong.md); 0 = no warm-up", lo=0)
    rmsprop_decay: float = _f(0.99, "RMSProp decay of the squared-gradient average (adam_shared: "
                              "Adam's beta2, 0.999 in Kingma & Ba 2015)", lo=0.0, hi=1.0)
    optim_eps: float = _f(0.1, "epsilon inside AdaGrad / RMSProp square roots (0 would divide "
                          "by 0 wherever a parameter had no gradient yet)", gt=0.0)
    adagrad_warmup_updates: int = _f(0, "adagrad: start G at this many times each network "
                                     "tensor's mean squared first gradient, so that steps are about "
                                     "lr / sqrt(this + updates) per weight from the first one "
                                     "(0 = G starts at 0, as the paper; other optimizers "
                                     "ignore it)", lo=0)
    adagrad_rmsprop_updates: int = _f(0, "adagrad with adagrad_warmup_updates = t0: take this "
                                      "many bias-corrected RMSProp steps of lr / sqrt(t0) "
                                      "first, then start G at t0 times each tensor's mean of "
                                      "RMSProp's statistic, a warm start from the recent "
                                      "gradient scale rather than the first gradient (a "
                                      "variant, not the paper's rule; 0 = off)", lo=0)
    adagrad_rmsprop_start: str = _f("tensor", "with adagrad_rmsprop_updates, G's start: tensor "
                                    "(t0 times each tensor's mean of the statistic) or "
                                    "parameter (t0 times each parameter's own, so that the "
                                    "first AdaGrad step equals RMSProp's; its tensor's mean "
                                    "where a parameter had no gradient)",
                                    choices=("tensor", "parameter"))
    rmsprop_bias_correction: bool = _f(False, "rmsprop_shared: divide the statistic by "
                                       "1 - decay^t (Adam's correction), so that the first "
                                       "steps are not up to 10x the learning rate")
    rmsprop_initial: float = _f(0.0, "RMSProp's statistic v before the first step: 0 as "
                                "PyTorch's RMSprop; 1 as TensorFlow 1's RMSPropOptimizer (OpenAI "
                                "baselines' A2C), whose steps start at lr * g and grow e-fold "
                                "every ~200 steps (decay 0.99) as v falls to g^2, a warm-up over "
                                "the first thousands (not with rmsprop_bias_correction, which "
                                "assumes 0)", lo=0.0)
    momentum: float = _f(0.9, "momentum for optimizer = momentum (adam_shared: Adam's beta1, "
                         "the first moment's decay)", lo=0.0, hi=1.0)
    max_staleness: int = _f(50, "ps drops gradients computed from parameters this many updates old",
                            lo=0)
    target_update_every: int = _f(10_000, "the target network is refreshed every this many "
                                  "target_update_unit", lo=1)
    target_update_unit: str = _f("auto", "unit of target_update_every: updates (applied ps "
                                 "updates: Gorila's N; the period in agent steps then depends on "
                                 "the updates per agent step, e.g. split-mode learners vs actors) "
                                 "| agent_steps (global agent steps over all actors, the async "
                                 "methods' I_target; the same for every layout) | auto (Gorila "
                                 "updates, async methods agent_steps)",
                                 choices=("auto", "updates", "agent_steps"))

    # --- Gorila actor / learner / replay -----------------------------------------------------
    actor_sync_every: int = _f(16, "actor pulls behaviour parameters every this many acting "
                               "steps, each one agent step in every one of its envs_per_actor "
                               "environments (1 = Gorila paper: before every acting step)", lo=1)
    learner_sync_every: int = _f(1, "learner pulls parameters every this many updates", lo=1)
    replay_capacity: int = _f(300_000, "transitions per replay memory (local: per actor; "
                              "global: per replay rank); 300 k: 3 bundles hold 6.4 GB of Atari "
                              "replay on a 16 GB node; the papers: 1 M per actor "
                              "(configs/gorila_paper.toml)", lo=1)
    replay_min_fill: int = _f(50_000, "transitions in a replay memory before learning starts", lo=1)
    batch_size: int = _f(32, "minibatch size in transitions", lo=1)
    n_step: int = _f(1, "Gorila: learn from n-step returns sampled from replay (each stops at "
                     "a terminal, its episode's end or the newest step; 1 = DQN's one-step "
                     "target; 3 in Rainbow)", lo=1, hi=100)
    update_every: int = _f(4, "bundled mode: one learner update per this many agent steps "
                               "(summed over the bundle's envs_per_actor environments)", lo=1)
    split_update_every: int = _f(0, "split mode: the learners together apply at most one "
                                 "update per this many global agent steps, waiting for the "
                                 "actors (bundled mode's update_every, for comparing layouts "
                                 "at one replay ratio); 0 = learn as fast as they can (the "
                                 "paper)", lo=0)
    loss: str = _f("huber", "DQN loss on the TD error: huber | clip", choices=("huber", "clip"))
    learner_precision: str = _f("float32", "the gradient's forward and backward (Gorila's "
                                "learner, A3C feed-forward): float32 | bfloat16 (the torso, "
                                "convolutions and hidden layer, under CPU autocast; heads, "
                                "loss, gradient, parameters and acting stay float32)",
                                choices=("float32", "bfloat16"))
    learner_reuse_acting: bool = _f(True, "asynchronous methods with an image network (not "
                                    "LSTM, not Sarsa's carried-over first step): the rollout "
                                    "gradient reuses the acting passes' activations instead of "
                                    "a second forward over the rollout (the same gradient to "
                                    "float32 rounding; float32 learner only)")
    outlier_k: float = _f(5.0, "drop gradients whose |loss| > running mean + k std (Gorila); 0 = off",
                          lo=0.0)
    epsilon_start: float = _f(1.0, "initial exploration epsilon", lo=0.0, hi=1.0)
    epsilon_end: float = _f(0.1, "final exploration epsilon (Gorila / DQN)", lo=0.0, hi=1.0)
    epsilon_frames: int = _f(1_000_000, "frames (per actor) over which epsilon anneals", lo=1)
    network: str = _f("auto", "Q-network: auto (nature for images, mlp for vectors) | nature "
                      "(Mnih et al. 2015) | small (the asynchronous value methods' network: "
                      "conv 16 8x8/4, conv 32 4x4/2, fc 256) | mlp",
                      choices=("auto", "nature", "small", "mlp"))
    mlp_hidden: int = _f(64, "hidden units per layer of MLP networks (classic control)", lo=1)
    init: str = _f("torch", "network initialisation: torch (its defaults) | orthogonal (gain "
                   "sqrt 2, zero biases, policy head 0.01, value and Q heads 1)",
                   choices=("torch", "orthogonal"))
    lstm_init: str = _f("torch", "A3C LSTM cell initialisation: torch (its defaults, the forget "
                        "gate near 0.5) | orthogonal (orthogonal gate blocks, zero biases, "
                        "forget-gate bias lstm_forget_bias)", choices=("torch", "orthogonal"))
    lstm_forget_bias: float = _f(1.0, "forget-gate bias of lstm_init = orthogonal (Jozefowicz et "
                                 "al. 2015: 1; OpenAI Baselines' LSTM: 0)")
    lstm_layer_norm: bool = _f(False, "A3C LSTM: a layer-normalised cell (Ba et al. 2016), not "
                               "the paper's plain one: its output does not saturate as |c| "
                               "grows over long episodes (hpcrl.rl.lstm)")

    # --- asynchronous methods (Mnih et al. 2016) ---------------------------------------------
    t_max: int = _f(5, "rollout length in agent steps (n-step Q, A3C) / I_AsyncUpdate", lo=1)
    entropy_beta: float = _f(0.01, "A3C entropy regularisation weight", lo=0.0)
    value_coef: float = _f(0.5, "A3C value-loss coefficient", lo=0.0)
    grad_clip_norm: float = _f(40.0, "asynchronous methods: clip the gradient's global norm "
                               "(0 = off); Gorila does not clip (its outlier rule drops instead)",
                               lo=0.0)
    lstm: bool = _f(False, "A3C: LSTM variant (256 cells after the fc layer; 128 after the "
                    "hidden layer of the Gaussian policy)")
    gaussian_std: str = _f("softplus", "A3C on continuous actions: the policy's variance is "
                           "a SoftPlus output of the network (the paper's) | state_independent "
                           "(one learned log standard deviation per action dimension, as "
                           "PPO/A2C implementations use)",
                           choices=("softplus", "state_independent"))
    gaussian_min_var: float = _f(1e-4, "A3C on continuous actions: added to the policy's "
                                 "variance (not in the paper): a variance that collapses to 0 "
                                 "makes log-densities infinite", lo=0.0)
    value_network: str = _f("shared", "A3C on continuous actions: the value function reads the "
                            "policy's hidden layer (shared) or has its own (separate: the "
                            "paper's S9, policy and value networks share no parameters; "
                            "feed-forward only)", choices=("shared", "separate"))
    obs_norm: bool = _f(False, "A3C on continuous actions: normalise each observation coordinate "
                        "by the running mean and standard deviation of the training "
                        "observations (not in the paper; as Stable-Baselines3's VecNormalize)")
    obs_norm_clip: float = _f(10.0, "with obs_norm: clip normalised observations to +-this many "
                              "standard deviations", lo=0.1)
    reward_norm: bool = _f(False, "A3C: divide training rewards by the "
                           "running standard deviation of the discounted return, clipped to "
                           "+-10 (not in the paper; as Stable-Baselines3's VecNormalize "
                           "norm_reward): values of order 1 whatever the task's reward scale")
    wait_own_update: float = _f(0.0, "asynchronous methods: after a push, wait up to this many "
                                "seconds for the ps to apply it before pulling (0 = pull at once, "
                                "Hogwild)", lo=0.0, hi=10.0)
    anneal_frames: int = _f(4_000_000, "frames over which async epsilons anneal from 1", lo=1)
    final_epsilon_high: float = _f(0.5, "asynchronous value methods: the largest of the final "
                                   "epsilons each environment draws (0.1, 0.01 and this one, "
                                   "with probabilities 0.4, 0.3, 0.3; the paper's 0.5 has three "
                                   "environments in ten act half at random for the whole run)",
                                   lo=0.0, hi=1.0)

    # --- evaluation --------------------------------------------------------------------------
    eval_every_frames: int = _f(1_000_000, "each evaluating rank (evaluator ranks, else every "
                                "acting rank) evaluates every this many of its own frames, the "
                                "ranks staggered: about one evaluation per this many frames of "
                                "the job; 0 = never", lo=0)
    eval_episodes: int = _f(5, "episodes per evaluation", lo=1)
    eval_epsilon: float = _f(0.05, "epsilon during evaluation", lo=0.0, hi=1.0)
    final_eval_episodes: int = _f(30, "episodes of the final weights played once the budget is "
                                  "spent or early_stop ends the run, shared out among the "
                                  "evaluating ranks (metrics.h5 group final; 30 in Mnih et al. "
                                  "2015 and 2016); 0 = none", lo=0)
    early_stop: bool = _f(False, "end the run (exit 0, final checkpoint) once the mean return of "
                          "the last 20 evaluation episodes (training episodes if the run does not "
                          "evaluate) reaches early_stop_return")
    early_stop_return: float = _f(195.0, "the mean return that ends the run when early_stop")

    # --- parameter store / MPI ---------------------------------------------------------------
    async_progress: bool = _f(False, "MPICH asynchronous progress thread (slow when "
                              "oversubscribed; off by default)")
    ps_idle_sleep_ms: float = _f(2.0, "ps sleeps this long between polls when idle", lo=0.0, hi=100.0)

    # --- reporting / checkpoints -------------------------------------------------------------
    log_every_s: float = _f(5.0, "rank 0 prints a progress line every this many seconds", lo=0.1)
    checkpoint_every_min: float = _f(30.0, "write a checkpoint generation every this many minutes; "
                                     "0 = only on signal / at the end", lo=0.0)
    checkpoint_keep: int = _f(2, "complete checkpoint generations kept", lo=1)
    checkpoint_replay: bool = _f(True, "include replay memories in checkpoints")
    checkpoint_max_failures: int = _f(3, "stop the job (status 3, run failed) after this many "
                                      "checkpoint generations in a row failed to be written "
                                      "(disk full, quota); a failed stop checkpoint stops it "
                                      "at once", lo=1)
    checkpoint_quota_check: bool = _f(True, "ask the quota tool (lfs quota on Lustre, quota "
                                      "elsewhere, where installed) how much the run "
                                      "directory's user, group or project quota still allows, "
                                      "in the pre-flight and before each checkpoint "
                                      "generation; a generation that would not fit is not "
                                      "started (it counts as a failed one)")
    watchdog_s: float = _f(300.0, "abort the job if a rank makes no progress for this long", lo=1.0)
    memory_guard_gb: float = _f(4.0, "abort the job when a rank's anonymous resident memory "
                                "exceeds its pre-flight estimate (replay, process, windows) by "
                                "this many GB, naming the rank and where it is: a rank that "
                                "grows without bound drives its node into swap, where the job "
                                "crawls on and no watchdog fires; 0 = off", lo=0.0)
    memory_floor_gb: float = _f(1.0, "abort the job when a node's free memory (MemAvailable, or "
                                "what its cgroup still allows) falls below this many GB, "
                                "naming the job's rank there that holds the most above its "
                                "estimate: ranks that each stay under memory_guard_gb can "
                                "together run the node out of memory, where the kernel's OOM "
                                "killer ends a rank without a word; 0 = off", lo=0.0)
    malloc_mmap_threshold_kb: int = _f(0, "glibc's mmap threshold for every rank, fixed; "
                                       "0 = glibc's own rule (it raises the threshold to the "
                                       "size of each large block freed), else >= 128. A fixed "
                                       "1024 keeps the A3C LSTM configs' ~1 MB tensors from "
                                       "fragmenting the heap (their 20-rank job's ranks grew "
                                       "by 3 MB/s under glibc's rule), but every block above "
                                       "it is then mapped and faulted in anew: the Gorila "
                                       "learner's gradient took 21-23 ms instead of 13",
                                       lo=0, hi=32768)
    checkpoint_min_mb_per_s: float = _f(100.0, "slowest aggregate write rate (MB/s over all "
                                        "ranks) a checkpoint generation may take before it "
                                        "counts as hung: a generation has watchdog_s + its "
                                        "size / this rate (at least 2 x watchdog_s) to be "
                                        "written and gathered; rank 0 then names the ranks "
                                        "that did not finish", gt=0.0)
    preflight: bool = _f(True, "before training, check that each node's memory holds its ranks "
                         "(replay memories, processes, parameter windows) and the run directory's "
                         "disk the checkpoint generations; refuse with the arithmetic if not")
    run_dir_lease_s: float = _f(300.0, "a run directory's lease whose heartbeat a new start "
                                "sees unchanged for this many seconds is taken over (its job "
                                "presumed dead); the holder beats every tenth of this (at most "
                                "10 s)", gt=0.0)

    def target_period_in_updates(self) -> bool:
        """Whether ``target_update_every`` counts applied ps updates (else global agent steps)."""
        if self.target_update_unit == "auto":
            return self.algo == "gorila"
        return self.target_update_unit == "updates"

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir.format(algo=self.algo, game=self.game, seed=self.seed))

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)


FIELDS = {f.name: f for f in dataclasses.fields(Config)}

#: Keys that older versions wrote into run directories' config.toml, accepted and ignored so
#: that those runs still resume. Profiling moved out of the config (HPCRL_PHASE_TIMES_DIR).
RETIRED = frozenset({"phase_times"})


def _check_value(origin: str, key: str, value: Any) -> Any:
    """Type- and range-check one value; returns it coerced (int -> float where a float is due)."""
    f = FIELDS.get(key)
    if f is None:
        close = [k for k in FIELDS if k.split("_")[0] == key.split("_")[0]][:3]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"{origin}: unknown key '{key}'{hint}")
    kind = {"int": int, "float": float, "str": str, "bool": bool}[f.type]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(f"{origin}: key '{key}' must be {f.type}, got "
                          f"{type(value).__name__} {value!r}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{origin}: key '{key}' must be finite, got {value!r}")
    meta = f.metadata
    if meta["choices"] and value not in meta["choices"]:
        raise ConfigError(f"{origin}: key '{key}' must be one of {', '.join(meta['choices'])}, "
                          f"got {value!r}")
    if meta["gt"] is not None and value <= meta["gt"]:
        raise ConfigError(f"{origin}: key '{key}' must be > {meta['gt']}, got {value!r}")
    if meta["lo"] is not None and value < meta["lo"]:
        raise ConfigError(f"{origin}: key '{key}' must be >= {meta['lo']}, got {value!r}")
    if meta["hi"] is not None and value > meta["hi"]:
        raise ConfigError(f"{origin}: key '{key}' must be <= {meta['hi']}, got {value!r}")
    return value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one ``--set key=value``; the value is read as a TOML value, else as a bare string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def _continuous(game: str) -> bool:
    from hpcrl.games import continuous_id

    return continuous_id(game) is not None


def _cross_checks(cfg: Config, origin: str) -> None:
    if cfg.epsilon_end > cfg.epsilon_start:
        raise ConfigError(f"{origin}: key 'epsilon_end' ({cfg.epsilon_end}) must be <= "
                          f"epsilon_start ({cfg.epsilon_start})")
    if cfg.algo != "gorila" and cfg.mode != "bundled":
        raise ConfigError(f"{origin}: key 'mode' must be 'bundled' for algo '{cfg.algo}' "
                          "(asynchronous methods run actor-learner ranks)")
    if cfg.split_update_every and (cfg.algo != "gorila" or cfg.mode != "split"):
        raise ConfigError(f"{origin}: key 'split_update_every' applies to Gorila's split mode "
                          f"only (bundled mode paces learning with update_every); remove it")
    if cfg.n_step != 1 and cfg.algo != "gorila":
        raise ConfigError(f"{origin}: key 'n_step' applies to algo 'gorila' only (the "
                          f"asynchronous methods' n is t_max); remove it")
    if cfg.adagrad_rmsprop_updates and not (cfg.optimizer == "adagrad"
                                            and cfg.adagrad_warmup_updates):
        raise ConfigError(f"{origin}: key 'adagrad_rmsprop_updates' needs optimizer 'adagrad' "
                          f"and adagrad_warmup_updates > 0 (its t0); set both or remove it")
    if cfg.adagrad_rmsprop_start != "tensor" and not cfg.adagrad_rmsprop_updates:
        raise ConfigError(f"{origin}: key 'adagrad_rmsprop_start' applies with "
                          f"adagrad_rmsprop_updates > 0 only; set it or remove this key")
    if cfg.rmsprop_bias_correction and cfg.optimizer != "rmsprop_shared":
        raise ConfigError(f"{origin}: key 'rmsprop_bias_correction' applies to optimizer "
                          f"'rmsprop_shared' only (got '{cfg.optimizer}'; adam_shared always "
                          f"corrects); remove it")
    if cfg.rmsprop_initial and not cfg.optimizer.startswith("rmsprop"):
        raise ConfigError(f"{origin}: key 'rmsprop_initial' applies to the RMSProp optimizers "
                          f"only (got '{cfg.optimizer}'); remove it")
    if cfg.rmsprop_initial and cfg.rmsprop_bias_correction:
        raise ConfigError(f"{origin}: keys 'rmsprop_initial' and 'rmsprop_bias_correction' "
                          "exclude each other (the correction assumes the statistic starts at "
                          "0); set one of them")
    if 0 < cfg.malloc_mmap_threshold_kb < 128:
        raise ConfigError(f"{origin}: key 'malloc_mmap_threshold_kb' must be 0 (glibc's own "
                          f"rule) or at least 128, glibc's starting value (got "
                          f"{cfg.malloc_mmap_threshold_kb}: nearly every block would be a "
                          f"mapping of its own)")
    if cfg.lstm_init != "torch" and not (cfg.algo == "a3c" and cfg.lstm):
        raise ConfigError(f"{origin}: key 'lstm_init' = '{cfg.lstm_init}' applies to A3C LSTM "
                          f"only (algo 'a3c' with lstm = true); remove it")
    if cfg.lstm_layer_norm and not (cfg.algo == "a3c" and cfg.lstm):
        raise ConfigError(f"{origin}: key 'lstm_layer_norm' applies to A3C LSTM only (algo "
                          f"'a3c' with lstm = true); remove it")
    if cfg.lstm_forget_bias != 1.0 and cfg.lstm_init != "orthogonal":
        raise ConfigError(f"{origin}: key 'lstm_forget_bias' applies with lstm_init = "
                          f"'orthogonal' only (got '{cfg.lstm_init}'); set both or remove it")
    if cfg.learner_precision != "float32" and not (
            cfg.algo == "gorila" or (cfg.algo == "a3c" and not cfg.lstm)):
        raise ConfigError(f"{origin}: key 'learner_precision' = '{cfg.learner_precision}' "
                          f"applies to algo 'gorila' and feed-forward 'a3c' only; remove it")
    if cfg.algo != "gorila" and cfg.target_update_unit == "updates":
        raise ConfigError(f"{origin}: key 'target_update_unit' = 'updates' applies to algo "
                          f"'gorila' only (the asynchronous methods count global agent steps)")
    if cfg.algo != "a3c" and _continuous(cfg.game):
        raise ConfigError(f"{origin}: game '{cfg.game}' has continuous actions, which only algo "
                          f"'a3c' (a Gaussian policy) handles (got '{cfg.algo}')")
    gaussian = cfg.algo == "a3c" and _continuous(cfg.game)
    continuous_only = "algo 'a3c' on a continuous-control task"
    for key, used, where, scope in (
            ("obs_norm", cfg.obs_norm, gaussian, continuous_only),
            ("reward_norm", cfg.reward_norm, cfg.algo == "a3c", "algo 'a3c'"),
            ("value_network", cfg.value_network != "shared", gaussian and not cfg.lstm,
             continuous_only + " without lstm")):
        if used and not where:
            raise ConfigError(f"{origin}: key '{key}' applies to {scope} only (got "
                              f"'{cfg.algo}' on '{cfg.game}'); remove it")
    if cfg.algo == "gorila" and cfg.replay_min_fill > cfg.replay_capacity:
        raise ConfigError(f"{origin}: key 'replay_min_fill' ({cfg.replay_min_fill}) must be <= "
                          f"replay_capacity ({cfg.replay_capacity})")


#: The default job's file in the package: ``python -m hpcrl.run`` without ``--config`` runs it.
DEFAULT_JOB = "default_job.toml"


def default_job_path() -> Path:
    """The default job's config file (``hpcrl/data/default_job.toml``): configs/gorila_pong.toml's
    recipe, the one with a Pong learning record, rather than the field defaults (Gorila's
    AdaGrad rule, which has not learned Pong)."""
    from importlib import resources

    return Path(str(resources.files("hpcrl.data").joinpath(DEFAULT_JOB)))


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Read a TOML file (or only the field defaults when ``path`` is None) and apply overrides.

    Raises:
        ConfigError: one line naming the file (or ``--set``) and the offending key.
    """
    values: dict[str, Any] = {}
    if path is not None:
        origin = str(path)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{origin}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
        values = _checked_values(origin, data)
    for text in overrides:
        key, value = parse_override(text)
        values[key] = _check_value(f"--set {key}", key, value)
    cfg = Config(**values)
    _cross_checks(cfg, str(path) if path is not None else "config")
    return cfg


def _checked_values(origin: str, data: dict) -> dict[str, Any]:
    values = {}
    for key, value in data.items():
        if key in RETIRED:
            continue
        if isinstance(value, dict):
            raise ConfigError(f"{origin}: key '{key}' is a table; hpcrl configs are flat "
                              "key = value files")
        values[key] = _check_value(origin, key, value)
    return values


def loads_config(text: str, origin: str) -> Config:
    """A config from TOML text (an exported policy's metadata carries its run's config so)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
    cfg = Config(**_checked_values(origin, data))
    _cross_checks(cfg, origin)
    return cfg


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML, one commented line per field (written to the run dir)."""
    lines = ["# hpcrl resolved config (every field, defaults included)"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = repr(value)
        lines.append(f"{f.name} = {text}  # {f.metadata['doc']}")
    return "\n".join(lines) + "\n"
