"""Escort's theta and affine score (`tab:alternative_param`) in one Numba pass each, for the
fused CPU step: the parametrization the paper prunes with, at its power P = 4, whose torch form
takes about fifteen passes over the bits (squares, sums, a where, reciprocals, negations and two
concatenations). The values are :class:`pbexact.parametrizations.Escort`'s torch values bit for
bit (``tests/test_param_kernels.py``): the same float operations in the same order (torch's
``P / x`` is ``x.reciprocal() * P``), so a run's numbers do not depend on which code formed them.
Every other parametrization, power or device takes pbexact's code (:func:`fast_theta`,
:func:`fast_affine_score` return None)."""

from __future__ import annotations

import numba
import numpy as np
import torch

from pbexact.parametrizations import Escort, Parametrization

# float32 constants: float32 arithmetic stays float32 (a Python literal would make it float64),
# float64 arithmetic promotes them exactly
_ONE, _ZERO = np.float32(1), np.float32(0)


@numba.njit(cache=True, error_model="numpy")
def _escort_theta(r, out):
    """out[i] = a^4 / (a^4 + b^4), a = r[i], b = r[d + i], each fourth power as two squarings."""
    d = out.shape[0]
    for i in range(d):
        a = r[i]
        b = r[d + i]
        sa = a * a
        sb = b * b
        pa = sa * sa
        pb = sb * sb
        out[i] = pa / (pa + pb)


@numba.njit(cache=True, error_model="numpy")
def _escort_affine(r, theta, power, a_out, b_out):
    """(a, b) of Escort.affine_score: p0 = (1 / x0) P and p1 = (1 / x1) P where 0 < theta < 1
    (0 elsewhere: torch's (1 / inf) P), a = [-theta p0, theta p1], b = [p0, -p1]; one loop per
    half (this form vectorizes; one loop writing both halves, or the test inside the
    conditional expression, ran five times slower)."""
    d = theta.shape[0]
    for h in range(2):
        o = h * d
        for i in range(d):
            t = theta[i]
            inside = (t > _ZERO) & (t < _ONE)
            p = (_ONE / r[o + i]) * power if inside else _ZERO
            if h == 0:
                a_out[i] = -t * p
                b_out[i] = p
            else:
                a_out[o + i] = t * p
                b_out[o + i] = -p


def _kernel_ready(param: Parametrization, r: torch.Tensor) -> bool:
    return (type(param) is Escort and param.power == 4.0 and r.device.type == "cpu"
            and r.dtype in (torch.float32, torch.float64) and r.dim() == 1
            and r.is_contiguous() and not r.requires_grad)


def fast_theta(param: Parametrization, r: torch.Tensor) -> torch.Tensor | None:
    """theta(r) (d,) by the kernel where one exists for ``param`` and r (escort, P = 4, a 1-d
    CPU float tensor without autograd); else None (call ``param.theta``)."""
    if not _kernel_ready(param, r):
        return None
    out = torch.empty(r.shape[0] // 2, dtype=r.dtype)
    _escort_theta(r.numpy(), out.numpy())
    return out


def fast_affine_score(param: Parametrization, r: torch.Tensor, theta: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``param.affine_score(r, theta)`` by the kernel where one exists (as :func:`fast_theta`);
    else None."""
    if not (_kernel_ready(param, r) and theta.dtype == r.dtype and theta.is_contiguous()):
        return None
    a, b = torch.empty_like(r), torch.empty_like(r)
    power = np.float32(param.power) if r.dtype == torch.float32 else np.float64(param.power)
    _escort_affine(r.numpy(), theta.numpy(), power, a.numpy(), b.numpy())
    return a, b
