"""Update rules applied by parameter-server shards: pure numpy, no MPI.

Each rule maps (theta_in, grad) to theta_out, writing into a separate buffer because the store
double-buffers its parameters (readers keep reading theta_in while theta_out is written).

* ``sgd``:        theta -= lr * g
* ``momentum``:   m_c = a m_c + (1 - a) g;  theta -= lr * m_c, one m per client
                  (Mnih et al. 2016, S7: "SGD with momentum", each thread keeps its own m).
* ``adagrad``:    G += g^2;  theta -= lr * g / sqrt(G + eps)  (Gorila, Nair et al. 2015 §4).
                  G is float64: it only grows, and in float32 G + g^2 == G once G / g^2
                  passes 2^24 (about 1.7e7 steps of similar size; Gorila's runs take more).
                  ``warmup_updates`` = t0 > 0 starts G at t0 mean(g_1^2), the mean squared
                  first gradient of each network tensor (its piece in this shard), as if t0
                  updates of that size had been applied. Per tensor because gradient scales
                  differ by orders of magnitude between tensors (Pong: the output biases' rms
                  gradient is ~1e4 times the fc weights'), so one mean over a shard would set
                  most weights' G by a few biases and leave them plain SGD at a tiny rate.
                  AdaGrad's step on a parameter with gradients of steady size is then about
                  lr / sqrt(t0 + t) after t updates instead of lr / sqrt(t): the first steps
                  are not lr itself (a step of 0.05 per weight wrecks a network), and lr /
                  sqrt(t0) can be set to DQN's step of ~1e-4..2.5e-4 per weight (RMSProp and
                  Adam steps are about lr per weight). With G at 0 and a large eps instead,
                  the rule is plain SGD at lr / sqrt(eps) wherever G < eps, which for Atari
                  gradients of ~1e-4 is the whole run. ``n`` counts the shard's updates and
                  ``G0`` (float32, per parameter) keeps the warm start, so (G - G0) / n is
                  each parameter's own mean
                  squared gradient (``hpcrl.diagnose``).
                  ``rmsprop_updates`` = K > 0 (a variant, not the paper's rule) takes the warm
                  start from the recent gradient scale instead of the first gradient, which on
                  Pong is ~100 times the gradients that follow it (the first batches fit a
                  random network's Q values) and which AdaGrad never forgets: the shard first
                  takes K bias-corrected RMSProp steps of lr / sqrt(t0) per weight (statistic
                  ``v``, count ``k``), then starts G at t0 times each tensor's mean of the
                  corrected v (``rmsprop_start`` "tensor"), or at t0 times each parameter's
                  own ("parameter"; its tensor's mean where v is 0), so that the first
                  AdaGrad step equals the last RMSProp one. ``n`` counts the AdaGrad updates
                  only.
* ``rmsprop_shared``: v = a v + (1 - a) g^2;  theta -= lr * g / sqrt(v + eps), one v for all
                  clients (Mnih et al. 2016 S7, "Shared RMSProp": the best variant).
* ``rmsprop_per_client``: the same with one v per client ("RMSProp" without sharing).
* ``adam_shared``: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
                  theta -= lr m^ / sqrt(v^ + eps), m^ = m / (1 - b1^t), v^ = v / (1 - b2^t),
                  both moments and the count t shared by all clients (Adam, Kingma & Ba 2015,
                  as the shared Adam of public one-environment A3C reproductions, e.g.
                  ikostrikov/pytorch-a3c; not in the papers). b1 is ``momentum``, b2 ``decay``;
                  eps inside the square root as for RMSProp (PyTorch's eps e outside it is
                  about eps = e^2 inside). Applied as lr sqrt(c2) / c1 m / sqrt(v + eps c2),
                  c = 1 - b^t, the same rule with the correction folded into lr and eps.

``bias_correction`` (shared RMSProp only): divide v by 1 - a^t after t steps, as Adam corrects
its second moment (Kingma & Ba 2015). v starts at 0, so without it the first steps are up to
1 / sqrt(1 - a) = 10 times the learning rate per weight (a = 0.99) wherever eps is small; with
it every step is at most about lr. Applied as lr sqrt(c) g / sqrt(v + eps c), c = 1 - a^t,
which is the same rule and lets the fused kernel run unchanged.

``initial`` (RMSProp only): v before the first step. 0 is PyTorch's RMSprop; 1 is TensorFlow 1's
RMSPropOptimizer, as OpenAI baselines' A2C ran it: v then decays from 1 towards g^2 as a^k, so
the first steps are about lr * g and grow e-fold every ~200 steps (a = 0.99; x10 at 460, x150 at
1,000) until v reaches g^2 (1,800-3,200 steps for g ~1e-4..1e-7): an exponential warm-up,
where bias correction makes every first step about lr whatever the gradient's size. A parameter without gradient reaches the
float32 floor (stored as 0) after ~8,700 steps, so ``hpcrl.diagnose`` sees it later than from 0.

Client c's state lives on the ps next to the shard, so "per client" statistics cost
``n_clients * shard`` floats per ps rank and "shared" ones cost ``shard``: sharing the statistics
is the same array object for every client by construction.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

try:      # the fused C loop (_kernels.c beside this file), built by pip install when a compiler exists
    from hpcrl.runtime.params import _kernels
except ImportError:          # pragma: no cover - depends on the install
    _kernels = None


def fused_available() -> bool:
    """Whether AdaGrad, RMSProp and momentum steps run as one fused C pass (HPCRL_NO_KERNELS=1
    turns it off)."""
    return _kernels is not None and not os.environ.get("HPCRL_NO_KERNELS")

KINDS = ("sgd", "momentum", "adagrad", "rmsprop_shared", "rmsprop_per_client", "adam_shared")


def tensor_pieces(tensor_sizes: Sequence[int], lo: int, hi: int) -> list[int]:
    """Lengths, in order, of the pieces of the network's tensors (``tensor_sizes`` in the
    flat vector's order) that fall in the flat range [lo, hi) of one shard."""
    pieces, start = [], 0
    for size in tensor_sizes:
        a, b = max(start, lo), min(start + size, hi)
        if a < b:
            pieces.append(b - a)
        start += size
    return pieces


def warm_start(grad: np.ndarray, pieces: Sequence[int], t0: int) -> np.ndarray:
    """AdaGrad's G0: t0 times the mean squared gradient of each piece, per parameter."""
    return warm_start_from_squares(np.square(grad, dtype=np.float64), pieces, t0)


def warm_start_from_squares(sq: np.ndarray, pieces: Sequence[int], t0: int) -> np.ndarray:
    """t0 times the mean of ``sq`` (squared gradients, or RMSProp's statistic) over each piece,
    repeated over the piece's parameters, as float32."""
    sq = np.asarray(sq, np.float64)
    starts = np.cumsum([0] + list(pieces[:-1]))
    means = np.add.reduceat(sq, starts) / np.asarray(pieces, np.float64)
    return np.repeat(t0 * means, pieces).astype(np.float32)


class ShardOptimizer:
    """Optimiser state and update rule for one shard of ``size`` floats."""

    def __init__(self, kind: str, size: int, n_clients: int, *, decay: float = 0.99,
                 eps: float = 0.1, momentum: float = 0.9, bias_correction: bool = False,
                 warmup_updates: int = 0, initial: float = 0.0,
                 pieces: Sequence[int] | None = None, rmsprop_updates: int = 0,
                 rmsprop_start: str = "tensor"):
        if kind not in KINDS:
            raise ValueError(f"unknown optimizer {kind!r}; choose one of {', '.join(KINDS)}")
        if bias_correction and kind != "rmsprop_shared":
            raise ValueError(f"bias_correction applies to rmsprop_shared only, not {kind!r}")
        if initial and not kind.startswith("rmsprop"):
            raise ValueError(f"initial applies to the RMSProp kinds only, not {kind!r}")
        if initial and bias_correction:
            raise ValueError("initial and bias_correction exclude each other")
        if warmup_updates and kind != "adagrad":
            raise ValueError(f"warmup_updates applies to adagrad only, not {kind!r}")
        if rmsprop_updates and not (kind == "adagrad" and warmup_updates):
            raise ValueError("rmsprop_updates needs adagrad with warmup_updates > 0")
        self.warmup_updates = int(warmup_updates)
        self.rmsprop_updates = int(rmsprop_updates)
        if rmsprop_start not in ("tensor", "parameter"):
            raise ValueError(f"rmsprop_start must be 'tensor' or 'parameter', not {rmsprop_start!r}")
        self.rmsprop_start = rmsprop_start
        self.pieces = [size] if pieces is None else [int(k) for k in pieces]
        if sum(self.pieces) != size or min(self.pieces, default=1) <= 0:
            raise ValueError(f"tensor pieces {self.pieces} do not split a shard of {size}")
        self.kind, self.decay, self.eps, self.momentum = kind, decay, eps, momentum
        self.bias_correction = bias_correction
        self._tmp = np.empty(size, np.float32)
        self.fused = fused_available()
        self.state: dict[str, np.ndarray] = {}
        if kind == "momentum":
            self.state["m"] = np.zeros((n_clients, size), np.float32)
        elif kind == "adagrad":
            self.state["G"] = np.zeros(size, np.float64)
            self.state["n"] = np.zeros((), np.int64)          # updates applied by this shard
            self.state["G0"] = np.zeros(size, np.float32)     # G's warm start, per parameter
            self._tmp64 = np.empty(size, np.float64)
            if rmsprop_updates:
                self.state["v"] = np.zeros(size, np.float32)  # RMSProp before AdaGrad
                self.state["k"] = np.zeros((), np.int64)      # RMSProp steps taken
        elif kind == "rmsprop_shared":
            self.state["v"] = np.full(size, initial, np.float32)
            if bias_correction:
                self.state["t"] = np.zeros((), np.int64)      # steps taken by this shard
        elif kind == "rmsprop_per_client":
            self.state["v"] = np.full((n_clients, size), initial, np.float32)
        elif kind == "adam_shared":
            self.state["m"] = np.zeros(size, np.float32)
            self.state["v"] = np.zeros(size, np.float32)
            self.state["t"] = np.zeros((), np.int64)          # steps taken by this shard

    def statistic(self) -> np.ndarray | None:
        """RMSProp's v ([n] shared, [n_clients, n] per client) or AdaGrad's own G - G0 (its
        sum of squared gradients without the warm start): the statistic that is exactly 0
        where a parameter gets no gradient, as ``hpcrl.diagnose`` reads it (None for SGD and
        momentum)."""
        if "G" in self.state:
            if "v" in self.state and self.state["n"] == 0:    # still in the RMSProp steps
                return self.state["v"]
            return self.state["G"] - self.state["G0"]
        return self.state.get("v")

    def statistics_for(self, client: int) -> np.ndarray | None:
        """The array that scales client ``client``'s steps (None for plain SGD; Adam's v)."""
        for name in ("G", "v", "m"):
            if name in self.state:
                arr = self.state[name]
                return arr if arr.ndim == 1 else arr[client]
        return None

    def step(self, theta_in: np.ndarray, grad: np.ndarray, theta_out: np.ndarray, lr: float,
             client: int) -> None:
        """theta_out = update(theta_in, grad); all arrays float32 of the shard's size."""
        tmp = self._tmp
        eps = self.eps
        if self.bias_correction:
            lr, eps = self._bias_corrected(self.state["t"], lr, eps)
        if self.kind == "sgd":
            np.multiply(grad, np.float32(lr), out=tmp)
        elif self.kind == "momentum":
            m = self.state["m"][client]
            if self.fused:
                _kernels.momentum_step(theta_in, grad, m, theta_out, self.momentum, lr)
                return
            m *= np.float32(self.momentum)
            np.multiply(grad, np.float32(1.0 - self.momentum), out=tmp)
            m += tmp
            # |m| below FLT_MIN is stored as 0, as in the C kernel (see _kernels.c)
            np.putmask(m, np.abs(m) < np.finfo(np.float32).tiny, np.float32(0.0))
            np.multiply(m, np.float32(lr), out=tmp)
        elif self.kind == "adagrad":
            self._adagrad_step(theta_in, grad, theta_out, lr, eps)
            return
        elif self.kind == "adam_shared":
            self._adam_step(theta_in, grad, theta_out, lr, eps)
            return
        else:
            self._rmsprop_step(self.statistics_for(client), theta_in, grad, theta_out, lr, eps)
            return
        np.subtract(theta_in, tmp, out=theta_out)

    def _bias_corrected(self, count: np.ndarray, lr: float, eps: float) -> tuple[float, float]:
        """Count one more step t and return (lr sqrt(c), eps c), c = 1 - decay^t: then
        lr' g / sqrt(v + eps') = lr g / sqrt(v / c + eps), Adam's correction of a zero-started v."""
        count += 1
        c = 1.0 - self.decay ** int(count)
        return lr * c ** 0.5, eps * c

    def _adam_step(self, theta_in: np.ndarray, grad: np.ndarray, theta_out: np.ndarray,
                   lr: float, eps: float) -> None:
        """One shared Adam step, the bias correction of step t folded into lr and eps."""
        m, v, t = self.state["m"], self.state["v"], self.state["t"]
        t += 1
        b1, b2 = self.momentum, self.decay
        c1, c2 = 1.0 - b1 ** int(t), 1.0 - b2 ** int(t)
        lr, eps = lr * c2 ** 0.5 / c1, eps * c2
        if self.fused:
            _kernels.adam_step(theta_in, grad, m, v, theta_out, b1, b2, eps, lr)
            return
        tiny, tmp = np.finfo(np.float32).tiny, self._tmp
        m *= np.float32(b1)
        np.multiply(grad, np.float32(1.0 - b1), out=tmp)
        m += tmp
        np.putmask(m, np.abs(m) < tiny, np.float32(0.0))     # as the C kernel (see _kernels.c)
        np.multiply(grad, grad, out=tmp)
        v *= np.float32(b2)
        tmp *= np.float32(1.0 - b2)
        v += tmp
        np.putmask(v, v < tiny, np.float32(0.0))
        np.add(v, np.float32(eps), out=tmp)
        np.sqrt(tmp, out=tmp)
        np.divide(m, tmp, out=tmp)
        tmp *= np.float32(lr)
        np.subtract(theta_in, tmp, out=theta_out)

    def _rmsprop_step(self, acc: np.ndarray, theta_in: np.ndarray, grad: np.ndarray,
                      theta_out: np.ndarray, lr: float, eps: float) -> None:
        """acc = decay acc + (1 - decay) g^2; theta_out = theta_in - lr g / sqrt(acc + eps)."""
        if self.fused:
            _kernels.scaled_step(theta_in, grad, acc, theta_out, self.decay, eps, lr, False)
            return
        tmp = self._tmp
        np.multiply(grad, grad, out=tmp)
        acc *= np.float32(self.decay)
        tmp *= np.float32(1.0 - self.decay)
        acc += tmp
        # statistics below FLT_MIN are stored as 0, as in the C kernel (see _kernels.c)
        np.putmask(acc, acc < np.finfo(np.float32).tiny, np.float32(0.0))
        np.add(acc, np.float32(eps), out=tmp)
        np.sqrt(tmp, out=tmp)
        np.divide(grad, tmp, out=tmp)
        tmp *= np.float32(lr)
        np.subtract(theta_in, tmp, out=theta_out)

    def _adagrad_step(self, theta_in: np.ndarray, grad: np.ndarray, theta_out: np.ndarray,
                      lr: float, eps: float) -> None:
        """G += g^2 in float64; theta_out = theta_in - lr g / sqrt(G + eps) in float32."""
        G, n = self.state["G"], self.state["n"]
        if self.rmsprop_updates and n == 0:
            k = self.state["k"]
            if k < self.rmsprop_updates:              # bias-corrected RMSProp, lr / sqrt(t0)
                lr_k, eps_k = self._bias_corrected(k, lr / self.warmup_updates ** 0.5, eps)
                self._rmsprop_step(self.state["v"], theta_in, grad, theta_out, lr_k, eps_k)
                return
            corrected = self.state["v"] / (1.0 - self.decay ** int(k))
            G0 = warm_start_from_squares(corrected, self.pieces, self.warmup_updates)
            if self.rmsprop_start == "parameter":
                own = (self.warmup_updates * corrected.astype(np.float64)).astype(np.float32)
                G0 = np.where(corrected > 0, own, G0)
            self.state["G0"][...] = G0
            G += self.state["G0"]
        elif n == 0 and self.warmup_updates:
            self.state["G0"][...] = warm_start(grad, self.pieces, self.warmup_updates)
            G += self.state["G0"]
        n += 1
        if self.fused:
            _kernels.adagrad_step(theta_in, grad, G, theta_out, eps, lr)
            return
        tmp64, tmp = self._tmp64, self._tmp
        np.multiply(grad, grad, out=tmp64, dtype=np.float64)
        G += tmp64
        np.add(G, eps, out=tmp64)
        np.sqrt(tmp64, out=tmp, casting="same_kind")      # the step in float32, as the kernel
        np.divide(grad, tmp, out=tmp)
        tmp *= np.float32(lr)
        np.subtract(theta_in, tmp, out=theta_out)

    def get_state(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.state.items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        if self.kind == "adagrad" and "n" not in state and "G" in state:
            # checkpoints older than the update count: a nonzero G has seen its first update
            state = {**state, "n": np.int64(bool(np.any(state["G"])))}
        if self.kind == "adagrad":
            # older checkpoints: no warm start, or one number per shard
            g0 = np.asarray(state.get("G0", 0.0), np.float32)
            state = {**state, "G0": np.broadcast_to(g0, self.state["G0"].shape)}
        for k, v in self.state.items():
            if k not in state or np.shape(state[k]) != v.shape:
                raise ValueError(f"optimizer state '{k}' missing or of shape "
                                 f"{np.shape(state.get(k))}, expected {v.shape}")
            v[...] = state[k]
