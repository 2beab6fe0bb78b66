"""The scale report's points and figures (``python -m analysis.scale_report``): each pruning
setting's seed means and whether it is on its group's front (:func:`write_points`,
``points_<experiment>.csv``), the Pareto fronts (:func:`plot_pareto`), the supermask settings
run at several n (:func:`plot_hyper`) and the remaining weights per layer over training of
matched joint runs (:func:`chosen_runs`, :func:`plot_layers`); and the log axis of remaining
fractions they share with ``analysis.pareto``'s figures (:func:`fraction_axis`, drawn by
:mod:`analysis.scale.pareto_plots` too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from analysis.scale.claims import joint_fronts
from analysis.scale.fronts import front
from analysis.scale.hyper import COLUMNS as HYPER_COLUMNS
from analysis.scale.hyper import carry_over, carry_over_text
from analysis.scale.outputs import Outputs
from analysis.scale.run_files import budget_text, lam_text, read_columns
from analysis.scale.runs import (
    ACC_FLOOR,
    STALLED_ACC,
    RunRecord,
    allocation_shares,
    by_budget,
    finished,
    group_label,
    legend_label,
    points,
    stalled,
)
from analysis.scale.tables import fmt


def fraction_axis(ax: Any, values: Iterable[float], axis: str = "x") -> None:
    """A log axis of remaining fractions labelled in percent whose tick labels do not overlap:
    major ticks at 1-9 x 10^k over at most half a decade of data, at 1, 2, 5 x 10^k over at most
    two decades, at powers of ten beyond (thinned to at most 7); minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    vals = [v for v in values if v > 0 and math.isfinite(v)]
    span = math.log10(max(vals) / min(vals)) if vals else 0.0
    subs = tuple(range(1, 10)) if span <= 0.5 else (1, 2, 5) if span <= 2 else (1,)
    a = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    a.set_major_locator(LogLocator(base=10, subs=subs, numticks=7 if subs == (1,) else 12))
    a.set_major_formatter(FuncFormatter(lambda x, _: f"{100 * x:.3g}%"))
    a.set_minor_formatter(NullFormatter())
    ax.tick_params(axis=axis, labelsize=8)


def write_points(files: Outputs, records: Sequence[RunRecord], experiment: str) -> list[dict]:
    """points_<experiment>.csv; returns the rows (for the Pareto figure)."""
    import numpy as np

    every = [r for r in records if r.experiment == experiment]
    rs = finished(every)
    diverged: dict[str, int] = {}
    for r in every:
        diverged[r.setting] = diverged.get(r.setting, 0) + (r.diverged is not None)
    rows = []
    if experiment == "regression":
        groups: dict[str, list[RunRecord]] = {}
        for r in rs:
            groups.setdefault(r.setting, []).append(r)
        for key in sorted(groups):
            g = groups[key]
            f = np.array([r.final_loss for r in g])
            s = g[0].settings
            rows.append([g[0].method, s.get("n"), s.get("param"), s.get("lr"),
                         s.get("optimizer"), s.get("epochs"), len(g), fmt(float(f.mean())),
                         fmt(float(f.std(ddof=1) / math.sqrt(len(f))) if len(f) > 1 else "")])
        files.csv("points_regression.csv", ["method", "n", "param", "lr", "optimizer",
                                            "epochs", "seeds", "final_val_loss", "stderr"], rows)
        return []
    budgets = by_budget(rs)
    by_label: dict[str, list[RunRecord]] = {}
    legends: dict[str, str] = {}
    for r in every:
        lab = group_label(r)
        if len(budgets) > 1:  # runs of several budgets: a curve per budget
            lab += f" ({budget_text(r.budget, budgets)})"
        by_label.setdefault(lab, []).append(r)
        legends.setdefault(lab, legend_label(r) + lab[len(group_label(r)):])
    table, plotted = [], []
    for lab in sorted(by_label):
        pts = points(by_label[lab])
        on = {id(p) for p in front(pts)}
        for p in sorted(pts, key=lambda p: (p.remaining, p.accuracy)):
            s = p.settings
            dist = sum(abs(p.shares[k] - p.dense[k]) for k in p.dense) / 2 if p.dense else 0.0
            key = p.runs[0].setting
            table.append([lab, p.method, lam_text(s), s.get("mask_opt"), s.get("mask_lr"),
                          s.get("target"), s.get("n"), s.get("param"), s.get("epochs"),
                          p.seeds, diverged.get(key, 0), sum(stalled(r) for r in p.runs),
                          fmt(p.remaining), fmt(p.rem_sd) if p.seeds > 1 else "",
                          fmt(p.accuracy), fmt(p.acc_sd) if p.seeds > 1 else "",
                          int(id(p) in on), fmt(dist)])
            plotted.append({"label": lab, "legend": legends[lab], "remaining": p.remaining,
                            "accuracy": p.accuracy, "front": id(p) in on,
                            "acc_sd": p.acc_sd if p.seeds > 1 else 0.0,
                            "rem_sd": p.rem_sd if p.seeds > 1 else 0.0})
    files.csv(f"points_{experiment}.csv",
              ["group", "method", "lam", "mask_opt", "mask_lr", "target", "n", "param", "epochs",
               "seeds", "diverged", "stalled", "remaining", "remaining_sd", "test_acc",
               "test_acc_sd", "on_front", "allocation_distance"], table)
    return plotted


def plot_pareto(files: Outputs, plotted: list[dict], experiment: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colors = plt.get_cmap("tab20").colors  # one color per group: more groups than tab10 has
    labels = sorted({p["label"] for p in plotted})
    for i, lab in enumerate(labels):
        g = [p for p in plotted if p["label"] == lab and p["remaining"] > 0]
        if not g:
            continue
        fr = sorted((p for p in g if p["front"]), key=lambda p: p["remaining"])
        line = ax.plot([p["remaining"] for p in fr], [p["accuracy"] for p in fr],
                       marker="os^D"[i // len(colors) % 4], ms=3, label=g[0]["legend"],
                       color=colors[(2 * i + i // 10) % len(colors)])[0]
        ax.scatter([p["remaining"] for p in g], [p["accuracy"] for p in g], s=8, alpha=0.3,
                   color=line.get_color())
        spread = [p for p in fr if p["acc_sd"] > 0 or p["rem_sd"] > 0]
        if spread:  # the seed spread of each front point: +-1 s.d. over its seeds
            ax.errorbar([p["remaining"] for p in spread], [p["accuracy"] for p in spread],
                        xerr=[p["rem_sd"] for p in spread], yerr=[p["acc_sd"] for p in spread],
                        fmt="none", lw=0.7, capsize=1.5, color=line.get_color(), alpha=0.8)
    ax.axhline(ACC_FLOOR, color="grey", lw=0.6, ls=":",
               label=f"accuracy floor {ACC_FLOOR:g} (a setting below it is on no front)")
    fraction_axis(ax, [p["remaining"] for p in plotted])
    ax.set_xlabel("weights remaining (fraction of the masked weights)")
    ax.set_ylabel("test accuracy (seed mean; bars: +-1 seed s.d.)")
    ax.set_title(f"{experiment}: Pareto fronts")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    files.figure(f"pareto_{experiment}.png", fig)
    plt.close(fig)


def plot_hyper(files: Outputs, rows: list[dict]) -> list[str]:
    """hyper_generalization.png / .csv (`fig:app_hyper_gen_scatter`,
    `fig:app_hyper_gen_parallel`): left, each (setting, n)'s seed means, the same setting's
    points linked across n, chance accuracy shaded; right, one line per (setting, n) across the
    hyperparameters, its remaining fraction and accuracy, coloured by remaining (red: sparse)
    and faded off its n's front. Returns :func:`analysis.scale.hyper.carry_over`'s lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files.csv("hyper_generalization.csv", list(HYPER_COLUMNS),
              [[r[k] for k in HYPER_COLUMNS] for r in rows])
    fig, (ax, par) = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = dict(zip(sorted({r["n"] for r in rows}), "os^Dv"))
    colors = plt.get_cmap("tab10").colors
    for i, key in enumerate(sorted({(r["method"], r["param"], r["key"]) for r in rows})):
        mine = sorted((r for r in rows if (r["method"], r["param"], r["key"]) == key),
                      key=lambda r: r["n"])
        c = colors[i % len(colors)]
        ax.plot([r["remaining"] for r in mine], [r["test_acc"] for r in mine], color=c, lw=0.8)
        for r in mine:
            ax.scatter(r["remaining"], r["test_acc"], marker=markers[r["n"]], color=c, s=22)
    for n, mk in markers.items():
        ax.scatter([], [], marker=mk, color="grey", label=f"n = {n}")
    ax.axhspan(0, STALLED_ACC, color="red", alpha=0.12, label="chance (failed runs)")
    fraction_axis(ax, [r["remaining"] for r in rows])
    ax.set_xlabel("weights remaining")
    ax.set_ylabel("test accuracy (seed mean)")
    ax.set_title("one setting at several n (linked)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    axes = ["log10 lam", "log10 mask lr", "log10 n", "log10 remaining", "test acc"]
    vals = [[math.log10(r["lam"]), math.log10(r["mask_lr"]), math.log10(r["n"]),
             math.log10(r["remaining"]), r["test_acc"]] for r in rows]
    lo = [min(v[i] for v in vals) for i in range(len(axes))]
    hi = [max(v[i] for v in vals) for i in range(len(axes))]
    scaled = [[(v[i] - lo[i]) / (hi[i] - lo[i]) if hi[i] > lo[i] else 0.5
               for i in range(len(axes))] for v in vals]
    cmap = plt.get_cmap("RdYlGn")
    for r, y in zip(rows, scaled):
        par.plot(range(len(axes)), y, color=cmap(y[3]), alpha=0.9 if r["on_front"] else 0.25,
                 lw=1.2 if r["on_front"] else 0.8)
    par.set_xticks(range(len(axes)), [f"{a}\n{lo[i]:.3g}..{hi[i]:.3g}"
                                      for i, a in enumerate(axes)], fontsize=7)
    par.set_yticks([0, 1], ["min", "max"])
    par.set_title("each (setting, n): colour = remaining (red sparse); faded off its n's front",
                  fontsize=8)
    files.figure("hyper_generalization.png", fig)
    plt.close(fig)
    return [carry_over_text(c) for c in carry_over(rows)]


def chosen_runs(loaded: Sequence[tuple[RunRecord, Path]]) -> list[tuple[str, RunRecord, Path]]:
    """One joint run each of MC, CP and GMP at matched sparsity, from the largest training
    budget: the sparsest MC front setting with accuracy >= ACC_FLOOR (else the median CP front
    setting) and the CP and GMP front settings nearest to it in log remaining; the lowest seed
    of each setting."""
    joint = [(r, f) for r, f in loaded if r.experiment == "joint" and r.diverged is None]
    if not joint:
        return []
    largest = list(by_budget(r for r, _ in joint))[-1]
    joint = [(r, f) for r, f in joint if r.budget == largest]
    fronts = joint_fronts([r for r, _ in joint])
    if fronts["MC"]:
        target = fronts["MC"][0].remaining
    elif fronts["CP"]:
        target = fronts["CP"][len(fronts["CP"]) // 2].remaining
    else:
        return []
    out = []
    for name in ("CP", "MC", "GMP"):
        if not fronts[name]:
            continue
        p = min(fronts[name], key=lambda p: abs(math.log(p.remaining / target)))
        r, f = min(((r, f) for r, f in joint if r.method == p.method
                    and r.settings == p.settings), key=lambda rf: rf[0].seed)
        out.append((name, r, f))
    return out


def plot_layers(files: Outputs, chosen: list[tuple[str, RunRecord, Path]]) -> None:
    """layers_over_training.png / .csv (`fig:joint_pruning_per_layer`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    fig, axes = plt.subplots(len(chosen), 2, figsize=(9, 2.6 * len(chosen)), squeeze=False)
    for (name, r, folder), (ax1, ax2) in zip(chosen, axes):
        hist = read_columns(folder / "metrics.csv")
        layers = list(r.layer_sizes)
        ep = hist["epoch"]
        frac = {k: hist[f"remaining_{k}"] for k in layers}
        shares = [allocation_shares({k: frac[k][i] for k in layers}, r.layer_sizes)
                  for i in range(len(ep))]
        kept = [i for i in range(len(ep)) if any(frac[k][i] > 0 for k in layers)]
        for k in layers:  # log axis: a layer with nothing left is not drawn at that epoch
            ax1.plot(ep, [x if x > 0 else math.nan for x in frac[k]], marker="o", ms=3, label=k)
        # shares only where some weight is left (CP's epoch 0: theta = 1/2 rounds to no weight)
        ax2.stackplot([ep[i] for i in kept], *[[shares[i][k] for i in kept] for k in layers],
                      labels=layers, alpha=0.8)
        for i, e in enumerate(ep):
            for k in layers:
                rows.append([name, folder.name, int(e), k, fmt(frac[k][i]), fmt(shares[i][k])])
        title = f"{name}: {legend_label(r)}, {r.remaining:.2%} left, acc {r.accuracy:.3f}"
        ax1.set_title(title, fontsize=8)
        fraction_axis(ax1, [x for k in layers for x in frac[k]], axis="y")
        ax1.set_ylabel("fraction left in layer", fontsize=7)
        ax2.set_ylabel("share of weights left", fontsize=7)
        ax2.set_ylim(0, 1)
        ax1.legend(fontsize=6)
        for ax in (ax1, ax2):
            ax.set_xlabel("epoch", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.tight_layout()
    files.figure("layers_over_training.png", fig)
    plt.close(fig)
    files.csv("layers_over_training.csv", ["method", "run", "epoch", "layer", "remaining",
                                           "share"], rows)
