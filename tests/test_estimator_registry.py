"""The estimator registry (`pbexact.estimators.REGISTRY`), DisARM added through it alone, and the
gradient as a surrogate loss (`pbscale.methods.mc_surrogate`).

DisARM (Dong, Mnih and Tucker, 2020) is checked against its paper form, for unbiasedness and
exact variance by enumeration (two ways: the pair enumeration of `pbexact.variance` and a brute
loop over ordered tuples of pairs), against the closed form, and in pbscale on identical samples.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from pbexact import estimators as E
from pbexact.closed_form import closed_form_moments, has_closed_form
from pbexact.copula import antithetic_correlation, antithetic_pair_law
from pbexact.errors import PBInputError
from pbexact.parametrizations import PARAMETRIZATIONS, get_parametrization
from pbexact.polynomial import true_gradient
from pbexact.sampling import sample_antithetic, vertex_index
from pbexact.variance import estimator_extra, exact_moments, sample_estimates
from pbexact.vertices import vertices
from pbscale import methods as M

RNG = np.random.default_rng(11)


def test_every_registered_estimator_is_complete():
    for name, spec in E.REGISTRY.items():
        assert spec.name == name and spec.label and spec.text
        assert spec.law in E.LAWS and spec.center in E.CENTERS and spec.constant in E.CONSTANTS
        assert E.get_estimator(name) is spec
        n = spec.min_samples + (spec.min_samples % 2 if spec.even else 0)
        assert spec.accepts(n) and not spec.accepts(n - 1)
    assert set(M.MC_METHODS) == {k for k, s in E.REGISTRY.items() if not s.needs_table}


def test_every_spec_has_exact_moments_and_its_closed_form_agrees():
    J = RNG.normal(size=8) + 1.0
    r = RNG.normal(size=3)
    grad = get_parametrization("sigmoid").chain(
        true_gradient(J, get_parametrization("sigmoid").theta(r)), r)
    for spec in E.REGISTRY.values():
        enum = exact_moments(J, r, 4, "sigmoid", (spec.name,))[spec.name]
        np.testing.assert_allclose(enum.mean, grad, rtol=1e-10, atol=1e-13)  # all unbiased
        assert has_closed_form(spec)  # every registered estimator has one today
        closed = closed_form_moments(J, r, 4, "sigmoid", (spec.name,))[spec.name]
        np.testing.assert_allclose(closed.variance, enum.variance, rtol=1e-10, atol=1e-14)


def test_unknown_or_wrong_n_is_a_one_line_error():
    for bad in ("nope", "ARMS", None):
        with pytest.raises(PBInputError, match="unknown estimator") as info:
            E.get_estimator(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(PBInputError, match="DisARM takes n/2 antithetic pairs: n must be even"):
        E.check_estimator("disarm", 5)
    with pytest.raises(PBInputError, match="unknown estimator"):
        closed_form_moments(np.zeros(4), np.zeros(2), 4, "sigmoid", ("nope",))
    with pytest.raises(PBInputError, match="unknown estimator"):
        exact_moments(np.zeros(4), np.zeros(2), 4, "sigmoid", ("nope",))
    with pytest.raises(PBInputError, match="unknown estimator"):
        M.mc_gradient(lambda z: z.sum(-1), torch.zeros(2), get_parametrization("sigmoid"),
                      "nope", 4)
    with pytest.raises(PBInputError, match="needs the whole J table"):
        M.mc_gradient(lambda z: z.sum(-1), torch.zeros(2), get_parametrization("sigmoid"),
                      "betastar", 4)
    with pytest.raises(PBInputError, match="must be even"):
        M.MethodConfig(method="disarm", n=3).validate()


def test_closed_form_refuses_a_spec_it_has_no_formula_for(monkeypatch):
    """No estimator silently gets another's numbers: a law/centering with no closed form is an
    error (before this registry, any unknown name got ARMS's variance)."""
    spec = E.EstimatorSpec("pairs_iid", "pairs", "pairs", 2, "iid", "pair", even=True)
    monkeypatch.setitem(E.REGISTRY, "pairs_iid", spec)
    assert not has_closed_form(spec)
    with pytest.raises(PBInputError, match="no closed form for pairs_iid"):
        closed_form_moments(np.zeros(4), np.zeros(2), 4, "sigmoid", ("pairs_iid",))
    # enumeration covers it: iid pairs centered on the pair mean are LOORF n = 2 averaged
    J = RNG.normal(size=8)
    r = RNG.normal(size=3)
    got = exact_moments(J, r, 4, "sigmoid", ("pairs_iid", "loorf"))
    loorf2 = exact_moments(J, r, 2, "sigmoid", ("loorf",))["loorf"]
    np.testing.assert_allclose(got["pairs_iid"].mean, loorf2.mean, rtol=1e-12)
    var2 = loorf2.variance + loorf2.mean**2  # E[g^2] of one pair
    grad = loorf2.mean
    want = (var2 - grad**2) / 2  # two iid pairs halve the variance
    np.testing.assert_allclose(got["pairs_iid"].variance, want, rtol=1e-10)


def test_disarm_is_the_papers_formula_for_sigmoid_logits():
    """g_i = mean over pairs of 1/2 (J(z) - J(z~)) (-1)^{z~_i} 1[z_i != z~_i] sigma(|r_i|)."""
    d, n = 5, 8
    r = RNG.normal(size=d) * 1.5
    theta = 1 / (1 + np.exp(-r))
    J = RNG.normal(size=2**d)
    z = sample_antithetic(theta, n, (), RNG)
    zz, zt = z[0::2], z[1::2]
    Jz, Jt = J[vertex_index(zz)], J[vertex_index(zt)]
    paper = (0.5 * (Jz - Jt)[:, None] * (-1.0) ** zt * (zz != zt)
             * (1 / (1 + np.exp(-np.abs(r))))).mean(0)
    param = get_parametrization("sigmoid")
    got = E.disarm(J[vertex_index(z)], param.score(z, r), estimator_extra("disarm", J, theta, n,
                                                                            param))
    np.testing.assert_allclose(got, paper, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("param_name", list(PARAMETRIZATIONS))
def test_disarm_unbiased_and_closed_form_equals_enumeration(param_name):
    """For every parametrization the factor 1 / (1 - rho) = max(theta, 1 - theta) makes DisARM
    unbiased (sigma(|r|) for sigmoid); checked by enumerating all 4^d ordered pairs."""
    param = get_parametrization(param_name)
    for d, n in ((1, 2), (3, 4), (4, 6)):
        J = RNG.normal(size=2**d) + 2.0
        theta = RNG.uniform(0.05, 0.95, size=d)
        theta[0] = 0.5
        r = param.logits(theta)
        grad = param.chain(true_gradient(J, param.theta(r)), r)
        enum = exact_moments(J, r, n, param, ("disarm",))["disarm"]
        np.testing.assert_allclose(enum.mean, grad, rtol=1e-10, atol=1e-13)
        closed = closed_form_moments(J, r, n, param, ("disarm",))["disarm"]
        np.testing.assert_allclose(closed.mean, grad, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(closed.variance, enum.variance, rtol=1e-10, atol=1e-14)
        # d = 1, theta = 0.5: the pair is (z, 1 - z), the estimate exact; otherwise it varies
        assert (enum.total_variance > 0) == (d > 1)


def test_disarm_variance_against_a_brute_loop_over_tuples_of_pairs():
    """d = 2, n = 4: every ordered tuple of two pairs (16^2 of them), its probability a product
    over pairs and dimensions, the batch form evaluated on it."""
    d, n = 2, 4
    param = get_parametrization("escort")
    J = RNG.normal(size=2**d)
    theta = np.array([0.3, 0.8])
    r = param.logits(theta)
    law = antithetic_pair_law(theta)  # (d, 4)
    V = vertices(d)
    rho = estimator_extra("disarm", J, theta, n, param)
    first = np.zeros(2 * d)
    second = np.zeros(2 * d)
    for tup in itertools.product(range(2**d), repeat=n):
        prob = math.prod(law[i, int(V[tup[2 * j], i] + 2 * V[tup[2 * j + 1], i])]
                         for j in range(n // 2) for i in range(d))
        if prob == 0:
            continue
        z = V[list(tup)]
        g = E.disarm(J[list(tup)], param.score(z, r), rho)
        first += prob * g
        second += prob * g * g
    grad = param.chain(true_gradient(J, theta), r)
    got = exact_moments(J, r, n, param, ("disarm",))["disarm"]
    np.testing.assert_allclose(first, grad, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got.variance, second - grad**2, rtol=1e-10, atol=1e-14)


def test_antithetic_samplers_marginals_and_correlation():
    theta = np.array([0.2, 0.5, 0.85])
    z = sample_antithetic(theta, 2, (40_000,), np.random.default_rng(0))  # (draws, 2, d)
    np.testing.assert_allclose(z.mean((0, 1)), theta, atol=0.01)
    a, b = z[:, 0], z[:, 1]
    corr = ((a * b).mean(0) - a.mean(0) * b.mean(0)) / (a.std(0) * b.std(0))
    np.testing.assert_allclose(corr, antithetic_correlation(theta), atol=0.02)
    zt = M.AntitheticSampler(torch.tensor(theta), torch.Generator().manual_seed(0)).next(80_000)
    np.testing.assert_allclose(zt.mean(0).numpy(), theta, atol=0.01)
    a, b = zt[0::2].numpy(), zt[1::2].numpy()
    corr = ((a * b).mean(0) - a.mean(0) * b.mean(0)) / (a.std(0) * b.std(0))
    np.testing.assert_allclose(corr, antithetic_correlation(theta), atol=0.02)


@pytest.mark.parametrize("param_name", list(PARAMETRIZATIONS))
def test_pbscale_disarm_same_samples_same_gradient(param_name):
    d, n = 6, 8
    param = get_parametrization(param_name)
    w = torch.tensor(RNG.normal(size=d))

    def f(z):
        return (z * w).sum(-1) ** 2 + z[..., 0]

    theta = RNG.uniform(0.1, 0.9, size=d)
    r = param.logits(theta)
    z = sample_antithetic(theta, n, (), RNG)
    J = f(torch.tensor(z)).numpy()
    want = E.disarm(J, param.score(z, r), estimator_extra("disarm", None, theta, n, param))
    for chunk in (1, 2, 5, 8):  # odd chunks are rounded down to whole pairs
        got = M.mc_gradient(f, torch.tensor(r), param, "disarm", n, chunk=chunk,
                            sampler=M.FixedSampler(torch.tensor(z)))
        np.testing.assert_allclose(got.grad.numpy(), want, rtol=1e-11, atol=1e-13)


def test_pbscale_disarm_unbiased_against_enumeration():
    d = 5
    J = RNG.normal(size=2**d)
    Jt = torch.tensor(J)

    def f(z):
        return Jt[vertex_index(z)]

    param = get_parametrization("sigmoid")
    theta = np.linspace(0.2, 0.8, d)
    r = torch.tensor(param.logits(theta))
    exact = param.chain(true_gradient(J, theta), r.numpy())
    gen = torch.Generator().manual_seed(0)
    ests = torch.stack([M.mc_gradient(f, r, param, "disarm", 4, gen, chunk=2).grad
                        for _ in range(3000)]).numpy()
    mean, se = ests.mean(0), ests.std(0, ddof=1) / np.sqrt(len(ests))
    assert np.all(np.abs(mean - exact) <= 4.5 * se + 1e-12), (mean, exact, se)
    assert np.any(np.abs(exact) > 4.5 * se)  # not vacuous
    # and the per-draw variance is the exact one (4 standard errors of the mean square)
    sq = ((ests - exact) ** 2).sum(1)
    want = exact_moments(J, r.numpy(), 4, param, ("disarm",))["disarm"].total_variance
    assert abs(sq.mean() - want) < 4 * sq.std(ddof=1) / np.sqrt(len(sq))


def test_mc_variance_of_disarm_matches_exact():
    J = RNG.normal(size=16)
    param = get_parametrization("cosine")
    r = param.logits(RNG.uniform(0.1, 0.9, size=4))
    exact = closed_form_moments(J, r, 6, param, ("disarm",))["disarm"]
    g = sample_estimates("disarm", J, r, 6, 20_000, np.random.default_rng(1), param)
    sq = ((g - exact.mean) ** 2).sum(-1)
    assert abs(sq.mean() - exact.total_variance) < 4 * sq.std(ddof=1) / np.sqrt(len(sq))


@pytest.mark.parametrize("estimator", M.MC_METHODS)
def test_surrogate_gradient_is_the_estimate(estimator):
    d, n = 6, 4
    param = get_parametrization("escort")
    w = torch.tensor(RNG.normal(size=d))

    def f(z):
        return torch.cos(z @ w)

    r = param.logits(torch.tensor(RNG.uniform(0.2, 0.8, size=d))).requires_grad_(True)
    loss, est = M.mc_surrogate(f, r, param, estimator, n, torch.Generator().manual_seed(3),
                               chunk=2)
    again = M.mc_gradient(f, r, param, estimator, n, torch.Generator().manual_seed(3), chunk=2)
    assert torch.equal(est.grad, again.grad)  # same generator state, same samples
    assert loss.ndim == 0 and float(loss.detach()) == pytest.approx(est.loss, rel=1e-15)
    (grad,) = torch.autograd.grad(loss, r)
    assert torch.equal(grad, est.grad)
    assert torch.any(est.grad != 0)


def test_surrogate_composes_with_other_autograd_terms():
    """L + lambda sum theta(r) backpropagates estimate + regularizer gradient; and through r into
    a layer that produced the logits (r = W x): dL/dW = g x^T."""
    d, n, lam = 5, 6, 0.3
    param = get_parametrization("sigmoid")
    w = torch.tensor(RNG.normal(size=d))

    def f(z):
        return (z @ w) ** 2

    W = torch.tensor(RNG.normal(size=(d, 3)) * 0.5, requires_grad=True)
    x = torch.tensor(RNG.normal(size=3))
    r = W @ x
    loss, est = M.mc_surrogate(f, r, param, "loorf", n, torch.Generator().manual_seed(0))
    total = loss + lam * param.theta(r).sum()
    total.backward()
    t = param.theta(r.detach())
    want = torch.outer(est.grad + lam * t * (1 - t), x)
    torch.testing.assert_close(W.grad, want, rtol=1e-12, atol=1e-14)
    # the surrogate's value is the mean sampled loss, not the regularizer
    assert float(loss.detach()) == pytest.approx(est.loss)


def test_disarm_trains_through_the_method_config():
    """DisARM is a method of pbscale's trainer only because it is in the registry: on a
    separable loss it drives theta to the target mask."""
    target = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])

    def f(z):
        return ((z - target) ** 2).sum(-1)

    trainer = M.MaskTrainer(M.MethodConfig(method="disarm", n=4, lr=0.1, seed=0), 5, 300)
    for _ in range(300):
        trainer.step(f)
    theta = trainer.theta()
    assert float((theta - target).abs().max()) < 0.1, theta


def test_disarm_at_n2_is_arms_at_n2():
    """With n = 2 the Dirichlet copula is antithetic (u~_2 = 1 - u~_1), so ARMS and DisARM are one
    estimator: their exact moments agree, ARMS's by multiset enumeration with the copula law and
    DisARM's by pair enumeration with the antithetic law (two separate code paths)."""
    for name in ("sigmoid", "escort"):
        param = get_parametrization(name)
        J = RNG.normal(size=16)
        r = param.logits(RNG.uniform(0.05, 0.95, size=4))
        got = exact_moments(J, r, 2, param, ("arms", "disarm"))
        np.testing.assert_allclose(got["disarm"].mean, got["arms"].mean, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(got["disarm"].variance, got["arms"].variance, rtol=1e-10,
                                   atol=1e-14)
        assert got["disarm"].total_variance > 0


def test_variance_table_cli(tmp_path, capsys):
    from analysis import variance_table

    argv = ["--d", "3", "--n", "2", "4", "--steps", "20", "--log-every", "10",
            "--benchmark", "exponential", "--out", str(tmp_path)]
    assert variance_table.main(argv) == 0
    import csv

    with open(tmp_path / "variance_table_disarm.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["n"], r["other"]) for r in rows] == [("2", "loorf"), ("2", "arms"),
                                                    ("4", "loorf"), ("4", "arms")]
    # n = 2: DisARM is ARMS (ratio 1, never lower beyond round-off)
    assert float(rows[1]["ratio_step0"]) == pytest.approx(1.0, rel=1e-9)
    assert float(rows[1]["lower_fraction"]) == 0.0
    from analysis.cli import run

    assert run(variance_table.main, ["--n", "3", "--out", str(tmp_path)]) == 2
    assert "n must be even" in capsys.readouterr().err
