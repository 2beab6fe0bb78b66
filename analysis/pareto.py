"""``python -m analysis.pareto RUNS... --out DIR``: Pareto fronts and per-layer sparsity of
pruning runs (`fig:supermask_results`, `fig:joint_pruning_results`,
`fig:joint_pruning_per_layer`).

RUNS are run folders of ``python -m pbscale.prune`` (with ``config.json`` and ``summary.json``)
or folders holding them. Runs that differ only in their seed are averaged (test accuracy and
weights remaining; the seed count is reported). A method's label is its name (``cp``, ``mp``,
``gmp``, ``dense``) or, for MC, ``<estimator>-<param>-n<n>``, with ``-<init>`` when the weights
are not ``kaiming_normal``; its colour is its method's in the method registry. For every (model,
mode) this writes ``pareto_<model>_<mode>.png`` (test accuracy against weights remaining over
the masked tensors, log axis; each label's points and its Pareto front: the points no other
point of the label beats in both accuracy and sparsity) and ``layers_<model>_<mode>.png`` (per
layer fraction remaining of each label's most accurate run at most ``--layer-max`` remaining),
with ``runs.csv``, ``pareto.csv`` and ``layers.csv`` holding the plotted numbers. A setting a
method does not use is left empty in them (GMP and MP: ``lam``, ``mask_lr``; CP and MC:
``target``; dense: all three; :func:`used_settings`).

``--overlay supermask:cp,joint:gmp`` (or ``--overlay all``, or a mode alone) also draws the chosen
series of each model on one pair of shared axes, ``overlay_<model>.png``, with the plotted points
in ``overlay_<model>.csv``: "CP supermask against GMP joint" in one figure.

A run folder whose ``config.json`` or ``summary.json`` is missing, truncated or of the wrong shape
is skipped with one warning line on stderr naming it; the others are plotted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.cli import atomic_write_text, check_out_dir, save_figure, write_csv
from analysis.cli import run as cli_run
from pbexact.cli import ArgumentParser, positive_float
from pbexact.errors import PBInputError
from pbscale.methods import REGISTRY, names

#: The methods whose runs are labelled with their parametrization and n (the MC estimators).
MC = names(samples=True)


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Finished run folders (``summary.json`` present) at or directly under ``paths``."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise PBInputError(f"{p} does not exist; pass run folders or folders holding them")
        if not p.is_dir():
            raise PBInputError(f"{p} is a file; pass run folders or folders holding them")
        if (p / "summary.json").exists():
            found.append(p)
            continue
        try:
            found += sorted(q for q in p.iterdir() if (q / "summary.json").exists())
        except OSError as exc:
            raise PBInputError(f"cannot list {p} ({exc.strerror}); pass a readable folder"
                               ) from None
    if not found:
        raise PBInputError("no finished runs (folders with summary.json) under "
                           f"{', '.join(map(str, paths))}; run python -m pbscale.prune first")
    return found


#: The weight initialization runs are labelled with when it is not this one.
DEFAULT_INIT = "kaiming_normal"
#: Marker and line style of a method's 1st, 2nd, ... label (its colour is the registry's).
STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("v", "-."), ("D", "--")]


def label(task: dict) -> str:
    m = task["method"]
    base = f"{m}-{task['param']}-n{task['n']}" if m in MC else m
    init = task.get("init", DEFAULT_INIT)
    return base if init == DEFAULT_INIT else f"{base}-{init}"


def styles(labels: Sequence[str], methods: dict[str, str]) -> dict[str, dict]:
    """Plot keywords per label: the colour of its method in the method registry, and a marker
    and line style that tell apart the labels of one method (in the order given)."""
    out, seen = {}, defaultdict(int)
    for lab in labels:
        m = methods[lab]
        marker, ls = STYLES[seen[m] % len(STYLES)]
        seen[m] += 1
        fam = REGISTRY.get(m)
        out[lab] = {"marker": marker, "linestyle": ls,
                    **({"color": fam.color} if fam is not None else {})}
    return out


#: The run settings the tables show besides the method's label; :func:`used_settings` says
#: which of them a method uses (the others are left empty: they do not act on its run).
SETTINGS = ("lam", "target", "mask_lr")


def used_settings(method: str) -> frozenset[str]:
    """The :data:`SETTINGS` a method's run depends on, from its registry family: a method with
    mask logits (CP, MC) has the L0 weight ``lam`` and the mask learning rate ``mask_lr``; one
    that cuts by magnitude (MP, GMP) prunes to ``target``; dense training uses none."""
    family = REGISTRY[method]
    used = {"lam", "mask_lr"} if family.logits else set()
    return frozenset(used | ({"target"} & set(family.prune_settings)))


class DamagedRun(Exception):
    """A run folder whose config.json or summary.json cannot be read as a finished run."""


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except OSError as exc:
        raise DamagedRun(f"cannot read {path.name} ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise DamagedRun(f"{path.name} is not valid JSON (truncated?)") from None
    if not isinstance(obj, dict):
        raise DamagedRun(f"{path.name} holds a {type(obj).__name__}, not an object")
    return obj


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DamagedRun(f"{name} is {value!r}, not a number")
    return float(value)


def read_run(folder: Path) -> dict:
    """One finished run's settings and final metrics; :class:`DamagedRun` (with the reason)
    when its config.json or summary.json is missing, truncated or of the wrong shape."""
    cfg = _read_json(folder / "config.json")
    summ = _read_json(folder / "summary.json")
    task = cfg.get("task")
    if not isinstance(task, dict):
        raise DamagedRun("config.json has no 'task' object")
    try:
        used = used_settings(task["method"])
        layers = {k[len("final_remaining_"):]: _number(v, k) for k, v in summ.items()
                  if k.startswith("final_remaining_") and k != "final_remaining_all"}
        metrics = {k: _number(summ[s], s) for k, s in (
            ("test_acc", "final_test_acc"), ("val_acc", "final_val_acc"),
            ("remaining", "final_remaining"), ("remaining_all", "final_remaining_all"),
            ("seconds_per_epoch", "seconds_per_epoch"))}
        return {"run": folder.name, "model": task["model"], "mode": task["mode"],
                "label": label(task), "method": task["method"],
                **{k: task[k] if k in used else "" for k in SETTINGS},
                "epochs": task["epochs"], "seed": task["seed"], **metrics, "layers": layers,
                "key": json.dumps({k: v for k, v in task.items() if k != "seed"},
                                  sort_keys=True),
                "command": command(task)}
    except KeyError as exc:
        raise DamagedRun(f"config.json or summary.json lacks {exc}") from None
    except TypeError as exc:
        raise DamagedRun(f"a value of config.json has the wrong type ({exc})") from None


def read_runs(folders: Sequence[Path]) -> list[dict]:
    """Every readable run; a damaged one is skipped with one warning line on stderr naming its
    folder and the reason. None readable: :class:`PBInputError`."""
    runs = []
    for f in folders:
        try:
            runs.append(read_run(f))
        except DamagedRun as exc:
            print(f"warning: skipped the damaged run {f}: {exc}", file=sys.stderr)
    if not runs:
        raise PBInputError(f"none of the {len(folders)} run(s) could be read (see the warnings); "
                           "rerun them with python -m pbscale.prune")
    return runs


def command(task: dict) -> str:
    """The shortest ``python -m pbscale.prune`` command line of a run's configuration: the
    options that differ from the defaults (``--data-dir`` left out)."""
    from pbscale.prune import PruneConfig

    default = PruneConfig(model=task["model"], mode=task["mode"]).resolved()
    parts = ["python -m pbscale.prune"]
    for k, v in task.items():
        if getattr(default, k, None) != v or k in ("model", "mode", "method"):
            if isinstance(v, bool):
                if v:
                    parts.append(f"--{k.replace('_', '-')}")
            else:
                parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts)


def average_seeds(runs: list[dict]) -> list[dict]:
    """One point per configuration: means over its seeds."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["key"]].append(r)
    out = []
    for rs in groups.values():
        p = dict(rs[0])
        for k in ("test_acc", "val_acc", "remaining", "remaining_all", "seconds_per_epoch"):
            p[k] = sum(r[k] for r in rs) / len(rs)
        p["seeds"] = len(rs)
        p["layers"] = {k: sum(r["layers"][k] for r in rs) / len(rs) for k in rs[0]["layers"]}
        out.append(p)
    return out


def pareto_front(points: list[dict]) -> list[dict]:
    """Points not dominated (another point with remaining <= and test_acc >=, one strictly),
    sorted by remaining."""
    front = []
    for p in points:
        dominated = any(q["remaining"] <= p["remaining"] and q["test_acc"] >= p["test_acc"]
                        and (q["remaining"] < p["remaining"] or q["test_acc"] > p["test_acc"])
                        for q in points)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: p["remaining"])


def parse_overlay(text: str) -> list[tuple[str, str | None]]:
    """``--overlay``: ``all``, or comma-separated ``MODE`` or ``MODE:LABEL`` items (e.g.
    ``supermask:cp,joint:gmp``) -> [(mode, label or None for every label of the mode)]; ``all``
    is ``[]``."""
    text = text.strip()
    if text == "all":
        return []
    items = []
    for part in text.split(","):
        mode, _, lab = part.strip().partition(":")
        if not mode or (":" in part and not lab):
            raise argparse.ArgumentTypeError(
                f"expected all or MODE[:LABEL],... such as supermask:cp,joint:gmp, got {text!r}")
        items.append((mode, lab or None))
    return items


def overlay_selection(points: list[dict], items: list[tuple[str, str | None]]
                      ) -> list[tuple[str, str]]:
    """The (mode, label) series an ``--overlay`` names, in its order (``all``: every one);
    an item that matches no run is a :class:`PBInputError` listing the ones there are."""
    have = sorted({(p["mode"], p["label"]) for p in points})
    if not items:
        return have
    out: list[tuple[str, str]] = []
    for mode, lab in items:
        match = [h for h in have if h[0] == mode and (lab is None or h[1] == lab)]
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

    styles = ["-", "--", ":", "-."]
    modes = list(dict.fromkeys(m for m, _ in series))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    rows = []
    for k, (mode, lab) in enumerate(series):
        group = [p for p in points if (p["model"], p["mode"], p["label"]) == (model, mode, lab)]
        if not group:
            continue
        front = pareto_front(group)
        line = ax.plot([p["remaining"] for p in front], [p["test_acc"] for p in front],
                       marker="osD^v<>P*X"[k % 10], ls=styles[modes.index(mode) % len(styles)],
                       color=f"C{k % 10}", label=f"{lab} ({mode})")[0]
        ax.scatter([p["remaining"] for p in group], [p["test_acc"] for p in group],
                   color=line.get_color(), marker=line.get_marker(), alpha=0.3, s=14)
        for p in sorted(group, key=lambda p: p["remaining"]):
            rows.append([model, mode, lab, *(p[c] for c in SETTINGS), p["epochs"], p["seeds"],
                         p["remaining"], p["test_acc"], int(any(p is q for q in front))])
    ax.set_xscale("log")
    ax.set_xlabel("weights remaining (fraction of masked weights, log)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{model}: " + ", ".join(f"{lab} ({mode})" for mode, lab in series), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig, rows


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis.pareto", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders or folders holding them")
    ap.add_argument("--out", type=Path, required=True, help="folder for the figures and CSVs")
    ap.add_argument("--layer-max", type=positive_float, default=1.0,
                    help="per-layer plot: each label's most accurate run at most this remaining")
    ap.add_argument("--overlay", type=parse_overlay, default=None, metavar="all|MODE[:LABEL],...",
                    help="also draw the chosen modes or (mode, label) series of each model on "
                    "shared axes, e.g. supermask:cp,joint:gmp or all: overlay_<model>.png with "
                    "overlay_<model>.csv beside it")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = check_out_dir(args.out, "--out")
    runs = read_runs(find_runs(args.runs))
    points = average_seeds(runs)
    overlay = None if args.overlay is None else overlay_selection(points, args.overlay)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = ["model", "mode", "label", *SETTINGS, "epochs", "seeds",
            "test_acc", "val_acc", "remaining", "remaining_all", "seconds_per_epoch"]
    pts = sorted(points, key=lambda p: (p["model"], p["mode"], p["label"], p["remaining"]))
    write_csv(out / "runs.csv", cols, [[p[c] for c in cols] for p in pts])
    lines = ["| command | epochs | seeds | test acc | remaining (masked) | remaining (all) | "
             "s/epoch |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in pts:
        lines.append(f"| `{p['command']}` | {p['epochs']} | {p['seeds']} | "
                     f"{p['test_acc']:.4f} | {p['remaining']:.4%} | {p['remaining_all']:.4%} | "
                     f"{p['seconds_per_epoch']:.1f} |")
    atomic_write_text(out / "runs.md", "\n".join(lines) + "\n")
    pareto_rows, layer_rows = [], []
    for (model, mode) in sorted({(p["model"], p["mode"]) for p in points}):
        sel = [p for p in points if (p["model"], p["mode"]) == (model, mode)]
        fig, ax = plt.subplots(figsize=(6, 4))
        fig2, ax2 = plt.subplots(figsize=(6, 4))
        labs = sorted({p["label"] for p in sel})
        look = styles(labs, {p["label"]: p["method"] for p in sel})
        for lab in labs:
            group = [p for p in sel if p["label"] == lab]
            front = pareto_front(group)
            line = ax.plot([p["remaining"] for p in front], [p["test_acc"] for p in front],
                           label=lab, **look[lab])[0]
            ax.scatter([p["remaining"] for p in group], [p["test_acc"] for p in group],
                       color=line.get_color(), alpha=0.35, s=12)
            for p in front:
                pareto_rows.append([model, mode, lab, p["lam"], p["target"], p["remaining"],
                                    p["test_acc"], p["seeds"]])
            eligible = [p for p in group if p["remaining"] <= args.layer_max]
            if eligible:
                best = max(eligible, key=lambda p: p["test_acc"])
                names = list(best["layers"])
                ax2.plot(range(len(names)), [best["layers"][n] for n in names], **look[lab],
                         label=f"{lab} ({best['remaining']:.2%}, acc {best['test_acc']:.3f})")
                for n in names:
                    layer_rows.append([model, mode, lab, best["remaining"], n,
                                       best["layers"][n]])
        ax.set_xscale("log")
        ax.set_xlabel("weights remaining (fraction of masked weights, log)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{model}, {mode}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        save_figure(fig, [out / f"pareto_{model}_{mode}.png"])
        if ax2.lines:
            ax2.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
            ax2.set_yscale("log")
            ax2.set_ylabel("fraction remaining in the layer")
            ax2.set_title(f"{model}, {mode}: per layer")
            ax2.legend(fontsize=7)
            save_figure(fig2, [out / f"layers_{model}_{mode}.png"])
        plt.close(fig)
        plt.close(fig2)
    write_csv(out / "pareto.csv", ["model", "mode", "label", "lam", "target", "remaining",
                                   "test_acc", "seeds"], pareto_rows)
    write_csv(out / "layers.csv", ["model", "mode", "label", "run_remaining", "layer",
                                   "remaining"], layer_rows)
    overlays = []
    for model in sorted({p["model"] for p in points}) if overlay is not None else ():
        mine = [s for s in overlay if any((p["model"], p["mode"], p["label"]) == (model, *s)
                                          for p in points)]
        if not mine:
            continue
        fig, rows = plot_overlay(points, model, mine)
        write_csv(out / f"overlay_{model}.csv", OVERLAY_COLUMNS, rows)
        save_figure(fig, [out / f"overlay_{model}.png"])
        plt.close(fig)
        overlays.append(f"overlay_{model}.png")
    print(f"{len(runs)} runs ({len(points)} configurations) -> {out}")
    for r in pareto_rows:
        print(f"  {r[0]} {r[1]} {r[2]:<22} remaining {r[5]:.4%}  test_acc {r[6]:.4f}")
    if overlays:
        print(f"  overlays: {', '.join(overlays)} (with their CSVs)")
    if any(math.isnan(p["test_acc"]) for p in points):
        print("warning: some runs have no test accuracy (nan)")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli_run(main))
