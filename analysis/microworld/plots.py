"""Figures of ``python -m analysis.report``: each method's final mean loss per instance,
normalized as (final - J(z*)) / (E_0.5[J] - J(z*)) (`tab:app_results_summ`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from analysis.microworld.units import EXPERIMENTS

BENCH_NAMES = {"exponential": "ExponentialTabularLoss", "nnloss": "NNLoss"}


def plot_final_losses(rows: list[dict], bench: str, d: int) -> Any:
    """One panel per experiment: per instance and method the normalized final loss with
    1 s.e. bars (rows of ``analysis.report.normalized_rows``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exps = [e for e in EXPERIMENTS if any(r["experiment"] == e and r["benchmark"] == bench
                                          for r in rows)]
    fig, axes = plt.subplots(1, len(exps), figsize=(5.6 * len(exps), 4.4), squeeze=False)
    for ax, exp in zip(axes[0], exps):
        mine = [r for r in rows if r["experiment"] == exp and r["benchmark"] == bench]
        methods = list(dict.fromkeys(r["method"] for r in mine))
        insts = sorted({r["instance"] for r in mine})
        width = 0.8 / max(len(methods), 1)
        for k, m in enumerate(methods):
            pts = sorted((r["instance"], r["normalized"], r["normalized_stderr"])
                         for r in mine if r["method"] == m)
            x = np.array([p[0] for p in pts]) - 0.4 + width * (k + 0.5)
            ax.errorbar(x, [p[1] for p in pts], yerr=[p[2] for p in pts],
                        fmt="osD^v<>"[k // 10 % 7], ms=3.5, lw=0.8, label=m, color=f"C{k % 10}")
        ax.set_xticks(insts)
        ax.set_xlabel("instance")
        ax.set_ylabel("normalized final loss")
        ax.set_title(f"{exp}", fontsize=10)
        ax.axhline(0, color="k", lw=0.6, ls=":")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    name = BENCH_NAMES[bench]
    fig.suptitle(f"{name}, d={d}: final mean loss per instance, normalized (0 = z*, 1 = start; "
                 "bars: 1 s.e.)", fontsize=11)
    fig.tight_layout()
    return fig
