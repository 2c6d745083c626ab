"""A fixed glibc mmap threshold for every rank (``malloc_mmap_threshold_kb``).

glibc serves an allocation above its mmap threshold (128 KiB at start) with a mapping of its
own, returned to the system when freed, and raises the threshold to the size of every such
block freed, up to 32 MiB. After the first ~1 MB tensor of a training step is freed, tensors of
that size come from the heap instead; between the step's many small allocations the freed ones
leave holes that later ones do not fit, and the heap grows without bound while what is in use
stays flat. Measured on the 20-rank A3C LSTM job (docs/experiments/a3c-paper.md): each
actor-learner held 128 MB in use while the free memory inside its heap grew by about 3 MB/s;
with the threshold fixed at 1 MiB (or 128 KiB) it stayed flat. A threshold set by ``mallopt``
stays where it is put (glibc's adjustment is off from then on).

Only glibc has ``mallopt``; elsewhere nothing is changed.
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def fix_mmap_threshold(threshold_kb: int) -> bool:
    """Sets glibc's mmap threshold to ``threshold_kb`` KiB for this process; whether it took."""
    try:
        mallopt = ctypes.CDLL(None).mallopt        # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, int(threshold_kb) * 1024) == 1
