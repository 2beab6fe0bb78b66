"""Benchmark of the closed-form variances (`pbexact.closed_form`), printed, never asserted.

1. Per theta at d=10, n=10, all four estimators (sigmoid): the closed form (best of 5) against
   the paper's Monte Carlo estimate with 10,000 estimator draws (`sec:app_true_var`, best of 3),
   same run, on both microworld benchmarks. Goal: at least 100x faster. Also printed: how far
   the MC estimate is from the exact value, in percent.
2. d=20, n=10, all four estimators at one theta (a 2^20 table). Goal: under 10 s. Checked
   against 10^5 Monte Carlo draws per estimator (z-scores printed).
3. Time against d (8..20, n=10) and against n (2..1000, d=10), with the fitted growth exponents:
   time ~ 2^(a d) and time ~ n^b.

    python -m benchmarks.bench_closed_form
"""

from __future__ import annotations

import numpy as np

from analysis.cli import run
from benchmarks.timing import best_time
from pbexact.cli import ArgumentParser
from pbexact.closed_form import closed_form_moments
from pbexact.instances import BENCHMARKS, benchmark_table
from pbexact.variance import mc_moments, sample_estimates

#: The paper's four estimators: every timing below does the same work as before DisARM joined
#: the registry; DisARM's own cost is printed on its own line.
ESTIMATORS = ("reinforce", "loorf", "arms", "betastar")



def compare_with_mc(thetas: int = 3, draws: int = 10_000) -> None:
    d, n = 10, 10
    print(f"1. d={d}, n={n}, all four estimators, per theta: closed form vs MC ({draws:,} draws)")
    print(f"{'benchmark':12s} {'theta':>5s} {'closed ms':>9s} {'MC ms':>8s} {'ratio':>7s}  "
          + "  ".join(f"{k + ' MC err':>16s}" for k in ESTIMATORS))
    ratios = []
    for bench in BENCHMARKS:
        J = benchmark_table(bench, d, 0)
        rng = np.random.default_rng(0)
        for t in range(thetas):
            r = rng.normal(scale=1.5, size=d) if t else np.zeros(d)
            closed = closed_form_moments(J, r, n, "sigmoid", ESTIMATORS)
            t_closed = best_time(
                lambda: closed_form_moments(J, r, n, "sigmoid", ESTIMATORS), 5)  # noqa: B023
            mc = mc_moments(J, r, n, draws, rng, "sigmoid", ESTIMATORS)
            t_mc = best_time(
                lambda: mc_moments(J, r, n, draws, rng, "sigmoid", ESTIMATORS), 3)  # noqa: B023
            ratios.append(t_mc / t_closed)
            errs = [
                100 * (mc[k].total_variance / closed[k].total_variance - 1) for k in ESTIMATORS
            ]
            times = f"{1e3 * t_closed:9.3f} {1e3 * t_mc:8.1f} {t_mc / t_closed:6.0f}x"
            print(f"{bench:12s} {t:5d} {times}  " + "  ".join(f"{e:+15.2f}%" for e in errs))
    print(f"   speed-up: min {min(ratios):.0f}x, median {np.median(ratios):.0f}x (goal >= 100x)")
    J = benchmark_table("exponential", d, 0)
    r = np.random.default_rng(0).normal(scale=1.5, size=d)
    t_dis = best_time(lambda: closed_form_moments(J, r, n, "sigmoid", ("disarm",)), 5)
    t_mc = best_time(lambda: mc_moments(J, r, n, draws, rng, "sigmoid", ("disarm",)), 3)
    print(f"   DisARM alone: closed form {1e3 * t_dis:.3f} ms, MC {1e3 * t_mc:.1f} ms "
          f"({t_mc / t_dis:.0f}x)\n")


def large_d(draws: int = 100_000, chunk: int = 10_000) -> None:
    d, n = 20, 10
    J = benchmark_table("exponential", d, 0)
    r = np.random.default_rng(1).normal(size=d)
    t = best_time(lambda: closed_form_moments(J, r, n, "sigmoid", ESTIMATORS), 3)
    m = closed_form_moments(J, r, n, "sigmoid", ESTIMATORS)
    print(f"2. d={d}, n={n}, all four estimators at one theta: {t:.2f} s (goal < 10 s)")
    print(f"   check against MC, {draws:,} draws of ||g - E g||^2 each:")
    rng = np.random.default_rng(2)
    for k in ESTIMATORS:
        sq = np.concatenate([
            ((sample_estimates(k, J, r, n, chunk, rng) - m[k].mean) ** 2).sum(-1)
            for _ in range(draws // chunk)
        ])
        se = sq.std(ddof=1) / np.sqrt(sq.size)
        print(f"   {k:9s} exact {m[k].total_variance:.6g}  MC {sq.mean():.6g} +- {se:.2g}  "
              f"(z = {(sq.mean() - m[k].total_variance) / se:+.2f})")
    print()


def scaling() -> None:
    print("3. time per theta, all four estimators (sigmoid), best of 3")
    ds = list(range(8, 21, 2))
    times_d = []
    for d in ds:
        J = np.random.default_rng(d).normal(size=2**d)
        r = np.random.default_rng(d + 1).normal(size=d)
        times_d.append(best_time(
            lambda: closed_form_moments(J, r, 10, "sigmoid", ESTIMATORS), 3))  # noqa: B023
    print("   n=10:  " + "  ".join(f"d={d}: {t:.4f}s" for d, t in zip(ds, times_d)))
    big = [i for i, d in enumerate(ds) if d >= 14]  # below, fixed overheads dominate
    a = np.polyfit([ds[i] for i in big], np.log2([times_d[i] for i in big]), 1)[0]
    per_unit = [t / (d * 2**d) for d, t in zip(ds, times_d)]
    print(f"   fitted over d=14..20: time ~ 2^({a:.2f} d); time / (d 2^d) = "
          + ", ".join(f"{x * 1e9:.0f}" for x in per_unit) + " ns")
    ns = [2, 5, 10, 30, 100, 300, 1000]
    J = np.random.default_rng(0).normal(size=2**10)
    r = np.random.default_rng(1).normal(size=10)
    times_n = [best_time(lambda: closed_form_moments(J, r, n, "sigmoid", ESTIMATORS), 5)  # noqa: B023
               for n in ns]
    print("   d=10:  " + "  ".join(f"n={n}: {t:.4f}s" for n, t in zip(ns, times_n)))
    b = np.polyfit(np.log(ns), np.log(times_n), 1)[0]
    print(f"   fitted: time ~ n^{b:.3f}")


def main(argv: list[str] | None = None) -> None:
    # no options: an unknown flag is an error, not silently ignored
    ArgumentParser(prog="python -m benchmarks.bench_closed_form",
                   description=__doc__.splitlines()[0]).parse_args(argv)
    compare_with_mc()
    large_d()
    scaling()


if __name__ == "__main__":
    raise SystemExit(run(main))
