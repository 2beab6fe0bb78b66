"""Exact estimator variances along the true-gradient trajectory
(`sec:microworld_compare_estimators`, `fig:microworld_variance`).

From theta = 0.5 (sigmoid logits r = 0), follow the exact gradient of E[J] with SGD; at every
logged step compute the variance of every estimator of the registry
(`pbexact.estimators.REGISTRY`: REINFORCE, LOORF, ARMS, beta*, DisARM; summed over the d
logits; DisARM's column is blank for odd n), the entropy of p_theta and the expected loss.

    python -m analysis.variance --d 4 --n 4
    python -m analysis.variance --d 10 --n 10      # exact, by the closed form
    python -m analysis.variance --benchmark random --d 6 --seed 3   # a random instance of one's own

--method auto (the default) enumerates multisets where they are few and uses the closed form
(`pbexact.closed_form`) otherwise; both are exact. Monte Carlo runs only when asked (--method mc;
its files end in ``_mc``). The settings of each result are recorded beside it
(``STEM_settings.json``); results of other settings in --out (another seed, table, step count...)
are refused before anything is written, never overwritten. The trajectory and its guards are
:mod:`analysis.exact.variance`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.cli import (
    check_settings,
    output_folders,
    read_table,
    run,
    save_figure,
    settings_path,
    write_csv,
    write_json,
)
from analysis.exact.variance import (
    AUTO_ENUMERATION_LIMIT,
    METHODS,
    check_estimators,
    check_log_memory,
    check_method,
    resolve_method,
    table_digest,
    table_name,
    variance_trajectory,
)
from pbexact.cli import ArgumentParser, nonneg_int, positive_float, positive_int, step_count
from pbexact.closed_form import MAX_CLOSED_FORM_D
from pbexact.errors import PBInputError, check_d
from pbexact.estimators import ESTIMATORS, estimators_for, get_estimator
from pbexact.instances import BENCHMARKS, TABLES, benchmark_table
from pbexact.io import csv_text

#: Line styles and markers of the estimators' curves, in registry order, so that curves lying on
#: top of each other stay apart in print and for colour-blind readers (not only colour).
LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def plot_variances(rows: list[dict[str, float]], title: str, logx: bool = False) -> Any:
    """Each estimator's variance (sum over the d logits) against the step, log y, one line
    style, marker and colour per estimator, with the entropy of p_theta on a second axis;
    ``logx``: a log step axis (step 0 drawn at step 1/2), where the early steps differ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([row["step"] for row in rows], dtype=float)
    if logx:
        steps = np.where(steps > 0, steps, 0.5)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for k, name in enumerate(ESTIMATORS):
        if rows[0][f"var_{name}"] is None:
            continue  # not defined for this n
        v = np.array([row[f"var_{name}"] for row in rows])
        v = np.where(v > 0, v, np.nan)  # exact zeros cannot sit on a log axis
        ax.plot(steps, v, label=get_estimator(name).label, color=f"C{k % 10}",
                ls=LINE_STYLES[k % len(LINE_STYLES)], marker=MARKERS[k % len(MARKERS)],
                markevery=(0.015 * k, 0.08) if np.isfinite(v).sum() > 1 else None,
                ms=4, lw=1.2, mfc="none")  # (matplotlib cannot space markers on 0-1 points)
    ax.set_yscale("log")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel("step (log; step 0 at 1/2)" if logx else "step")
    ax.set_ylabel("variance (sum over logits)")
    ax2 = ax.twinx()
    ax2.plot(steps, [row["entropy"] for row in rows], "k:", label="entropy")
    ax2.set_ylabel("entropy of $p_\\theta$ (nats)")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="best")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def result_stem(name: str, d: int, n: int, method: str) -> str:
    """``B_d{d}_n{n}_variance``, with ``_mc`` for the Monte Carlo estimate (so that exact and
    estimated variances of one instance sit side by side)."""
    return f"{name}_d{d}_n{n}_variance" + ("_mc" if method == "mc" else "")


def check_table_file(path: Path, J: np.ndarray) -> None:
    """Refuse a ``B_d{d}_table.csv`` in --out that holds another table than ``J`` (another
    instance seed) before anything is written."""
    if path.exists() and (not path.is_file() or path.read_bytes() != csv_text(
            ["h", "J"], enumerate(J)).encode()):
        raise PBInputError(f"{path} holds another J table (another instance or --seed); choose "
                           "another --out or delete it")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m analysis.variance",
        description="Exact estimator variances along the true-gradient trajectory "
        "(fig:microworld_variance): sigmoid, SGD from theta = 0.5.",
    )
    p.add_argument("--d", type=positive_int, default=None, help="number of bits (default 4)")
    p.add_argument("--n", type=positive_int, default=4, help="samples per estimate (default 4)")
    p.add_argument("--benchmark", choices=(*TABLES, "all"), default="all",
                   help="exponential, nnloss, all (both), or random: one's own random instance, "
                   "J(z) iid standard normal drawn from --seed")
    p.add_argument(
        "--table",
        type=Path,
        default=None,
        help="a J table CSV with exactly two columns h,J (as written to DIR/B_d{d}_table.csv) "
        "to study instead of the benchmarks; row h is the loss of the vertex z with z_i = bit "
        "i-1 of h (h = sum_i 2^(i-1) z_i: h=1 is z_1=1, the others 0), every h in 0..2^d-1 "
        "once; d is read from its length; results are named by the file (rand_d6.csv gives "
        "rand_d6_n4_variance.csv)",
    )
    p.add_argument("--steps", type=step_count(0), default=10_000,
                   help="SGD steps (default 10,000)")
    p.add_argument("--log-every", type=positive_int, default=100,
                   help="steps between logged points")
    p.add_argument("--lr", type=positive_float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help="seed of the benchmark instance and of MC")
    p.add_argument(
        "--method",
        choices=METHODS,
        default="auto",
        help="enumerate: exact, over all n-multisets; closed: exact, closed form (any n, "
        f"d <= {MAX_CLOSED_FORM_D}); auto (default): enumerate up to "
        f"{AUTO_ENUMERATION_LIMIT:,} multisets, else closed; mc: the paper's estimate from "
        "--draws estimator draws per logged step",
    )
    p.add_argument("--draws", type=positive_int, default=10_000,
                   help="estimator draws per step for mc")
    p.add_argument("--out", type=Path, default=Path("results"),
                   help="output folder; the settings of each result are recorded beside it "
                   "(STEM_settings.json) and results of other settings are never overwritten")
    p.add_argument("--logx", action="store_true",
                   help="log step axis in the figure (the early steps, where the estimators "
                   "differ most, spread out)")
    p.add_argument("--figures", type=Path, default=None,
                   help="also copy figures and their CSVs here (the commands in docs/exact.md pass "
                   "--figures figures to regenerate the committed ones; default: only --out)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tables: dict[str, np.ndarray] = {}
    if args.table is not None:
        J = read_table(args.table)
        table_d = len(J).bit_length() - 1
        if args.d is not None and args.d != table_d:
            raise PBInputError(f"--d {args.d} does not match the table's 2^{table_d} entries; "
                               "leave --d out (d is read from the table)")
        args.d = table_d
        tables[table_name(args.table, table_d)] = J
    d = check_d(4 if args.d is None else args.d, limit=MAX_CLOSED_FORM_D)
    check_estimators(args.n)
    check_method(args.method, d, args.n, args.draws)
    check_log_memory(args.steps, args.log_every, d)
    method = resolve_method(args.method, d, args.n)
    if not tables:  # every table is built before anything is written
        names = BENCHMARKS if args.benchmark == "all" else (args.benchmark,)
        tables = {bench: benchmark_table(bench, d, args.seed) for bench in names}
    folders = output_folders(args.out, args.figures)
    stems = {bench: result_stem(bench, d, args.n, method) for bench in tables}
    # enumerate and closed give the same numbers (both exact): one name, one setting
    settings = {bench: {"seed": args.seed, "d": d, "n": args.n, "steps": args.steps,
                        "log_every": args.log_every, "lr": args.lr,
                        "method": "mc" if method == "mc" else "exact",
                        "draws": args.draws if method == "mc" else None,
                        "table": table_digest(J)}
                for bench, J in tables.items()}
    for bench, J in tables.items():  # refused before anything is written
        check_settings(args.out / stems[bench], settings[bench])
        if args.table is None:
            check_table_file(args.out / f"{bench}_d{d}_table.csv", J)
    if args.table is None:
        for bench, J in tables.items():
            write_csv(args.out / f"{bench}_d{d}_table.csv", ["h", "J"], enumerate(J))
    for bench, J in tables.items():
        rows = variance_trajectory(
            J, args.n, args.steps, args.log_every, args.lr, args.method, args.draws, args.seed,
            desc=f"{bench} d={d} n={args.n}",
        )
        stem = stems[bench]
        write_json(settings_path(args.out / stem), settings[bench])  # before what it labels
        for folder in folders:  # the figure's data sits next to it
            write_csv(folder / f"{stem}.csv", list(rows[0]), [list(r.values()) for r in rows])
        fig = plot_variances(rows, f"{bench}, d={d}, n={args.n} ({method})", args.logx)
        save_figure(fig, [folder / f"{stem}.png" for folder in folders])
        last = rows[-1]
        print(
            f"{bench}: final E[J]={last['loss']:.4f}, entropy={last['entropy']:.3g}; variances at "
            f"step 0: "
            + ", ".join(f"{k}={rows[0][f'var_{k}']:.4g}" for k in estimators_for(args.n))
        )
        print(f"  wrote {args.out / (stem + '.csv')} and {args.out / (stem + '.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
