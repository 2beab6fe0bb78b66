"""Samplers of the MC estimators' laws (`pbexact.estimators.LAWS`) in torch, with an explicit
``torch.Generator`` (same seed, same numbers): iid Bernoulli (`eq:reinforce_p`), ARMS's Dirichlet
copula (`alg:orig_arms`, `alg:iter_dir`), DisARM's antithetic pairs, one sampler per run
(:class:`PerRunSampler`), replayed samples (:class:`FixedSampler`), and the chunk size k of a
step's O(k d) working set (:func:`auto_chunk`). Every sampler has ``next(k) -> (k, ..., d)``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from pbexact.copula import branch_side, branch_threshold
from pbexact.errors import PBInputError, check_n, format_bytes

from .copula_kernels import bounds_from_levels, copula_levels
from .counter_stream import BITS, CounterStream

# ---------------------------------------------------------------------------------------------
# Sampling with an explicit torch.Generator (same seed, same numbers)


def standard_gamma(alpha: float, shape: tuple[int, ...], generator: torch.Generator,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Gamma(alpha, 1) draws for alpha >= 1 by Marsaglia and Tsang's method, using only
    ``generator`` (torch's own gamma sampler takes no generator). Shape ``shape``."""
    if alpha < 1:
        raise PBInputError(f"standard_gamma needs alpha >= 1, got {alpha}")
    device = generator.device
    a = alpha - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * a)
    out = torch.empty(shape, dtype=torch.float64, device=device).reshape(-1)
    todo = torch.arange(out.numel(), device=device)
    while todo.numel():
        x = torch.randn(todo.numel(), generator=generator, dtype=torch.float64, device=device)
        u = torch.rand(todo.numel(), generator=generator, dtype=torch.float64, device=device)
        v = (1 + c * x) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * x**2 + a - a * v + a * torch.log(v.clamp_min(1e-300)))
        out[todo[ok]] = (a * v)[ok]
        todo = todo[~ok]
    return out.reshape(shape).to(dtype)


class BernoulliSampler:
    """z ~ prod_i Bern(theta_i) (`eq:reinforce_p`), k at a time: z = 1[u < theta].

    For float32 theta on the CPU, u = m / 2^24 with m uniform on {0, ..., 2^24 - 1} (the
    resolution of torch.rand in float32), m being 24 bits of each 32-bit half of ``random_()``
    int64 draws (uniform on [0, 2^63 - 1]), which the CPU generator makes faster than float
    uniforms; u < theta is tested as m < theta 2^24, exact in float32. Elsewhere u comes from
    torch.rand. Either way the samples depend only on the generator's state. ``generator`` may
    be a :class:`CounterStream` (the CPU's stream of MC samples; any dtype): u = m / 2^24 from it.
    """

    _BITS = 24

    def __init__(self, theta: torch.Tensor, generator: torch.Generator) -> None:
        self.theta = theta
        self.generator = generator
        self._scaled: torch.Tensor | None = None
        if theta.device.type == "cpu" and (theta.dtype == torch.float32
                                           or isinstance(generator, CounterStream)):
            self._scaled = theta * float(1 << self._BITS)  # exact: a power-of-two scaling

    def next(self, k: int) -> torch.Tensor:
        shape = (k,) + tuple(self.theta.shape)
        if self._scaled is None:
            u = torch.rand(shape, generator=self.generator, dtype=self.theta.dtype,
                           device=self.theta.device)
            return torch.lt(u, self.theta, out=u)  # 1[u < theta] over u, in theta's dtype
        u = uniform_bits24(shape, self.generator)
        return torch.lt(u, self._scaled, out=u)


def uniform_bits24(shape: tuple[int, ...], generator: torch.Generator | CounterStream
                   ) -> torch.Tensor:
    """float32 m, uniform on {0, ..., 2^24 - 1}, of shape ``shape``, from a CPU generator: 24
    bits of each 32-bit half of ``random_()`` int64 draws (uniform on [0, 2^63 - 1]), which
    the CPU generator makes much faster than float uniforms (m / 2^24 is torch.rand's float32
    resolution), or the next rows of a :class:`CounterStream` (:meth:`CounterStream.bits24`).
    Each row (last dimension, d values) takes ceil(d/2) words, so the stream does not depend on
    how the rows are split into chunks, odd d included."""
    if isinstance(generator, CounterStream):
        return generator.bits24(shape)
    d = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if shape else 1
    words = torch.empty((rows, (d + 1) // 2), dtype=torch.int64)
    words.random_(generator=generator)
    m = words.view(torch.int32)[:, :d].bitwise_and_((1 << 24) - 1)
    # m as float32 (exact: m < 2^24) over the same memory: an elementwise in-place cast,
    # which spares a fresh (k, d) buffer (a fresh buffer costs more than the cast itself)
    u = words.view(torch.float32)[:, :d]
    u.copy_(m)
    return u.reshape(shape)  # a copy only for odd d


#: Rows per float64 product of ARMS's reflected values (each v <= 2^24, so 40 of them stay
#: below 2^960, float64's normal range).
R0_GROUP = 40


def r0_offset(n: int) -> float:
    """24 n ln 2, the part of R_0 = sum_s -log(v_s / 2^24) = 24 n ln 2 - sum_s log v_s that does
    not depend on the draw (the one rounding both the sampler and the fused step take)."""
    return 24 * n * math.log(2.0)


def copula_reflection(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, offset), float64 of theta's shape, with the reflected value v = scale m + offset
    of a 24-bit value m: m + 1 where theta > 1/2, 2^24 - m elsewhere (in [1, 2^24]), so that
    U = v / 2^24 is never 0 and the sample bit of both branches is 1[m >= bound]
    (:func:`copula_bounds`). Formed in numpy (faster than torch's float64 CPU kernels here)."""
    hi = (theta.detach().cpu().numpy() > 0.5).astype(np.float64)
    scale, offset = 2 * hi - 1, 1 - hi
    offset *= 2.0**24
    offset += hi
    return torch.from_numpy(scale), torch.from_numpy(offset)


def log_of_products(prods: np.ndarray, total: np.ndarray) -> None:
    """total += log prods[g] for the rows g of prods (groups, d) float64 (overwritten by its
    logs), one after another:
    numpy's log (a third of torch's float64 CPU log here), the one both the copula sampler's
    reference and the fused kernel's R_0 take."""
    np.log(prods, out=prods)  # in place: the caller's scratch
    for row in prods:
        total += row


def copula_log_sum_reference(v: torch.Tensor) -> torch.Tensor:
    """sum over the rows of v (n, d) of log v_s, float64 (d,): the product of each group of
    ``R0_GROUP`` consecutive rows (the last may be shorter), multiplied row after row in
    float64, its log, the logs summed group after group (:func:`log_of_products`; the definition
    the fused kernel, :func:`pbscale.methods.fused.copula_log_sum`, follows bit for bit)."""
    prods = []
    for g0 in range(0, v.shape[0], R0_GROUP):
        prod = v[g0].double().clone()
        for row in v[g0 + 1:g0 + R0_GROUP]:
            prod.mul_(row)
        prods.append(prod)
    total = np.zeros(v.shape[1:], dtype=np.float64)
    log_of_products(torch.stack(prods).numpy(), total)
    return torch.from_numpy(total)


def copula_bounds(theta: torch.Tensor, n: int, r0: torch.Tensor) -> torch.Tensor:
    """The integer bound (float64 (d,) for theta (d,), in [0, 2^24]) with z~ = 1[m >= bound] for
    ARMS's n samples whose exponentials sum to R_0 = ``r0`` (`alg:orig_arms`, `alg:iter_dir`):
    with c = 1 - m_b^(1/(n-1)) (:func:`pbexact.copula.branch_threshold`), theta > 1/2:
    m + 1 >= 2^24 exp(-c R_0); otherwise 2^24 - m <= 2^24 exp(-c R_0). theta 0 or 1: exp(-c R_0)
    is taken as 0, so the bound is 2^24 (never) resp. 0 (always). Computed by
    :mod:`pbscale.methods.copula_kernels` (:func:`copula_levels`, :func:`bounds_from_levels`),
    the kernels the fused CPU step calls."""
    t = theta.detach().reshape(-1).cpu().numpy()
    r = r0.detach().double().reshape(-1).cpu().numpy()
    out = bounds_from_levels(t, copula_levels(t, n), r).astype(np.float64)
    return torch.from_numpy(out).reshape(theta.shape)


class CopulaSampler:
    """ARMS samples from the Dirichlet copula (`alg:orig_arms`, `alg:iter_dir`), k at a time, in
    theta's dtype and without any host synchronization (no data-dependent loop).

    u~ depends on the Dirichlet fractions D_s = E_s / R_0 only (E_s = -log U_s, R_0 = sum of the
    n E_s), and the bits of `alg:orig_arms`, z~ = 1[u~ <= theta] (theta > 1/2) and
    1[1 - u~ <= theta] (otherwise) with u~ = 1 - (1 - D)^(n-1), are threshold tests on D:
    D <= c and D >= c, c = 1 - (1 - theta)^(1/(n-1)) resp. 1 - theta^(1/(n-1)) (computed once per
    step, d values, log and expm1). Two ways to the same law:

    * on the CPU, float32 or drawn from a :class:`CounterStream`, with n d <= 2^24 (integer
      thresholds): the step's n rows of 24-bit values m are drawn at its first chunk (at most
      64 MiB) and served chunk by chunk, so every chunking gives the same samples. U_s = v_s /
      2^24 with the reflected value v_s = m_s + 1 where theta > 1/2 and 2^24 - m_s elsewhere
      (:func:`copula_reflection`: torch.rand's float32 grid, never 0). D_s <= c is E_s <= c R_0,
      i.e. U_s >= exp(-c R_0), and D_s >= c is U_s <= exp(-c R_0): both read m_s >= an integer
      bound per coordinate (:func:`copula_bounds`), so a sample costs what a Bernoulli sample
      does (one comparison per element) plus R_0 = 24 n ln 2 - sum_s log v_s, the logs of
      float64 products of ``R0_GROUP`` rows summed in float64 (:func:`copula_log_sum_reference`;
      the fused CPU step, :mod:`pbscale.methods.fused`, computes the same products bit for bit).
    * otherwise (GPU, float64, larger n d): a uniform stick-breaking, Q_0 = 1, Q_s = Q_(s-1)
      U_s^(1/(n-s)) (Q_n = 0), D_s = Q_(s-1) - Q_s, the Q of a chunk a running product over its
      rows, O(d) state; the sign of the test rides on Q. No power of a (k, d) array is taken, so
      float32 keeps the tails (theta near 0 or 1); D has an absolute rounding error of about 1e-7
      (float32), which moves P(z~_i = 1) by at most about n 1e-7 (1 - theta_i) (resp. theta_i).
      A chunk is nine kernels on a GPU (a launch-bound step: the H100 spent 0.64 ms on the 27
      of an earlier form): the exponents 1 / (n - s) are cached per (n, first row, k) with
      +inf for the last draw (log U * inf = -inf: it takes the whole stick left), and the
      running product starts from the previous chunk's Q in the row above the chunk, so one
      product and one difference give every D of the chunk.
    """

    def __init__(self, theta: torch.Tensor, n: int, generator: torch.Generator) -> None:
        self.theta = theta
        self.n = check_n(n, "ARMS", 2)
        self.generator = generator
        self.drawn = 0
        cpu = theta.device.type == "cpu"
        ints = cpu and (theta.dtype == torch.float32 or isinstance(generator, CounterStream))
        self._ints = ints and self.n * theta.numel() <= _ALL_DRAWS_ELEMENTS
        # the branch and its threshold c = 1 - m^(1/(n-1)), m = 1 - theta (theta > 1/2) or
        # theta, by log and expm1 (a few ulps of the dtype, also for m near 0 or 1)
        if self._ints:  # the reflected values v = scale m + offset and their bound, per weight
            self._scale, self._offset = copula_reflection(theta.detach().reshape(-1))
            self._bound: torch.Tensor | None = None  # z~ = 1[m >= bound], once R_0 is known
            self._m: torch.Tensor | None = None  # the step's n rows of m, drawn at draw 1
            return
        hi, m = branch_side(theta.detach())
        c = branch_threshold(m, self.n)
        if theta.device.type == "cpu":  # +1 / -1 (faster than torch.where on the CPU)
            self._sign = hi.to(theta.dtype).mul_(2).sub_(1)
        else:  # one kernel (the same +-1; exact in every dtype)
            self._sign = torch.where(hi, 1.0, -1.0).to(theta.dtype)
        self._bound = c.mul_(self._sign)  # z = 1[sign D <= sign c]
        self._q = self._sign  # sign Q of the last draw (sign times the stick left); read only

    def _check(self, k: int) -> int:
        first = self.drawn + 1
        if first + k - 1 > self.n:
            raise PBInputError(f"all n={self.n} ARMS samples of this step were already drawn")
        return first

    # --- float32 on the CPU: integer thresholds on the sum of exponentials ------------------

    def _start_step(self, m: torch.Tensor) -> None:
        """R_0 = sum_s E_s = 24 n ln 2 - sum_s log v_s over the step's n draws m (n, d)
        (:func:`copula_log_sum_reference`), then the bound per coordinate
        (:func:`copula_bounds`)."""
        v = torch.addcmul(self._offset, self._scale, m.double())
        self._r0 = r0_offset(self.n) - copula_log_sum_reference(v)
        self._bound = copula_bounds(self.theta.detach().reshape(-1), self.n, self._r0).to(m.dtype)

    def _draw_ints(self, k: int, bits: bool) -> torch.Tensor:
        first = self._check(k)
        if first == 1:
            self._m = uniform_bits24((self.n, self.theta.numel()), self.generator)
            self._start_step(self._m)
        m = self._m[first - 1:first - 1 + k]  # each row is served once
        self.drawn += k
        shape = (k,) + tuple(self.theta.shape)
        if bits:  # z~ = 1[m >= bound]: over m's memory when the chunk is the whole step (the
            # next step draws a new buffer), else in a fresh tensor: a view of the step's draws
            # shares their version counter, and autograd (joint runs save a chunk's masks for
            # the weights' backward) would see it bumped by the next chunk's comparison
            out = m if k == self.n else torch.empty_like(m)
            return torch.ge(m, self._bound, out=out).reshape(shape)
        E = 24 * math.log(2.0) - torch.addcmul(self._offset, self._scale, m.double()).log_()
        return E.div_(self._r0).to(self.theta.dtype).reshape(shape)  # D_s = E_s / R_0

    # --- elsewhere: stick-breaking -------------------------------------------------------

    def _draw(self, k: int, bits: bool) -> torch.Tensor:
        """The next k draws, s = drawn + 1, ..., drawn + k, shape (k, d): z~ if ``bits``, else
        sign D_s (sign = +1 where theta > 1/2, -1 elsewhere), by stick-breaking."""
        first = self._check(k)
        dev, dt = self.theta.device, self.theta.dtype
        shape = (k,) + tuple(self.theta.shape)
        rows = (k,) + (1,) * self.theta.dim()
        per_row = _exponents(self.n, first, k, dt, dev).view(rows)  # 1 / (n - s), inf at s = n
        cpu = dev.type == "cpu"
        if dt == torch.float32 and cpu:
            # U = m / 2^24, torch.rand's float32 grid (U = 0: log U = -inf, U^(1/(n-s)) = 0)
            out = uniform_bits24(shape, self.generator).mul_(2.0**-24)
        else:
            out = torch.rand(shape, generator=self.generator, dtype=dt, device=dev)
        block = max(1, _CACHE_ELEMENTS // max(self.theta.numel(), 1)) if cpu else k
        for b0 in range(0, k, block):
            b1 = min(b0 + block, k)
            # log U^(1/(n-s)); -inf for s = n: the last draw takes the whole remaining stick
            L = out[b0:b1].log_().mul_(per_row[b0:b1])
            self._q = break_sticks(L, self._q, row_loop=cpu)
            if bits:
                torch.le(L, self._bound, out=L)
        self.drawn = first + k - 1
        return out

    def fractions(self, k: int) -> torch.Tensor:
        """The next k Dirichlet fractions D_s (k, d), s = drawn + 1, ..., drawn + k."""
        if self._ints:
            return self._draw_ints(k, bits=False)
        return self._draw(k, bits=False).mul_(self._sign)

    def next(self, k: int) -> torch.Tensor:
        """z~ of the next k samples, (k, d), in theta's dtype."""
        if self._ints:
            return self._draw_ints(k, bits=True)
        return self._draw(k, bits=True)


def break_sticks(L: torch.Tensor, q: torch.Tensor, row_loop: bool) -> torch.Tensor:
    """One block of stick-breaking: L (b, ...) holds log U_s^(1/(n-s)) of b draws and q (...)
    sign Q of the draw before them; overwrites L with sign D_s = sign Q_(s-1) - sign Q_s,
    Q_s = Q_(s-1) U_s^(1/(n-s)), and returns sign Q of the last draw (a new tensor). The running
    product starts from q in the row above the block, so one product and one difference cover
    the block; ``row_loop``: by rows (the CPU: 3x faster than its cumprod along dim 0), else one
    cumprod (the same products in the same order)."""
    Q = _scratch((L.shape[0] + 1,) + tuple(L.shape[1:]), L)
    Q[0].copy_(q)
    torch.exp(L, out=Q[1:])
    if row_loop:
        qs = Q.unbind(0)
        for i in range(1, len(qs)):
            qs[i].mul_(qs[i - 1])
    else:
        Q.cumprod_(0)
    torch.sub(Q[:-1], Q[1:], out=L)
    return Q[-1].clone()


#: The CPU float32 copula sampler keeps a step's n d draws up to this many (64 MiB); beyond,
#: stick-breaking with O(d) state (a chunked step's memory stays flat in n).
_ALL_DRAWS_ELEMENTS = 1 << 24
#: Elements of a block of rows the CPU stick-breaking works on at once (about 256 KiB float32).
_CACHE_ELEMENTS = 1 << 16
_SCRATCH: dict = {}
#: The stick-breaking exponents of recent (n, first row, k, dtype, device), at most 16.
_EXPONENTS: dict = {}


def _exponents(n: int, first: int, k: int, dtype: torch.dtype, device: torch.device
               ) -> torch.Tensor:
    """1 / (n - s) for the draws s = first, ..., first + k - 1 of a step of n, +inf for s = n
    (the last draw: log U * inf = -inf for every U in [0, 1)), shape (k,); cached (a step's
    chunks repeat, and each fresh vector costs kernels on a GPU)."""
    key = (n, first, k, dtype, device)
    e = _EXPONENTS.get(key)
    if e is None:
        if len(_EXPONENTS) >= 16:
            _EXPONENTS.pop(next(iter(_EXPONENTS)))
        s = torch.arange(first, first + k, device=device, dtype=dtype)
        e = (n - s).clamp_min(1).reciprocal_()
        if first + k - 1 == n:
            e[-1] = math.inf
        _EXPONENTS[key] = e
    return e


def release_scratch() -> None:
    """Drop the cached scratch tensor and stick-breaking exponents, so that the next ones are
    allocated anew (a CUDA graph capture that allocates them keeps them in the graph's own
    memory pool, safe from reuse when a later shape evicts them)."""
    _SCRATCH.clear()
    _EXPONENTS.clear()


def _scratch(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """One cached scratch tensor per process (the latest shape, dtype and device only): a fresh
    (k, d) buffer per chunk costs page faults on the CPU that can exceed the arithmetic. Only
    for intermediates that never leave the function that asks for them."""
    key = (tuple(shape), like.dtype, like.device)
    buf = _SCRATCH.get(key)
    if buf is None:
        _SCRATCH.clear()
        buf = _SCRATCH[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
    return buf


class AntitheticSampler:
    """DisARM's antithetic pairs, k at a time (k even), interleaved: sample 2j is
    z = 1[u < theta] and sample 2j + 1 is z~ = 1[1 - u < theta] for one u ~ U(0, 1)^d
    (`pbexact.sampling.sample_antithetic` in torch). From a :class:`CounterStream` the pair's
    uniform is a 24-bit value m: z = 1[m < theta 2^24] and z~ = 1[(2^24 - 1 - m) < theta 2^24]
    (1 - u - 2^-24 on torch.rand's float32 grid: uniform there too)."""

    def __init__(self, theta: torch.Tensor, generator: torch.Generator) -> None:
        self.theta = theta
        self.generator = generator

    def next(self, k: int) -> torch.Tensor:
        if k % 2:
            raise PBInputError(f"antithetic pairs come two at a time, asked for {k} samples")
        shape = (k // 2,) + tuple(self.theta.shape)
        if isinstance(self.generator, CounterStream):
            m = self.generator.bits24(shape)
            t = self.theta * float(1 << BITS)
            pairs = torch.stack([m < t, (2.0**BITS - 1) - m < t], 1).to(self.theta.dtype)
            return pairs.reshape((k,) + tuple(self.theta.shape))
        u = torch.rand(shape, generator=self.generator, dtype=self.theta.dtype,
                       device=self.theta.device)
        pairs = torch.stack([u < self.theta, 1 - u < self.theta], 1).to(self.theta.dtype)
        return pairs.reshape((k,) + tuple(self.theta.shape))


#: The torch sampler of each law of `pbexact.estimators.LAWS`: (theta, n, generator) -> sampler.
SAMPLERS: dict[str, Callable[[torch.Tensor, int, torch.Generator], Any]] = {
    "iid": lambda theta, n, gen: BernoulliSampler(theta, gen),
    "copula": lambda theta, n, gen: CopulaSampler(theta, n, gen),
    "antithetic": lambda theta, n, gen: AntitheticSampler(theta, gen),
}


class FixedSampler:
    """Replays given samples (n, d) chunk by chunk (tests feed identical samples to pbexact)."""

    def __init__(self, z: torch.Tensor) -> None:
        self.z = z
        self.pos = 0

    def next(self, k: int) -> torch.Tensor:
        out = self.z[self.pos : self.pos + k]
        self.pos += k
        return out


# ---------------------------------------------------------------------------------------------
# Chunk size


def auto_chunk(n: int, bytes_per_sample: int, device: torch.device | str = "cpu",
               fraction: float = 0.25) -> int:
    """Chunk size k from free memory: the largest k whose O(k d) working set fits in
    ``fraction`` of the free memory (cuda: ``mem_get_info``; CPU: MemAvailable), capped at n.
    On CPU k is also capped at 256: past that the batched forward is no faster per sample
    (`benchmarks/bench_pbscale.py`) and memory would only grow."""
    device = torch.device(device)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        cap = 1 << 16
    else:
        free = _mem_available_bytes()
        cap = 256
    k = int(fraction * free) // max(int(bytes_per_sample), 1)
    return max(1, min(n, k, cap))


def free_memory(device: torch.device | str = "cpu") -> int:
    """Bytes free for a run's tensors: CUDA's free device memory, else the CPU's MemAvailable
    (what :func:`auto_chunk` sizes its chunks by)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return _mem_available_bytes()


#: Bytes a step holds per sample outside its chunks, every estimator alike, supermask or
#: joint: the fused CPU step's int64 row and flip indices of the sampling law (two arrays of n,
#: five at the peak of the antithetic law: :func:`pbscale.methods.fused.law_rule`), the n losses
#: and their float64 copies for the sums. Measured (peak resident set, a 768-weight network,
#: chunk 1,000, n = 2 x 10^5 and 2 x 10^6): ARMS 22 and DisARM 84 bytes per extra sample.
SAMPLE_BYTES = 96


def check_sample_memory(n: int, d: int, chunk: int, bytes_per_sample: int,
                        device: torch.device | str = "cpu", flag: str = "--n", *,
                        joint: bool = False, itemsize: int = 4, world: int = 1) -> None:
    """Refuse (one line, before anything trains) n samples per step whose masks and working
    set cannot be held in the :func:`free_memory` of ``device``; ``bytes_per_sample``: the
    working set of one mask in a chunk (its mask, masked weights, score and activations),
    ``itemsize``: bytes per mask entry (float32: 4). What a step holds, every estimator alike:

    * supermask (``joint=False``): the chunks stream. On the CPU the fused step
      (:func:`pbscale.methods.fused.fused_gradient`) writes the next chunk's masks while the
      previous one is summed, two (k, d) buffers whatever n is (ARMS's R_0 comes from a pass
      that stores no mask); on a GPU the torch samplers draw a chunk at a time, ARMS's
      stick-breaking with O(d) state and a (k + 1, d) scratch (:class:`CopulaSampler`). Held:
      k working sets plus one more chunk of masks, k = min(``chunk``, n).
    * joint (``joint=True``: the network weights train on the step's loss): autograd keeps
      every chunk's masks and activations until the backward, so all n working sets are held
      (n x ``bytes_per_sample``; LeNet-300-100 joint LOORF measured 13-15 d bytes per
      sample against the default 16 d, docs/refusals.md); under torchrun each of the
      ``world`` ranks evaluates (and keeps) only its share, ceil(n / world).
    * and in both, :data:`SAMPLE_BYTES` per sample of the step's O(n) index arrays and losses
      (all n on every rank).

    The message names the bytes held and the largest n that fits."""
    free = free_memory(device)
    per = max(int(bytes_per_sample), 1)
    world = max(int(world), 1)
    if joint:
        def held(m: int) -> int:
            return -(-m // world) * per + m * SAMPLE_BYTES
        share = f"{-(-n // world):,} of them on each of {world} ranks, " if world > 1 else ""
        what = (f"{format_bytes(held(n))} of masks, activations, indices and losses ({share}"
                f"{format_bytes(per)} each: a joint step keeps every chunk for the weights' "
                "backward)")
    else:
        def held(m: int) -> int:
            return min(chunk, m) * (per + itemsize * d) + m * SAMPLE_BYTES
        k = min(chunk, n)
        what = (f"{format_bytes(held(n))} of masks, activations, indices and losses ({k:,} at a "
                f"time: {k:,} x {format_bytes(per)} working sets and one more chunk of masks, "
                f"and {SAMPLE_BYTES} bytes of indices and losses per sample)")
    if held(n) <= free:
        return
    lo, hi = 0, n  # held(lo) <= free < held(hi); held grows with m
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if held(mid) <= free else (lo, mid)
    raise PBInputError(
        f"{flag} {n:,} samples per step of d = {d:,} mask entries hold {what}, more than the "
        f"{format_bytes(free)} free on {torch.device(device)}; lower {flag} to at most "
        f"{lo:,}")


def _mem_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2 * 2**30  # no /proc (not Linux): assume a modest 2 GiB


class PerRunSampler:
    """The samples of R independent runs, each from its own generator: theta (..., d) with
    R = prod(...) runs, one sampler of ``law`` per run (on its row of theta, with its
    generator), so run g draws exactly the stream a separate run with that generator draws.
    ``next(k)`` -> (k, ..., d)."""

    def __init__(self, law: str, theta: torch.Tensor, n: int,
                 generators: Sequence[torch.Generator]) -> None:
        self.lead = tuple(theta.shape[:-1])
        rows = theta.reshape(-1, theta.shape[-1])
        if len(generators) != rows.shape[0]:
            raise PBInputError(f"{len(generators)} generators for {rows.shape[0]} runs; give one "
                               "generator per run (the leading dimensions of r)")
        self.samplers = [SAMPLERS[law](t, n, g) for t, g in zip(rows, generators)]

    def next(self, k: int) -> torch.Tensor:
        z = torch.stack([s.next(k) for s in self.samplers])  # (runs, k, d), each run contiguous
        return z.view(*self.lead, k, z.shape[-1]).movedim(-2, 0)

