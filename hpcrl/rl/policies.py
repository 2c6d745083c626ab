"""Exploration, action sampling, schedules and Gorila's loss-outlier filter (numpy, no torch).

Sources: Mnih et al. 2015 (epsilon annealed linearly from 1 to 0.1), Nair et al. 2015 (Gorila:
loss-outlier rejection in each learner) and Mnih et al. 2016 (asynchronous methods: per-thread
final epsilon sampled from {0.1, 0.01, 0.5}, learning rate annealed linearly to 0).
"""

import math
from typing import Callable

import numpy as np


class LinearSchedule:
    """Linear interpolation from `start` to `end` over `duration` frames, then constant.

        value(frame) = start + (end - start) * clip((frame - begin_frame) / duration, 0, 1)

    e.g. DQN/Gorila epsilon: LinearSchedule(1.0, 0.1, 1_000_000) (frames per actor).
    """

    def __init__(self, start: float, end: float, duration: int, begin_frame: int = 0):
        """Args:
            start: value up to `begin_frame`.
            end: value from `begin_frame + duration` on.
            duration: frames over which the value moves; 0 jumps to `end` at `begin_frame`.
            begin_frame: frame at which the interpolation starts.
        """
        if duration < 0:
            raise ValueError(f"duration must be >= 0, got {duration}")
        self.start, self.end = float(start), float(end)
        self.duration, self.begin_frame = int(duration), int(begin_frame)

    def value(self, frame: int) -> float:
        if self.duration == 0:
            return self.end if frame >= self.begin_frame else self.start
        fraction = min(max((frame - self.begin_frame) / self.duration, 0.0), 1.0)
        return self.start + (self.end - self.start) * fraction

    __call__ = value


def epsilon_greedy(q_values: np.ndarray, epsilon, rng: np.random.Generator):
    """Epsilon-greedy actions, breaking ties between maximal Q-values uniformly at random.

    With probability epsilon the action is uniform over all A actions (so the greedy one has
    total probability 1 - epsilon + epsilon / A). Ties are broken at random, not by lowest
    index: at initialisation many Q-values are equal and argmax would always pick action 0.
    The generator is consumed by the same amount whatever the values (determinism).

    Args:
        q_values: [A] or [B, A] Q-values.
        epsilon: scalar, or [B] per-row epsilons (e.g. one per environment).
        rng: numpy Generator.

    Returns:
        int for [A] input, int64 [B] array for [B, A] input.
    """
    q = np.asarray(q_values)
    single = q.ndim == 1
    q = q[None] if single else q
    assert q.ndim == 2, q.shape
    actions = epsilon_greedy_lazy(lambda: q, q.shape[0], q.shape[1], epsilon, rng)
    return int(actions[0]) if single else actions


def epsilon_greedy_lazy(q_values: Callable[[], np.ndarray], batch: int, num_actions: int,
                        epsilon, rng: np.random.Generator) -> np.ndarray:
    """:func:`epsilon_greedy` over ``batch`` rows that calls ``q_values()`` (-> [B, A]) only
    when some row acts greedily: the same actions and the same draws from ``rng``, in the same
    order, whatever the values; a row that explores never reads its Q-values, so when every
    row explores (over DQN's anneal of epsilon from 1, about half the steps of one
    environment) the network's forward is not run at all. Returns int64 [B]."""
    explore = rng.random(batch) < np.asarray(epsilon)
    random_actions = rng.integers(0, num_actions, batch)
    tie_draws = rng.random((batch, num_actions))
    if explore.all():
        return random_actions.astype(np.int64)
    q = np.asarray(q_values())
    assert q.shape == (batch, num_actions), (q.shape, batch, num_actions)
    ties = q == q.max(axis=1, keepdims=True)
    greedy = np.argmax(np.where(ties, tie_draws, -1.0), axis=1)
    return np.where(explore, random_actions, greedy).astype(np.int64)


FINAL_EPSILONS = (0.1, 0.01, 0.5)
FINAL_EPSILON_PROBS = (0.4, 0.3, 0.3)


def sample_from_logits(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One action per row from softmax(logits) by inverse CDF: the first action whose
    cumulative probability exceeds the row's uniform draw.

    Plain Python over the few actions of a row: right after a forward pass numpy's code is
    cold, and a vectorised version's ten numpy calls cost several times more per step in the
    acting loop than they do timed alone.

    Args:
        logits: [N, A].
        u: [N] uniform draws in [0, 1).

    Returns:
        [N] int64.
    """
    actions = []
    for row, target in zip(logits.tolist(), u.tolist()):
        top = max(row)
        weights = [math.exp(x - top) for x in row]
        target *= sum(weights)
        a, cumulative = 0, weights[0]
        while cumulative <= target and a < len(weights) - 1:
            a += 1
            cumulative += weights[a]
        actions.append(a)
    return np.array(actions, np.int64)


def sample_final_epsilon(rng: np.random.Generator, high: float = FINAL_EPSILONS[2]) -> float:
    """Final epsilon of one actor-learner (Mnih et al. 2016, §8 Experimental setup).

    "... the final value epsilon sampled from a distribution taking three values 0.1, 0.01, 0.5
    with probabilities 0.4, 0.3, 0.3", so that actor-learners explore differently. ``high``
    replaces the 0.5 (``final_epsilon_high``); the draw is the same.
    """
    values = (*FINAL_EPSILONS[:2], high)
    return float(values[rng.choice(len(values), p=FINAL_EPSILON_PROBS)])


def linear_lr(lr0: float, frame: int, total_frames: int) -> float:
    """Learning rate annealed linearly from lr0 to 0 over training (Mnih et al. 2016, §8).

        lr(frame) = lr0 * max(0, 1 - frame / total_frames)
    """
    return lr0 * max(0.0, 1.0 - frame / total_frames)


def learning_rate(cfg, global_frames: int) -> float:
    """The lr a client sends with a gradient (``cfg``: hpcrl.config.Config): ``learning_rate``,
    annealed by :func:`linear_lr` over ``lr_anneal_frames`` (0: ``total_frames``) when
    ``lr_anneal``. A horizon longer than the run keeps the rate from collapsing in a short run
    (the paper anneals over 80 M agent steps whatever the budget of one experiment).

    With ``lr_warmup_frames`` (not in the papers) the rate is first multiplied by
    ``min(1, global_frames / lr_warmup_frames)``: the first updates, whose gradients are the
    largest of the run, then move the network by small steps.
    """
    lr = cfg.learning_rate
    if cfg.lr_anneal:
        lr = linear_lr(lr, global_frames, cfg.lr_anneal_frames or cfg.total_frames)
    if cfg.lr_warmup_frames:
        lr *= min(1.0, global_frames / cfg.lr_warmup_frames)
    return lr


class LossOutlierFilter:
    """Gorila's loss-outlier rule (Nair et al. 2015, §4): drop gradients with unusually large loss.

    "each learner maintains a running average and standard deviation of the absolute DQN loss
    for the data it computes gradients on, and discards gradients whose absolute loss is higher
    than the mean plus several standard deviations." A NaN or infinite loss is always rejected
    (its gradient would poison the shared parameters), even during warm-up or with k_std <= 0.

    Running statistics: a mean and variance with weight alpha_n = max(1/n, 1/window) for the
    n-th update, i.e. exact population statistics for the first `window` losses and an
    exponential moving average after that. The DQN loss drifts during training (Q-values grow as
    rewards are found), so statistics over the whole run would lag behind it; `window=None`
    keeps the exact cumulative statistics.

    Rejected losses update the statistics winsorised: as the value of the threshold that they
    exceeded, not as themselves. Feeding them raw would let one huge loss inflate the standard
    deviation and open the gate for the next outliers; ignoring them entirely could lock a
    learner out forever after a genuine upward shift of the loss (every loss rejected, the
    threshold never moves). Winsorising bounds one outlier's influence to that of a loss at
    the threshold, while a persistent shift raises the threshold step by step until losses are
    accepted again. Non-finite losses never touch the statistics.

    For the first `warmup` finite losses the statistics are not yet meaningful: these losses are
    all accepted and update the statistics.
    """

    def __init__(self, k_std: float = 5.0, warmup: int = 100, window: int | None = 10_000):
        """Args:
            k_std: reject when |loss| > mean + k_std * std; k_std <= 0 turns the statistical
                test off (non-finite losses are still rejected).
            warmup: number of finite losses accepted unconditionally at the start.
            window: effective averaging length of the statistics (None: whole history).
        """
        self.k_std, self.warmup, self.window = float(k_std), int(warmup), window
        self._count = 0  # Updates of the statistics.
        self._mean = 0.0
        self._var = 0.0
        self.num_accepted = 0
        self.num_rejected = 0  # Includes the non-finite ones.
        self.num_nonfinite = 0

    @property
    def mean(self) -> float:
        return self._mean

    @property
    def std(self) -> float:
        return math.sqrt(self._var)

    @property
    def threshold(self) -> float:
        """|loss| above this is rejected (inf during warm-up or when the test is off)."""
        if self._count < self.warmup or self.k_std <= 0:
            return math.inf
        return self._mean + self.k_std * self.std

    def accept(self, loss) -> bool:
        """Returns whether the gradient of this loss should be applied, and updates the state.

        Args:
            loss: scalar loss (float, numpy scalar or 0-d tensor).
        """
        abs_loss = abs(float(loss))
        if not math.isfinite(abs_loss):
            self.num_nonfinite += 1
            self.num_rejected += 1
            return False
        threshold = self.threshold
        if abs_loss > threshold:
            self._update(threshold)
            self.num_rejected += 1
            return False
        self._update(abs_loss)
        self.num_accepted += 1
        return True

    def _update(self, x: float) -> None:
        """Weighted incremental mean/variance (Welford for alpha = 1/n; West 1979 in general)."""
        self._count += 1
        alpha = 1.0 / self._count
        if self.window is not None:
            alpha = max(alpha, 1.0 / self.window)
        delta = x - self._mean
        self._mean += alpha * delta
        self._var = (1.0 - alpha) * (self._var + alpha * delta * delta)

    def get_state(self) -> dict[str, np.ndarray]:
        return {
            "count": np.asarray(self._count, np.int64),
            "mean": np.asarray(self._mean, np.float64),
            "var": np.asarray(self._var, np.float64),
            "num_accepted": np.asarray(self.num_accepted, np.int64),
            "num_rejected": np.asarray(self.num_rejected, np.int64),
            "num_nonfinite": np.asarray(self.num_nonfinite, np.int64),
        }

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self._count = int(state["count"])
        self._mean = float(state["mean"])
        self._var = float(state["var"])
        self.num_accepted = int(state["num_accepted"])
        self.num_rejected = int(state["num_rejected"])
        self.num_nonfinite = int(state["num_nonfinite"])
