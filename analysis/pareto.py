"""``python -m analysis.pareto RUNS... --out DIR``: Pareto fronts and per-layer sparsity of
pruning runs (`fig:supermask_results`, `fig:joint_pruning_results`,
`fig:joint_pruning_per_layer`).

RUNS are run folders of ``python -m pbscale.prune`` (with ``config.json`` and ``summary.json``)
or folders holding them. Runs that differ only in their seed are averaged (test accuracy and
weights remaining; the seed count is reported). A series' label is its method's name (``cp``,
``mp``, ``gmp``, ``dense``) or, for a method that samples (MC), ``<name>-<param>-n<n>``, with
``-<init>`` when the weights are not ``kaiming_normal``; its legend text and colour are the
method's own as the run recorded them (``method_info`` in ``config.json``), else the method
registry's, else the name in grey, so runs of a method removed since still plot. The training
budget (epochs, ``max_batches``, batch size, data: :data:`analysis.scale.run_files.PRUNE_BUDGET`) is
part of a setting: where one model and mode hold runs of several budgets, each label is split by
budget (``cp-e2``, ``cp-e3``, ``cp-e1-b20``) and a note says so, so a front never mixes budgets.

For every (model, mode) this writes ``pareto_<model>_<mode>.png`` (test accuracy against weights
remaining over the masked tensors, log axis in percent; each label's points and its Pareto
front: the points no other point of the label beats in both accuracy and sparsity) and
``layers_<model>_<mode>.png`` (per layer fraction remaining of one setting per label: by default
the one nearest a common remaining fraction, the sparsest fraction every pruning label reaches;
``--layer-at`` sets the fraction, ``--layer-max`` picks each label's most accurate setting at
most that remaining instead; the console and ``layers.csv`` name the run folders used), with
``runs.csv``, ``pareto.csv`` and ``layers.csv`` holding the plotted numbers. A setting a method
does not use is left empty in them (GMP and MP: ``lam``, ``mask_lr``; CP and MC: ``target``;
dense: all three; :func:`used_settings`).

``--compare A B`` also judges whether series A's front lies above series B's in each model and
mode both have (:func:`analysis.compare_fronts`: holds, fails, noise or cannot tell, with the
gap, its interval and the budgets judged) and writes ``compare.csv``.

``--overlay supermask:cp,joint:gmp`` (or ``--overlay all``, or a mode alone) also draws the chosen
series of each model on one pair of shared axes, ``overlay_<model>.png``, with the plotted points
in ``overlay_<model>.csv``: "CP supermask against GMP joint" in one figure.

A run folder whose ``config.json`` or ``summary.json`` is missing, truncated, of the wrong shape
or holds a wrong value is skipped with one warning line on stderr naming it; the others are
plotted. Nothing is written outside ``--out`` (a symlink out of it is refused), and a full disk
is one line with the space needed, every older file left as it was.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.cli import run as cli_run
from analysis.scale.front_verdict import compare_fronts
from analysis.scale.fronts import pareto_front, seed_text
from analysis.scale.outputs import Outputs, check_in_folder, check_out, out_folder
from analysis.scale.plots import fraction_axis
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
from pbexact.cli import ArgumentParser, positive_float
from pbexact.errors import PBInputError
from pbscale.methods import names

#: The method registry's MC estimators (a run's own ``method_info`` says whether it samples).
MC = names(samples=True)


def file_part(model: str) -> str:
    """A model's name as part of a file name: a user's import path ``package.module:factory``
    with ``:`` (not allowed in Windows file names) written ``-``."""
    return model.replace(":", "-")


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
#: Marker and line style of a method's 1st, 2nd, ... label (its colour is the method's own).
STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("v", "-."), ("D", "--")]


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


def styles(points: Sequence[dict]) -> dict[str, dict]:
    """Plot keywords per label: its method's colour (as the run recorded it), and a marker and
    line style that tell apart the labels of one method (in the order given)."""
    out, seen = {}, defaultdict(int)
    for p in points:
        lab = p["label"]
        if lab in out:
            continue
        m = p["method"]
        marker, ls = STYLES[seen[m] % len(STYLES)]
        seen[m] += 1
        out[lab] = {"marker": marker, "linestyle": ls, "color": p["color"]}
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


def data_dir_of(folder: Path) -> str:
    """The data folder a run read (config.json's unhashed "info"), "" where none is recorded."""
    try:
        info = json.loads((folder / "config.json").read_text()).get("info", {})
    except (OSError, ValueError, AttributeError):
        return ""
    value = info.get("data_dir", "") if isinstance(info, dict) else ""
    return value if isinstance(value, str) else ""


def data_file_of(folder: Path) -> str:
    """The user's data file a run read (config.json's "info" ``data_file``), "" where none."""
    try:
        info = json.loads((folder / "config.json").read_text()).get("info", {})
    except (OSError, ValueError, AttributeError):
        return ""
    value = info.get("data_file", "") if isinstance(info, dict) else ""
    return value if isinstance(value, str) else ""


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


def mean_sd(mean: float, sd: float, fmt: str) -> str:
    """``0.9612 +- 0.0012`` (the mean alone when the s.d. is NaN: one seed)."""
    return format(mean, fmt) + ("" if math.isnan(sd) else " +- " + format(sd, fmt))


def parse_overlay(text: str) -> list[tuple[str, str | None]]:
    """``--overlay``: ``all``, or comma-separated ``MODE`` or ``MODE:LABEL`` items (e.g.
    ``supermask:cp,joint:gmp``) -> [(mode, label or None for every label of the mode)]; ``all``
    is ``[]``."""
    text = text.strip()
    parts = [part.strip() for part in text.split(",")]
    if "all" in parts:  # all, alone or beside other items, is every series
        return []
    items: list[tuple[str, str | None]] = []
    for part in parts:
        mode, _, lab = part.partition(":")
        if not mode or (":" in part and not lab):
            raise argparse.ArgumentTypeError(
                f"expected all or MODE[:LABEL],... such as supermask:cp,joint:gmp, got {text!r}")
        if (mode, lab or None) not in items:
            items.append((mode, lab or None))
    return items


def overlay_selection(points: list[dict], items: list[tuple[str, str | None]]
                      ) -> list[tuple[str, str]]:
    """The (mode, label) series an ``--overlay`` names, in its order (``all``: every one; a
    label split by budget is named by its label or its series, ``cp`` for ``cp-e2`` and
    ``cp-e3``); an item that matches no run is a :class:`PBInputError` listing the ones there
    are."""
    have = sorted({(p["mode"], p["label"]) for p in points})
    series = {(p["mode"], p["label"]): p["series"] for p in points}
    if not items:
        return have
    out: list[tuple[str, str]] = []
    for mode, lab in items:
        match = [h for h in have if h[0] == mode and (lab is None or lab in (h[1], series[h]))]
        if not match:
            raise PBInputError(
                f"--overlay {mode}{':' + lab if lab else ''} matches no run; the runs have "
                f"{', '.join(f'{m}:{la}' for m, la in have)}")
        out += [m for m in match if m not in out]
    return out


OVERLAY_COLUMNS = ["model", "mode", "label", *SETTINGS, "epochs", "seeds", "remaining",
                   "test_acc", "on_front"]


def plot_overlay(points: list[dict], model: str, series: list[tuple[str, str]]
                 ) -> tuple[Any, list[list]]:
    """One figure of ``model`` with every chosen (mode, label) on shared axes: each series'
    points and its Pareto front; the colour and marker tell the series, the line style its mode
    (solid for the first mode, dashed, dotted ...). Returns the figure and its CSV rows
    (:data:`OVERLAY_COLUMNS`; ``on_front`` 1 for the points of the front)."""
    import matplotlib.pyplot as plt

    line_styles = ["-", "--", ":", "-."]
    modes = list(dict.fromkeys(m for m, _ in series))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    rows = []
    for k, (mode, lab) in enumerate(series):
        group = [p for p in points if (p["model"], p["mode"], p["label"]) == (model, mode, lab)]
        if not group:
            continue
        front = pareto_front(group)
        line = ax.plot([p["remaining"] for p in front], [p["test_acc"] for p in front],
                       marker="osD^v<>P*X"[k % 10], ls=line_styles[modes.index(mode) % 4],
                       color=f"C{k % 10}", label=f"{group[0]['legend']} ({mode})")[0]
        ax.scatter([p["remaining"] for p in group], [p["test_acc"] for p in group],
                   color=line.get_color(), marker=line.get_marker(), alpha=0.3, s=14)
        for p in sorted(group, key=lambda p: p["remaining"]):
            rows.append([model, mode, lab, *(p[c] for c in SETTINGS), p["epochs"], p["seeds"],
                         p["remaining"], p["test_acc"], int(any(p is q for q in front))])
    fraction_axis(ax, [p["remaining"] for p in points if p["model"] == model])
    ax.set_xlabel("weights remaining (fraction of masked weights, log)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{model}: " + ", ".join(f"{lab} ({mode})" for mode, lab in series), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig, rows


def plot_fronts(sel: list[dict], title: str) -> Any:
    """Test accuracy against weights remaining of one (model, mode): each label's points and its
    Pareto front, in its method's colour, with its method's legend text."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    look = styles(sorted(sel, key=lambda p: p["label"]))
    for lab in sorted(look):
        group = [p for p in sel if p["label"] == lab]
        front = pareto_front(group)
        line = ax.plot([p["remaining"] for p in front], [p["test_acc"] for p in front],
                       label=group[0]["legend"], **look[lab])[0]
        ax.scatter([p["remaining"] for p in group], [p["test_acc"] for p in group],
                   color=line.get_color(), alpha=0.35, s=12)
        spread = [p for p in front if p["seeds"] > 1]
        if spread:  # the seed spread of each front point: +-1 s.d.
            ax.errorbar([p["remaining"] for p in spread], [p["test_acc"] for p in spread],
                        xerr=[p["remaining_sd"] for p in spread],
                        yerr=[p["test_acc_sd"] for p in spread], fmt="none", lw=0.7,
                        capsize=1.5, color=line.get_color(), alpha=0.8)
    fraction_axis(ax, [p["remaining"] for p in sel])
    ax.set_xlabel("weights remaining (fraction of masked weights, log)")
    ax.set_ylabel("test accuracy (seed mean; bars: +-1 seed s.d.)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def common_fraction(sel: list[dict]) -> float:
    """The sparsest remaining fraction every pruning label of a (model, mode) reaches: the
    largest, over labels with some setting below 1, of the label's smallest remaining fraction
    (settings with no weight left aside); 1 when no label prunes."""
    lows = []
    for lab in {p["label"] for p in sel}:
        rem = [p["remaining"] for p in sel if p["label"] == lab and p["remaining"] > 0]
        if rem and min(rem) < 1:
            lows.append(min(rem))
    return max(lows) if lows else 1.0


def layer_choice(sel: list[dict], at: float | None, most_accurate_below: float | None
                 ) -> tuple[str, dict[str, dict]]:
    """How the per-layer plot chose its settings (words) and, per label, the setting: the
    most accurate at most ``most_accurate_below`` remaining; else the one nearest (in log
    remaining) to ``at`` (default :func:`common_fraction`)."""
    out = {}
    if most_accurate_below is not None:
        how = f"each label's most accurate setting at most {most_accurate_below:.3g} remaining"
        for lab in sorted({p["label"] for p in sel}):
            ok = [p for p in sel if p["label"] == lab and p["remaining"] <= most_accurate_below]
            if ok:
                out[lab] = max(ok, key=lambda p: p["test_acc"])
        return how, out
    target = common_fraction(sel) if at is None else at
    how = (f"the settings nearest {target:.2%} remaining"
           + (" (the sparsest fraction every pruning label reaches)" if at is None else ""))
    for lab in sorted({p["label"] for p in sel}):
        ok = [p for p in sel if p["label"] == lab and p["remaining"] > 0]
        if ok:
            out[lab] = min(ok, key=lambda p: (abs(math.log(p["remaining"] / target)),
                                              -p["test_acc"]))
    return how, out


def plot_layers(chosen: dict[str, dict], look: dict[str, dict], title: str) -> Any:
    """Fraction remaining per layer of the chosen setting of each label."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    layer_names: list[str] = []
    for lab, p in chosen.items():
        layer_names = list(p["layers"])
        ax.plot(range(len(layer_names)), [p["layers"][n] for n in layer_names], **look[lab],
                label=f"{p['legend']} ({p['remaining']:.2%}, acc {p['test_acc']:.3f})")
    ax.set_xticks(range(len(layer_names)), layer_names, rotation=60, fontsize=7)
    fraction_axis(ax, [v for p in chosen.values() for v in p["layers"].values()], axis="y")
    ax.set_ylabel("fraction remaining in the layer")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return fig


#: The columns of compare.csv.
COMPARE_COLUMNS = ("model", "mode", "a", "b", "verdict", "gap", "ci_low", "ci_high", "allowance",
                   "detectable", "budget_lo", "budget_hi", "seeds", "reason")


def runs_table(runs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """One series' runs as (seeds, settings) arrays of remaining and test accuracy, NaN where a
    setting was not run with a seed or diverged (rows: the seeds in order)."""
    keys = sorted({r["key"] for r in runs})
    seeds = sorted({r["seed"] for r in runs})
    rem = np.full((len(seeds), len(keys)), np.nan)
    acc = np.full((len(seeds), len(keys)), np.nan)
    for r in runs:
        if r["diverged"] is None:
            i, j = seeds.index(r["seed"]), keys.index(r["key"])
            rem[i, j], acc[i, j] = r["remaining"], r["test_acc"]
    return rem, acc


def compare_series(runs: Sequence[dict], a: str, b: str) -> list[dict]:
    """``--compare A B``: per (model, mode) where both series have runs, the verdict of
    :func:`analysis.scale.front_verdict.compare_fronts` (seeds paired when both series were run
    with the same seeds)."""
    out = []
    labels = {r["label"] for r in runs}
    for name in (a, b):
        if name not in labels:
            raise PBInputError(f"--compare: no series {name!r} among the runs; choose from "
                               f"{', '.join(sorted(labels))}")
    for model, mode in sorted({(r["model"], r["mode"]) for r in runs}):
        mine = [r for r in runs if (r["model"], r["mode"]) == (model, mode)]
        ra, rb = ([r for r in mine if r["label"] == x] for x in (a, b))
        if not ra or not rb:
            continue
        same = sorted({r["seed"] for r in ra}) == sorted({r["seed"] for r in rb})
        c = compare_fronts(*runs_table(ra), *runs_table(rb), paired=same)
        out.append({"model": model, "mode": mode, "a": a, "b": b, "verdict": c.verdict,
                    "gap": c.gap, "ci_low": c.ci[0], "ci_high": c.ci[1],
                    "allowance": c.allowance, "detectable": c.detectable,
                    "budget_lo": c.budgets[0], "budget_hi": c.budgets[1],
                    "seeds": c.test.how if c.test is not None else "", "reason": c.reason})
    if not out:
        raise PBInputError(f"--compare: {a} and {b} have no runs of one model and mode; choose "
                           "two series of the same model and mode")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis.pareto", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders or folders holding them")
    ap.add_argument("--out", type=out_folder, required=True,
                    help="folder for the figures and CSVs")
    pick = ap.add_mutually_exclusive_group()
    pick.add_argument("--layer-at", type=positive_float, default=None, metavar="FRACTION",
                      help="per-layer plot: each label's setting nearest this remaining "
                      "fraction (default: the sparsest fraction every pruning label reaches)")
    pick.add_argument("--layer-max", type=positive_float, default=None,
                      help="per-layer plot: each label's most accurate setting at most this "
                      "remaining instead")
    ap.add_argument("--compare", nargs=2, default=None, metavar=("A", "B"),
                    help="also judge whether series A's front lies above series B's (labels as "
                    "runs.csv names them, e.g. cp arms-escort-n10) in each model and mode both "
                    "have: holds, fails, noise or cannot tell (analysis.compare_fronts), with "
                    "compare.csv")
    ap.add_argument("--overlay", type=parse_overlay, default=None, metavar="all|MODE[:LABEL],...",
                    help="also draw the chosen modes or (mode, label) series of each model on "
                    "shared axes, e.g. supermask:cp,joint:gmp or all: overlay_<model>.png with "
                    "overlay_<model>.csv beside it")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = check_out(args.out, "--out")
    runs = read_runs(find_runs(args.runs))
    notes = split_budgets(runs)
    points = average_seeds(runs)
    overlay = None if args.overlay is None else overlay_selection(points, args.overlay)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = Outputs(out)
    cols = ["model", "mode", "label", *SETTINGS, "epochs", "seeds", "diverged",
            *(c for k in METRICS for c in (k, f"{k}_sd"))]
    pts = sorted(points, key=lambda p: (p["model"], p["mode"], p["label"], p["remaining"]))
    files.csv("runs.csv", cols, [[p[c] for c in cols] for p in pts])
    lines = ["| command | epochs | seeds | diverged | test acc (mean +- s.d.) | remaining "
             "(masked) | remaining (all) | s/epoch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in pts:
        lines.append(f"| `{p['command']}` | {p['epochs']} | {p['seeds']} | {p['diverged']} | "
                     f"{mean_sd(p['test_acc'], p['test_acc_sd'], '.4f')} | "
                     f"{mean_sd(p['remaining'], p['remaining_sd'], '.4%')} | "
                     f"{mean_sd(p['remaining_all'], p['remaining_all_sd'], '.4%')} | "
                     f"{p['seconds_per_epoch']:.1f} |")
    gone = diverged_only(runs)
    files.text("runs.md", "\n".join(lines) + "\n")
    pareto_rows, layer_rows, used = [], [], []
    for (model, mode) in sorted({(p["model"], p["mode"]) for p in points}):
        sel = [p for p in points if (p["model"], p["mode"]) == (model, mode)]
        fig = plot_fronts(sel, f"{model}, {mode}")
        files.figure(f"pareto_{file_part(model)}_{mode}.png", fig)
        plt.close(fig)
        for lab in sorted({p["label"] for p in sel}):
            for p in pareto_front([p for p in sel if p["label"] == lab]):
                pareto_rows.append([model, mode, lab, p["lam"], p["target"], p["remaining"],
                                    p["remaining_sd"], p["test_acc"], p["test_acc_sd"],
                                    p["seeds"]])
        how, chosen = layer_choice(sel, args.layer_at, args.layer_max)
        if chosen:
            fig = plot_layers(chosen, styles(sorted(sel, key=lambda p: p["label"])),
                              f"{model}, {mode}: per layer, {how}")
            files.figure(f"layers_{file_part(model)}_{mode}.png", fig)
            plt.close(fig)
            used.append(f"  per-layer plot {model} {mode}: {how}")
            for lab, p in chosen.items():
                used.append(f"    {lab:<22} {p['remaining']:.4%} remaining, test_acc "
                            f"{p['test_acc']:.4f}: {', '.join(p['runs'])}")
                layer_rows += [[model, mode, lab, p["remaining"], n, p["layers"][n],
                                ";".join(p["runs"])] for n in p["layers"]]
    files.csv("pareto.csv", ["model", "mode", "label", "lam", "target", "remaining",
                             "remaining_sd", "test_acc", "test_acc_sd", "seeds"], pareto_rows)
    files.csv("layers.csv", ["model", "mode", "label", "run_remaining", "layer", "remaining",
                             "runs"], layer_rows)
    compared = compare_series(runs, *args.compare) if args.compare else []
    if compared:
        files.csv("compare.csv", list(COMPARE_COLUMNS),
                  [[c[k] for k in COMPARE_COLUMNS] for c in compared])
    overlays = []
    for model in sorted({p["model"] for p in points}) if overlay is not None else ():
        mine = [s for s in overlay if any((p["model"], p["mode"], p["label"]) == (model, *s)
                                          for p in points)]
        if not mine:
            continue
        fig, rows = plot_overlay(points, model, mine)
        files.csv(f"overlay_{file_part(model)}.csv", OVERLAY_COLUMNS, rows)
        files.figure(f"overlay_{file_part(model)}.png", fig)
        plt.close(fig)
        overlays.append(f"overlay_{file_part(model)}.png")
    files.write()
    for note in notes:
        print(note, file=sys.stderr)
    diverged = sum(r["diverged"] is not None for r in runs)
    print(f"{len(runs)} runs ({len(points)} configurations)"
          + (f", {diverged} of them diverged" if diverged else "") + f" -> {out}")
    for r in pareto_rows:
        print(f"  {r[0]} {r[1]} {r[2]:<22} remaining {mean_sd(r[5], r[6], '.4%')}  test_acc "
              f"{mean_sd(r[7], r[8], '.4f')} ({r[9]} seed{'s' * (r[9] != 1)})")
    for line in used:
        print(line)
    if overlays:
        print(f"  overlays: {', '.join(overlays)} (with their CSVs)")
    for g in gone:
        print(f"  every seed diverged: {g}")
    for c in compared:
        numbers = (f"gap {c['gap']:+.4f}, 95% CI [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}] with "
                   f"interpolation allowance {c['allowance']:.4f} at {c['budget_lo']:.2%}.."
                   f"{c['budget_hi']:.2%} ({c['seeds']}); " if c["seeds"] else "")
        print(f"  {c['model']} {c['mode']}: does {c['a']} beat {c['b']}? {c['verdict']}: "
              f"{numbers}{c['reason']}")
    if any(math.isnan(p["test_acc"]) for p in points):
        print("warning: some runs have no test accuracy (nan)")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli_run(main))
