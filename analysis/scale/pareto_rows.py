"""Finished pruning run folders as the rows of ``python -m analysis.pareto``'s tables: the
folders found under the paths given (:func:`find_runs`), each read into a row of its settings and
final metrics, a diverged run's with NaN metrics (:func:`read_run`, :func:`diverged_row`,
:func:`read_runs`); a row's series label (:func:`label`), split by training budget where one
model and mode hold several (:func:`split_budgets`); the ``python -m pbscale.prune`` command line
that makes it again (:func:`command`); and the seed means of each configuration
(:func:`average_seeds`, :func:`diverged_only`).
"""

from __future__ import annotations

import json
import math
import shlex
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from analysis.scale.fronts import seed_text
from analysis.scale.outputs import check_in_folder
from analysis.scale.run_files import (
    PRUNE_BUDGET,
    DamagedRun,
    DivergedRun,
    PruneRun,
    budget_of,
    finished_or_diverged,
    lam_text,
    read_diverged,
    read_diverged_run,
    read_each,
    read_object,
    read_prune,
)
from pbexact.errors import PBInputError
from pbscale.methods import names

#: The method registry's MC estimators (a run's own ``method_info`` says whether it samples).
MC = names(samples=True)


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Run folders that ended (``summary.json``, or a diverged run's record) at or directly
    under ``paths``, each once (a folder named twice, or through two paths, counts once)."""
    found: dict[Path, Path] = {}
    for p in map(Path, paths):
        check_in_folder(p, "", "pass run folders or folders holding them")
        if finished_or_diverged(p):
            found.setdefault(p.resolve(), p)
            continue
        try:
            for q in sorted(p.iterdir()):
                if finished_or_diverged(q):
                    found.setdefault(q.resolve(), q)
        except OSError as exc:
            raise PBInputError(f"cannot list {p} ({exc.strerror}); pass a readable folder"
                               ) from None
    if not found:
        raise PBInputError("no finished runs (folders with summary.json) under "
                           f"{', '.join(map(str, paths))}; run python -m pbscale.prune first")
    return list(found.values())


#: The weight initialization runs are labelled with when it is not this one.
DEFAULT_INIT = "kaiming_normal"


def label(run: PruneRun, name: str | None = None) -> str:
    """A run's series: ``name`` (default: its method's name) with ``-<param>-n<n>`` for a
    method that samples, ``-target5%`` for a ``--lam-target`` run, ``-channel-<cost>`` for a
    structured run (``--granularity channel``) and ``-<init>`` for weights not initialized by
    DEFAULT_INIT."""
    task = run.task
    m = name or run.method
    base = f"{m}-{task.get('param')}-n{task.get('n')}" if run.info.samples else m
    if task.get("lam_target"):  # lam steered to a target: a series of its own
        base += f"-{lam_text(task).replace(' ', '')}"
    if task.get("granularity", "weight") != "weight":  # channels: remaining is of a cost
        base += f"-{task['granularity']}-{task.get('cost', 'params')}"
    init = task.get("init", DEFAULT_INIT)
    return base if init == DEFAULT_INIT else f"{base}-{init}"


#: How a label names each budget setting (:data:`analysis.scale.run_files.PRUNE_BUDGET`):
#: ``-e<epochs>`` and ``-b<max batches>`` always (where set), the others where they differ.
SUFFIX = {"epochs": "e", "max_batches": "b", "batch_size": "bs", "synthetic": "syn",
          "val_size": "val", "dataset": "", "mask_head": "head", "mask_shortcuts": "sc",
          "model": ""}


def budget_suffix(budget: tuple, differ: Sequence[str] = ()) -> str:
    """``-e<epochs>`` (and ``-b<max_batches>`` where set) of a budget, then every other budget
    setting named in ``differ`` (those that differ between the runs drawn together:
    ``-bs32``, ``-syn48``, ``-val500``, ``-headTrue``, ``-<dataset>``)."""
    b = dict(budget)
    out = f"-e{b.get('epochs')}"
    if b.get("max_batches"):
        out += f"-b{b['max_batches']}"
    for k in differ:
        if k not in ("epochs", "max_batches") and k in b:
            out += f"-{SUFFIX.get(k, k)}{b[k]}"
    return out


#: The run settings the tables show besides the method's label; :func:`used_settings` says
#: which of them a method uses (the others are left empty: they do not act on its run).
SETTINGS = ("lam", "target", "mask_lr")


def used_settings(run: PruneRun) -> frozenset[str]:
    """The :data:`SETTINGS` a run's method uses (its recorded settings, else the registry's: a
    method with mask logits (CP, MC) has the L0 weight ``lam`` and the mask learning rate
    ``mask_lr``; one that cuts by magnitude (MP, GMP) prunes to ``target``; dense training uses
    none; a method known to neither shows all three)."""
    return frozenset(s for s in SETTINGS if run.info.uses(s))


def info_text(folder: Path, key: str) -> str:
    """The text entry ``key`` of a run's config.json's unhashed "info", "" where none is
    recorded (or the file cannot be read)."""
    try:
        info = json.loads((folder / "config.json").read_text()).get("info", {})
    except (OSError, ValueError, AttributeError):
        return ""
    value = info.get(key, "") if isinstance(info, dict) else ""
    return value if isinstance(value, str) else ""


def data_dir_of(folder: Path) -> str:
    """The data folder a run read (config.json's "info" ``data_dir``), "" where none."""
    return info_text(folder, "data_dir")


def data_file_of(folder: Path) -> str:
    """The user's data file a run read (config.json's "info" ``data_file``), "" where none."""
    return info_text(folder, "data_file")


def read_run(folder: Path) -> dict:
    """One run's settings and final metrics (a dict of the tables' columns; a diverged run:
    ``diverged`` its record, its metrics NaN); :class:`~analysis.scale.run_files.DamagedRun` (with
    the reason) when its config.json or summary.json is missing, truncated or of the wrong
    shape."""
    if not (folder / "summary.json").exists():
        record = read_diverged(folder)
        if record is not None:
            return diverged_row(folder, record)
    run = read_prune(folder)
    task = run.task
    used = used_settings(run)
    try:
        cmd = command(task, data_dir_of(folder), data_file=data_file_of(folder))
    except (PBInputError, KeyError, TypeError, ValueError) as exc:
        raise DamagedRun(f"config.json's task is not a prune configuration ({exc})") from None
    return {"run": folder.name, "task": task, "data_dir": data_dir_of(folder),
            "data_file": data_file_of(folder),
            "model": task["model"], "mode": task["mode"],
            "series": label(run), "label": label(run), "legend": label(run, run.info.label),
            "method": run.method, "color": run.info.color,
            **{k: task.get(k, "") if k in used else "" for k in SETTINGS},
            **({"lam": lam_text(task)} if "lam" in used else {}),
            "epochs": task["epochs"], "seed": task["seed"], **run.metrics, "layers": run.layers,
            "budget": budget_of(task, PRUNE_BUDGET),
            "key": json.dumps({k: v for k, v in task.items() if k != "seed"}, sort_keys=True),
            "command": cmd, "diverged": None}


def diverged_row(folder: Path, record: dict) -> dict:
    """The table row of a diverged pruning run: its settings, NaN metrics and its record."""
    run = read_diverged_run(folder, read_object(folder / "config.json"), record)
    if not isinstance(run, DivergedRun) or run.experiment == "regression":
        raise DamagedRun("its diverged.json belongs to a run that is not a pruning run")
    task = {**run.settings, "seed": run.seed}
    shell = PruneRun(folder, task, run.info, run.seed, {}, {}, {})
    used = used_settings(shell)
    try:
        cmd = command(task, data_dir_of(folder), data_file=data_file_of(folder))
    except (PBInputError, KeyError, TypeError, ValueError) as exc:
        raise DamagedRun(f"config.json's task is not a prune configuration ({exc})") from None
    nan = math.nan
    return {"run": folder.name, "model": task["model"], "mode": task["mode"],
            "series": label(shell), "label": label(shell), "legend": label(shell, run.info.label),
            "method": run.method, "color": run.info.color,
            **{k: task.get(k, "") if k in used else "" for k in SETTINGS},
            "epochs": task["epochs"], "seed": run.seed,
            **{k: nan for k in ("test_acc", "val_acc", "remaining", "remaining_all",
                                "seconds_per_epoch")},
            "layers": {}, "budget": budget_of(task, PRUNE_BUDGET),
            "key": json.dumps(run.settings, sort_keys=True), "command": cmd,
            "diverged": record}


def read_runs(folders: Sequence[Path]) -> list[dict]:
    """Every readable run; a damaged one is skipped with one warning line on stderr naming its
    folder and the reason. None readable: :class:`PBInputError`."""
    runs = read_each(folders, read_run)
    if not runs:
        raise PBInputError(f"none of the {len(folders)} run(s) could be read (see the warnings); "
                           "rerun them with python -m pbscale.prune")
    return runs


def split_budgets(runs: list[dict]) -> list[str]:
    """Where one (model, mode) has runs of several training budgets, append each run's budget to
    its label (``cp-e2``) so that no front mixes budgets; returns one note per such pair."""
    notes = []
    for mm in sorted({(r["model"], r["mode"]) for r in runs}):
        sel = [r for r in runs if (r["model"], r["mode"]) == mm]
        budgets = {r["budget"] for r in sel}
        if len(budgets) < 2:
            continue
        keys = dict.fromkeys(k for b in budgets for k, _ in b)
        differ = [k for k in keys if len({dict(b).get(k) for b in budgets}) > 1]
        for r in sel:
            suffix = budget_suffix(r["budget"], differ)
            r["label"] += suffix
            r["legend"] += f" ({suffix[1:]})"
        named = ", ".join(f"-{SUFFIX.get(k, k)}<{k.replace('_', ' ')}>" if SUFFIX.get(k, k)
                          else f"-<{k}>" for k in differ if k not in ("epochs", "max_batches"))
        notes.append(f"note: {mm[0]} {mm[1]}: runs of {len(budgets)} training budgets; each "
                     "label is split by budget (-e<epochs>, -b<max batches>"
                     + (f", {named}" if named else "") + ") so that no front mixes them")
    return notes


#: Entries of a run's "task" that name its user data and network by identity, not by an option.
IDENTITY_KEYS = ("network_id", "data_id")


#: What a run records as its data file when the arrays were given in Python
#: (:data:`pbscale.pruning.api.IN_MEMORY`), and the file its command names in its place: the same
#: arrays saved with ``numpy.savez`` make the same run.
IN_MEMORY, SAVED_ARRAYS = "(arrays given in Python)", "ARRAYS.npz"


def command(task: dict, data_dir: str = "", seeds: Sequence[int] = (), data_file: str = "") -> str:
    """The shortest ``python -m pbscale.prune`` command line of a run's configuration, as it
    can be pasted: the options that differ from the defaults (a method's own settings as their
    ``--<method>-<setting>`` flags, values quoted for the shell), ``--seeds`` for several
    ``seeds`` (one group: the runs of a configuration averaged over seeds) in place of
    ``--seed``, then where the run read its data: ``--data`` with the user's data file
    (``data_file``, config.json's "info" ``data_file``; arrays given in Python:
    :data:`SAVED_ARRAYS`, the file they would be saved to) in place of the recorded data set
    and identities, else ``--data-dir`` (``data_dir``, as the run was given it; synthetic runs
    have none)."""
    from pbscale.pruning.config import PruneConfig

    arrays = task.get("dataset") == "arrays"
    default = PruneConfig(model=task["model"], mode=task["mode"]).resolved()
    parts = ["python -m pbscale.prune"]
    for k, v in task.items():
        if k == "seed" and len(seeds) > 1 or k in IDENTITY_KEYS or (arrays and k == "dataset"):
            continue
        if k == "settings" and isinstance(v, dict):  # the method's own: --<method>-<setting>
            for name, value in v.items():
                flag = f"--{task['method']}-{name}".replace("_", "-")
                text = str(value).lower() if isinstance(value, bool) else str(value)
                parts.append(f"{flag} {shlex.quote(text)}")
            continue
        if getattr(default, k, None) != v or k in ("model", "mode", "method"):
            if isinstance(v, bool):
                if v:
                    parts.append(f"--{k.replace('_', '-')}")
            else:
                parts.append(f"--{k.replace('_', '-')} {shlex.quote(str(v))}")
    if len(seeds) > 1:
        parts.append(f"--seeds {seed_text(seeds).replace(', ', ',')}")
    if arrays:
        given = data_file if data_file and data_file != IN_MEMORY else SAVED_ARRAYS
        parts.append(f"--data {shlex.quote(given)}")
    elif data_dir:
        parts.append(f"--data-dir {shlex.quote(data_dir)}")
    return " ".join(parts)


#: The metrics a configuration reports as seed mean and s.d.
METRICS = ("test_acc", "val_acc", "remaining", "remaining_all", "seconds_per_epoch")


def average_seeds(runs: list[dict]) -> list[dict]:
    """One point per configuration (the training budget part of it) with a finished run: the
    means over its finished seeds and their s.d. (``<metric>_sd``, ddof 1; NaN with one seed),
    ``seeds`` (finished), ``diverged`` (seeds that diverged) and ``runs`` (its run folders). A
    configuration whose every seed diverged has no point (:func:`diverged_only`)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["key"]].append(r)
    out = []
    for all_runs in groups.values():
        rs = [r for r in all_runs if r["diverged"] is None]
        if not rs:
            continue
        p = dict(rs[0])
        for k in METRICS:
            vals = [r[k] for r in rs]
            p[k] = sum(vals) / len(vals)
            p[f"{k}_sd"] = (math.sqrt(sum((v - p[k]) ** 2 for v in vals) / (len(vals) - 1))
                            if len(vals) > 1 else math.nan)
        p["seeds"] = len(rs)
        if len(rs) > 1:  # the one command that trains them: a group over their seeds
            p["command"] = command(rs[0]["task"], rs[0]["data_dir"], [r["seed"] for r in rs],
                                   rs[0].get("data_file", ""))
        p["diverged"] = len(all_runs) - len(rs)
        p["runs"] = sorted(r["run"] for r in rs)
        p["layers"] = {k: sum(r["layers"][k] for r in rs) / len(rs) for k in rs[0]["layers"]}
        out.append(p)
    return out


def diverged_only(runs: list[dict]) -> list[str]:
    """The configurations every seed of which diverged, as ``label (n seeds): folder ...``."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["key"]].append(r)
    return [f"{rs[0]['label']} ({len(rs)} seeds): {', '.join(sorted(r['run'] for r in rs))}"
            for rs in groups.values() if all(r["diverged"] is not None for r in rs)]
