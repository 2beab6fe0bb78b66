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
import os
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
    """z ~ prod_i Bern(theta_i) (`eq:reinforce_p`), k at a time: z = 1[u < theta]."""

    def __init__(self, theta: torch.Tensor, generator: torch.Generator) -> None:
        self.theta = theta
        self.generator = generator

    def next(self, k: int) -> torch.Tensor:
        u = torch.rand((k,) + tuple(self.theta.shape), generator=self.generator,
                       dtype=self.theta.dtype, device=self.theta.device)
        return (u < self.theta).to(self.theta.dtype)


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
        total, done = 0.0, 0
        while done < n:
            k = min(chunk, n - done)
            z = sampler.next(k)
            J = f(z).to(r.dtype)
            acc.update(J, param.score(z, r))
            total += float(J.sum())
            done += k
        return Estimate(acc.value(), total / n)


def dense_regularizer(r: torch.Tensor, theta_fn: Callable[[torch.Tensor], torch.Tensor],
                      lam: float) -> tuple[float, torch.Tensor]:
    """lambda * sum_i theta_i(r) in closed form and its exact gradient over r, shape (P,).

    For MC methods theta_fn is the parametrization's theta (E[sum z] = sum theta); for CP it is
    r -> sigmoid(r / tau). Used by pruning (`sec:app_pruning_setup`); lambda = 0 here.
    """
    rr = r.detach().requires_grad_(True)
    value = lam * theta_fn(rr).sum()
    (grad,) = torch.autograd.grad(value, rr)
    return float(value), grad


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

    def __init__(self, kind: str, d: int, shape: tuple[int, ...] = (), hidden: int = 10) -> None:
        super().__init__()
        if kind not in ("rebar", "relax"):
            raise PBInputError(f"unknown control kind {kind!r}; choose rebar or relax")
        self.kind = kind
        self.log_tau = nn.Parameter(torch.full(shape, 0.5))
        self.eta = nn.Parameter(torch.ones(shape)) if kind == "rebar" else None
        self.net = (nn.Sequential(nn.Linear(d, hidden), nn.Tanh(), nn.Linear(hidden, 1))
                    if kind == "relax" else None)

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
