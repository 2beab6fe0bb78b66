"""Closed-form variances (`pbexact.closed_form`) against multiset enumeration, Monte Carlo and the
d=1 reference values of the exact-core issue."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from _reference import D1_TABLE, D1_VARIANCES

from pbexact.closed_form import closed_form_moments, pair_kernels, subset_patterns
from pbexact.copula import pattern_probabilities
from pbexact.errors import PBInputError
from pbexact.estimators import ESTIMATORS, estimators_for
from pbexact.instances import benchmark_table
from pbexact.parametrizations import PARAMETRIZATIONS, get_parametrization
from pbexact.variance import exact_moments, sample_estimates

SIZES = [(d, n) for d in range(1, 5) for n in range(1, 5)] + [(2, 6), (3, 5), (1, 10)]


def _thetas(d: int, rng: np.random.Generator) -> np.ndarray:
    """Random thetas with 0.5, near 0 and near 1 mixed in (0.5 takes the copula's lower branch)."""
    th = rng.uniform(0.05, 0.95, size=d)
    special = np.array([0.5, 1e-3, 1 - 1e-3, 0.3])
    th[: min(d, 4)] = rng.permutation(special)[: min(d, 4)]
    return th


def _agree(closed: np.ndarray, enum: np.ndarray, second: np.ndarray) -> bool:
    """1e-10 relative, except where the variance is a cancellation E[g^2] - E[g]^2 far below
    E[g^2] (exact zeros, e.g. ARMS at n=2, theta=0.5): there the enumeration itself only holds
    ~1e-15 E[g^2] and the closed form ~1e-13 E[g^2] (its terms, weighted by scores up to
    1/theta, cancel), so the floor is 1e-12 E[g^2]."""
    return bool(np.all(np.abs(closed - enum) <= 1e-10 * np.abs(enum) + 1e-12 * second))


@pytest.mark.parametrize("param_name", list(PARAMETRIZATIONS))
@pytest.mark.parametrize("d,n", SIZES)
def test_equals_enumeration(param_name: str, d: int, n: int) -> None:
    rng = np.random.default_rng(1000 * d + n)
    param = get_parametrization(param_name)
    names = estimators_for(n)  # n = 1: REINFORCE and beta*; DisARM at even n
    for _ in range(2):
        J = rng.normal(size=2**d) + rng.normal()  # a nonzero mean exercises the centring
        r = param.logits(_thetas(d, rng))
        enum = exact_moments(J, r, n, param, names)
        closed = closed_form_moments(J, r, n, param, names)
        for k in names:
            second = enum[k].variance + enum[k].mean ** 2
            assert _agree(closed[k].variance, enum[k].variance, second), (k, d, n)
            assert np.allclose(closed[k].mean, enum[k].mean, rtol=1e-10, atol=1e-13), (k, d, n)


def test_boundary_theta_gives_zero_variance() -> None:
    """theta_i in {0, 1} freezes the bit: its score, hence every estimate, is zero."""
    J = np.random.default_rng(0).normal(size=8)
    r = np.array([0.0, 0.4, 1.0])  # direct parametrization: theta = r
    closed = closed_form_moments(J, r, 4, "direct")
    enum = exact_moments(J, r, 4, "direct")
    for k in ESTIMATORS:
        assert closed[k].variance[0] == 0 and closed[k].variance[2] == 0
        assert np.allclose(closed[k].variance, enum[k].variance, rtol=1e-10, atol=1e-15)


def test_subset_patterns_are_the_copula_marginals() -> None:
    """Marginalising the all-n pattern table of `pbexact.copula` to m samples gives the same law."""
    theta = np.array([0.5, 0.2, 0.8, 0.999])
    n = 6
    full = pattern_probabilities(theta, n)  # (d, n+1) by number of ones
    for m in (1, 2, 3, 4):
        q = subset_patterns(theta, n, m)
        assert np.allclose(q.sum(-1), 1.0, atol=1e-14)
        for w in range(2**m):
            k = bin(w).count("1")
            # the other n - m samples: j more ones among them, C(n-m, j) orderings each
            marg = sum(comb(n - m, j) * full[:, k + j] for j in range(n - m + 1))
            assert np.allclose(q[:, w], marg, rtol=1e-12, atol=1e-15)
    assert np.allclose(subset_patterns(theta, n, 1)[:, 1], theta, rtol=1e-13)


def test_subset_patterns_stable_for_large_n() -> None:
    theta = np.array([0.5, 0.01, 0.3, 0.7, 0.99])
    for n in (100, 1000, 10_000):
        q = subset_patterns(theta, n, 4)
        assert np.all(q >= 0) and np.allclose(q.sum(-1), 1.0, atol=1e-12)
        assert np.allclose(q.reshape(5, 2, 8).sum(-1)[:, 1], theta, rtol=1e-10)


def test_pair_kernels_match_dense_bilinear_form() -> None:
    rng = np.random.default_rng(3)
    d = 5
    J = rng.normal(size=2**d)
    pair = rng.uniform(size=(d, 2, 2))
    dense = np.ones((1, 1))
    for j in reversed(range(d)):  # bit j of h is the (d-1-j)-th Kronecker factor
        dense = np.kron(dense, pair[j])
    h = np.arange(2**d)
    kern = pair_kernels(J, pair)
    for i in range(d):
        for a in range(2):
            for b in range(2):
                masked = dense / np.kron(np.ones((2**(d - 1 - i), 2**(d - 1 - i))), np.kron(
                    pair[i], np.ones((2**i, 2**i))))
                sel_x = ((h >> i) & 1) == a
                sel_y = ((h >> i) & 1) == b
                want = J[sel_x] @ masked[np.ix_(sel_x, sel_y)] @ J[sel_y]
                assert np.isclose(kern[i, a, b], want, rtol=1e-12)


@pytest.mark.parametrize("theta", list(D1_VARIANCES))
def test_d1_reference_values(theta: float) -> None:
    J = np.array(D1_TABLE)
    r = get_parametrization("sigmoid").logits(np.array([theta]))
    for (name, n), want in D1_VARIANCES[theta].items():
        got = closed_form_moments(J, r, n, "sigmoid", (name,))[name].variance[0]
        # the references carry 4-7 significant digits
        assert got == pytest.approx(want, rel=5e-4, abs=1e-15), (name, n, got)


@pytest.mark.parametrize("where", ["middle", "near_0_and_1"])
def test_equals_monte_carlo_at_d10_n10(where: str) -> None:
    """10^5 estimator draws per estimator at d=10, n=10 on ExponentialTabularLoss, fixed seed:
    the total variance lies within 4 standard errors of the MC mean of ||g - E g||^2. Near 0 and
    1 is where the trajectories end and beta*'s variance falls far below grad^2."""
    d, n, draws = 10, 10, 100_000
    J = benchmark_table("exponential", d, 0)
    rng = np.random.default_rng(7)
    if where == "middle":
        theta = rng.uniform(0.2, 0.8, size=d)
    else:
        theta = np.where(rng.random(d) < 0.5, 1, 0) + rng.uniform(0.002, 0.05, size=d) * np.where(
            rng.random(d) < 0.5, 1, -1)
        theta = np.clip(theta, 0.002, 0.998)
    r = get_parametrization("sigmoid").logits(theta)
    closed = closed_form_moments(J, r, n)
    for k in ESTIMATORS:
        g = sample_estimates(k, J, r, n, draws, rng)
        sq = ((g - closed[k].mean) ** 2).sum(-1)
        se = sq.std(ddof=1) / np.sqrt(draws)
        assert abs(sq.mean() - closed[k].total_variance) < 4 * se, (k, sq.mean(), se)


def test_n_in_the_thousands_is_finite_and_shrinks() -> None:
    J = np.random.default_rng(5).normal(size=2**6)
    r = np.random.default_rng(6).normal(size=6)
    v = [closed_form_moments(J, r, n)["arms"].total_variance for n in (10, 100, 1000)]
    assert all(np.isfinite(v)) and v[0] > v[1] > v[2] > 0
    # beyond the first orders the variance falls like 1/n
    assert 5 < v[1] / v[2] < 20


def test_bad_input() -> None:
    J = np.zeros(4)
    with pytest.raises(PBInputError):
        closed_form_moments(J, np.zeros(2), 1, "sigmoid", ("loorf",))
    with pytest.raises(PBInputError):
        closed_form_moments(np.zeros(5), np.zeros(2), 2)
    with pytest.raises(PBInputError):
        closed_form_moments(J, np.zeros((2, 2)), 2)
    with pytest.raises(PBInputError):
        closed_form_moments(J, np.zeros(2), 2, "nope")


def test_cli_methods_agree_and_auto_picks_by_size(tmp_path) -> None:
    from analysis import variance_compare
    from analysis.exact import variance

    assert variance.resolve_method("auto", 4, 4) == "enumerate"  # the paper's 3,876 multisets
    assert variance.resolve_method("auto", 10, 10) == "closed"
    assert variance.resolve_method("mc", 10, 10) == "mc"
    J = benchmark_table("exponential", 3, 1)
    enum = variance.variance_trajectory(J, 3, steps=20, log_every=10, method="enumerate")
    closed = variance.variance_trajectory(J, 3, steps=20, log_every=10, method="closed")
    assert [list(r) for r in enum] == [list(r) for r in closed]  # same CSV columns
    for e, c in zip(enum, closed):
        assert e["var_disarm"] is None and c["var_disarm"] is None  # blank: n = 3 is odd
        for k in estimators_for(3):
            assert c[f"var_{k}"] == pytest.approx(e[f"var_{k}"], rel=1e-10, abs=1e-14)
    rc = variance_compare.main(["--d", "3", "--n", "3", "--steps", "20", "--log-every", "10",
                                "--draws", "2000", "--benchmark", "exponential",
                                "--out", str(tmp_path), "--figures", str(tmp_path / "fig")])
    assert rc == 0
    stem = "exponential_d3_n3_variance_exact_vs_mc"
    assert (tmp_path / "fig" / f"{stem}.png").stat().st_size > 0
    header = (tmp_path / f"{stem}.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["step", "var_reinforce", "mc_reinforce", "relerr_reinforce"]


def test_large_n_equals_monte_carlo() -> None:
    """n = 100 is out of enumeration's reach; 4 standard errors of 2 x 10^4 MC draws, fixed seed."""
    rng = np.random.default_rng(3)
    J, r, n, draws = rng.normal(size=8), rng.normal(size=3), 100, 20_000
    closed = closed_form_moments(J, r, n)
    for k in ("loorf", "arms"):
        sq = ((sample_estimates(k, J, r, n, draws, rng) - closed[k].mean) ** 2).sum(-1)
        se = sq.std(ddof=1) / np.sqrt(draws)
        assert abs(sq.mean() - closed[k].total_variance) < 4 * se, (k, sq.mean(), se)
