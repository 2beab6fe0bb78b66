"""Sweep engines: a local pool of child processes, or Ray tasks; both launch the same child
command (:func:`pbscale.sweep.records.launch`), so their results are identical.

Both print one line per run to stderr as it starts (local pool; Ray prints one line when the
tasks are submitted) and as it ends (finished, failed or interrupted). SIGTERM or Ctrl-C stops
the sweep: running children get SIGTERM (they checkpoint and exit 143), Ray tasks are cancelled
(their children get SIGTERM the same way), nothing new starts, and :class:`Interrupted` is
raised with the exit codes so far.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pbexact.errors import PBInputError

from .file import Group, Run, Sweep, label, members
from .records import launch, per_run, read_record

#: Most runs one local pool or local Ray runs at once.
MAX_JOBS = 1024
#: Exit code that stands for a child the sweep stopped (SIGTERM).
STOPPED = 143


class Interrupted(Exception):  # noqa: N818 - what happened, not an error
    """SIGTERM or Ctrl-C stopped the sweep; ``codes`` holds {run id: exit code} of the runs
    that ended."""

    def __init__(self, codes: dict[str, int]):
        super().__init__("sweep interrupted")
        self.codes = codes


def per_gpu(gpus: float) -> int:
    """Runs that share one GPU: floor(1 / gpus) for a fraction, else 1."""
    return max(1, math.floor(1 / gpus + 1e-9)) if gpus <= 1 else 1


def gpu_count() -> int:
    """CUDA devices torch sees (0 without torch CUDA)."""
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch CUDA: no GPU
        return 0


def default_jobs(sweep: Sweep) -> int:
    """Local pool size: CPU cores // cpus per run, and with GPUs at most floor(1/gpus) runs per
    visible GPU."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    jobs = max(1, int((cores or 1) // sweep.cpus))
    if sweep.gpus > 0:
        jobs = min(jobs, max(1, gpu_count() * per_gpu(sweep.gpus)))
    return min(jobs, MAX_JOBS)


class Progress:
    """One line per run to stderr as it starts and ends, with a time stamp and a count of the
    runs ended out of ``total``."""

    def __init__(self, sweep: Sweep, total: int):
        self.sweep, self.total, self.ended = sweep, total, 0
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        with self.lock:
            print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)

    def started(self, job: Run | Group) -> None:
        if isinstance(job, Group):
            self.say(f"started     group {job.id} ({len(job.runs)} runs: {job.text()})")
        else:
            self.say(f"started     {job.id}  {label(job)}")

    def ended_job(self, job: Run | Group) -> None:
        for r in members(job):
            rec = read_record(self.sweep, r) or {}
            state = rec.get("state", "failed")
            where = f"  log: {rec.get('log', '')}" if state != "finished" else ""
            with self.lock:
                self.ended += 1
                n = self.ended
            self.say(f"{state:<11} {r.id}  {label(r)}  [{n}/{self.total}]{where}")


def run_local(sweep: Sweep, runs: list[Run | Group], jobs: int,
              progress: Progress | None = None) -> dict[str, int]:
    """A pool of ``jobs`` children (runs or groups); returns {run id: exit code}.
    SIGTERM/SIGINT: children get SIGTERM (they checkpoint), nothing new starts, and
    :class:`Interrupted` is raised. Any child still running when this returns (an error in the
    sweep itself) gets SIGTERM."""
    procs: dict[str, subprocess.Popen] = {}
    stop = threading.Event()
    n_gpu = gpu_count() if sweep.gpus > 0 else 0
    jobs = max(1, min(jobs, len(runs)))
    slots: list[int] = list(range(jobs))
    slot_lock = threading.Lock()

    def one(run: Run | Group) -> int | None:
        if stop.is_set():
            return None
        with slot_lock:
            slot = slots.pop()
        try:
            env = ({"CUDA_VISIBLE_DEVICES": str((slot // per_gpu(sweep.gpus)) % n_gpu)}
                   if n_gpu else None)
            if progress is not None:
                progress.started(run)
            code = launch(sweep, run, env, procs)
            if progress is not None:
                progress.ended_job(run)
            return code
        finally:
            with slot_lock:
                slots.append(slot)

    def terminate_children() -> None:
        for p in list(procs.values()):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()
        terminate_children()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, runs))
    finally:
        terminate_children()
        for s, h in old.items():
            signal.signal(s, h)
    done = [(job, c) for job, c in zip(runs, results) if c is not None]
    codes = per_run([j for j, _ in done], [c for _, c in done])
    if stop.is_set():
        raise Interrupted(codes)
    return codes


def ray_runtime_env() -> dict:
    """What a Ray worker needs to start the children: this checkout first on PYTHONPATH (the
    sweep's own code, at the path it has here; on a cluster the same path on every node)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {"env_vars": {"PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root}}


def launch_in(cwd: str, sweep: Sweep, job: Run | Group) -> int:
    """:func:`launch` from the folder ``cwd`` (the sweep's working folder, so relative paths in
    the options mean what they mean there) where it exists, else from the worker's folder."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    return launch(sweep, job)


def require_ray() -> Any:
    """The ``ray`` module, or a one-line :class:`PBInputError` naming the extra that installs
    it (``sweep run --engine ray`` asks before it prints or writes anything)."""
    try:
        import ray
    except ImportError:
        raise PBInputError('--engine ray needs Ray; install the extra: pip install -e ".[ray]"'
                           ) from None
    return ray


def run_ray(sweep: Sweep, runs: list[Run | Group], jobs: int, address: str | None,
            progress: Progress | None = None) -> dict[str, int]:
    """Each run (or group) a Ray task declaring num_cpus=cpus, num_gpus=gpus; returns {run id:
    code}. The tasks get :func:`ray_runtime_env` and run from the sweep's working folder.
    SIGTERM/SIGINT cancel the tasks (a running one stops its child with SIGTERM and records it
    interrupted) and raise :class:`Interrupted`."""
    ray = require_ray()
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False, runtime_env=ray_runtime_env())
        else:
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False,
                     runtime_env=ray_runtime_env())
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        task = ray.remote(num_cpus=sweep.cpus, num_gpus=sweep.gpus, max_retries=0)(launch_in)
        pending = {task.remote(os.getcwd(), sweep, r): r for r in runs}
        if progress is not None:
            progress.say(f"submitted   {len(pending)} Ray tasks")
        done: list[tuple[Run | Group, int]] = []
        cancelled = False
        while pending:
            if stop.is_set() and not cancelled:
                for ref in pending:
                    ray.cancel(ref)
                cancelled = True
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                job = pending.pop(ref)
                try:
                    code = ray.get(ref)
                except Exception:  # noqa: BLE001 - a cancelled or crashed task
                    code = STOPPED if stop.is_set() else 1
                    if stop.is_set() and read_record(sweep, members(job)[0]) is None:
                        continue  # cancelled before it started: still pending
                done.append((job, code))
                if progress is not None:
                    progress.ended_job(job)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if started:
            ray.shutdown()
    codes = per_run([j for j, _ in done], [c for _, c in done])
    if stop.is_set():
        raise Interrupted(codes)
    return codes
