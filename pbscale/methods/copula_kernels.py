"""ARMS's per-step constants on the CPU (`alg:orig_arms`, `alg:iter_dir`): its correlation rho
and the integer bounds of its samples, for theta (d,) in numpy, in a few Numba passes around
numpy's vectorized transcendental functions (log, expm1, log1p, exp: numpy's SIMD kernels,
several times faster than the scalar libm calls a Numba loop makes), every temporary written in
place; a kernel that divides uses numpy's error model (IEEE division, vectorized: Python's
raises on a zero divisor, which keeps LLVM from vectorizing the loop).

The values are those of the definitions, bit for bit (``tests/test_copula_kernels.py``): the same
floating-point operations on the same values in the same order, only fused into fewer passes:

* :func:`arms_rho` is :func:`pbexact.copula.arms_correlation` on a numpy theta (in theta's
  dtype: float32 for float32 logits);
* :func:`copula_levels` is -c, c = :func:`pbexact.copula.branch_threshold` of the branch's m =
  min(theta, 1 - theta) in float64 (:func:`pbexact.copula.branch_side`), formed once per step,
  before the draw;
* :func:`bounds_from_levels` is the integer bound of ARMS's samples from those levels and R_0
  (what :func:`pbscale.methods.samplers.copula_bounds` returns, which calls it), and
  :func:`bounds_from_log_sum` the same from 24 n ln 2 and the sum of logs, R_0 never formed
  (the fused step's entry).
"""

from __future__ import annotations

import numba
import numpy as np

#: 2^24 as a float: the grid of the 24-bit values m.
TOP = float(1 << 24)


# Constants as float32 literals: with a float32 theta the arithmetic stays in float32, with a
# float64 theta it is promoted to float64 (0, 1, 1/2, 2 and -1 are exact in both). A Python
# literal (0) would make an expression float64 in both.
_ZERO, _ONE, _HALF, _TWO = np.float32(0), np.float32(1), np.float32(0.5), np.float32(2)
_MINUS_ONE = np.float32(-1)


@numba.njit(cache=True)
def _rho_level_input(theta, out):
    """out = off of :func:`pbexact.copula.arms_correlation`: (1 - sign(var)) 0.5 + m, var =
    theta (1 - theta), m = min(theta, 1 - theta) (m inside (0, 1), 1/2 at theta 0 or 1), in
    theta's dtype."""
    for i in range(theta.shape[0]):
        t = theta[i]
        q = _ONE - t
        m = t if t < q else q
        off = _ONE - np.sign(t * q)
        off *= _HALF
        out[i] = off + m


@numba.njit(cache=True)
def _double_clip(x, cut):
    """x = max(2 x, -1) in place, arms_correlation's clip(c, -1) of c = -2 (-x), except where
    that is -1 (or NaN): there x = 0 and cut = True. log1p(-1) = -inf and NaN take numpy's slow
    path; (1 - 2c)_+^(n-1) is 0 there (:func:`_rho_finish` writes it)."""
    for i in range(x.shape[0]):
        v = x[i] * _TWO
        c = not v > _MINUS_ONE
        cut[i] = c
        x[i] = _ZERO if c else v


@numba.njit(cache=True, error_model="numpy")
def _rho_finish(theta, cut, both):
    """both = (both - m^2) / var where var = theta (1 - theta) > 0 (both = 0 where ``cut``),
    else 0, in place."""
    for i in range(theta.shape[0]):
        t = theta[i]
        q = _ONE - t
        m = t if t < q else q
        var = t * q
        b = _ZERO if cut[i] else both[i]
        both[i] = (b - m * m) / var if var > _ZERO else _ZERO


def arms_rho(theta: np.ndarray, n: int) -> np.ndarray:
    """rho (d,) of ARMS's n samples at theta (d,) float32 or float64: the values of
    :func:`pbexact.copula.arms_correlation` (0 where theta is 0, 1 or invalid), bit for bit."""
    x = np.empty_like(theta)
    cut = np.empty(theta.shape[0], dtype=np.bool_)
    _rho_level_input(theta, x)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.log(x, out=x)
        np.divide(x, n - 1, out=x)
        np.expm1(x, out=x)  # -c, c = branch_threshold(off, n)
    _double_clip(x, cut)  # clip(-2 c, -1)
    np.log1p(x, out=x)
    np.multiply(x, n - 1, out=x)
    np.exp(x, out=x)  # (1 - 2c)_+^(n-1) where not cut
    _rho_finish(theta, cut, x)
    return x


@numba.njit(cache=True)
def _branch_m(theta, out):
    """out = m = min(theta, 1 - theta) in float64 (:func:`pbexact.copula.branch_side` of
    theta as float64) where m > 0; 1 elsewhere (theta 0, 1 or invalid: its bound does not read
    the level, and log(0) takes numpy's slow path)."""
    for i in range(theta.shape[0]):
        t = np.float64(theta[i])
        q = 1.0 - t
        m = t if t < q else q
        out[i] = m if m > 0 else 1.0


def copula_levels(theta: np.ndarray, n: int) -> np.ndarray:
    """L = -c (d,) float64, c = 1 - m^(1/(n-1)) the branch threshold of theta (d,), as
    :func:`pbexact.copula.branch_threshold` computes it: -expm1(log(m) / (n - 1)); 0 where
    theta is 0, 1 or invalid (never read: :func:`bounds_from_levels` takes exp(-c R_0) as 0
    there)."""
    L = np.empty(theta.shape[0], dtype=np.float64)
    _branch_m(theta, L)
    np.log(L, out=L)
    np.divide(L, n - 1, out=L)
    np.expm1(L, out=L)
    return L


@numba.njit(cache=True)
def _exponent(levels, r0, out):
    """out = L R_0 = -c R_0, the exponent of exp(-c R_0)."""
    for i in range(levels.shape[0]):
        out[i] = levels[i] * r0[i]


@numba.njit(cache=True)
def _exponent_of_sum(levels, offset, log_sum, out):
    """out = L (offset - log_sum): :func:`_exponent` of R_0 = offset - log_sum, one pass."""
    for i in range(levels.shape[0]):
        out[i] = levels[i] * (offset - log_sum[i])


@numba.njit(cache=True)
def _int_bounds(theta, e, out):
    """out[i] = the integer bound of :func:`bounds_from_levels` from theta and e = exp(-c R_0),
    int64 in [0, 2^24]."""
    for i in range(theta.shape[0]):
        t = np.float64(theta[i])
        ei = e[i] if min(t, 1.0 - t) > 0 else 0.0
        b = np.ceil(TOP * ei - 1.0) if t > 0.5 else np.ceil(TOP - TOP * ei)
        out[i] = np.int64(min(max(b, 0.0), TOP))


def bounds_from_levels(theta: np.ndarray, levels: np.ndarray, r0: np.ndarray) -> np.ndarray:
    """The integer bound (d,) int64, in [0, 2^24], with z~ = 1[m >= bound] for ARMS's samples
    whose n exponentials sum to R_0 = ``r0`` (d,) float64 (`alg:orig_arms`, `alg:iter_dir`),
    from theta (d,) and its levels L = -c (:func:`copula_levels`): theta > 1/2: m + 1 >= 2^24
    exp(-c R_0); otherwise 2^24 - m <= 2^24 exp(-c R_0). theta 0 or 1 (or NaN): exp(-c R_0) is
    taken as 0, so the bound is 2^24 (never) resp. 0 (always)."""
    e = np.empty(theta.shape[0], dtype=np.float64)
    _exponent(levels, r0, e)
    return _bounds_of_exponent(theta, e)


def bounds_from_log_sum(theta: np.ndarray, levels: np.ndarray, offset: float,
                        log_sum: np.ndarray) -> np.ndarray:
    """:func:`bounds_from_levels` with R_0 = offset - log_sum (offset = 24 n ln 2, log_sum =
    sum_s log v_s (d,) float64), R_0 never formed (the same values)."""
    e = np.empty(theta.shape[0], dtype=np.float64)
    _exponent_of_sum(levels, offset, log_sum, e)
    return _bounds_of_exponent(theta, e)


def _bounds_of_exponent(theta: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The bounds from the exponents e = -c R_0 (exp taken in place)."""
    with np.errstate(over="ignore", invalid="ignore"):
        np.exp(e, out=e)
    out = np.empty(theta.shape[0], dtype=np.int64)
    _int_bounds(theta, e, out)
    return out
