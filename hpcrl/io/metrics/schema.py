"""The columns, groups and attributes of `metrics.h5` (the schema is described in
:mod:`hpcrl.io.metrics`), shared by its writer and its readers."""

from __future__ import annotations

from typing import Any

import numpy as np

SCHEMA_VERSION = 4

_EPISODE_COLUMNS = {
    "frames": np.int64,  # global env frames at the end of the episode
    "return": np.float64,  # undiscounted, unclipped episode return
    "length": np.int64,  # env frames in the episode
    "rank": np.int32,  # MPI rank that played the episode
    "wall_time": np.float64,  # seconds since the run started (summed over restarts)
}

COLUMNS: dict[str, dict[str, type]] = {
    "episodes": dict(_EPISODE_COLUMNS),
    "eval": dict(_EPISODE_COLUMNS),
    "final": dict(_EPISODE_COLUMNS),
    "train": {
        "frames": np.int64,  # global env frames at the report
        "updates": np.int64,  # cumulative parameter updates applied
        "loss": np.float64,  # mean loss since the previous report
        "dropped_stale": np.int64,  # cumulative gradients dropped as too stale (Gorila)
        "dropped_outlier": np.int64,  # cumulative gradients dropped as loss outliers (Gorila)
        "dropped_nonfinite": np.int64,  # cumulative gradients dropped as NaN/inf
        "frames_per_second": np.float64,  # env frames per second since the previous report
        "wall_time": np.float64,  # seconds since the run started (summed over restarts)
        # network health since the previous report (schema 3; NaN in older files and where a
        # figure does not apply):
        "grad_norm": np.float64,  # mean global gradient norm before clipping
        "clipped_fraction": np.float64,  # share of gradients clipped (grad_clip_norm)
        # share of the gradients' summed norm the clip let through, sum of min(norm, clip) /
        # sum of norms (schema 4; 1 = nothing cut): a heavy tail of large gradients shows
        # here, where clipped_fraction counts them only
        "clip_kept": np.float64,
        "entropy": np.float64,  # A3C: mean policy entropy per agent step, nats
        "max_q": np.float64,  # value methods: mean max_a Q(s, a) over the learners' states
        # at the report, from the ps ranks' optimiser statistics (as hpcrl.diagnose):
        "dead_units": np.float64,  # the worst layer's share of units without a gradient
        "dead_params": np.float64,  # share of all parameters without a gradient
    },
}
#: columns a file of an older schema may lack: read as NaN
_ADDED_COLUMNS = {"train": ("grad_norm", "clipped_fraction", "entropy", "max_q", "dead_units",
                            "dead_params", "clip_kept")}
GROUPS: tuple[str, ...] = ("episodes", "eval", "train", "final")
STATUSES: tuple[str, ...] = ("running", "finished", "failed", "preempted")
REQUIRED_ATTRS: tuple[str, ...] = ("algo", "game", "seed", "config")
IDENTITY_ATTRS: tuple[str, ...] = ("algo", "game", "seed")



class MetricsError(Exception):
    """A metrics file is missing, unreadable, truncated, or does not follow the schema."""


def _empty_columns(group: str) -> dict[str, np.ndarray]:
    return {name: np.zeros(0, dtype) for name, dtype in COLUMNS[group].items()}


def _as_python(value: Any) -> Any:
    """HDF5 attribute value -> plain Python (str / int / float / list)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value

