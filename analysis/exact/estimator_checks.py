"""The checks of the score-function estimators' claims (``python -m analysis.theorems``): the
variance-optimal baseline (`thm:bStarOne`, `thm:bStarTwo`), the ARMS copula, its correlation and
unbiasedness (`sec:arms_iter_proof`, `alg:orig_arms`), and the multiset enumeration behind the
exact moments (`eq:n_multisets`, `eq:multiset_permutations`). Each returns a
:class:`analysis.exact.check_result.CheckResult` or a list of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import optimize, stats

from analysis.exact.check_result import ALPHA, CheckResult, TableFn, error_result, random_table
from pbexact import estimators as est
from pbexact.copula import arms_correlation, joint_one_probability, pattern_probabilities
from pbexact.parametrizations import get_parametrization
from pbexact.polynomial import flipped_expectation, true_gradient, vertex_probabilities
from pbexact.sampling import IterativeDirichletCopula, copula_from_uniforms
from pbexact.variance import exact_moments
from pbexact.vertices import multisets, permutation_counts, vertices

# ---------------------------------------------------------------------------------------------
# thm:bStarOne, thm:bStarTwo
# ---------------------------------------------------------------------------------------------


def fisher_weighted_distribution(theta: np.ndarray, i: int) -> np.ndarray:
    """q_i(zeta_h) proportional to p_theta(zeta_h) (d log p_theta(zeta_h) / d theta_i)^2
    (`thm:bStarOne`), shape (2^d,)."""
    score = get_parametrization("direct").score(vertices(theta.shape[-1]), theta)[:, i]
    q = vertex_probabilities(theta) * score**2
    return q / q.sum()


def baseline_variance(J: np.ndarray, theta: np.ndarray, n: int, beta: np.ndarray) -> np.ndarray:
    """Exact per-coordinate variance of `eq:bstar_thm_estimator` with baselines beta (shape (d,)),
    n iid samples, by enumerating every n-multiset (`eq:n_multisets`), shape (d,)."""
    d = theta.shape[-1]
    ms = multisets(2**d, n)
    prob = permutation_counts(ms) * np.prod(vertex_probabilities(theta)[ms], axis=1)
    scores = get_parametrization("direct").score(vertices(d), theta)
    g = est.baseline(J[ms], scores[ms], beta)
    return prob @ g**2 - true_gradient(J, theta) ** 2


def check_bstar(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    max_n: int,
    closed_form: TableFn = flipped_expectation,
    q_builder: Callable[[np.ndarray, int], np.ndarray] = fisher_weighted_distribution,
) -> list[CheckResult]:
    """`thm:bStarOne`: the minimizer over beta_i of the exact variance (Brent's method) equals
    E_{q_i}[J]; `thm:bStarTwo`: both equal the flipped-coordinate expectation ``closed_form``
    (`pbexact.polynomial.flipped_expectation`). Errors relative to max |J|."""
    max_d = min(max_d, 4)
    max_n = min(max_n, 4)  # C(16 + 3, 4) = 3,876 multisets at most
    worst_one = worst_two = 0.0
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        n = int(rng.integers(1, max_n + 1))
        J = random_table(rng, d)
        theta = rng.uniform(0.05, 0.95, size=d)  # the score is undefined at 0 and 1
        scale = np.abs(J).max()
        closed = closed_form(J, theta)
        for i in range(d):
            found = optimize.minimize_scalar(
                lambda b, J=J, theta=theta, n=n, i=i: float(
                    baseline_variance(J, theta, n, np.full(theta.size, b))[i]),
                bracket=(-scale, scale), method="brent", options={"xtol": 1e-12},
            ).x
            e_q = q_builder(theta, i) @ J
            worst_one = max(worst_one, abs(found - e_q) / scale)
            worst_two = max(worst_two, abs(closed[i] - e_q) / scale, abs(closed[i] - found) / scale)
    sizes = f"{instances} instances, d=1..{max_d}, n=1..{max_n}"
    return [
        error_result(
            "thm:bStarOne",
            "argmin_beta_i exact Var (Brent) = E_{q_i}[J], q_i from the Fisher integrand",
            sizes,
            worst_one,
            1e-6,
        ),
        error_result(
            "thm:bStarTwo",
            "flipped-coordinate expectation = E_{q_i}[J] = numerical argmin",
            sizes,
            worst_two,
            1e-6,
        ),
    ]


# ---------------------------------------------------------------------------------------------
# sec:arms_iter_proof, ARMS correlation and unbiasedness
# ---------------------------------------------------------------------------------------------


def iterative_copula(total: np.ndarray, uniforms: np.ndarray, n: int) -> np.ndarray:
    """`alg:iter_dir` through :class:`pbexact.sampling.IterativeDirichletCopula`: Gamma(n, 1)
    totals of shape (k,) and uniforms of shape (n, k) -> copula uniforms, shape (n, k)."""
    return IterativeDirichletCopula(total, n).next(uniforms)


def check_arms_iterative(
    rng: np.random.Generator,
    samples: int,
    ns: Sequence[int] = (2, 3, 5),
    sampler: Callable[[np.ndarray, np.ndarray, int], np.ndarray] = iterative_copula,
) -> CheckResult:
    """`sec:arms_iter_proof`: `alg:iter_dir` (``sampler``) and `alg:orig_arms` give the same
    copula: two-sample KS tests on every marginal u~^(s), and for both samplers the frequency of
    z~^(s) = z~^(s') = 1 on every pair against the exact inclusion-exclusion value
    (`pbexact.copula.joint_one_probability`), at theta above and below 0.5. ``worst`` is the
    smallest p-value; the level is ALPHA / number of tests."""
    thetas = np.array([0.15, 0.5, 0.7, 0.93])
    pvals: list[float] = []
    for n in ns:
        k = samples * thetas.size
        orig = copula_from_uniforms(np.maximum(rng.random((samples, n, thetas.size)), 1e-300))
        it = sampler(rng.gamma(n, 1.0, size=k), rng.random((n, k)), n)
        it = np.moveaxis(it.reshape(n, samples, thetas.size), 0, 1)
        for s in range(n):
            for i in range(thetas.size):
                pvals.append(stats.ks_2samp(orig[:, s, i], it[:, s, i]).pvalue)
        exact = joint_one_probability(thetas, n, 2)
        for u in (orig, it):
            z = np.where(thetas > 0.5, u <= thetas, 1 - u <= thetas)
            for s, t in itertools.combinations(range(n), 2):
                freq = (z[:, s] & z[:, t]).mean(0)
                se = np.sqrt(exact * (1 - exact) / samples)
                zscore = np.abs(freq - exact) / np.where(se > 0, se, 1.0)
                pvals.extend((2 * stats.norm.sf(zscore)).tolist())
    level = ALPHA / len(pvals)
    p = float(min(pvals))
    return CheckResult(
        "sec:arms_iter_proof",
        "alg:iter_dir = alg:orig_arms: KS on marginals, pairwise P(z=1,z'=1) = incl.-excl.",
        f"{samples} samples, n in {list(ns)}, theta in {thetas.tolist()}, {len(pvals)} tests",
        p,
        level,
        "p-value",
        p >= level,
    )


def pairwise_correlation(theta: np.ndarray, n: int) -> np.ndarray:
    """Exact Corr(z~^(1), z~^(2)) of the copula samples from the pattern probabilities
    (`pbexact.copula.pattern_probabilities`): P(both 1) = sum_k C(n-2, k-2) q[k]."""
    q = pattern_probabilities(theta, n)
    both = sum(math.comb(n - 2, k - 2) * q[..., k] for k in range(2, n + 1))
    return (both - theta**2) / (theta * (1 - theta))


def check_arms_correlation(
    rng: np.random.Generator,
    instances: int,
    max_n: int,
    rho: Callable[[np.ndarray, int], np.ndarray] = arms_correlation,
) -> CheckResult:
    """`alg:orig_arms`: the paper's rho equals the exact correlation of the copula samples, from
    the pattern probabilities (inclusion-exclusion over orderings), at random theta and n."""
    worst = 0.0
    for _ in range(instances):
        n = int(rng.integers(2, max_n + 1))
        theta = np.concatenate([rng.uniform(0.001, 0.999, size=8), [0.5, 0.25, 0.75]])
        worst = max(worst, float(np.abs(rho(theta, n) - pairwise_correlation(theta, n)).max()))
    return error_result(
        "alg:orig_arms",
        "ARMS rho = exact pairwise correlation of the Dirichlet-copula bits",
        f"{instances} instances, n=2..{max_n}, 11 thetas each",
        worst,
        1e-9,
    )


def check_arms_unbiased(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    max_n: int,
    rho: Callable[[np.ndarray, int], np.ndarray] = arms_correlation,
) -> CheckResult:
    """ARMS is unbiased: its exact mean over every multiset of copula samples
    (`pbexact.variance.exact_moments`) equals the true gradient. ARMS is LOORF / (1 - rho), so the
    mean with another ``rho`` is the library mean times (1 - rho_lib) / (1 - rho)."""
    max_d, max_n = min(max_d, 4), min(max_n, 4)
    param = get_parametrization("sigmoid")
    worst = 0.0
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        n = int(rng.integers(2, max_n + 1))
        J = random_table(rng, d)
        r = rng.normal(0, 1.5, size=d)
        theta = param.theta(r)
        mean = exact_moments(J, r, n, param, ("arms",))["arms"].mean
        mean = mean * (1 - arms_correlation(theta, n)) / (1 - rho(theta, n))
        truth = param.chain(true_gradient(J, theta), r)
        worst = max(worst, float(np.abs(mean - truth).max() / np.abs(J).max()))
    return error_result(
        "alg:orig_arms",
        "ARMS unbiased: exact E[g_ARMS] (multiset enumeration) = true gradient",
        f"{instances} instances, d=1..{max_d}, n=2..{max_n}",
        worst,
        1e-9,
    )


# ---------------------------------------------------------------------------------------------
# eq:n_multisets, eq:multiset_permutations
# ---------------------------------------------------------------------------------------------


def check_multisets(
    rng: np.random.Generator,
    max_d: int,
    max_n: int,
    count: Callable[[int, int], int] = lambda items, n: math.comb(items - 1 + n, n),
    orderings: Callable[[np.ndarray], np.ndarray] = permutation_counts,
) -> CheckResult:
    """`eq:n_multisets`: the number of n-multisets of 2^d vertices is ``count``, and equals a
    brute-force enumeration; `eq:multiset_permutations`: ``orderings`` matches brute-force counts
    of ordered tuples, and the probability mass over multisets sums to 1, for iid samples and for
    the ARMS copula. ``worst`` is the largest |mass - 1| plus the number of count mismatches."""
    max_d, max_n = min(max_d, 3), min(max_n, 4)
    mismatches = 0
    worst_mass = 0.0
    for d in range(1, max_d + 1):
        items = 2**d
        for n in range(1, max_n + 1):
            ms = multisets(items, n)
            brute = list(itertools.combinations_with_replacement(range(items), n))
            mismatches += int(ms.shape[0] != count(items, n) or ms.shape[0] != len(brute))
            mismatches += int(not np.array_equal(ms, np.array(brute)))
            perms = orderings(ms)
            if items**n <= 5000:
                tally: dict[tuple[int, ...], int] = {}
                for tup in itertools.product(range(items), repeat=n):
                    key = tuple(sorted(tup))
                    tally[key] = tally.get(key, 0) + 1
                mismatches += int(not np.array_equal(perms, [tally[tuple(row)] for row in ms]))
            theta = rng.uniform(0.01, 0.99, size=d)
            mass = perms @ np.prod(vertex_probabilities(theta)[ms], axis=1)
            worst_mass = max(worst_mass, abs(mass - 1))
            if n >= 2:
                q = pattern_probabilities(theta, n)
                ones = ((ms[:, :, None] >> np.arange(d)) & 1).sum(1)
                arms_mass = perms @ np.prod(q[np.arange(d), ones], axis=1)
                worst_mass = max(worst_mass, abs(arms_mass - 1))
    return error_result(
        "eq:n_multisets",
        "multiset counts = C(2^d-1+n, n) = brute force; orderings = brute force; mass sums to 1",
        f"d=1..{max_d}, n=1..{max_n}",
        worst_mass + mismatches,
        1e-12,
        count_mismatches=mismatches,
        worst_mass_error=worst_mass,
    )
