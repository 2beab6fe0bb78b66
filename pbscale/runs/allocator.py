"""The C allocator setting of the training commands: on Linux with glibc, freed memory stays in
the process instead of going back to the system.

A step allocates and frees vectors of a few MiB many times (theta, the affine scores, the
estimate over the P mask logits, the chunk's masks). glibc serves blocks above its mmap threshold
(128 KiB at start, raised dynamically up to 32 MiB) with fresh ``mmap`` pages and gives the top
of its heap back above its trim threshold, so the next allocation of the same size page-faults
its memory in again: at LeNet's d about 30% of a REINFORCE n = 1 step.
:func:`keep_freed_memory` fixes the mmap threshold at :data:`MMAP_THRESHOLD` (glibc's own
dynamic ceiling) and raises the trim threshold to :data:`TRIM_THRESHOLD` (``mallopt``), so such
blocks come from the heap and stay mapped once touched, while larger ones (a data set, one-shot
masks) are still mapped and unmapped on their own. The cost: heap memory freed after a peak
is kept by the process (its resident set does not shrink back); the peak is not raised (a LeNet
pruning epoch: the same peak resident set). ``PBNN_KEEP_FREED_MEMORY=0`` in the environment
leaves glibc's defaults; elsewhere (no glibc, not Linux) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: ``mallopt`` parameters of glibc's malloc.h.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Blocks up to this size (32 MiB) come from the heap.
MMAP_THRESHOLD = 32 << 20
#: The heap is not trimmed until this much (1 GiB) is free at its top.
TRIM_THRESHOLD = 1 << 30
#: The environment variable that opts out (``0``).
OPT_OUT = "PBNN_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (:data:`MMAP_THRESHOLD`, :data:`TRIM_THRESHOLD`)
    for this process; True when
    set, False where it does not apply (not Linux, no glibc, ``PBNN_KEEP_FREED_MEMORY=0``).
    Call it once when a command starts, before its tensors are made."""
    if os.environ.get(OPT_OUT, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap_set = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return mmap_set & bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
