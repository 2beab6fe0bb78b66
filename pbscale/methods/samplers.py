"""Samplers of the MC estimators' laws (`pbexact.estimators.LAWS`) in torch, with an explicit
``torch.Generator`` (same seed, same numbers): iid Bernoulli (`eq:reinforce_p`), ARMS's Dirichlet
copula (`alg:orig_arms`, `alg:iter_dir`), DisARM's antithetic pairs, one sampler per run
(:class:`PerRunSampler`), replayed samples (:class:`FixedSampler`), and the chunk size k of a
step's O(k d) working set (:func:`auto_chunk`). Every sampler has ``next(k) -> (k, ..., d)``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pbexact.copula import branch_side, branch_threshold
from pbexact.errors import PBInputError, check_n, format_bytes

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
    torch.rand. Either way the samples depend only on the generator's state.
    """

    _BITS = 24

    def __init__(self, theta: torch.Tensor, generator: torch.Generator) -> None:
        self.theta = theta
        self.generator = generator
        self._scaled: torch.Tensor | None = None
        if theta.dtype == torch.float32 and theta.device.type == "cpu":
            self._scaled = theta * float(1 << self._BITS)  # exact: a power-of-two scaling

    def next(self, k: int) -> torch.Tensor:
        shape = (k,) + tuple(self.theta.shape)
        if self._scaled is None:
            u = torch.rand(shape, generator=self.generator, dtype=self.theta.dtype,
                           device=self.theta.device)
            return torch.lt(u, self.theta, out=u)  # 1[u < theta] over u, in theta's dtype
        u = uniform_bits24(shape, self.generator)
        return torch.lt(u, self._scaled, out=u)


def uniform_bits24(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """float32 m, uniform on {0, ..., 2^24 - 1}, of shape ``shape``, from a CPU generator: 24
    bits of each 32-bit half of ``random_()`` int64 draws (uniform on [0, 2^63 - 1]), which
    the CPU generator makes much faster than float uniforms (m / 2^24 is torch.rand's float32
    resolution). Each row (last dimension, d values) takes ceil(d/2) words, so the stream does
    not depend on how the rows are split into chunks, odd d included."""
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


class CopulaSampler:
    """ARMS samples from the Dirichlet copula (`alg:orig_arms`, `alg:iter_dir`), k at a time, in
    theta's dtype and without any host synchronization (no data-dependent loop).

    u~ depends on the Dirichlet fractions D_s = E_s / R_0 only (E_s = -log U_s, R_0 = sum of the
    n E_s), and the bits of `alg:orig_arms`, z~ = 1[u~ <= theta] (theta > 1/2) and
    1[1 - u~ <= theta] (otherwise) with u~ = 1 - (1 - D)^(n-1), are threshold tests on D:
    D <= c and D >= c, c = 1 - (1 - theta)^(1/(n-1)) resp. 1 - theta^(1/(n-1)) (computed once per
    step, d values, log and expm1). Two ways to the same law:

    * float32 on the CPU with n d <= 2^24 (integer thresholds): the step's n rows are drawn at
      its first chunk (at most 64 MiB) and served chunk by chunk, so every chunking gives the
      same samples. U_s = (m_s + 1) / 2^24 where theta > 1/2 and (2^24 - m_s) / 2^24 elsewhere,
      m_s uniform on {0, ..., 2^24 - 1} (torch.rand's float32 grid reflected: never 0), from 24
      bits of each 32-bit half of ``random_()`` int64 draws. D_s <= c is E_s <= c R_0, i.e.
      U_s >= exp(-c R_0), and D_s >= c is U_s <= exp(-c R_0): both read m_s >= an integer
      threshold per coordinate, so a sample costs what a Bernoulli sample does (one comparison
      per element) plus R_0 = 24 n ln 2 - sum_s log |m_s - p| (p = -1 or 2^24): products of
      10 rows of 2^-12 |m_s - p| in float32, their logs summed in float64.
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
        cpu32 = theta.dtype == torch.float32 and theta.device.type == "cpu"
        self._ints = cpu32 and self.n * theta.numel() <= _ALL_DRAWS_ELEMENTS
        # the branch and its threshold c = 1 - m^(1/(n-1)), m = 1 - theta (theta > 1/2) or
        # theta, by log and expm1 (a few ulps of the dtype, also for m near 0 or 1)
        if self._ints:  # float arithmetic only: torch's CPU where and bool kernels are slow
            t = theta.detach().reshape(-1)
            m = torch.minimum(t, 1 - t)  # branch_side's m
            hi = torch.sign(t - m)  # 1 where theta > 1/2, else 0
            # -c, and -inf where m = 0 (theta 0 or 1): the bound below is then 0 (theta = 1:
            # D <= 1 always) or 2^24 (theta = 0: D >= 1 never)
            self._neg_c = branch_threshold(m, self.n).div_(torch.sign(m)).neg_()
            # 2^-12 |m - p| = 2^-12 m + shift: 2^-12 (m + 1) (theta > 1/2), -2^-12 (2^24 - m)
            self._shift = hi * 2.0**-12 + (hi - 1) * 2.0**12
            # the bound a + b exp(-c R_0): theta > 1/2: m + 1 >= 2^24 exp(-c R_0); otherwise
            # 2^24 - m <= 2^24 exp(-c R_0)
            self._a = (1 - hi) * 2.0**24 - hi
            self._b = (2 * hi - 1) * 2.0**24
            self._bound: torch.Tensor | None = None  # m >= bound, once R_0 is known
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

    def _sum_of_logs(self, m: torch.Tensor) -> torch.Tensor:
        """sum over the rows of m of log(2^-12 |m - p|), float64 (d,), by products of
        _PRODUCT_ROWS rows (the last may be shorter) in float32."""
        k, d = m.shape
        # 2^-12 (m + 1) or -2^-12 (2^24 - m): exact (24 significant bits), in [2^-12, 2^12]
        t = torch.add(self._shift, m, alpha=2.0**-12, out=_scratch((k, d), m))
        q = k // _PRODUCT_ROWS
        parts = [t[: q * _PRODUCT_ROWS].view(q, _PRODUCT_ROWS, d).prod(1)] if q else []
        if k > q * _PRODUCT_ROWS:
            parts.append(t[q * _PRODUCT_ROWS:].prod(0, keepdim=True))
        prods = torch.cat(parts) if len(parts) > 1 else parts[0]
        return prods.abs_().log_().sum(0, dtype=torch.float64)

    def _start_step(self, m: torch.Tensor) -> None:
        """R_0 = sum_s E_s = 12 n ln 2 - sum_s log(2^-12 |m_s - p|) over the step's n draws m
        (n, d), then the bound per coordinate: theta > 1/2: m + 1 >= 2^24 exp(-c R_0); else
        2^24 - m <= 2^24 exp(-c R_0)."""
        logs = torch.zeros(self.theta.numel(), dtype=torch.float64)
        rows = _PRODUCT_ROWS * max(1, _SUM_ELEMENTS // (_PRODUCT_ROWS * self.theta.numel()))
        for g0 in range(0, self.n, rows):
            logs += self._sum_of_logs(m[g0:g0 + rows])
        self._r0 = torch.sub(12 * self.n * math.log(2.0), logs)
        # float32: the integer bound is off by at most about 1 (2^-24 in probability)
        e = torch.mul(self._neg_c, self._r0.float()).exp_()
        self._bound = torch.addcmul(self._a, self._b, e).ceil_().clamp_(0, 2.0**24)

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
        E = 12 * math.log(2.0) - torch.add(self._shift, m, alpha=2.0**-12).abs_().double().log_()
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


#: Rows per product of the CPU copula sampler's sum of logs: 10 factors in [2^-12, 2^12] stay in
#: [2^-120, 2^120], float32's normal range.
_PRODUCT_ROWS = 10
#: Elements of a batch of rows whose products the CPU copula sampler forms at once (1 MiB).
_SUM_ELEMENTS = 1 << 18
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
    (`pbexact.sampling.sample_antithetic` in torch)."""

    def __init__(self, theta: torch.Tensor, generator: torch.Generator) -> None:
        self.theta = theta
        self.generator = generator

    def next(self, k: int) -> torch.Tensor:
        if k % 2:
            raise PBInputError(f"antithetic pairs come two at a time, asked for {k} samples")
        u = torch.rand((k // 2,) + tuple(self.theta.shape), generator=self.generator,
                       dtype=self.theta.dtype, device=self.theta.device)
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


def check_sample_memory(n: int, d: int, chunk: int, bytes_per_sample: int,
                        device: torch.device | str = "cpu", flag: str = "--n") -> None:
    """Refuse (one line, before anything trains) n samples per step whose masks cannot be
    held in memory: a step draws n masks of d entries, n d float32 values (ARMS holds all n
    draws for the whole step; the other estimators stream them ``chunk`` at a time, each chunk
    with its ``bytes_per_sample`` working set of activations), and that, plus one chunk's
    working set, must fit in the :func:`free_memory` of ``device``. The message names the cost
    and the largest n that fits."""
    free = free_memory(device)
    working = chunk * max(int(bytes_per_sample), 1)
    per_mask = 4 * d
    if n * per_mask + working <= free:
        return
    largest = max((free - working) // per_mask, 0)
    raise PBInputError(
        f"{flag} {n:,} samples per step of d = {d:,} mask entries are {format_bytes(n * per_mask)}"
        f" of masks (n x d float32; ARMS holds them all, the others stream {chunk:,} at a time "
        f"with {format_bytes(working)} of activations), more than the {format_bytes(free)} "
        f"free on {torch.device(device)}; lower {flag} to at most {largest:,}")


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

