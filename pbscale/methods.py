"""Every mask-optimization method of the paper, in torch, for any batched loss f(z).

The loss is a batched function ``f(z)`` of masks z of shape (..., d) returning (...); for the
MC estimators it is only evaluated, for CP and the hybrid estimators it is differentiated
(soft masks in [0, 1]). Nothing here knows about ``nn.Module`` masking: :mod:`pbscale.masks`
supplies f for a masked network, and the microworld (NNLoss) can supply its own.

* MC (every estimator of the pbexact registry that needs no J table: REINFORCE, LOORF, ARMS,
  DisARM; `ch:monte_carlo`): the n samples of one step are drawn by the estimator's law and
  evaluated in chunks of k, summed by pbexact's one accumulator (`SampleSums`: k, sum J,
  U = sum J S, B = sum S) and finished by the estimator's linear form (`alg:iter_reinforce`,
  `alg:iter_loorf`, `alg:iter_arms`; ARMS with the iterative Dirichlet copula of
  `alg:iter_dir`), so memory is O(k d) whatever n is and the gradient equals the one-shot batch
  form on the same samples. Scores come from the pbexact parametrizations' affine reading
  (`tab:alternative_param`, `Parametrization.affine_score`), never as a (k, P) matrix.
  :func:`mc_surrogate` gives the same estimate as a surrogate loss for autograd.
* CP (`sec:pb_application`): f(sigmoid(r / tau)) with tau annealed exponentially from 1 to 1/200,
  updated every 100 iterations (`sec:app_microworld_hypers`); evaluated with 1[r > 0].
* ST, REBAR, RELAX (`ch:other`), sigmoid parametrization only, as the paper uses them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from pbexact.continuation import CP_FINAL_TAU
from pbexact.copula import branch_side, branch_threshold
from pbexact.errors import PBInputError, check_n
from pbexact.estimators import MC_ESTIMATORS, MIN_SAMPLES, SampleSums, get_estimator
from pbexact.parametrizations import PARAMETRIZATIONS, Parametrization, get_parametrization

#: A batched loss: masks (..., d) -> losses (...).
BatchedLoss = Callable[[torch.Tensor], torch.Tensor]

#: The MC estimators of the registry that need no J table (`pbexact.estimators.REGISTRY`).
MC_METHODS = MC_ESTIMATORS
HYBRID_METHODS = ("st", "rebar", "relax")
METHODS = MC_METHODS + ("cp",) + HYBRID_METHODS
OPTIMIZERS = ("rmsprop", "sgd")
#: Fewest samples per step for each method (CP is deterministic and ignores n).
METHOD_MIN_SAMPLES = {**{m: MIN_SAMPLES[m] for m in MC_METHODS}, "st": 1, "rebar": 1, "relax": 1}
#: Keeps log(u) and log(1 - u) finite in the logistic reparametrization of REBAR/RELAX.
_UNIFORM_EPS = 1e-6


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
        self._sign = hi.to(theta.dtype).mul_(2).sub_(1)  # +1 / -1 (faster than torch.where)
        self._bound = c.mul_(self._sign)  # z = 1[sign D <= sign c]
        self._q = self._sign.clone()  # sign Q of the last draw (sign times the stick left)

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
        s = torch.arange(first, first + k, device=dev, dtype=dt)
        per_row = (self.n - s).clamp_min(1).reciprocal_().view(rows)  # 1 / (n - s)
        cpu = dev.type == "cpu"
        if dt == torch.float32 and cpu:
            # U = m / 2^24, torch.rand's float32 grid (U = 0: log U = -inf, U^(1/(n-s)) = 0)
            out = uniform_bits24(shape, self.generator).mul_(2.0**-24)
        else:
            out = torch.rand(shape, generator=self.generator, dtype=dt, device=dev)
        block = max(1, _CACHE_ELEMENTS // max(self.theta.numel(), 1)) if cpu else k
        for b0 in range(0, k, block):
            b1 = min(b0 + block, k)
            L = out[b0:b1].log_().mul_(per_row[b0:b1])  # log U^(1/(n-s))
            if first + b1 - 1 == self.n:
                L[-1] = -math.inf  # the last draw takes the whole remaining stick
            q = torch.exp(L, out=_scratch(L.shape, L))
            q[0].mul_(self._q)
            if cpu:  # a row loop beats the CPU cumprod kernel along dim 0 (3x)
                qs = q.unbind(0)
                for i in range(1, b1 - b0):
                    qs[i].mul_(qs[i - 1])
            else:
                q.cumprod_(0)  # sign Q_s
            torch.sub(self._q, q[0], out=L[0])  # sign D_s = sign Q_(s-1) - sign Q_s, over L
            if b1 - b0 > 1:
                torch.sub(q[:-1], q[1:], out=L[1:])
            self._q = q[-1].clone()
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
# MC estimators, chunked


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


def _mem_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2 * 2**30  # no /proc (not Linux): assume a modest 2 GiB


@dataclass
class Estimate:
    """One step's gradient over the logits, shape (..., P) (the shape of r), and the mean sampled
    loss: a float for r of shape (P,), else a float64 CPU tensor of shape (...), one per run."""

    grad: torch.Tensor
    loss: float | torch.Tensor


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


def mc_gradient(f: BatchedLoss, r: torch.Tensor, param: Parametrization, estimator: str, n: int,
                generator: torch.Generator | Sequence[torch.Generator] | None = None,
                chunk: int | None = None, sampler: Any = None, shard: Any = None) -> Estimate:
    """The estimate of grad_r E[J(z)] by a registered MC estimator (REINFORCE, LOORF, ARMS,
    DisARM) from n samples evaluated k = chunk at a time (`alg:iter_loorf`, `alg:iter_arms`);
    r of shape (P,), f: (k, d) -> (k,). Pair estimators (DisARM) take chunks of whole pairs
    (an odd chunk is rounded down, at least 2).

    Leading dimensions batch independent runs: r of shape (..., P) (e.g. (G, P) for G runs),
    f: (k, ..., d) -> (k, ...), and each run's estimate (grad (..., P), loss (...)) is its own,
    equal to a separate call on the same samples (to round-off). ``generator`` is then one
    generator for all runs, or a sequence of one generator per run (leading index flattened,
    :class:`PerRunSampler`), so that run g's samples are those a separate call with its
    generator draws. The samples' stream does not depend on the chunking when k d is even.

    ``sampler`` (an object with ``next(k) -> (k, ..., d)``) replaces the default sampler of the
    estimator's law, e.g. to replay given samples. ``shard`` (a
    :class:`pbscale.distributed.Shard`): every chunk is drawn in full but f is evaluated on
    this rank's rows only, and the sums are combined over the ranks by one all-reduce.
    """
    spec = get_estimator(estimator)
    if spec.needs_table:
        raise PBInputError(
            f"{spec.text} needs the whole J table; pbscale runs {', '.join(MC_METHODS)}"
        )
    spec.check_n(n)
    chunk = n if chunk is None else max(1, min(int(chunk), n))
    pairs = spec.center == "pair"
    if pairs:
        chunk = max(2, chunk - chunk % 2)
    lead = tuple(r.shape[:-1])
    with torch.no_grad():
        r = r.detach()
        theta = param.theta(r)
        extra = spec.constant_of(theta, n, param)
        if sampler is None:
            if isinstance(generator, (list, tuple)):
                sampler = PerRunSampler(spec.law, theta, n, generator)
            else:
                sampler = SAMPLERS[spec.law](theta, n, generator)
        a, b = param.affine_score(r)  # S = a + z b, never built in full
        sums = SampleSums(pairs=pairs)
        total, done = 0.0, 0
        while done < n:
            k = min(chunk, n - done)
            z = sampler.next(k).to(r.dtype)  # (k, ..., d)
            done += k
            if shard is not None:
                z = z[shard.rows(k, pairs)]
                if z.shape[0] == 0:
                    continue
            J = f(z).to(r.dtype)  # (k, ...)
            # SampleSums takes the samples last: J (..., k), z (..., k, d) (no-ops without runs)
            sums.update_affine(J.movedim(0, -1), z.movedim(0, -2), a, b, param)
            total = total + J.sum(0).double()  # on the device: one read-back per step, below
        if shard is not None:
            _reduce_sums(sums, shard, r)
            total = sums.sum_j
        loss = float(total) / n if not lead else total.cpu() / n
        return Estimate(sums.estimate(spec, extra), loss)


def _reduce_sums(sums: SampleSums, shard: Any, r: torch.Tensor) -> None:
    """Replace this rank's (k, sum J, U, B) by their sums over the ranks (one all-reduce)."""
    if sums.count == 0:  # no rows here: zeros of the right shapes
        zero = torch.zeros_like(r)
        sums.sum_j = torch.zeros(r.shape[:-1], dtype=r.dtype, device=r.device)
        sums.U, sums.B = zero, zero
    sums.count, sums.sum_j, sums.U, sums.B = shard.reduce(sums.count, sums.sum_j, sums.U, sums.B)


def surrogate_loss(g: torch.Tensor, r: torch.Tensor, value: torch.Tensor | float = 0.0
                   ) -> torch.Tensor:
    """A scalar whose value is ``value`` and whose autograd gradient in r is the estimate g
    (shape of r), the convention of the field's estimator libraries:

        L(r) = value + sum_p g_p (r_p - stop_grad(r_p)),

    so L = value and dL/dr = g exactly (g is detached: the estimate is a constant to autograd;
    its dependence on r through the samples and the scores is already inside g). It composes:
    L + R(r) backpropagates g + grad R, and through r into whatever produced r (a network that
    outputs the logits, a shared parameter). Equivalent to the score-weighted log-probability
    form sum_s w_s log p(z_s; theta(r)) with w_s the estimator's sample weights, except that it
    also carries per-parameter constants (ARMS's 1 / (1 - rho), beta*) exactly.
    """
    return value + (g.detach() * (r - r.detach())).sum()


def mc_surrogate(f: BatchedLoss, r: torch.Tensor, param: Parametrization, estimator: str, n: int,
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,
                 chunk: int | None = None,
                 sampler: Any = None) -> tuple[torch.Tensor, Estimate]:
    """:func:`mc_gradient` as a surrogate loss: (L, estimate) with L a 0-dim tensor whose value is
    the mean sampled loss and whose autograd gradient in r equals ``estimate.grad`` exactly
    (:func:`surrogate_loss`). r may require grad (then L.backward() writes the estimate into
    r.grad, plus the gradient of anything added to L); the samples are drawn as by
    :func:`mc_gradient`, so the same generator state gives the same estimate. With leading
    dimensions (r (..., P), one generator per run or one for all) L's value is the sum over the
    runs of their mean sampled losses and its gradient in each run's row of r is that run's
    estimate."""
    est = mc_gradient(f, r, param, estimator, n, generator, chunk, sampler)
    loss = est.loss if isinstance(est.loss, float) else float(est.loss.sum())
    # the value as a Python scalar: a tensor made from it on r's device would be a second,
    # blocking host-to-device copy per step on a GPU (`benchmarks/check_gpu_sync.py`)
    return surrogate_loss(est.grad, r, loss), est


def dense_regularizer(r: torch.Tensor, theta_fn: Callable[[torch.Tensor], torch.Tensor],
                      lam: float) -> tuple[float, torch.Tensor]:
    """lambda * sum_i theta_i(r) in closed form and its exact gradient over r, shape (P,).

    For MC methods theta_fn is the parametrization's theta (E[sum z] = sum theta); for CP it is
    r -> sigmoid(r / tau). Used by pruning (`sec:app_pruning_setup`); lambda = 0 here.
    """
    rr = r.detach().requires_grad_(True)
    value = lam * theta_fn(rr).sum()
    (grad,) = torch.autograd.grad(value, rr)
    return float(value.detach()), grad


# ---------------------------------------------------------------------------------------------
# CP (`sec:pb_application`, `sec:app_microworld_hypers`)


def cp_temperature(step: int, total_steps: int, final: float = CP_FINAL_TAU,
                   every: int = 100) -> float:
    """tau at iteration ``step``: 1 at the start, multiplied by a constant every ``every``
    iterations so that the last update of training reaches ``final``."""
    updates = max((total_steps - 1) // every, 1)
    k = min(step // every, updates)
    return final ** (k / updates)


def cp_relaxed_loss(f: BatchedLoss, r: torch.Tensor, tau: float) -> torch.Tensor:
    """f(sigmoid(r / tau)) (`eq:sigmoid_cp`), r of shape (..., d) -> (...), differentiable."""
    return f(torch.sigmoid(r / tau))


def cp_hard_mask(r: torch.Tensor) -> torch.Tensor:
    """The mask CP is evaluated with, 1[r > 0] (the tau -> 0 limit)."""
    return (r > 0).to(r.dtype)


@dataclass
class CPStep:
    """One CP evaluation at logits r (..., d): the relaxed losses f(sigmoid(r / tau)) (...), with
    their autograd graph back to the weights of f when asked for; their gradient over r (the
    shape of r); and the losses of the hard mask f(1[r > 0]) (...), detached, or None."""

    relaxed: torch.Tensor
    grad: torch.Tensor
    hard: torch.Tensor | None


def cp_step(f: BatchedLoss, r: torch.Tensor, tau: float, hard: bool = True,
            keep_graph: bool = False) -> CPStep:
    """CP's gradient (`eq:sigmoid_cp`, `sec:pb_application`): d/dr sum f(sigmoid(r / tau)) for r
    of any leading shape (..., d) (one problem, or one per seed), f: (..., d) -> (...). With
    ``hard``, f also evaluates 1[r > 0] in the same batched call (stacked in front: f sees
    (2, ..., d)), the loss CP reports. ``keep_graph`` keeps the relaxed losses' graph (to train
    the weights of f from them too). The one definition for `MaskTrainer` and the microworld."""
    rr = r.detach().requires_grad_(True)
    soft = torch.sigmoid(rr / tau)
    if hard:
        out = f(torch.stack([soft, cp_hard_mask(rr.detach())]))
        relaxed, hard_loss = out[0], out[1].detach()
    else:
        relaxed, hard_loss = cp_relaxed_loss(f, rr, tau), None
    (grad,) = torch.autograd.grad(relaxed.sum(), rr, retain_graph=keep_graph)
    return CPStep(relaxed, grad, hard_loss)


# ---------------------------------------------------------------------------------------------
# Hybrid estimators (`ch:other`), sigmoid parametrization, r of shape (..., d)


def straight_through(f: BatchedLoss, r: torch.Tensor, u: torch.Tensor) -> Estimate:
    """ST (Bengio et al., 2013) as in `ch:other`: forward J(z) with z = 1[u < sigmoid(r)], backward
    d J / d z_i used as d E / d r_i (sigmoid derivative ignored). u: (n, ..., d) uniforms."""
    z = (u < torch.sigmoid(r.detach())).to(r.dtype).requires_grad_(True)
    J = f(z)
    (g,) = torch.autograd.grad(J.sum(), z)
    return Estimate(g.mean(0), float(J.detach().mean()))


class HybridControl(nn.Module):
    """The learned control variate of REBAR / RELAX (`sec:app_microworld_hypers`).

    REBAR: c(z) = eta f(sigmoid(z / tau)), log tau = 0.5 and eta = 1 at the start.
    RELAX: c(z) = f(sigmoid(z / tau)) + r_rho(sigmoid(z / tau)), log tau = 0.5, r_rho an MLP
    d -> 10 (tanh) -> 1. Feeding r_rho the relaxed sample (bounded) rather than the logistic
    sample is our choice; the paper does not say which. ``shape`` gives log tau and eta leading
    batch dimensions (e.g. (seeds, 1) for vectorized microworld runs).
    """

    def __init__(self, kind: str, d: int, shape: tuple[int, ...] = (), hidden: int = 10,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if kind not in ("rebar", "relax"):
            raise PBInputError(f"unknown control kind {kind!r}; choose rebar or relax")
        self.kind = kind
        self.log_tau = nn.Parameter(torch.full(shape, 0.5))
        self.eta = nn.Parameter(torch.ones(shape)) if kind == "rebar" else None
        self.net = (nn.Sequential(nn.Linear(d, hidden), nn.Tanh(), nn.Linear(hidden, 1))
                    if kind == "relax" else None)
        if self.net is not None and generator is not None:
            # nn.Linear's default init from an explicit generator: same seed, same network
            with torch.no_grad():
                for p in self.net.parameters():
                    fan_in = p.shape[-1] if p.dim() == 2 else hidden if p.numel() == 1 else d
                    bound = 1 / math.sqrt(fan_in)
                    p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)

    def relax(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(z / self.log_tau.exp()[..., None])

    def scalar_parameters(self) -> list[nn.Parameter]:
        return [p for p in (self.log_tau, self.eta) if p is not None]

    def surrogate_parameters(self) -> list[nn.Parameter]:
        return list(self.net.parameters()) if self.net is not None else []


def rebar_relax(f: BatchedLoss, r: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                control: HybridControl) -> tuple[Estimate, torch.Tensor]:
    """REBAR (Tucker et al., 2017) / RELAX (Grathwohl et al., 2018) for Bernoulli(sigmoid(r)),
    r of shape (..., d), u and v uniforms of shape (n, ..., d):

      z = r + logit(u), b = 1[z > 0], z~ = r + logit(v') with v' uniform on b's side of 1 - theta,
      g = mean_s [(f(b) - c(z~)) (b - theta) + d c(z) / d r - d c(z~) / d r].

    Unbiased for every control c. Returns the estimate (grad of shape (..., d), detached) and the
    single-sample variance proxy sum g^2 as a graph over the control's parameters, whose gradient
    trains them (the estimators' own recipe). f is called once on 3n masks (b, relaxed z and z~).
    """
    n = u.shape[0]
    rr = r.detach().requires_grad_(True)
    theta = torch.sigmoid(rr)
    u = u.clamp(_UNIFORM_EPS, 1 - _UNIFORM_EPS)
    v = v.clamp(_UNIFORM_EPS, 1 - _UNIFORM_EPS)
    z = rr + torch.log(u) - torch.log1p(-u)
    b = (z > 0).to(r.dtype).detach()
    vb = b * (v * theta + 1 - theta) + (1 - b) * v * (1 - theta)
    zt = rr + torch.log(vb) - torch.log1p(-vb)
    soft_z, soft_zt = control.relax(z), control.relax(zt)
    J_all = f(torch.cat([b, soft_z, soft_zt]))
    J_b, f_z, f_zt = J_all[:n].detach(), J_all[n : 2 * n], J_all[2 * n :]
    if control.kind == "rebar":
        c_z, c_zt = control.eta * f_z, control.eta * f_zt
    else:
        c_z = f_z + control.net(soft_z).squeeze(-1)
        c_zt = f_zt + control.net(soft_zt).squeeze(-1)
    d_cz, d_czt = _grad_pair(c_z, c_zt, rr)
    score = (b - theta).detach()
    g = ((J_b - c_zt)[..., None] * score).mean(0) + (d_cz - d_czt) / n
    return Estimate(g.detach(), float(J_b.mean())), (g**2).sum()


def _grad_pair(c_z: torch.Tensor, c_zt: torch.Tensor, r: torch.Tensor):
    """d(sum c(z))/dr and d(sum c(z~))/dr, kept differentiable in the control's parameters.
    Samples are independent, so the gradient of the sum is the sum of per-sample gradients."""
    (d_cz,) = torch.autograd.grad(c_z.sum(), r, create_graph=True, retain_graph=True)
    (d_czt,) = torch.autograd.grad(c_zt.sum(), r, create_graph=True, retain_graph=True)
    return d_cz, d_czt


#: RELAX control network (`sec:app_microworld_hypers`): one tanh hidden layer of 10 units,
#: Adam with lr 1 and weight decay 1e-3.
RELAX_HIDDEN = 10
RELAX_LR = 1.0
RELAX_WEIGHT_DECAY = 1e-3


class PerSeedMLP(nn.Module):
    """d -> hidden (tanh) -> 1 with separate weights for each of ``seeds`` runs: input
    (..., seeds, d), output (..., seeds, 1). Initialized like ``nn.Linear`` (uniform in
    +-1/sqrt(fan_in)) from ``generator``, so it is reproducible."""

    def __init__(self, seeds: int, d: int, hidden: int, generator: torch.Generator,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()

        def uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
            bound = 1 / math.sqrt(fan_in)
            u = torch.rand(shape, generator=generator, dtype=dtype)
            return nn.Parameter((2 * u - 1) * bound)

        self.w1 = uniform((seeds, d, hidden), d)
        self.b1 = uniform((seeds, hidden), d)
        self.w2 = uniform((seeds, hidden, 1), hidden)
        self.b2 = uniform((seeds, 1), hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(torch.einsum("...sd,sdh->...sh", x, self.w1) + self.b1)
        return torch.einsum("...sh,sho->...so", h, self.w2) + self.b2


class PerSeedControl(HybridControl):
    """The REBAR/RELAX control with log tau and eta of shape (seeds,) and, for RELAX, a
    :class:`PerSeedMLP` in place of the shared network, so no parameter couples two seeds
    (vectorized microworld runs, r of shape (seeds, d)); float64."""

    def __init__(self, kind: str, d: int, seeds: int, generator: torch.Generator) -> None:
        super().__init__(kind, d, shape=(seeds,), hidden=RELAX_HIDDEN)
        if self.net is not None:
            self.net = PerSeedMLP(seeds, d, RELAX_HIDDEN, generator)
        self.to(torch.float64)


def make_control(kind: str, d: int, lr: float, generator: torch.Generator,
                 seeds: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None
                 ) -> tuple[HybridControl, list[torch.optim.Optimizer]]:
    """The REBAR/RELAX control and its optimizers (`sec:app_microworld_hypers`), set up here for
    every loop: log tau and eta by Adam at the method's ``lr``, the RELAX network by Adam with
    lr RELAX_LR and weight decay RELAX_WEIGHT_DECAY. ``seeds=None``: one shared control for
    logits (d,) (:class:`HybridControl`, moved to device/dtype); else one per seed
    (:class:`PerSeedControl`, float64)."""
    if seeds is None:
        control = HybridControl(kind, d, hidden=RELAX_HIDDEN, generator=generator).to(
            device=device, dtype=dtype)
    else:
        control = PerSeedControl(kind, d, seeds, generator)
    opts = [torch.optim.Adam(control.scalar_parameters(), lr=lr)]
    if control.net is not None:
        opts.append(torch.optim.Adam(control.surrogate_parameters(), lr=RELAX_LR,
                                     weight_decay=RELAX_WEIGHT_DECAY))
    return control, opts


def hybrid_gradient(method: str, f: BatchedLoss, r: torch.Tensor,
                    uniforms: Callable[[], torch.Tensor], control: HybridControl | None,
                    control_opts: list[torch.optim.Optimizer]) -> Estimate:
    """ST, REBAR or RELAX gradient over sigmoid logits r of shape (..., d) (leading dimensions
    batch independent runs, e.g. the microworld's seeds), ``uniforms()`` giving (n, ..., d)
    uniforms; REBAR/RELAX also take one optimizer step of their control on the variance proxy
    (the one place the controls are trained)."""
    if method == "st":
        return straight_through(f, r, uniforms())
    est, var = rebar_relax(f, r, uniforms(), uniforms(), control)
    for opt in control_opts:
        opt.zero_grad()
    params = control.scalar_parameters() + control.surrogate_parameters()
    # var sums the runs' own proxies, so each run's parameters get their own gradient
    grads = torch.autograd.grad(var, params, allow_unused=True)
    for p, g in zip(params, grads):
        p.grad = g
    for opt in control_opts:
        opt.step()
    return est


# ---------------------------------------------------------------------------------------------
# One optimizer over mask logits for every method


@dataclass
class MethodConfig:
    """A mask-optimization method and its hyperparameters (validated before training)."""

    method: str = "loorf"
    n: int = 10
    param: str = "sigmoid"
    lr: float = 0.1
    optimizer: str = "rmsprop"
    seed: int = 0
    chunk: int | None = None
    lam: float = 0.0
    cp_final_tau: float = CP_FINAL_TAU
    cp_every: int = 100

    def validate(self) -> MethodConfig:
        """Raise :class:`PBInputError` on the first bad setting."""
        if self.method not in METHODS:
            raise PBInputError(
                f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}"
            )
        if self.param not in PARAMETRIZATIONS:
            raise PBInputError(
                f"unknown parametrization {self.param!r}; "
                f"choose one of {', '.join(PARAMETRIZATIONS)}"
            )
        if self.method not in MC_METHODS and self.param != "sigmoid":
            raise PBInputError(
                f"{self.method.upper()} is defined for the sigmoid parametrization only; "
                f"use --param sigmoid (other parametrizations: {', '.join(MC_METHODS)})"
            )
        if self.method in MC_METHODS:
            get_estimator(self.method).check_n(self.n)
        elif self.method != "cp":
            check_n(self.n, self.method.upper(), METHOD_MIN_SAMPLES[self.method])
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise PBInputError(f"the learning rate must be a positive number, got lr={self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise PBInputError(
                f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
            )
        if self.chunk is not None and (not isinstance(self.chunk, int) or self.chunk < 1):
            raise PBInputError(f"chunk must be a positive integer (or omitted), got {self.chunk}")
        if not (math.isfinite(self.lam) and self.lam >= 0):
            raise PBInputError(f"the regularization weight must be >= 0, got lam={self.lam}")
        if not 0 < self.cp_final_tau <= 1 or self.cp_every < 1:
            raise PBInputError("CP needs 0 < final tau <= 1 and a schedule period >= 1")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


class MaskTrainer:
    """Mask logits r of shape (P,) and one optimizer step per call of :meth:`step`.

    theta starts at 0.5 for every weight (`sec:app_maskednnregression`): r = logits(0.5) of the
    parametrization, and r = 0 for CP (sigmoid(0 / tau) = 0.5).
    """

    def __init__(self, config: MethodConfig, d: int, total_steps: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 bytes_per_sample: int | None = None) -> None:
        self.config = config.validate()
        self.d = d
        self.total_steps = max(int(total_steps), 1)
        self.device = torch.device(device)
        self.param = get_parametrization(config.param)
        if config.method == "cp":
            r0 = torch.zeros(d, dtype=torch.float64)
        else:
            r0 = self.param.logits(torch.full((d,), 0.5, dtype=torch.float64))
        self.r = nn.Parameter(r0.to(device=self.device, dtype=dtype))
        opt_cls = torch.optim.RMSprop if config.optimizer == "rmsprop" else torch.optim.SGD
        self.opt = opt_cls([self.r], lr=config.lr)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        self.control: HybridControl | None = None
        self.control_opts: list[torch.optim.Optimizer] = []
        if config.method in ("rebar", "relax"):
            init_gen = torch.Generator().manual_seed(config.seed)
            self.control, self.control_opts = make_control(
                config.method, d, config.lr, init_gen, device=self.device, dtype=dtype)
        if config.chunk is not None:
            self.chunk = min(config.chunk, config.n)
        else:
            per_sample = bytes_per_sample or 16 * d
            self.chunk = auto_chunk(config.n, per_sample, self.device)
        self.step_count = 0
        #: :class:`pbscale.distributed.Shard` of a torchrun launch (MC samples split over ranks)
        self.shard = None

    @property
    def method(self) -> str:
        return self.config.method

    def theta(self) -> torch.Tensor:
        """Mask probabilities, shape (d,) (CP: its hard mask)."""
        with torch.no_grad():
            return cp_hard_mask(self.r) if self.method == "cp" else self.param.theta(self.r)

    def tau(self) -> float:
        c = self.config
        return cp_temperature(self.step_count, self.total_steps, c.cp_final_tau, c.cp_every)

    def _uniforms(self, n: int) -> torch.Tensor:
        return torch.rand((n, self.d), generator=self.generator, dtype=self.r.dtype,
                          device=self.device)

    def gradient(self, f: BatchedLoss, record: list | None = None) -> Estimate:
        """This step's gradient estimate over r (P,) and training loss, without updating r.

        With ``record`` (a list), the losses the weights are trained on are appended to it with
        their autograd graphs (MC: J of the n sampled masks, in chunks; CP: the relaxed loss);
        the hybrid methods do not support it."""
        c = self.config
        if record is not None and self.method in HYBRID_METHODS:
            raise PBInputError(
                f"{self.method.upper()} cannot train network weights; use an MC method or cp"
            )
        if self.method in MC_METHODS:
            fn = f
            if record is not None:
                def fn(z: torch.Tensor) -> torch.Tensor:
                    with torch.enable_grad():
                        J = f(z)
                    record.append(J)
                    return J.detach()
            est = mc_gradient(fn, self.r, self.param, self.method, c.n, self.generator,
                              self.chunk, shard=self.shard)
            theta_fn = self.param.theta
        elif self.method == "cp":
            tau = self.tau()
            cp = cp_step(f, self.r, tau, hard=True, keep_graph=record is not None)
            if record is not None:
                record.append(cp.relaxed)
            # the training loss CP reports is that of 1[r > 0], as the paper does
            est = Estimate(cp.grad, float(cp.hard))

            def theta_fn(x: torch.Tensor) -> torch.Tensor:
                return torch.sigmoid(x / tau)
        else:
            est = hybrid_gradient(self.method, f, self.r, lambda: self._uniforms(c.n),
                                  self.control, self.control_opts)
            theta_fn = torch.sigmoid
        if c.lam > 0:
            _, reg_grad = dense_regularizer(self.r, theta_fn, c.lam)
            est.grad = est.grad + reg_grad
        return est

    def surrogate(self, f: BatchedLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        """This step's estimate as a surrogate loss (:func:`surrogate_loss`): a scalar whose
        autograd gradient in r is the method's gradient estimate (with the dense regularizer),
        and, with ``weights=True``, whose gradient in the network weights is that of the method's
        loss on the weights (MC: the mean of J over the n sampled masks; CP: the relaxed loss),
        so that one ``backward`` fills both. Returns (surrogate (), training loss)."""
        record: list | None = [] if weights else None
        est = self.gradient(f, record)
        weight_loss: torch.Tensor | float = 0.0
        if record:
            weight_loss = (record[0] if self.method == "cp"
                           else sum(J.sum() for J in record) / self.config.n)
        return surrogate_loss(est.grad.to(self.r.dtype), self.r, weight_loss), est.loss

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers over r (the learning-rate schedules of :mod:`pbscale.loop` act on
        these; the REBAR/RELAX control optimizers keep their own rates)."""
        return [self.opt]

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def apply(self) -> None:
        """The optimizer step on r from r.grad, then the parametrization's projection (the
        direct parametrization's clamp to [eps, 1 - eps])."""
        self.opt.step()
        with torch.no_grad():
            self.r.copy_(self.param.project(self.r))
        self.step_count += 1

    def step(self, f: BatchedLoss) -> float:
        """One optimizer step on r with this method's gradient of E[f]; returns the training loss
        (mean sampled loss; CP: loss of its hard mask)."""
        self.zero_grad()
        value, loss = self.surrogate(f)
        value.backward()
        self.apply()
        return loss

    def mode_mask(self) -> torch.Tensor:
        """The most probable mask, 1[theta > 1/2] (CP: 1[r > 0]), shape (d,)."""
        return (self.theta() > 0.5).to(self.r.dtype)

    def config_dict(self) -> dict:
        return self.config.to_dict()

    def sample_masks(self, k: int) -> torch.Tensor:
        """k masks (k, d) from the current distribution (CP: its hard mask k times)."""
        if self.method == "cp":
            return cp_hard_mask(self.r.detach()).expand(k, self.d)
        return BernoulliSampler(self.theta(), self.generator).next(k)

    def state_dict(self) -> dict:
        return {
            "r": self.r.detach().cpu(),
            "opt": self.opt.state_dict(),
            "generator": self.generator.get_state(),
            "step_count": self.step_count,
            "control": self.control.state_dict() if self.control is not None else None,
            "control_opts": [o.state_dict() for o in self.control_opts],
        }

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.r.copy_(state["r"].to(self.r.device))
        self.opt.load_state_dict(state["opt"])
        self.generator.set_state(state["generator"])
        self.step_count = int(state["step_count"])
        if self.control is not None:
            self.control.load_state_dict(state["control"])
        for o, s in zip(self.control_opts, state["control_opts"]):
            o.load_state_dict(s)



class MaskTrainerGroup:
    """G MC runs that step together: one :class:`pbscale.loop.Method` over G
    :class:`MaskTrainer` members (logits (P,), optimizer and generator each), whose n samples
    per step are drawn member by member from the members' own generators and evaluated in one
    batched call f: (k, G, d) -> (k, G) (:func:`mc_gradient` with leading dimension G and one
    generator per run), so member g's estimate, step and history are those of the separate run
    with its configuration (to the round-off of the batched loss).

    The members share the estimator, n and the parametrization (one :func:`mc_gradient` call);
    learning rate, optimizer, seed and lam are their own. Masks only (supermask); the loop's
    own ``generator`` is not used (each member's is, and each is checkpointed in
    :meth:`state_dict`). The losses of the current epoch are kept per member
    (:meth:`pop_epoch_losses`). ``r``, :meth:`theta`, :meth:`mode_mask` and
    :meth:`sample_masks` stack the members' (leading dimension G)."""

    def __init__(self, configs: Sequence[MethodConfig], d: int, total_steps: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 bytes_per_sample: int | None = None) -> None:
        self.check(configs)
        self.members = [MaskTrainer(c, d, total_steps, device, dtype, bytes_per_sample)
                        for c in configs]
        self.d = d
        self.device = torch.device(device)
        self.param = self.members[0].param
        self.n = configs[0].n
        per_sample = bytes_per_sample or 16 * d
        explicit = [c.chunk for c in configs if c.chunk is not None]
        self.chunk = min([auto_chunk(self.n, per_sample * len(configs), self.device), *explicit])
        self.generator = torch.Generator(device=self.device)  # the loop's; members use theirs
        self.epoch_losses: list[list[float]] = [[] for _ in configs]

    @staticmethod
    def check(configs: Sequence[MethodConfig]) -> None:
        """Refuse (:class:`PBInputError`) configurations that cannot form a group."""
        if not configs:
            raise PBInputError("no runs to train; give at least one seed and learning rate")
        for c in configs:
            c.validate()
            if c.method not in MC_METHODS:
                raise PBInputError(f"batched runs are MC runs ({', '.join(MC_METHODS)}); run "
                                   f"{c.method} with python -m pbscale.regress")
        seen = [repr(sorted(c.to_dict().items())) for c in configs]
        if len(set(seen)) != len(seen):
            raise PBInputError("a run is listed twice in the batch (same seed, learning rate and "
                               "settings); list each once")
        for field in ("n", "method", "param"):
            values = sorted({str(getattr(c, field)) for c in configs})
            if len(values) != 1:
                raise PBInputError(f"batched runs share {field}; got {field} in "
                                   f"{', '.join(values)}: batch each {field} separately")

    @property
    def method(self) -> str:
        return self.members[0].method

    @property
    def r(self) -> torch.Tensor:
        """The members' logits, (G, P) (a detached copy)."""
        return torch.stack([m.r.detach() for m in self.members])

    def theta(self) -> torch.Tensor:
        return torch.stack([m.theta() for m in self.members])

    def surrogate(self, f: BatchedLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        """One step's surrogate over the members: f: (k, G, d) -> (k, G); the value's gradient
        in member g's logits is its estimate (with its dense regularizer). Returns (surrogate,
        mean over the members of their training losses); each member's loss is kept for
        :meth:`pop_epoch_losses`."""
        if weights:
            raise PBInputError("batched runs train masks only (supermask); train weights with "
                               "one run at a time")
        R = torch.stack([m.r for m in self.members])
        est = mc_gradient(f, R, self.param, self.method, self.n,
                          [m.generator for m in self.members], self.chunk)
        grads = list(est.grad.unbind(0))
        for g, m in enumerate(self.members):
            if m.config.lam > 0:
                grads[g] = grads[g] + dense_regularizer(m.r, m.param.theta, m.config.lam)[1]
        losses = est.loss.tolist()
        for kept, loss in zip(self.epoch_losses, losses):
            kept.append(loss)
        grad = torch.stack(grads).to(R.dtype)
        return surrogate_loss(grad, R), sum(losses) / len(losses)

    def pop_epoch_losses(self) -> list[float]:
        """Each member's mean training loss over the steps since the last call (NaN if none),
        as a separate run's loop computes it; then starts afresh."""
        out = [sum(ls) / len(ls) if ls else math.nan for ls in self.epoch_losses]
        self.epoch_losses = [[] for _ in self.members]
        return out

    def check_finite(self, epoch: int) -> None:
        """Refuse logits that became NaN or inf, naming the member and its learning rate."""
        for m in self.members:
            if not bool(torch.isfinite(m.r).all()):
                c = m.config
                raise PBInputError(
                    f"the mask logits of the run with lr={c.lr}, seed={c.seed} became NaN or inf "
                    f"in epoch {epoch + 1}: the learning rate is too large for --optimizer "
                    f"{c.optimizer}; lower it or leave it out of the batch")

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for m in self.members for o in m.optimizers]

    def zero_grad(self) -> None:
        for m in self.members:
            m.zero_grad()

    def apply(self) -> None:
        for m in self.members:
            m.apply()

    def mode_mask(self) -> torch.Tensor:
        """(G, d)."""
        return torch.stack([m.mode_mask() for m in self.members])

    def sample_masks(self, k: int) -> torch.Tensor:
        """(G, k, d), member g's from its generator."""
        return torch.stack([m.sample_masks(k) for m in self.members])

    def config_dict(self) -> dict:
        return {"runs": [m.config_dict() for m in self.members]}

    def state_dict(self) -> dict:
        return {"members": [m.state_dict() for m in self.members],
                "epoch_losses": [list(ls) for ls in self.epoch_losses]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["members"]) != len(self.members):
            raise ValueError("member count")
        for m, st in zip(self.members, state["members"]):
            m.load_state_dict(st)
        self.epoch_losses = [list(ls) for ls in state["epoch_losses"]]
