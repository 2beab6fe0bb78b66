"""The MLP paths of the masked forward: an ``nn.Sequential`` of Linear, batch-statistics
BatchNorm1d and elementwise layers read once into a plan of typed steps (:func:`mlp_plan`:
:class:`Linear`, :class:`Norm`, :class:`Act`), and the one interpreter of that plan
(:class:`MlpBackend`), which walks it for both paths: :class:`MlpAutograd` (out of place, with
autograd) and :class:`MlpInplace` (in place on cached buffers, no autograd) supply only what
each step computes in their layout of the activations. The masked flat weights they share are
:class:`MlpWeights`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from pbscale.forward.layout import Backend, MaskLayout
from pbscale.forward.rescale import HOOK_WRITERS

#: Elementwise activations the MLP paths apply as they are (any tensor layout is fine).
ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.GELU, nn.SiLU,
               nn.Softplus, nn.Identity)


@dataclass(frozen=True)
class Linear:
    """An ``nn.Linear`` of the plan: its weight's offset into the flat mask (None: unmasked),
    the weight's and the bias's parameter names (bias None: no bias)."""

    offset: int | None
    weight: str
    bias: str | None


@dataclass(frozen=True)
class Norm:
    """An ``nn.BatchNorm1d`` without running statistics (each mask's own batch statistics)."""

    module: nn.BatchNorm1d


@dataclass(frozen=True)
class Act:
    """An elementwise activation of :data:`ELEMENTWISE`."""

    module: nn.Module


#: One step of an MLP plan.
PlanStep = Linear | Norm | Act


def mlp_plan(layout: MaskLayout) -> list[PlanStep] | None:
    """The layers of a Sequential the MLP backends can run, or None.

    Qualifies: an ``nn.Sequential`` (or a subclass keeping its forward, e.g. LeNet300100) of
    ``nn.Linear`` (masked weight or unmasked; bias unmasked), ``nn.BatchNorm1d`` without running
    statistics (BN parameters unmasked) and :data:`ELEMENTWISE` activations, starting with a
    Linear, every masked name a Linear weight, no layer used twice; and a layout whose mask
    entries are weights (``per_weight``)."""
    seq = layout.module
    if not getattr(layout, "per_weight", True):
        return None  # masks over channels, not one entry per weight
    if (not isinstance(seq, nn.Sequential) or type(seq).forward is not nn.Sequential.forward
            or len(list(seq.named_children())) != len(seq)):
        return None
    offsets, pos = {}, 0
    for k, size in zip(layout.names, layout.sizes):
        offsets[k] = pos
        pos += size
    plan: list[PlanStep] = []
    covered = set()
    for name, m in seq.named_children():
        if type(m) is nn.Linear:
            w = f"{name}.weight"
            b = f"{name}.bias" if m.bias is not None else None
            if w not in layout.base or (b is not None and (b in offsets or b not in layout.base)):
                return None  # tied (shared) parameters or a masked bias
            plan.append(Linear(offsets.get(w), w, b))
            covered.add(w)
        elif type(m) is nn.BatchNorm1d:
            if m.running_mean is not None or any(f"{name}.{p}" in offsets
                                                 for p in ("weight", "bias")):
                return None  # running statistics (or masked BN parameters)
            plan.append(Norm(m))
        elif type(m) in ELEMENTWISE:
            plan.append(Act(m))
        else:
            return None
    if set(layout.names) - covered or not plan or not isinstance(plan[0], Linear):
        return None
    return plan


class MlpWeights:
    """The masked flat weights the two MLP backends share: the base weights flattened in mask
    order (cached while the weights are unchanged and no graph is needed), and the (k, out, in)
    weight of each :class:`Linear` step."""

    def __init__(self, layout: MaskLayout, plan: list[PlanStep]) -> None:
        self.layout = layout
        self.plan = plan
        self.cache: tuple | None = None

    def needs_graph(self) -> bool:
        """Whether the forward must record autograd for the weights."""
        lay = self.layout
        return (lay.train_weights and torch.is_grad_enabled()
                and any(lay.base[k].requires_grad for k in lay.base))

    def wants_graph(self, z: torch.Tensor, x: torch.Tensor) -> bool:
        """Whether the output needs autograd (then the MLP path runs out of place)."""
        return (torch.is_grad_enabled() and (z.requires_grad or x.requires_grad)
                or self.needs_graph())

    def flat_base(self) -> torch.Tensor:
        """The masked weights flattened and concatenated in mask order, shape (d,)."""
        lay = self.layout
        if self.needs_graph():  # a fresh graph every call
            return torch.cat([lay.base[k].reshape(-1) for k in lay.names])
        ids = tuple((lay.base[k].data_ptr(), lay.base[k]._version) for k in lay.names)
        if self.cache is None or self.cache[0] != ids:
            self.cache = (ids, torch.cat([lay.base[k].reshape(-1) for k in lay.names]))
        return self.cache[1]

    def hooked(self, z: torch.Tensor) -> torch.Tensor:
        """The hooked masked weights flattened in mask order, z (k, d) -> (k, d)."""
        return torch.cat([w.reshape(z.shape[0], -1)
                          for w in self.layout.masked_weights(z).values()], dim=1)

    def write_hooked(self, z: torch.Tensor, out: torch.Tensor) -> bool:
        """The hooked masked weights of z (k, d) written into out (k, d) by the hook's writer
        (:data:`pbscale.forward.rescale.HOOK_WRITERS`), tensor by tensor, without autograd;
        False where the hook has none or its writer declines (then call :meth:`hooked`)."""
        lay = self.layout
        writer = HOOK_WRITERS.get(lay.weight_hook)
        if writer is None:
            return False
        off = 0
        for name, size in zip(lay.names, lay.sizes):
            if not writer(lay.base[name], z, off, out):
                return False
            off += size
        return True

    def linear_weight(self, step: Linear, w_all: torch.Tensor, k: int) -> torch.Tensor:
        """The (k, out, in) weights of a :class:`Linear` step: its slice of the masked flat
        weights ``w_all`` (k, d), or the unmasked base weight shared by all k masks."""
        base = self.layout.base[step.weight]
        out_f, in_f = base.shape
        if step.offset is None:
            return base.expand(k, out_f, in_f)
        return w_all[:, step.offset : step.offset + out_f * in_f].view(k, out_f, in_f)


@dataclass
class Call:
    """One call of an MLP backend: k masks in all (G groups of k / G), B inputs per group,
    the leading group shape (() or (G,)), and the layout state an interpreter keeps between
    steps (``kfirst``: the out-of-place activations are (k, B, F) rather than (B, k, F))."""

    k: int
    B: int
    G: int
    lead: tuple[int, ...]
    kfirst: bool = False


class MlpBackend(Backend):
    """The one interpreter of an MLP plan: masks z (k, d) on inputs x (B, features) -> (k, B,
    out), or grouped, z (G, k, d) with x (G, B, features) -> (G, k, B, out) (group g's masks on
    group g's inputs; only the first Linear, whose input differs per group, is batched over G).
    :meth:`__call__` walks the plan once; a subclass computes each step in its own layout of
    the activations (:meth:`masked`, :meth:`linear`, :meth:`norm`, :meth:`act`,
    :meth:`output`)."""

    takes_groups = True

    def __init__(self, layout: MaskLayout, weights: MlpWeights) -> None:
        super().__init__(layout)
        self.weights = weights

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        mw = self.weights
        lead = tuple(z.shape[:-2])  # () or (G,)
        G = z.shape[0] if lead else 1
        call = Call(k=G * z.shape[-2], B=x.shape[-2], G=G, lead=lead)
        w_all = self.masked(z, call)
        last = max(i for i, s in enumerate(mw.plan) if isinstance(s, Linear))
        h = None
        seen = 0
        for i, step in enumerate(mw.plan):
            if isinstance(step, Linear):
                seen += 1
                w = mw.linear_weight(step, w_all, call.k)
                h = self.linear(step, w, x, h, call, seen, i == last)
            elif isinstance(step, Norm):
                h = self.norm(step.module, h, call)
            else:
                h = self.act(step.module, h, call)
        return self.output(h, call)

    def masked(self, z: torch.Tensor, call: Call) -> torch.Tensor:
        """The masked flat weights (k, d) of masks z."""
        raise NotImplementedError

    def linear(self, step: Linear, w: torch.Tensor, x: torch.Tensor, h: torch.Tensor | None,
               call: Call, nth: int, last: bool) -> torch.Tensor:
        """The ``nth`` Linear (``last``: the plan's last) with weights w (k, out, in) on the
        activations h, or on the inputs x for the first (h None), its bias added."""
        raise NotImplementedError

    def norm(self, m: nn.BatchNorm1d, h: torch.Tensor, call: Call) -> torch.Tensor:
        """BatchNorm1d with each mask's own batch statistics."""
        raise NotImplementedError

    def act(self, m: nn.Module, h: torch.Tensor, call: Call) -> torch.Tensor:
        """An elementwise activation."""
        raise NotImplementedError

    def output(self, h: torch.Tensor, call: Call) -> torch.Tensor:
        """The outputs (*lead, k / G, B, out) from the last activations."""
        raise NotImplementedError


class MlpAutograd(MlpBackend):
    """MLP path with autograd (soft masks that require grad, or trained weights).

    Networks: :func:`mlp_plan` accepts them; inputs x (B, features), B > 1, masks z (k, d)
    (k > 0) in the layout's dtype; also grouped (:class:`MlpBackend`). Out of place: a Linear
    is one batched product over the k masks, giving (k, B, out); BatchNorm1d is
    ``F.batch_norm`` on the activations laid out as (B, k * features), whose columns it
    normalizes over the B points, i.e. with each mask's own batch statistics (the networks have
    no running statistics). Gradients flow to z, x and (``train_weights``) the weights and BN
    affine parameters."""

    name = "mlp_autograd"

    def masked(self, z: torch.Tensor, call: Call) -> torch.Tensor:
        lay, mw = self.layout, self.weights
        z = z.reshape(call.k, lay.d)
        return mw.hooked(z) if lay.weight_hook is not None else z * mw.flat_base()

    def linear(self, step: Linear, w: torch.Tensor, x: torch.Tensor, h: torch.Tensor | None,
               call: Call, nth: int, last: bool) -> torch.Tensor:
        k, B, G = call.k, call.B, call.G
        out_f, in_f = w.shape[1:]
        if h is None and call.lead:  # each group's input shared by its masks
            w2 = w.reshape(G, k // G * out_f, in_f)
            h = torch.bmm(x, w2.transpose(1, 2)).view(G, B, k // G, out_f)
            h = h.transpose(0, 1).reshape(B, k, out_f)
            call.kfirst = False
        elif h is None:  # the input is shared by every mask: one matrix product
            h = (x @ w.reshape(k * out_f, in_f).t()).view(B, k, out_f)
            call.kfirst = False
        else:
            h = torch.bmm(h if call.kfirst else h.transpose(0, 1), w.transpose(1, 2))
            call.kfirst = True
        if step.bias is not None:
            h = h + self.layout.base[step.bias]
        return h

    def norm(self, m: nn.BatchNorm1d, h: torch.Tensor, call: Call) -> torch.Tensor:
        lay, k, B = self.layout, call.k, call.B
        C = h.shape[2]
        if call.kfirst:
            h = h.transpose(0, 1).contiguous()
            call.kfirst = False
        weight = bias = None
        if m.affine:
            mw_, mb = ((m.weight, m.bias) if lay.train_weights
                       else (m.weight.detach(), m.bias.detach()))
            weight, bias = mw_.repeat(k), mb.repeat(k)
        return F.batch_norm(h.reshape(B, k * C), None, None, weight, bias, True, 0.0,
                            m.eps).view(B, k, C)

    def act(self, m: nn.Module, h: torch.Tensor, call: Call) -> torch.Tensor:
        return m(h)

    def output(self, h: torch.Tensor, call: Call) -> torch.Tensor:
        out = h if call.kfirst else h.transpose(0, 1)
        return (out.reshape(*call.lead, call.k // call.G, *out.shape[1:]) if call.lead
                else out)


class MlpInplace(MlpBackend):
    """MLP path without autograd, in place on cached buffers.

    Networks and inputs as :class:`MlpAutograd`, masks z (k, d), with no graph wanted; also
    grouped (:class:`MlpBackend`). Activations laid out as (k, features, B): a Linear is
    W (k, out, in) @ h and BatchNorm1d reduces over the contiguous last dimension (two-pass mean
    and biased variance, as ``F.batch_norm``: each mask's own batch statistics). Intermediates
    ping-pong between two cached scratch buffers; the output is a fresh tensor. No
    gradients."""

    name = "mlp_inplace"

    def __init__(self, layout: MaskLayout, weights: MlpWeights) -> None:
        super().__init__(layout, weights)
        self.scratch: dict = {}

    def workspace(self, name: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """A cached scratch tensor (reused across calls: a fresh large buffer costs page faults
        on every call); only for intermediates that never leave this backend."""
        key = (name, tuple(shape), like.dtype, like.device)
        buf = self.scratch.get(key)
        if buf is None:
            self.scratch = {k: v for k, v in self.scratch.items() if k[0] != name}
            buf = self.scratch[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return buf

    def masked(self, z: torch.Tensor, call: Call) -> torch.Tensor:
        lay, mw = self.layout, self.weights
        if lay.weight_hook is not None:
            flat = z.reshape(call.k, lay.d)
            w = self.workspace("w", flat.shape, z)
            return w if mw.write_hooked(flat, w) else mw.hooked(flat)
        return torch.mul(z, mw.flat_base(), out=self.workspace("w", z.shape, z)).view(
            call.k, lay.d)

    def linear(self, step: Linear, w: torch.Tensor, x: torch.Tensor, h: torch.Tensor | None,
               call: Call, nth: int, last: bool) -> torch.Tensor:
        k, B, G = call.k, call.B, call.G
        out_f, in_f = w.shape[1:]
        out = None if last else self.workspace(f"h{nth % 2}", (k, out_f, B), x)
        if h is None and call.lead:  # each group's input shared by its masks
            w2 = w.reshape(G, k // G * out_f, in_f)
            h = (torch.bmm(w2, x.transpose(1, 2)) if out is None
                 else torch.bmm(w2, x.transpose(1, 2),
                                out=out.view(G, k // G * out_f, B))).view(k, out_f, B)
        elif h is None:  # the input is shared by every mask: one matrix product
            w2 = w.reshape(k * out_f, in_f)
            h = (torch.mm(w2, x.t()) if out is None
                 else torch.mm(w2, x.t(), out=out.view(k * out_f, B))).view(k, out_f, B)
        else:
            h = torch.bmm(w, h) if out is None else torch.bmm(w, h, out=out)
        if step.bias is not None:
            h.add_(self.layout.base[step.bias][:, None])
        return h

    def norm(self, m: nn.BatchNorm1d, h: torch.Tensor, call: Call) -> torch.Tensor:
        h.sub_(h.mean(-1, keepdim=True))
        var = torch.linalg.vector_norm(h, dim=-1, keepdim=True).square_().div_(call.B)
        h.mul_(var.add_(m.eps).rsqrt_())
        if m.affine:
            h.mul_(m.weight.detach()[:, None]).add_(m.bias.detach()[:, None])
        return h

    def act(self, m: nn.Module, h: torch.Tensor, call: Call) -> torch.Tensor:
        if type(m) is nn.LeakyReLU:
            return F.leaky_relu_(h, m.negative_slope)
        if type(m) is nn.ReLU:
            return h.relu_()
        return m(h)

    def output(self, h: torch.Tensor, call: Call) -> torch.Tensor:
        ptr = h.untyped_storage().data_ptr()
        if any(ptr == b.untyped_storage().data_ptr() for b in self.scratch.values()):
            h = h.clone()  # the Sequential ends after its last Linear: never return scratch
        return h.transpose(1, 2).reshape(*call.lead, call.k // call.G, call.B, h.shape[1])
