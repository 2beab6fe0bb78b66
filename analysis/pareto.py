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
dense: all three; :func:`analysis.scale.pareto_rows.used_settings`).

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
import math
import sys
from collections.abc import Sequence

from analysis.cli import run as cli_run
from analysis.scale.compare import COMPARE_COLUMNS, compare_series
from analysis.scale.fronts import pareto_front
from analysis.scale.outputs import Outputs, check_out, out_folder
from analysis.scale.pareto_overlay import overlay_selection, parse_overlay
from analysis.scale.pareto_plots import (
    OVERLAY_COLUMNS,
    layer_choice,
    plot_fronts,
    plot_layers,
    plot_overlay,
    styles,
)
from analysis.scale.pareto_rows import (
    METRICS,
    SETTINGS,
    average_seeds,
    diverged_only,
    find_runs,
    read_runs,
    split_budgets,
)
from pbexact.cli import ArgumentParser, positive_float


def file_part(model: str) -> str:
    """A model's name as part of a file name: a user's import path ``package.module:factory``
    with ``:`` (not allowed in Windows file names) written ``-``."""
    return model.replace(":", "-")


def mean_sd(mean: float, sd: float, fmt: str) -> str:
    """``0.9612 +- 0.0012`` (the mean alone when the s.d. is NaN: one seed)."""
    return format(mean, fmt) + ("" if math.isnan(sd) else " +- " + format(sd, fmt))


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
