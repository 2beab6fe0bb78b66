"""Sweep files: parsing and checking a TOML sweep, its runs and their ids, and the plan of groups
(the file format is described in :mod:`pbscale.sweep`; the commands and how their runs group:
the job interface, :mod:`pbscale.sweep.jobs`).

Every value of ``[base]`` and ``[[grid]]`` is checked with the command's own argparse parser
before anything is launched: a switch (``action="store_true"``) takes ``true`` or ``false``, a
flag that takes a value refuses booleans, and a value goes through the flag's ``type`` and
``choices`` as the command line would. Then every run is checked as the run itself would check
its options before it trains (:func:`pbscale.sweep.jobs.checker`): ``lam_target = 5.0`` or
``cp_final_tau = 0.0`` are refused by ``status`` and ``run --dry-run``, not by each child. A
run is named by its canonical options (the values as the command parses them, every default
filled in), so one run written in two spellings (``"0.1"`` and ``0.1``, ``1`` and ``1.0`` for a
float flag, a default spelled out or left out) is one run with one id.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pbexact.errors import PBInputError
from pbexact.io import inside, path_problem
from pbscale.sweep import jobs
from pbscale.sweep.jobs import COMMANDS, Grouping

#: Keys a sweep may not set per run: the sweep sets them.
RESERVED = ("out", "threads", "quiet")
#: Bounds of the ``[sweep]`` resources (a run asking for more is a typo, not a plan).
MAX_THREADS = 1024
MAX_CPUS = 1024
MAX_GPUS = 64
#: Most runs a sweep's grid may expand to (counted before it is built): each run gets a record
#: file, a log and a run folder, and ``status`` reads them all (the largest committed sweep,
#: sweeps/supermask.toml, has 3,780).
MAX_RUNS = 100_000


@dataclass
class Run:
    """One run of a sweep: its options (flag name without ``--``, ``_`` for ``-``; canonical
    values, see :func:`canonical_value`) and id."""

    options: dict[str, Any]
    id: str
    #: every option of the command, defaults filled in (what the run's id hashes)
    full: dict[str, Any] = field(default_factory=dict)
    #: the id the same run had when ids hashed the values as the file spelled them (equal to
    #: ``id`` for values already in canonical form); records kept under it are still found
    spelled_id: str = ""


@dataclass
class Group:
    """Runs that differ only in their command's grouping axes (:attr:`pbscale.sweep.jobs.Grouping.
    axes`: regress seed and lr; prune seed, lam and mask lr), trained as one child of its
    grouping module (``python -m pbscale.regress --seeds``, ``python -m pbscale.prune --seeds``):
    ``values`` maps each axis to its sorted values, whose product is exactly the members'.
    Id ``g`` + hash."""

    runs: list[Run]
    values: dict[str, list]
    id: str

    def text(self) -> str:
        """``seed 0,1 x lam 0.001 x mask_lr 0.01,0.1`` (for status lines)."""
        return " x ".join(f"{axis} {','.join(map(option_text, vals))}"
                          for axis, vals in self.values.items())


@dataclass
class Sweep:
    """A parsed sweep file (see :mod:`pbscale.sweep`)."""

    path: Path
    command: str
    out: Path
    runs: list[Run]
    threads: int = 1
    cpus: float = 1.0
    gpus: float = 0.0
    extra: dict = field(default_factory=dict)
    group: bool = False
    #: lines the CLI prints before it starts (e.g. which output folder was chosen and why)
    notes: list[str] = field(default_factory=list)

    @property
    def module(self) -> str:
        return COMMANDS[self.command].module

    @property
    def grouping(self) -> Grouping | None:
        """How the command's runs group (:func:`pbscale.sweep.jobs.grouping`), or None."""
        return jobs.grouping(self.command)

    @property
    def record_dir(self) -> Path:
        """``OUT/sweep-<stem>``: one ``<id>.json`` record and ``<id>.log`` per run."""
        return record_dir_of(self.out, self.path)

    def argv(self, run: Run) -> list[str]:
        """The command line of one run (after ``python -m MODULE``)."""
        args: list[str] = []
        for key, value in run.options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False:
                args += [flag, option_text(value)]
        return [*args, "--out", str(self.out), "--threads", str(self.threads), "--quiet"]

    def command_line(self, job: Run | Group) -> list[str]:
        """``-m MODULE ARGS`` of a run's or a group's child (after the Python executable)."""
        if isinstance(job, Run):
            return ["-m", self.module, *self.argv(job)]
        grouping = self.grouping
        defaults = {k: a.default for k, a in command_actions(self.module).items()}
        args = grouping.argv(job.runs[0].full, job.values, defaults)
        return ["-m", grouping.module, *args, "--out", str(self.out), "--threads",
                str(self.threads), "--quiet"]


def record_dir_of(out: Path, sweep_file: Path) -> Path:
    """The folder of a sweep's records: ``OUT/sweep-<file stem>``."""
    return out / f"sweep-{sweep_file.stem}"


def option_text(value: Any) -> str:
    """A canonical option value as the command line spells it (lists comma-separated)."""
    if isinstance(value, (list, tuple)):
        return ",".join(option_text(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def run_id(command: str, options: dict) -> str:
    """First 12 hex digits of the SHA-256 of the command and its options (canonical JSON)."""
    text = json.dumps({"command": command, "options": options}, sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def command_actions(module: str) -> dict[str, argparse.Action]:
    """{option name (``_`` form): argparse action} of the command's parser (``--help`` and
    ``--version`` left out)."""
    parser = importlib.import_module(module).build_parser()
    return {a.dest: a for a in parser._actions  # noqa: SLF001 - argparse has no public list
            if a.option_strings and a.dest != "help" and a.default != argparse.SUPPRESS}


def in_run_id(actions: dict[str, argparse.Action], options: dict) -> dict:
    """``options`` without the reserved ones and without those of a flag added after run ids
    existed (its action has ``id_when_changed = True``) at its default: such a flag enters a
    run's id only when it is set, so the ids of existing runs do not change."""
    return {k: v for k, v in options.items() if k not in RESERVED and not (
        getattr(actions.get(k), "id_when_changed", False) and v == actions[k].default)}


def canonical_value(action: argparse.Action, value: Any, where: str) -> Any:
    """``value`` (from a TOML file) as the command's parser would hold it after reading it on
    the command line, or a one-line :class:`PBInputError` (``where`` names the file and key).

    A switch (no argument) takes a boolean. Any other flag refuses booleans, and its value goes
    through the flag's ``type`` and ``choices``. A value equal to the flag's default is the
    default itself, so a default spelled out names the same run as one left out."""
    flag = "--" + action.dest.replace("_", "-")
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise PBInputError(f"{where}: {flag} is a switch; give true or false, got {value!r}")
        return value
    if isinstance(value, bool):
        raise PBInputError(f"{where}: {flag} takes a value, not {str(value).lower()}; give its "
                           "value, or leave the key out for the default")
    if isinstance(value, float) and not math.isfinite(value):
        raise PBInputError(f"{where}: {flag} must be a finite number, got {value!r}; give a "
                           "finite value")
    if not isinstance(value, (str, int, float)):
        raise PBInputError(f"{where}: {flag} takes a number or a string, got {value!r}; give "
                           "one value or a list of values")
    text = option_text(value)
    try:
        parsed = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
        raise PBInputError(f"{where}: {flag} {text}: {e}; give a value the command accepts "
                           f"(python -m ... {flag} VALUE)") from None
    if isinstance(parsed, float) and not math.isfinite(parsed):
        raise PBInputError(f"{where}: {flag} must be a finite number, got {text}; give a finite "
                           "value")
    if action.choices is not None and parsed not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise PBInputError(f"{where}: {flag} {text} is not a choice; give one of {choices}")
    default = action.default
    if not isinstance(default, bool) and type(default) in (int, float, str) and parsed == default:
        return default
    return parsed


def grid_size(base: dict, grids: list[dict]) -> int:
    """How many option sets :func:`expand` would build (duplicates counted), computed without
    building them."""
    return sum(math.prod(len(v) if isinstance(v, list) else 1 for v in {**base, **g}.values())
               for g in grids or [{}])


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
            seen.setdefault(json.dumps(opts, sort_keys=True, default=str), opts)
    return list(seen.values())


def _read_toml(path: Path) -> dict:
    try:
        import tomllib  # standard library from Python 3.11
    except ModuleNotFoundError:
        raise PBInputError("sweep files are read with tomllib, new in Python 3.11; run the sweep "
                           "with Python >= 3.11") from None
    if not path.is_file():
        raise PBInputError(f"sweep file {path} not found; give the path of a .toml sweep file "
                           "(examples in sweeps/)")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise PBInputError(f"cannot read sweep file {path} ({e.strerror}); check its "
                           "permissions") from None
    except UnicodeDecodeError as e:
        raise PBInputError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); save it as "
                           "UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PBInputError(f"{path} is not valid TOML ({e}); fix the file") from None


def _check_resources(path: Path, head: dict) -> tuple[int, float, float]:
    """``[sweep]`` threads, cpus, gpus, checked: finite, in range, no booleans."""
    threads, cpus, gpus = head.get("threads", 1), head.get("cpus", 1), head.get("gpus", 0.0)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= \
            MAX_THREADS:
        raise PBInputError(f"{path}: [sweep] threads must be an integer from 1 to {MAX_THREADS}, "
                           f"got {threads!r}; write e.g. threads = 1 (torch threads per run)")

    def number(x: Any) -> bool:
        return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)

    if not (number(cpus) and 0 < cpus <= MAX_CPUS):
        raise PBInputError(f"{path}: [sweep] cpus must be a number > 0 and <= {MAX_CPUS}, got "
                           f"{cpus!r}; write e.g. cpus = 1 (CPU cores per run)")
    if not (number(gpus) and 0 <= gpus <= MAX_GPUS and (gpus <= 1 or gpus == int(gpus))):
        raise PBInputError(f"{path}: [sweep] gpus is a GPU fraction in [0, 1] or a whole number "
                           f"up to {MAX_GPUS}, got {gpus!r}; write e.g. gpus = 0.5 (or leave it "
                           "out: no GPU)")
    return threads, float(cpus), float(gpus)


def has_records(record_dir: Path) -> bool:
    """Whether a sweep record folder holds any run record."""
    return record_dir.is_dir() and any(record_dir.glob("*.json"))


def resolve_out(path: Path, head: dict, out: str | Path | None) -> tuple[Path, list[str]]:
    """The sweep's output folder and notes to print.

    ``--out`` (``out``) is relative to the current folder, as every command-line path; a
    relative ``[sweep] out`` is relative to the sweep file's folder. A sweep whose records are
    only in ``[sweep] out`` taken relative to the current folder (where such files were read
    before) keeps that folder, with a note saying so and how to move it."""
    if out is not None:
        return Path(out).expanduser().absolute(), []
    raw = head.get("out")
    if not raw:
        raise PBInputError(f"{path}: no output folder; set [sweep] out or pass --out")
    if not isinstance(raw, str):
        raise PBInputError(f"{path}: [sweep] out must be a folder name (a string), got {raw!r}; "
                           "write e.g. out = \"runs\"")
    problem = path_problem(raw)
    if problem:
        raise PBInputError(f"{path}: [sweep] out {raw[:60]!r} {problem}; name another folder")
    given = Path(raw).expanduser()
    if given.is_absolute():
        return given, []
    target = (path.absolute().parent / given).absolute()
    cwd_relative = given.absolute()
    if cwd_relative != target and has_records(record_dir_of(cwd_relative, path)) \
            and not has_records(record_dir_of(target, path)):
        return cwd_relative, [
            f"note: using {cwd_relative}, which holds this sweep's records ([sweep] out "
            f"relative to the current folder); a relative out is relative to the sweep file, "
            f"{target}: move the folder there, or pass --out {cwd_relative} to keep it"]
    return target, []


def load(path: str | Path, out: str | Path | None = None) -> Sweep:
    """Parse and check a sweep file (one-line :class:`PBInputError` on any problem)."""
    path = Path(path)
    doc = _read_toml(path)
    unknown = set(doc) - {"sweep", "base", "grid"}
    if unknown:
        raise PBInputError(f"{path}: unknown table {sorted(unknown)[0]!r}; use [sweep], [base] "
                           "and [[grid]]")
    head = doc.get("sweep", {})
    if not isinstance(head, dict):
        raise PBInputError(f"{path}: sweep must be a table; write a [sweep] header followed "
                           "by key = value lines")
    command = head.get("command")
    if command not in COMMANDS:
        raise PBInputError(f"{path}: [sweep] command must be one of {', '.join(COMMANDS)}, got "
                           f"{command!r}; write e.g. command = \"{next(iter(COMMANDS))}\"")
    if "batch" in head:
        raise PBInputError(f"{path}: [sweep] batch is now called group; write group = "
                           f"{str(head['batch']).lower()}")
    bad = set(head) - {"command", "out", "threads", "cpus", "gpus", "description", "group"}
    if bad:
        raise PBInputError(f"{path}: unknown [sweep] key {sorted(bad)[0]!r}; use command, out, "
                           "threads, cpus, gpus, group, description")
    group = head.get("group", False)
    if not isinstance(group, bool):
        raise PBInputError(f"{path}: [sweep] group must be true or false, got {group!r}; write "
                           "group = true or leave it out")
    threads, cpus, gpus = _check_resources(path, head)
    base = doc.get("base", {})
    grids = doc.get("grid", [])
    if not isinstance(base, dict) or not isinstance(grids, list) or not all(
            isinstance(g, dict) for g in grids):
        raise PBInputError(f"{path}: [base] must be a table and grid an array of tables; "
                           "write [base] once and head each grid block [[grid]]")
    target, notes = resolve_out(path, head, out)
    actions = command_actions(COMMANDS[command].module)
    for table in [base, *grids]:
        for key, value in table.items():
            if key in RESERVED:
                raise PBInputError(f"{path}: {key!r} is set by the sweep; remove it (use [sweep] "
                                   "out / threads)")
            if key not in actions:
                raise PBInputError(f"{path}: python -m {COMMANDS[command].module} has no option "
                                   f"--{key.replace('_', '-')}; fix the key {key!r}")
            values = value if isinstance(value, list) else [value]
            if not values or any(isinstance(v, (dict, list)) for v in values):
                raise PBInputError(f"{path}: {key!r} is empty or nested; give a value or a "
                                   "non-empty list of values")
            for v in values:
                canonical_value(actions[key], v, f"{path}: {key}")
    size = grid_size(base, grids)
    if size > MAX_RUNS:
        raise PBInputError(f"{path}: the grid has {size:,} runs (the product of its lists), more "
                           f"than the {MAX_RUNS:,} a sweep holds (a record and a run folder "
                           "each); shorten the lists or split the grid over several files")
    defaults = {k: a.default for k, a in actions.items()}
    # a run is named by all its canonical options, defaults filled in, so that a run listed
    # twice (in two spellings, or once with a default spelled out) is one run
    runs: dict[str, Run] = {}
    for spelled in expand(base, grids):
        options = {k: canonical_value(actions[k], v, f"{path}: {k}") for k, v in spelled.items()}
        full = in_run_id(actions, {**defaults, **options})
        key = run_id(command, full)
        old = run_id(command, in_run_id(actions, {**defaults, **spelled}))
        runs.setdefault(key, Run(options, key, full, old))
    check = jobs.checker(command)
    if check is not None:  # the run's own validation, before anything starts
        for r in runs.values():
            try:
                check(r.full, set(r.options))
            except PBInputError as e:
                raise PBInputError(f"{path}: the run {label(r) or '(the defaults)'} would be "
                                   f"refused when it starts: {e}") from None
    record_dir = record_dir_of(target, path)
    if record_dir.is_symlink() or record_dir.exists():
        inside(record_dir, target)  # records are written only under the sweep's out
    for r in runs.values():  # a record kept under the spelled id is this run's record
        if r.spelled_id != r.id and (record_dir / f"{r.spelled_id}.json").exists() \
                and not (record_dir / f"{r.id}.json").exists():
            r.id = r.spelled_id
    return Sweep(path, command, target, list(runs.values()), threads, cpus, gpus,
                 extra={"description": head.get("description", "")}, group=group, notes=notes)


# ---------------------------------------------------------------------- groups


def groupable(sweep: Sweep, run: Run) -> bool:
    """Whether a run can train in a group: its command groups runs and accepts it (regress: a
    method of a regression group, with only the options a group takes, no own chunk)."""
    grouping = sweep.grouping
    return grouping is not None and grouping.groupable(run.full)


def make_group(runs: list[Run], values: dict[str, list]) -> Group:
    """The group of ``runs`` (the product of ``values``); its id hashes the sorted member ids."""
    ids = ",".join(sorted(r.id for r in runs))
    return Group(runs, values, "g" + hashlib.sha256(ids.encode()).hexdigest()[:11])


def product_parts(cells: dict[tuple, Run], axes: tuple[str, ...]) -> list[dict[str, list]]:
    """Split runs keyed by their values on ``axes`` into full products (axis -> sorted
    values): all of them when they form one, else one part per value of the last axis, each
    split the same way on the axes before it (the first axis alone is always a product)."""
    values = [sorted({key[i] for key in cells}) for i in range(len(axes))]
    if len(cells) == math.prod(len(v) for v in values) or len(axes) == 1:
        return [dict(zip(axes, values))]
    parts = []
    for last in values[-1]:
        sub = {key[:-1]: r for key, r in cells.items() if key[-1] == last}
        parts += [{**p, axes[-1]: [last]} for p in product_parts(sub, axes[:-1])]
    return parts


def plan(sweep: Sweep, runs: list[Run]) -> list[Run | Group]:
    """The children that run ``runs``: groupable runs (:func:`groupable`) that differ only in
    the command's grouping axes (regress: seed, lr; prune: seed, lam, mask lr) form
    :class:`Group` s, one per setting whose values are a full product over the axes, else
    split into products along the last axes (:func:`product_parts`); groups of one and other
    runs stay single :class:`Run` s. Groups come first, in order of their first run; each
    axis's values sorted, so the same runs always form the same group (and a group launched
    again resumes its checkpoint)."""
    settings: dict[str, list[Run]] = {}
    singles: list[Run | Group] = []
    axes = sweep.grouping.axes if sweep.grouping is not None else ()
    for r in runs:
        if groupable(sweep, r):
            key = json.dumps({k: v for k, v in r.full.items() if k not in axes},
                             sort_keys=True, default=str)
            settings.setdefault(key, []).append(r)
        else:
            singles.append(r)
    groups: list[Run | Group] = []
    for members_ in settings.values():
        cells = {tuple(r.full[a] for a in axes): r for r in members_}
        for values in product_parts(cells, axes):
            part = [cells[key] for key in itertools.product(*values.values())]
            if len(part) == 1:
                singles.append(part[0])
            else:
                groups.append(make_group(part, values))
    return groups + singles


def members(job: Run | Group) -> list[Run]:
    """The runs a child trains: a group's members, or the run itself."""
    return job.runs if isinstance(job, Group) else [job]


def label(run: Run) -> str:
    """``key=value ...`` of a run's own options (for status lines)."""
    return " ".join(f"{k}={v}" for k, v in run.options.items())
