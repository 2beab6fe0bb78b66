"""Benchmark of the exact core (`pbexact.variance`), printed, never asserted.

1. Time per exact variance step at d=4, n=4 (REINFORCE, LOORF, ARMS, beta*; all 3,876 multisets)
   with pbexact against a straightforward pure-Python loop over the multisets, same run, same
   numbers (checked), as a ratio. Goal: at least 100x.
2. Wall time of the default ``python -m analysis.variance --d 4 --n 4`` with a warm Numba cache
   (the first run warms it). Goal: under 30 s.

    python -m benchmarks.bench_variance
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import tempfile
import time

import numpy as np

from analysis.cli import run
from benchmarks.timing import best_time
from pbexact.cli import ArgumentParser
from pbexact.copula import arms_correlation, pattern_probabilities
from pbexact.instances import exponential_tabular_loss
from pbexact.polynomial import flipped_expectation, true_gradient
from pbexact.variance import exact_moments


def python_loop_variances(J: list[float], theta: list[float], n: int) -> dict[str, float]:
    """Summed variances of the four estimators (sigmoid logits) by a plain loop over multisets."""
    d = len(theta)
    verts = [[(h >> i) & 1 for i in range(d)] for h in range(2**d)]
    score = [[z[i] - theta[i] for i in range(d)] for z in verts]
    p_vertex = [math.prod(theta[i] if z[i] else 1 - theta[i] for i in range(d)) for z in verts]
    th = np.array(theta)
    rho = arms_correlation(th, n).tolist()
    q = pattern_probabilities(th, n).tolist()
    beta = flipped_expectation(np.array(J), th).tolist()
    grad = (true_gradient(np.array(J), th) * th * (1 - th)).tolist()
    second = {k: [0.0] * d for k in ("reinforce", "loorf", "arms", "betastar")}
    for ms in itertools.combinations_with_replacement(range(2**d), n):
        perms = math.factorial(n) / math.prod(math.factorial(ms.count(h)) for h in set(ms))
        p_iid = perms * math.prod(p_vertex[h] for h in ms)
        ones = [sum(verts[h][i] for h in ms) for i in range(d)]
        p_arms = perms * math.prod(q[i][ones[i]] for i in range(d))
        js = [J[h] for h in ms]
        mean = sum(js) / n
        for i in range(d):
            s = [score[h][i] for h in ms]
            rf = sum(j * si for j, si in zip(js, s)) / n
            lo = sum((j - mean) * si for j, si in zip(js, s)) / (n - 1)
            bs = sum((j - beta[i]) * si for j, si in zip(js, s)) / n
            second["reinforce"][i] += p_iid * rf * rf
            second["loorf"][i] += p_iid * lo * lo
            second["betastar"][i] += p_iid * bs * bs
            ar = lo / (1 - rho[i])
            second["arms"][i] += p_arms * ar * ar
    return {k: sum(v[i] - grad[i] ** 2 for i in range(d)) for k, v in second.items()}



def main(argv: list[str] | None = None) -> None:
    # no options: an unknown flag is an error, not silently ignored
    ArgumentParser(prog="python -m benchmarks.bench_variance",
                   description=__doc__.splitlines()[0]).parse_args(argv)
    d, n = 4, 4
    J = exponential_tabular_loss(d, 0)
    theta = np.array([0.3, 0.5, 0.62, 0.9])
    r = np.log(theta / (1 - theta))
    four = ("reinforce", "loorf", "arms", "betastar")  # the loop's four: the same work
    exact_moments(J, r, n, "sigmoid", four)  # compile and cache the enumeration once
    fast = exact_moments(J, r, n, "sigmoid", four)
    slow = python_loop_variances(J.tolist(), theta.tolist(), n)
    for k, v in slow.items():
        assert abs(fast[k].total_variance - v) <= 1e-12 * max(1.0, abs(v)), k
    t_fast = best_time(lambda: exact_moments(J, r, n, "sigmoid", four), 50)
    t_slow = best_time(lambda: python_loop_variances(J.tolist(), theta.tolist(), n), 3)
    print(f"exact variance step, d={d}, n={n}, 4 estimators, 3,876 multisets")
    print(f"  pbexact (vectorized enumeration): {t_fast * 1e3:8.3f} ms")
    print(f"  pure-Python multiset loop:        {t_slow * 1e3:8.3f} ms")
    print(f"  speed-up: {t_slow / t_fast:.0f}x (goal >= 100x); results agree to 1e-12")
    t_all = best_time(lambda: exact_moments(J, r, n), 50)
    print(f"  every registered estimator (DisARM too): {t_all * 1e3:8.3f} ms")

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "analysis.variance", "--d", "4", "--n", "4",
               "--out", tmp, "--figures", tmp]
        subprocess.run(cmd, check=True, capture_output=True)  # warms the Numba cache
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - start
    print(f"python -m analysis.variance --d 4 --n 4 (warm cache): {wall:.1f} s wall (goal < 30 s)")


if __name__ == "__main__":
    raise SystemExit(run(main))
