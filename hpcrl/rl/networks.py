"""Networks of the papers (torch nn.Modules only, no training logic) and the builder that picks
the run's network.

* `NatureQNetwork`: the DQN network of Mnih et al. 2015 (Nature), used by Gorila (Nair et al.
  2015).
* `SmallQNetwork`: the network of Mnih et al. 2013, which the asynchronous value methods of
  Mnih et al. 2016 use (``network = "small"``).
* `A3CNetwork`: the smaller network of Mnih et al. 2016 (that of Mnih et al. 2013), with a
  softmax policy head and a linear value head, feed-forward or with an LSTM cell of 256 units
  after the fully connected layer ("A3C LSTM").
* `MLPQNetwork`, `MLPActorCritic`: small MLP versions for classic-control tasks (CartPole),
  which make the learning tests fast enough for CI.
* `MLPGaussianActorCritic`: the Gaussian policy of the paper's continuous-control experiments
  (MuJoCo from physical state); its "logits" are the means and variances.

Image inputs may be uint8 (as the envs and replay store them); they are scaled by 1/255 inside
the network, so the float copy never crosses a process boundary.

Actor-critic modules share one call signature, so workers need not know which kind they hold::

    state = net.initial_state(batch_size)           # None for feed-forward nets
    logits, value, state = net(obs, state)          # logits [B, A], value [B]
    state = reset_lstm_state(state, episode_end)    # zero the rows whose episode ended

The policy is softmax(logits); returning logits lets the loss use log_softmax (stable).

`build_network` picks the run's network from its config. The flat float32 vector that the
parameter servers store is mapped to a module's parameters by
:class:`hpcrl.runtime.params.layout.ParamLayout`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hpcrl.rl.lstm import LayerNormLSTMCell

try:      # the C pass over a batch of frame stacks (hpcrl/envs/_frames.c), where it is built
    from hpcrl.envs import _frames
except ImportError:       # pragma: no cover - installs without a C compiler
    _frames = None
#: None without the extension, or with one built before it had this function
_stack_channels_last = getattr(_frames, "stack_channels_last", None)

if TYPE_CHECKING:
    from hpcrl.config import Config

LSTMState = tuple[torch.Tensor, torch.Tensor]


def scale_input(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> float in [0, 1]; float inputs pass through unchanged."""
    if x.dtype == torch.uint8:
        return x.float().mul_(1.0 / 255.0)
    return x.float()


def scaled_channels_last(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An image batch [B, C, H, W] as ``scale_input`` makes it, in channels-last memory (the
    layout oneDNN's convolutions run fastest on this CPU, docs/performance.md), in ``dtype``:
    float32, or bfloat16 for a torso under bfloat16 autocast (the values autocast would cast
    the float32 batch to, so that it casts nothing).

    uint8 frames go through the C extension's ``stack_channels_last`` where it is built: one
    pass that writes the batch in order, each pixel looked up in a 256-entry table made here by
    ``scale_input`` itself (then ``.to(dtype)``), so the values are torch's bit for bit.
    Without the extension: one strided copy per channel into a float [B, H, W, C] buffer and
    one in-place scaling, the same values (for a stack of C = 4 frames torch's general layout
    change, ``contiguous(memory_format=channels_last)``, costs about twice as much).
    """
    if x.dtype != torch.uint8:
        return scale_input(x).contiguous(memory_format=torch.channels_last).to(dtype)
    b, c, h, w = x.shape
    if _stack_channels_last is not None and dtype in _PIXEL_VIEW and x.device.type == "cpu":
        out = torch.empty((b, h, w, c), dtype=dtype)
        _stack_channels_last(x.detach().reshape(b, c, h * w).contiguous().numpy(),
                             _pixel_table(dtype),
                             out.view(_PIXEL_VIEW[dtype]).view(b, h * w, c).numpy())
        return out.permute(0, 3, 1, 2)
    return per_channel_copies(x).to(dtype)


def per_channel_copies(x: torch.Tensor) -> torch.Tensor:
    """`scaled_channels_last` of uint8 frames [B, C, H, W] without the extension, in float32:
    one strided copy per channel into a float [B, H, W, C] buffer, one in-place scaling."""
    b, c, h, w = x.shape
    out = torch.empty((b, h, w, c), dtype=torch.float32)
    pixels_out, pixels_in = out.view(b, h * w, c), x.reshape(b, c, h * w)
    for channel in range(c):
        pixels_out[:, :, channel] = pixels_in[:, channel]
    return out.permute(0, 3, 1, 2).mul_(1.0 / 255.0)


#: The integer type whose numpy view carries each dtype's bits into `stack_channels_last`.
_PIXEL_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


@functools.lru_cache(maxsize=None)
def _pixel_table(dtype: torch.dtype) -> np.ndarray:
    """The 256 values ``scale_input`` gives uint8 pixels, in ``dtype``, as the bits of
    `_PIXEL_VIEW`'s integer type."""
    table = scale_input(torch.arange(256, dtype=torch.int32).to(torch.uint8)).to(dtype)
    table = table.view(_PIXEL_VIEW[dtype]).numpy().copy()
    table.flags.writeable = False         # shared by every caller
    return table


def _torso(torso: nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``torso(x)``, under CPU autocast to ``dtype`` if given, the output back in float32."""
    if dtype is None:
        return torso(x)
    with torch.autocast("cpu", dtype=dtype):
        return torso(x).float()


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


class NatureQNetwork(nn.Module):
    """Q-network of Mnih et al. 2015: conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1, fc 512, ReLUs.

    Args:
        obs_shape: (stack, height, width), (4, 84, 84) for DQN preprocessing.
        num_actions: number of outputs (one Q-value per action).
    """

    def __init__(self, obs_shape: tuple[int, int, int], num_actions: int):
        super().__init__()
        c, h, w = obs_shape
        for k, s in ((8, 4), (4, 2), (3, 1)):
            h, w = _conv_out(h, k, s), _conv_out(w, k, s)
        self.torso = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * h * w, 512), nn.ReLU(),
        )
        self.q_head = nn.Linear(512, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, stack, H, W] (uint8 or float) -> Q-values [B, num_actions]."""
        return self.q_head(self.torso(scale_input(obs)))


def small_torso(obs_shape: tuple[int, int, int]) -> nn.Sequential:
    """The network of Mnih et al. 2013 up to its hidden layer, which A3C and the asynchronous
    value methods share: conv 16 8x8/4, conv 32 4x4/2, fc 256, ReLUs."""
    c, h, w = obs_shape
    for k, s in ((8, 4), (4, 2)):
        h, w = _conv_out(h, k, s), _conv_out(w, k, s)
    return nn.Sequential(
        nn.Conv2d(c, 16, 8, stride=4), nn.ReLU(),
        nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * h * w, 256), nn.ReLU(),
    )


class SmallQNetwork(nn.Module):
    """Q-network of the asynchronous value methods (Mnih et al. 2016, §8: "the same
    architecture as (Mnih et al., 2013)", the torso of A3C's network): conv 16 8x8/4, conv 32
    4x4/2, fc 256, ReLUs, one Q-value per action. About a third of the Nature network's
    multiply-adds on Atari frames.

    Args:
        obs_shape: (stack, height, width), (4, 84, 84) for DQN preprocessing.
        num_actions: number of outputs.
    """

    def __init__(self, obs_shape: tuple[int, int, int], num_actions: int):
        super().__init__()
        self.torso = small_torso(obs_shape)
        self.q_head = nn.Linear(256, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, stack, H, W] (uint8 or float) -> Q-values [B, num_actions]."""
        return self.q_head(self.torso(scale_input(obs)))


def q_values(net: nn.Module, obs: torch.Tensor, torso_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Q-values of a ``torso`` + ``q_head`` network, the torso optionally in lower precision.

    With ``torso_dtype`` (torch.bfloat16) the torso runs under CPU autocast: oneDNN's bfloat16
    convolutions and matmuls take about 0.7 of the float32 time of a Nature-DQN update on
    AVX512-BF16 cores (``python -m hpcrl.bench learner``). Its output returns to float32 before
    the Q head, so the Q head, TD errors and the loss run in float32; the parameters and
    their gradients are float32 either way (autocast casts weights per op).
    """
    if torso_dtype is None:
        return net(obs)
    x = obs if obs.dtype == torso_dtype else scale_input(obs)   # already scaled, cast by
    return net.q_head(_torso(net.torso, x, torso_dtype))           # `scaled_channels_last`


class MLPQNetwork(nn.Module):
    """Q-network for vector observations (classic control): MLP with ReLUs."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: tuple[int, ...] = (64, 64)):
        super().__init__()
        layers, d = [], obs_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.torso = nn.Sequential(*layers)
        self.q_head = nn.Linear(d, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, obs_dim] -> Q-values [B, num_actions]."""
        return self.q_head(self.torso(scale_input(obs)))


class _ActorCritic(nn.Module):
    """Torso -> optional LSTMCell -> (policy logits, value). Subclasses build `self.torso`."""

    def _build_heads(self, torso_dim: int, num_actions: int, lstm: bool, lstm_size: int) -> None:
        self.lstm = nn.LSTMCell(torso_dim, lstm_size) if lstm else None
        d = lstm_size if lstm else torso_dim
        self.policy_head = nn.Linear(d, num_actions)
        self.value_head = nn.Linear(d, 1)

    def initial_state(self, batch_size: int) -> LSTMState | None:
        """Zero (h, c), each [B, lstm_size]; None for a feed-forward net."""
        if self.lstm is None:
            return None
        z = torch.zeros(batch_size, self.lstm.hidden_size)
        return z, z.clone()

    def forward(self, obs: torch.Tensor, state: LSTMState | None = None,
                torso_dtype: torch.dtype | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, LSTMState | None]:
        """obs [B, ...], state (h, c) [B, lstm_size] each (LSTM only; None = zeros).

        ``torso_dtype`` (torch.bfloat16): the torso under CPU autocast, its output back in
        float32 before the LSTM and the heads (as :func:`q_values` does for Q-networks).

        Returns:
            logits [B, num_actions] (policy = softmax(logits)), value [B], next state.
        """
        return self.recurrent_heads(self.features(obs, torso_dtype), state)

    #: The torso reads each observation alone (no state, no running statistics), so a
    #: rollout's observations may pass it in one batch before the LSTM steps through them
    #: (`features`, then `recurrent_heads` per step): the same outputs as `forward` per step.
    batched_torso = True

    def features(self, obs: torch.Tensor, torso_dtype: torch.dtype | None = None
                 ) -> torch.Tensor:
        """The torso's output [B, torso_dim] for observations [B, ...] (any batch)."""
        return _torso(self.torso, scale_input(obs), torso_dtype)

    def recurrent_heads(self, x: torch.Tensor, state: LSTMState | None
                        ) -> tuple[torch.Tensor, torch.Tensor, LSTMState | None]:
        """One step of the LSTM (if any) from torso features x [B, torso_dim], then the heads:
        (logits, value, next state), as `forward`."""
        if self.lstm is not None:
            if state is None:
                state = self.initial_state(x.shape[0])
            h, c = self.lstm(x, state)
            x, state = h, (h, c)
        return self.policy_head(x), self.value_head(x).squeeze(-1), state


class A3CNetwork(_ActorCritic):
    """Actor-critic of Mnih et al. 2016: conv 16 8x8/4, conv 32 4x4/2, fc 256 (ReLUs), then
    (LSTM variant) an LSTMCell of 256 units, a softmax policy head and a linear value head."""

    def __init__(self, obs_shape: tuple[int, int, int], num_actions: int, lstm: bool = False):
        super().__init__()
        self.torso = small_torso(obs_shape)
        self._build_heads(256, num_actions, lstm, 256)


class MLPActorCritic(_ActorCritic):
    """Actor-critic for vector observations (classic control), feed-forward or LSTM."""

    def __init__(self, obs_dim: int, num_actions: int, lstm: bool = False, hidden: int = 64):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(),
                                   nn.Linear(hidden, hidden), nn.ReLU())
        self._build_heads(hidden, num_actions, lstm, hidden)


class MLPGaussianActorCritic(_ActorCritic):
    """Actor-critic with a Gaussian policy for continuous actions from physical state (Mnih et
    al. 2016, supplementary §9): one hidden layer of ReLU units (200 in the paper), an LSTM of
    128 cells in the recurrent variant, a linear layer for the mean mu and a SoftPlus layer
    for the variance sigma^2 (``std="softplus"``), or one learned log standard deviation per
    action dimension (``std="state_independent"``), and a linear value head.

    The policy output is ``[B, 2 D]``: the means, then the variances (each plus ``min_var``),
    as :func:`hpcrl.rl.gaussian.split_policy` reads it. With ``obs_norm_clip`` the observations
    first pass an :class:`hpcrl.rl.obs_norm.ObsNormalizer` clipping at that many standard
    deviations (``obs_norm``: not in the paper).

    ``separate_value=True`` gives the value function a hidden layer of its own (the paper's
    §9: "the networks for policy network and value network do not share any parameters"):
    with one shared layer, the value loss's gradient, which grows with the task's reward scale,
    steers the features the policy reads. Feed-forward only.
    """

    batched_torso = False       # forward normalises observations and splits the output

    def __init__(self, obs_dim: int, action_dim: int, lstm: bool = False, hidden: int = 200,
                 std: str = "softplus", min_var: float = 1e-4, lstm_size: int = 128,
                 obs_norm_clip: float | None = None, separate_value: bool = False):
        super().__init__()
        from hpcrl.rl.obs_norm import ObsNormalizer

        self.obs_norm = ObsNormalizer(obs_dim, obs_norm_clip) if obs_norm_clip else None
        if std not in ("softplus", "state_independent"):
            raise ValueError(f"unknown gaussian std {std!r} (softplus, state_independent)")
        if separate_value and lstm:
            raise ValueError("a separate value network is feed-forward only (no lstm)")
        self.action_dim, self.min_var = action_dim, min_var
        self.torso = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU())
        outputs = 2 * action_dim if std == "softplus" else action_dim
        self._build_heads(hidden, outputs, lstm, lstm_size)
        self.value_torso = (nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU())
                            if separate_value else None)
        self.log_std = nn.Parameter(torch.zeros(action_dim)) if std != "softplus" else None

    def forward(self, obs: torch.Tensor, state: LSTMState | None = None,
                torso_dtype: torch.dtype | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, LSTMState | None]:
        """obs [B, obs_dim] -> policy output [B, 2 D] (means, variances), value [B], state."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs.float())
        if self.value_torso is None:
            out, value, state = super().forward(obs, state, torso_dtype)
        else:
            x = obs.float()
            out = self.policy_head(_torso(self.torso, x, torso_dtype))
            value = self.value_head(_torso(self.value_torso, x, torso_dtype)).squeeze(-1)
        if self.log_std is None:
            d = self.action_dim
            mean, var = out[:, :d], F.softplus(out[:, d:])
        else:
            mean, var = out, torch.exp(2.0 * self.log_std).expand_as(out)
        return torch.cat([mean, var + self.min_var], dim=-1), value, state


def reset_lstm_state(state: LSTMState | None, episode_end: np.ndarray | torch.Tensor
                     ) -> LSTMState | None:
    """Zero the (h, c) rows of envs whose episode ended; other rows are kept. None passes.

    Args:
        state: (h, c), each [B, lstm_size].
        episode_end: [B] bool (numpy or torch).
    """
    if state is None:
        return None
    keep = (~torch.as_tensor(np.asarray(episode_end), dtype=torch.bool)).to(state[0].dtype)[:, None]
    return state[0] * keep, state[1] * keep


def build_q_network(obs_shape: tuple[int, ...], num_actions: int, kind: str = "auto",
                    hidden: int = 64, init: str = "torch") -> nn.Module:
    """Q-network for an env: "nature" (conv, 3-D obs), "small" (the asynchronous methods'
    conv network, 3-D obs), "mlp" (1-D obs), or "auto" (nature or mlp, by obs rank);
    ``init``: "torch" (its defaults) or "orthogonal" (`init_orthogonal`)."""
    if init not in INITS:
        raise ValueError(f"unknown init {init!r} ({', '.join(INITS)})")
    if kind == "auto":
        kind = "nature" if len(obs_shape) == 3 else "mlp"
    if kind == "nature":
        net = NatureQNetwork(tuple(obs_shape), num_actions)
    elif kind == "small":
        net = SmallQNetwork(tuple(obs_shape), num_actions)
    elif kind == "mlp":
        net = MLPQNetwork(int(np.prod(obs_shape)), num_actions, hidden=(hidden, hidden))
    else:
        raise ValueError(f"unknown q-network kind {kind!r} (auto, nature, small, mlp)")
    return init_orthogonal(net) if init == "orthogonal" else net


INITS = ("torch", "orthogonal")


@torch.no_grad()
def init_orthogonal(net: nn.Module) -> nn.Module:
    """Orthogonal weights (Saxe et al. 2014) and zero biases, in place; returns ``net``.

    Torso layers get gain sqrt(2) (ReLU), the policy head 0.01 (a near-uniform first policy)
    and the value head 1, as in the A2C of OpenAI Baselines, a Q-network's head 1; an LSTM
    cell keeps torch's (``lstm_init`` = "orthogonal": `init_lstm_orthogonal`).
    Why: torch's default, U(+-1/sqrt(fan_in)) for weights and biases, is the same as
    Torch7's default, but under RMSProp's fixed-size steps those small weights and
    random biases let A3C on Pong lose most ReLU units within 1 M frames (measured with
    ``python -m hpcrl.diagnose``, docs/experiments).
    """
    torsos = [net.torso] + [t for t in [getattr(net, "value_torso", None)] if t is not None]
    layers = [(m, 2 ** 0.5) for torso in torsos for m in torso
              if isinstance(m, (nn.Conv2d, nn.Linear))]
    heads = ([(net.q_head, 1.0)] if hasattr(net, "q_head")
             else [(net.policy_head, 0.01), (net.value_head, 1.0)])
    for module, gain in layers + heads:
        nn.init.orthogonal_(module.weight, gain)
        nn.init.zeros_(module.bias)
    return net


@torch.no_grad()
def init_lstm_orthogonal(cell: nn.LSTMCell, forget_bias: float = 1.0) -> nn.LSTMCell:
    """Each gate's input and recurrent weight block orthogonal (gain 1), biases zero but the
    forget gate's, ``forget_bias``; in place, returns ``cell``.

    Why: torch's default draws every LSTM weight and bias from U(+-1/sqrt(hidden)), so the
    forget gate starts near 0.5 and the cell state halves each step: gradients through the
    recurrent path vanish within a few steps (Jozefowicz et al. 2015, "An Empirical Exploration
    of Recurrent Network Architectures", recommend a forget bias of 1). Orthogonal recurrent
    weights keep the step's Jacobian well conditioned (Saxe et al. 2014), the same reason the
    rest of the A3C network is orthogonal under ``init = "orthogonal"``.
    """
    h = cell.hidden_size
    for weight in (cell.weight_ih, cell.weight_hh):
        for gate in range(4):                   # torch's gate order: input, forget, cell, output
            nn.init.orthogonal_(weight[gate * h:(gate + 1) * h])
    nn.init.zeros_(cell.bias_ih)
    nn.init.zeros_(cell.bias_hh)
    cell.bias_ih[h:2 * h] = forget_bias
    return cell


def build_actor_critic(obs_shape: tuple[int, ...], num_actions: int, lstm: bool,
                       hidden: int = 64, init: str = "torch", continuous: bool = False,
                       std: str = "softplus", min_var: float = 1e-4,
                       lstm_init: str = "torch", obs_norm_clip: float | None = None,
                       separate_value: bool = False, lstm_forget_bias: float = 1.0,
                       lstm_layer_norm: bool = False) -> _ActorCritic:
    """A3C network for 3-D (image) observations, MLP actor-critic for 1-D ones, the Gaussian
    one (``num_actions`` = the action dimension) for ``continuous`` actions; ``init``:
    "torch" (torch's default initialisation) or "orthogonal" (`init_orthogonal`);
    ``lstm_init``: the LSTM cell's, "torch" or "orthogonal" (`init_lstm_orthogonal`, its
    forget-gate bias ``lstm_forget_bias``); ``lstm_layer_norm``: the LSTM cell layer-normalised
    (:class:`hpcrl.rl.lstm.LayerNormLSTMCell`);
    ``obs_norm_clip``: normalise the Gaussian policy's observations, clipped at this many
    standard deviations (None: raw observations)."""
    for name, value in (("init", init), ("lstm_init", lstm_init)):
        if value not in INITS:
            raise ValueError(f"unknown {name} {value!r} ({', '.join(INITS)})")
    if continuous:
        net = MLPGaussianActorCritic(int(np.prod(obs_shape)), num_actions, lstm=lstm,
                                     hidden=hidden, std=std, min_var=min_var,
                                     obs_norm_clip=obs_norm_clip,
                                     separate_value=separate_value)
    elif len(obs_shape) == 3:
        net = A3CNetwork(tuple(obs_shape), num_actions, lstm=lstm)
    else:
        net = MLPActorCritic(int(np.prod(obs_shape)), num_actions, lstm=lstm, hidden=hidden)
    if lstm_layer_norm:
        if net.lstm is None:
            raise ValueError("lstm_layer_norm needs an LSTM (lstm = true)")
        net.lstm = LayerNormLSTMCell(net.lstm.input_size, net.lstm.hidden_size)
    if init == "orthogonal":
        init_orthogonal(net)
    if lstm_init == "orthogonal" and net.lstm is not None:
        init_lstm_orthogonal(net.lstm, lstm_forget_bias)
    return net


def num_params(module: nn.Module) -> int:
    """Number of scalar parameters."""
    return sum(p.numel() for p in module.parameters())


def build_network(cfg: "Config", obs_shape: tuple[int, ...], num_actions: int) -> nn.Module:
    """The run's network: an actor-critic for A3C, a Q-network for the value-based methods.

    Sets torch to one thread: every rank owns one core (``OMP_NUM_THREADS=1``)."""
    torch.set_num_threads(1)
    if cfg.algo == "a3c":
        from hpcrl.games import continuous_id

        return build_actor_critic(obs_shape, num_actions, lstm=cfg.lstm, hidden=cfg.mlp_hidden,
                                  init=cfg.init, continuous=continuous_id(cfg.game) is not None,
                                  std=cfg.gaussian_std, min_var=cfg.gaussian_min_var,
                                  lstm_init=cfg.lstm_init, lstm_forget_bias=cfg.lstm_forget_bias,
                                  lstm_layer_norm=cfg.lstm_layer_norm,
                                  obs_norm_clip=cfg.obs_norm_clip if cfg.obs_norm else None,
                                  separate_value=cfg.value_network == "separate")
    return build_q_network(obs_shape, num_actions, kind=cfg.network, hidden=cfg.mlp_hidden,
                           init=cfg.init)
