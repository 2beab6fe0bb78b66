"""Every mask-optimization method of the paper, in torch, for any batched loss f(z).

The loss is a batched function ``f(z)`` of masks z of shape (..., d) returning (...); for the
MC estimators it is only evaluated, for CP and the hybrid estimators it is differentiated
(soft masks in [0, 1]). Nothing here knows about ``nn.Module`` masking: :mod:`pbscale.masks`
supplies f for a masked network, and the microworld (NNLoss) can supply its own.

* MC (REINFORCE, LOORF, ARMS; `ch:monte_carlo`): the n samples of one step are drawn and
  evaluated in chunks of k, combined with the iterative accumulators of pbexact
  (`alg:iter_reinforce`, `alg:iter_loorf`, `alg:iter_arms`; ARMS with the iterative Dirichlet
  copula of `alg:iter_dir`), so memory is O(k d) whatever n is and the gradient equals the
  one-shot batch form on the same samples. Scores come from the pbexact parametrizations
  (`tab:alternative_param`).
* CP (`sec:pb_application`): f(sigmoid(r / tau)) with tau annealed exponentially from 1 to 1/200,
  updated every 100 iterations (`sec:app_microworld_hypers`); evaluated with 1[r > 0].
* ST, REBAR, RELAX (`ch:other`), sigmoid parametrization only, as the paper uses them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from pbexact.copula import arms_bits, arms_correlation
from pbexact.errors import PBInputError, check_n
from pbexact.estimators import (
    MIN_SAMPLES,
    ArmsAccumulator,
    LoorfAccumulator,
    ReinforceAccumulator,
)
from pbexact.parametrizations import PARAMETRIZATIONS, Parametrization, get_parametrization
from pbexact.sampling import IterativeDirichletCopula

#: A batched loss: masks (..., d) -> losses (...).
BatchedLoss = Callable[[torch.Tensor], torch.Tensor]

MC_METHODS = ("reinforce", "loorf", "arms")
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
        total = math.prod(shape)
        words = torch.empty(((total + 1) // 2,), dtype=torch.int64)
        words.random_(generator=self.generator)
        m = words.view(torch.int32)[:total].view(shape).bitwise_and_((1 << self._BITS) - 1)
        # m as float32 (exact: m < 2^24) over the same memory: an elementwise in-place cast,
        # which spares a fresh (k, d) buffer (a fresh buffer costs more than the cast itself)
        u = words.view(torch.float32)[:total].view(shape)
        u.copy_(m)
        return torch.lt(u, self._scaled, out=u)


class CopulaSampler:
    """ARMS samples from the iterative Dirichlet copula (`alg:iter_dir`), k at a time, with
    O(d) state: the Gamma(n, 1) totals are drawn once, then pbexact's sampler does the rest."""

    def __init__(self, theta: torch.Tensor, n: int, generator: torch.Generator) -> None:
        self.theta = theta
        self.generator = generator
        total = standard_gamma(float(n), tuple(theta.shape), generator, torch.float64)
        self.copula = IterativeDirichletCopula(total, n)

    def next(self, k: int) -> torch.Tensor:
        u = torch.rand((k,) + tuple(self.theta.shape), generator=self.generator,
                       dtype=torch.float64, device=self.theta.device)
        # float64 for the copula arithmetic: (1 - E/R)^(n-1) loses the tail in float32 for large n
        return arms_bits(self.copula.next(u), self.theta.double()).to(self.theta.dtype)


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
    """One step's gradient over the logits, shape (P,), and the mean sampled loss."""

    grad: torch.Tensor
    loss: float


def mc_gradient(f: BatchedLoss, r: torch.Tensor, param: Parametrization, estimator: str, n: int,
                generator: torch.Generator | None = None, chunk: int | None = None,
                sampler: Any = None) -> Estimate:
    """REINFORCE / LOORF / ARMS estimate of grad_r E[J(z)] from n samples evaluated k = chunk at
    a time (`alg:iter_loorf`, `alg:iter_arms`); r of shape (P,), f: (k, d) -> (k,).

    ``sampler`` (an object with ``next(k) -> (k, d)``) replaces the default Bernoulli or copula
    sampler, e.g. to replay given samples.
    """
    check_n(n, estimator.upper(), MIN_SAMPLES[estimator])
    chunk = n if chunk is None else max(1, min(int(chunk), n))
    with torch.no_grad():
        r = r.detach()
        theta = param.theta(r)
        if estimator == "arms":
            rho = param.expand(arms_correlation(theta, n))
            acc: ReinforceAccumulator | LoorfAccumulator = ArmsAccumulator(rho)
            sampler = sampler or CopulaSampler(theta, n, generator)
        else:
            acc = LoorfAccumulator() if estimator == "loorf" else ReinforceAccumulator()
            sampler = sampler or BernoulliSampler(theta, generator)
        affine = None
        if param.logits_per_bit == 1:
            affine = param.affine_score(r)  # S = a + z b, never built in full
        total, done = 0.0, 0
        while done < n:
            k = min(chunk, n - done)
            z = sampler.next(k)
            J = f(z).to(r.dtype)
            acc.update(J, _AffineScores(z.to(r.dtype), *affine) if affine is not None
                       else param.score(z, r))
            total += float(J.sum())
            done += k
        return Estimate(acc.value(), total / n)


class _AffineScores:
    """The scores S = a + z b (k, P) of k samples z (k, d), P = d, kept unmaterialized: the
    pbexact accumulators only take their sum over samples and weighted sums
    (`pbexact.estimators.sample_sum`), which are sum(z) b + k a and (w z) b + sum(w) a."""

    def __init__(self, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        self.z, self.a, self.b = z, a, b

    def sum(self, dim: int) -> torch.Tensor:
        if dim not in (-2, 0):
            raise ValueError("affine scores are summed over samples only")
        return self.z.sum(0) * self.b + self.z.shape[0] * self.a

    def weighted_sum(self, w: torch.Tensor) -> torch.Tensor:
        return (w @ self.z) * self.b + w.sum(-1) * self.a


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


def cp_temperature(step: int, total_steps: int, final: float = 1 / 200, every: int = 100) -> float:
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
    cp_final_tau: float = 1 / 200
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
                "use --param sigmoid (other parametrizations: reinforce, loorf, arms)"
            )
        if self.method != "cp":
            check_n(self.n, self.method.upper(), METHOD_MIN_SAMPLES[self.method])
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise PBInputError(f"the learning rate must be a positive number, got lr={self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise PBInputError(
                f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
            )
        if self.chunk is not None and (not isinstance(self.chunk, int) or self.chunk < 1):
            raise PBInputError(f"chunk must be a positive integer (or omitted), got {self.chunk}")
        if not self.lam >= 0:
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
            self.control = HybridControl(config.method, d, generator=init_gen).to(
                device=self.device, dtype=dtype)
            scalars = self.control.scalar_parameters()
            self.control_opts.append(torch.optim.Adam(scalars, lr=config.lr))
            if self.control.net is not None:
                # `sec:app_microworld_hypers`: the RELAX network uses Adam, lr 1, weight decay 1e-3
                self.control_opts.append(
                    torch.optim.Adam(self.control.surrogate_parameters(), lr=1.0, weight_decay=1e-3)
                )
        if config.chunk is not None:
            self.chunk = min(config.chunk, config.n)
        else:
            per_sample = bytes_per_sample or 16 * d
            self.chunk = auto_chunk(config.n, per_sample, self.device)
        self.step_count = 0

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
                              self.chunk)
            theta_fn = self.param.theta
        elif self.method == "cp":
            tau = self.tau()
            rr = self.r.detach().requires_grad_(True)
            out = f(torch.stack([torch.sigmoid(rr / tau), cp_hard_mask(rr.detach())]))
            (grad,) = torch.autograd.grad(out[0], rr, retain_graph=record is not None)
            if record is not None:
                record.append(out[0])
            # the training loss CP reports is that of 1[r > 0], as the paper does
            est = Estimate(grad, float(out[1].detach()))

            def theta_fn(x: torch.Tensor) -> torch.Tensor:
                return torch.sigmoid(x / tau)
        elif self.method == "st":
            est = straight_through(f, self.r, self._uniforms(c.n))
            theta_fn = torch.sigmoid
        else:
            est, var = rebar_relax(f, self.r, self._uniforms(c.n), self._uniforms(c.n),
                                   self.control)
            for opt in self.control_opts:
                opt.zero_grad()
            params = self.control.scalar_parameters() + self.control.surrogate_parameters()
            grads = torch.autograd.grad(var, params, allow_unused=True)
            for p, g in zip(params, grads):
                p.grad = g
            for opt in self.control_opts:
                opt.step()
            theta_fn = torch.sigmoid
        if c.lam > 0:
            _, reg_grad = dense_regularizer(self.r, theta_fn, c.lam)
            est.grad = est.grad + reg_grad
        return est

    def surrogate(self, f: BatchedLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        """This step's estimate as a surrogate loss: a scalar whose autograd gradient in r is the
        method's gradient estimate (with the dense regularizer), (g.detach() * r).sum(), and, with
        ``weights=True``, whose gradient in the network weights is that of the method's loss on
        the weights (MC: the mean of J over the n sampled masks; CP: the relaxed loss), so that
        one ``backward`` fills both. Returns (surrogate (), training loss)."""
        record: list | None = [] if weights else None
        est = self.gradient(f, record)
        value = (est.grad.detach().to(self.r.dtype) * self.r).sum()
        if record:
            if self.method == "cp":
                value = value + record[0]
            else:
                value = value + sum(J.sum() for J in record) / self.config.n
        return value, est.loss

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

