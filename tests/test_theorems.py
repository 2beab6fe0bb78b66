"""`python -m analysis.theorems` at small sizes: every check passes on the paper's formulas and
fails on a deliberately wrong one. Fixed seeds; tolerances are the checks' own."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis import theorems
from analysis.exact.bad_generalization_checks import (
    MC_BAD_GEN_1,
    check_cor_mc_bad_gen_2,
    check_ex_mc_bad_gen_1,
    check_mc_bad_gen_2,
)
from analysis.exact.bias_checks import (
    ST_BIAS_FLOOR,
    check_cp_relaxation,
    check_hybrid_unbiased,
    check_st_bias,
    deceiving_squared_loss,
    rebar_relax_estimates,
    st_theta_moments,
)
from analysis.exact.check_result import CheckResult
from analysis.exact.estimator_checks import (
    check_arms_correlation,
    check_arms_iterative,
    check_arms_unbiased,
    check_bstar,
    check_multisets,
)
from analysis.exact.polynomial_checks import (
    check_equivalence,
    check_equivalence_mc,
    check_multilinear_hessian_numeric,
    check_multilinear_hessian_symbolic,
    sympy_multilinear,
)
from pbexact.bad_generalization import mc_bad_gen_table
from pbexact.copula import arms_correlation
from pbexact.parametrizations import get_parametrization
from pbexact.polynomial import (
    flipped_expectation,
    multilinear_value,
    true_gradient,
    vertex_probabilities,
)
from pbexact.vertices import permutation_counts, vertices


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_equivalence_passes_and_fails_on_a_perturbed_form():
    assert check_equivalence(rng(), 30, 5).passed
    bad = {"perturbed": lambda J, t: multilinear_value(J, t) + 1e-6 * np.abs(J).max()}
    assert not check_equivalence(rng(), 30, 5, forms=bad).passed


def test_equivalence_mc_passes_and_fails_on_a_biased_polynomial():
    assert check_equivalence_mc(rng(), 5, 4, 4000).passed
    biased = lambda J, t: multilinear_value(J, t) + 0.2 * np.abs(J).max()  # noqa: E731
    assert not check_equivalence_mc(rng(), 5, 4, 4000, polynomial=biased).passed


def test_hessian_symbolic_passes_and_fails_on_a_squared_variable():
    assert check_multilinear_hessian_symbolic(rng(), 6, 3).passed

    def squared(J, xs):
        return sympy_multilinear(J, xs) + xs[0] ** 2  # not multilinear

    res = check_multilinear_hessian_symbolic(rng(), 6, 3, builder=squared)
    assert not res.passed and res.detail["failures"]["multilinear"] == 6


def test_hessian_numeric_passes_and_fails_on_a_squared_variable():
    assert check_multilinear_hessian_numeric(rng(), 20, 5).passed

    def squared(J, x):
        return multilinear_value(J, x) + 0.01 * np.abs(J).max() * x[..., 0] ** 2

    assert not check_multilinear_hessian_numeric(rng(), 20, 5, function=squared).passed


def test_bstar_passes_and_fails_on_perturbed_formulas():
    one, two = check_bstar(rng(), 4, 3, 3)
    assert one.passed and two.passed
    shifted = lambda J, t: flipped_expectation(J, t) + 1e-3 * np.abs(J).max()  # noqa: E731
    one, two = check_bstar(rng(), 4, 3, 3, closed_form=shifted)
    assert one.passed and not two.passed

    def unsquared(theta, i):  # p * score instead of p * score^2: not the Fisher integrand
        score = get_parametrization("direct").score(vertices(theta.size), theta)[:, i]
        q = vertex_probabilities(theta) * np.abs(score)
        return q / q.sum()

    one, _ = check_bstar(rng(), 4, 3, 3, q_builder=unsquared)
    assert not one.passed


def test_mc_bad_gen_2_passes_and_fails_on_a_wrong_threshold():
    res = check_mc_bad_gen_2(rng(), 15, 4)
    assert res.passed and res.detail["near_equality"] > 0 and res.detail["exact_equalities"] > 0

    def all_coordinates(d, p_star, M0, dM):  # prod over every j, including i
        return np.full(d, M0 - dM / (d * np.prod(p_star)))

    assert not check_mc_bad_gen_2(rng(), 15, 4, threshold=all_coordinates).passed


def test_cor_mc_bad_gen_2_passes_and_fails_on_a_wrong_table():
    res = check_cor_mc_bad_gen_2(10, 0.25)
    assert res.passed
    assert res.detail["c_fit"] == pytest.approx(4 / 3, rel=1e-9)
    assert res.detail["binding_from_d"] == 9

    def undivided(d, z_star, m, M0, dM):  # steps of dM instead of dM / d
        return mc_bad_gen_table(d, z_star, m, M0, dM * d)

    assert not check_cor_mc_bad_gen_2(10, 0.25, table=undivided).passed


def test_ex_mc_bad_gen_1_passes_and_fails_off_the_saddle():
    res = check_ex_mc_bad_gen_1(rng(), 40, steps=300)
    assert res.passed
    assert res.detail["escaped_fraction"]["reinforce_shifted"] == 0.0
    tilted = MC_BAD_GEN_1 + np.array([0.0, 0.0, 0.0, 0.3])
    assert not check_ex_mc_bad_gen_1(rng(), 40, steps=300, J=tilted).passed


def test_arms_iterative_passes_and_fails_on_a_wrong_exponent():
    assert check_arms_iterative(rng(), 4000, ns=(2, 4)).passed

    def fixed_exponent(total, u, n):  # U^(1/(n-1)) at every step, not U^(1/(n-s))
        remaining, rows = total * 1.0, []
        for s in range(1, n + 1):
            e = remaining * (1 - u[s - 1] ** (1.0 / (n - 1))) if s < n else remaining
            remaining = remaining - e
            rows.append(1 - (1 - e / total) ** (n - 1))
        return np.stack(rows)

    assert not check_arms_iterative(rng(), 4000, ns=(2, 4), sampler=fixed_exponent).passed


def test_arms_correlation_and_unbiasedness_fail_on_a_wrong_rho():
    assert check_arms_correlation(rng(), 10, 6).passed
    assert check_arms_unbiased(rng(), 6, 3, 3).passed
    wrong = lambda theta, n: arms_correlation(theta, n) * 0.99  # noqa: E731
    assert not check_arms_correlation(rng(), 10, 6, rho=wrong).passed
    assert not check_arms_unbiased(rng(), 6, 3, 3, rho=wrong).passed


def test_multisets_pass_and_fail_on_wrong_counts():
    assert check_multisets(rng(), 2, 3).passed
    assert not check_multisets(rng(), 2, 3, count=lambda k, n: math.comb(k + n, n)).passed
    plus_one = lambda ms: permutation_counts(ms) + 1  # noqa: E731
    assert not check_multisets(rng(), 2, 3, orderings=plus_one).passed


def test_st_bias_checks_pass_and_fail_on_wrong_formulas():
    unbiased, nnloss, quadratic = check_st_bias(rng(), 8, 4)
    assert unbiased.passed and nnloss.passed and quadratic.passed
    assert min(nnloss.detail["ratios"]) > ST_BIAS_FLOOR

    def half(A, theta):  # A_kk (theta_k - 1/2): the factor 2 dropped
        return np.diag(A) * (theta - 0.5)

    assert not check_st_bias(rng(), 8, 4, nets=0, closed_form=half)[2].passed

    def without_chain(f, J, r, param):  # the microworld's ST: dJ/dz taken as dJ/dr
        from analysis.exact.bias import BIASED, Setting, estimator_moments
        from pbexact.bias import Moments

        sigmoid = get_parametrization("sigmoid")
        m = estimator_moments(BIASED["st"], f, J, sigmoid.logits(param.theta(r)), sigmoid,
                              Setting())
        return Moments(param.expand(m.mean), param.expand(m.variance))

    assert not check_st_bias(rng(), 8, 4, nets=0, moments=without_chain)[0].passed

    def multilinear_nets(f, J, r, param):  # the net's table through P_J: no bias left
        from pbexact.bias import MultilinearExtension

        return st_theta_moments(MultilinearExtension(J), J, r, param)

    assert not check_st_bias(rng(), 2, 3, nets=2, moments=multilinear_nets)[1].passed


def test_cp_relaxation_checks_pass_and_fail_on_wrong_formulas():
    exact, counter = check_cp_relaxation(rng(), 6, 4)
    assert exact.passed and counter.passed and counter.detail["cosines"] == [-1.0] * 8

    def sigmoid_gradient(J, r, tau):  # "CP's gradient is the true gradient at sigmoid(r)"
        s = 1 / (1 + np.exp(-r))
        return true_gradient(J, s) * s * (1 - s)

    assert not check_cp_relaxation(rng(), 6, 4, reference=sigmoid_gradient)[0].passed
    from pbexact.bias import MultilinearExtension

    table = deceiving_squared_loss(th_torch_vertices()).numpy()
    ml = MultilinearExtension(table)  # P_J of the same two values: no counter-example left
    assert not check_cp_relaxation(rng(), 2, 2, counter_example=ml)[1].passed


def th_torch_vertices():
    import torch

    return torch.tensor([[0.0], [1.0]], dtype=torch.float64)


def test_hybrid_unbiasedness_passes_and_fails_on_a_wrong_conditional_sample():
    assert check_hybrid_unbiased(rng(), 3, 3, 3000).passed

    def same_uniforms(kind, f, r, u, v, log_tau, eta):  # z~ from u itself, not a fresh v
        return rebar_relax_estimates(kind, f, r, u, u, log_tau, eta)

    assert not check_hybrid_unbiased(rng(), 3, 3, 3000, estimates=same_uniforms).passed


def test_cli_writes_tables_and_exits_zero(tmp_path, capsys):
    argv = ["--instances", "4", "--max-d", "3", "--max-n", "3", "--samples", "2000",
            "--cor-max-d", "8", "--runs", "30", "--no-progress", "--out", str(tmp_path)]
    assert theorems.main(argv) == 0
    rows = json.loads((tmp_path / "theorems.json").read_text())
    labels = {r["label"] for r in rows}
    assert {"eq:equivalence", "thm:multilinear_hessian", "thm:bStarOne", "thm:bStarTwo",
            "thm:mc_bad_gen_2", "cor:mc_bad_gen_2", "ex:mc_bad_gen_1", "sec:arms_iter_proof",
            "alg:orig_arms", "eq:n_multisets", "ch:other", "eq:sigmoid_cp"} <= labels
    assert all({"label", "check", "worst", "passed"} <= set(r) for r in rows)
    assert all(r["passed"] for r in rows)
    assert "| label |" in (tmp_path / "theorems.md").read_text()
    assert "cor:mc_bad_gen_2" in capsys.readouterr().out


def test_only_runs_the_named_checks_with_the_full_runs_generators(tmp_path, capsys):
    argv = ["--instances", "4", "--max-d", "3", "--max-n", "3", "--samples", "2000",
            "--cor-max-d", "8", "--runs", "30", "--no-progress", "--out", str(tmp_path),
            "--only", "thm:bStarTwo", "eq:n_multisets"]
    assert theorems.main(argv) == 0
    rows = json.loads((tmp_path / "theorems.json").read_text())
    assert [r["label"] for r in rows] == ["thm:bStarTwo", "eq:n_multisets"]
    # the same numbers as in the full run: the k-th check gets the k-th spawned generator
    gens = [np.random.default_rng(x) for x in np.random.SeedSequence(0).spawn(12)]
    want = check_bstar(gens[4], 4, 3, 3)[1]
    assert rows[0]["worst"] == want.worst and rows[0]["sizes"] == want.sizes
    assert rows[1]["worst"] == check_multisets(gens[11], 3, 3).worst
    assert "cor:mc_bad_gen_2" not in capsys.readouterr().out  # its fit table only when it ran
    assert theorems.run(theorems.main, ["--only", "thm:nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--only" in err[0] and "thm:bStarOne" in err[0]


def test_cli_bad_input_is_one_line_and_exit_2(capsys):
    assert theorems.run(theorems.main, ["--epsilon", "1.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_bad_generalization_module_threshold_two_ways():
    """pbexact.bad_generalization: the largest aligned m (root of the exact alignment, affine in
    m) equals the smallest closed-form threshold of `eq:mc_bad_gen_inner`."""
    from pbexact import bad_generalization as bg

    r = np.random.default_rng(4)
    for d in (2, 3, 5):
        z_star = r.integers(0, 2, size=d).astype(float)
        p_star = r.uniform(0.4, 0.95, size=d)
        theta = np.where(z_star == 1, p_star, 1 - p_star)
        got = bg.largest_aligned_m(d, theta, z_star, 1.5, 2.0)
        want = bg.mc_bad_gen_threshold(d, p_star, 1.5, 2.0).min()
        assert got == pytest.approx(want, rel=1e-10)
        assert np.all(bg.alignment(bg.mc_bad_gen_table(d, z_star, want - 1e-3, 1.5, 2.0),
                                   theta, z_star) >= 0)


def test_console_table_fits_the_terminal_and_cuts_nothing():
    """Issue 42: the table was about 200 columns wide. At any width from 72 it fits, and every
    word of each check's description is still there (wrapped, not cut)."""
    long = CheckResult("eq:label", "a check whose description runs on " * 6, "d <= 6, "
                       "instances 300, samples 20000, n <= 4", 1e-12, 1e-9, "error", True)
    for width in (72, 100, 140):
        text = theorems.format_table([long], width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        assert " ".join(text.split()).count("runs on") == 6
