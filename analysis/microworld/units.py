"""The units of ``python -m analysis.report`` and the runner that computes them.

A unit is one call of a tool's command line (``module.main(argv)``) whose results live in their
own folder ``RESULTS/units/<unit.name>-<key>/``, keyed by its settings as run folders are by
their hash (``key``: the first 10 hex digits of the SHA-256 of ``unit.record(settings)``), so
units of other settings (another ``--seeds``, ``--steps`` ...) stay side by side and are never
replaced. A folder is marked finished by ``unit.json`` (the unit's recorded settings, its wall
time and its command); a unit is reused when ``unit.json`` records the requested settings and its
result files exist. A finished folder of an older version, ``RESULTS/units/<unit.name>/``, is
renamed to its key when its settings are the requested ones.

Any frozen dataclass with the attributes of :class:`ReportUnit` is a unit: the runner needs its
folder name, the module it runs, the command line for a folder, the settings it records, the
files that must exist when it is finished and a relative cost (units are started longest first).
:class:`Unit` is the microworld's (`tab:app_results_summ`); another kind of unit (another study)
is one more such class, run by the same :func:`run_units`.

A unit never destroys a finished result: it is built in a partial folder beside its folder and
swapped in only when its tool succeeded (`pbexact.io.replace_folder`). A tool's one-line error
(:class:`PBInputError` or an argparse error) or a failed write (disk full) stops the study with
that line and the unit's name.

Units run in parallel (``jobs`` > 1) in worker processes that die with the study: on Linux the
kernel sends them SIGTERM when the study's process dies, even by SIGKILL (``PR_SET_PDEATHSIG``),
and they ignore Ctrl-C, which the study handles; a study stopped by an exception, Ctrl-C or
SIGTERM terminates its running workers before it returns (their partial folders are removed by
the next run).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib
import json
import multiprocessing
import os
import shutil
import signal
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from analysis.cli import write_json
from analysis.microworld.claims import ConfigResult, UnitResult
from analysis.microworld.hybrid import DETERMINISTIC_TORCH
from pbexact.errors import PBInputError
from pbexact.instances import BENCHMARKS
from pbexact.io import NO_SPACE, WriteError, new_partial_folder, replace_folder
from pbexact.processes import die_with_parent

EXPERIMENTS = ("estimators", "params", "approaches")
#: Relative cost of one microworld unit at the paper's scale (measured, d = 10 estimators = 1):
#: the longest units are started first so that the parallel run ends soon after the longest one.
COST = {("approaches", 10): 5.5, ("approaches", 4): 4.6, ("params", 10): 1.6,
        ("estimators", 10): 1.0, ("params", 4): 0.8, ("estimators", 4): 0.4}


class ReportUnit(Protocol):
    """What :func:`run_units` needs of a unit (picklable: units run in worker processes)."""

    @property
    def name(self) -> str:
        """The unit's folder name under RESULTS/units/."""
        ...

    @property
    def module(self) -> str:
        """The module whose ``main(argv)`` computes the unit."""
        ...

    @property
    def cost(self) -> float:
        """Relative run time (larger runs first)."""
        ...

    def argv(self, settings: Any, folder: Path) -> list[str]:
        """The command line (without ``python -m module``) writing the unit into ``folder``."""
        ...

    def record(self, settings: Any) -> dict:
        """What the unit's results depend on (compared with ``unit.json`` for reuse)."""
        ...

    def result_files(self) -> list[str]:
        """Files (relative to the unit folder) that a finished unit has."""
        ...


@dataclass(frozen=True)
class Settings:
    """What a microworld unit's results depend on besides the unit itself (in unit.json)."""

    seeds: int
    steps: int
    seed: int
    log_every: int

    def unit_log_every(self, unit: Unit) -> int:
        """approaches selects lr by the mean loss over iterations >= 10, averaged over the logged
        steps, so it is logged at every step to select exactly as ``analysis.microworld``."""
        return 1 if unit.experiment == "approaches" else self.log_every

    def record(self, unit: Unit) -> dict:
        return {**asdict(unit), "seeds": self.seeds, "steps": self.steps, "seed": self.seed,
                "log_every": self.unit_log_every(unit)}


@dataclass(frozen=True)
class Unit:
    """One run of ``python -m analysis.microworld``: an experiment on one benchmark instance."""

    experiment: str
    benchmark: str
    instance: int
    d: int

    module = "analysis.microworld"

    @property
    def name(self) -> str:
        return f"{self.experiment}_d{self.d}_{self.benchmark}_i{self.instance}"

    @property
    def stem(self) -> str:
        """The microworld's results CSV (without .csv) inside the unit folder."""
        return f"microworld_{self.experiment}_{self.benchmark}_d{self.d}"

    @property
    def cost(self) -> float:
        return COST.get((self.experiment, self.d), 1.0)

    def argv(self, settings: Settings, folder: Path) -> list[str]:
        return [self.experiment, "--benchmark", self.benchmark, "--instance", str(self.instance),
                "--d", str(self.d), "--seeds", str(settings.seeds), "--steps",
                str(settings.steps), "--seed", str(settings.seed), "--log-every",
                str(settings.unit_log_every(self)), "--out", str(folder), "--figures",
                str(folder / "figures")]

    def record(self, settings: Settings) -> dict:
        return settings.record(self)

    def result_files(self) -> list[str]:
        return [f"{self.stem}.csv"]


def plan_units(experiments: Sequence[str], instances: Sequence[int], d: int,
               d4: bool) -> list[Unit]:
    """The microworld units of a study: every experiment on every benchmark it runs on
    (approaches: NNLoss only) and instance at d, plus the d = 4 row (estimators on both
    benchmarks, approaches on NNLoss) when ``d4``."""
    out = []
    for dd, exps in ((d, experiments), (4, ("estimators", "approaches") if d4 else ())):
        for exp in exps:
            for bench in (("nnloss",) if exp == "approaches" else BENCHMARKS):
                out += [Unit(exp, bench, i, dd) for i in instances]
    return list(dict.fromkeys(out))


def check_units(units: Sequence[ReportUnit], settings: Any) -> None:
    """Parse every unit's command line with its tool's own parser before anything runs: a value
    the tool refuses is one line naming the unit, and no folder is touched."""
    parsers: dict[str, Any] = {}
    for unit in units:
        if unit.module not in parsers:
            parsers[unit.module] = importlib.import_module(unit.module).build_parser()
        buf = _StderrLine()
        try:
            with contextlib.redirect_stderr(buf):
                parsers[unit.module].parse_args(unit.argv(settings, Path("unit")))
        except SystemExit:
            raise PBInputError(f"unit {unit.name}: {buf.last_line()}") from None


class _StderrLine:
    """A stderr stand-in that keeps what was written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def last_line(self) -> str:
        lines = [ln for ln in self.text.splitlines() if ln.strip()]
        line = lines[-1] if lines else "its tool refused the settings"
        return line.removeprefix("error: ")


def unit_key(unit: ReportUnit, settings: Any) -> str:
    """The first 10 hex digits of the SHA-256 of the unit's recorded settings."""
    text = json.dumps(unit.record(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def unit_dir(results: Path, unit: ReportUnit, settings: Any) -> Path:
    """``RESULTS/units/<unit.name>-<key>``: the unit's folder at these settings."""
    return results / "units" / f"{unit.name}-{unit_key(unit, settings)}"


def _finished(folder: Path, unit: ReportUnit, settings: Any) -> bool:
    marker = folder / "unit.json"
    if not marker.is_file():
        return False
    try:
        rec = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(rec, dict) and rec.get("settings") == unit.record(settings) and all(
        (folder / f).exists() for f in unit.result_files())


def is_done(results: Path, unit: ReportUnit, settings: Any) -> bool:
    """A unit is reused only if its marker exists and records the same settings."""
    return _finished(unit_dir(results, unit, settings), unit, settings)


def adopt_unkeyed(results: Path, units: Sequence[ReportUnit], settings: Any) -> int:
    """Rename each finished unit folder of an older version (``RESULTS/units/<unit.name>``,
    without a key) whose settings are the requested ones to its keyed name; returns how many."""
    moved = 0
    for unit in units:
        old, new = results / "units" / unit.name, unit_dir(results, unit, settings)
        if not new.exists() and _finished(old, unit, settings):
            os.replace(old, new)
            moved += 1
    return moved


def run_unit(unit: ReportUnit, settings: Any, results: Path) -> tuple[ReportUnit, float]:
    """Run one unit through its tool's command line (output and progress bars go to the unit's
    log.txt) in a partial folder, write unit.json there last, and swap the folder in: a unit
    folder is finished or absent, never half, and a failed rerun leaves the old one in place.

    A :class:`PBInputError` or argparse error of the tool, or a failed write (disk full), becomes
    a :class:`PBInputError` naming the unit (its partial folder is removed); any other exception
    propagates and leaves the partial folder, with the traceback in its log.txt, for
    inspection."""
    final = unit_dir(results, unit, settings)
    work = new_partial_folder(final)
    argv = unit.argv(settings, work)
    main = importlib.import_module(unit.module).main
    start = time.perf_counter()
    log_path = work / "log.txt"
    try:
        with open(log_path, "w") as log, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            try:
                main(argv)
            except PBInputError as exc:
                raise _UnitRefused(str(exc)) from None
            except WriteError as exc:
                raise _UnitRefused(exc.one_line("--results")) from None
            except SystemExit as exc:
                if exc.code not in (0, None):
                    log.flush()
                    raise _UnitRefused(_last_error(log_path)) from None
            except Exception:
                traceback.print_exc(file=log)  # kept in the partial folder for inspection
                raise
    except _UnitRefused as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise PBInputError(f"unit {unit.name}: {exc}") from None
    except OSError as exc:  # the log itself could not be written (disk full)
        if exc.errno not in NO_SPACE:
            raise
        shutil.rmtree(work, ignore_errors=True)
        raise PBInputError(f"unit {unit.name}: {WriteError(exc, log_path).one_line('--results')}"
                           ) from None
    finally:
        import matplotlib.pyplot as plt

        plt.close("all")  # the tool's figures, saved already
    wall = time.perf_counter() - start
    try:
        write_json(work / "unit.json", {"settings": unit.record(settings), "wall_s": wall,
                                        "argv": ["python", "-m", unit.module,
                                                 *unit.argv(settings, final)]})
    except WriteError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise PBInputError(f"unit {unit.name}: {exc.one_line('--results')}") from None
    replace_folder(work, final)
    return unit, wall


class _UnitRefused(Exception):
    pass


def _last_error(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    line = lines[-1] if lines else "its tool exited with an error"
    return line.removeprefix("error: ")


def _init_worker(parent: int) -> None:
    """A worker: dies with the study (SIGTERM when ``parent`` dies, Linux), leaves Ctrl-C to
    the study (which terminates it), one torch thread."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)()
    import threading

    import torch
    from tqdm import tqdm

    # tqdm's default lock is a multiprocessing semaphore, which a terminated worker would leave
    # to the resource tracker (a "leaked semaphore" warning); the worker's bars go to its log
    tqdm.set_lock(threading.RLock())

    torch.set_num_threads(1)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the units not started and terminate the running ones (their partial folders are
    removed by the next run)."""
    pool.shutdown(wait=False, cancel_futures=True)
    workers = multiprocessing.active_children()
    for proc in workers:
        proc.terminate()
    for proc in workers:
        proc.join(10)
    pool.shutdown(wait=True)  # joins the pool's manager thread, which sees the workers gone


def run_units(units: Sequence[ReportUnit], settings: Any, results: Path, jobs: int) -> None:
    """Run the units not already done, longest first, in ``jobs`` processes of one thread each.
    A unit refused by its tool stops the study (with that one line); a crashed unit is reported
    and the others go on. Any exception here (Ctrl-C, SIGTERM turned into one, a refusal)
    terminates the running workers before it propagates."""
    adopt_unkeyed(results, units, settings)
    todo = [u for u in units if not is_done(results, u, settings)]
    reused = len(units) - len(todo)
    todo.sort(key=lambda u: -u.cost)
    print(f"{len(units)} units: {reused} reused from {results}, {len(todo)} to run "
          f"with {jobs} process(es)", flush=True)
    if not todo:
        return
    start = time.perf_counter()

    def done(k: int, unit: ReportUnit, wall: float) -> None:
        print(f"  [{k}/{len(todo)}] {unit.name}: {wall:.1f} s "
              f"(elapsed {time.perf_counter() - start:.0f} s)", flush=True)

    if jobs == 1:
        for k, unit in enumerate(todo, 1):
            done(k, *run_unit(unit, settings, results))
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"  # inherited by the worker processes
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker,
                               initargs=(os.getpid(),))
    try:
        futures = {pool.submit(run_unit, u, settings, results): u for u in todo}
        for k, fut in enumerate(as_completed(futures), 1):
            try:
                done(k, *fut.result())
            except PBInputError:
                raise
            except Exception as exc:  # a crashed unit: report it, keep the others
                folder = unit_dir(results, futures[fut], settings)
                print(f"  [{k}/{len(todo)}] {futures[fut].name} FAILED: {exc!r} "
                      f"(partial folder with its log.txt beside {folder})", flush=True)
    except BaseException:
        _stop_workers(pool)
        raise
    pool.shutdown()


# ---------------------------------------------------------------------------------------------
# Reading microworld units


def instance_table(benchmark: str, d: int, instance: int) -> np.ndarray:
    """The 2^d J table of an instance, exactly as the microworld builds it."""
    from pbexact.instances import NNLoss, benchmark_table

    if benchmark == "nnloss":
        return NNLoss(d, instance).table()
    return benchmark_table(benchmark, d, instance)


def read_unit(path: Path, unit: Unit, J: np.ndarray) -> UnitResult:
    """The selected configs of a microworld results CSV (``analysis.microworld.write_results``
    format; rows other than ``curve`` and ``final`` are ignored). Checks that the curves start
    at E_0.5[J] of ``J`` (CP: at J of its hard mask), so that results of another instance
    cannot be read by mistake."""
    curves: dict[tuple, list] = {}
    finals: dict[tuple, list] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if row.get("selected") != "1":
                continue
            key = (row["method"], int(row["n"]), row["param"], float(row["lr"]))
            if row["record"] == "curve":
                curves.setdefault(key, []).append((int(row["step"]), float(row["mean"])))
            elif row["record"] == "final":
                finals.setdefault(key, []).append((float(row["value"]),
                                                   row["found_z_star"] == "1"))
    if not curves:
        raise PBInputError(f"{path} has no selected curves; delete it and rerun the unit")
    start_J = float(J.mean())
    configs = []
    for key, rows in curves.items():
        rows.sort()
        steps = np.array([s for s, _ in rows])
        curve = np.array([m for _, m in rows])
        off = abs(curve[0] - start_J) > 1e-9 * max(1.0, abs(start_J))
        # a deterministic method logs J of its hard mask (CP: J(1[r > 0])), not E_0.5[J]
        if steps[0] != 0 or (off and key[0] not in DETERMINISTIC_TORCH):
            raise PBInputError(f"{path}: curve {key} does not start at E_0.5[J] = {start_J:.6g} "
                               f"of {unit.benchmark} instance {unit.instance}; delete the unit "
                               "folder and rerun")
        value, found = zip(*finals[key])
        configs.append(ConfigResult(key[0], key[1], key[2], key[3], np.array(value),
                                    np.array(found, dtype=bool), steps, curve))
    return UnitResult(unit.experiment, unit.benchmark, unit.instance, unit.d, float(J.min()),
                      start_J, configs)


def load_units(units: Sequence[Unit], settings: Settings, results: Path) -> dict[Unit, UnitResult]:
    adopt_unkeyed(results, units, settings)
    missing = [u.name for u in units if not is_done(results, u, settings)]
    if missing:
        raise PBInputError(
            f"{len(missing)} unit(s) missing or run with other settings in {results}/units "
            f"(first: {missing[0]}); run without --replot to compute them")
    out = {}
    for u in units:
        J = instance_table(u.benchmark, u.d, u.instance)
        out[u] = read_unit(unit_dir(results, u, settings) / f"{u.stem}.csv", u, J)
    return out
