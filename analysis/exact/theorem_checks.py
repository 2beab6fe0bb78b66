"""The numerical checks of every analytical claim of the paper, one function per claim (its
paper label in each :class:`CheckResult`), run by ``python -m analysis.theorems``.

Every check takes the formula or object under test as an argument, so the tests can feed it a
wrong one (a perturbed formula, a wrong rho, a non-multilinear polynomial) and see it fail; each
takes its random generator and sizes, and returns one :class:`CheckResult` or a list of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import optimize, stats

from pbexact import estimators as est
from pbexact.bad_generalization import (
    alignment,
    corollary_fit,
    exact_alignment,
    first_binding_d,
    largest_aligned_m,
    mc_bad_gen_table,
    mc_bad_gen_threshold,
)
from pbexact.copula import arms_correlation, joint_one_probability, pattern_probabilities
from pbexact.errors import PBInputError
from pbexact.parametrizations import PARAMETRIZATIONS, get_parametrization
from pbexact.polynomial import (
    expected_loss,
    flipped_expectation,
    moebius_value,
    moebius_weights,
    multilinear_value,
    true_gradient,
    vertex_probabilities,
)
from pbexact.sampling import (
    IterativeDirichletCopula,
    copula_from_uniforms,
    sample_bernoulli,
    vertex_index,
)
from pbexact.sgd import sgd
from pbexact.variance import exact_moments
from pbexact.vertices import multisets, permutation_counts, vertices

TableFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: Family-wise significance level of the statistical checks (Bonferroni over each check's tests).
ALPHA = 1e-3


@dataclass
class CheckResult:
    """One row of the table: ``worst`` is an error (pass if <= tolerance) or, for statistical
    checks, the smallest p-value (pass if >= tolerance, the Bonferroni level)."""

    label: str
    check: str
    sizes: str
    worst: float
    tolerance: float
    kind: str  # "error" or "p-value"
    passed: bool
    detail: dict[str, Any] = field(default_factory=dict)


def _error_result(label: str, check: str, sizes: str, worst: float, tol: float, **detail: Any):
    return CheckResult(label, check, sizes, float(worst), tol, "error", bool(worst <= tol), detail)


def _random_table(rng: np.random.Generator, d: int) -> np.ndarray:
    """A J table on a random scale from 1e-2 to 1e3, so relative tolerances are exercised."""
    return rng.normal(size=2**d) * 10 ** rng.uniform(-2, 3)


def _random_theta(rng: np.random.Generator, d: int, edges: bool = True) -> np.ndarray:
    theta = rng.uniform(0, 1, size=d)
    if edges:
        # exact 0, 1 and 0.5 are where branches and 0^0 conventions live
        pick = rng.random(d)
        theta = np.where(pick < 0.1, 0.0, np.where(pick < 0.2, 1.0, theta))
        theta = np.where((pick >= 0.2) & (pick < 0.25), 0.5, theta)
    return theta


# ---------------------------------------------------------------------------------------------
# eq:equivalence
# ---------------------------------------------------------------------------------------------


def expectation_by_enumeration(J: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """E_{z ~ Bern(theta)}[J(z)] as the definition of an expectation: sum over the 2^d vertices of
    P(z = zeta_h) J(zeta_h), with P(z = zeta_h) = prod_i theta_i^z_i (1 - theta_i)^(1 - z_i)."""
    v = vertices(theta.shape[-1])
    prob = np.prod(np.where(v == 1, theta, 1 - theta), axis=-1)
    return prob @ J


def _literal_form(J: np.ndarray, theta: np.ndarray) -> np.ndarray:
    return multilinear_value(J, theta)


def _subset_form(J: np.ndarray, theta: np.ndarray) -> np.ndarray:
    return moebius_value(moebius_weights(J), theta)


def check_equivalence(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    forms: dict[str, TableFn] | None = None,
) -> CheckResult:
    """`eq:equivalence`: E[J(z)] = P_J(theta) for both polynomial forms (`eq:multi_poly`,
    `eq:multi_poly_set`), error relative to max |J|."""
    forms = forms or {"eq:multi_poly": _literal_form, "eq:multi_poly_set": _subset_form}
    worst = {name: 0.0 for name in forms}
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        J, theta = _random_table(rng, d), _random_theta(rng, d)
        expect = expectation_by_enumeration(J, theta)
        for name, form in forms.items():
            err = abs(float(form(J, theta)) - float(expect)) / np.abs(J).max()
            worst[name] = max(worst[name], err)
    return _error_result(
        "eq:equivalence",
        "E_Bern(theta)[J] (enumeration) = P_J(theta), literal and subset forms",
        f"{instances} instances, d=1..{max_d}",
        max(worst.values()),
        1e-12,
        per_form=worst,
    )


def check_equivalence_mc(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    samples: int,
    polynomial: TableFn = _literal_form,
) -> CheckResult:
    """`eq:equivalence` by sampling: the Monte Carlo mean of J(z), z ~ Bern(theta), against
    P_J(theta); two-sided z-test with the exact variance, Bonferroni over the instances."""
    pvals = []
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        J, theta = _random_table(rng, d), _random_theta(rng, d, edges=False)
        z = sample_bernoulli(theta, (samples,), rng)
        mean = J[vertex_index(z)].mean()
        var = vertex_probabilities(theta) @ J**2 - expected_loss(J, theta) ** 2
        se = math.sqrt(max(float(var), 1e-300) / samples)
        pvals.append(2 * stats.norm.sf(abs(mean - float(polynomial(J, theta))) / se))
    level = ALPHA / instances
    p = float(min(pvals))
    return CheckResult(
        "eq:equivalence",
        "Monte Carlo mean of J(z) vs P_J(theta) (z-test)",
        f"{instances} instances, d=1..{max_d}, {samples} samples",
        p,
        level,
        "p-value",
        p >= level,
    )


# ---------------------------------------------------------------------------------------------
# thm:multilinear_hessian
# ---------------------------------------------------------------------------------------------


def sympy_multilinear(J: Sequence[int], xs: Sequence[Any]) -> Any:
    """P_J(x) of `eq:multi_poly` in sympy: sum_h prod_i x_i^z_i (1 - x_i)^(1 - z_i) J(zeta_h)."""
    total = 0
    for h, value in enumerate(J):
        term = value
        for i, x in enumerate(xs):
            term = term * (x if (h >> i) & 1 else 1 - x)
        total = total + term
    return total


def check_multilinear_hessian_symbolic(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    builder: Callable[[Sequence[int], Sequence[Any]], Any] = sympy_multilinear,
) -> CheckResult:
    """`thm:multilinear_hessian` with sympy, both directions:
    (1) the polynomial ``builder`` makes from a random integer table has a zero Hessian diagonal
        and its expanded coefficients are the subset weights w_S (`eq:multi_poly_set`);
    (2) adding c x_k^2 (times a random monomial) makes the diagonal nonzero;
    (3) for random polynomials with exponents in {0, 1, 2}: zero diagonal iff every exponent <= 1.
    ``worst`` counts the instances where a claim failed."""
    import sympy as sp

    max_d = min(max_d, 4)  # symbolic expansion of 2^d terms; d <= 4 keeps it to seconds
    failures = {"multilinear": 0, "weights": 0, "squared": 0, "iff": 0}
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        xs = sp.symbols(f"x1:{d + 1}")
        J = [int(v) for v in rng.integers(-9, 10, size=2**d)]
        expr = sp.expand(builder(J, xs))
        if any(sp.diff(expr, x, 2) != 0 for x in xs):
            failures["multilinear"] += 1
        w = moebius_weights(np.array(J, dtype=float))
        poly = sp.Poly(expr, *xs)
        for S in range(2**d):
            monom = tuple((S >> i) & 1 for i in range(d))
            if float(poly.coeff_monomial(monom)) != w[S]:
                failures["weights"] += 1
                break
        k = int(rng.integers(d))
        extra = int(rng.choice([-3, -2, -1, 1, 2, 3])) * xs[k] ** 2
        for i in range(d):
            if i != k and rng.random() < 0.5:
                extra = extra * xs[i]
        if all(sp.diff(expr + extra, x, 2) == 0 for x in xs):
            failures["squared"] += 1
        exps = rng.integers(0, 3, size=(3, d))
        coeffs = rng.integers(1, 5, size=3)
        rand_poly = sp.expand(sum(int(c) * sp.prod([x**int(e) for x, e in zip(xs, row)])
                                  for c, row in zip(coeffs, exps)))
        zero_diag = all(sp.diff(rand_poly, x, 2) == 0 for x in xs)
        multilinear = all(sp.degree(rand_poly, x) <= 1 for x in xs)
        if zero_diag != multilinear:
            failures["iff"] += 1
    return _error_result(
        "thm:multilinear_hessian",
        "sympy: zero Hessian diagonal iff multilinear; w_S = coefficients; x_k^2 breaks it",
        f"{instances} instances, d=1..{max_d}",
        sum(failures.values()),
        0,
        failures=failures,
    )


def check_multilinear_hessian_numeric(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    function: TableFn = multilinear_value,
) -> CheckResult:
    """`thm:multilinear_hessian` numerically: the central second difference of P_J along each
    axis, (f(x + h e_i) - 2 f(x) + f(x - h e_i)) / h^2, at random real x (also outside [0, 1]);
    exactly zero for a multilinear f and any h, so only round-off remains."""
    worst = 0.0
    h = 0.5
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        J = _random_table(rng, d)
        x = rng.uniform(-2, 3, size=d)
        for i in range(d):
            e = np.zeros(d)
            e[i] = h
            second = (function(J, x + e) - 2 * function(J, x) + function(J, x - e)) / h**2
            worst = max(worst, abs(float(second)) / np.abs(J).max())
    return _error_result(
        "thm:multilinear_hessian",
        "second difference of P_J along each axis at random real x is 0",
        f"{instances} instances, d=1..{max_d}",
        worst,
        1e-9,
    )


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
        J = _random_table(rng, d)
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
        _error_result(
            "thm:bStarOne",
            "argmin_beta_i exact Var (Brent) = E_{q_i}[J], q_i from the Fisher integrand",
            sizes,
            worst_one,
            1e-6,
        ),
        _error_result(
            "thm:bStarTwo",
            "flipped-coordinate expectation = E_{q_i}[J] = numerical argmin",
            sizes,
            worst_two,
            1e-6,
        ),
    ]


# ---------------------------------------------------------------------------------------------
# thm:mc_bad_gen_2 and cor:mc_bad_gen_2
# ---------------------------------------------------------------------------------------------


def check_mc_bad_gen_2(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    threshold: Callable[[int, np.ndarray, float, float], np.ndarray] = mc_bad_gen_threshold,
) -> CheckResult:
    """`thm:mc_bad_gen_2`, both directions of the iff on every coordinate: for random d, z*,
    theta, M0, dM and m (far below, and within a relative 1e-5 of each coordinate's threshold on
    both sides), sign(LHS >= 0) must equal (m <= threshold_i). Exact equality m = threshold_i is
    checked in rational arithmetic (LHS = 0 exactly). ``worst`` counts disagreements."""
    max_d = min(max_d, 6)  # keeps p_theta(z*) products well above round-off near equality
    mismatches = cases = near = exact_cases = 0
    inside_hypothesis = 0
    for _ in range(instances):
        d = int(rng.integers(2, max_d + 1))
        z_star = rng.integers(0, 2, size=d).astype(float)
        p_star = rng.uniform(0.3, 0.97, size=d)
        theta = np.where(z_star == 1, p_star, 1 - p_star)
        M0 = float(rng.normal(0, 5))
        dM = float(10 ** rng.uniform(-1, 1))
        thr = threshold(d, p_star, M0, dM)
        true_thr = mc_bad_gen_threshold(d, p_star, M0, dM)
        scale = abs(M0) + dM + np.abs(true_thr).max()
        ms = [M0 - dM - float(10 ** rng.uniform(-2, 3))]
        for t in true_thr:
            ms += [t - 1e-5 * scale, t + 1e-5 * scale]
        for m in ms:
            lhs = alignment(mc_bad_gen_table(d, z_star, m, M0, dM), theta, z_star)
            predicted = m <= thr
            mismatches += int(np.sum((lhs >= 0) != predicted))
            cases += d
            near += d if m != ms[0] else 0
            inside_hypothesis += int(m < M0 - dM)
        if d <= 4:
            # exact equality at a rational instance: LHS_i must be exactly 0 (so ">= 0" holds)
            pf = [Fraction(int(rng.integers(30, 98)), 100) for _ in range(d)]
            M0f = Fraction(int(rng.integers(-50, 50)), 7)
            dMf = Fraction(int(rng.integers(1, 30)), 3)
            zs = [int(z) for z in z_star]
            i = int(rng.integers(d))
            others = math.prod(pf[j] for j in range(d) if j != i)
            m_eq = M0f - dMf / (d * others)
            lhs_eq = exact_alignment(d, zs, pf, m_eq, M0f, dMf, i)
            thr_eq = threshold(d, np.array([float(p) for p in pf]), float(M0f), float(dMf))[i]
            # the formula under test must put m_eq on the ">= 0" side, to round-off
            mismatches += int(lhs_eq != 0) + int(float(m_eq) > thr_eq + 1e-12 * (1 + abs(thr_eq)))
            exact_cases += 1
    return _error_result(
        "thm:mc_bad_gen_2",
        "sign of (-grad E[J])_i (grad p(z*))_i agrees with m <= threshold_i, both directions",
        f"{instances} instances, d=2..{max_d}, {cases} coordinate cases ({near} near equality, "
        f"{exact_cases} exact equalities)",
        mismatches,
        0,
        cases=cases,
        near_equality=near,
        exact_equalities=exact_cases,
        m_below_second_lowest=inside_hypothesis,
    )


def check_corollary_sizes(cor_max_d: int, epsilon: float) -> None:
    """The command-line sizes of the `cor:mc_bad_gen_2` study: d up to 24 and 0 < epsilon < 1."""
    if not 2 <= cor_max_d <= 24:
        raise PBInputError(f"--cor-max-d must be in 2..24 (a 2^d table per d), got {cor_max_d}; "
                           "give a value from 2 to 24")
    if not 0 < epsilon < 1:
        raise PBInputError(f"--epsilon must be in (0, 1), got {epsilon}; give a value "
                           "strictly between 0 and 1")


def check_cor_mc_bad_gen_2(
    max_d: int, epsilon: float, table: Callable[..., np.ndarray] = mc_bad_gen_table,
    seed: int = 0,
) -> CheckResult:
    """`cor:mc_bad_gen_2`: the exact threshold equals the closed form for d = 2..max_d, and it
    shrinks like -c^d / d: the fitted c equals 1 / (1 - epsilon) and the fit is exact (R^2 = 1).
    Also the "only if" with unequal p (max p = 1 - epsilon): m* is never above the equal case."""
    fit = corollary_fit(range(2, max_d + 1), epsilon, table=table, seed=seed)
    rel = np.abs(fit.exact - fit.formula) / np.abs(fit.formula)
    rng = np.random.default_rng(seed + 1)
    above = 0
    for d in range(2, min(max_d, 12) + 1):
        z_star = rng.integers(0, 2, size=d).astype(float)
        p = rng.uniform(0.5, 1 - epsilon, size=d)
        p[rng.integers(d)] = 1 - epsilon
        theta = np.where(z_star == 1, p, 1 - p)
        m_star = largest_aligned_m(d, theta, z_star, 0.0, 1.0, table)
        above += int(m_star > fit.formula[d - 2] + 1e-9 * abs(fit.formula[d - 2]))
    worst = max(float(rel.max()), abs(fit.c_fit - fit.c_expected) / fit.c_expected,
                1 - fit.r_squared, float(above))
    return _error_result(
        "cor:mc_bad_gen_2",
        f"largest aligned m = -Theta(c^d/d): fitted c={fit.c_fit:.6f} vs 1/(1-eps)="
        f"{fit.c_expected:.6f}, R^2={fit.r_squared:.9f}",
        f"d=2..{max_d}, eps={epsilon}",
        worst,
        1e-8,
        d=fit.ds.tolist(),
        exact_m=fit.exact.tolist(),
        formula_m=fit.formula.tolist(),
        c_fit=fit.c_fit,
        c_expected=fit.c_expected,
        intercept=fit.intercept,
        r_squared=fit.r_squared,
        unequal_p_above_bound=above,
        binding_from_d=first_binding_d(epsilon),
    )


# ---------------------------------------------------------------------------------------------
# ex:mc_bad_gen_1
# ---------------------------------------------------------------------------------------------

#: `ex:mc_bad_gen_1` with m = -1, M = 1: J(zeta_0) = J(zeta_3) = M, J(zeta_1) = J(zeta_2) = m.
MC_BAD_GEN_1 = np.array([1.0, -1.0, -1.0, 1.0])


def sgd_from_samples(
    J: np.ndarray, theta0: np.ndarray, runs: int, steps: int, n: int, lr: float,
    rng: np.random.Generator, estimator: str = "reinforce",
) -> np.ndarray:
    """``runs`` independent runs of SGD on theta (direct parametrization, projected to
    [eps, 1 - eps]) with the REINFORCE (`eq:reinforce`) or LOORF (`eq:loorf`) estimate from n iid
    samples per step; final thetas, shape (runs, d)."""
    est.check_estimator(estimator, n)
    spec = est.get_estimator(estimator)
    if spec.law != "iid" or spec.constant is not None:  # REINFORCE or LOORF
        iid = [k for k, v in est.REGISTRY.items() if v.law == "iid" and v.constant is None]
        raise PBInputError(f"use {' or '.join(iid)} here, got {estimator!r}")
    param = get_parametrization("direct")
    r = np.tile(np.asarray(theta0, dtype=float), (runs, 1))

    def gradient(step: int, r: np.ndarray) -> np.ndarray:
        theta = param.theta(r)
        z = (rng.random((runs, n, theta.shape[-1])) < theta[:, None, :]) * 1.0
        S = param.score(z, r[:, None, :])
        return spec.form(J[vertex_index(z)]).evaluate(S)

    return param.theta(sgd(r, gradient, lr, steps, project=param.project))


def escaped_fraction(J: np.ndarray, final: np.ndarray) -> float:
    """Fraction of runs whose E[J] ends within 10% of max J - min J of the minimum."""
    low, high = J.min(), J.max()
    return float(np.mean(expected_loss(J, final) <= low + 0.1 * (high - low)))


def check_ex_mc_bad_gen_1(
    rng: np.random.Generator,
    runs: int,
    steps: int = 300,
    n: int = 2,
    lr: float = 0.05,
    J: np.ndarray = MC_BAD_GEN_1,
) -> CheckResult:
    """`ex:mc_bad_gen_1`: the exact gradient at theta = (0.5, 0.5) is zero (so exact gradient
    descent never moves), while REINFORCE SGD on ``J`` and LOORF SGD on ``J - min J`` escape the
    saddle: at least 90% of the runs end with E[J] within 10% of (M - m) of the minimum m.

    Also recorded (not a pass criterion): REINFORCE on J - min J (m = 0) never escapes. With
    J(zeta_1) = J(zeta_2) = 0 only the samples zeta_0 and zeta_3 contribute, their scores are
    equal in both coordinates when theta_1 = theta_2, so every estimate stays on the diagonal,
    along which (0.5, 0.5) is a minimum."""
    center = np.array([0.5, 0.5])
    grad = float(np.abs(true_gradient(J, center)).max())
    shifted = J - J.min()
    escaped = {
        "reinforce": escaped_fraction(J, sgd_from_samples(J, center, runs, steps, n, lr, rng)),
        "loorf_shifted": escaped_fraction(
            shifted, sgd_from_samples(shifted, center, runs, steps, n, lr, rng, "loorf")),
        "reinforce_shifted": escaped_fraction(
            shifted, sgd_from_samples(shifted, center, runs, steps, n, lr, rng)),
    }
    passed = grad <= 1e-12 * np.abs(J).max() and min(
        escaped["reinforce"], escaped["loorf_shifted"]) >= 0.9
    return CheckResult(
        "ex:mc_bad_gen_1",
        f"grad at (0.5,0.5) = 0; escape: REINFORCE {100 * escaped['reinforce']:.0f}%, LOORF "
        f"(m=0) {100 * escaped['loorf_shifted']:.0f}% (REINFORCE, m=0: "
        f"{100 * escaped['reinforce_shifted']:.0f}%)",
        f"{runs} runs x {steps} steps, n={n}, lr={lr}",
        grad,
        1e-12,
        "error",
        bool(passed),
        {"escaped_fraction": escaped},
    )


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
    return _error_result(
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
        J = _random_table(rng, d)
        r = rng.normal(0, 1.5, size=d)
        theta = param.theta(r)
        mean = exact_moments(J, r, n, param, ("arms",))["arms"].mean
        mean = mean * (1 - arms_correlation(theta, n)) / (1 - rho(theta, n))
        truth = param.chain(true_gradient(J, theta), r)
        worst = max(worst, float(np.abs(mean - truth).max() / np.abs(J).max()))
    return _error_result(
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
    return _error_result(
        "eq:n_multisets",
        "multiset counts = C(2^d-1+n, n) = brute force; orderings = brute force; mass sums to 1",
        f"d=1..{max_d}, n=1..{max_n}",
        worst_mass + mismatches,
        1e-12,
        count_mismatches=mismatches,
        worst_mass_error=worst_mass,
    )


# ---------------------------------------------------------------------------------------------
# ch:other, eq:sigmoid_cp: the bias of ST, CP, REBAR and RELAX (beyond the paper)
# ---------------------------------------------------------------------------------------------

#: ST's relative bias must be at least this on a non-multilinear extension (NNLoss).
ST_BIAS_FLOOR = 1e-3


def st_theta_moments(f: Any, J: np.ndarray, r: np.ndarray, param: Any) -> Any:
    """Exact moments of one ST-theta estimate (pbscale's ``st_theta``, Zhou et al.) on the
    extension f at logits r, by enumerating the 2^d vertices (`pbexact.bias`)."""
    from analysis.exact.bias import BIASED, Setting, estimator_moments

    return estimator_moments(BIASED["st-theta"], f, J, r, param, Setting())


def _st_variance_closed_form(A: np.ndarray, theta: np.ndarray, r: np.ndarray, param: Any
                             ) -> np.ndarray:
    """Per-logit variance of ST-theta on z^T A z + b^T z: diag(S diag(theta (1-theta)) S)
    (`pbexact.bias.st_quadratic_moments`) times (d theta / d r)^2."""
    from pbexact.bias import st_quadratic_moments

    _, cov = st_quadratic_moments(A, np.zeros(theta.shape), theta)
    return param.expand(np.diag(cov)) * param.dtheta_dr(r) ** 2


def _one_thread(check: Callable[..., Any]) -> Callable[..., Any]:
    """Run a check with one torch thread (`analysis.exact.bias.torch_threads`): its many small
    autograd calls run fastest that way."""
    import functools

    @functools.wraps(check)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        from analysis.exact.bias import torch_threads

        with torch_threads(1):
            return check(*args, **kwargs)

    return wrapped


@_one_thread
def check_st_bias(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    nets: int = 2,
    moments: Callable[..., Any] = st_theta_moments,
    closed_form: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> list[CheckResult]:
    """ST (`ch:other`) on theta, exact by enumeration over the vertices, three ways:
    (1) unbiased when J's extension is multilinear (random tables, every parametrization);
    (2) biased on NNLoss, a non-multilinear extension: ||b|| / ||grad|| >= ST_BIAS_FLOOR on
    ``nets`` networks (d = 2, 3, ...) at random theta; ``worst`` counts the instances below;
    (3) on J(z) = z^T A z + b^T z its bias equals ``closed_form`` (default
    `pbexact.bias.st_quadratic_bias`, A_kk (2 theta_k - 1)) times d theta / d r, and its
    variance the closed form S diag(theta (1 - theta)) S (S = A + A^T). ``moments``: the
    estimator's exact moments (f, J, r, param) -> `pbexact.bias.Moments`."""
    from pbexact.bias import MultilinearExtension, QuadraticLoss, st_quadratic_bias
    from pbexact.instances import NNLoss

    closed_form = closed_form or st_quadratic_bias
    names = list(PARAMETRIZATIONS)
    worst_ml = worst_quad = 0.0
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        param = get_parametrization(names[int(rng.integers(len(names)))])
        theta = rng.uniform(0.05, 0.95, size=d)
        r = param.logits(theta)
        J = _random_table(rng, d)
        truth = param.chain(true_gradient(J, theta), r)
        m = moments(MultilinearExtension(J), J, r, param)
        worst_ml = max(worst_ml, float(np.abs(m.mean - truth).max() / np.abs(J).max()))
        A, b = rng.normal(size=(d, d)), rng.normal(size=d)
        quad = QuadraticLoss(A, b)
        Jq = quad.table()
        m = moments(quad, Jq, r, param)
        bias = m.mean - param.chain(true_gradient(Jq, theta), r)
        scale = np.abs(A).max() + np.abs(b).max()
        err = max(np.abs(bias - param.chain(closed_form(A, theta), r)).max(),
                  np.abs(m.variance - _st_variance_closed_form(A, theta, r, param)).max()
                  / scale)
        worst_quad = max(worst_quad, float(err / scale))
    below, ratios = 0, []
    param = get_parametrization("sigmoid")
    for k in range(nets):
        net = NNLoss(2 + k, int(rng.integers(2**31)))
        J = net.table()
        theta = rng.uniform(0.1, 0.9, size=net.d)
        r = param.logits(theta)
        truth = param.chain(true_gradient(J, theta), r)
        m = moments(net, J, r, param)
        ratio = float(np.linalg.norm(m.mean - truth) / np.linalg.norm(truth))
        ratios.append(ratio)
        below += int(ratio < ST_BIAS_FLOOR)
    sizes = f"{instances} instances, d=1..{max_d}, 4 parametrizations"
    return [
        _error_result("ch:other", "ST on theta unbiased on the multilinear extension: exact "
                      "E[g] (vertex enumeration) = true gradient", sizes, worst_ml, 1e-12),
        _error_result("ch:other", f"ST on theta biased on NNLoss (not multilinear): "
                      f"||b|| / ||grad|| >= {ST_BIAS_FLOOR:g} (worst: instances below)",
                      f"{nets} networks, d=2..{nets + 1}", below, 0, ratios=ratios),
        _error_result("ch:other", "ST bias on J = z^T A z + b^T z: enumeration = closed form "
                      "A_kk (2 theta_k - 1) dtheta/dr; variance = diag(S diag(theta(1-theta)) S)",
                      sizes, worst_quad, 1e-12),
    ]


def cp_relaxed_gradient(f: Any, r: np.ndarray, tau: float) -> np.ndarray:
    """CP's gradient d/dr f(sigmoid(r / tau)) at logits r (d,) (pbscale's ``cp_step``)."""
    from analysis.exact.bias import BIASED, Setting, per_sample

    return per_sample(BIASED["cp-anneal"], f, r, get_parametrization("sigmoid"),
                      Setting(tau=tau))[0]


def deceiving_squared_loss(z: Any) -> Any:
    """`ex:deceiving_squared` (`pbexact.continuation.DECEIVING_SQUARED`) as a batched torch loss
    (..., 1) -> (...), differentiable: 2 - 12.5 (z - 0.4)^2 below 0.4, 2 - (z - 0.4)^2 / 0.36
    above."""
    import torch

    from pbexact.continuation import DECEIVING_SQUARED

    (brk,), (c_lo, c_hi) = DECEIVING_SQUARED.breaks, DECEIVING_SQUARED.coeffs
    x = z[..., 0] - brk
    return torch.where(x < 0, c_lo[0] + c_lo[2] * x * x, c_hi[0] + c_hi[2] * x * x)


@_one_thread
def check_cp_relaxation(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    temperatures: int = 8,
    reference: Callable[[np.ndarray, np.ndarray, float], np.ndarray] | None = None,
    counter_example: Callable[[Any], Any] = deceiving_squared_loss,
) -> list[CheckResult]:
    """CP's relaxed gradient against the true gradient (`eq:sigmoid_cp`, `sec:pb_application`).

    (1) With the multilinear extension P_J, f(sigmoid(r / tau)) = E_{Bern(sigmoid(r/tau))}[J]
    (`eq:equivalence`), so CP's gradient equals ``reference`` (default
    `pbexact.bias.tempered_true_gradient`: the true gradient at theta = sigmoid(r / tau), by
    enumeration) at every tau of CP's schedule (1 to 1/200), on random tables and logits;
    the paper's limit J(sigmoid(x / tau)) -> J(1[x > 0]) is the tau -> 0 end of it.
    (2) The counter-example where J's extension is not multilinear: `ex:deceiving_squared`
    (``counter_example``) from CP's start r = 0 has sigmoid(0 / tau) = 1/2 > 0.4 for every tau,
    where its derivative is negative while J(1) - J(0) = 1 > 0: the relaxed gradient points
    against the true one (cosine -1) at every tau; ``worst`` counts the tau where it does not."""
    import torch

    from pbexact.bias import MultilinearExtension, tempered_true_gradient
    from pbexact.continuation import exponential_schedule

    reference = reference or tempered_true_gradient
    taus = exponential_schedule(temperatures)
    worst = 0.0
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        J = _random_table(rng, d)
        r = rng.normal(scale=2.0, size=d)
        f = MultilinearExtension(J)
        for tau in taus:
            want = reference(J, r, tau)
            got = cp_relaxed_gradient(f, r, tau)
            scale = np.abs(J).max() / (4 * tau)  # the largest the gradient can be
            worst = max(worst, float(np.abs(got - want).max() / scale))
    table = counter_example(torch.tensor([[0.0], [1.0]], dtype=torch.float64)).numpy()
    r = np.zeros(1)
    cosines = []
    for tau in taus:
        got = cp_relaxed_gradient(counter_example, r, tau)
        want = tempered_true_gradient(table, r, tau)
        cosines.append(float(np.sign(got @ want)))
    wrong_way = sum(c != -1.0 for c in cosines)
    return [
        _error_result("eq:sigmoid_cp", "CP's relaxed gradient d/dr P_J(sigmoid(r/tau)) = "
                      "grad_r E_{sigmoid(r/tau)}[J] (multilinear extension), every tau of the "
                      "schedule; error relative to max|J| / (4 tau)",
                      f"{instances} instances, d=1..{max_d}, {temperatures} tau from 1 to 1/200",
                      worst, 1e-12),
        _error_result("eq:sigmoid_cp", "counter-example ex:deceiving_squared (not multilinear):"
                      " from r = 0 the relaxed gradient opposes the true one at every tau "
                      "(worst: tau where it does not)", f"{temperatures} tau", wrong_way, 0,
                      cosines=cosines),
    ]


def rebar_relax_estimates(kind: str, f: Any, r: np.ndarray, u: Any, v: Any,
                          log_tau: float, eta: float) -> np.ndarray:
    """One REBAR or RELAX estimate per row of u, v (M, d) (pbscale's ``rebar_relax``) with its
    control's log tau and eta set (RELAX's network from seed 0): shape (M, d)."""
    import torch

    from analysis.exact.bias import BIASED, Setting, per_sample

    setting = Setting()
    control = setting.control(kind, r.shape[-1])
    with torch.no_grad():
        control.log_tau.fill_(log_tau)
        if control.eta is not None:
            control.eta.fill_(eta)
    return per_sample(BIASED[kind], f, r, get_parametrization("sigmoid"), setting, u, v)


@_one_thread
def check_hybrid_unbiased(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    samples: int,
    estimates: Callable[..., np.ndarray] = rebar_relax_estimates,
) -> CheckResult:
    """REBAR and RELAX (`ch:other`) are unbiased for any control: the mean of ``samples``
    estimates against the exact true gradient, per-coordinate z-tests with the sample standard
    error, Bonferroni over instances, coordinates and the two estimators; random multilinear
    tables, logits and control temperatures (log tau in [-1, 1], eta in [0.5, 1.5])."""
    import torch

    from pbexact.bias import BiasSummary, MultilinearExtension, mc_moments

    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    pvals = []
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        J = _random_table(rng, d)
        r = rng.normal(size=d)
        sigmoid = get_parametrization("sigmoid")
        truth = sigmoid.chain(true_gradient(J, sigmoid.theta(r)), r)
        for kind in ("rebar", "relax"):
            u = torch.rand((samples, d), generator=gen, dtype=torch.float64)
            v = torch.rand((samples, d), generator=gen, dtype=torch.float64)
            g = estimates(kind, MultilinearExtension(J), r, u, v, rng.uniform(-1, 1),
                          rng.uniform(0.5, 1.5))
            pvals.append(BiasSummary(mc_moments(g), truth).zero_bias_pvalue)
    level = ALPHA / len(pvals)
    p = float(min(pvals))
    return CheckResult("ch:other", "REBAR and RELAX unbiased: Monte Carlo mean = true gradient "
                       "(z-tests, Bonferroni over coordinates)",
                       f"{instances} instances x 2 estimators, d=1..{max_d}, {samples} samples",
                       p, level, "p-value", p >= level)
