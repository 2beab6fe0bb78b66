"""Helpers of the tests that launch worker processes (torchrun with gloo, K = 2)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker_env() -> dict:
    """The environment of a worker: one thread, this checkout first on PYTHONPATH."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for torchrun's --master_port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
