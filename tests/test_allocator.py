"""The training commands' allocator setting (:mod:`pbscale.runs.allocator`): freed blocks stay
in the process on Linux/glibc, and ``PBNN_KEEP_FREED_MEMORY=0`` leaves glibc's defaults."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from pbscale.runs import allocator

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# a fresh process: allocate 16 MiB, touch it, free it; print the resident set before and after
CHILD = """
import sys
from pbscale.runs.allocator import keep_freed_memory
print(keep_freed_memory())
import numpy as np
def rss():
    with open('/proc/self/status') as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith('VmRSS:'))
a = np.ones(16 << 17)
before = rss()
del a
print(before - rss())
"""


def _freed_kib(keep: str) -> tuple[str, int]:
    env = {**os.environ, allocator.OPT_OUT: keep}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1])


def test_opt_out_leaves_defaults(monkeypatch):
    monkeypatch.setenv(allocator.OPT_OUT, "0")
    assert allocator.keep_freed_memory() is False


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_freed_memory_stays_in_the_process():
    set_, returned = _freed_kib("1")
    assert set_ == "True" and returned < 4 << 10  # the 16 MiB block stays mapped
    set_, returned = _freed_kib("0")
    assert set_ == "False" and returned > 15 << 10  # glibc's default: unmapped at once
