"""What the CPU offers that a config's speed depends on, read without importing torch.

``learner_precision = "bfloat16"`` pays off only where the cores have bfloat16 instructions
(AVX512-BF16 or AMX-BF16: Intel Cooper Lake, Sapphire Rapids and later, AMD Zen 4 and later);
elsewhere oneDNN emulates the type in float32 and the learner may run slower than plain float32.
The default job and ``configs/gorila_pong.toml`` set it, so a user on older cores is told at
start rather than left with a slow run. Rank 0 reads its own node's flags: on a partition of
mixed nodes the learners' may differ.
"""

from __future__ import annotations

from pathlib import Path

#: /proc/cpuinfo flags of native bfloat16 arithmetic.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str) -> set[str] | None:
    """The first ``flags`` line of a /proc/cpuinfo text as a set; None where there is none
    (not Linux x86: nothing known, nothing said)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return None


def bfloat16_note(learner_precision: str, cpuinfo: str | None = None) -> str | None:
    """The start-up warning for a bfloat16 learner on cores without bfloat16 instructions,
    else None. ``cpuinfo``: the text of /proc/cpuinfo (read when not given)."""
    if learner_precision != "bfloat16":
        return None
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = cpu_flags(cpuinfo)
    if flags is None or flags & BF16_FLAGS:
        return None
    return ("warning: learner_precision = \"bfloat16\" on cores without bfloat16 instructions "
            "(no avx512_bf16 or amx_bf16 in rank 0's /proc/cpuinfo): the learner may run "
            "slower than in float32; --set learner_precision=float32 for a float32 learner "
            "(the recorded runs used bfloat16)")
