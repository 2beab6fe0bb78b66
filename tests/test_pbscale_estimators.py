"""pbscale's estimators against pbexact: same samples, same gradient; chunked equals one-shot;
unbiasedness against the exact gradient by enumeration; the ARMS copula sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pbexact import estimators as E
from pbexact.copula import arms_correlation
from pbexact.errors import PBInputError
from pbexact.parametrizations import get_parametrization
from pbexact.polynomial import true_gradient
from pbexact.sampling import sample_arms, sample_bernoulli
from pbscale.forward.masks import MaskedModule
from pbscale.methods import (
    MC_METHODS,
    SAMPLERS,
    BernoulliSampler,
    CopulaSampler,
    FixedSampler,
    HybridControl,
    mc_gradient,
    rebar_relax,
    samplers,
    standard_gamma,
    straight_through,
)
from pbscale.regression.problem import mlp

PARAMS = ("sigmoid", "cosine", "direct", "escort")


def small_problem(widths, batch=8, seed=0):
    """A masked MLP in float64 and its batched loss f(z) on a fixed batch."""
    torch.manual_seed(seed)
    net = mlp(widths).double()
    masked = MaskedModule(net)
    x = torch.rand(batch, widths[0], dtype=torch.float64) * 2 - 1
    y = torch.rand(batch, 1, dtype=torch.float64)
    return masked, masked.loss_fn(x, y)


def logits_for(param, theta: np.ndarray):
    r_np = param.logits(theta)
    return r_np, torch.tensor(r_np)


@pytest.mark.parametrize("param_name", PARAMS)
@pytest.mark.parametrize("estimator", ["reinforce", "loorf", "arms"])
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_same_samples_same_gradient_as_pbexact(param_name, estimator, chunk):
    masked, f = small_problem((3, 4, 4, 1))
    d, n = masked.d, 7
    rng = np.random.default_rng(1)
    theta = rng.uniform(0.1, 0.9, d)
    param = get_parametrization(param_name)
    r_np, r_t = logits_for(param, theta)
    if estimator == "arms":
        z = sample_arms(theta, n, (), rng)
    else:
        z = sample_bernoulli(theta, (n,), rng)
    J = f(torch.tensor(z)).numpy()
    S = param.score(z, r_np)
    if estimator == "arms":
        expected = E.arms(J, S, param.expand(arms_correlation(theta, n)))
    else:
        expected = getattr(E, estimator)(J, S)
    replay = FixedSampler(torch.tensor(z))
    got = mc_gradient(f, r_t, param, estimator, n, chunk=chunk, sampler=replay)
    assert got.grad.dtype == torch.float64
    np.testing.assert_allclose(got.grad.numpy(), expected, rtol=1e-11, atol=1e-13)
    assert got.loss == pytest.approx(J.mean(), rel=1e-12)


@pytest.mark.parametrize("estimator", MC_METHODS)
def test_chunked_equals_one_shot_with_the_default_samplers(estimator):
    masked, f = small_problem((3, 4, 1))
    param = get_parametrization("sigmoid")
    r = torch.linspace(-1, 1, masked.d, dtype=torch.float64)
    n = 12
    # draw the samples once with the method's own sampler, then replay them chunked and whole
    gen = torch.Generator().manual_seed(3)
    theta = param.theta(r)
    z = SAMPLERS[E.get_estimator(estimator).law](theta, n, gen).next(n)
    one = mc_gradient(f, r, param, estimator, n, chunk=n, sampler=FixedSampler(z)).grad
    for k in (1, 5):
        chunked = mc_gradient(f, r, param, estimator, n, chunk=k, sampler=FixedSampler(z)).grad
        torch.testing.assert_close(chunked, one, rtol=1e-12, atol=1e-14)


def _enumerated(masked, f):
    d = masked.d
    h = torch.arange(2**d)
    Z = ((h[:, None] >> torch.arange(d)) & 1).double()  # z_i = bit i-1 of h (`sec:pb_basics`)
    return f(Z).numpy()


@pytest.mark.parametrize("param_name", PARAMS)
@pytest.mark.parametrize("estimator", ["reinforce", "loorf", "arms"])
def test_mc_unbiased_against_enumeration(param_name, estimator):
    masked, f = small_problem((2, 3, 1))  # d = 9 masked weights
    assert masked.d <= 10
    table = _enumerated(masked, f)
    param = get_parametrization(param_name)
    theta = np.linspace(0.2, 0.8, masked.d)
    r_np, r_t = logits_for(param, theta)
    exact = param.chain(true_gradient(table, theta), r_np)
    gen = torch.Generator().manual_seed(0)
    ests = torch.stack([mc_gradient(f, r_t, param, estimator, 4, gen, chunk=2).grad
                        for _ in range(1500)]).numpy()
    mean, se = ests.mean(0), ests.std(0, ddof=1) / np.sqrt(len(ests))
    assert np.all(np.abs(mean - exact) <= 4.5 * se + 1e-12), (mean, exact, se)
    # not vacuous: at this resolution an estimator returning zeros would fail
    assert np.any(np.abs(exact) > 4.5 * se)


@pytest.mark.parametrize("kind", ["rebar", "relax"])
def test_rebar_relax_unbiased_against_enumeration(kind):
    masked, f = small_problem((2, 3, 1))
    table = _enumerated(masked, f)
    theta = np.linspace(0.2, 0.8, masked.d)
    r = torch.tensor(np.log(theta) - np.log1p(-theta))
    exact = true_gradient(table, theta) * theta * (1 - theta)
    torch.manual_seed(0)
    control = HybridControl(kind, masked.d).double()
    gen = torch.Generator().manual_seed(1)
    ests = []
    for _ in range(60):
        u = torch.rand((50, masked.d), generator=gen, dtype=torch.float64)
        v = torch.rand((50, masked.d), generator=gen, dtype=torch.float64)
        est, var = rebar_relax(f, r, u, v, control)
        ests.append(est.grad.numpy())
    ests = np.array(ests)
    mean, se = ests.mean(0), ests.std(0, ddof=1) / np.sqrt(len(ests))
    assert np.all(np.abs(mean - exact) <= 4.5 * se + 1e-12), (mean, exact, se)
    # the variance objective is differentiable in the control's parameters
    grads = torch.autograd.grad(var, control.scalar_parameters(), allow_unused=True)
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_straight_through_is_the_gradient_in_z():
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)

    def f(z):
        return (z * w).sum(-1) + (z[..., 0] * z[..., 1])

    u = torch.rand((4, 3), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    r = torch.zeros(3, dtype=torch.float64)
    est = straight_through(f, r, u)
    z = (u < 0.5).double()
    expected = w + torch.stack([z[:, 1], z[:, 0], 0 * z[:, 0]], -1)
    torch.testing.assert_close(est.grad, expected.mean(0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # stick-breaking; thresholds
def test_copula_sampler_marginals_and_correlation(dtype):
    theta1 = torch.tensor([0.2, 0.5, 0.85], dtype=dtype)
    reps, n = 20000, 4
    theta = theta1.repeat(reps)  # reps independent copies of a d = 3 problem side by side
    z = CopulaSampler(theta, n, torch.Generator().manual_seed(0)).next(n).reshape(n, reps, 3)
    np.testing.assert_allclose(z.double().mean((0, 1)).numpy(), theta1.double().numpy(), atol=0.01)
    a, b = z[0].double(), z[1].double()
    corr = ((a * b).mean(0) - a.mean(0) * b.mean(0)) / (a.std(0) * b.std(0))
    np.testing.assert_allclose(corr.double().numpy(), arms_correlation(theta1.double().numpy(), n),
                               atol=0.03)
    assert float(arms_correlation(theta1, n).min()) < -0.1  # antithetic: not a vacuous check


def test_standard_gamma_moments_and_seed():
    g = torch.Generator().manual_seed(0)
    x = standard_gamma(5.0, (200000,), g, torch.float64)
    assert x.mean().item() == pytest.approx(5.0, rel=0.01)
    assert x.var().item() == pytest.approx(5.0, rel=0.03)
    again = standard_gamma(5.0, (200000,), torch.Generator().manual_seed(0), torch.float64)
    assert torch.equal(x, again)


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("name", PARAMS)
def test_unmaterialized_affine_scores_match_the_scores(name, pairs):
    """The accumulator's affine reading of the scores (never a (k, P) matrix, escort's two logits
    included) gives the sums of the scores built in full."""
    param = get_parametrization(name)
    gen = torch.Generator().manual_seed(0)
    d = 9
    r = param.logits(torch.rand(d, generator=gen, dtype=torch.float64) * 0.8 + 0.1)
    if name == "direct":
        r[:2] = torch.tensor([0.0, 1.0], dtype=torch.float64)  # theta 0 and 1: score 0 there
    z = (torch.rand(8, d, generator=gen, dtype=torch.float64) < 0.5).double()
    w = torch.randn(8, generator=gen, dtype=torch.float64)
    a, b = param.affine_score(r)
    lazy, full = E.SampleSums(pairs), E.SampleSums(pairs)
    lazy.update_affine(w, z, a, b, param)
    full.update(w, param.score(z, r))
    torch.testing.assert_close(lazy.B, param.score(z, r).sum(-2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lazy.U, full.U, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lazy.B, full.B, rtol=1e-12, atol=1e-12)
    if not pairs:
        torch.testing.assert_close(lazy.U, w @ param.score(z, r), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_copula_fractions_are_a_dirichlet_split_with_beta_marginals(dtype):
    # D_1..D_n of each coordinate: nonnegative, sum to one (drawn in uneven chunks), each
    # Beta(1, n - 1) (KS against 1 - (1 - x)^(n-1)), for the first, a middle and the last draw
    from scipy import stats

    n, d = 7, 40_000
    sampler = CopulaSampler(torch.full((d,), 0.3, dtype=dtype), n, torch.Generator().manual_seed(2))
    D = torch.cat([sampler.fractions(k) for k in (1, 3, 2, 1)]).double()
    assert D.min() >= 0
    torch.testing.assert_close(D.sum(0), torch.ones(d, dtype=torch.float64),
                               atol=1e-5 if dtype == torch.float32 else 1e-12, rtol=0)
    for s in (0, 3, n - 1):
        ks = stats.kstest(D[s].numpy(), lambda x: 1 - (1 - x) ** (n - 1))
        assert ks.pvalue > 1e-3, (s, ks)
    with pytest.raises(PBInputError, match="already drawn"):
        sampler.fractions(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_copula_bits_are_alg_orig_arms_bits_of_the_same_fractions(dtype):
    # next() by threshold tests on D equals arms_bits(u~) with u~ = 1 - (1 - D)^(n-1) (float64)
    from pbexact.copula import arms_bits

    n, d = 5, 3000
    theta = torch.rand(d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    theta[:4] = torch.tensor([0.0, 1.0, 0.5, 0.5 + 1e-9], dtype=torch.float64)
    theta = theta.to(dtype)
    a = CopulaSampler(theta, n, torch.Generator().manual_seed(1))
    b = CopulaSampler(theta, n, torch.Generator().manual_seed(1))
    z = torch.cat([a.next(2), a.next(3)])
    D = torch.cat([b.fractions(2), b.fractions(3)]).double()
    expected = arms_bits(1 - (1 - D) ** (n - 1), theta.double())
    assert z.dtype == dtype
    mismatch = (z.double() != expected).float().mean().item()
    assert mismatch <= (2e-4 if dtype == torch.float32 else 0.0)  # float32: rounding at ties
    assert z[:, 0].sum() == 0 and z[:, 1].sum() == n  # theta 0 and 1


def test_copula_sampler_same_numbers_whatever_the_chunking():
    theta = torch.rand(10, generator=torch.Generator().manual_seed(0))
    one = CopulaSampler(theta, 6, torch.Generator().manual_seed(4)).next(6)
    s = CopulaSampler(theta, 6, torch.Generator().manual_seed(4))
    assert torch.equal(torch.cat([s.next(1), s.next(4), s.next(1)]), one)


@pytest.mark.parametrize("stick", [False, True])  # n d <= 2^24 (thresholds) and beyond
@pytest.mark.parametrize("d", [30_001, 8])
def test_copula_cpu_float32_same_samples_whatever_the_chunking(d, stick, monkeypatch):
    # every chunking gives the same bits and fractions and leaves the generator where one chunk
    # of n leaves it, on both CPU float32 paths (stick-breaking forced by a budget of 0)
    if stick:
        monkeypatch.setattr(samplers, "_ALL_DRAWS_ELEMENTS", 0)
    n = 37
    theta = torch.rand(d, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(5)
    s = CopulaSampler(theta, n, gen)
    assert s._ints is not stick
    one = s.next(n)
    after = torch.rand(3, generator=gen)
    for sizes in ([1, 9, 20, 7], [10, 10, 10, 7], [36, 1]):
        g = torch.Generator().manual_seed(5)
        s = CopulaSampler(theta, n, g)
        assert torch.equal(torch.cat([s.next(k) for k in sizes]), one), sizes
        assert torch.equal(torch.rand(3, generator=g), after)
    D = CopulaSampler(theta, n, torch.Generator().manual_seed(5)).fractions(n)
    parts = CopulaSampler(theta, n, torch.Generator().manual_seed(5))
    torch.testing.assert_close(torch.cat([parts.fractions(k) for k in (3, 34)]), D, rtol=0,
                               atol=0)
    assert 0.3 < one.mean() < 0.7 and one.dtype == torch.float32


def test_bernoulli_cpu_float32_same_samples_whatever_the_chunking():
    # 24-bit draws take whole words per row, so an odd d does not pair rows differently
    theta = torch.rand(7, generator=torch.Generator().manual_seed(0))
    one = BernoulliSampler(theta, torch.Generator().manual_seed(2)).next(9)
    s = BernoulliSampler(theta, torch.Generator().manual_seed(2))
    assert torch.equal(torch.cat([s.next(k) for k in (1, 3, 5)]), one)


@pytest.mark.parametrize("stick", [False, True])
def test_copula_cpu_float32_paths_marginals_and_correlation(stick, monkeypatch):
    if stick:
        monkeypatch.setattr(samplers, "_ALL_DRAWS_ELEMENTS", 0)
    theta1 = torch.tensor([0.2, 0.5, 0.85, 0.03])
    reps, n = 20000, 5
    s = CopulaSampler(theta1.repeat(reps), n, torch.Generator().manual_seed(1))
    assert s._ints is not stick
    z = s.next(n).reshape(n, reps, 4).double()
    np.testing.assert_allclose(z.mean((0, 1)).numpy(), theta1.double().numpy(), atol=0.01)
    a, b = z[1], z[3]
    corr = ((a * b).mean(0) - a.mean(0) * b.mean(0)) / (a.std(0) * b.std(0))
    np.testing.assert_allclose(corr.numpy(), arms_correlation(theta1.double().numpy(), n),
                               atol=0.03)


def test_arms_float32_unbiased_against_enumeration_in_chunks():
    # the float32 CPU sampler (integer thresholds) through mc_gradient in chunks of 2 of n = 4
    masked, f = small_problem((2, 3, 1))
    table = _enumerated(masked, f)
    param = get_parametrization("sigmoid")
    theta = np.linspace(0.2, 0.8, masked.d)
    r_np, r_t = logits_for(param, theta)
    exact = param.chain(true_gradient(table, theta), r_np)
    gen = torch.Generator().manual_seed(0)

    def f32(z):
        return f(z.double()).float()

    ests = torch.stack([mc_gradient(f32, r_t.float(), param, "arms", 4, gen, chunk=2).grad
                        for _ in range(1500)]).double().numpy()
    mean, se = ests.mean(0), ests.std(0, ddof=1) / np.sqrt(len(ests))
    assert np.all(np.abs(mean - exact) <= 4.5 * se + 1e-6), (mean, exact, se)
    assert np.any(np.abs(exact) > 4.5 * se)


def test_copula_sampler_float32_marginals_at_extreme_theta_and_large_n():
    # float32 arithmetic keeps the tails: P(z = 1) = theta within 4 standard errors
    theta1 = torch.tensor([0.003, 0.2, 0.5, 0.9, 0.997])
    reps, n = 4000, 400
    z = CopulaSampler(theta1.repeat(reps), n, torch.Generator().manual_seed(3)).next(n)
    freq = z.reshape(n * reps, 5).double().mean(0)
    se = (theta1.double() * (1 - theta1.double()) / (n * reps)).sqrt()
    assert ((freq - theta1.double()).abs() <= 4 * se).all(), (freq, theta1)


@pytest.mark.parametrize("name", ["reinforce", "loorf", "arms", "disarm"])
@pytest.mark.parametrize("param_name", ["sigmoid", "escort"])
def test_affine_sums_over_leading_dims_and_chunks_equal_the_batch_form(name, param_name):
    # SampleSums keeps per-bit sums across affine chunks and expands once (centered: U - c B);
    # with leading dims (3 problems), the estimate equals the batch form on full scores
    spec, param = E.get_estimator(name), get_parametrization(param_name)
    gen = torch.Generator().manual_seed(0)
    d, n = 5, 6
    theta = torch.rand(3, d, generator=gen, dtype=torch.float64) * 0.8 + 0.1
    r = param.logits(theta)
    z = (torch.rand(3, n, d, generator=gen, dtype=torch.float64) < theta[:, None]).double()
    J = torch.randn(3, n, generator=gen, dtype=torch.float64)
    extra = spec.constant_of(theta, n, param)
    a, b = param.affine_score(r)
    sums = E.SampleSums(pairs=spec.center == "pair")
    for c0, c1 in ((0, 2), (2, 6)):
        sums.update_affine(J[:, c0:c1], z[:, c0:c1], a, b, param)
    S = param.score(z, r[:, None, :])
    expected = spec.form(J, extra).evaluate(S)
    torch.testing.assert_close(sums.estimate(spec, extra), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(sums.B, S.sum(-2), rtol=1e-10, atol=1e-12)
