"""Peak-memory measurement for one call: CUDA's allocator counter on GPU; on CPU the growth of
the process's peak resident set (VmHWM, reset through /proc/self/clear_refs, Linux only); and
the memory the process may still take on the CPU (:func:`cpu_available`)."""

from __future__ import annotations

import resource
from collections.abc import Callable
from pathlib import Path

import torch


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key))


def peak_memory(fn: Callable[[], object], device: torch.device | str = "cpu") -> int | None:
    """Bytes by which peak memory rises above its level before ``fn`` runs (None where it cannot
    be measured). CPU numbers include allocator slack, so compare them at the MiB scale."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if not Path("/proc/self/clear_refs").exists():
        return None
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current resident set
    before = _status("VmRSS:")
    fn()
    return _status("VmHWM:") - before


def cpu_available() -> int:
    """Bytes the process may still allocate on the CPU: the machine's MemAvailable
    (``/proc/meminfo``; 2 GiB assumed without it), bounded by what the address-space limit
    (``ulimit -v``) leaves the process."""
    free = 2 * 2**30
    try:
        with open("/proc/meminfo") as fh:
            free = next(int(line.split()[1]) * 1024 for line in fh
                        if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        pass
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return free
    try:
        used = _status("VmSize:")
    except (OSError, StopIteration, ValueError):
        return free
    return max(min(free, limit - used), 0)
