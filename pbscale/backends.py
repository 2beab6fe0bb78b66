"""How a masked network is evaluated: the backends, and the one rule that picks one per call.

A :class:`pbscale.masks.MaskedModule` evaluates k masks z (k, d) of a network on inputs x
(B, ...) (and, with a leading group dimension, z (G, k, d) on x (G, B, ...)). Five backends
compute the same function (to float rounding), the same gradients to the masks and to trained
weights, and the same BatchNorm running-statistics update (tested); they differ in speed and in
which networks they run:

========================  ======================================================================
:class:`MlpInplace`       ``nn.Sequential`` of Linear / batch-statistics BatchNorm1d /
                          elementwise layers, no autograd: batched products in place
:class:`MlpAutograd`      the same networks when the output needs a graph: out of place
:class:`Folded`           networks :func:`pbscale.batched.foldable` accepts: the k masks as one
                          network of grouped convolutions (:func:`pbscale.batched.forward_masked`)
:class:`Loop`             the same code one mask at a time (conv nets on a CPU)
:class:`Vmap`             any network: ``torch.func.vmap`` over ``functional_call``
========================  ======================================================================

:class:`BackendChoice` holds a layout's backends and is the only place that chooses among them:
:meth:`BackendChoice.choose` per call (the MLP paths where they apply, else the device's
backend), :meth:`BackendChoice.for_device` for networks off the MLP paths ("auto": folded on a
GPU and for networks without convolutions, loop for conv nets elsewhere, vmap for a network the
folded code cannot run; or the backend asked for by name). It also decides which GPU routes of
:mod:`pbscale.routes` a call takes (:meth:`BackendChoice.effective_routes`): the folded
backend's (channels-last, the 1x1 shortcut as an einsum, the fused BatchNorm tail, cuDNN
autotuning) and :class:`Graphed`, a backend's forward replayed from a CUDA graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import ClassVar, Protocol

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from pbexact.errors import PBInputError
from pbscale import route_ops
from pbscale import routes as routes_module
from pbscale.batched import WeightHook, foldable, forward_masked, plain_weight
from pbscale.graphs import StaticFunction, capturing
from pbscale.routes import NONE, Routes

#: Backends a layout may ask for by name ("auto": :meth:`BackendChoice.for_device` decides).
BACKENDS = ("auto", "folded", "loop", "vmap")

#: Elementwise activations the MLP paths apply as they are (any tensor layout is fine).
ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.GELU, nn.SiLU,
               nn.Softplus, nn.Identity)

#: One step of an MLP plan: ("linear", offset into z or None, weight name, bias name or None),
#: ("bn", module) or ("act", module).
PlanStep = tuple


class MaskLayout(Protocol):
    """What a backend reads from its layout (:class:`pbscale.masks.MaskedModule`): the network,
    the masked parameter names with their shapes and sizes (d = sum of sizes), the parameters
    as the forward uses them (``base``: detached unless ``train_weights``), the buffers, the
    weight hook (None: w * z), autocast dtype and channels-last flag, and the split of flat
    masks (..., d) into per-tensor masks."""

    module: nn.Module
    names: list[str]
    sizes: list[int]
    d: int
    base: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    weight_hook: WeightHook | None
    train_weights: bool
    amp: torch.dtype | None
    channels_last: bool

    @property
    def dtype(self) -> torch.dtype: ...

    def split(self, z: torch.Tensor) -> dict[str, torch.Tensor]: ...

    def masked_weights(self, z: torch.Tensor) -> dict[str, torch.Tensor]: ...


class Backend:
    """One way to evaluate k masks: ``backend(z, x)``, masks z (k, d), inputs x (B, ...) ->
    outputs (k, B, ...). ``takes_groups``: whether it also takes z (G, k, d) with x (G, B, ...)
    in one call (otherwise :class:`pbscale.masks.MaskedModule` runs the groups one by one)."""

    name: ClassVar[str]
    takes_groups: ClassVar[bool] = False

    def __init__(self, layout: MaskLayout) -> None:
        self.layout = layout

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def mlp_plan(layout: MaskLayout) -> list[PlanStep] | None:
    """The layers of a Sequential the MLP backends can run, or None.

    Qualifies: an ``nn.Sequential`` (or a subclass keeping its forward, e.g. LeNet300100) of
    ``nn.Linear`` (masked weight or unmasked; bias unmasked), ``nn.BatchNorm1d`` without running
    statistics (BN parameters unmasked) and :data:`ELEMENTWISE` activations, starting with a
    Linear, every masked name a Linear weight, no layer used twice."""
    seq = layout.module
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
            plan.append(("linear", offsets.get(w), w, b))
            covered.add(w)
        elif type(m) is nn.BatchNorm1d:
            if m.running_mean is not None or any(f"{name}.{p}" in offsets
                                                 for p in ("weight", "bias")):
                return None  # running statistics (or masked BN parameters)
            plan.append(("bn", m))
        elif type(m) in ELEMENTWISE:
            plan.append(("act", m))
        else:
            return None
    if set(layout.names) - covered or not plan or plan[0][0] != "linear":
        return None
    return plan


class MlpWeights:
    """The masked flat weights the two MLP backends share: the base weights flattened in mask
    order (cached while the weights are unchanged and no graph is needed), and the (k, out, in)
    weight of each plan step."""

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

    def linear_weight(self, step: PlanStep, w_all: torch.Tensor, k: int) -> torch.Tensor:
        """The (k, out, in) weights of a ``linear`` step: its slice of the masked flat weights
        ``w_all`` (k, d), or the unmasked base weight shared by all k masks."""
        _, off, wname, _ = step
        base = self.layout.base[wname]
        out_f, in_f = base.shape
        if off is None:
            return base.expand(k, out_f, in_f)
        return w_all[:, off : off + out_f * in_f].view(k, out_f, in_f)


class MlpAutograd(Backend):
    """MLP path with autograd (soft masks that require grad, or trained weights).

    Networks: :func:`mlp_plan` accepts them; inputs x (B, features), B > 1, masks z (k, d)
    (k > 0) in the layout's dtype; also grouped: z (G, k, d) with x (G, B, features) ->
    (G, k, B, out), the G k masks one stack (only the first Linear, whose input differs per
    group, is a product batched over G). Out of place: a Linear is one batched product over the
    k masks, giving (k, B, out); BatchNorm1d is ``F.batch_norm`` on the activations laid out as
    (B, k * features), whose columns it normalizes over the B points, i.e. with each mask's own
    batch statistics (the networks have no running statistics). Gradients flow to z, x and
    (``train_weights``) the weights and BN affine parameters."""

    name = "mlp_autograd"
    takes_groups = True

    def __init__(self, layout: MaskLayout, weights: MlpWeights) -> None:
        super().__init__(layout)
        self.weights = weights

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        lay, mw = self.layout, self.weights
        lead = z.shape[:-2]  # () or (G,)
        G = z.shape[0] if lead else 1
        k, B = G * z.shape[-2], x.shape[-2]
        z = z.reshape(k, lay.d)
        w_all = mw.hooked(z) if lay.weight_hook is not None else z * mw.flat_base()
        h = None
        kfirst = False  # h is (k, B, features) if kfirst else (B, k, features)
        for step in mw.plan:
            kind = step[0]
            if kind == "linear":
                bname = step[3]
                w = mw.linear_weight(step, w_all, k)
                out_f, in_f = w.shape[1:]
                if h is None and lead:  # each group's input shared by its masks
                    w2 = w.reshape(G, k // G * out_f, in_f)
                    h = torch.bmm(x, w2.transpose(1, 2)).view(G, B, k // G, out_f)
                    h = h.transpose(0, 1).reshape(B, k, out_f)
                    kfirst = False
                elif h is None:  # the input is shared by every mask: one matrix product
                    h = (x @ w.reshape(k * out_f, in_f).t()).view(B, k, out_f)
                    kfirst = False
                else:
                    h = torch.bmm(h if kfirst else h.transpose(0, 1), w.transpose(1, 2))
                    kfirst = True
                if bname is not None:
                    h = h + lay.base[bname]
            elif kind == "bn":
                m = step[1]
                C = h.shape[2]
                if kfirst:
                    h = h.transpose(0, 1).contiguous()
                    kfirst = False
                weight = bias = None
                if m.affine:
                    mw_, mb = ((m.weight, m.bias) if lay.train_weights
                               else (m.weight.detach(), m.bias.detach()))
                    weight, bias = mw_.repeat(k), mb.repeat(k)
                h = F.batch_norm(h.reshape(B, k * C), None, None, weight, bias, True, 0.0,
                                 m.eps).view(B, k, C)
            else:
                h = step[1](h)
        out = h if kfirst else h.transpose(0, 1)
        return out.reshape(*lead, k // G, *out.shape[1:]) if lead else out


class MlpInplace(Backend):
    """MLP path without autograd, in place on cached buffers.

    Networks and inputs as :class:`MlpAutograd`, with no graph wanted; also grouped: z (G, k, d)
    with x (G, B, in) -> (G, k, B, out), the G k masks one stack of G k rows (only the first
    Linear, whose input differs per group, is a product batched over G). Activations laid out as
    (k, features, B): a Linear is W (k, out, in) @ h and BatchNorm1d reduces over the contiguous
    last dimension (two-pass mean and biased variance, as ``F.batch_norm``: each mask's own
    batch statistics). Intermediates ping-pong between two cached scratch buffers; the output is
    a fresh tensor. No gradients."""

    name = "mlp_inplace"
    takes_groups = True

    def __init__(self, layout: MaskLayout, weights: MlpWeights) -> None:
        super().__init__(layout)
        self.weights = weights
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

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        lay, mw = self.layout, self.weights
        lead = z.shape[:-2]  # () or (G,)
        G = z.shape[0] if lead else 1
        k, B = G * z.shape[-2], x.shape[-2]
        if lay.weight_hook is not None:
            w_all = mw.hooked(z.reshape(k, lay.d))
        else:
            w_all = torch.mul(z, mw.flat_base(),
                              out=self.workspace("w", z.shape, z)).view(k, lay.d)
        h = None  # (k, features, B)
        n_linear = sum(step[0] == "linear" for step in mw.plan)
        seen = 0
        for step in mw.plan:
            kind = step[0]
            if kind == "linear":
                bname = step[3]
                w = mw.linear_weight(step, w_all, k)
                out_f, in_f = w.shape[1:]
                seen += 1
                out = (None if seen == n_linear
                       else self.workspace(f"h{seen % 2}", (k, out_f, B), x))
                if h is None and lead:  # each group's input shared by its masks
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
                if bname is not None:
                    h.add_(lay.base[bname][:, None])
            elif kind == "bn":
                m = step[1]
                h.sub_(h.mean(-1, keepdim=True))
                var = torch.linalg.vector_norm(h, dim=-1, keepdim=True).square_().div_(B)
                h.mul_(var.add_(m.eps).rsqrt_())
                if m.affine:
                    h.mul_(m.weight.detach()[:, None]).add_(m.bias.detach()[:, None])
            else:
                m = step[1]
                if type(m) is nn.LeakyReLU:
                    h = F.leaky_relu_(h, m.negative_slope)
                elif type(m) is nn.ReLU:
                    h = h.relu_()
                else:
                    h = m(h)
        ptr = h.untyped_storage().data_ptr()
        if any(ptr == b.untyped_storage().data_ptr() for b in self.scratch.values()):
            h = h.clone()  # the Sequential ends after its last Linear: never return scratch
        return h.transpose(1, 2).reshape(*lead, k // G, B, h.shape[1])


class Folded(Backend):
    """All k masks as one network (:func:`pbscale.batched.forward_masked`, ``group`` masks per
    folded call; None: all k).

    Networks: those :func:`pbscale.batched.foldable` accepts (every model of
    :mod:`pbscale.models`); z (k, d), x (B, ...) -> (k, B, ...); groups one by one. Supports the
    weight hook, ``amp`` (autocast) and ``channels_last``. Gradients: to soft masks, inputs and
    (live parameters when ``train_weights``) the weights. BatchNorm in training mode: each mask
    normalizes with its own batch statistics, and the running statistics are updated once per
    call with the mean over the k masks of their updates; in eval mode the running statistics.
    Dropout: independent units per mask's channels. ``routes``: the GPU routes to take
    (:class:`pbscale.routes.Routes`, or a function of the device giving them; default none),
    ``channels_last`` among them turning channels-last on, ``cudnn_benchmark`` autotuning."""

    name = "folded"
    group: int | None = None

    def __init__(self, layout: MaskLayout, group: int | None = None,
                 routes: Routes | Callable[[torch.device], Routes] = NONE) -> None:
        super().__init__(layout)
        if group is not None:
            self.group = group
        self.routes = routes

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        if z.dim() != 2 or z.shape[-1] != lay.d:
            raise PBInputError(f"masks must have shape (k, {lay.d}), got {tuple(z.shape)}")
        r = self.routes(x.device) if callable(self.routes) else self.routes
        with route_ops.cudnn_benchmark() if r.cudnn_benchmark else contextlib.nullcontext():
            return forward_masked(lay.module, lay.split(z), x, amp=lay.amp,
                                  channels_last=lay.channels_last or r.channels_last,
                                  weight_hook=lay.weight_hook or plain_weight, params=lay.base,
                                  group=self.group, update_stats=True, routes=r)


class Loop(Folded):
    """:class:`Folded` one mask at a time (``group=1``): each call a forward of the plain
    network's size, the fastest on a CPU core for conv nets (grouped convolutions cost 1.2-1.6
    dense forwards per mask there, `benchmarks/bench_prune.py`). Same contract as
    :class:`Folded`; Dropout draws per loop iteration."""

    name = "loop"
    group = 1


class Vmap(Backend):
    """``torch.func.vmap`` over ``functional_call``: any network.

    z (k, d), x (B, ...) -> (k, B, ...) (k may be 0); groups one by one. Weight hook supported;
    not ``amp`` or ``channels_last``. Gradients to masks, inputs and trained weights. BatchNorm
    with running statistics in training mode: per-mask copies of the buffers, updated by each
    mask's batch statistics, then their mean written back (``num_batches_tracked``: one step for
    all k); in eval mode the running statistics. Dropout: ``randomness="different"``."""

    name = "vmap"

    def one(self, weights: dict[str, torch.Tensor], x: torch.Tensor,
            buffers: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The network on x under one mask's weights {name: (*shape)} (the vmapped function)."""
        lay = self.layout
        params = {**lay.base, **weights}
        return functional_call(lay.module, {**params, **(buffers or lay.buffers)}, (x,))

    def bn_batched(self) -> bool:
        """Whether a BatchNorm with running statistics is in training mode (per-mask copies)."""
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
                   and m.running_mean is not None for m in self.layout.module.modules())

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        if z.dim() != 2 or z.shape[-1] != lay.d:
            raise PBInputError(f"masks must have shape (k, {lay.d}), got {tuple(z.shape)}")
        weights = lay.masked_weights(z)
        if not self.bn_batched():
            return vmap(self.one, in_dims=(0, None), randomness="different")(weights, x)
        k = z.shape[0]
        copies = {n: b.expand(k, *b.shape).clone() for n, b in lay.buffers.items()}
        out = vmap(self.one, in_dims=(0, None, 0), randomness="different")(weights, x, copies)
        with torch.no_grad():
            for n, b in lay.buffers.items():
                if b.is_floating_point():
                    b.copy_(copies[n].mean(0))
                else:
                    b.copy_(copies[n][0])  # num_batches_tracked: one step for all k masks
        return out


class Graphed(Backend):
    """Another backend's forward replayed from CUDA graphs (the ``cuda_graph`` route), one
    :class:`pbscale.graphs.StaticFunction` per shape, dtype, layout and device of (z, x), the
    latest ``keep`` kept, each around its own instance of the backend (``make()``: its scratch
    buffers are the graph's). Contract: the wrapped backend's, for the calls :meth:`eligible`
    admits (masks (k, d), no gradient wanted to masks, inputs or weights, no BatchNorm whose
    factor is read back on the host); ``capture=False`` runs the same static-buffer data flow
    eagerly (any device). A change of the weights (their storage or version) makes a new graph.
    BatchNorm running statistics: updated once per call, as by the wrapped backend."""

    name = "graphed"

    def __init__(self, layout: MaskLayout, make: Callable[[], Backend], capture: bool = True,
                 keep: int = 2) -> None:
        super().__init__(layout)
        self.make, self.capture, self.keep = make, capture, keep
        self.calls: dict[tuple, StaticFunction] = {}

    @staticmethod
    def eligible(layout: MaskLayout, z: torch.Tensor, x: torch.Tensor) -> bool:
        """Whether a call can be replayed: z (k, d) with k > 0, nothing to differentiate, no
        training-mode BatchNorm with ``momentum=None`` (its factor is a host read-back), and not
        inside another capture (a captured step, :mod:`pbscale.captured_step`)."""
        grads = torch.is_grad_enabled() and (z.requires_grad or x.requires_grad or any(
            t.requires_grad for t in layout.base.values()))
        cumulative = any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
                         and m.momentum is None for m in layout.module.modules())
        return (z.dim() == 2 and z.shape[0] > 0 and not grads and not cumulative
                and not capturing())

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        key = (tuple(z.shape), z.dtype, tuple(x.shape), x.dtype, x.stride(), str(x.device),
               torch.is_grad_enabled(), tuple(m.training for m in lay.module.modules()),
               tuple((t.data_ptr(), t._version) for t in lay.base.values()))
        call = self.calls.pop(key, None)
        if call is None:
            while len(self.calls) >= self.keep:
                self.calls.pop(next(iter(self.calls)))  # the oldest
            call = StaticFunction(self.make(), list(lay.buffers.values()),
                                  capture=self.capture and x.device.type == "cuda")
        self.calls[key] = call  # the latest last
        return call(z, x)


class BackendChoice:
    """A layout's backends and the rule that picks one.

    ``requested``: one of :data:`BACKENDS`. "auto" (the default) lets :meth:`choose` take the
    MLP paths where :func:`mlp_plan` accepts the network (and no autocast is asked for), and
    :meth:`for_device` pick the rest; a backend named explicitly is used for every call. Built
    once per layout (and again when it moves device), so the MLP scratch buffers and the flat
    weight cache live as long as the layout.

    ``routes``: the GPU routes asked for (:class:`pbscale.routes.Routes` or its text; None:
    the process default, :func:`pbscale.routes.default`, read at each call);
    :meth:`effective_routes` keeps those that apply."""

    def __init__(self, layout: MaskLayout, requested: str = "auto",
                 routes: Routes | str | None = None) -> None:
        if requested not in BACKENDS:
            raise PBInputError(f"unknown backend {requested!r}; choose one of "
                               f"{', '.join(BACKENDS)}")
        self.foldable = foldable(layout.module)
        if requested in ("folded", "loop") and not self.foldable:
            raise PBInputError(f"backend {requested!r} cannot run this network (a layer or "
                               "forward pbscale.batched.foldable does not accept); use "
                               "backend='vmap'")
        if (layout.amp is not None or layout.channels_last) and not self.foldable:
            raise PBInputError("amp and channels_last need the folded or loop backend, which "
                               "cannot run this network; leave them unset")
        self.layout = layout
        self.requested = requested
        self.routes = None if routes is None else routes_module.parse(routes)
        mods = list(layout.module.modules())
        self.has_conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in mods)
        self.has_conv2d = any(isinstance(m, nn.Conv2d) for m in mods)
        self.has_1x1 = any(isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) for m in mods)
        self.has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in mods)
        self.plan = mlp_plan(layout) if requested == "auto" and layout.amp is None else None
        self.folded = Folded(layout, routes=self.effective_routes)
        self.loop, self.vmap = Loop(layout), Vmap(layout)
        self.mlp_inplace = self.mlp_autograd = None
        if self.plan is not None:
            weights = MlpWeights(layout, self.plan)
            self.mlp_inplace = MlpInplace(layout, weights)
            self.mlp_autograd = MlpAutograd(layout, weights)
        self.graphed: dict[str, Graphed] = {}

    def asked(self) -> Routes:
        """The routes asked for: this layout's, else the process default at this moment."""
        return routes_module.default() if self.routes is None else self.routes

    def effective_routes(self, device: torch.device | str) -> Routes:
        """The routes asked for that apply on ``device`` to this network: none off a GPU (a
        CUDA device, or the meta device, which stands for one in the emulated sync check and
        the op counts) or off the folded code; ``channels_last`` for 2-d conv nets under
        autocast (bf16 or fp16: in fp32 channels-last measured slower on the H100, 10.97
        against 7.44 dense steps); ``shortcut_einsum`` where a 1x1 convolution is; ``fused_bn``
        for conv nets with BatchNorm (it acts where the forward calls
        :func:`pbscale.route_ops.bn_act`: ResNet-20) when ``torch.compile`` can compile for a
        CUDA device (on meta: the eager tail); ``cudnn_benchmark`` for conv nets;
        ``cuda_graph`` for supermasks (constant weights; captured on CUDA only)."""
        r = self.asked()
        kind = torch.device(device).type
        if kind not in ("cuda", "meta") or not r.on or not self.foldable:
            return NONE
        lay = self.layout
        compiles = kind == "meta" or route_ops.compile_available()
        return Routes(channels_last=r.channels_last and lay.amp is not None and self.has_conv2d,
                      shortcut_einsum=r.shortcut_einsum and self.has_1x1,
                      fused_bn=r.fused_bn and self.has_bn and self.has_conv2d and compiles,
                      cudnn_benchmark=r.cudnn_benchmark and self.has_conv,
                      cuda_graph=r.cuda_graph and not lay.train_weights)

    def for_device(self, device: torch.device | str) -> Backend:
        """The backend for networks off the MLP paths on ``device``: the requested one, or for
        "auto": folded on cuda and for networks without convolutions, loop for conv nets
        elsewhere, vmap for a network :func:`pbscale.batched.foldable` rejects."""
        if self.requested != "auto":
            return {"folded": self.folded, "loop": self.loop, "vmap": self.vmap}[self.requested]
        if not self.foldable:
            return self.vmap
        if torch.device(device).type == "cuda" or not self.has_conv:
            return self.folded
        return self.loop

    def choose(self, z: torch.Tensor, x: torch.Tensor) -> Backend:
        """The backend for masks z (k, d) or (G, k, d) on inputs x (B, ...) or (G, B, ...):
        an MLP path when the network has a plan, x is (B, features) (or (G, B, features)) with
        B > 1, k > 0 and both dtypes are the layout's (in place unless a graph is wanted); vmap
        for k = 0; else :meth:`for_device`."""
        grouped = z.dim() == 3
        if (self.plan is not None and x.dim() == 2 + grouped and x.shape[-2] > 1
                and z.shape[-2] > 0 and z.dtype == self.layout.dtype
                and x.dtype == self.layout.dtype):
            wants = self.mlp_inplace.weights.wants_graph(z, x)
            backend = self.mlp_autograd if wants else self.mlp_inplace
        elif z.shape[-2] == 0:
            return self.vmap
        else:
            backend = self.for_device(x.device)
        if (backend.name in ("mlp_inplace", "folded", "loop")
                and self.effective_routes(x.device).cuda_graph
                and Graphed.eligible(self.layout, z, x)):
            return self.graphed_for(backend)
        return backend

    def graphed_for(self, backend: Backend, capture: bool = True) -> Graphed:
        """The :class:`Graphed` wrapper of ``backend`` (an MLP in-place, folded or loop
        backend of this layout), built once; each of its graphs runs its own instance."""
        if backend.name not in self.graphed:
            lay = self.layout
            if backend.name == "mlp_inplace":
                def make() -> Backend:
                    return MlpInplace(lay, MlpWeights(lay, self.plan))
            else:
                def make() -> Backend:
                    return Folded(lay, backend.group, self.effective_routes)
            self.graphed[backend.name] = Graphed(lay, make, capture)
        return self.graphed[backend.name]
