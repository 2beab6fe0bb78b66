"""The paper's d=10 variance figure (`fig:microworld_variance`, `sec:microworld_compare_estimators`)
exactly, beside the Monte Carlo estimate the paper drew it from (`sec:app_true_var`: 10,000
estimator draws per logged step), on the same trajectory.

Left panel: the exact variances (closed form, `pbexact.closed_form`) as lines and the MC estimates
as dots; right panel: the MC estimate's relative error, MC / exact - 1, i.e. the noise the paper's
figure carried.

    python -m analysis.variance_compare --d 10 --n 10

The settings of each result are recorded beside it (``STEM_settings.json``); results of other
settings in --out are refused before anything is written, never overwritten.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysis.cli import (
    check_settings,
    output_folders,
    run,
    save_figure,
    settings_path,
    write_csv,
    write_json,
)
from analysis.exact.variance import (
    check_estimators,
    check_log_memory,
    check_method,
    table_digest,
    variance_trajectory,
)
from pbexact.cli import ArgumentParser, nonneg_int, positive_float, positive_int, step_count
from pbexact.closed_form import MAX_CLOSED_FORM_D
from pbexact.errors import check_d
from pbexact.estimators import ESTIMATORS, get_estimator
from pbexact.instances import BENCHMARKS, TABLES, benchmark_table


def compare_rows(
    exact: list[dict[str, float]], mc: list[dict[str, float]]
) -> list[dict[str, float]]:
    """Rows ``step, var_<estimator> (exact), mc_<estimator>, relerr_<estimator>``, for the
    estimators defined at this n (the exact rows' non-blank columns)."""
    rows = []
    names = [k for k in ESTIMATORS if exact[0][f"var_{k}"] is not None]
    for e, m in zip(exact, mc):
        row = {"step": e["step"]}
        for k in names:
            row[f"var_{k}"] = e[f"var_{k}"]
            row[f"mc_{k}"] = m[f"var_{k}"]
            row[f"relerr_{k}"] = m[f"var_{k}"] / e[f"var_{k}"] - 1 if e[f"var_{k}"] > 0 else np.nan
        rows.append(row)
    return rows


def plot_compare(rows: list[dict[str, float]], title: str, draws: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([row["step"] for row in rows])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.0))
    for i, k in enumerate(ESTIMATORS):
        if f"var_{k}" not in rows[0]:
            continue
        color = f"C{i}"
        label = get_estimator(k).label
        exact = np.array([row[f"var_{k}"] for row in rows])
        mc = np.array([row[f"mc_{k}"] for row in rows])
        ax.plot(steps, np.where(exact > 0, exact, np.nan), color=color, label=f"{label} exact")
        ax.plot(steps, np.where(mc > 0, mc, np.nan), ".", color=color, ms=3,
                label=f"{label} MC")
        ax2.plot(steps, 100 * np.array([row[f"relerr_{k}"] for row in rows]), ".-", color=color,
                 ms=3, lw=0.6, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("variance (sum over logits)")
    ax.legend(fontsize=7, ncol=2, loc="best")
    # mean(g^2) - grad^2 can come out <= 0 when the variance is far below grad^2 (beta* late on)
    ax.text(0.01, 0.01, "MC estimates <= 0 are not drawn (log axis); they show as -100% right",
            transform=ax.transAxes, fontsize=7, va="bottom")
    ax.set_title(title)
    ax2.axhline(0, color="k", lw=0.6)
    ax2.set_xlabel("step")
    ax2.set_ylabel(f"MC ({draws:,} draws) / exact - 1  (%)")
    ax2.legend(fontsize=7, loc="best")
    ax2.set_title("noise of the Monte Carlo estimate")
    fig.tight_layout()
    return fig


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m analysis.variance_compare",
        description="Exact (closed-form) estimator variances along the true-gradient trajectory "
        "beside the paper's Monte Carlo estimate (fig:microworld_variance).",
    )
    p.add_argument("--d", type=positive_int, default=10, help="number of bits (default 10)")
    p.add_argument("--n", type=positive_int, default=10, help="samples per estimate (default 10)")
    p.add_argument("--benchmark", choices=(*TABLES, "all"), default="all",
                   help="exponential, nnloss, all (both), or random (J(z) iid standard normal "
                   "from --seed)")
    p.add_argument("--steps", type=step_count(0), default=10_000,
                   help="SGD steps (default 10,000)")
    p.add_argument("--log-every", type=positive_int, default=100,
                   help="steps between logged points")
    p.add_argument("--lr", type=positive_float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--draws", type=positive_int, default=10_000, help="MC estimator draws per step")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help="seed of the benchmark instance and of MC")
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder")
    p.add_argument("--figures", type=Path, default=None,
                   help="also copy figures and their CSVs here (default: only --out)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    d = check_d(args.d, limit=MAX_CLOSED_FORM_D)
    check_estimators(args.n)
    check_method("closed", d, args.n)
    check_method("mc", d, args.n, args.draws)
    check_log_memory(args.steps, args.log_every, d)
    names = BENCHMARKS if args.benchmark == "all" else (args.benchmark,)
    tables = {bench: benchmark_table(bench, d, args.seed) for bench in names}
    folders = output_folders(args.out, args.figures)
    stems = {bench: f"{bench}_d{d}_n{args.n}_variance_exact_vs_mc" for bench in names}
    settings = {bench: {"seed": args.seed, "d": d, "n": args.n, "steps": args.steps,
                        "log_every": args.log_every, "lr": args.lr, "draws": args.draws,
                        "table": table_digest(J)} for bench, J in tables.items()}
    for bench in names:  # refused before anything is written
        check_settings(args.out / stems[bench], settings[bench])
    for bench, J in tables.items():
        common = dict(steps=args.steps, log_every=args.log_every, lr=args.lr, seed=args.seed)
        exact = variance_trajectory(J, args.n, method="closed", desc=f"{bench} exact", **common)
        mc = variance_trajectory(J, args.n, method="mc", draws=args.draws, desc=f"{bench} MC",
                                 **common)
        rows = compare_rows(exact, mc)
        stem = stems[bench]
        write_json(settings_path(args.out / stem), settings[bench])  # before what it labels
        for folder in folders:
            write_csv(folder / f"{stem}.csv", list(rows[0]), [list(r.values()) for r in rows])
        fig = plot_compare(rows, f"{bench}, d={d}, n={args.n}: exact vs MC", args.draws)
        save_figure(fig, [folder / f"{stem}.png" for folder in folders])
        print(f"{bench}: |MC / exact - 1| over {len(rows)} logged steps (median, max):")
        for k in (k for k in ESTIMATORS if f"relerr_{k}" in rows[0]):
            err = np.abs([row[f"relerr_{k}"] for row in rows])
            print(f"  {k:9s} {100 * np.nanmedian(err):6.2f}%  {100 * np.nanmax(err):6.2f}%")
        print(f"  wrote {args.out / (stem + '.csv')} and {args.out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
