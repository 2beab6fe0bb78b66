"""Child processes that do not outlive their parent: a ``preexec_fn`` for ``subprocess.Popen``
(a sweep's runs in :mod:`pbscale.sweep.records`, the report's unit workers in
:mod:`analysis.microworld.units`), so that a parent killed with SIGKILL leaves no orphan."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

#: Linux ``prctl`` option: the signal a process gets when its parent thread dies.
PR_SET_PDEATHSIG = 1


def _prctl() -> Any:
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    if not name:
        return None
    try:
        return ctypes.CDLL(name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


#: libc's ``prctl`` on Linux; None elsewhere (there a child is not told of its parent's death).
PRCTL = _prctl()


def die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` under which the child gets SIGTERM when its parent dies (Linux
    ``PR_SET_PDEATHSIG``; elsewhere nothing), and exits at once (143) if the parent ``parent``
    is already gone."""
    def setup() -> None:
        if PRCTL is not None:
            PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(143)
    return setup
