"""The figures of ``python -m analysis.pareto``: each (model, mode)'s points and Pareto fronts
(:func:`plot_fronts`, in :func:`styles`), the per-layer fractions of one setting per label
(:func:`layer_choice`, :func:`plot_layers`) and the ``--overlay`` of chosen series of a model
on shared axes (:func:`plot_overlay`). Each figure is returned, not written.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from analysis.scale.fronts import pareto_front
from analysis.scale.pareto_rows import SETTINGS
from analysis.scale.plots import fraction_axis

#: Marker and line style of a method's 1st, 2nd, ... label (its colour is the method's own).
STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("v", "-."), ("D", "--")]


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
