"""One estimator's exact variance against others along the true-gradient trajectory of
`fig:microworld_variance` (`analysis.variance`: sigmoid, SGD from theta = 0.5, lr 0.1), for
several d and n; exact by the closed form (`pbexact.closed_form`).

    python -m analysis.variance_table --d 4 10 --n 2 4 10 --estimator disarm --against loorf arms
    python -m analysis.variance_table --table mine.csv --n 2 4    # one's own J table(s)
    python -m analysis.variance_table --benchmark random --d 6   # a random instance (--seed)

For each benchmark, d and n it prints and writes (CSV in --out) the variance ratios
estimator / other at theta = 0.5 (step 0) and their median over the logged steps, and the
fraction of logged steps where the estimator has the lower variance. Written to test the claim
that DisARM underperforms LOORF for larger n (`sec:microworld_compare_estimators`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysis.cli import check_out_dir, read_table, run, write_csv
from analysis.exact.variance import check_log_memory, table_name, variance_trajectory
from pbexact.cli import ArgumentParser, nonneg_int, positive_int, step_count
from pbexact.errors import PBInputError, check_d
from pbexact.estimators import ESTIMATORS, check_estimator
from pbexact.instances import BENCHMARKS, TABLES, benchmark_table


def compare(rows: list[dict], estimator: str, other: str) -> dict[str, float]:
    """Ratios var_estimator / var_other at step 0, their median and largest value over the logged
    steps, and the fraction of steps where the estimator's variance is lower by more than a
    relative 1e-9 (equal estimators, e.g. DisARM and ARMS at n = 2, tie to round-off)."""
    a = np.array([row[f"var_{estimator}"] for row in rows], dtype=float)
    b = np.array([row[f"var_{other}"] for row in rows], dtype=float)
    keep = b > 0
    ratio = a[keep] / b[keep]
    return {
        "ratio_step0": float(a[0] / b[0]) if b[0] > 0 else float("nan"),
        "ratio_median": float(np.median(ratio)) if ratio.size else float("nan"),
        "ratio_max": float(ratio.max()) if ratio.size else float("nan"),
        "lower_fraction": float(np.mean(a < b * (1 - 1e-9))),
    }


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m analysis.variance_table",
        description="Exact variance ratios of one estimator against others along the "
        "true-gradient trajectory (closed form).",
    )
    p.add_argument("--d", type=positive_int, nargs="+", default=None,
                   help="numbers of bits (default 4 10)")
    p.add_argument("--n", type=positive_int, nargs="+", default=[2, 4, 10],
                   help="samples per estimate")
    p.add_argument("--estimator", choices=ESTIMATORS, default="disarm",
                   help="the estimator studied")
    p.add_argument("--against", nargs="+", choices=ESTIMATORS, default=["loorf", "arms"],
                   help="estimators compared")
    p.add_argument("--benchmark", choices=(*TABLES, "all"), default="all",
                   help="exponential, nnloss, all (both), or random (J(z) iid standard normal "
                   "from --seed)")
    p.add_argument("--table", type=Path, nargs="+", default=None,
                   help="J table CSVs (columns h,J, as analysis.variance --table reads them) "
                   "studied instead of the benchmarks; d is read from each")
    p.add_argument("--steps", type=step_count(0), default=10_000,
                   help="SGD steps (default 10,000)")
    p.add_argument("--log-every", type=positive_int, default=100,
                   help="steps between logged points")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the benchmark instances")
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder")
    p.add_argument("--progress", action="store_true", help="show progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.table is not None and args.d is not None:
        raise PBInputError("--d and --table both given; leave --d out (d is read from each "
                           "table)")
    given: dict[tuple[str, int], np.ndarray] = {}
    for path in args.table or ():
        J = read_table(path)
        d = len(J).bit_length() - 1
        given[(table_name(path, d), d)] = J
    ds = sorted({d for _, d in given}) if given else (args.d or [4, 10])
    for d in ds:
        check_d(d, limit=20)
        check_log_memory(args.steps, args.log_every, d)
    for name in (args.estimator, *args.against):
        for n in args.n:
            check_estimator(name, n)
    check_out_dir(args.out, "--out")
    names = BENCHMARKS if args.benchmark == "all" else (args.benchmark,)
    tables = given or {(bench, d): benchmark_table(bench, d, args.seed)
                       for bench in names for d in ds}
    out = []
    print(f"{'benchmark':12s} {'d':>3s} {'n':>3s} {'vs':8s} {'ratio@0.5':>10s} "
          f"{'median ratio':>12s} {'max ratio':>10s} {'lower on':>9s}")
    for (bench, d), J in tables.items():
        for n in args.n:
            rows = variance_trajectory(J, n, args.steps, args.log_every, method="closed",
                                       desc=f"{bench} d={d} n={n}" if args.progress else "")
            for other in args.against:
                c = compare(rows, args.estimator, other)
                out.append([bench, d, n, args.estimator, other, c["ratio_step0"],
                            c["ratio_median"], c["ratio_max"], c["lower_fraction"]])
                print(f"{bench:12s} {d:3d} {n:3d} {other:8s} {c['ratio_step0']:10.3f} "
                      f"{c['ratio_median']:12.3f} {c['ratio_max']:10.3f} "
                      f"{100 * c['lower_fraction']:8.0f}%")
    path = write_csv(args.out / f"variance_table_{args.estimator}.csv",
                     ["benchmark", "d", "n", "estimator", "other", "ratio_step0",
                      "ratio_median", "ratio_max", "lower_fraction"], out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
