"""The start-up warning for a bfloat16 learner on cores without bfloat16 instructions."""

from __future__ import annotations

from hpcrl.runtime.hardware import bfloat16_note, cpu_flags

SKYLAKE = ("processor\t: 0\nvendor_id\t: GenuineIntel\n"
           "flags\t\t: fpu sse2 avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni\n"
           "bugs\t\t: spectre_v1\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN4 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16\n"
AARCH64 = "processor\t: 0\nFeatures\t: fp asimd bf16\nCPU implementer\t: 0x41\n"


def test_cpu_flags_reads_the_first_flags_line():
    assert cpu_flags(SKYLAKE) == {"fpu", "sse2", "avx2", "avx512f", "avx512dq", "avx512bw",
                                  "avx512vl", "avx512_vnni"}
    assert cpu_flags(AARCH64) is None


def test_only_a_bfloat16_learner_on_cores_without_bfloat16_is_warned():
    note = bfloat16_note("bfloat16", SKYLAKE)
    assert note.startswith('warning: learner_precision = "bfloat16" on cores without bfloat16 '
                           "instructions") and "--set learner_precision=float32" in note
    assert bfloat16_note("bfloat16", SAPPHIRE_RAPIDS) is None
    assert bfloat16_note("bfloat16", ZEN4) is None
    assert bfloat16_note("float32", SKYLAKE) is None
    assert bfloat16_note("bfloat16", AARCH64) is None      # flags unknown: nothing claimed
    assert bfloat16_note("bfloat16", "") is None
