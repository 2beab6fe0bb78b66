"""The fused MC step on the CPU: the masks of a step's n samples drawn from the run's counter
stream (:mod:`pbscale.methods.counter_stream`) and the per-bit sums every estimator needs
accumulated, in Numba kernels that never hold more than two chunks of masks.

A step of n samples is evaluated k = chunk at a time. One kernel pass over the d weights, block by
block, both accumulates the previous chunk's per-bit sums (sum_s w_s z_s and sum_s z_s over its
rows, in float64; w_s the sample weights of pbexact's accumulator, :meth:`SampleSums.weights`) and
writes the next chunk's masks, so each chunk's masks are read and written once; the last chunk is
accumulated alone. The per-bit sums go to pbexact's one accumulator
(:meth:`pbexact.estimators.SampleSums.add_bit_sums`) and the estimator's linear form finishes the
estimate, so every estimator of the registry runs through these kernels unchanged: what differs
is only its sampling law (:data:`pbexact.estimators.LAWS`), read here as a rule on the stream's
24-bit values m (:func:`law_rule`):

* iid (`eq:reinforce_p`): z_s = 1[m_s < t], t = ceil(theta 2^24) (u = m / 2^24 < theta);
* antithetic (DisARM): samples 2q and 2q + 1 share row q: z = 1[m < t], z~ = 1[(2^24 - 1 - m) <
  t], the value reflected (u and 1 - u - 2^-24, both uniform on the grid);
* copula (ARMS, `alg:orig_arms`): z~_s = 1[m_s >= bound], the integer bound of
  :func:`pbscale.methods.samplers.copula_bounds` from the sum of the step's n exponentials
  R_0, whose logs come from float64 products of ``R0_GROUP`` reflected values per row group
  (:func:`copula_log_sum`, a pass over the n rows that only computes: no mask is stored).

The same rows drawn by the torch samplers from the same stream (:class:`CounterStream` given to
them as the generator) are the unfused reference: equal masks bit for bit, and estimates to
round-off (``tests/test_fused_mc.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import torch

from pbexact.errors import PBInputError
from pbexact.estimators import EstimatorSpec, SampleSums
from pbexact.parametrizations import Parametrization

from .copula_kernels import TOP, arms_rho, bounds_from_log_sum, copula_levels
from .counter_stream import GAMMA, CounterStream, high24, low24, mix, row_base, words_per_row
from .param_kernels import fast_affine_score, fast_theta
from .samplers import R0_GROUP, log_of_products, r0_offset

#: Words per block of a kernel pass: the per-bit sums of 2 x 2048 weights (64 KiB) stay in L2.
BLOCK = 2048
#: 2^24 - 1: the reflection of a 24-bit value m is m ^ FLIP = 2^24 - 1 - m.
FLIP = (1 << 24) - 1


@numba.njit(inline="always")
def _accumulate(prev, w, wz, zs):
    """wz += w prev, zs += prev over one row's run of weights (1-d views: LLVM vectorizes
    them, not two-index loads)."""
    for i in range(prev.shape[0]):
        v = np.float64(prev[i])
        wz[i] += w * v
        zs[i] += v


@numba.njit(inline="always")
def _masks(base, j0, fl, invert, t_lo, t_hi, o_lo, o_hi):
    """The masks of one row's words j0, j0 + 1, ...: o_lo[j] from the low half of word j0 + j,
    o_hi[j] from its high half (o_hi may be shorter: odd d), 1[(m ^ fl) < t] or its
    complement."""
    for j in range(o_hi.shape[0]):
        x = mix(base + np.uint64(j0 + j) * GAMMA)
        lo = low24(x) ^ fl
        hi = high24(x) ^ fl
        if invert:
            o_lo[j] = lo >= t_lo[j]
            o_hi[j] = hi >= t_hi[j]
        else:
            o_lo[j] = lo < t_lo[j]
            o_hi[j] = hi < t_hi[j]
    for j in range(o_hi.shape[0], o_lo.shape[0]):
        lo = low24(mix(base + np.uint64(j0 + j) * GAMMA)) ^ fl
        o_lo[j] = (lo >= t_lo[j]) if invert else (lo < t_lo[j])


@numba.njit(cache=True)
def chunk_pass(key, start, W, rows, flips, thr, invert, out, prev, weights, wz, zs):
    """One pass over the weights: accumulate the previous chunk, then write the next one.

    Accumulate: wz += sum_s weights[s] prev[s], zs += sum_s prev[s] over the rows of ``prev``
    (kp, d) (kp = 0: nothing), in float64, rows in order. Write: out[s, i] = 1[(m ^ flips[s]) <
    thr[i]] (``invert``: its complement) for the values m of stream row ``rows[s]`` of the draw
    starting at word ``start`` (W words per row), s < out.shape[0] (0: nothing). Block by block
    of weights, so a block's sums stay in cache over the rows."""
    d = thr.shape[0]
    for j0 in range(0, W, BLOCK):
        j1 = min(j0 + BLOCK, W)
        h0, h1 = W + j0, min(W + j1, d)
        for s in range(weights.shape[0]):
            _accumulate(prev[s, j0:j1], weights[s], wz[j0:j1], zs[j0:j1])
            _accumulate(prev[s, h0:h1], weights[s], wz[h0:h1], zs[h0:h1])
        for s in range(rows.shape[0]):
            base = row_base(key, start, W, rows[s])
            _masks(base, j0, flips[s], invert, thr[j0:j1], thr[h0:h1], out[s, j0:j1],
                   out[s, h0:h1])


@numba.njit(inline="always")
def _products(base, j0, t_lo, t_hi, p_lo, p_hi):
    """p *= v over one row's words j0, j0 + 1, ... (low and high halves), v the reflected value
    of :func:`pbscale.methods.samplers.copula_reflection`: m + 1 where theta > 1/2, 2^24 - m
    elsewhere (exact in float64)."""
    for j in range(p_hi.shape[0]):
        x = mix(base + np.uint64(j0 + j) * GAMMA)
        lo, hi = np.float64(low24(x)), np.float64(high24(x))
        p_lo[j] *= lo + 1.0 if t_lo[j] > 0.5 else TOP - lo
        p_hi[j] *= hi + 1.0 if t_hi[j] > 0.5 else TOP - hi
    for j in range(p_hi.shape[0], p_lo.shape[0]):
        lo = np.float64(low24(mix(base + np.uint64(j0 + j) * GAMMA)))
        p_lo[j] *= lo + 1.0 if t_lo[j] > 0.5 else TOP - lo


@numba.njit(cache=True)
def reflected_products(key, start, W, row0, rows, theta, out):
    """out[g, i] = the product over rows row0 + g G, ..., row0 + g G + G - 1 (G = ``R0_GROUP``;
    the last group holds what is left of the ``rows`` rows) of the reflected value v of
    :func:`pbscale.methods.samplers.copula_reflection` at theta[i] (in [1, 2^24]), in float64,
    rows in order; out (ceil(rows / G), d)."""
    d = out.shape[1]
    out[:] = 1.0
    for j0 in range(0, W, BLOCK):
        j1 = min(j0 + BLOCK, W)
        h0, h1 = W + j0, min(W + j1, d)
        for r in range(rows):
            g = r // R0_GROUP
            base = row_base(key, start, W, row0 + r)
            _products(base, j0, theta[j0:j1], theta[h0:h1], out[g, j0:j1], out[g, h0:h1])


def copula_log_sum(key: np.uint64, start: int, n: int, theta: np.ndarray,
                   groups_per_call: int = 16) -> np.ndarray:
    """sum over the n rows of a draw (starting at word ``start``) of log v_s, (d,) float64, v_s
    the reflected values at theta (d,):
    products of ``R0_GROUP`` consecutive rows in float64, their logs summed group after group
    (:func:`pbscale.methods.samplers.copula_log_sum_reference` on the drawn values, bit for bit);
    memory O(groups_per_call d), flat in n."""
    d = theta.shape[0]
    W = words_per_row(d)
    if n <= R0_GROUP:  # one group: its log is the sum (0 + x = x for the logs, all >= 0)
        out = np.empty((1, d), dtype=np.float64)
        reflected_products(key, np.int64(start), np.int64(W), np.int64(0), np.int64(n), theta,
                           out)
        return np.log(out[0], out=out[0])
    total = np.zeros(d, dtype=np.float64)
    per_call = groups_per_call * R0_GROUP
    for r0 in range(0, n, per_call):
        rows = min(per_call, n - r0)
        out = np.empty((-(-rows // R0_GROUP), d), dtype=np.float64)
        reflected_products(key, np.int64(start), np.int64(W), np.int64(r0), np.int64(rows),
                           theta, out)
        log_of_products(out, total)
    return total


@numba.njit(cache=True)
def grid_thresholds(theta, out):
    """out[i] = ceil(theta[i] 2^24) (float64 product, exact), so that u = m / 2^24 < theta[i]
    exactly when the 24-bit value m < out[i]; theta (d,) float32 or float64, out (d,) int64.
    One pass, no temporaries."""
    for i in range(theta.shape[0]):
        out[i] = np.int64(np.ceil(np.float64(theta[i]) * 16777216.0))


@dataclass
class LawRule:
    """A sampling law read as a rule on the stream's values: a draw of ``rows`` rows; sample s
    is z_s = 1[(m_row(s) ^ flip_s) < thr] (``invert``: its complement), row(s) = ``row_of[s]``
    (int64 (n,)), flip_s = ``flips[s]`` (0 or :data:`FLIP`), thr (d,) int64."""

    rows: int
    row_of: np.ndarray
    flips: np.ndarray
    thr: np.ndarray | None
    invert: bool


def law_rule(law: str, theta: torch.Tensor, n: int) -> LawRule:
    """The rule of ``law`` (:data:`pbexact.estimators.LAWS`) at theta (d,) for n samples; the
    copula's thresholds need the draw (:func:`copula_thresholds`) and are left None."""
    s = np.arange(n, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    if law == "copula":
        return LawRule(n, s, zeros, None, True)
    t = theta.detach().reshape(-1).contiguous().numpy()
    thr = np.empty(t.shape[0], dtype=np.int64)
    grid_thresholds(t, thr)
    if law == "iid":
        return LawRule(n, s, zeros, thr, False)
    if law == "antithetic":  # samples 2q, 2q + 1: row q, the second reflected
        return LawRule(n // 2, s // 2, (s % 2) * FLIP, thr, False)
    raise ValueError(f"no fused rule for the sampling law {law!r}")


def copula_thresholds(theta: np.ndarray, levels: np.ndarray, n: int, key: np.uint64,
                      start: int) -> np.ndarray:
    """ARMS's integer bounds (d,) int64 for the n rows of the draw at word ``start``: z~_s =
    1[m_s >= bound] (:func:`pbscale.methods.samplers.copula_bounds` of R_0 = 24 n ln 2 -
    sum_s log v_s, :func:`copula_log_sum`), from theta (d,) and its levels
    (:func:`pbscale.methods.copula_kernels.copula_levels`)."""
    return bounds_from_log_sum(theta, levels, r0_offset(n), copula_log_sum(key, start, n, theta))


@numba.njit(cache=True, error_model="numpy")
def _finish(wz, zs, centered, center, sw, k, norm, bits, a, b, out):
    """out = (expand(w) b + s a) / norm (/ (1 - bits), per bit, where bits is not empty): the
    linear form of :meth:`pbexact.estimators.LinearEstimate.finish` on affine sums, with w =
    wz - center zs and s = sw - center k in float64 (``centered``; else wz and sw) rounded to
    the scores' dtype, then every operation in that dtype in the order of
    :meth:`pbexact.estimators.SampleSums.centered` and ``LinearEstimate._scale``. wz, zs (d,)
    float64; a, b, out (P,) with P = d times the logits per bit, laid out as
    :meth:`pbexact.parametrizations.Parametrization.expand` repeats a bit's value. IEEE
    division (numpy's error model: x / 0 is inf, as in torch, and the loops vectorize)."""
    d = wz.shape[0]
    tmp = np.empty_like(out[:1])
    tmp[0] = sw - center * k if centered else sw
    s = tmp[0]
    tmp[0] = norm
    nm = tmp[0]
    tmp[0] = 1.0
    one = tmp[0]
    wide = np.empty_like(out[:d])
    for i in range(d):
        wide[i] = wz[i] - center * zs[i] if centered else wz[i]
    for j in range(out.shape[0] // d):
        o = j * d
        if bits.shape[0]:
            for i in range(d):
                out[o + i] = (wide[i] * b[o + i] + s * a[o + i]) / nm / (one - bits[i])
        else:
            for i in range(d):
                out[o + i] = (wide[i] * b[o + i] + s * a[o + i]) / nm


def fused_estimate(sums: SampleSums, spec: EstimatorSpec, bits: torch.Tensor | None,
                   param: Parametrization) -> torch.Tensor:
    """The estimate (P,) of :meth:`pbexact.estimators.SampleSums.estimate` with the constant
    ``param.expand(bits)`` (``bits``: the estimator's per-bit constant (d,), rho; None: it has
    none), bit for bit: from the sums' affine bit sums by one kernel pass (:func:`_finish`:
    no (P,) temporaries) where they are pending, the form has no baseline and the
    parametrization expands by repetition; else by ``sums.estimate``."""
    form = spec.linear(sums.count, sums.sum_j, bits, check=False)
    pending = sums.bit_sums()
    plain_expand = type(param).expand is Parametrization.expand
    if pending is None or not plain_expand or not _is_zero(form.baseline):
        return sums.estimate(spec, None if bits is None else param.expand(bits))
    a, b, _, wz, zs, sw, k = pending
    center = form.center
    centered = not _is_zero(center)
    out = torch.empty_like(a)
    no_bits = np.zeros(0, dtype=a.numpy().dtype)
    _finish(wz.numpy(), zs.numpy(), centered, float(center) if centered else 0.0, float(sw),
            k, form.norm, no_bits if bits is None else bits.numpy(), a.numpy(), b.numpy(),
            out.numpy())
    return out


def _is_zero(x: Any) -> bool:
    return isinstance(x, float) and x == 0.0


_BUFFERS: dict = {}


def _buffers(k: int, d: int, dtype: torch.dtype, reuse: bool) -> list[torch.Tensor]:
    """Two (k, d) mask buffers: cached per process when the masks are not kept past the step's
    evaluation (``reuse``; a fresh buffer per chunk costs page faults), else fresh."""
    if not reuse:
        return [torch.empty((k, d), dtype=dtype) for _ in range(2)]
    key = (k, d, dtype)
    bufs = _BUFFERS.get(key)
    if bufs is None:
        _BUFFERS.clear()
        bufs = _BUFFERS[key] = [torch.empty((k, d), dtype=dtype) for _ in range(2)]
    return bufs


def fused_gradient(f: Any, r: torch.Tensor, param: Parametrization, spec: EstimatorSpec, n: int,
                   stream: CounterStream, chunk: int, shard: Any = None,
                   keep_masks: bool = True) -> tuple[SampleSums, Any, torch.Tensor]:
    """The step's sums of :func:`pbscale.methods.mc.mc_gradient` on the CPU from ``stream``:
    (sums, bits, total J (float64)), the sums those of the unfused path on the same samples and
    bits the estimator's per-bit constant (d,) (rho; None where it has none), which
    :func:`fused_estimate` finishes them with.
    r (P,) on the CPU; chunk k (whole pairs for the antithetic law); ``shard``: this rank's rows
    of each chunk only (the copula's R_0 from all n rows); ``keep_masks``: f may keep the masks
    it is given (autograd of joint training), so each chunk gets fresh memory."""
    theta = fast_theta(param, r)  # escort's kernel, else pbexact's code
    theta = param.theta(r) if theta is None else theta
    d = theta.shape[-1]
    th = theta.numpy()
    levels = None
    if spec.law == "copula":  # the levels of the bounds, before the draw
        levels = copula_levels(th, n)
    bits = None  # the per-bit constant (rho), expanded to the logits only by a fallback
    if spec.constant == "rho":
        # ARMS's by the fused kernels (pbexact's values); DisARM's in numpy (faster
        # transcendentals and where than torch)
        rho = arms_rho(th, n) if spec.law == "copula" else spec.correlation(th, n)
        bits = torch.from_numpy(np.asarray(rho, dtype=th.dtype))
    elif spec.constant is not None:
        raise PBInputError(f"{spec.text}: pbscale's MC step has no constant {spec.constant!r}")
    rule = law_rule(spec.law, theta, n)
    start = stream.take(rule.rows, d)
    thr = (rule.thr if rule.thr is not None
           else copula_thresholds(th, levels, n, stream.key, start))
    key, W = stream.key, np.int64(words_per_row(d))
    whole = spec.law == "antithetic"
    sums = SampleSums(pairs=spec.center == "pair")
    wz = np.zeros(d)
    zs = np.zeros(d)
    bufs = _buffers(chunk, d, r.dtype, not keep_masks)
    no_rows = np.zeros(0, dtype=np.int64)
    none = np.zeros(0)
    losses: list[torch.Tensor] = []
    prev, weights = bufs[1][:0].numpy(), none
    s0, c = 0, 0
    while s0 < n:
        k = min(chunk, n - s0)
        sl = shard.rows(k, whole) if shard is not None else slice(0, k)
        rows = np.arange(s0 + sl.start, s0 + sl.stop, dtype=np.int64)
        s0 += k
        if keep_masks:
            bufs[c % 2] = torch.empty((chunk, d), dtype=r.dtype)
        z = bufs[c % 2][:len(rows)]
        chunk_pass(key, np.int64(start), W, rule.row_of[rows], rule.flips[rows], thr,
                   rule.invert, z.numpy(), prev, weights, wz, zs)
        if len(rows) == 0:
            prev, weights = bufs[1][:0].numpy(), none
            continue
        J = f(z).to(r.dtype)  # (k',)
        losses.append(J)
        weights = sums.weights(J.double()).numpy()
        prev = z.numpy()
        c += 1
    chunk_pass(key, np.int64(start), W, no_rows, no_rows, thr, rule.invert,
               bufs[0][:0].numpy(), prev, weights, wz, zs)
    J = torch.cat(losses) if losses else torch.zeros(0, dtype=r.dtype)
    ab = fast_affine_score(param, r, theta)
    a, b = param.affine_score(r, theta) if ab is None else ab
    if len(J):
        Jd = J.double()
        sums.add_bit_sums(Jd, torch.from_numpy(wz), torch.from_numpy(zs),
                          sums.weights(Jd).sum(-1), a, b, param)
    return sums, bits, J.double().sum()
