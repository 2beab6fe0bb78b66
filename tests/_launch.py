"""Helpers of the tests that launch worker processes (torchrun with gloo, K = 2; sweeps that
are interrupted)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
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


def sigterm_when(cmd: list[str], env: dict, ready: Callable[[], bool],
                 timeout: float = 300) -> tuple[subprocess.Popen, bool]:
    """Start ``cmd`` (stdout and stderr piped) and send it SIGTERM as soon as ``ready()`` holds
    (polled every 50 ms); returns (the process, whether it was signalled before it ended or
    ``timeout`` seconds passed)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if ready():
            proc.send_signal(signal.SIGTERM)
            return proc, True
        time.sleep(0.05)
    return proc, False
