"""How a masked network is evaluated: the backends, and the one rule that picks one per call.

A :class:`pbscale.forward.masks.MaskedModule` evaluates k masks z (k, d) of a network on inputs x
(B, ...) (and, with a leading group dimension, z (G, k, d) on x (G, B, ...)). Five backends
compute the same function (to float rounding), the same gradients to the masks and to trained
weights, and the same BatchNorm running-statistics update (tested); they differ in speed and in
which networks they run:

========================  ======================================================================
:class:`MlpInplace`       ``nn.Sequential`` of Linear / batch-statistics BatchNorm1d /
                          elementwise layers, no autograd: batched products in place
:class:`MlpAutograd`      the same networks when the output needs a graph: out of place
:class:`Folded`           networks :func:`pbscale.forward.folded.foldable` accepts: the k masks
                          as one network of grouped convolutions
                          (:func:`pbscale.forward.folded.forward_masked`)
:class:`Loop`             the same code one mask at a time (conv nets on a CPU)
:class:`Vmap`             any network: ``torch.func.vmap`` over ``functional_call``
========================  ======================================================================

:class:`BackendChoice` holds a layout's backends and is the only place that chooses among them:
:meth:`BackendChoice.choose` per call (the MLP paths where they apply, else the device's
backend), :meth:`BackendChoice.for_device` for networks off the MLP paths ("auto": folded on a
GPU and for networks without convolutions, loop for conv nets elsewhere, vmap for a network the
folded code cannot run; or the backend asked for by name). It also decides which GPU routes of
:mod:`pbscale.forward.routes` a call takes (:meth:`BackendChoice.effective_routes`): the folded
backend's (channels-last, the 1x1 shortcut as an einsum, the fused BatchNorm tail, cuDNN
autotuning) and :class:`Graphed`, a backend's forward replayed from a CUDA graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from pbexact.errors import PBInputError
from pbscale.forward import route_ops
from pbscale.forward import routes as routes_module
from pbscale.forward.folded import foldable, forward_masked, plain_weight
from pbscale.forward.graphs import StaticFunction, capturing
from pbscale.forward.layout import Backend, MaskLayout
from pbscale.forward.mlp import MlpAutograd, MlpInplace, MlpWeights, mlp_plan
from pbscale.forward.routes import NONE, Routes

#: Backends a layout may ask for by name ("auto": :meth:`BackendChoice.for_device` decides).
BACKENDS = ("auto", "folded", "loop", "vmap")


class Folded(Backend):
    """All k masks as one network (:func:`pbscale.forward.folded.forward_masked`, ``per_call`` masks
    per folded call; None: all k).

    Networks: those :func:`pbscale.forward.folded.foldable` accepts (every model of
    :mod:`pbscale.nets.models`); z (k, d), x (B, ...) -> (k, B, ...); groups one by one. Supports
    the weight hook, ``amp`` (autocast) and ``channels_last``. Gradients: to soft masks, inputs and
    (live parameters when ``train_weights``) the weights. BatchNorm in training mode: each mask
    normalizes with its own batch statistics, and the running statistics are updated once per
    call with the mean over the k masks of their updates; in eval mode the running statistics.
    Dropout: independent units per mask's channels. ``routes``: the GPU routes to take
    (:class:`pbscale.forward.routes.Routes`, or a function of the device giving them; default none),
    ``channels_last`` among them turning channels-last on, ``cudnn_benchmark`` autotuning."""

    name = "folded"
    per_call: int | None = None

    def __init__(self, layout: MaskLayout, per_call: int | None = None,
                 routes: Routes | Callable[[torch.device], Routes] = NONE) -> None:
        super().__init__(layout)
        if per_call is not None:
            self.per_call = per_call
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
                                  per_call=self.per_call, update_stats=True, routes=r)


class Loop(Folded):
    """:class:`Folded` one mask at a time (``per_call=1``): each call a forward of the plain
    network's size, the fastest on a CPU core for conv nets (grouped convolutions cost 1.2-1.6
    dense forwards per mask there, `benchmarks/bench_prune.py`). Same contract as
    :class:`Folded`; Dropout draws per loop iteration."""

    name = "loop"
    per_call = 1


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
    :class:`pbscale.forward.graphs.StaticFunction` per shape, dtype, layout and device of (z, x),
    the latest ``keep`` kept, each around its own instance of the backend (``make()``: its scratch
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
        inside another capture (a captured step, :mod:`pbscale.execution.captured`)."""
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

    ``routes``: the GPU routes asked for (:class:`pbscale.forward.routes.Routes` or its text; None:
    the process default, :func:`pbscale.forward.routes.default`, read at each call);
    :meth:`effective_routes` keeps those that apply."""

    def __init__(self, layout: MaskLayout, requested: str = "auto",
                 routes: Routes | str | None = None) -> None:
        if requested not in BACKENDS:
            raise PBInputError(f"unknown backend {requested!r}; choose one of "
                               f"{', '.join(BACKENDS)}")
        self.foldable = foldable(layout.module)
        if requested in ("folded", "loop") and not self.foldable:
            raise PBInputError(f"backend {requested!r} cannot run this network (a layer or "
                               "forward pbscale.forward.folded.foldable does not accept); use "
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
        :func:`pbscale.forward.route_ops.bn_act`: ResNet-20) when ``torch.compile`` can compile for
        a CUDA device (on meta: the eager tail); ``cudnn_benchmark`` for conv nets;
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
        elsewhere, vmap for a network :func:`pbscale.forward.folded.foldable` rejects."""
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
                    return Folded(lay, backend.per_call, self.effective_routes)
            self.graphed[backend.name] = Graphed(lay, make, capture)
        return self.graphed[backend.name]
