"""Escort's theta and affine score by the fused step's kernels
(:mod:`pbscale.methods.param_kernels`) are pbexact's torch values bit for bit (signs of zeros
included, NaN where NaN) over logits from 1e-20 to 1e20 in both signs, zeros, infinities and
NaNs, in float32 and float64; every other parametrization, power, or a tensor with autograd
takes pbexact's code."""

from __future__ import annotations

import pytest
import torch

from pbexact.parametrizations import PARAMETRIZATIONS, Escort, get_parametrization
from pbscale.methods.param_kernels import fast_affine_score, fast_theta


def _logits(d: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    scale = torch.logspace(-20, 20, 2 * d, dtype=torch.float64)[torch.randperm(2 * d,
                                                                               generator=g)]
    r = (torch.randn(2 * d, generator=g, dtype=torch.float64) * scale).to(dtype)
    edges = [0.0, 1.0, -1.0, float("inf"), float("nan"), 1e-30, -1e-30, 1e30, 0.0, 5.0, -0.0]
    other = [0.0, 0.0, 1.0, 1.0, 2.0, 1e-30, 1e30, -1e30, float("nan"), 0.0, 3.0]
    r[:len(edges)] = torch.tensor(edges, dtype=dtype)
    r[d:d + len(other)] = torch.tensor(other, dtype=dtype)
    return r


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    nan = torch.isnan(x)
    return (x.dtype == y.dtype and torch.equal(nan, torch.isnan(y))
            and torch.equal(x[~nan], y[~nan]) and torch.equal(torch.signbit(x[~nan]),
                                                              torch.signbit(y[~nan])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_escort_kernels_are_pbexacts_values_bit_for_bit(dtype):
    param = get_parametrization("escort")
    r = _logits(50_000, dtype)
    want_theta = param.theta(r)
    got_theta = fast_theta(param, r)
    assert got_theta is not None and _same(got_theta, want_theta)
    for theta in (want_theta, torch.rand(50_000, dtype=dtype)):  # any theta given
        want_a, want_b = param.affine_score(r, theta)
        got = fast_affine_score(param, r, theta)
        assert got is not None and _same(got[0], want_a) and _same(got[1], want_b)
    # the comparison is not vacuous: P / x formed as a division differs from torch's
    # x.reciprocal() * P somewhere
    inside = (want_theta > 0) & (want_theta < 1)
    direct = torch.where(inside, 4.0 / r[:50_000].double(), 0.0).to(dtype)
    assert not torch.equal(direct, want_b[:50_000])


@pytest.mark.parametrize("name", sorted(PARAMETRIZATIONS))
def test_other_parametrizations_powers_and_autograd_take_pbexacts_code(name):
    param = get_parametrization(name)
    r = torch.randn(param.num_params(16))
    if name == "escort":
        assert fast_theta(param, r) is not None
        assert fast_theta(Escort(power=2.0), r) is None
        assert fast_theta(param, r.clone().requires_grad_(True)) is None
        assert fast_affine_score(param, r, torch.rand(16, dtype=torch.float64)) is None
    else:
        assert fast_theta(param, r) is None
        assert fast_affine_score(param, r, param.theta(r)) is None
