"""Plain data types shared by actors, learners and replay (dqn_zoo `replay.Transition` naming)."""

from typing import NamedTuple

import numpy as np


class Transition(NamedTuple):
    """One step (or a batch of steps, with a leading batch axis) of experience.

    Names carry time indices: the agent was in `s_tm1`, took `a_tm1`, received `r_t` and
    arrived in `s_t`. `discount_t` is 0 where `s_t` is terminal (no bootstrapping from it) and
    1 otherwise; the learner multiplies it by gamma.

    Attributes:
        s_tm1: observation before the step, e.g. uint8 [B, stack, 84, 84].
        a_tm1: int64 [B], the action taken in `s_tm1`.
        r_t: float32 [B], the reward of that step.
        discount_t: float32 [B], 0.0 where `s_t` is terminal else 1.0.
        s_t: observation after the step, same shape and dtype as `s_tm1`.
    """
    s_tm1: np.ndarray
    a_tm1: np.ndarray
    r_t: np.ndarray
    discount_t: np.ndarray
    s_t: np.ndarray

