"""Pre-flight sizing: the memory each node and the disk each checkpoint generation need, worked
out before training, so that a layout that cannot fit stops in seconds with the arithmetic
instead of hours later in the OOM killer or on a full disk.

Pure arithmetic over the config and the layout (no MPI, no torch); :func:`check` compares it with
what the node and the run directory have. Replay memories are allocated up front but filled over
hours (``np.zeros`` pages are touched as transitions arrive), so without this a job that cannot
fit runs until its replay fills.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcrl.config import Config
from hpcrl.runtime.node_guard import mem_available
from hpcrl.runtime.params.header import FLAGS
from hpcrl.runtime.topology import Layout, Role

GB = 1e9
#: Resident memory of a rank that builds a network (python, torch, numpy, mpi4py, h5py, the
#: environment): the Gorila paper layout (100 torch ranks + 30 ps) peaked at 16.6 GiB of summed
#: PSS (docs/performance.md#paper-layout-memory), about 0.17 GB per torch rank; 0.2 GB leaves room.
TORCH_RANK_BYTES = 200e6
#: A ps or replay rank without torch (python, numpy, mpi4py, h5py).
PLAIN_RANK_BYTES = 80e6
#: Per replay slot besides its frame: action int32, reward float32, terminal bool, pos int32,
#: transition id int64 (hpcrl.rl.replay.ReplayMemory).
SLOT_EXTRA_BYTES = 4 + 4 + 1 + 4 + 8


@dataclass
class Need:
    """What one rank needs, in bytes, by part (for the message)."""
    memory: dict[str, float] = field(default_factory=dict)
    checkpoint: float = 0.0

    @property
    def memory_total(self) -> float:
        return sum(self.memory.values())


def replay_bytes(cfg: Config, obs_shape: tuple[int, ...]) -> float:
    """One replay memory of ``replay_capacity`` transitions: each frame stored once (a stack
    of 4 shares 3 frames with its neighbour), plus the slot's other columns."""
    from hpcrl.rl.replay import frame_layout

    stack, frame_shape, dtype = frame_layout(obs_shape)
    slot = int(np.prod(frame_shape)) * np.dtype(dtype).itemsize + SLOT_EXTRA_BYTES
    return float(cfg.replay_capacity + stack * max(cfg.envs_per_actor, 1)) * slot


def _optimizer_floats(cfg: Config, shard: int, n_clients: int) -> float:
    """Optimiser state in float32-equivalents (AdaGrad: the float64 accumulator counts 2, its
    float32 warm start 1)."""
    return {"sgd": 0, "adagrad": 3 * shard, "rmsprop_shared": shard,
            "rmsprop_per_client": shard * n_clients, "momentum": shard * n_clients,
            "adam_shared": 2 * shard}[cfg.optimizer]


def rank_needs(cfg: Config, layout: Layout, obs_shape: tuple[int, ...], n_params: int
               ) -> list[Need]:
    """Memory and checkpoint bytes of every rank of the job, by rank."""
    n_ps, n_clients = len(layout.ps_ranks), len(layout.client_ranks)
    shard = -(-n_params // max(n_ps, 1))
    replay = replay_bytes(cfg, obs_shape)
    holds_replay = {Role.REPLAY} | ({Role.ACTOR_LEARNER} if cfg.algo == "gorila" else set())
    needs = []
    for role in layout.roles:
        need = Need()
        if role == Role.PS:
            opt = _optimizer_floats(cfg, shard, n_clients)
            need.memory["process"] = PLAIN_RANK_BYTES
            # windows: parameters and target, double-buffered; one inbox per client; header
            need.memory["windows"] = 4.0 * (4 * shard + n_clients * (shard + 2)) + 8 * (FLAGS + n_clients)
            need.memory["optimizer"] = 4.0 * opt
            need.checkpoint = 4.0 * (2 * shard + opt)
        elif role == Role.REPLAY:
            need.memory["process"] = PLAIN_RANK_BYTES
        else:
            need.memory["process"] = TORCH_RANK_BYTES
        if role in holds_replay:
            need.memory["replay"] = replay
            if cfg.checkpoint_replay:
                need.checkpoint += replay
        needs.append(need)
    return needs


def summary(cfg: Config, layout: Layout, obs_shape, n_params: int,
            hosts: list[str] | None = None) -> dict:
    """Per-host memory and the disk of the checkpoint generations: ``{"hosts": {host: bytes},
    "memory_parts": {host: {part: bytes}}, "generation_bytes", "disk_bytes",
    "rank_memory": [bytes by rank]}``. Without
    ``hosts`` all ranks count as one node (``--dry-run``)."""
    needs = rank_needs(cfg, layout, obs_shape, n_params)
    hosts = hosts or ["one node"] * len(needs)
    per_host: dict[str, dict[str, float]] = {}
    for host, need in zip(hosts, needs):
        parts = per_host.setdefault(host, {})
        for part, b in need.memory.items():
            parts[part] = parts.get(part, 0.0) + b
    generation = sum(n.checkpoint for n in needs)
    return {"memory": {h: sum(p.values()) for h, p in per_host.items()},
            "memory_parts": per_host, "generation_bytes": generation,
            "rank_memory": [n.memory_total for n in needs],
            # checkpoint_keep generations are kept, and the next one is written before the
            # oldest is removed
            "disk_bytes": generation * (cfg.checkpoint_keep + 1)}


def checkpoint_bound_s(generation_bytes: float, watchdog_s: float,
                       min_mb_per_s: float) -> float:
    """Seconds a checkpoint generation may take to be written and gathered before it counts
    as hung: ``watchdog_s`` plus its size at ``min_mb_per_s`` of aggregate bandwidth, at least
    twice ``watchdog_s``. A 700 GB generation of the Gorila paper layout at 100 MB/s: about
    2 hours; a few MB: 2 x watchdog_s."""
    return max(2.0 * watchdog_s, watchdog_s + generation_bytes / (min_mb_per_s * 1e6))


def describe(totals: dict) -> list[str]:
    """Lines for the start-up log and ``--dry-run``."""
    lines = []
    for host, parts in totals["memory_parts"].items():
        detail = ", ".join(f"{k} {v / GB:.2f}" for k, v in parts.items() if v)
        lines.append(f"memory on {host}: {totals['memory'][host] / GB:.2f} GB ({detail})")
    lines.append(f"checkpoints: {totals['generation_bytes'] / GB:.2f} GB per generation, "
                 f"{totals['disk_bytes'] / GB:.2f} GB of disk with checkpoint_keep + 1 "
                 "generations")
    return lines


def memory_available() -> tuple[float, str] | None:
    """The memory this node's job may use, and where that figure comes from: the smallest of
    SLURM's allocation (``SLURM_MEM_PER_NODE``, MB), the cgroup limit and MemAvailable."""
    found = []
    env = os.environ.get("SLURM_MEM_PER_NODE")
    if env and env.isdigit() and int(env) > 0:
        found.append((int(env) * 2.0 ** 20, "SLURM_MEM_PER_NODE"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2 ** 60:
            found.append((float(text), "the cgroup limit"))
            break
    available = mem_available()
    if available is not None:
        found.append((available, "MemAvailable"))
    return min(found) if found else None


def check(cfg: Config, totals: dict, run_dir: Path,
          available: dict[str, tuple[float, str] | None],
          free_disk: tuple[float, str] | None) -> str | None:
    """The one-line refusal, or None when the job fits: each host's memory, plus the
    ``memory_floor_gb`` that the node memory guard keeps free, against what that host allows
    (``available``, from :func:`memory_available` on that host), the checkpoint generations
    against ``free_disk`` (:func:`free_disk_bytes`)."""
    floor = cfg.memory_floor_gb * GB          # the node memory guard keeps this free
    for host, need in totals["memory"].items():
        avail = available.get(host)
        if avail is not None and need + floor > avail[0]:
            parts = totals["memory_parts"][host]
            detail = " + ".join(f"{k} {v / GB:.2f} GB" for k, v in parts.items() if v)
            kept = (f" and keeps memory_floor_gb = {cfg.memory_floor_gb:g} GB free"
                    if floor else "")
            return (f"the job needs {need / GB:.1f} GB of memory on {host} ({detail}){kept}, "
                    f"and {avail[1]} allows {avail[0] / GB:.1f} GB: lower replay_capacity "
                    "(--set replay_capacity=N), use fewer ranks per node, lower "
                    "memory_floor_gb, or --set preflight=false to start anyway")
    if free_disk is not None and totals["disk_bytes"] > free_disk[0]:
        return (f"the checkpoints need {totals['disk_bytes'] / GB:.1f} GB "
                f"(checkpoint_keep {cfg.checkpoint_keep} + 1 generations x "
                f"{totals['generation_bytes'] / GB:.2f} GB) in {run_dir}, which has "
                f"{free_disk[0] / GB:.1f} GB {free_disk[1]}: --set checkpoint_keep=1, --set "
                "checkpoint_replay=false, another run_dir, or --set preflight=false")
    return None


def free_disk_bytes(run_dir: Path, quota: tuple[float, str] | None = None
                    ) -> tuple[float, str]:
    """``(bytes, what they are)`` for the run's checkpoints: the file system's free space, or
    the quota's headroom where that is smaller (``quota``, from
    :func:`hpcrl.io.quota.quota_headroom`), plus what the existing generations hold (they are
    pruned as new ones are written)."""
    free, what = float(shutil.disk_usage(run_dir).free), "free"
    if quota is not None and quota[0] < free:
        free, what = quota[0], f"left under {quota[1]}"
    root = run_dir / "checkpoints"
    if root.is_dir():
        free += sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return free, what
