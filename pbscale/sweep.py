"""``python -m pbscale.sweep run|status|results SWEEP.toml``: many runs of one command from a
TOML sweep file, on a local process pool or on Ray.

A sweep file (read with the standard library's ``tomllib``)::

    [sweep]
    command = "regress"        # pbscale.regress or pbscale.prune (COMMANDS)
    out = "runs/regression/epochs300"   # parent folder of the run folders (--out overrides)
    threads = 1                # torch CPU threads per run (passed as --threads)
    cpus = 1                   # CPUs a run occupies: local pool size, Ray num_cpus
    gpus = 0.0                 # GPU fraction a run occupies (Ray num_gpus; local: runs per GPU)

    [base]                     # options shared by every run (the command's flags, _ for -)
    epochs = 300

    [[grid]]                   # every combination of the list values; scalars are fixed
    method = ["loorf", "arms"]
    n = [2, 10, 100, 1000]
    seed = [0, 1, 2]

The sweep is the union of its ``[[grid]]`` blocks (each merged over ``[base]``), duplicates
dropped. Every run is the command's own CLI (``python -m pbscale.regress ... --out OUT``) in a
child process, so it lands in its own hash-named run folder (:mod:`pbscale.loop`): a finished
run is never redone and an interrupted one resumes from its last checkpoint. The sweep keeps
one record and one log per run in ``OUT/sweep-<file stem>/`` (``<id>.json``, ``<id>.log``; the
id is a hash of the command and its options): state (running, finished, failed, interrupted),
return code, run folder, times. A failed run keeps its log and does not stop the others.
SIGTERM or Ctrl-C to ``sweep run`` passes SIGTERM to the running children (they checkpoint and
exit 143) and exits 143; running the same command again goes on where it stopped.

Engines: ``--engine local`` (default) runs ``--jobs`` children at once (default: CPU cores //
``cpus``, and with ``gpus > 0`` at most ``floor(1 / gpus)`` runs per visible GPU, each child
pinned to one GPU with ``CUDA_VISIBLE_DEVICES``). ``--engine ray`` (``pip install -e
".[ray]"``) submits each run as a Ray task declaring ``num_cpus=cpus, num_gpus=gpus``, so small
runs share a GPU; ``--address`` joins an existing cluster (``ray.init(address=...)``; the run
folders must then be on a file system all nodes share), otherwise a local Ray is started with
``--jobs`` CPUs. Both engines run the same child command, so their results are identical.

Batched seeds (``batch = true`` under ``[sweep]``, or ``sweep run --batch``): the ``regress``
runs of MC methods (:data:`pbscale.methods.MC_METHODS`) that differ only in ``seed`` and ``lr``
form groups (:func:`plan`), each one child ``python -m pbscale.batched_seeds --lrs ... --seeds
...`` that steps its members together (one grouped forward per step) and writes each member's run
folder where ``pbscale.regress`` would, to the same numbers up to round-off. A group's seeds x
learning rates is a full product (else it is split per learning rate); a group of one, CP, the
hybrid methods, a run with its own ``chunk`` and ``prune`` sweeps launch as single runs. Records
stay per run (the members' records name the group and share its log ``group-<id>.log``), so
status, results and skipping finished runs are as without batching; a group interrupted and
launched again resumes from its checkpoint under ``OUT/.groups``. A group occupies the
resources of one run (``cpus``, ``gpus``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pbexact.cli import ArgumentParser
from pbexact.errors import PBInputError

from . import io

#: Sweep command name -> module run as ``python -m MODULE`` (it must accept --out and --threads).
COMMANDS = {"regress": "pbscale.regress", "prune": "pbscale.prune"}
ENGINES = ("local", "ray")
STATES = ("finished", "running", "failed", "interrupted", "pending")
#: Keys a sweep may not set per run: the sweep sets them.
RESERVED = ("out", "threads", "quiet")
#: Module of a group of batched runs, and the regress options it takes once per group (the
#: others, seed and lr, as lists).
BATCH_MODULE = "pbscale.batched_seeds"
BATCH_SHARED = ("method", "n", "param", "optimizer", "epochs", "data_seed", "lam", "device")


@dataclass
class Run:
    """One run of a sweep: its options (flag name without ``--``, ``_`` for ``-``) and id."""

    options: dict[str, Any]
    id: str
    #: every option of the command, defaults filled in (what the run's id hashes)
    full: dict[str, Any] = field(default_factory=dict)


@dataclass
class Group:
    """Runs that differ only in seed and lr, trained as one ``python -m pbscale.batched_seeds``
    child: ``seeds`` x ``lrs`` are exactly the members' (seed, lr) pairs. Id ``g`` + hash."""

    runs: list[Run]
    seeds: list[int]
    lrs: list[float]
    id: str


@dataclass
class Sweep:
    """A parsed sweep file (see the module docstring)."""

    path: Path
    command: str
    out: Path
    runs: list[Run]
    threads: int = 1
    cpus: float = 1.0
    gpus: float = 0.0
    extra: dict = field(default_factory=dict)
    batch: bool = False

    @property
    def module(self) -> str:
        return COMMANDS[self.command]

    @property
    def record_dir(self) -> Path:
        """``OUT/sweep-<stem>``: one ``<id>.json`` record and ``<id>.log`` per run."""
        return self.out / f"sweep-{self.path.stem}"

    def argv(self, run: Run) -> list[str]:
        """The command line of one run (after ``python -m MODULE``)."""
        args: list[str] = []
        for key, value in run.options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False:
                args += [flag, str(value)]
        return [*args, "--out", str(self.out), "--threads", str(self.threads), "--quiet"]

    def command_line(self, job: Run | Group) -> list[str]:
        """``-m MODULE ARGS`` of a run's or a group's child (after the Python executable)."""
        if isinstance(job, Run):
            return ["-m", self.module, *self.argv(job)]
        full = job.runs[0].full
        args: list[str] = []
        for key in BATCH_SHARED:
            args += ["--" + key.replace("_", "-"), str(full[key])]
        args += ["--lrs", ",".join(repr(v) for v in job.lrs),
                 "--seeds", ",".join(str(v) for v in job.seeds)]
        return ["-m", BATCH_MODULE, *args, "--out", str(self.out), "--threads",
                str(self.threads), "--quiet"]


def run_id(command: str, options: dict) -> str:
    """First 12 hex digits of the SHA-256 of the command and its options (canonical JSON)."""
    text = json.dumps({"command": command, "options": options}, sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _defaults(module: str) -> dict[str, Any]:
    """{option name (``_`` form): default} of the command's argparse parser."""
    parser = importlib.import_module(module).build_parser()
    return {a.dest: a.default for a in parser._actions
            if a.option_strings and a.dest != "help"}


def expand(base: dict, grids: list[dict]) -> list[dict]:
    """Every combination of the list values of each grid merged over base; duplicates dropped,
    first occurrence order kept. No grid: the base alone."""
    seen: dict[str, dict] = {}
    for grid in grids or [{}]:
        merged = {**base, **grid}
        keys = list(merged)
        lists = [v if isinstance(v, list) else [v] for v in merged.values()]
        for combo in itertools.product(*lists):
            opts = dict(zip(keys, combo))
            seen.setdefault(json.dumps(opts, sort_keys=True), opts)
    return list(seen.values())


def load(path: str | Path, out: str | Path | None = None) -> Sweep:
    """Parse and check a sweep file (one-line :class:`PBInputError` on any problem)."""
    try:
        import tomllib  # standard library from Python 3.11
    except ModuleNotFoundError:
        raise PBInputError("sweep files are read with tomllib, new in Python 3.11; run the sweep "
                           "with Python >= 3.11") from None
    path = Path(path)
    if not path.is_file():
        raise PBInputError(f"sweep file {path} not found; give the path of a .toml sweep file "
                           "(examples in sweeps/)")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise PBInputError(f"{path} is not valid TOML ({e}); fix the file") from None
    unknown = set(doc) - {"sweep", "base", "grid"}
    if unknown:
        raise PBInputError(f"{path}: unknown table {sorted(unknown)[0]!r}; use [sweep], [base] "
                           "and [[grid]]")
    head = doc.get("sweep", {})
    command = head.get("command")
    if command not in COMMANDS:
        raise PBInputError(f"{path}: [sweep] command must be one of {', '.join(COMMANDS)}, got "
                           f"{command!r}")
    bad = set(head) - {"command", "out", "threads", "cpus", "gpus", "description", "batch"}
    if bad:
        raise PBInputError(f"{path}: unknown [sweep] key {sorted(bad)[0]!r}; use command, out, "
                           "threads, cpus, gpus, batch, description")
    batch = head.get("batch", False)
    if not isinstance(batch, bool):
        raise PBInputError(f"{path}: [sweep] batch must be true or false, got {batch!r}")
    target = out if out is not None else head.get("out")
    if not target:
        raise PBInputError(f"{path}: no output folder; set [sweep] out or pass --out")
    threads, cpus, gpus = head.get("threads", 1), head.get("cpus", 1), head.get("gpus", 0.0)
    if not isinstance(threads, int) or threads < 1:
        raise PBInputError(f"{path}: [sweep] threads must be a positive integer, got {threads!r}")
    if not (isinstance(cpus, (int, float)) and cpus > 0):
        raise PBInputError(f"{path}: [sweep] cpus must be > 0, got {cpus!r}")
    if not (isinstance(gpus, (int, float)) and 0 <= gpus and (gpus <= 1 or gpus == int(gpus))):
        raise PBInputError(f"{path}: [sweep] gpus is a GPU fraction in [0, 1] or a whole number, "
                           f"got {gpus!r}")
    base = doc.get("base", {})
    grids = doc.get("grid", [])
    if not isinstance(base, dict) or not isinstance(grids, list):
        raise PBInputError(f"{path}: [base] must be a table and [[grid]] an array of tables")
    defaults = _defaults(COMMANDS[command])
    flags = set(defaults)
    for table in [base, *grids]:
        for key, value in table.items():
            if key in RESERVED:
                raise PBInputError(f"{path}: {key!r} is set by the sweep; remove it (use [sweep] "
                                   "out / threads)")
            if key not in flags:
                raise PBInputError(f"{path}: python -m {COMMANDS[command]} has no option "
                                   f"--{key.replace('_', '-')}; fix the key {key!r}")
            values = value if isinstance(value, list) else [value]
            if not values or any(isinstance(v, (dict, list)) for v in values):
                raise PBInputError(f"{path}: {key!r} must be a value or a non-empty list of "
                                   "values")
    # a run is named by all its options, defaults filled in, so that a run listed twice (once
    # with a default spelled out, once without) is one run
    runs: dict[str, Run] = {}
    for o in expand(base, grids):
        full = {k: v for k, v in {**defaults, **o}.items() if k not in RESERVED}
        key = run_id(command, full)
        runs.setdefault(key, Run(o, key, full))
    return Sweep(path, command, Path(target).absolute(), list(runs.values()), threads,
                 float(cpus), float(gpus), extra={"description": head.get("description", "")},
                 batch=batch)


def _batchable(sweep: Sweep, run: Run) -> bool:
    """A regress run of an MC method whose options batched_seeds takes (no own chunk)."""
    from .methods import MC_METHODS
    full = run.full
    return (sweep.command == "regress" and full.get("method") in MC_METHODS
            and full.get("chunk") is None
            and set(full) <= {*BATCH_SHARED, "seed", "lr", "chunk"})


def _group(runs: list[Run], seeds: list[int], lrs: list[float]) -> Group:
    ids = ",".join(sorted(r.id for r in runs))
    return Group(runs, seeds, lrs, "g" + hashlib.sha256(ids.encode()).hexdigest()[:11])


def plan(sweep: Sweep, runs: list[Run]) -> list[Run | Group]:
    """The children that run ``runs``: batchable runs (:func:`_batchable`) that differ only in
    seed and lr form :class:`Group` s, one per setting whose (seed, lr) pairs are a full
    product of its seeds and learning rates, else one per learning rate; groups of one and
    other runs stay single :class:`Run` s. Groups come first, in order of their first run;
    seeds and learning rates sorted, so the same runs always form the same group (and a group
    launched again resumes its checkpoint)."""
    settings: dict[str, list[Run]] = {}
    singles: list[Run | Group] = []
    for r in runs:
        if _batchable(sweep, r):
            key = json.dumps({k: v for k, v in r.full.items() if k not in ("seed", "lr")},
                             sort_keys=True, default=str)
            settings.setdefault(key, []).append(r)
        else:
            singles.append(r)
    groups: list[Run | Group] = []
    for members in settings.values():
        pairs = {(int(r.full["seed"]), float(r.full["lr"])): r for r in members}
        seeds, lrs = sorted({s for s, _ in pairs}), sorted({lr for _, lr in pairs})
        if len(pairs) == len(seeds) * len(lrs):
            parts = [(seeds, lrs)]
        else:  # not a product: one group per learning rate
            parts = [(sorted(s for s, v in pairs if v == lr), [lr]) for lr in lrs]
        for ss, ls in parts:
            part = [pairs[(s, lr)] for lr in ls for s in ss]
            if len(part) == 1:
                singles.append(part[0])
            else:
                groups.append(_group(part, ss, ls))
    return groups + singles


def members(job: Run | Group) -> list[Run]:
    return job.runs if isinstance(job, Group) else [job]


# ---------------------------------------------------------------------- records


def _record_path(sweep: Sweep, run: Run) -> Path:
    return sweep.record_dir / f"{run.id}.json"


def read_record(sweep: Sweep, run: Run) -> dict | None:
    p = _record_path(sweep, run)
    if not p.exists():
        return None
    try:
        return io.read_json(p)
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def state_of(sweep: Sweep, run: Run) -> str:
    """finished / running / failed / interrupted / pending (no record). A record left
    "running" by a process that no longer exists on this host counts as interrupted."""
    rec = read_record(sweep, run)
    if rec is None:
        return "pending"
    state = rec.get("state", "pending")
    if state == "running" and rec.get("host") == os.uname().nodename:
        if not _alive(int(rec.get("pid", 0))):
            return "interrupted"
    return state


def launch(sweep: Sweep, job: Run | Group, env: dict | None = None,
           procs: dict | None = None) -> int:
    """Run one child (a run, or a :class:`Group` of batched runs) to its end, output appended
    to ``<id>.log`` (a group: ``group-<id>.log``); writes each run's record before and after;
    returns the child's exit code. ``procs`` (id -> Popen) lets the caller signal children."""
    from .batched_seeds import member_key
    sweep.record_dir.mkdir(parents=True, exist_ok=True)
    grouped = isinstance(job, Group)
    log = sweep.record_dir / (f"group-{job.id}.log" if grouped else f"{job.id}.log")
    cmd = [sys.executable, *sweep.command_line(job)]
    if grouped:
        info = {"sweep": sweep.path.stem, "sweep_ids": {
            member_key(r.full["seed"], r.full["lr"]): r.id for r in job.runs}}
    else:
        info = {"sweep": sweep.path.stem, "sweep_id": job.id}
    recs = {r.id: {"id": r.id, "command": sweep.command, "options": r.options,
                   "argv": cmd[1:], "log": str(log), "host": os.uname().nodename,
                   **({"group": job.id} if grouped else {})} for r in members(job)}
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(cmd[1:])}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {}),
                                     "PBSCALE_RUN_INFO": json.dumps(info)},
                                start_new_session=True)
        if procs is not None:
            procs[job.id] = proc
        for r in members(job):
            io.write_json(_record_path(sweep, r), {**recs[r.id], "state": "running",
                                                   "pid": proc.pid, "started": t0})
        code = proc.wait()
        if procs is not None:
            procs.pop(job.id, None)
        fh.write(f"# exit code {code}\n")
    state = "finished" if code == 0 else ("interrupted" if code in (143, -15) else "failed")
    for r in members(job):
        io.write_json(_record_path(sweep, r), {**recs[r.id], "state": state,
                                               "returncode": code, "started": t0,
                                               "seconds": time.time() - t0})
    return code


def _per_run(jobs: list[Run | Group], codes: list[int]) -> dict[str, int]:
    """{run id: exit code of the child that ran it}."""
    return {r.id: c for job, c in zip(jobs, codes) for r in members(job)}


# ---------------------------------------------------------------------- engines


def default_jobs(sweep: Sweep) -> int:
    """Local pool size: CPU cores // cpus per run, and with GPUs at most floor(1/gpus) runs per
    visible GPU."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    jobs = max(1, int((cores or 1) // sweep.cpus))
    if sweep.gpus > 0:
        jobs = min(jobs, max(1, _gpu_count() * _per_gpu(sweep.gpus)))
    return jobs


def _per_gpu(gpus: float) -> int:
    return max(1, math.floor(1 / gpus + 1e-9)) if gpus <= 1 else 1


def _gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch CUDA: no GPU
        return 0


def todo(sweep: Sweep, retry_failed: bool = True) -> list[Run]:
    """Runs not finished (failed ones too unless retry_failed is False)."""
    skip = {"finished"} | (set() if retry_failed else {"failed"})
    return [r for r in sweep.runs if state_of(sweep, r) not in skip]


def run_local(sweep: Sweep, runs: list[Run | Group], jobs: int) -> dict[str, int]:
    """A pool of ``jobs`` children (runs or groups); returns {run id: exit code}.
    SIGTERM/SIGINT: children get SIGTERM (they checkpoint), nothing new starts, and
    :class:`SystemExit` (143) is raised."""
    procs: dict[str, subprocess.Popen] = {}
    stop = threading.Event()
    n_gpu = _gpu_count() if sweep.gpus > 0 else 0
    slots: list[int] = list(range(jobs))
    slot_lock = threading.Lock()

    def one(run: Run | Group) -> int:
        if stop.is_set():
            return -1
        with slot_lock:
            slot = slots.pop()
        try:
            env = ({"CUDA_VISIBLE_DEVICES": str((slot // _per_gpu(sweep.gpus)) % n_gpu)}
                   if n_gpu else None)
            return launch(sweep, run, env, procs)
        finally:
            with slot_lock:
                slots.append(slot)

    def on_signal(signum, _frame):
        stop.set()
        for p in list(procs.values()):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            codes = _per_run(runs, list(pool.map(one, runs)))
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if stop.is_set():
        raise SystemExit(143)
    return codes


def run_ray(sweep: Sweep, runs: list[Run | Group], jobs: int, address: str | None
            ) -> dict[str, int]:
    """Each run (or group) a Ray task declaring num_cpus=cpus, num_gpus=gpus; returns {run id:
    code}."""
    try:
        import ray
    except ImportError:
        raise PBInputError('--engine ray needs Ray; install the extra: pip install -e ".[ray]"'
                           ) from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=sweep.cpus, num_gpus=sweep.gpus, max_retries=0)(launch)
        refs = [task.remote(sweep, r) for r in runs]
        return _per_run(runs, ray.get(refs))
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------- CLI


def status(sweep: Sweep) -> dict[str, list[Run]]:
    """Runs grouped by state (STATES order)."""
    groups: dict[str, list[Run]] = {s: [] for s in STATES}
    for r in sweep.runs:
        groups[state_of(sweep, r)].append(r)
    return groups


def results(sweep: Sweep) -> list[dict]:
    """One row per finished run: its options, then ``folder`` and the run's summary.json
    (``final_*`` metrics, seconds). A run's folder is the one under ``out`` whose config.json
    "info" holds the run's sweep id (the sweep passes it to the child in $PBSCALE_RUN_INFO)."""
    folders = folder_index(sweep.out)
    rows = []
    for r in sweep.runs:
        folder = folders.get(r.id)
        if folder is None or not (folder / "summary.json").exists():
            continue
        rows.append({**r.options, "folder": str(folder), **io.read_json(folder / "summary.json")})
    return rows


def folder_index(out: Path) -> dict[str, Path]:
    """{sweep run id: run folder} over the run folders directly under ``out``."""
    index = {}
    for cfg in sorted(out.glob("*/config.json")):
        try:
            info = io.read_json(cfg).get("info", {})
        except (OSError, ValueError):
            continue
        if "sweep_id" in info:
            index[info["sweep_id"]] = cfg.parent
    return index


def _print_status(sweep: Sweep, verbose: bool) -> None:
    groups = status(sweep)
    total = len(sweep.runs)
    print(f"{sweep.path}: {total} runs of python -m {sweep.module} in {sweep.out}")
    print("  " + ", ".join(f"{s} {len(groups[s])}" for s in STATES))
    for s in ("failed", "running", "interrupted"):
        for r in groups[s]:
            log = (read_record(sweep, r) or {}).get("log", sweep.record_dir / f"{r.id}.log")
            print(f"  {s:<11} {r.id}  {_label(r)}  log: {log}")
    if verbose:
        for s in ("finished", "pending"):
            for r in groups[s]:
                print(f"  {s:<11} {r.id}  {_label(r)}")


def _label(run: Run) -> str:
    return " ".join(f"{k}={v}" for k, v in run.options.items())


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m pbscale.sweep",
                                description="Run a TOML sweep of pbscale runs (resumable), show "
                                "its status, or tabulate its results.")
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="run every unfinished run of the sweep")
    r.add_argument("sweep", help="sweep file (.toml)")
    r.add_argument("--engine", default="local", help="local (process pool, default) or ray")
    r.add_argument("--jobs", type=int, default=0,
                   help="runs at once (local) / CPUs of a local Ray (default: from the machine)")
    r.add_argument("--address", default=None, help="Ray cluster address (default: start a "
                   "local Ray)")
    r.add_argument("--out", default=None, help="parent folder of the runs (overrides the file)")
    r.add_argument("--no-retry", action="store_true", help="leave failed runs alone")
    r.add_argument("--dry-run", action="store_true", help="print the command lines only")
    r.add_argument("--batch", action="store_true", help="batched seeds: runs differing only in "
                   "seed and lr train together in one python -m pbscale.batched_seeds child "
                   "(also [sweep] batch = true)")
    s = sub.add_parser("status", help="finished / running / failed / interrupted / pending")
    s.add_argument("sweep")
    s.add_argument("--out", default=None)
    s.add_argument("-v", "--verbose", action="store_true", help="list every run")
    t = sub.add_parser("results", help="one CSV row per finished run (options + summary)")
    t.add_argument("sweep")
    t.add_argument("--out", default=None)
    t.add_argument("--csv", required=True, help="file to write")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sweep = load(args.sweep, args.out)
        if args.action == "status":
            _print_status(sweep, args.verbose)
            return 0
        if args.action == "results":
            rows = results(sweep)
            if not rows:
                raise PBInputError(f"no finished runs of {sweep.path} in {sweep.out}; run the "
                                   "sweep first")
            keys = list(dict.fromkeys(k for row in rows for k in row))
            io.write_csv(args.csv, [{k: row.get(k, "") for k in keys} for row in rows])
            print(f"wrote {len(rows)} rows to {args.csv}")
            return 0
        if args.engine not in ENGINES:
            raise PBInputError(f"unknown engine {args.engine!r}; use local or ray")
        if args.jobs < 0:
            raise PBInputError(f"--jobs must be >= 1 (0: from the machine), got {args.jobs}")
        runs = todo(sweep, retry_failed=not args.no_retry)
        children = plan(sweep, runs) if (args.batch or sweep.batch) else list(runs)
        if args.dry_run:
            for c in children:
                print(" ".join(["python", *sweep.command_line(c)]))
            return 0
        jobs = args.jobs or default_jobs(sweep)
        n_groups = sum(isinstance(c, Group) for c in children)
        batched = (f" ({n_groups} batched groups, {len(children)} children)"
                   if args.batch or sweep.batch else "")
        print(f"{len(sweep.runs) - len(runs)} of {len(sweep.runs)} runs already finished; "
              f"running {len(runs)}{batched} with --engine {args.engine} ({jobs} at once)",
              file=sys.stderr, flush=True)
        if args.engine == "ray":
            codes = run_ray(sweep, children, jobs, args.address)
        else:
            codes = run_local(sweep, children, jobs)
    except PBInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = [i for i, c in codes.items() if c != 0]
    _print_status(sweep, verbose=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
