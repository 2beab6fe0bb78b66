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
are refused before anything is written, never overwritten.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

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
from pbexact.cli import ArgumentParser, nonneg_int, positive_float, positive_int, step_count
from pbexact.closed_form import MAX_CLOSED_FORM_D, check_closed_form_size, closed_form_moments
from pbexact.errors import (
    ENUMERATION_MEMORY_LIMIT,
    PBInputError,
    check_d,
    check_learning_rate,
    format_bytes,
    multiset_count,
)
from pbexact.estimators import ESTIMATORS, check_estimator, estimators_for, get_estimator
from pbexact.instances import BENCHMARKS, TABLES, benchmark_table
from pbexact.io import csv_text
from pbexact.parametrizations import Sigmoid
from pbexact.polynomial import entropy, expected_loss, true_gradient
from pbexact.variance import EstimatorMoments, exact_moments, mc_moments
from pbexact.vertices import check_enumeration

METHODS = ("auto", "enumerate", "closed", "mc")
#: auto enumerates up to this many multisets (the paper's d=4, n=4 has 3,876), else closed form.
AUTO_ENUMERATION_LIMIT = 10_000
#: Bytes per (draw, sample, bit) at the peak of one ``mc_moments`` call (measured with
#: tracemalloc: 41-42 at d = 6 and 10, n = 4 and 10, 20,000 draws; rounded up).
MC_BYTES_PER_ENTRY = 48


def moments_at(
    J: np.ndarray, r: np.ndarray, n: int, method: str, rng: np.random.Generator, draws: int
) -> dict[str, EstimatorMoments]:
    """Every estimator's moments at sigmoid logits r by the chosen method."""
    if method == "auto":
        method = resolve_method(method, int(np.log2(len(J))), n)
    if method == "enumerate":
        return exact_moments(J, r, n, "sigmoid", estimators_for(n))
    if method == "closed":
        return closed_form_moments(J, r, n, "sigmoid", estimators_for(n))
    if method == "mc":
        return mc_moments(J, r, n, draws, rng, "sigmoid", estimators_for(n))
    raise PBInputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def resolve_method(method: str, d: int, n: int) -> str:
    """The method ``auto`` stands for at this size; any other method unchanged."""
    if method != "auto":
        return method
    return "enumerate" if multiset_count(2**d, n) <= AUTO_ENUMERATION_LIMIT else "closed"


def mc_bytes(d: int, n: int, draws: int) -> int:
    """Peak memory of one logged step of ``--method mc``: the draws x n x d samples, their
    scores and the estimates, :data:`MC_BYTES_PER_ENTRY` bytes per (draw, sample, bit)."""
    return draws * n * d * MC_BYTES_PER_ENTRY


def check_method(method: str, d: int, n: int, draws: int = 1) -> None:
    """Fail before any work if the method cannot run at this size (``draws``: for mc)."""
    method = resolve_method(method, d, n)
    if method == "enumerate":
        check_enumeration(2**d, n)
    elif method == "closed":
        check_d(d, limit=MAX_CLOSED_FORM_D)
        check_closed_form_size(d, n)
    elif method == "mc":
        need = mc_bytes(d, n, draws)
        if need > ENUMERATION_MEMORY_LIMIT:
            most = ENUMERATION_MEMORY_LIMIT // mc_bytes(d, n, 1)
            raise PBInputError(
                f"--method mc with --draws {draws:,} at d={d}, n={n} needs about "
                f"{format_bytes(need)} per logged step, over the limit of "
                f"{format_bytes(ENUMERATION_MEMORY_LIMIT)}; use --draws {most:,} or fewer, or "
                "--method closed (exact)")
    elif method not in METHODS:
        raise PBInputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def check_estimators(n: int) -> None:
    """Every estimator must take n, except those that need an even n (their column is blank)."""
    for name in ESTIMATORS:
        if not get_estimator(name).even:
            check_estimator(name, n)


def variance_trajectory(
    J: np.ndarray,
    n: int,
    steps: int = 10_000,
    log_every: int = 100,
    lr: float = 0.1,
    method: str = "auto",
    draws: int = 10_000,
    seed: int = 0,
    desc: str = "",
) -> list[dict[str, float]]:
    """Rows ``step, loss, entropy, var_<estimator>..., theta_1..theta_d`` along the trajectory;
    one var column per registered estimator, None (a blank CSV cell) where it is not defined for
    this n (DisARM at odd n)."""
    d = int(np.log2(len(J)))
    lr = check_learning_rate(lr)
    check_estimators(n)
    check_method(method, d, n, draws)
    method = resolve_method(method, d, n)
    param = Sigmoid()
    rng = np.random.default_rng(seed)
    r = np.zeros(d)
    rows = []
    # step 0's moments before the progress bar starts: the first call compiles the Numba
    # kernels (seconds), which would otherwise make the bar's rate and ETA absurd
    first = moments_at(J, r, n, method, rng, draws)
    for step in tqdm(range(steps + 1), desc=desc, leave=False, mininterval=0.5, disable=not desc):
        theta = param.theta(r)
        if step % log_every == 0 or step == steps:
            moments = first if step == 0 else moments_at(J, r, n, method, rng, draws)
            row = {
                "step": step,
                "loss": float(expected_loss(J, theta)),
                "entropy": float(entropy(theta)),
            }
            row.update({f"var_{k}": moments[k].total_variance if k in moments else None
                        for k in ESTIMATORS})
            row.update({f"theta_{i + 1}": float(t) for i, t in enumerate(theta)})
            rows.append(row)
        r = r - lr * param.chain(true_gradient(J, theta), r)
        if not np.all(np.isfinite(r)):
            raise PBInputError(
                f"the logits became NaN or inf at step {step + 1}: the learning rate {lr:g} is "
                f"too large for the table's values (max |J| = {np.abs(J).max():.3g}); lower --lr "
                "or rescale the table"
            )
    return rows


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


#: Peak bytes per logged row and bit (a dict of d + 8 Python floats, its CSV line, the figure's
#: arrays), a bound: the rows of every table are kept until its CSV is written.
ROW_BYTES_PER_COLUMN = 128


def check_log_memory(steps: int, log_every: int, d: int,
                     limit: int = ENUMERATION_MEMORY_LIMIT) -> None:
    """Refuse, before any work, a trajectory whose logged rows pass ``limit`` bytes, naming the
    --log-every that fits."""
    rows = steps // log_every + 2
    need = rows * (d + 8) * ROW_BYTES_PER_COLUMN
    if need > limit:
        every = -(-steps * (d + 8) * ROW_BYTES_PER_COLUMN // limit)
        raise PBInputError(
            f"--steps {steps:,} logged every {log_every:,} step(s) keeps {rows:,} rows of "
            f"{d + 8} values, about {format_bytes(need)}, over the limit of "
            f"{format_bytes(limit)}; use --log-every {every:,} or more, or fewer --steps")


def table_name(path: Path, d: int) -> str:
    """The name a ``--table`` file gives its results: its stem without a trailing ``_d{d}`` or
    ``_d{d}_table`` (``rand_d6.csv`` and ``rand_d6_table.csv`` give ``rand``, whose results are
    ``rand_d6_n4_variance.*``: d is not repeated; ``my_table.csv`` gives ``my_table``)."""
    for suffix in (f"_d{d}_table", f"_d{d}"):
        if path.stem.endswith(suffix) and path.stem != suffix:
            return path.stem.removesuffix(suffix)
    return path.stem


def result_stem(name: str, d: int, n: int, method: str) -> str:
    """``B_d{d}_n{n}_variance``, with ``_mc`` for the Monte Carlo estimate (so that exact and
    estimated variances of one instance sit side by side)."""
    return f"{name}_d{d}_n{n}_variance" + ("_mc" if method == "mc" else "")


def table_digest(J: np.ndarray) -> str:
    """The first 16 hex digits of the SHA-256 of a J table's float64 bytes (recorded with the
    results it gave: another table, same settings otherwise, is refused)."""
    data = np.ascontiguousarray(J, dtype=np.float64).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


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
