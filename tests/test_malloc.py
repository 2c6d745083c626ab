"""The fixed glibc mmap threshold (hpcrl.runtime.malloc), observed through glibc's own counts."""

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

# In a fresh process: free a 4 MiB block (glibc then raises its threshold to 4 MiB unless it
# was fixed), then allocate 2 MiB and print how many mmapped blocks that added (mallinfo2).
PROBE = """
    import ctypes, sys
    import numpy as np
    from hpcrl.runtime.malloc import fix_mmap_threshold

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost").split()]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] != "0":
        assert fix_mmap_threshold(int(sys.argv[1]))
    big = np.ones(4 << 20, np.uint8)
    del big
    before = libc.mallinfo2().hblks
    block = np.ones(2 << 20, np.uint8)
    print(libc.mallinfo2().hblks - before)
"""


def _mapped_blocks_added(threshold_kb: int) -> int:
    env = {k: v for k, v in os.environ.items()   # glibc's own rule, whatever the caller set
           if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE), str(threshold_kb)],
                         capture_output=True, text=True, check=True, env=env).stdout
    return int(out)


def test_a_fixed_threshold_keeps_large_blocks_out_of_the_heap():
    libc = ctypes.CDLL(None)
    if not (hasattr(libc, "mallopt") and hasattr(libc, "mallinfo2")):
        pytest.skip("needs glibc >= 2.33 (mallopt, mallinfo2)")
    assert _mapped_blocks_added(0) == 0        # glibc's own rule: 2 MiB now comes from the heap
    assert _mapped_blocks_added(1024) == 1     # fixed at 1 MiB: its own mapping, as 4 MiB had

