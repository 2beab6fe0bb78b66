"""k masked copies of a Conv / Linear / BatchNorm / residual network evaluated as one network.

:func:`forward_masked` runs the module's own ``forward`` once, with activations in a *folded*
layout: the k masked copies side by side in the channel dimension, (B, k * C, ...) for conv
activations and (B, k * F) for flat ones. Only the layers with weights need to know about k, and
while the call runs they take a k-batched form (restored afterwards):

* ``nn.Conv1d/2d/3d``: the k masked kernels (k, out, in / g, ...) stacked into one kernel
  (k * out, in / g, ...) and applied as ONE grouped convolution with groups = k * g. The first
  layer sees the input shared by every mask (C channels, not k * C): a masked convolution applies
  the stacked kernel with the original groups (the input is never repeated), an unmasked layer
  runs once and its output is repeated k times. From then on every activation is folded; the
  one unsupported mix is adding the raw input (before any layer with weights) to a folded
  activation.
* ``nn.Linear``: one batched matrix product over the k masks, (k, B, in) @ (k, in, out); on a
  shared input one matrix product with the stacked (k * out, in) weight.
* ``nn.BatchNorm1d/2d/3d``: ``F.batch_norm`` over (B, k * C, ...) normalizes each of the k * C
  channels over the batch, i.e. with each mask's own batch statistics (training mode), or with
  the running statistics repeated k times (eval mode). Running statistics are left alone unless
  ``update_stats=True`` (what :class:`pbscale.forward.masks.MaskedModule` passes): then each mask
  updates its own copy and the mean of the k copies is written back once per call.

Everything without weights (ReLU and other elementwise functions, pooling, residual additions,
flatten) acts channel by channel and so works on the folded layout unchanged. Not supported (the
result would be wrong or raise): operations that mix channels outside these layers (e.g. a
channel-padding "option A" shortcut or a channel shuffle) and any other layer type with
parameters (rejected with :class:`PBInputError`). The tests check equality with a per-mask
``functional_call`` loop on the repository's networks, forward and gradients.
:func:`foldable` is the conservative check :class:`pbscale.forward.masks.MaskedModule` applies
before using this path (known layer types, and custom forwards only where the class vouches for them
with ``channelwise_forward = True``).

``per_call=g`` runs the k masks g at a time through the same code (g = 1: a loop over masks, each a
forward of the plain network's size): on one CPU core a grouped convolution over k-times-wider
activations costs more per mask than k plain ones (ResNet-20, batch 32: 1.2-1.6 dense forwards
per mask at k = 2-10 against about 1.0 for the loop, `benchmarks/bench_prune.py`), while on a
GPU the single folded call wins (H200, k = 100: 53 ms against 85 ms for vmap).

Weights are used live (not detached): gradients flow to the weights (joint training,
`sec:app_joint_pruning_setup`) and to soft masks (CP, `sec:pb_application`). The backends
:class:`pbscale.forward.backends.Folded` and :class:`pbscale.forward.backends.Loop` run masks
through it.

``routes`` (:class:`pbscale.forward.routes.Routes`, default none: the reference path) swaps in the
GPU routes' computations of :mod:`pbscale.forward.route_ops` where they apply: ``channels_last``
(the masked kernels written in channels-last, a repeated shared activation kept so),
``shortcut_einsum`` (a 1x1 convolution on folded activations) and ``fused_bn`` (BatchNorm with
the ReLU and residual add the model's :func:`pbscale.forward.route_ops.bn_act` asks for after it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from pbexact.errors import PBInputError
from pbscale.forward import route_ops
from pbscale.forward.routes import NONE, Routes

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CONV_FN = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

#: Loss per mask: outputs (k, B, C) and targets (B,) -> (k,).
PerMaskLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: A mask-to-weight hook: (parameter name, weight (*shape), masks (k, *shape)) -> (k, *shape).
WeightHook = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]


def plain_weight(name: str, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The default mask-to-weight map w * z: weight (*shape), mask (k, *shape) -> (k, *shape)."""
    return weight * mask


def cross_entropy_per_mask(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the batch for each mask: logits (k, B, C), labels (B,) -> (k,)."""
    k, B = out.shape[:2]
    per = F.cross_entropy(out.reshape(k * B, -1).float(), y.repeat(k), reduction="none")
    return per.view(k, B).mean(1)


class _Fold:
    """State of one folded call: k, the masks per parameter name, whether the latest k-batched
    layer returned a folded tensor; ``params`` replaces the module's own parameters (e.g.
    detached copies), ``stats`` collects the BatchNorm running-statistics updates of the masks
    ({module: [sum of updated running means, sum of updated running variances, count]}) or is
    None (running statistics left alone)."""

    def __init__(self, masks: Mapping[str, torch.Tensor], hook: WeightHook,
                 params: Mapping[str, torch.Tensor] | None = None, stats: dict | None = None,
                 routes: Routes = NONE, bn_act: Callable[..., torch.Tensor] | None = None
                 ) -> None:
        self.hook = hook
        self.params = params
        self.stats = stats
        self.routes = routes
        self.bn_act = bn_act or route_ops.batch_norm_act  # the fused route's tail
        self.used: set[str] = set()
        self.start(next(iter(masks.values())).shape[0], masks)

    def start(self, k: int, masks: Mapping[str, torch.Tensor]) -> None:
        """Begin one folded call of the module with these k masks."""
        self.k = k
        self.masks = masks
        self.folded_out = False

    def value(self, module: nn.Module, prefix: str, attr: str, channels_last: bool = False
              ) -> tuple[torch.Tensor | None, bool]:
        """The parameter ``attr`` of ``module``: (k, *shape) masked values and True when a mask
        applies to it, else (the shared parameter or None, False). ``channels_last``: a 4-d
        kernel's plain product w * z is written in channels-last order of the stacked kernel
        (k out, in, kh, kw) (the same values; with autograd or a weight hook: the hook's result,
        laid out by the caller)."""
        p = getattr(module, attr)
        name = f"{prefix}{attr}"
        if p is not None and self.params is not None:
            p = self.params[name]
        if p is None or name not in self.masks:
            return p, False
        self.used.add(name)
        z = self.masks[name]
        if (channels_last and p.dim() == 4 and self.hook is plain_weight
                and not (torch.is_grad_enabled() and (p.requires_grad or z.requires_grad))):
            out = torch.empty((z.shape[0] * p.shape[0], *p.shape[1:]), device=p.device,
                              dtype=torch.result_type(p, z), memory_format=torch.channels_last)
            return torch.mul(p, z, out=out.view(z.shape)), True
        return self.hook(name, p, z), True

    def channels(self, x: torch.Tensor, expected: int, what: str) -> bool:
        """True if x (B, C, ...) is folded (C = k * expected), False if shared (C = expected)."""
        c = x.shape[1] if x.dim() > 1 else -1
        if c == expected:
            return False
        if c == self.k * expected:
            return True
        raise PBInputError(
            f"{what} expects {expected} channels (or {self.k} x {expected} folded), got input "
            f"shape {tuple(x.shape)}; forward_masked supports channel-wise networks only"
        )


def _repeat(x: torch.Tensor, k: int, channels_last: bool = False) -> torch.Tensor:
    """A shared tensor (B, C, ...) in the folded layout (B, k * C, ...) (no copy for k = 1);
    ``channels_last``: a 4-d result in channels-last memory format."""
    if k == 1:
        return x
    out = x.repeat(1, k, *([1] * (x.dim() - 2)))
    return out.contiguous(memory_format=torch.channels_last) if channels_last and out.dim() == 4 \
        else out


def _conv(state: _Fold, m: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    if m.padding_mode != "zeros":
        raise PBInputError(f"{prefix or 'conv'}: padding_mode={m.padding_mode!r} is not supported "
                           "by forward_masked; use padding_mode='zeros'")
    k, g = state.k, m.groups
    fn = _CONV_FN[m.weight.dim() - 2]
    cl = state.routes.channels_last and x.dim() == 4
    w, w_masked = state.value(m, prefix, "weight", channels_last=cl)
    b, b_masked = state.value(m, prefix, "bias")
    folded = state.channels(x, m.in_channels, f"{prefix}weight")
    state.folded_out = True
    if not folded and not (w_masked or b_masked):
        return _repeat(fn(x, w, b, m.stride, m.padding, m.dilation, g), k, cl)
    if not w_masked:
        w = w.unsqueeze(0).expand(k, *w.shape)
    if b is not None and not b_masked:
        b = b.unsqueeze(0).expand(k, *b.shape)
    w = w.reshape(k * w.shape[1], *w.shape[2:])
    if cl:  # a no-op for the channels-last product of state.value
        w = w.contiguous(memory_format=torch.channels_last)
    b = None if b is None else b.reshape(-1)
    if not folded:
        if g == 1:  # the shared input through the stacked kernel: out channel block j = mask j
            return fn(x, w, b, m.stride, m.padding, m.dilation, 1)
        x = _repeat(x, k, cl)
    if (state.routes.shortcut_einsum and g == 1 and x.dim() == 4 and w.shape[2:] == (1, 1)
            and tuple(m.padding) == (0, 0) and tuple(m.dilation) == (1, 1)):
        return route_ops.conv1x1_folded(x, w, b, m.stride, k)
    return fn(x, w, b, m.stride, m.padding, m.dilation, k * g)


def _linear(state: _Fold, m: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2:
        raise PBInputError(f"{prefix}weight: forward_masked takes Linear inputs of shape "
                           f"(B, features), got {tuple(x.shape)}")
    k, B = state.k, x.shape[0]
    w, w_masked = state.value(m, prefix, "weight")
    b, b_masked = state.value(m, prefix, "bias")
    folded = state.channels(x, m.in_features, f"{prefix}weight")
    state.folded_out = True
    if not folded and not (w_masked or b_masked):
        return _repeat(F.linear(x, w, b), k)
    out_f = m.out_features
    if b is not None:
        b = b.reshape(k * out_f) if b_masked else b.repeat(k)
    if not folded:  # shared input: one matrix product with the stacked weight
        w2 = w.reshape(k * out_f, -1) if w_masked else w.repeat(k, 1)
        return F.linear(x, w2, b)
    if not w_masked:  # one weight for every mask: (B, k, in) @ (in, out)
        h = F.linear(x.view(B, k, -1), w).reshape(B, k * out_f)
        return h if b is None else h + b
    h = torch.bmm(x.view(B, k, -1).transpose(0, 1), w.transpose(1, 2))  # (k, B, out)
    h = h.transpose(0, 1).reshape(B, k * out_f)
    return h if b is None else h + b


def _batch_norm(state: _Fold, m: nn.Module, prefix: str, x: torch.Tensor,
                residual: torch.Tensor | None = None, relu: bool = False,
                fused: bool = False) -> torch.Tensor:
    """The k-batched BatchNorm; ``fused`` (the fused route,
    :func:`pbscale.forward.route_ops.bn_act`): followed by ``+ residual`` and ReLU, in one function
    where the input is folded."""
    k = state.k
    w, w_masked = state.value(m, prefix, "weight")
    b, b_masked = state.value(m, prefix, "bias")
    folded = state.channels(x, m.num_features, f"{prefix}BatchNorm")
    use_batch = m.training or m.running_mean is None
    update = state.stats is not None and m.training and m.running_mean is not None
    rm = rv = None
    momentum = 0.0
    if not use_batch:
        rm, rv = m.running_mean, m.running_var
    elif update:  # nn.BatchNorm's factor: momentum, or the cumulative 1 / (batches seen + 1)
        momentum = (m.momentum if m.momentum is not None
                    else 1.0 / (float(m.num_batches_tracked) + 1.0))
    state.folded_out = True
    if not folded and not (w_masked or b_masked):
        if update:  # one computation stands for all k masks: k equal updates
            rm, rv = m.running_mean.clone(), m.running_var.clone()
        out = F.batch_norm(x, rm, rv, w, b, use_batch, momentum, m.eps)
        if update:
            _collect(state, m, rm.unsqueeze(0), rv.unsqueeze(0), k)
        out = _repeat(out, k, state.routes.channels_last)
        if residual is not None:  # the shared case: the tail op by op
            out = out + residual
        return torch.relu(out) if relu else out
    if not folded:
        x = _repeat(x, k)
    if w is not None:
        w = w.reshape(-1) if w_masked else w.repeat(k)
    if b is not None:
        b = b.reshape(-1) if b_masked else b.repeat(k)
    if rm is not None or update:  # eval: the running statistics; update: copies per mask
        rm, rv = m.running_mean.repeat(k), m.running_var.repeat(k)
    if fused:
        out = state.bn_act(x, rm, rv, w, b, use_batch, momentum, m.eps, residual, relu)
    else:
        out = F.batch_norm(x, rm, rv, w, b, use_batch, momentum, m.eps)
    if update:
        _collect(state, m, rm.view(k, -1), rv.view(k, -1), 1)
    return out


def _collect(state: _Fold, m: nn.Module, rm: torch.Tensor, rv: torch.Tensor, weight: int
             ) -> None:
    """Add the per-mask updated running statistics rm, rv (j, C), each standing for ``weight``
    masks, to the call's sums (:func:`_apply_stats` writes their mean back)."""
    acc = state.stats.setdefault(m, [0.0, 0.0, 0])
    acc[0] = acc[0] + weight * rm.sum(0)
    acc[1] = acc[1] + weight * rv.sum(0)
    acc[2] += weight * rm.shape[0]


def _apply_stats(stats: dict) -> None:
    """Running statistics := the mean over the k masks of their per-mask updates (the update
    is linear in the batch statistics, so this is the update by their mean); one more batch
    tracked, as one plain forward."""
    with torch.no_grad():
        for m, (rm, rv, count) in stats.items():
            m.running_mean.copy_(rm / count)
            m.running_var.copy_(rv / count)
            if m.num_batches_tracked is not None:
                m.num_batches_tracked.add_(1)


@contextlib.contextmanager
def _folded(module: nn.Module, state: _Fold) -> Iterator[None]:
    """Give every Conv / Linear / BatchNorm of ``module`` its k-batched forward while inside
    (and, with the fused route, every BatchNorm the tail :func:`pbscale.forward.route_ops.bn_act`
    calls)."""
    patched: list[nn.Module] = []
    fused: list[nn.Module] = []
    try:
        for prefix, m in module.named_modules():
            pre = f"{prefix}." if prefix else ""
            if isinstance(m, _CONV):
                fn = _conv
            elif isinstance(m, nn.Linear):
                fn = _linear
            elif isinstance(m, _BN):
                fn = _batch_norm
            else:
                if any(True for _ in m.parameters(recurse=False)):
                    raise PBInputError(
                        f"forward_masked cannot batch layer {prefix!r} ({type(m).__name__}); "
                        "supported layers with parameters: Conv1d/2d/3d, Linear, BatchNorm1d/2d/3d"
                    )
                continue

            def fwd(x, _fn=fn, _m=m, _pre=pre):
                return _fn(state, _m, _pre, x)

            m.forward = fwd
            patched.append(m)
            if fn is _batch_norm and state.routes.fused_bn:
                def tail(x, residual=None, relu=True, _m=m, _pre=pre):
                    return _batch_norm(state, _m, _pre, x, residual, relu, fused=True)

                setattr(m, route_ops.FUSED_ATTR, tail)
                fused.append(m)
        yield
    finally:
        for m in patched:
            del m.forward  # back to the class's forward
        for m in fused:
            delattr(m, route_ops.FUSED_ATTR)


def forward_masked(module: nn.Module, masks: Mapping[str, torch.Tensor], x: torch.Tensor,
                   *, amp: torch.dtype | None = None, channels_last: bool = False,
                   weight_hook: WeightHook = plain_weight,
                   params: Mapping[str, torch.Tensor] | None = None, per_call: int | None = None,
                   update_stats: bool = False, routes: Routes = NONE) -> torch.Tensor:
    """Outputs of ``module`` under k masks at once: masks {parameter name: (k, *param.shape)}
    multiplying the named parameters (weights or biases of Conv / Linear / BatchNorm layers;
    soft values allowed), input x (B, ...) shared by all masks -> (k, B, ...).

    ``weight_hook(name, weight, masks) -> (k, *shape)`` replaces the product w * z, as in
    :class:`pbscale.forward.masks.MaskedModule` (e.g.
    :func:`pbscale.forward.rescale.rescaled_weight`, dynamic weight rescaling). ``params``
    {name: tensor} replaces the module's parameters (all of them, e.g. detached copies for a
    supermask); default: the module's own, live.

    ``per_call``: masks per folded call of the module (default: all k in one call; 1: a loop over
    the masks, each a plain-sized forward, the fastest on a CPU core).

    ``amp``: run under ``torch.autocast`` with this dtype (e.g. ``torch.bfloat16``);
    ``channels_last``: 4-d activations in channels-last memory format. BatchNorm uses batch
    statistics per mask in training mode and the running statistics in eval mode. Running
    statistics: left unchanged by default; with ``update_stats=True`` (training mode) updated
    once, with the mean over the k masks of the update each mask's batch statistics would make
    (and ``num_batches_tracked`` + 1), as :class:`pbscale.forward.masks.MaskedModule` documents.

    ``routes``: the GPU routes to take where they apply (module docstring); none by default.
    The fused BatchNorm tail is compiled on a CUDA device where Triton is available
    (:func:`pbscale.forward.route_ops.batch_norm_act_fn`), eager elsewhere.
    """
    if not masks:
        raise PBInputError("forward_masked needs at least one mask; pass {name: (k, *shape)}")
    named = dict(module.named_parameters())
    k = None
    for name, m in masks.items():
        if name not in named:
            raise PBInputError(f"cannot mask {name!r}: the module has no such parameter; "
                               f"choose from {', '.join(named) or '(none)'}")
        shape = tuple(named[name].shape)
        if m.dim() != len(shape) + 1 or tuple(m.shape[1:]) != shape:
            dims = ", ".join(map(str, shape))
            raise PBInputError(f"mask for {name!r} must have shape (k, {dims}), "
                               f"got {tuple(m.shape)}")
        if k is None:
            k = m.shape[0]
        elif m.shape[0] != k:
            raise PBInputError(f"every mask needs the same k; {name!r} has {m.shape[0]}, not {k}")
    if k < 1:
        raise PBInputError("forward_masked needs k >= 1 masks")
    if per_call is not None and per_call < 1:
        raise PBInputError(f"per_call must be a positive number of masks, got {per_call}")
    if params is not None and set(params) != set(named):
        raise PBInputError("params must name every parameter of the module (and only those)")
    g = k if per_call is None else min(int(per_call), k)
    stats: dict | None = {} if update_stats else None
    state = _Fold(masks, weight_hook, params, stats, routes,
                  route_ops.batch_norm_act_fn(x.device) if routes.fused_bn else None)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    amp_ctx = (torch.autocast(x.device.type, dtype=amp) if amp is not None
               else contextlib.nullcontext())
    outs = []
    with _folded(module, state), amp_ctx:
        for s in range(0, k, g):
            part = masks if g == k else {n: m[s : s + g] for n, m in masks.items()}
            state.start(min(g, k - s), part)
            outs.append(_unfold(module(x), state))
    unused = set(masks) - state.used
    if unused:
        raise PBInputError(f"mask for {sorted(unused)[0]!r} was never applied: forward_masked "
                           "masks weights and biases of Conv, Linear and BatchNorm layers only")
    if stats:
        _apply_stats(stats)
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _unfold(out: torch.Tensor, state: _Fold) -> torch.Tensor:
    """One folded call's output (B, k * C, ...) (or a shared (B, C, ...)) -> (k, B, C, ...)."""
    k, B = state.k, out.shape[0]
    if not state.folded_out or k == 1:
        return out.unsqueeze(0).expand(k, *out.shape)
    return out.reshape(B, k, out.shape[1] // k, *out.shape[2:]).transpose(0, 1)


#: Parameter-free layers that act on each channel separately (the folded layout passes through).
_CHANNELWISE = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.GELU, nn.SiLU,
    nn.Softplus, nn.Hardtanh, nn.Mish, nn.Identity,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
)


def foldable(module: nn.Module) -> bool:
    """Whether :func:`forward_masked` computes ``module`` under k masks exactly (what
    :class:`pbscale.forward.masks.MaskedModule` checks before using it instead of vmap).

    True when every submodule is a Conv1d/2d/3d (zero padding), Linear or BatchNorm1d/2d/3d, a
    channel-wise parameter-free layer (elementwise activations, pooling, dropout, identity,
    ``Flatten`` from dimension 1), an ``nn.Sequential`` (or a subclass keeping its forward), or
    a module whose class sets ``channelwise_forward = True``: its own ``forward`` only chains
    its submodules with channel-wise operations (elementwise functions, pooling, residual
    additions of activations, flattening from dimension 1); and no parameter is shared between
    layers. Anything else (e.g. LayerNorm, attention, ``torch.cat`` of channels, a custom
    forward not vouched for) is left to vmap."""
    if len(list(module.named_parameters(remove_duplicate=False))) != len(
            list(module.named_parameters())):
        return False  # tied parameters: a mask on one name must reach every use
    for m in module.modules():
        t = type(m)
        if t in _CONV:
            if m.padding_mode != "zeros":
                return False
        elif t in (nn.Linear, *_BN) or t in _CHANNELWISE:
            continue
        elif t is nn.Flatten:
            if m.start_dim != 1 or m.end_dim != -1:
                return False
        elif isinstance(m, nn.Sequential) and t.forward is nn.Sequential.forward:
            continue
        else:  # the class that defines this forward must vouch for it
            owner = next(c for c in t.__mro__ if "forward" in vars(c))
            if not vars(owner).get("channelwise_forward", False):
                return False
    return True

