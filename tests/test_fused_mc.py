"""The fused CPU MC step (:mod:`pbscale.methods.fused`) and its counter-based stream
(:mod:`pbscale.methods.counter_stream`): the stream is SplitMix64 and any chunk of it can be drawn
again; the fused path equals the unfused reference (the torch samplers and pbexact's SampleSums)
on the same uniforms, masks bit for bit and estimates to 1e-6 relative, for every MC estimator
and parametrization, supermask and joint; its estimates are unbiased against the exact gradient
by enumeration; the samples do not depend on the chunking (the memory guard) nor on a resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pbexact import estimators as E
from pbexact.parametrizations import PARAMETRIZATIONS, get_parametrization
from pbexact.polynomial import true_gradient
from pbscale.forward.masks import MaskedModule
from pbscale.methods import MC_METHODS, FixedSampler, mc_gradient
from pbscale.methods.counter_stream import GAMMA, CounterStream, seed_key, stream_values
from pbscale.methods.fused import fused_estimate, fused_gradient
from pbscale.regression.problem import mlp

PARAMS = tuple(PARAMETRIZATIONS)
MASK = (1 << 64) - 1


def _splitmix64(state: int, count: int) -> list[int]:
    """SplitMix64 in plain Python integers (state += gamma; Mix13 of the state), the reference
    the stream's Numba words are checked against."""
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(z ^ (z >> 31))
    return out


def test_splitmix64_reference_reproduces_the_published_sequence():
    # the first outputs of SplitMix64 from state 1234567 (the test vector of Vigna's
    # splitmix64.c), so the plain-Python reference above is SplitMix64 itself
    assert _splitmix64(1234567, 3) == [6457827717110365317, 3203168211198807973,
                                       9817491932198370423]


@pytest.mark.parametrize("d", [1, 6, 7])
def test_stream_values_are_the_splitmix64_words_split_in_24_bit_halves(d):
    seed = 11
    key = int(seed_key(seed))
    assert key == _splitmix64(seed, 1)[0]
    rows, W = 3, (d + 1) // 2
    words = _splitmix64(key, rows * W)  # the stream's words 0, 1, ...: SplitMix64 from the key
    got = stream_values(np.uint64(key), 0, d, rows, dtype=torch.float64)
    for r in range(rows):
        for j in range(d):
            x = words[r * W + (j if j < W else j - W)]
            want = ((x & 0xFFFFFFFF) >> 8) if j < W else (x >> 40)
            assert got[r, j].item() == want, (r, j)
    assert int(GAMMA) == 0x9E3779B97F4A7C15


def test_any_rows_of_a_draw_can_be_drawn_again():
    s = CounterStream(5)
    first = s.bits24((4, 9))
    start = s.take(6, 9)
    assert start == 4 * 5 and s.position == 10 * 5
    whole = stream_values(s.key, start, 9, 6)
    np.testing.assert_array_equal(stream_values(s.key, start, 9, 2, row0=3).numpy(),
                                  whole[3:5].numpy())
    again = CounterStream(5)
    np.testing.assert_array_equal(again.bits24((2, 9)).numpy(), first[:2].numpy())
    np.testing.assert_array_equal(again.bits24((2, 9)).numpy(), first[2:].numpy())
    other = CounterStream(6).bits24((4, 9))
    assert not torch.equal(first, other)


def test_stream_values_are_uniform_on_the_24_bit_grid():
    m = stream_values(seed_key(0), 0, 1001, 200, dtype=torch.float64).reshape(-1)
    N = m.numel()
    assert m.min() >= 0 and m.max() <= 2**24 - 1 and torch.equal(m, m.round())
    u = m / 2**24
    # mean and variance of U(0, 1) within 5 standard errors; 16 equal bins by chi-square
    assert abs(u.mean().item() - 0.5) < 5 * (1 / 12 / N) ** 0.5
    assert abs(u.var().item() - 1 / 12) < 5 * (1 / 180 / N) ** 0.5
    counts = torch.bincount((m // 2**20).long(), minlength=16).double()
    chi2 = ((counts - N / 16) ** 2 / (N / 16)).sum().item()
    assert chi2 < 45.0  # P(chi2_15 > 45) < 1e-4


def test_the_stream_state_round_trips():
    s = CounterStream(3)
    s.bits24((5, 8))
    t = CounterStream(0)
    t.load_state_dict(s.state_dict())
    assert torch.equal(t.bits24((2, 8)), s.bits24((2, 8)))


# ---------------------------------------------------------------------------------------------
# fused == unfused on the same uniforms


def _problem(d: int, dtype: torch.dtype):
    w = torch.linspace(-1.5, 2.0, d, dtype=torch.float64)

    def f(z):
        return torch.tanh(z.double() @ w - 0.3 * z.double().sum(-1) ** 0.5).to(z.dtype)
    return f


def _recording(f, keep: list, clone: bool):
    def g(z):
        keep.append(z.clone() if clone else z)
        return f(z)
    return g


def _reference_sums(spec, r, param, masks, J, n):
    """The unfused estimate from the masks (n, d) and losses J (n,): pbexact's SampleSums in
    float64 on the samples, scores (a, b) of the parametrization at r."""
    theta = param.theta(r)
    extra = spec.constant_of(theta, n, param)
    a, b = param.affine_score(r)
    sums = E.SampleSums(pairs=spec.center == "pair")
    sums.update_affine(J.double(), masks.double(), a.double(), b.double(), param)
    return sums.estimate(spec, None if extra is None else extra.double())


def _theta(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    theta = torch.rand(d, generator=g, dtype=torch.float64) * 0.9 + 0.05
    theta[:3] = torch.tensor([0.5, 0.02, 0.98], dtype=torch.float64)[: min(3, d)]
    return theta


@pytest.mark.parametrize("param_name", PARAMS)
@pytest.mark.parametrize("estimator", MC_METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,chunk", [(10, 4), (10, 10), (2, 1)])
def test_fused_equals_the_unfused_reference_on_the_same_uniforms(param_name, estimator, dtype,
                                                                 n, chunk):
    d = 37  # odd: the last word's high half is unused
    param, spec = get_parametrization(param_name), E.get_estimator(estimator)
    r = torch.as_tensor(param.logits(_theta(d, 1).numpy())).to(dtype)
    f = _problem(d, dtype)
    fused, ref = [], []
    got = mc_gradient(_recording(f, fused, True), r, param, estimator, n, CounterStream(9), chunk)
    want = mc_gradient(_recording(f, ref, True), r, param, estimator, n, CounterStream(9), chunk,
                       fused=False)
    zf, zr = torch.cat(fused), torch.cat(ref)
    assert zf.dtype == zr.dtype == dtype
    assert torch.equal(zf, zr)  # the masks, bit for bit
    assert 0 < zf.mean() < 1
    # the estimate: against the unfused path (float64: to round-off) and against pbexact's
    # accumulator in float64 on the same masks (float32 too: the reference's own float32 sums
    # differ from float64 ones by more than 1e-6 where the centering cancels)
    J = f(zf)
    exact = _reference_sums(spec, r, param, zf, J, n)
    scale = exact.abs().max().item()
    assert scale > 0
    assert (got.grad.double() - exact).abs().max().item() <= 1e-6 * scale
    if dtype == torch.float64:
        assert (got.grad - want.grad).abs().max().item() <= 1e-6 * scale
    assert got.loss == pytest.approx(J.double().mean().item(), rel=1e-6)


@pytest.mark.parametrize("estimator", MC_METHODS)
def test_joint_training_keeps_every_chunks_masks(estimator):
    # joint pruning saves each chunk's masks for the weights' backward: the fused path must
    # hand f fresh memory per chunk (keep_masks), so the masks f kept equal the reference's
    d, n, chunk = 23, 12, 4
    param = get_parametrization("escort")
    r = torch.as_tensor(param.logits(_theta(d, 2).numpy())).float()
    f = _problem(d, torch.float32)
    kept, ref = [], []
    mc_gradient(_recording(f, kept, False), r, param, estimator, n, CounterStream(4), chunk,
                keep_masks=True)
    mc_gradient(_recording(f, ref, True), r, param, estimator, n, CounterStream(4), chunk,
                fused=False)
    assert len(kept) == len(ref) == n // chunk
    for a, b in zip(kept, ref):
        assert torch.equal(a, b)
    # the supermask path (keep_masks=False) reuses two buffers and still sees the same masks
    seen = []
    mc_gradient(_recording(f, seen, True), r, param, estimator, n, CounterStream(4), chunk,
                keep_masks=False)
    assert torch.equal(torch.cat(seen), torch.cat(ref))


@pytest.mark.parametrize("estimator", MC_METHODS)
def test_fused_samples_do_not_depend_on_the_chunking(estimator):
    # the memory guard picks the chunk: every chunk size draws the same samples (regenerated
    # from the stream's position), and the estimate agrees to round-off
    d, n = 29, 12
    param = get_parametrization("sigmoid")
    r = torch.as_tensor(param.logits(_theta(d, 3).numpy()))
    f = _problem(d, torch.float64)
    runs = {}
    for chunk in (1, 2, 5, 12):
        seen = []
        s = CounterStream(7)
        est = mc_gradient(_recording(f, seen, True), r, param, estimator, n, s, chunk)
        runs[chunk] = (torch.cat(seen), est.grad, s.position)
    base = runs[12]
    for chunk, (z, g, pos) in runs.items():
        assert torch.equal(z, base[0]), chunk
        torch.testing.assert_close(g, base[1], rtol=1e-12, atol=1e-14)
        assert pos == base[2]


def test_a_resumed_stream_draws_what_the_uninterrupted_one_draws():
    d, n = 19, 6
    param = get_parametrization("sigmoid")
    r = torch.as_tensor(param.logits(_theta(d, 4).numpy()))
    f = _problem(d, torch.float64)
    s = CounterStream(2)
    steps = [mc_gradient(f, r, param, "arms", n, s, 3).grad for _ in range(3)]
    t = CounterStream(2)
    mc_gradient(f, r, param, "arms", n, t, 3)
    saved = t.state_dict()
    u = CounterStream(99)
    u.load_state_dict(saved)
    later = [mc_gradient(f, r, param, "arms", n, u, 3).grad for _ in range(2)]
    assert torch.equal(later[0], steps[1]) and torch.equal(later[1], steps[2])


def test_fused_path_replays_given_samples_through_the_unfused_one():
    # a given sampler always takes the unfused path (replays are not drawn from the stream)
    d, n = 11, 4
    param = get_parametrization("sigmoid")
    r = torch.zeros(d, dtype=torch.float64)
    z = (torch.arange(n * d).reshape(n, d) % 3 == 0).double()
    f = _problem(d, torch.float64)
    a = mc_gradient(f, r, param, "loorf", n, CounterStream(1), 2, sampler=FixedSampler(z))
    b = mc_gradient(f, r, param, "loorf", n, None, 2, sampler=FixedSampler(z))
    assert torch.equal(a.grad, b.grad)


# ---------------------------------------------------------------------------------------------
# unbiased against the exact gradient


def _small():
    torch.manual_seed(0)
    net = mlp((2, 3, 1)).double()
    masked = MaskedModule(net)
    x = torch.rand(8, 2, dtype=torch.float64) * 2 - 1
    y = torch.rand(8, 1, dtype=torch.float64)
    f = masked.loss_fn(x, y)
    d = masked.d
    h = torch.arange(2**d)
    Z = ((h[:, None] >> torch.arange(d)) & 1).double()  # z_i = bit i-1 of h (`sec:pb_basics`)
    return masked, f, f(Z).numpy()


@pytest.mark.parametrize("param_name", PARAMS)
@pytest.mark.parametrize("estimator", MC_METHODS)
def test_fused_estimates_are_unbiased_against_enumeration(param_name, estimator):
    """The mean of 1500 fused estimates (n = 4, chunks of 2, one counter stream) is the exact
    gradient (pbexact.polynomial.true_gradient over the 2^9 masks, chained to the
    parametrization) within 4.5 standard errors per coordinate."""
    masked, f, table = _small()
    assert masked.d <= 10
    param = get_parametrization(param_name)
    theta = np.linspace(0.2, 0.8, masked.d)
    r_np = param.logits(theta)
    exact = param.chain(true_gradient(table, theta), r_np)
    stream = CounterStream(0)
    ests = torch.stack([mc_gradient(f, torch.tensor(r_np), param, estimator, 4, stream,
                                    chunk=2).grad for _ in range(1500)]).numpy()
    mean, se = ests.mean(0), ests.std(0, ddof=1) / np.sqrt(len(ests))
    assert np.all(np.abs(mean - exact) <= 4.5 * se + 1e-12), (mean, exact, se)
    assert np.any(np.abs(exact) > 4.5 * se)  # not vacuous: zeros would fail


@pytest.mark.parametrize("estimator", MC_METHODS)
def test_fused_float32_estimates_are_unbiased_against_enumeration(estimator):
    """As above in float32 (what pruning runs): logits, masks and losses in float32, the sums
    in float64; sigmoid, n = 4 in chunks of 2; within 4.5 standard errors (+1e-6 for float32)."""
    masked, f, table = _small()
    param = get_parametrization("sigmoid")
    theta = np.linspace(0.2, 0.8, masked.d)
    r_np = param.logits(theta)
    exact = param.chain(true_gradient(table, theta), r_np)

    def f32(z):
        return f(z.double()).float()

    stream = CounterStream(1)
    r = torch.tensor(r_np).float()
    ests = torch.stack([mc_gradient(f32, r, param, estimator, 4, stream, chunk=2).grad
                        for _ in range(1500)]).double().numpy()
    mean, se = ests.mean(0), ests.std(0, ddof=1) / np.sqrt(len(ests))
    assert np.all(np.abs(mean - exact) <= 4.5 * se + 1e-6), (mean, exact, se)
    assert np.any(np.abs(exact) > 4.5 * se)


@pytest.mark.parametrize("param_name", PARAMS)
@pytest.mark.parametrize("estimator", MC_METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_one_pass_finish_is_the_linear_form_bit_for_bit(param_name, estimator, dtype):
    """fused_estimate (one kernel pass over the P logits) equals SampleSums.estimate with the
    expanded constant bit for bit, for every MC estimator and parametrization, at a d where
    the finish's rounding has room to differ; and the comparison is not vacuous (the same
    form rounded once from float64 differs)."""
    param, spec = get_parametrization(param_name), E.get_estimator(estimator)
    d, n = 3001, 10
    r = param.logits(_theta(d, seed=5)).to(dtype)
    w = torch.randn(d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def f(z):  # losses that differ from sample to sample at this d
        return (z.double() @ w / d**0.5).to(z.dtype)
    sums, bits, _ = fused_gradient(f, r, param, spec, n, CounterStream(9), 4)
    got = fused_estimate(sums, spec, bits, param)
    want = sums.estimate(spec, None if bits is None else param.expand(bits))
    assert got.dtype == want.dtype == dtype and torch.equal(got, want)
    assert (got != 0).float().mean() > 0.5  # (LOORF: 0 where the n bits agree)
    if dtype == torch.float32:  # the form in float64, rounded once: differs somewhere
        a, b, _, wz, zs, sw, k = sums.bit_sums()
        form = spec.linear(sums.count, sums.sum_j, bits, check=False)
        c = 0.0 if isinstance(form.center, float) else form.center
        g = (param.expand(wz - c * zs) * b.double() + (sw - c * k) * a.double()) / form.norm
        if bits is not None:
            g = g / (1 - param.expand(bits.double()))
        assert not torch.equal(g.float(), want)


def test_the_finish_falls_back_to_the_sums_where_they_are_formed():
    """Sums whose U and B were formed (as after the all-reduce of sample parallelism) are
    finished by SampleSums.estimate itself."""
    param, spec = get_parametrization("escort"), E.get_estimator("arms")
    d = 501
    r = param.logits(_theta(d, seed=2))
    sums, bits, _ = fused_gradient(_problem(d, torch.float32), r, param, spec, 6,
                                   CounterStream(1), 3)
    want = sums.estimate(spec, param.expand(bits))
    sums.U = sums.U  # forms U and B
    assert sums.bit_sums() is None
    assert torch.equal(fused_estimate(sums, spec, bits, param), want)
