"""Finished run folders as analysis reads them: the one reader of ``analysis.pareto`` and
``analysis.scale_report``.

A run folder of ``python -m pbscale.prune`` holds ``config.json`` (``task``: the run's settings),
``summary.json`` (final metrics) and ``metrics.csv`` (per epoch); one of ``python -m
pbscale.regress`` holds ``config.json`` (``task``, ``method``, ``loop``), ``summary.json`` and
``history.csv``. Every value analysis takes is checked here: a folder whose files are missing,
truncated, of the wrong shape or hold a wrong value is a :class:`DamagedRun`, which
:func:`read_each` skips with one warning line naming the folder and the reason.

A run describes its method itself (:class:`MethodInfo`): ``config.json``'s ``method_info``
(label, colour, whether it samples, which settings it uses) where the run recorded it, else the
live method registry (:data:`pbscale.methods.REGISTRY`), else the bare name with a neutral
colour, so a run of a method removed since still reads, under its recorded label.

A run's training budget (:data:`PRUNE_BUDGET`, :data:`REGRESSION_BUDGET`: what was trained and
for how long) is part of its setting: runs of different budgets are never averaged together.

A run that stopped on a non-finite value (it exits with code 2) leaves :data:`DIVERGED` beside its
``config.json``: the epoch and step, where and why, and the last finished epoch's metrics. Such a
folder (no ``summary.json``) is a :class:`DivergedRun`: an outcome the analyses count, not a
point on a front. A folder with a ``summary.json`` is finished, whatever else it holds.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from pbexact.errors import PBInputError
from pbscale.runs import io as runio

#: The colour of a method that neither the run nor the registry describes.
NEUTRAL_COLOR = "0.45"
#: The pruning settings that set what was trained and for how long: runs that differ in one of
#: them are never one point or one front.
PRUNE_BUDGET = ("model", "dataset", "mask_head", "mask_shortcuts", "epochs", "max_batches",
                "batch_size", "synthetic", "val_size")
#: The same for NN-regression runs (``loop.epochs`` and the problem's size).
REGRESSION_BUDGET = ("epochs", "d", "n_train", "n_valid", "batch")
#: Task values checked by type where a run has them (the others are kept as they are).
INTEGER_TASK = ("seed", "epochs", "n", "max_batches", "batch_size", "synthetic", "val_size")
REAL_TASK = ("lam", "mask_lr", "target", "lr")
TEXT_TASK = ("model", "mode", "method", "dataset", "param", "mask_opt", "init")


#: The record a diverged run leaves in its folder (:data:`pbscale.runs.io.DIVERGED`, written by
#: :func:`pbscale.runs.io.write_diverged`).
DIVERGED = runio.DIVERGED
#: The keys of that record: epoch (int), step (int or null), where (text), reason (one line),
#: last_metrics (the last finished epoch's metrics, possibly {}).
DIVERGED_KEYS = ("epoch", "step", "where", "reason", "last_metrics")


class DamagedRun(Exception):
    """A run folder whose files cannot be read as a finished run (the message says why)."""


# ------------------------------------------------------------------------------ values


def read_object(path: Path) -> dict:
    """A JSON object from ``path``; :class:`DamagedRun` if missing, unreadable, truncated or not
    an object."""
    try:
        obj = json.loads(path.read_text())
    except OSError as exc:
        raise DamagedRun(f"cannot read {path.name} ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise DamagedRun(f"{path.name} is not valid JSON (truncated?)") from None
    if not isinstance(obj, dict):
        raise DamagedRun(f"{path.name} holds a {type(obj).__name__}, not an object")
    return obj


def number(value: object, name: str, integer: bool = False, finite: bool = False,
           low: float | None = None, high: float | None = None) -> Any:
    """``value`` as a float (an int with ``integer``); :class:`DamagedRun` naming ``name`` if it is
    not a number (booleans and strings are not), not whole, not finite or outside [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DamagedRun(f"{name} is {value!r}, not a number")
    x = float(value)
    if (finite or integer or low is not None or high is not None) and not math.isfinite(x):
        raise DamagedRun(f"{name} is {value!r}, not a finite number")
    if integer and not x.is_integer():
        raise DamagedRun(f"{name} is {value!r}, not a whole number")
    if (low is not None and x < low) or (high is not None and x > high):
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise DamagedRun(f"{name} is {value!r}, outside [{lo}, {hi}]")
    return int(x) if integer else x


def text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise DamagedRun(f"{name} is {value!r}, not a name")
    return value


def read_columns(path: Path, need: Sequence[str] = ()) -> dict[str, list[float]]:
    """The columns of a run's CSV (``metrics.csv``, ``history.csv``) as floats; every row must
    have every column (a truncated file does not) and at least one row; ``need`` lists columns
    that must be there."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise DamagedRun(f"cannot read {path.name} ({exc.strerror})") from None
    except (UnicodeDecodeError, csv.Error):
        raise DamagedRun(f"{path.name} is not a CSV file") from None
    if len(rows) < 2:
        raise DamagedRun(f"{path.name} has no rows (truncated?)")
    header, body = rows[0], rows[1:]
    missing = [c for c in need if c not in header]
    if missing:
        raise DamagedRun(f"{path.name} lacks the column {missing[0]}")
    for i, row in enumerate(body, 2):
        if len(row) != len(header):
            raise DamagedRun(f"{path.name} line {i} has {len(row)} of {len(header)} values "
                             "(truncated?)")
    try:
        return {c: [float(r[j]) for r in body] for j, c in enumerate(header)}
    except ValueError as exc:
        raise DamagedRun(f"{path.name} holds a value that is not a number ({exc})") from None


# ------------------------------------------------------------------------------ methods


@dataclass(frozen=True)
class MethodInfo:
    """What analysis needs to know about a run's method: ``label`` (legend text), ``text``
    (messages), ``color`` (matplotlib colour), ``samples`` (draws masks for its estimate: the
    MC estimators), ``deterministic`` (draws nothing), ``settings`` (the run settings it uses;
    None: not known, every setting is shown) and ``source`` (``run``, ``registry`` or
    ``name``: where this came from)."""

    name: str
    label: str
    text: str
    color: str
    samples: bool
    deterministic: bool
    settings: frozenset[str] | None
    source: str

    def uses(self, setting: str) -> bool:
        return self.settings is None or setting in self.settings


def legacy_settings(family: Any) -> frozenset[str]:
    """The run settings analysis takes a registry family's run to use when the run recorded
    none (no "method_info": runs made before it was recorded, e.g. most of figures/claims):
    the listing of that time, so that those studies read as they always did. It differs from
    what a run records now (:func:`pbscale.pruning.config.method_reads`) where the capabilities
    were stated later: edge-popup's lam (its L0 term was a constant) and ST-theta's n (pruning
    runs it with n = 1) are listed here. ``param`` (any parametrization), ``n`` (it draws
    samples), ``lam``, ``mask_opt`` and ``mask_lr`` (it trains mask logits), and its cut
    schedule's settings (``target`` ...)."""
    caps = family.caps
    used = set(caps.prune_settings)
    if caps.any_param:
        used.add("param")
    if caps.min_samples is not None:
        used.add("n")
    if caps.logits:
        used |= {"lam", "mask_opt", "mask_lr"}
    return frozenset(used)


def _color(value: str) -> str:
    from matplotlib.colors import is_color_like

    return value if is_color_like(value) else NEUTRAL_COLOR


def method_info(cfg: dict, name: str) -> MethodInfo:
    """The :class:`MethodInfo` of a run of method ``name``: its config's ``method_info``, else
    the registry's family (its settings by :func:`legacy_settings`), else the name itself
    (neutral colour, every setting shown). A ``method_info`` of the wrong shape is a
    :class:`DamagedRun`."""
    rec = cfg.get("method_info")
    if rec is not None:
        if not isinstance(rec, dict):
            raise DamagedRun(f"method_info is a {type(rec).__name__}, not an object")
        label = rec.get("label", name)
        settings = rec.get("settings")
        if not isinstance(label, str) or not all(
                isinstance(rec.get(k, False), bool) for k in ("samples", "deterministic")) or (
                settings is not None and not (isinstance(settings, list)
                                              and all(isinstance(s, str) for s in settings))):
            raise DamagedRun("method_info has a value of the wrong type")
        return MethodInfo(name, label or name, str(rec.get("text") or label or name),
                          _color(str(rec.get("color") or NEUTRAL_COLOR)),
                          rec.get("samples", False), rec.get("deterministic", False),
                          None if settings is None else frozenset(settings), "run")
    from pbscale.methods import REGISTRY

    fam = REGISTRY.get(name)
    if fam is not None:
        return MethodInfo(name, fam.label or name, fam.text or name, _color(fam.color or
                                                                            NEUTRAL_COLOR),
                          fam.caps.samples, fam.caps.deterministic, legacy_settings(fam),
                          "registry")
    return MethodInfo(name, name, name, NEUTRAL_COLOR, False, False, None, "name")


# ------------------------------------------------------------------------------ runs


def lam_text(settings: dict) -> Any:
    """The L0 strength a pruning run is known by: its ``lam``, or ``"target 5%"`` for a run
    that steered lambda to a target fraction (``--lam-target``; its ``lam`` only the start)."""
    target = settings.get("lam_target")
    return f"target {100 * target:.3g}%" if target else settings.get("lam")


def budget_of(settings: dict, keys: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    """A run's training budget: its values of ``keys`` (those it has), as a hashable tuple."""
    return tuple((k, settings[k]) for k in keys if k in settings)


def budget_text(budget: Sequence[tuple[str, Any]], among: Iterable[Sequence] = ()) -> str:
    """A budget as words: ``4 ep`` (``max_batches`` ``20``: ``4 ep x 20 batches``), with every
    other value that differs from one of ``among`` (other budgets) appended."""
    b = dict(budget)
    words = f"{b.get('epochs', '?')} ep"
    if b.get("max_batches"):
        words += f" x {b['max_batches']} batches"
    others = [dict(o) for o in among]
    for k, v in b.items():
        if k not in ("epochs", "max_batches") and any(o.get(k) != v for o in others):
            words += f", {k} {v}"
    return words


@cache
def layer_sizes(model: str, mask_head: bool, mask_shortcuts: bool) -> dict[str, int]:
    """{layer: dense weights} of the masked tensors of a pruning run, keyed as its summary's
    ``final_remaining_<layer>`` and its metrics' ``remaining_<layer>``."""
    from pbscale.nets.models import build_model

    net = build_model(model)
    counts = net.layer_counts(net.masked_names(mask_head, mask_shortcuts))
    return {k.removesuffix(".weight"): v for k, v in counts.items()}


@dataclass(frozen=True)
class PruneRun:
    """A finished ``pbscale.prune`` run: its task (every setting), method, seed, final metrics
    (``remaining``: fraction of the masked weights left; ``test_acc`` may be nan when the run
    has no test set), per-layer fractions left and the masked layers' sizes."""

    folder: Path
    task: dict
    info: MethodInfo
    seed: int
    metrics: dict[str, float]
    layers: dict[str, float]
    sizes: dict[str, int]

    @property
    def method(self) -> str:
        return self.task["method"]


@dataclass(frozen=True)
class RegressionRun:
    """A finished ``pbscale.regress`` run: method, settings (method settings, ``epochs``,
    ``data_seed`` and the problem's size), seed, final validation loss and the curve
    (``epochs``, ``losses``: per logged epoch)."""

    folder: Path
    method: str
    info: MethodInfo
    settings: dict
    seed: int
    final_loss: float
    epochs: list[float]
    losses: list[float]


#: Final metrics of a pruning run: (key, summary.json name, required).
PRUNE_METRICS = (("test_acc", "final_test_acc", True), ("val_acc", "final_val_acc", False),
                 ("remaining", "final_remaining", True),
                 ("remaining_all", "final_remaining_all", False),
                 ("seconds_per_epoch", "seconds_per_epoch", False))


def check_task(task: object) -> dict:
    """A pruning task's settings, each checked by type; the seed and epochs whole numbers."""
    if not isinstance(task, dict):
        raise DamagedRun("config.json has no 'task' object")
    for k in ("method", "model", "mode", "seed", "epochs"):
        if k not in task:
            raise DamagedRun(f"config.json's task lacks '{k}'")
    out = dict(task)
    for k in INTEGER_TASK:
        if k in out:
            out[k] = number(out[k], f"task {k}", integer=True, low=0)
    for k in REAL_TASK:
        if k in out:
            out[k] = number(out[k], f"task {k}", finite=True)
    for k in TEXT_TASK:
        if k in out:
            text(out[k], f"task {k}")
    return out


@cache
def task_fields() -> frozenset[str]:
    """The entries of a pruning run's task that are not its method's own settings: the fields
    of :class:`pbscale.pruning.config.PruneConfig` and the identities of the user's network and
    data."""
    import dataclasses

    from pbscale.pruning.config import PruneConfig

    return frozenset(f.name for f in dataclasses.fields(PruneConfig)) | {"network_id", "data_id"}


def read_task(cfg: dict) -> dict:
    """A pruning run's settings as analysis reads them (:func:`check_task`), the same from a
    folder of either config.json format: those it read, its method's own under "settings"
    ({setting: value}). Format 2 holds only those, its method's own under their options' names
    (``cp_final_tau``); format 1 held every field, listing those the run did not read in
    "info" as "unused" (left out here)."""
    from pbscale.methods.options import option_dest

    task = check_task(cfg.get("task"))
    if "format" in cfg:
        prefix = option_dest(task["method"], "")
        own = {k: v for k, v in task.items() if k.startswith(prefix) and k not in task_fields()}
        out = {k: v for k, v in task.items() if k not in own}
        if own:
            out["settings"] = {k.removeprefix(prefix): v for k, v in own.items()}
        return out
    info = cfg.get("info")
    unused = info.get("unused") if isinstance(info, dict) else None
    if not isinstance(unused, list):
        return task
    return {k: v for k, v in task.items() if k not in unused}


def read_prune(folder: Path) -> PruneRun:
    """One finished pruning run; :class:`DamagedRun` with the reason otherwise."""
    cfg = read_object(folder / "config.json")
    summ = read_object(folder / "summary.json")
    task = read_task(cfg)
    metrics = {}
    for key, name, required in PRUNE_METRICS:
        if name not in summ and not required:
            metrics[key] = math.nan
            continue
        if name not in summ:
            raise DamagedRun(f"summary.json lacks '{name}'")
        x = number(summ[name], name)
        if key == "seconds_per_epoch":
            ok = math.isnan(x) or x >= 0
        else:  # a fraction; an accuracy may be nan (no test set), a remaining fraction not
            ok = 0 <= x <= 1 or (math.isnan(x) and not key.startswith("remaining"))
        if not ok:
            raise DamagedRun(f"{name} is {summ[name]!r}, out of its range")
        metrics[key] = x
    # a channel run (--granularity channel) also reports its channels and MACs kept
    not_layers = {"all"} | ({"channels", "macs"} if task.get("granularity") == "channel"
                            else set())
    layers = {k[len("final_remaining_"):]: number(v, k, low=0, high=1) for k, v in summ.items()
              if k.startswith("final_remaining_")
              and k[len("final_remaining_"):] not in not_layers}
    recorded = cfg.get("info", {}).get("masked_sizes") if isinstance(cfg.get("info"),
                                                                       dict) else None
    try:
        # a user's network (pbscale.nets.network) records its masked sizes; a built-in one is built
        sizes = ({k.removesuffix(".weight"): int(v) for k, v in recorded.items()}
                 if isinstance(recorded, dict) else
                 layer_sizes(task["model"], bool(task.get("mask_head")),
                             bool(task.get("mask_shortcuts"))))
    except (PBInputError, KeyError, ValueError, TypeError) as exc:
        raise DamagedRun(f"task model {task['model']!r} cannot be built ({exc})") from None
    if set(layers) != set(sizes):
        raise DamagedRun(f"summary.json's layers ({', '.join(sorted(layers)) or 'none'}) are "
                         f"not {task['model']}'s masked layers ({', '.join(sizes)})")
    return PruneRun(folder, task, method_info(cfg, task["method"]), task["seed"], metrics,
                    {k: layers[k] for k in sizes}, sizes)


def regression_setting(cfg: dict) -> tuple[str, dict, int]:
    """A regression run's method name, settings (method settings, ``epochs``, ``data_seed`` and
    the problem's size) and seed, from its config.json."""
    method, loop, task = cfg.get("method"), cfg.get("loop"), cfg.get("task")
    if not isinstance(method, dict) or not isinstance(loop, dict) or not isinstance(task, dict):
        raise DamagedRun("config.json lacks its 'method' or 'loop' object")
    name = text(method.get("method"), "method")
    settings = {k: v for k, v in method.items() if k not in ("seed", "chunk", "method")}
    for k in ("n",):
        if k in settings:
            settings[k] = number(settings[k], k, integer=True, low=0)
    for k in ("lr", "lam"):
        if k in settings:
            settings[k] = number(settings[k], k, finite=True)
    settings["epochs"] = number(loop.get("epochs"), "loop epochs", integer=True, low=0)
    settings["data_seed"] = task.get("data_seed")
    settings.update({k: task[k] for k in REGRESSION_BUDGET if k in task and k != "epochs"})
    seed = number(method.get("seed"), "seed", integer=True, low=0)
    return name, settings, seed


def read_regression(folder: Path) -> RegressionRun:
    """One finished NN-regression run; :class:`DamagedRun` with the reason otherwise."""
    cfg = read_object(folder / "config.json")
    summ = read_object(folder / "summary.json")
    name, settings, seed = regression_setting(cfg)
    if "final_val_loss_chosen" not in summ:
        raise DamagedRun("summary.json lacks 'final_val_loss_chosen'")
    final = number(summ["final_val_loss_chosen"], "final_val_loss_chosen", finite=True)
    hist = read_columns(folder / "history.csv", ("epoch", "val_loss_chosen"))
    return RegressionRun(folder, name, method_info(cfg, name), settings, seed, final,
                         hist["epoch"], hist["val_loss_chosen"])


def read_diverged(folder: Path) -> dict | None:
    """The :data:`DIVERGED` record of a run folder (None when there is none);
    :class:`DamagedRun` when it is not an object of :data:`DIVERGED_KEYS` with values of their
    types."""
    try:
        rec = runio.read_diverged(folder)  # pbscale's reader: None, a dict, or one line
    except PBInputError as exc:
        raise DamagedRun(str(exc)) from None
    if rec is None:
        return None
    missing = [k for k in DIVERGED_KEYS if k not in rec]
    if missing:
        raise DamagedRun(f"{DIVERGED} lacks '{missing[0]}'")
    number(rec["epoch"], f"{DIVERGED} epoch", integer=True, low=0)
    if rec["step"] is not None:
        number(rec["step"], f"{DIVERGED} step", integer=True, low=0)
    for k in ("where", "reason"):
        if not isinstance(rec[k], str):
            raise DamagedRun(f"{DIVERGED} {k} is {rec[k]!r}, not text")
    if not isinstance(rec["last_metrics"], dict):
        raise DamagedRun(f"{DIVERGED} last_metrics is a {type(rec['last_metrics']).__name__}, "
                         "not an object")
    return {**rec, "epoch": int(rec["epoch"]),
            "step": None if rec["step"] is None else int(rec["step"])}


def finished_or_diverged(folder: Path) -> bool:
    """Whether a folder holds a run that ended: ``config.json`` with ``summary.json`` (finished)
    or with :data:`DIVERGED` (diverged)."""
    return (folder / "config.json").exists() and (
        (folder / "summary.json").exists() or (folder / DIVERGED).exists())


@dataclass(frozen=True)
class DivergedRun:
    """A run that diverged: its experiment (``supermask``, ``joint``, ``regression``), method,
    settings (as the finished run's would be), seed, what it recorded about its method, and its
    :data:`DIVERGED` record."""

    folder: Path
    experiment: str
    method: str
    info: MethodInfo
    settings: dict
    seed: int
    record: dict


def read_diverged_run(folder: Path, cfg: dict, record: dict) -> DivergedRun | None:
    """A diverged pruning or regression run (None: another tool's)."""
    task = cfg.get("task")
    if not isinstance(task, dict):
        raise DamagedRun("config.json has no 'task' object")
    if "mode" in task:
        task = read_task(cfg)
        return DivergedRun(folder, task["mode"], task["method"], method_info(cfg, task["method"]),
                           {k: v for k, v in task.items() if k != "seed"}, task["seed"], record)
    if task.get("name") == "regression":
        name, settings, seed = regression_setting(cfg)
        return DivergedRun(folder, "regression", name, method_info(cfg, name), settings, seed,
                           record)
    return None


def read_run(folder: Path) -> PruneRun | RegressionRun | DivergedRun | None:
    """A pruning or NN-regression run folder, finished or diverged; None for a folder of another
    tool (a task without ``mode`` that is not a regression)."""
    cfg = read_object(folder / "config.json")
    task = cfg.get("task")
    if not isinstance(task, dict):
        raise DamagedRun("config.json has no 'task' object")
    if not (folder / "summary.json").exists():
        record = read_diverged(folder)
        if record is not None:
            return read_diverged_run(folder, cfg, record)
    if "mode" in task:
        return read_prune(folder)
    if task.get("name") == "regression":
        return read_regression(folder)
    return None


T = TypeVar("T")


def read_each(folders: Iterable[Path], reader: Callable[[Path], T | None]) -> list[T]:
    """``reader`` of every folder, in order; a :class:`DamagedRun` is skipped with one warning
    line on stderr naming its folder and the reason, a None (another tool's folder) silently."""
    out = []
    for f in folders:
        try:
            got = reader(f)
        except DamagedRun as exc:
            print(f"warning: skipped the damaged run {f}: {exc}", file=sys.stderr)
            continue
        if got is not None:
            out.append(got)
    return out
