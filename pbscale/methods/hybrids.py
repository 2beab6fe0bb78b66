"""The hybrid estimators of `ch:other`: ST, REBAR and RELAX over sigmoid logits r of shape
(..., d) (leading dimensions batch independent runs, e.g. the microworld's seeds), and the learned
controls of REBAR/RELAX (`sec:app_microworld_hypers`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale.runs.contracts import BatchedLoss

from .estimate import Estimate, sample_mean
from .registry import Capabilities, register
from .trainer import Gradient, LogitsFamily, MicroworldHooks, StepArgs

#: Keeps log(u) and log(1 - u) finite in the logistic reparametrization of REBAR/RELAX.
_UNIFORM_EPS = 1e-6
#: The parts of each control kind: (a learned scale eta, a learned network r_rho).
CONTROL_PARTS = {"rebar": (True, False), "relax": (False, True)}


def straight_through(f: BatchedLoss, r: torch.Tensor, u: torch.Tensor) -> Estimate:
    """ST (Bengio et al., 2013) as in `ch:other`: forward J(z) with z = 1[u < sigmoid(r)], backward
    d J / d z_i used as d E / d r_i (sigmoid derivative ignored). u: (n, ..., d) uniforms."""
    z = (u < torch.sigmoid(r.detach())).to(r.dtype).requires_grad_(True)
    J = f(z)
    (g,) = torch.autograd.grad(J.sum(), z)
    return Estimate(g.mean(0), sample_mean(J))


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
        if kind not in CONTROL_PARTS:
            raise PBInputError(f"unknown control kind {kind!r}; choose one of "
                               f"{', '.join(CONTROL_PARTS)}")
        scaled, learned = CONTROL_PARTS[kind]
        self.kind = kind
        self.log_tau = nn.Parameter(torch.full(shape, 0.5))
        self.eta = nn.Parameter(torch.ones(shape)) if scaled else None
        self.net = (nn.Sequential(nn.Linear(d, hidden), nn.Tanh(), nn.Linear(hidden, 1))
                    if learned else None)
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
    # v theta + 1 - theta rounds to 1 where theta (1 - v) is under half an ulp of 1 (a small
    # theta, v near 1): log1p(-1) = -inf and the gradient 0 * inf = NaN. Any other vb is below
    # 1, so the clamp changes only those values (every other step is bit for bit as before).
    vb = vb.clamp(max=1 - torch.finfo(vb.dtype).eps / 2)
    zt = rr + torch.log(vb) - torch.log1p(-vb)
    soft_z, soft_zt = control.relax(z), control.relax(zt)
    J_all = f(torch.cat([b, soft_z, soft_zt]))
    J_b, f_z, f_zt = J_all[:n].detach(), J_all[n : 2 * n], J_all[2 * n :]
    if control.eta is not None:  # REBAR
        c_z, c_zt = control.eta * f_z, control.eta * f_zt
    else:
        c_z = f_z + control.net(soft_z).squeeze(-1)
        c_zt = f_zt + control.net(soft_zt).squeeze(-1)
    d_cz, d_czt = _grad_pair(c_z, c_zt, rr)
    score = (b - theta).detach()
    g = ((J_b - c_zt)[..., None] * score).mean(0) + (d_cz - d_czt) / n
    return Estimate(g.detach(), sample_mean(J_b)), (g**2).sum()


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


def rebar_relax_step(f: BatchedLoss, r: torch.Tensor, uniforms: Callable[[], torch.Tensor],
                     control: HybridControl, control_opts: list[torch.optim.Optimizer]
                     ) -> Estimate:
    """REBAR or RELAX gradient over sigmoid logits r of shape (..., d), ``uniforms()`` giving
    (n, ..., d) uniforms, then one optimizer step of the control on the variance proxy (the one
    place the controls are trained)."""
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


class HybridFamily(LogitsFamily, MicroworldHooks):
    """The hybrid estimators as methods: sigmoid parametrization only, n >= 1 uniforms per step,
    the masks trained alone (no loss for network weights), dense regularizer through sigmoid.
    A member's estimate over sigmoid logits is :meth:`sigmoid_estimate`, shared by its runs and
    the microworld's vectorized ones."""

    caps = Capabilities(commands=("regress", "regress-group", "microworld"),
                        uses=("n", "lr", "optimizer", "lam"), min_samples=1)

    def gradient(self, f: BatchedLoss, r: torch.Tensor, at: StepArgs) -> Gradient:
        est = self.sigmoid_estimate(f, r, lambda: at.uniforms(at.n), at.control,
                                    list(at.control_opts))
        return Gradient(est, torch.sigmoid)

    def sigmoid_estimate(self, f: BatchedLoss, r: torch.Tensor,
                         uniforms: Callable[[], torch.Tensor], control: Any,
                         control_opts: list[torch.optim.Optimizer]) -> Estimate:
        """The estimate over sigmoid logits r (..., d), ``uniforms()`` giving (n, ..., d)."""
        raise NotImplementedError

    def vector_gradient(self, f: BatchedLoss, r: torch.Tensor,
                        uniforms: Callable[[], torch.Tensor], control: Any,
                        control_opts: list[torch.optim.Optimizer], tau: float) -> torch.Tensor:
        return self.sigmoid_estimate(f, r, uniforms, control, control_opts).grad


@register
class STFamily(HybridFamily):
    """Straight-through (:func:`straight_through`)."""

    name, label, text, color = "st", "ST", "ST", "C5"

    def sigmoid_estimate(self, f: BatchedLoss, r: torch.Tensor,
                         uniforms: Callable[[], torch.Tensor], control: Any,
                         control_opts: list[torch.optim.Optimizer]) -> Estimate:
        return straight_through(f, r, uniforms())


class ControlledFamily(HybridFamily):
    """REBAR or RELAX (:func:`rebar_relax_step`): a learned control of kind ``name``
    (:func:`make_control`), trained at every step."""

    def make_control(self, d: int, lr: float, generator: torch.Generator,
                     seeds: int | None = None, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None
                     ) -> tuple[HybridControl, list[torch.optim.Optimizer]]:
        return make_control(self.name, d, lr, generator, seeds, device, dtype)

    def sigmoid_estimate(self, f: BatchedLoss, r: torch.Tensor,
                         uniforms: Callable[[], torch.Tensor], control: Any,
                         control_opts: list[torch.optim.Optimizer]) -> Estimate:
        return rebar_relax_step(f, r, uniforms, control, control_opts)


@register
class RebarFamily(ControlledFamily):
    name, label, text, color = "rebar", "REBAR", "REBAR", "C6"


@register
class RelaxFamily(ControlledFamily):
    name, label, text, color = "relax", "RELAX", "RELAX", "C8"
