"""What a run's network does on its own game: each ReLU layer's units that stay off over a
stretch of play, and, for A3C LSTM, how far its cell state has run into tanh's flat tails.

:mod:`hpcrl.tools.diagnose` reads the optimiser's statistics (which parameters got no gradient
for thousands of updates); this runs the checkpoint's network on the run's game, in training
environments, acting as the run's actors do (A3C samples its policy and carries its LSTM state,
zeroed at episode ends), and looks at the activations themselves.

Why the LSTM part: the cell state c of an LSTM is a sum over time, gated by the forget gate f.
Where f stays near 1 and the input gate stays open, c grows with the length of the episode
(a Pong episode is thousands of agent steps) while truncated backpropagation over t_max = 5
steps never sees, and never corrects, that growth. h = o tanh(c) then saturates: tanh'(c) <
0.07 for |c| > 2, so almost no gradient reaches the input, forget and cell gates, nor, through
them, the layers before the LSTM. (Gers et al. 2000 added the forget gate because without one
the cell state grows without bound on long input streams; a forget gate stuck at 1 brings
that back.)

    python -m hpcrl.diagnose RUN_DIR --probe AGENT_STEPS [--probe-envs N]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SATURATED_C = 2.0           # |c| beyond which tanh'(c) = 1 - tanh(c)^2 < 0.071
OPEN_FORGET = 0.95          # a forget gate above which c keeps 95 % or more per step


def units_off(ever_active: np.ndarray) -> float:
    """Share of a layer's units (a conv layer's channels) never active over the probe."""
    return float(1.0 - np.mean(ever_active))


def cell_saturation(c: np.ndarray, f: np.ndarray, tanh_in: np.ndarray | None = None) -> dict:
    """Statistics of LSTM cell states c and forget gates f (any shape, the same one):
    rms and max of |c|, the share whose output tanh is saturated (its input, c or in a
    layer-normalised cell LN(c), beyond SATURATED_C), the mean forget gate and the share above
    OPEN_FORGET."""
    c, f = np.asarray(c, np.float64), np.asarray(f, np.float64)
    tanh_in = c if tanh_in is None else np.asarray(tanh_in, np.float64)
    return {"c_rms": float(np.sqrt(np.mean(c * c))), "c_max": float(np.abs(c).max()),
            "c_saturated": float(np.mean(np.abs(tanh_in) > SATURATED_C)),
            "forget_mean": float(f.mean()), "forget_open": float(np.mean(f > OPEN_FORGET))}


class _Recorder:
    """Forward hooks on the torso's ReLUs (units ever active) and the LSTM cell (c and f)."""

    def __init__(self, net):
        import torch.nn as nn

        self.names, self.active, self.c, self.f, self.tanh_in = [], {}, [], [], []
        self.handles = []
        for name, module in net.torso.named_children():
            if isinstance(module, nn.ReLU):
                self.names.append(f"torso.{int(name) - 1}")   # the conv / linear before it
                self.handles.append(module.register_forward_hook(self._relu(self.names[-1])))
        if getattr(net, "lstm", None) is not None:
            self.handles.append(net.lstm.register_forward_hook(self._lstm))

    def _relu(self, name: str):
        def hook(module, inputs, out):
            on = (out > 0).numpy()
            on = on.any(axis=(0, 2, 3)) if on.ndim == 4 else on.any(axis=0)
            self.active[name] = self.active.get(name, False) | on
        return hook

    def _lstm(self, cell, inputs, out):
        import torch

        from hpcrl.rl.lstm import lstm_gates, tanh_input

        x, (h, _) = inputs
        n = cell.hidden_size
        self.f.append(torch.sigmoid(lstm_gates(cell, x, h)[:, n:2 * n]).numpy())
        self.c.append(out[1].numpy())
        self.tanh_in.append(tanh_input(cell, out[1]).numpy())

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def probe_run(run_dir: str | Path, agent_steps: int, num_envs: int = 8, seed: int = 0) -> dict:
    """Play ``agent_steps`` steps of ``num_envs`` training environments of the run's game with
    the newest checkpoint's network and report each ReLU layer's share of units off throughout
    and, for an LSTM, :func:`cell_saturation` over every step."""
    import torch

    from hpcrl.envs import make_env_from_config
    from hpcrl.tools.policy import policy_from_run

    policy = policy_from_run(run_dir, seed=seed)
    cfg, net = policy.config, policy.module
    env = make_env_from_config(cfg, num_envs, seed, training=True)
    recorder = _Recorder(net)
    try:
        obs = env.reset()
        with torch.no_grad():
            for _ in range(agent_steps):
                res = env.step(policy.act(obs))
                policy.episode_end(res.episode_end)
                obs = res.obs
    finally:
        recorder.remove()
        env.close()
    report = {"run_dir": str(run_dir), "frames": policy.source.frames,
              "generation": policy.source.generation, "game": cfg.game,
              "agent_steps": agent_steps, "envs": num_envs,
              "units_off": {n: units_off(recorder.active[n]) for n in recorder.names}}
    if recorder.c:
        report["lstm"] = cell_saturation(np.stack(recorder.c), np.stack(recorder.f),
                                         np.stack(recorder.tanh_in))
    return report


def format_probe(report: dict) -> str:
    lines = [f"probe: {report['agent_steps']:,} agent steps x {report['envs']} training "
             f"environments of {report['game']}, the network of generation "
             f"{report['generation']} ({report['frames']:,} frames), acting as the run does",
             "  units (conv: channels) off for every observation:"]
    lines += [f"    {name:<10} {100 * off:5.1f} %" for name, off in report["units_off"].items()]
    s = report.get("lstm")
    if s:
        lines.append(f"  LSTM cell state over every step: |c| rms {s['c_rms']:.2f}, max "
                     f"{s['c_max']:.1f}; {100 * s['c_saturated']:.1f} % with tanh's input "
                     f"beyond +-{SATURATED_C:g} (tanh' < 0.07: little gradient to the gates); forget "
                     f"gate mean {s['forget_mean']:.3f}, {100 * s['forget_open']:.1f} % above "
                     f"{OPEN_FORGET:g}")
    return "\n".join(lines) + "\n"
