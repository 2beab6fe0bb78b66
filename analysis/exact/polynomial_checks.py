"""The checks of the multilinear polynomial behind E_theta[J] (``python -m analysis.theorems``):
`eq:equivalence` (E_{z ~ Bern(theta)}[J(z)] = P_J(theta), by enumeration and by sampling) and
`thm:multilinear_hessian` (zero Hessian diagonal iff multilinear, with sympy and numerically).
Each returns a :class:`analysis.exact.check_result.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats

from analysis.exact.check_result import ALPHA, CheckResult, TableFn, error_result, random_table
from pbexact.polynomial import (
    expected_loss,
    moebius_value,
    moebius_weights,
    multilinear_value,
    vertex_probabilities,
)
from pbexact.sampling import sample_bernoulli, vertex_index
from pbexact.vertices import vertices

# ---------------------------------------------------------------------------------------------
# eq:equivalence
# ---------------------------------------------------------------------------------------------


def _random_theta(rng: np.random.Generator, d: int, edges: bool = True) -> np.ndarray:
    theta = rng.uniform(0, 1, size=d)
    if edges:
        # exact 0, 1 and 0.5 are where branches and 0^0 conventions live
        pick = rng.random(d)
        theta = np.where(pick < 0.1, 0.0, np.where(pick < 0.2, 1.0, theta))
        theta = np.where((pick >= 0.2) & (pick < 0.25), 0.5, theta)
    return theta


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
        J, theta = random_table(rng, d), _random_theta(rng, d)
        expect = expectation_by_enumeration(J, theta)
        for name, form in forms.items():
            err = abs(float(form(J, theta)) - float(expect)) / np.abs(J).max()
            worst[name] = max(worst[name], err)
    return error_result(
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
        J, theta = random_table(rng, d), _random_theta(rng, d, edges=False)
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
    return error_result(
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
        J = random_table(rng, d)
        x = rng.uniform(-2, 3, size=d)
        for i in range(d):
            e = np.zeros(d)
            e[i] = h
            second = (function(J, x + e) - 2 * function(J, x) + function(J, x - e)) / h**2
            worst = max(worst, abs(float(second)) / np.abs(J).max())
    return error_result(
        "thm:multilinear_hessian",
        "second difference of P_J along each axis at random real x is 0",
        f"{instances} instances, d=1..{max_d}",
        worst,
        1e-9,
    )
