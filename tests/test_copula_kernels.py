"""ARMS's per-step constants on the CPU (:mod:`pbscale.methods.copula_kernels`) are the values of
their definitions bit for bit: rho of :func:`pbexact.copula.arms_correlation` and the integer
bounds of the formula of :func:`pbscale.methods.samplers.copula_bounds` (written out here as the
numpy expressions it had: branch_side, branch_threshold, an exponential and a ceiling), over
theta in (0, 1), its tails (down to float32's smallest subnormals, up to 1 - 2^-24), the edge
values 0, 1/2, 1, NaN and invalid ones, in float32 and float64, for n from 2 to 1000."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pbexact.copula import arms_correlation, branch_side, branch_threshold
from pbscale.methods import copula_kernels as K
from pbscale.methods.samplers import copula_bounds

NS = (2, 3, 10, 40, 41, 100, 1000)
EDGES = [0.0, 1.0, 0.5, np.nan, 1e-30, 1 - 1e-16, 0.49999997, 0.5000001, 1e-45, 2.0, -1.0,
         np.inf]


def _thetas(dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tiny = 10.0 ** rng.uniform(-45, -1, 20000)  # subnormal m * m in float32 included
    parts = [rng.uniform(0, 1, 20000), tiny, 1 - tiny, rng.uniform(0.49, 0.51, 2000),
             np.array(EDGES)]
    return np.concatenate(parts).astype(dtype)


def _bounds_definition(theta: np.ndarray, n: int, r0: np.ndarray) -> np.ndarray:
    """The bound as copula_bounds computed it before the kernels, in numpy: c by
    branch_threshold of branch_side's m (float64), e = exp(-c R_0), then the ceiling."""
    t = theta.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c = branch_threshold(branch_side(t)[1], n)
        e = np.exp(c * -r0)
    e = np.where(np.minimum(t, 1 - t) > 0, e, 0.0)
    top = float(1 << 24)
    b = np.where(t > 0.5, np.ceil(top * e - 1.0), np.ceil(top - top * e))
    return np.minimum(np.maximum(b, 0.0), top).astype(np.int64)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", NS)
def test_rho_is_arms_correlation_bit_for_bit(dtype, n):
    theta = _thetas(dtype)
    with np.errstate(all="ignore"):
        want = arms_correlation(theta, n)
    got = K.arms_rho(theta, n)
    assert _same(want, got), np.flatnonzero(~((want == got) | (np.isnan(want) & np.isnan(got))))
    assert got[np.isnan(theta) | (theta <= 0) | (theta >= 1)].tolist() == [0.0] * int(
        (np.isnan(theta) | (theta <= 0) | (theta >= 1)).sum())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", NS)
def test_bounds_are_the_formula_bit_for_bit(dtype, n):
    theta = _thetas(dtype, seed=n)
    rng = np.random.default_rng(n)
    # R_0 = sum of n standard exponentials: from near 0 to far out in its tail
    r0 = rng.gamma(n, 1.0, theta.shape[0]) * rng.choice([1e-3, 1.0, 5.0], theta.shape[0])
    got = K.bounds_from_levels(theta, K.copula_levels(theta, n), r0)
    want = _bounds_definition(theta, n, r0)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:5]
    # and the sampler's entry point returns them (as float64)
    via = copula_bounds(torch.from_numpy(theta), n, torch.from_numpy(r0))
    assert np.array_equal(via.numpy().astype(np.int64), want)
    assert 0 < (want == 0).sum() and 0 < (want == 1 << 24).sum()  # both ends are met
    # the fused step's entry: R_0 = 24 n ln 2 - sum log v, never formed
    offset = 24 * n * np.log(2.0)
    log_sum = rng.uniform(0, offset, theta.shape[0])
    assert np.array_equal(K.bounds_from_log_sum(theta, K.copula_levels(theta, n), offset,
                                                log_sum),
                          _bounds_definition(theta, n, offset - log_sum))


def test_levels_are_branch_threshold_inside_and_unread_outside():
    theta = _thetas(np.float32)
    L = K.copula_levels(theta, 10)
    m = branch_side(theta.astype(np.float64))[1]
    inside = m > 0
    with np.errstate(all="ignore"):
        assert np.array_equal(L[inside], -branch_threshold(m[inside], 10))
    assert (L[~inside] == 0).all()


def test_a_wrong_rho_is_caught():
    """The comparison is not vacuous: one float32 rounding changed (m^2 formed in float64)
    differs from the definition somewhere in the theta tested."""
    theta = _thetas(np.float32)
    with np.errstate(all="ignore"):
        want = arms_correlation(theta, 10)
        m = np.minimum(theta, 1 - theta).astype(np.float64)
        wrong = want.astype(np.float64) + (m * m - (m * m).astype(np.float32)) / (
            theta.astype(np.float64) * (1 - theta))
    assert not _same(want, wrong.astype(np.float32))


@pytest.mark.parametrize("n", [1, 2, 40, 41, 100, 700])
def test_the_fused_log_sum_is_the_references_bit_for_bit(n):
    """copula_log_sum (the R_0 pass: products of 40 rows, their logs summed group by group; one
    group's log returned as the sum) against copula_log_sum_reference on the same drawn rows,
    below, at and beyond one group and one call of 16 groups."""
    from pbscale.methods.counter_stream import CounterStream, stream_values
    from pbscale.methods.fused import copula_log_sum
    from pbscale.methods.samplers import copula_log_sum_reference, copula_reflection

    d = 301
    theta = _thetas(np.float32)[:d]
    stream = CounterStream(4)
    start = stream.take(n, d)
    m = stream_values(stream.key, start, d, n, dtype=torch.float64)
    scale, offset = copula_reflection(torch.from_numpy(theta))
    want = copula_log_sum_reference(offset + scale * m).numpy()
    got = copula_log_sum(stream.key, start, n, theta)
    assert np.array_equal(got, want)
