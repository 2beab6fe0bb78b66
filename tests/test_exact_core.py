"""The exact core checked two independent ways: enumeration against closed form, closed form
against Monte Carlo, batch forms against iterative forms."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from _reference import D1_TABLE, D1_VARIANCES

from pbexact import estimators as est
from pbexact import variance
from pbexact.copula import arms_correlation, pattern_probabilities
from pbexact.errors import PBInputError, check_table, check_theta
from pbexact.parametrizations import PARAMETRIZATIONS, get_parametrization
from pbexact.polynomial import (
    entropy,
    expected_loss,
    flipped_expectation,
    moebius_gradient,
    moebius_value,
    moebius_weights,
    multilinear_value,
    true_gradient,
    vertex_probabilities,
)
from pbexact.sampling import IterativeDirichletCopula, copula_from_uniforms, vertex_index
from pbexact.variance import exact_moments, sample_estimates
from pbexact.vertices import multisets, permutation_counts, vertices

RNG = np.random.default_rng(20261125)
EDGE_THETAS = (1e-4, 0.5, 1 - 1e-4)


def test_vertices_follow_the_papers_order():
    np.testing.assert_array_equal(vertices(2), [[0, 0], [1, 0], [0, 1], [1, 1]])
    v = vertices(5)
    np.testing.assert_array_equal(vertex_index(v), np.arange(32))


def test_multiset_count_and_permutations():
    ms = multisets(16, 4)
    assert ms.shape == (3876, 4) == (math.comb(19, 4), 4)
    assert np.all(np.diff(ms, axis=1) >= 0)
    assert len({tuple(r) for r in ms}) == 3876
    assert permutation_counts(ms).sum() == 16**4
    # against itertools on a size where it is cheap
    ref = list(itertools.combinations_with_replacement(range(5), 3))
    np.testing.assert_array_equal(multisets(5, 3), np.array(ref))
    counts = [
        math.factorial(3) / math.prod(math.factorial(r.count(v)) for v in set(r)) for r in ref
    ]
    np.testing.assert_array_equal(permutation_counts(multisets(5, 3)), counts)


@pytest.mark.parametrize("d", [1, 3, 6])
def test_expectation_in_both_polynomial_forms(d):
    J = RNG.normal(size=2**d)
    theta = RNG.uniform(size=(7, d))
    direct = np.array([sum(J[h] * np.prod(np.where(vertices(d)[h] == 1, t, 1 - t))
                           for h in range(2**d)) for t in theta])
    np.testing.assert_allclose(expected_loss(J, theta), direct, rtol=1e-12)
    np.testing.assert_allclose(vertex_probabilities(theta) @ J, direct, rtol=1e-12)
    np.testing.assert_allclose(moebius_value(moebius_weights(J), theta), direct, rtol=1e-12)
    # the polynomial interpolates J at the vertices and extends past the cube
    np.testing.assert_allclose(multilinear_value(J, vertices(d)), J, atol=1e-12)
    x = RNG.normal(size=(4, d)) * 3
    np.testing.assert_allclose(multilinear_value(J, x), moebius_value(moebius_weights(J), x),
                               rtol=1e-10, atol=1e-10)


def test_gradient_against_finite_differences_and_moebius_form():
    d = 5
    J = RNG.normal(size=2**d)
    theta = RNG.uniform(0.05, 0.95, size=(3, d))
    g = true_gradient(J, theta)
    h = 1e-6
    fd = np.stack([(expected_loss(J, theta + h * e) - expected_loss(J, theta - h * e)) / (2 * h)
                   for e in np.eye(d)], axis=-1)
    np.testing.assert_allclose(g, fd, atol=1e-8)
    np.testing.assert_allclose(g, moebius_gradient(moebius_weights(J), theta), atol=1e-12)
    # exact also on the faces of the cube
    edge = np.array([0.0, 1.0, 0.5, 0.0, 1.0])
    np.testing.assert_allclose(true_gradient(J, edge), moebius_gradient(moebius_weights(J), edge),
                               atol=1e-12)


@pytest.mark.parametrize("d", [1, 4, 9])
def test_gradient_by_table_equals_gradient_by_contraction(d):
    from pbexact.polynomial import _gradient_by_contraction, _gradient_by_table

    J = RNG.normal(size=2**d)
    theta = RNG.uniform(size=(3, 5, d))
    theta[0, 0] = np.round(theta[0, 0])  # faces of the cube too
    np.testing.assert_allclose(_gradient_by_table(J, theta), _gradient_by_contraction(J, theta),
                               atol=1e-12)


@pytest.mark.parametrize("name", list(PARAMETRIZATIONS))
def test_parametrization_chain_rule_and_inverse(name):
    param = get_parametrization(name)
    d = 4
    J = RNG.normal(size=2**d)
    theta = RNG.uniform(0.1, 0.9, size=d)
    r = param.logits(theta)
    np.testing.assert_allclose(param.theta(r), theta, rtol=1e-12)
    grad_r = param.chain(true_gradient(J, theta), r)
    h = 1e-6
    def loss(rr):
        return expected_loss(J, param.theta(rr))

    fd = np.array([(loss(r + h * e) - loss(r - h * e)) / (2 * h) for e in np.eye(r.shape[0])])
    np.testing.assert_allclose(grad_r, fd, atol=1e-7)
    # score = grad_r log p, by finite differences at every vertex
    for z in vertices(d):
        def logp(rr, z=z):
            t = param.theta(rr)
            return np.sum(z * np.log(t) + (1 - z) * np.log(1 - t))
        fd = np.array([(logp(r + h * e) - logp(r - h * e)) / (2 * h) for e in np.eye(r.shape[0])])
        np.testing.assert_allclose(param.score(z, r), fd, atol=1e-6)


def test_score_is_zero_on_the_faces():
    z = np.array([1.0, 0.0])
    for name in PARAMETRIZATIONS:
        param = get_parametrization(name)
        if name == "sigmoid":
            r = np.array([800.0, -800.0])
        elif name == "cosine":
            r = np.array([np.pi, 0.0])
        elif name == "direct":
            r = np.array([1.0, 0.0])
        else:
            r = np.array([1.0, 0.0, 0.0, 1.0])
        assert set(np.round(param.theta(r), 12)) <= {0.0, 1.0}
        np.testing.assert_array_equal(param.score(z, r), 0.0)


def _random_logits(param, d):
    """Thetas with entries near 0, at 0.5 and near 1, plus random ones."""
    theta = RNG.uniform(0.02, 0.98, size=d)
    theta[: min(d, 3)] = EDGE_THETAS[: min(d, 3)]
    return param.logits(RNG.permutation(theta))


@pytest.mark.parametrize("d,n", [(3, 3), (2, 5)])
@pytest.mark.parametrize("name", list(PARAMETRIZATIONS))
def test_every_estimator_is_unbiased_by_enumeration(d, n, name):
    param = get_parametrization(name)
    for _ in range(3):
        J = RNG.normal(size=2**d)
        r = _random_logits(param, d)
        grad = param.chain(true_gradient(J, param.theta(r)), r)
        scale = max(1.0, np.abs(grad).max())
        for est_name, m in exact_moments(J, r, n, param).items():
            np.testing.assert_allclose(m.mean, grad, atol=1e-12 * scale, rtol=0, err_msg=est_name)


def test_d1_reference_values():
    J = np.array(D1_TABLE)
    for theta, values in D1_VARIANCES.items():
        r = np.array([math.log(theta / (1 - theta))])
        for (name, n), want in values.items():
            got = exact_moments(J, r, n, "sigmoid", (name,))[name].variance[0]
            # the reference values carry 4-5 significant digits
            assert got == pytest.approx(want, rel=1e-4, abs=1e-15), (theta, name, n)


@pytest.mark.parametrize("name", ["sigmoid", "escort"])
def test_enumerated_variance_matches_monte_carlo(name):
    """Within 4 standard errors of the Monte Carlo mean of (g - grad)^2 summed over logits."""
    param = get_parametrization(name)
    rng = np.random.default_rng(7)
    d, n, draws = 3, 3, 40_000
    J = rng.normal(size=2**d)
    r = param.logits(rng.uniform(0.2, 0.8, size=d))
    grad = param.chain(true_gradient(J, param.theta(r)), r)
    exact = exact_moments(J, r, n, param)
    for est_name, m in exact.items():
        g = sample_estimates(est_name, J, r, n, draws, rng, param)
        sq = ((g - grad) ** 2).sum(1)
        se = sq.std(ddof=1) / math.sqrt(draws)
        assert abs(sq.mean() - m.total_variance) < 4 * se, est_name



@pytest.mark.parametrize("offset", [0, 1000])
def test_enumeration_against_exact_rational_arithmetic(offset):
    """Variances of REINFORCE, LOORF and beta* (sigmoid logits, d=2, n=3) against a loop over all
    ordered sample tuples in exact fractions; J and theta are dyadic, so float64 holds them
    exactly and every difference is the implementation's rounding."""
    d, n = 2, 3
    Jq = [Fraction(int(k), 1024) + offset for k in RNG.integers(-2048, 2048, size=2**d)]
    th = [Fraction(int(k), 128) for k in RNG.integers(8, 120, size=d)]
    bits = [[(h >> i) & 1 for i in range(d)] for h in range(2**d)]
    p = [math.prod(th[i] if b[i] else 1 - th[i] for i in range(d)) for b in bits]
    expected = sum(ph * j for ph, j in zip(p, Jq))
    # d E / d r_i for sigmoid logits: E[J (z_i - theta_i)]
    grad = [sum(p[h] * Jq[h] * (bits[h][i] - th[i]) for h in range(2**d)) for i in range(d)]
    beta = [expected + (1 - 2 * th[i]) * grad[i] / (th[i] * (1 - th[i])) for i in range(d)]
    second = {k: [Fraction(0)] * d for k in ("reinforce", "loorf", "betastar")}
    for tup in itertools.product(range(2**d), repeat=n):
        prob = math.prod(p[h] for h in tup)
        js = [Jq[h] for h in tup]
        mean = sum(js) / n
        for i in range(d):
            s = [bits[h][i] - th[i] for h in tup]
            for name, g in (
                ("reinforce", sum(j * si for j, si in zip(js, s)) / n),
                ("loorf", sum((j - mean) * si for j, si in zip(js, s)) / (n - 1)),
                ("betastar", sum((j - beta[i]) * si for j, si in zip(js, s)) / n),
            ):
                second[name][i] += prob * g * g
    theta = np.array([float(t) for t in th])
    got = exact_moments(
        np.array([float(j) for j in Jq]), np.log(theta / (1 - theta)), n, "sigmoid",
        tuple(second),
    )
    for name, sq in second.items():
        want = np.array([float(sq[i] - grad[i] ** 2) for i in range(d)])
        np.testing.assert_allclose(got[name].variance, want, rtol=1e-11, err_msg=name)


@pytest.mark.parametrize("offset", [0.0, 1e3])
@pytest.mark.parametrize("name", ["sigmoid", "escort"])
def test_shared_sums_equal_estimates_on_materialized_scores(name, offset, monkeypatch):
    """exact_moments (multiset sums U, B shared by the estimators, several chunks) against each
    estimator evaluated on every multiset's scores built in full, weighted by the multiset's
    probability; the offset moves J far from 0, where U and B nearly cancel."""
    monkeypatch.setattr(variance, "CHUNK_ENTRIES", 500)
    param = get_parametrization(name)
    d, n = 3, 3
    J = RNG.normal(size=2**d) + offset
    r = _random_logits(param, d)
    theta = param.theta(r)
    ms = multisets(2**d, n)
    counts = permutation_counts(ms)
    S = param.score(vertices(d)[ms], r)  # (multisets, n, P)
    iid = counts * vertex_probabilities(theta)[ms].prod(1)
    q = pattern_probabilities(theta, n)
    ones = vertices(d)[ms].sum(1).astype(int)  # (multisets, d)
    copula = counts * q[np.arange(d), ones].prod(1)
    got = exact_moments(J, r, n, param)
    for est_name in est.estimators_for(n):  # every estimator sharing U and B (n odd: no pairs)
        g = variance.apply_estimator(
            est_name, J[ms], S, variance.estimator_extra(est_name, J, theta, n, param)
        )
        prob = copula if est.get_estimator(est_name).law == "copula" else iid
        scale = (prob @ g**2).max()
        np.testing.assert_allclose(got[est_name].mean, prob @ g, atol=1e-12 * scale**0.5)
        np.testing.assert_allclose(
            got[est_name].variance + got[est_name].mean ** 2, prob @ g**2, atol=1e-11 * scale
        )

def test_iterative_forms_equal_batch_forms():
    n, P = 9, 5
    J = RNG.normal(size=n)
    S = RNG.normal(size=(n, P))
    beta = RNG.normal(size=P)
    rho = RNG.uniform(-0.5, 0.2, size=P)
    extras = {"arms": rho, "betastar": beta, "disarm": rho}
    batch = {
        "reinforce": est.reinforce(J, S),
        "loorf": est.loorf(J, S),
        "arms": est.arms(J, S, rho),
        "betastar": est.baseline(J, S, beta),
    }
    # eq:loorf's first form, written out
    loo = sum((J[s] - (J.sum() - J[s]) / (n - 1)) * S[s] for s in range(n)) / n
    np.testing.assert_allclose(batch["loorf"], loo, rtol=1e-12)
    assert set(batch) == set(est.estimators_for(n))  # every estimator that takes n = 9
    for chunks in ([1] * n, [2, 3, 4], [n]):
        # the one accumulator of every estimator (`alg:iter_reinforce`, `alg:iter_loorf`,
        # `alg:iter_arms`), finished by each estimator's linear form
        sums = est.SampleSums()
        start = 0
        for k in chunks:
            sums.update(J[start : start + k], S[start : start + k])
            start += k
        for key in batch:
            got = sums.estimate(key, extras.get(key))
            np.testing.assert_allclose(got, batch[key], rtol=1e-12, atol=1e-14)
    # DisARM: pairs (2j, 2j + 1), chunks of whole pairs
    J, S = J[:8], S[:8]
    pairs = sum((J[2 * j] - J[2 * j + 1]) / 2 * (S[2 * j] - S[2 * j + 1]) for j in range(4)) / 4
    np.testing.assert_allclose(est.disarm(J, S, rho), pairs / (1 - rho), rtol=1e-12)
    for chunks in ([2] * 4, [4, 2, 2], [8]):
        sums = est.SampleSums(pairs=True)
        start = 0
        for k in chunks:
            sums.update(J[start : start + k], S[start : start + k])
            start += k
        np.testing.assert_allclose(sums.estimate("disarm", rho), pairs / (1 - rho), rtol=1e-12)


def test_iterative_copula_is_a_valid_dirichlet_copula():
    # the exponentials drawn one by one sum to the Gamma total, so the d^(s) sum to one
    rng = np.random.default_rng(3)
    n, d = 6, 4
    total = rng.gamma(n, 1.0, size=d)
    sampler = IterativeDirichletCopula(total, n)
    u_tilde = np.concatenate([sampler.next(rng.random((2, d))) for _ in range(3)])
    dirichlet = 1 - (1 - u_tilde) ** (1 / (n - 1))
    np.testing.assert_allclose(dirichlet.sum(0), 1.0, atol=1e-12)
    with pytest.raises(ValueError):
        sampler.next(rng.random((1, d)))
    orig = copula_from_uniforms(rng.random((n, d)))
    np.testing.assert_allclose((1 - (1 - orig) ** (1 / (n - 1))).sum(0), 1.0, atol=1e-12)


# tab:integral_closed as printed in the paper (variable c, see shared/paper/README.md), by ones
PAPER_TABLE_N4 = {
    0: [(0, "1/4", "-(4*c-1)**3"), ("1/4", 1, "0")],
    1: [(0, "1/4", "c*(37*c**2-21*c+3)"), ("1/4", "1/3", "-(3*c-1)**3"), ("1/3", 1, "0")],
    2: [(0, "1/4", "6*(1-3*c)*c**2"), ("1/4", "1/3", "46*c**3-42*c**2+12*c-1"),
        ("1/3", "1/2", "-(2*c-1)**3"), ("1/2", 1, "0")],
    3: [(0, "1/4", "6*c**3"), ("1/4", "1/3", "-58*c**3+48*c**2-12*c+1"),
        ("1/3", "1/2", "23*c**3-33*c**2+15*c-2"), ("1/2", 1, "-(c-1)**3")],
    4: [(0, "1/4", "0"), ("1/4", "1/3", "(4*c-1)**3"), ("1/3", "1/2", "-44*c**3+60*c**2-24*c+3"),
        ("1/2", 1, "4*c**3-12*c**2+12*c-3")],
}


def test_symbolic_table_agrees_with_the_paper():
    import sympy as sp

    from pbexact.copula import symbolic_pattern_table

    c = sp.Symbol("c")
    rows = symbolic_pattern_table(4)
    for row in rows:
        paper = PAPER_TABLE_N4[row["ones"]]
        assert len(row["pieces"]) == len(paper)
        for piece, (lo, hi, expr) in zip(row["pieces"], paper):
            assert piece["lo"] == sp.Rational(lo) and piece["hi"] == sp.Rational(hi)
            assert sp.expand(piece["expr"] - sp.sympify(expr, locals={"c": c})) == 0
    # and the symbolic table equals the numeric inclusion-exclusion at theta > 0.5
    theta = np.linspace(0.501, 0.999, 60)
    cs = 1 - (1 - theta) ** (1 / 3)
    q = pattern_probabilities(theta, 4)
    for row in rows:
        f = sp.Piecewise(*[(p["expr"], c < p["hi"]) for p in row["pieces"][:-1]],
                         (row["pieces"][-1]["expr"], True))
        vals = np.array([float(f.subs(c, x)) for x in cs])
        np.testing.assert_allclose(q[:, row["ones"]], vals, atol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 10])
def test_copula_probabilities_are_a_distribution(n):
    # the paper's code went negative for max(theta, 1-theta) in (0.578, 0.875) at n=4
    theta = np.concatenate([np.linspace(0, 1, 2001), [0.5, 0.578, 0.7, 0.875]])
    q = pattern_probabilities(theta, n)
    assert q.min() >= 0
    total = sum(math.comb(n, k) * q[:, k] for k in range(n + 1))
    np.testing.assert_allclose(total, 1.0, atol=1e-12)
    marginal = sum(math.comb(n - 1, k - 1) * q[:, k] for k in range(1, n + 1))
    np.testing.assert_allclose(marginal, theta, atol=1e-12)


def test_copula_probabilities_agree_with_sampling():
    """Counts of ones per dimension against C(n,k) q_k: a chi-square test at level 1e-3 on the
    cells expected at least 5 times, a Poisson bound at the same level on the rarer ones."""
    from scipy.stats import chisquare, poisson

    from pbexact.sampling import sample_arms

    rng = np.random.default_rng(11)
    n, draws = 4, 60_000
    theta = np.array([0.3, 0.5, 0.6, 0.7, 0.8, 0.9])  # 0.6-0.875 is where the paper's code failed
    z = sample_arms(theta, n, (draws,), rng)
    ones = z.sum(1).astype(int)  # (draws, d)
    q = pattern_probabilities(theta, n)
    for i in range(theta.shape[0]):
        expected = np.array([math.comb(n, k) * q[i, k] for k in range(n + 1)]) * draws
        observed = np.bincount(ones[:, i], minlength=n + 1)
        keep = expected >= 5
        assert observed[expected == 0].sum() == 0
        assert observed[~keep].sum() <= poisson.ppf(1 - 1e-3, expected[~keep].sum()), theta[i]
        obs, exp = observed[keep], expected[keep]
        assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3, theta[i]
    # rho is the correlation of two samples of one dimension
    zz = z[:, 0, :] * z[:, 1, :]
    corr = (zz.mean(0) - theta**2) / (theta * (1 - theta))
    np.testing.assert_allclose(corr, arms_correlation(theta, n), atol=0.02)


def test_beta_star_is_the_flipped_expectation():
    d = 3
    J = RNG.normal(size=2**d)
    theta = RNG.uniform(0.1, 0.9, size=d)
    v = vertices(d)
    p = vertex_probabilities(theta)
    for i in range(d):
        flipped = v.copy()
        flipped[:, i] = 1 - flipped[:, i]
        assert flipped_expectation(J, theta)[i] == pytest.approx(p @ J[vertex_index(flipped)])


def test_entropy():
    assert entropy(np.array([0.5, 0.5])) == pytest.approx(2 * math.log(2))
    assert entropy(np.array([0.0, 1.0])) == 0.0


def test_bad_input_is_named():
    with pytest.raises(PBInputError, match=r"theta must lie in \[0, 1\]"):
        check_theta([0.2, 1.5])
    with pytest.raises(PBInputError, match="NaN or inf at h=2"):
        check_table([0.0, 1.0, np.nan, 2.0])
    with pytest.raises(PBInputError, match="2\\^d entries"):
        check_table(np.zeros(6))
    with pytest.raises(PBInputError, match="d=3 needs 8"):
        expected_loss(np.zeros(4), np.full(3, 0.5))
    with pytest.raises(PBInputError, match="LOORF needs n >= 2"):
        exact_moments(np.zeros(4), np.zeros(2), 1, "sigmoid", ("loorf",))
    with pytest.raises(PBInputError, match="ARMS needs n >= 2"):
        exact_moments(np.zeros(4), np.zeros(2), 1, "sigmoid", ("arms",))
    with pytest.raises(PBInputError, match=r"needs about .* over the limit .* --method closed"):
        multisets(2**10, 10)
    with pytest.raises(PBInputError, match="unknown parametrization"):
        get_parametrization("tanh")
    with pytest.raises(PBInputError, match="unknown estimator"):
        est.check_estimator("rebar")
    with pytest.raises(PBInputError, match="constant rho; .*estimator_extra"):
        est.linear_estimate("arms", np.zeros((2, 3)))
    # the fast paths of the checks: NaN fails both bounds; a sum that overflows is no NaN
    with pytest.raises(PBInputError, match="NaN or inf"):
        check_theta([0.2, np.nan])
    with pytest.raises(PBInputError, match="got -0.1"):
        check_theta([0.3, -0.1])
    with pytest.raises(PBInputError, match="theta has 2 entries"):
        check_theta([0.3, 0.1], d=3)
    np.testing.assert_array_equal(check_table([1e308, 1e308]), [1e308, 1e308])


def test_theta_one_half_takes_the_lower_branch_everywhere():
    """theta = 0.5 exactly: z~ = 1[1 - u~ <= theta], so with n=4 and c = F^{-1}(0.5) ~ 0.206 all
    four samples can be 1 (every d > c) but never all 0 (every d < c is impossible)."""
    from pbexact.copula import arms_bits
    from pbexact.sampling import sample_arms

    q = pattern_probabilities(np.array([0.5]), 4)[0]
    assert q[0] < 1e-15 and q[4] > 1e-3  # q[0] is zero up to inclusion-exclusion round-off
    z = sample_arms(np.array([0.5]), 4, (20_000,), np.random.default_rng(5))
    ones = z.sum(1)[:, 0]
    assert (ones == 0).sum() == 0 and (ones == 4).sum() > 0
    # the bit map itself: u~ = 0.5 is a 1 under the lower branch (1 - 0.5 <= 0.5)
    assert arms_bits(np.array([[0.5]]), np.array([0.5]))[0, 0] == 1.0
    assert arms_correlation(np.array([0.5]), 4)[0] == pytest.approx(
        (max(0.0, 2 * 0.5 ** (1 / 3) - 1) ** 3 - 0.25) / 0.25
    )


def test_large_d_takes_the_contraction_path_and_agrees():
    """d = 15 is past the table path's limit: E[J] and the gradient by O(2^d)-memory contractions
    agree with the subset (Moebius) form."""
    d = 15
    J = RNG.normal(size=2**d)
    theta = RNG.uniform(size=(2, d))
    w = moebius_weights(J)
    np.testing.assert_allclose(expected_loss(J, theta), moebius_value(w, theta), rtol=1e-9)
    np.testing.assert_allclose(true_gradient(J, theta), moebius_gradient(w, theta), atol=1e-9)
