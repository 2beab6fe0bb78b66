"""Binary masks on the weights of any torch network, evaluated for many masks at once.

A :class:`MaskedModule` wraps an ``nn.Module`` and a list of its weight tensors; a mask is a flat
vector z of shape (d,), d = total number of masked weights, laid out tensor after tensor in the
order given (row-major within a tensor). :meth:`MaskedModule.forward` runs a batch of k masks
(k, d) through the network (memory O(k d) plus activations), which is how the n samples of one
step are evaluated in chunks (`alg:iter_loorf`, `alg:iter_arms`). Masks may be soft (values in
[0, 1]) so that CP and the hybrid estimators can differentiate through them. Backends: for the
networks :func:`pbscale.batched.foldable` accepts (Conv / Linear / BatchNorm layers joined by
channel-wise operations: every model of :mod:`pbscale.models`),
:func:`pbscale.batched.forward_masked`, with all k masks as one network of grouped convolutions
("folded": on a GPU, and for networks without convolutions) or one mask at a time ("loop": conv
nets on a CPU, where grouped convolutions cost more per mask than a plain one); for any other
network ``torch.func.vmap`` over ``functional_call`` (:meth:`MaskedModule.forward_vmap`). All
three compute the same function, gradients and running-statistics update (tested).

When the module is a plain ``nn.Sequential`` of Linear layers (only their weights masked),
BatchNorm1d layers that always use batch statistics, and elementwise activations, and the input
is (B, features), :meth:`MaskedModule.forward` takes a fast path that computes the same function
(to float rounding) with batched matrix products over the k masks and BatchNorm statistics per
mask, in place on cached buffers when nothing needs gradients; any other module goes through the
backends above. The forward also takes a leading group dimension, masks (G, k, d) and inputs
(G, B, ...), group g's masks on group g's inputs (G runs stepped together,
:mod:`pbscale.batched_seeds`): one pass of the fast path over the G k masks, group by group
elsewhere.

Trainable networks: with ``train_weights=True`` (joint pruning) the network's parameters are
used as they are, so the outputs are differentiable in the weights and a loss's ``backward``
fills their ``.grad`` next to the mask logits' (the surrogate losses of :mod:`pbscale.methods`);
with ``train_weights=False`` (supermask, the default) every parameter is a detached constant.
A mask-to-weight hook ``weight_hook(name, weight, mask) -> masked weight`` (mask of shape
(k, *weight.shape)) replaces the plain product w * z; :func:`rescaled_weight` is dynamic weight
rescaling. BatchNorm with running statistics in training mode: each of the k masks normalizes
with its own batch statistics, and the running statistics are updated once per forward call
with the mean over the k masks of their batch statistics (the update is linear, so this is the
mean of k per-mask updates); in eval mode all k masks use the running statistics. Dropout draws
independent units per mask (``vmap(..., randomness="different")``, or per mask's channels in the
folded layout, or per loop iteration; torch's global generator, which :mod:`pbscale.loop` seeds
and checkpoints; the draws differ between backends).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from pbexact.errors import PBInputError

#: Loss of the network output against targets per mask: (k, B, ...) outputs -> (k,) losses.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


#: A mask-to-weight hook: (parameter name, weight (*shape), masks (k, *shape)) -> (k, *shape).
WeightHook = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]

#: How :meth:`MaskedModule.forward` runs k masks of a network off the MLP fast path.
BACKENDS = ("auto", "folded", "loop", "vmap")

#: Elementwise activations the fast path applies as they are (any tensor layout is fine).
_ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.GELU, nn.SiLU,
                nn.Softplus, nn.Identity)


def mean_absolute_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """MAE per mask: outputs (k, B, 1) against targets (B, 1) -> (k,)."""
    return (out - y).abs().flatten(1).mean(1)


def rescaled_weight(name: str, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Dynamic weight rescaling, a mask-to-weight hook: w * z / mean(z) per mask and layer, the
    mean taken over this tensor's mask and treated as a constant in the backward pass (detached);
    an all-zero mask keeps scale 1 (its masked weights are all zero anyway).
    weight (*shape), mask (k, *shape) -> (k, *shape)."""
    dims = tuple(range(1, mask.dim()))
    mean = mask.detach().mean(dim=dims, keepdim=True)
    scale = torch.where(mean > 0, mean, torch.ones_like(mean))
    return weight * mask / scale


def plain_weight(name: str, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The default mask-to-weight map w * z: weight (*shape), mask (k, *shape) -> (k, *shape)."""
    return weight * mask


class MaskedModule:
    """Masks over chosen weight tensors of ``module``.

    ``names`` are parameter names as in ``module.named_parameters()``; by default every
    parameter whose name ends in ``weight`` and has at least two dimensions (the Linear and
    convolution weights). With ``train_weights=False`` (supermask, `sec:app_maskednnregression`)
    every parameter is detached and only the mask is optimized; with ``train_weights=True``
    (joint) the outputs carry the weights' autograd graph. ``weight_hook`` maps (name, w, z) to
    the masked weight (default w * z; :func:`rescaled_weight` for dynamic weight rescaling).

    ``backend`` (how :meth:`forward` runs k masks when the MLP fast path does not apply):
    ``"auto"`` (default) picks, per call, by the input's device: for a network
    :func:`pbscale.batched.foldable` accepts (every model of :mod:`pbscale.models`),
    ``"folded"`` on a GPU (:func:`pbscale.batched.forward_masked`, k masks as one network of
    grouped convolutions and batched products) and for networks without convolutions, and
    ``"loop"`` for conv nets on a CPU (the same code one mask at a time: grouped convolutions
    cost 1.2-1.6 dense forwards per mask on a CPU core, a loop about 1,
    `benchmarks/bench_prune.py`); ``"vmap"`` for any other network. ``amp`` (e.g.
    ``torch.bfloat16``, autocast) and ``channels_last`` apply to the folded and loop backends.
    """

    def __init__(self, module: nn.Module, names: Sequence[str] | None = None,
                 train_weights: bool = False, weight_hook: WeightHook | None = None,
                 backend: str = "auto", amp: torch.dtype | None = None,
                 channels_last: bool = False) -> None:
        params = dict(module.named_parameters())
        if names is None:
            names = [k for k, p in params.items() if k.endswith("weight") and p.dim() >= 2]
        names = list(names)
        if not names:
            raise PBInputError("no weight tensors to mask; pass names= with parameter names")
        missing = [k for k in names if k not in params]
        if missing:
            raise PBInputError(
                f"cannot mask {missing[0]!r}: the module has no such parameter; "
                f"choose from {', '.join(params) or '(none)'}"
            )
        if len(set(names)) != len(names):
            raise PBInputError("a weight tensor is listed twice in names; list each once")
        if len(list(module.named_parameters(remove_duplicate=False))) != len(params):
            raise PBInputError("the network uses one parameter in two places (a reused layer or "
                               "tied weights), which masking does not support; give each "
                               "place its own layer")
        self.module = module
        self.names = names
        self.train_weights = bool(train_weights)
        self.weight_hook = weight_hook
        self.base = self._params()
        self.buffers = {k: b for k, b in module.named_buffers()}
        self.shapes = [tuple(self.base[k].shape) for k in names]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.d = sum(self.sizes)
        self._init_backend(backend, amp, channels_last)
        self._plan = self._fast_plan()
        self._flat_cache: tuple | None = None
        self._scratch: dict = {}

    def _init_backend(self, backend: str, amp: torch.dtype | None, channels_last: bool) -> None:
        from pbscale.batched import foldable  # batched builds on this module

        if backend not in BACKENDS:
            raise PBInputError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.foldable = foldable(self.module)
        if backend in ("folded", "loop") and not self.foldable:
            raise PBInputError(f"backend {backend!r} cannot run this network (a layer or forward "
                               "pbscale.batched.foldable does not accept); use backend='vmap'")
        if (amp is not None or channels_last) and not self.foldable:
            raise PBInputError("amp and channels_last need the folded or loop backend, which "
                               "cannot run this network; leave them unset")
        self.backend, self.amp, self.channels_last = backend, amp, bool(channels_last)
        self._has_conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in self.module.modules())

    def backend_for(self, device: torch.device | str) -> str:
        """The backend :meth:`forward` uses on ``device`` (for networks off the MLP fast path):
        the requested one, or for ``"auto"``: "folded" on cuda and for networks without
        convolutions, "loop" for conv nets elsewhere, "vmap" for a network
        :func:`pbscale.batched.foldable` rejects."""
        if self.backend != "auto":
            return self.backend
        if not self.foldable:
            return "vmap"
        if torch.device(device).type == "cuda" or not self._has_conv:
            return "folded"
        return "loop"

    def path_for(self, device: torch.device | str) -> str:
        """How :meth:`forward` runs masks (k, d) on (B, features) inputs on ``device``: "mlp_fast"
        for a network the MLP fast path takes, else :meth:`backend_for`."""
        return "mlp_fast" if self._plan is not None else self.backend_for(device)

    @property
    def device(self) -> torch.device:
        return self.base[self.names[0]].device

    @property
    def dtype(self) -> torch.dtype:
        return self.base[self.names[0]].dtype

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """Move (and cast) the module and the cached weights; returns self."""
        self.module.to(device=device, dtype=dtype)
        self.base = self._params()
        self.buffers = {k: b for k, b in self.module.named_buffers()}
        self._plan = self._fast_plan()
        self._flat_cache = None
        self._scratch = {}
        return self

    def _params(self) -> dict[str, torch.Tensor]:
        """The parameters as the forward uses them: detached unless the weights train."""
        params = dict(self.module.named_parameters())
        if self.train_weights:
            return params
        return {k: p.detach() for k, p in params.items()}

    def _needs_graph(self) -> bool:
        """Whether the forward must record autograd for the weights."""
        return (self.train_weights and torch.is_grad_enabled()
                and any(self.base[k].requires_grad for k in self.base))

    def _bn_batched(self) -> bool:
        """Whether a BatchNorm with running statistics is in training mode (per-mask copies)."""
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
                   and m.running_mean is not None for m in self.module.modules())

    def _fast_plan(self) -> list[tuple] | None:
        """The layers of a Sequential the fast path can run, or None (then vmap is used).

        Each entry: ("linear", offset into z or None, weight name, bias name or None),
        ("bn", module) or ("act", module)."""
        if self.backend != "auto" or self.amp is not None:
            return None  # a backend asked for by name, or autocast: not this path
        seq = self.module
        # a Sequential subclass that keeps Sequential's forward (LeNet300100) qualifies; a layer
        # reused twice (named_children lists it once) does not
        if (not isinstance(seq, nn.Sequential) or type(seq).forward is not nn.Sequential.forward
                or len(list(seq.named_children())) != len(seq)):
            return None
        offsets, pos = {}, 0
        for k, size in zip(self.names, self.sizes):
            offsets[k] = pos
            pos += size
        plan: list[tuple] = []
        covered = set()
        for name, m in self.module.named_children():
            if type(m) is nn.Linear:
                w = f"{name}.weight"
                b = f"{name}.bias" if m.bias is not None else None
                if w not in self.base or (b is not None and (b in offsets or b not in self.base)):
                    return None  # tied (shared) parameters or a masked bias: generic path
                plan.append(("linear", offsets.get(w), w, b))
                covered.add(w)
            elif type(m) is nn.BatchNorm1d:
                if m.running_mean is not None or any(f"{name}.{p}" in offsets
                                                     for p in ("weight", "bias")):
                    return None  # running statistics (or masked BN parameters): generic path
                plan.append(("bn", m))
            elif type(m) in _ELEMENTWISE:
                plan.append(("act", m))
            else:
                return None
        if set(self.names) - covered or not plan or plan[0][0] != "linear":
            return None
        return plan

    def _workspace(self, name: str, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """A cached scratch tensor (reused across calls: a fresh large buffer costs page faults
        on every call); only for intermediates that never leave :meth:`_forward_fast_inplace`."""
        key = (name, tuple(shape), like.dtype, like.device)
        buf = self._scratch.get(key)
        if buf is None:
            self._scratch = {k: v for k, v in self._scratch.items() if k[0] != name}
            buf = self._scratch[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
        return buf

    def _flat_base(self) -> torch.Tensor:
        """The masked weights flattened and concatenated in mask order, shape (d,) (cached)."""
        if self._needs_graph():  # a fresh graph every call
            return torch.cat([self.base[k].reshape(-1) for k in self.names])
        ids = tuple((self.base[k].data_ptr(), self.base[k]._version) for k in self.names)
        if self._flat_cache is None or self._flat_cache[0] != ids:
            flat = torch.cat([self.base[k].reshape(-1) for k in self.names])
            self._flat_cache = (ids, flat)
        return self._flat_cache[1]

    def split(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flat masks (..., d) -> {name: mask of shape (..., *weight.shape)}."""
        lead = z.shape[:-1]
        parts = torch.split(z, self.sizes, dim=-1)
        return {k: p.reshape(*lead, *s) for k, p, s in zip(self.names, parts, self.shapes)}

    def masked_weights(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """{name: masked weight (k, *shape)} for masks z (k, d), through the weight hook."""
        hook = self.weight_hook or plain_weight
        return {k: hook(k, self.base[k], m) for k, m in self.split(z).items()}

    def _single(self, weights: dict[str, torch.Tensor], x: torch.Tensor,
                buffers: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        params = {**self.base, **weights}
        return functional_call(self.module, {**params, **(buffers or self.buffers)}, (x,))

    def forward(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Outputs of the network under each of k masks: z (k, d), x (B, ...) -> (k, B, ...).

        With a leading group dimension, z (G, k, d) and x (G, B, ...) -> (G, k, B, ...): group
        g's k masks see group g's inputs only (G runs stepped together,
        :mod:`pbscale.batched_seeds`). The MLP fast path runs all G k masks in one pass; other
        modules (and the fast path with autograd) run group by group."""
        grouped = z.dim() == 3
        if z.dim() not in (2, 3) or z.shape[-1] != self.d:
            raise PBInputError(f"masks must have shape (k, {self.d}) or (G, k, {self.d}), "
                               f"got {tuple(z.shape)}")
        if grouped and (x.dim() < 2 or x.shape[0] != z.shape[0]):
            raise PBInputError(f"grouped masks (G, k, d) need inputs (G, B, ...) with the same G;"
                               f" got masks {tuple(z.shape)} and inputs {tuple(x.shape)}")
        if (self._plan is not None and x.dim() == 2 + grouped and x.shape[-2] > 1
                and z.shape[-2] > 0 and z.dtype == self.dtype and x.dtype == self.dtype):
            if not grouped or not self._wants_graph(z, x):
                return self._forward_fast(z, x)
        if grouped:
            return torch.stack([self.forward(zg, xg) for zg, xg in zip(z, x)])
        return self._forward_generic(z, x)

    def _forward_generic(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` off the MLP fast path: the backend of :meth:`backend_for`."""
        backend = self.backend_for(x.device)
        if backend == "vmap" or z.shape[0] == 0:
            return self.forward_vmap(z, x)
        return self.forward_folded(z, x, group=1 if backend == "loop" else None)

    def forward_folded(self, z: torch.Tensor, x: torch.Tensor, group: int | None = None
                       ) -> torch.Tensor:
        """:meth:`forward` by :func:`pbscale.batched.forward_masked` (``group`` masks per
        folded call; 1: a loop over the masks), with the same running-statistics rule as the
        vmap path; for networks :func:`pbscale.batched.foldable` accepts."""
        from pbscale.batched import forward_masked

        if z.dim() != 2 or z.shape[-1] != self.d:
            raise PBInputError(f"masks must have shape (k, {self.d}), got {tuple(z.shape)}")
        return forward_masked(self.module, self.split(z), x, amp=self.amp,
                              channels_last=self.channels_last,
                              weight_hook=self.weight_hook or plain_weight, params=self.base,
                              group=group, update_stats=True)

    def _wants_graph(self, z: torch.Tensor, x: torch.Tensor) -> bool:
        """Whether the fast path must record autograd (then it runs out of place)."""
        return (torch.is_grad_enabled() and (z.requires_grad or x.requires_grad)
                or self._needs_graph())

    def forward_vmap(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` by ``vmap`` over ``functional_call``: works for any module."""
        if z.dim() != 2 or z.shape[-1] != self.d:
            raise PBInputError(f"masks must have shape (k, {self.d}), got {tuple(z.shape)}")
        weights = self.masked_weights(z)
        if not self._bn_batched():
            return vmap(self._single, in_dims=(0, None), randomness="different")(weights, x)
        # per-mask copies of the buffers, updated in place by BatchNorm, then averaged back
        k = z.shape[0]
        copies = {n: b.expand(k, *b.shape).clone() for n, b in self.buffers.items()}
        out = vmap(self._single, in_dims=(0, None, 0), randomness="different")(weights, x, copies)
        with torch.no_grad():
            for n, b in self.buffers.items():
                if b.is_floating_point():
                    b.copy_(copies[n].mean(0))
                else:
                    b.copy_(copies[n][0])  # num_batches_tracked: one step for all k masks
        return out

    def _forward_fast(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` for a Sequential of Linear / BatchNorm1d / activations (see _fast_plan).

        Without autograd: :meth:`_forward_fast_inplace`. With it (soft masks that require grad),
        out of place: a Linear is one batched product over the k masks, giving (k, B, out), and
        ``F.batch_norm`` runs on the activations laid out as (B, k * features), whose columns it
        normalizes over the B points, i.e. with each mask's own batch statistics."""
        if not self._wants_graph(z, x):
            return self._forward_fast_inplace(z, x)
        k, B = z.shape[0], x.shape[0]
        w_all = self._hooked(z) if self.weight_hook is not None else z * self._flat_base()
        h = None
        kfirst = False  # h is (k, B, features) if kfirst else (B, k, features)
        for step in self._plan:
            kind = step[0]
            if kind == "linear":
                bname = step[3]
                w = self._linear_weight(step, w_all, k)
                out_f, in_f = w.shape[1:]
                if h is None:  # the input is shared by every mask: one matrix product
                    h = (x @ w.reshape(k * out_f, in_f).t()).view(B, k, out_f)
                    kfirst = False
                else:
                    h = torch.bmm(h if kfirst else h.transpose(0, 1), w.transpose(1, 2))
                    kfirst = True
                if bname is not None:
                    h = h + self.base[bname]
            elif kind == "bn":
                m = step[1]
                C = h.shape[2]
                if kfirst:
                    h = h.transpose(0, 1).contiguous()
                    kfirst = False
                weight = bias = None
                if m.affine:
                    mw, mb = ((m.weight, m.bias) if self.train_weights
                              else (m.weight.detach(), m.bias.detach()))
                    weight, bias = mw.repeat(k), mb.repeat(k)
                h = F.batch_norm(h.reshape(B, k * C), None, None, weight, bias, True, 0.0,
                                 m.eps).view(B, k, C)
            else:
                h = step[1](h)
        return h if kfirst else h.transpose(0, 1)

    def _hooked(self, z: torch.Tensor) -> torch.Tensor:
        """The hooked masked weights flattened in mask order, (k, d)."""
        return torch.cat([w.reshape(z.shape[0], -1) for w in self.masked_weights(z).values()],
                         dim=1)

    def _linear_weight(self, step: tuple, w_all: torch.Tensor, k: int) -> torch.Tensor:
        """The (k, out, in) weights of a ``linear`` plan step: its slice of the masked flat
        weights ``w_all`` (k, d), or the unmasked base weight shared by all k masks."""
        _, off, wname, _ = step
        base = self.base[wname]
        out_f, in_f = base.shape
        if off is None:
            return base.expand(k, out_f, in_f)
        return w_all[:, off : off + out_f * in_f].view(k, out_f, in_f)

    def _forward_fast_inplace(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """:meth:`_forward_fast` without autograd: activations laid out as (k, features, B), so a
        Linear is W (k, out, in) @ h and BatchNorm1d reduces over the contiguous last dimension
        (two-pass mean and biased variance, as ``F.batch_norm``), all in place. With a group
        dimension (z (G, k, d), x (G, B, in)) the G k masks are one stack of G k rows
        (activations (G k, features, B)); only the first Linear, whose input differs per group,
        is a product batched over G."""
        lead = z.shape[:-2]  # () or (G,)
        G = z.shape[0] if lead else 1
        k, B = G * z.shape[-2], x.shape[-2]
        if self.weight_hook is not None:
            w_all = self._hooked(z.reshape(k, self.d))
        else:
            w_all = torch.mul(z, self._flat_base(),
                              out=self._workspace("w", z.shape, z)).view(k, self.d)
        h = None  # (k, features, B)
        n_linear = sum(step[0] == "linear" for step in self._plan)
        seen = 0
        for step in self._plan:
            kind = step[0]
            if kind == "linear":
                bname = step[3]
                w = self._linear_weight(step, w_all, k)
                out_f, in_f = w.shape[1:]
                seen += 1
                # activations ping-pong between two cached buffers; the output is a fresh tensor
                out = (None if seen == n_linear
                       else self._workspace(f"h{seen % 2}", (k, out_f, B), x))
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
                    h.add_(self.base[bname][:, None])
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
        if any(ptr == b.untyped_storage().data_ptr() for b in self._scratch.values()):
            h = h.clone()  # the Sequential ends after its last Linear: never return scratch
        return h.transpose(1, 2).reshape(*lead, k // G, B, h.shape[1])

    def forward_one(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Output under one mask z (d,) without vmap (the per-sample loop of the benchmark)."""
        return self._single({k: w[0] for k, w in self.masked_weights(z[None]).items()}, x)

    def loss_fn(self, x: torch.Tensor, y: torch.Tensor, loss: LossFn = mean_absolute_error):
        """J(z) on the batch (x, y) as a batched function f(z (k, d)) -> (k,), differentiable in
        z (what the MC estimators evaluate and the hybrid estimators differentiate)."""

        def f(z: torch.Tensor) -> torch.Tensor:
            lead = z.shape[:-1]
            out = self.forward(z.reshape(-1, self.d), x)
            return loss(out, y).reshape(lead)

        return f
