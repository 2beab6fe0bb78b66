"""The checks of unwanted generalization (`sec:mc_bad_gen`, ``python -m analysis.theorems``):
`thm:mc_bad_gen_2` (the iff of the alignment threshold) and `cor:mc_bad_gen_2` (its rate in d,
with the command-line sizes of that study, :func:`check_corollary_sizes`), and
`ex:mc_bad_gen_1` (sampled SGD escapes a saddle the exact gradient cannot). Each returns a
:class:`analysis.exact.check_result.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from analysis.exact.check_result import CheckResult, error_result
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
from pbexact.errors import PBInputError
from pbexact.parametrizations import get_parametrization
from pbexact.polynomial import expected_loss, true_gradient
from pbexact.sampling import vertex_index
from pbexact.sgd import sgd

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
    return error_result(
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
    return error_result(
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
