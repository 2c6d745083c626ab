"""``python -m hpcrl.bench gradient``: the A3C rollout gradient as the learner computes it,
against the ways it was or could be computed, alternating blocks in one process (one core).

Variants, each on the same rollout of real Pong frames (``configs/a3c_pong.toml``'s network
and rollout shape, t_max x envs_per_actor states):

* ``learner``: :meth:`hpcrl.agents.async_rl.learner.AsyncLearner.gradient` itself (the
  production path, norm clip and gradient pieces included) with no recording: a forward over
  the rollout and its backward;
* ``bootstrap_in_batch``: the previous feed-forward path, the bootstrap states riding along in
  the gradient's batch (their values detached, but backward covers the whole batch), NCHW;
* ``bootstrap_apart``: the same with the bootstrap states in a pass of their own, NCHW;
* ``bfloat16_torso``: ``bootstrap_apart`` with the torso under CPU bfloat16 autocast and a
  channels-last batch (the learner's ``learner_precision = "bfloat16"`` pass, without its
  norm clip).

Each figure is milliseconds per rollout gradient (median over blocks); ``*_over_reference``
divides by ``bootstrap_in_batch``.

The acting passes and the gradient together (both methods), the production learner either
way: ``act_rerun`` (t_max acting forwards of envs_per_actor states, then the gradient with its
own forward) and ``act_reuse`` (the acting forwards recorded, the gradient from their
activations, `hpcrl.rl.reuse`); ``reuse_over_rerun`` divides the two.

The gradient batch's input alone (both methods): the rollout's uint8 states made a scaled float
channels-last batch by torch's layout change (``input_layout_change``), by one strided copy per
channel (``input_per_channel``, :func:`hpcrl.rl.networks.per_channel_copies`, the path without
the C extension) and by :func:`hpcrl.rl.networks.scaled_channels_last` (``input_learner``, the
learners' path: the extension's one pass where it is built); ``per_channel_over_layout_change``
and ``learner_over_per_channel`` divide them.

``--algo n_step_q`` (:func:`bench_value_gradient`, ``configs/n_step_q_pong.toml``'s network
and rollout): ``learner`` (the production path: the target network only on the states that
bootstrap, a channels-last batch) against ``all_states_nchw`` (the target network on every
s_t, an NCHW batch: the previous path).

``--algo a3c_lstm`` (:func:`bench_lstm_gradient`, ``configs/a3c_lstm_paper.toml``'s network and
rollout: one environment, t_max states): ``learner`` (the production gradient: the rollout's
frames through the torso in one batch, the LSTM stepped) against ``step_by_step`` (the network
called on each state in turn, as it acts: the previous path), and ``act`` (the t_max acting
forwards) beside them; ``learner_over_reference`` divides the first two.
"""

from __future__ import annotations

import time

import numpy as np


def _rollout(cfg, steps: int):
    """A rollout of ``steps`` x envs_per_actor real Pong states, random actions."""
    from hpcrl.agents.async_rl.rollout import Rollout
    from hpcrl.envs import make_env_from_config

    env = make_env_from_config(cfg, cfg.envs_per_actor, 0, training=True)
    rng = np.random.default_rng(0)
    obs = env.reset()
    for _ in range(50):                               # past the zero-padded first stacks
        obs = env.step(rng.integers(0, env.num_actions, env.num_envs)).obs
    s_tm1, s_t = [], []
    for _ in range(steps):
        s_tm1.append(obs)
        obs = env.step(rng.integers(0, env.num_actions, env.num_envs)).obs
        s_t.append(obs)
    n = env.num_envs
    env.close()
    return Rollout(np.stack(s_tm1), rng.integers(0, env.num_actions, (steps, n)),
                   rng.normal(size=(steps, n)).astype(np.float32),
                   np.ones((steps, n), np.float32), np.zeros((steps, n), bool), np.stack(s_t))


def _time(variants: dict, blocks: int, reps: int) -> dict:
    """Milliseconds per call of each variant: 3 warm-up calls each, then ``blocks`` rounds of
    ``reps`` calls of each in turn."""
    times = {k: [] for k in variants}
    for f in variants.values():
        for _ in range(3):
            f()
    for _ in range(blocks):
        for k, f in variants.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                f()
            times[k].append((time.perf_counter() - t0) / reps * 1e3)
    return times


def _summary(name: str, states: int, blocks: int, reps: int, times: dict, reference: str) -> dict:
    ms = {k: float(np.median(v)) for k, v in times.items()}
    ref = ms[reference]
    paired = ("act_rerun", "act_reuse", "input_layout_change", "input_per_channel",
              "input_learner")
    return {"bench": name, "states": states, "blocks": blocks, "reps": reps,
            **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
            **{f"{k}_over_reference": round(v / ref, 3) for k, v in ms.items()
               if k != reference and k not in paired},
            "reuse_over_rerun": round(ms["act_reuse"] / ms["act_rerun"], 3),
            "per_channel_over_layout_change": round(
                ms["input_per_channel"] / ms["input_layout_change"], 3),
            "learner_over_per_channel": round(ms["input_learner"] / ms["input_per_channel"], 3),
            "runs_ms": {k: [round(t, 2) for t in v] for k, v in times.items()}}


def _acting_variants(net, cfg, rollout, learner, forward) -> dict:
    """``act_rerun`` and ``act_reuse`` (see the module docstring): the rollout's acting passes
    (``forward`` on each step's states, no graph) and the production gradient."""
    import torch

    from hpcrl.agents.async_rl.learner import AsyncLearner
    from hpcrl.agents.async_rl.rollout import flat_batch
    from hpcrl.rl.networks import per_channel_copies, scaled_channels_last
    from hpcrl.rl.reuse import ActivationRecorder, RecordedActivations

    rerun = AsyncLearner(learner.net, learner.target, cfg.replace(learner_reuse_acting=False))
    recorder = ActivationRecorder(net.torso)
    steps = [torch.from_numpy(s) for s in rollout.s_tm1]

    def act():
        with torch.no_grad():
            for s in steps:
                forward(s)

    def act_rerun():
        act()
        rerun.gradient(rollout)

    def act_reuse():
        recorder.start()
        act()
        learner.gradient(rollout, None, RecordedActivations(recorder.stop()))

    batch = torch.from_numpy(flat_batch(rollout.s_tm1))

    def input_layout_change():
        batch.contiguous(memory_format=torch.channels_last).float().mul_(1.0 / 255.0)

    return {"act_rerun": act_rerun, "act_reuse": act_reuse,
            "input_layout_change": input_layout_change,
            "input_per_channel": lambda: per_channel_copies(batch),
            "input_learner": lambda: scaled_channels_last(batch)}


def bench_value_gradient(blocks: int = 7, reps: int = 20) -> dict:
    import copy

    import torch

    from hpcrl.agents.async_rl.learner import AsyncLearner
    from hpcrl.agents.async_rl.rollout import flat_batch
    from hpcrl.config import load_config
    from hpcrl.rl.losses import dqn_loss, td_error, value_targets
    from hpcrl.rl.networks import build_q_network

    torch.set_num_threads(1)
    cfg = load_config("configs/n_step_q_pong.toml", [])
    rollout = _rollout(cfg, cfg.t_max)
    T, N = rollout.a_tm1.shape
    net = build_q_network(rollout.s_tm1.shape[2:], 6, kind=cfg.network, init=cfg.init)
    target = copy.deepcopy(net)
    learner = AsyncLearner(net, target, cfg)
    x, x_t = (torch.from_numpy(flat_batch(s)) for s in (rollout.s_tm1, rollout.s_t))
    acts = torch.from_numpy(rollout.a_tm1.reshape(-1))

    def all_states_nchw():
        with torch.no_grad():
            q_t = target(x_t).numpy().reshape(T, N, -1)
        y = value_targets(cfg.algo, rollout.r_t, rollout.discount_t, rollout.end_t,
                          rollout.a_tm1, q_t, cfg.gamma)
        loss = dqn_loss(td_error(net(x), acts, y.reshape(-1)), cfg.loss, reduction="sum") / N
        net.zero_grad(set_to_none=True)
        loss.backward()

    times = _time({"learner": lambda: learner.gradient(rollout),
                   "all_states_nchw": all_states_nchw,
                   **_acting_variants(net, cfg, rollout, learner, net)}, blocks, reps)
    return _summary("gradient_n_step_q", T * N, blocks, reps, times, "all_states_nchw")


def bench_gradient(blocks: int = 7, reps: int = 20) -> dict:
    import torch

    from hpcrl.agents.async_rl.learner import AsyncLearner
    from hpcrl.agents.async_rl.rollout import flat_batch
    from hpcrl.config import load_config
    from hpcrl.rl.losses import a3c_loss, bootstrap_returns, rollout_cuts
    from hpcrl.rl.networks import build_actor_critic

    torch.set_num_threads(1)
    cfg = load_config("configs/a3c_pong.toml", [])
    rollout = _rollout(cfg, cfg.t_max)
    T, N = rollout.a_tm1.shape
    net = build_actor_critic(rollout.s_tm1.shape[2:], 6, lstm=False, init=cfg.init)
    learner = AsyncLearner(net, None, cfg)
    acts = torch.from_numpy(rollout.a_tm1)
    cuts = rollout_cuts(rollout.end_t)

    def finish(lg, v, v_t):
        returns = bootstrap_returns(rollout.r_t, rollout.discount_t, cuts, v_t, cfg.gamma)
        loss = a3c_loss(lg.reshape(T, N, -1), v.reshape(T, N), acts, torch.from_numpy(returns),
                        cfg.entropy_beta, cfg.value_coef)["total"] / N
        net.zero_grad(set_to_none=True)
        loss.backward()

    x = torch.from_numpy(flat_batch(rollout.s_tm1))
    x_cl = x.contiguous(memory_format=torch.channels_last)
    boot = torch.from_numpy(rollout.s_t[-1])             # every env cut at the last step

    def in_batch():
        lg, v, _ = net(torch.cat([x, boot]), None)
        v_t = np.zeros((T, N), np.float32)
        v_t[-1] = v[T * N:].detach().numpy()
        finish(lg[:T * N], v[:T * N], v_t)

    def apart(torso_dtype=None):
        with torch.no_grad():
            v_t = np.zeros((T, N), np.float32)
            v_t[-1] = net(boot, None)[1].numpy()
        batch = x if torso_dtype is None else x_cl
        lg, v, _ = net(batch, None, torso_dtype)
        finish(lg, v, v_t)

    variants = {"learner": lambda: learner.gradient(rollout),
                "bootstrap_in_batch": in_batch, "bootstrap_apart": apart,
                "bfloat16_torso": lambda: apart(torch.bfloat16),
                **_acting_variants(net, cfg, rollout, learner, lambda s: net(s, None))}
    times = _time(variants, blocks, reps)
    return _summary("gradient", T * N, blocks, reps, times, "bootstrap_in_batch")


def bench_lstm_gradient(blocks: int = 7, reps: int = 20) -> dict:
    import torch

    from hpcrl.agents.async_rl.learner import AsyncLearner
    from hpcrl.config import load_config
    from hpcrl.rl.losses import a3c_loss, bootstrap_returns, rollout_cuts
    from hpcrl.rl.networks import build_network

    torch.set_num_threads(1)
    cfg = load_config("configs/a3c_lstm_paper.toml", [])
    rollout = _rollout(cfg, cfg.t_max)
    T, N = rollout.a_tm1.shape
    net = build_network(cfg, rollout.s_tm1.shape[2:], 6)
    state0 = net.initial_state(N)
    rollout = rollout._replace(state0=state0)
    learner = AsyncLearner(net, None, cfg)
    steps = [torch.from_numpy(s) for s in rollout.s_tm1]
    cuts = rollout_cuts(rollout.end_t)
    acts = torch.from_numpy(rollout.a_tm1)

    def step_by_step():
        logits, values, state = [], [], state0
        for s in steps:
            lg, v, state = net(s, state)
            logits.append(lg)
            values.append(v)
        with torch.no_grad():
            v_t = np.zeros((T, N), np.float32)
            v_t[-1] = net(torch.from_numpy(rollout.s_t[-1]), state)[1].numpy()
        returns = bootstrap_returns(rollout.r_t, rollout.discount_t, cuts, v_t, cfg.gamma)
        loss = a3c_loss(torch.stack(logits), torch.stack(values), acts,
                        torch.from_numpy(returns), cfg.entropy_beta, cfg.value_coef)["total"] / N
        net.zero_grad(set_to_none=True)
        loss.backward()

    def act():
        with torch.no_grad():
            state = state0
            for s in steps:
                state = net(s, state)[2]

    times = _time({"learner": lambda: learner.gradient(rollout), "step_by_step": step_by_step,
                   "act": act}, blocks, reps)
    ms = {k: float(np.median(v)) for k, v in times.items()}
    return {"bench": "gradient_a3c_lstm", "states": T * N, "blocks": blocks, "reps": reps,
            **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
            "learner_over_reference": round(ms["learner"] / ms["step_by_step"], 3),
            "runs_ms": {k: [round(t, 2) for t in v] for k, v in times.items()}}
