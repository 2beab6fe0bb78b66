"""Binary masks on the weights of any torch network, evaluated for many masks at once.

A :class:`MaskedModule` wraps an ``nn.Module`` and a list of its weight tensors; a mask is a flat
vector z of shape (d,), d = total number of masked weights, laid out tensor after tensor in the
order given (row-major within a tensor). :meth:`MaskedModule.forward` runs a batch of k masks
(k, d) through the network (memory O(k d) plus activations), which is how the n samples of one
step are evaluated in chunks (`alg:iter_loorf`, `alg:iter_arms`). Masks may be soft (values in
[0, 1]) so that CP and the hybrid estimators can differentiate through them. How the k masks
are evaluated is chosen per call by :class:`pbscale.forward.backends.BackendChoice` among the
backends of :mod:`pbscale.forward.backends` (the MLP paths in place and with autograd, folded, loop,
vmap), which compute the same function, gradients and running-statistics update (tested). The
forward also takes a leading group dimension, masks (G, k, d) and inputs (G, B, ...), group g's
masks on group g's inputs (G runs stepped together, :mod:`pbscale.regression.group`).

Trainable networks: with ``train_weights=True`` (joint pruning) the network's parameters are
used as they are, so the outputs are differentiable in the weights and a loss's ``backward``
fills their ``.grad`` next to the mask logits' (the surrogate losses of :mod:`pbscale.methods`);
with ``train_weights=False`` (supermask, the default) every parameter is a detached constant.
A mask-to-weight hook ``weight_hook(name, weight, mask) -> masked weight`` (mask of shape
(k, *weight.shape)) replaces the plain product w * z;
:func:`pbscale.forward.rescale.rescaled_weight` is dynamic weight rescaling. BatchNorm
statistics and Dropout draws: as each backend's contract in
:mod:`pbscale.forward.backends` states (per-mask batch statistics in training mode, one
running-statistics update per call with the mean of the k masks' updates; Dropout from torch's
global generator, which :mod:`pbscale.runs.loop` seeds and checkpoints, drawn differently by each
backend).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale.forward.backends import Backend, BackendChoice, Folded
from pbscale.forward.folded import WeightHook, plain_weight
from pbscale.forward.routes import Routes

#: Loss of the network output against targets per mask: (k, B, ...) outputs -> (k,) losses.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def mean_absolute_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """MAE per mask: outputs (k, B, 1) against targets (B, 1) -> (k,)."""
    return (out - y).abs().flatten(1).mean(1)


def tied_names(model: nn.Module) -> dict[str, str]:
    """{name: another name of the same ``nn.Parameter``} for every parameter the network holds
    under two or more names (tied weights)."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
            out.setdefault(first[id(p)], name)
        else:
            first[id(p)] = name
    return out


class MaskedModule:
    """Masks over chosen weight tensors of ``module``.

    ``names`` are parameter names as in ``module.named_parameters()``; by default every
    parameter whose name ends in ``weight`` and has at least two dimensions (the Linear and
    convolution weights). With ``train_weights=False`` (supermask, `sec:app_maskednnregression`)
    every parameter is detached and only the mask is optimized; with ``train_weights=True``
    (joint) the outputs carry the weights' autograd graph. ``weight_hook`` maps (name, w, z) to
    the masked weight (default w * z; :func:`pbscale.forward.rescale.rescaled_weight` for
    dynamic weight rescaling).

    ``backend``: "auto" (default: :class:`pbscale.forward.backends.BackendChoice` picks per call) or
    "folded", "loop", "vmap" for every call. ``amp`` (e.g. ``torch.bfloat16``, autocast) and
    ``channels_last`` apply to the folded and loop backends. ``routes``: the GPU routes asked
    for (:mod:`pbscale.forward.routes`: "all", names, a ``Routes``; None: the process default,
    ``PBNN_ROUTES``), taken where they apply.
    """

    #: mask entry i is one weight of the tensors in order (a subclass over other variables,
    #: e.g. channels, sets False: the MLP paths are then not taken)
    per_weight = True

    def __init__(self, module: nn.Module, names: Sequence[str] | None = None,
                 train_weights: bool = False, weight_hook: WeightHook | None = None,
                 backend: str = "auto", amp: torch.dtype | None = None,
                 channels_last: bool = False, routes: Routes | str | None = None) -> None:
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
        tied = tied_names(module)
        if any(k in tied for k in names):
            k = next(k for k in names if k in tied)
            raise PBInputError(f"cannot mask {k}: the network uses it in two places ({k} and "
                               f"{tied[k]}: a reused layer or tied weights), which masking "
                               "does not support; leave it unmasked or give each place its own "
                               "layer")
        self.module = module
        self.names = names
        self.train_weights = bool(train_weights)
        self.weight_hook = weight_hook
        self.base = self._params()
        self.buffers = {k: b for k, b in module.named_buffers()}
        self.shapes = [tuple(self.base[k].shape) for k in names]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.d = sum(self.sizes)
        self.amp, self.channels_last = amp, bool(channels_last)
        self.choice = BackendChoice(self, backend, routes)

    def backend_for(self, device: torch.device | str) -> str:
        """The name of the backend :meth:`forward` uses on ``device`` for networks off the MLP
        paths (:meth:`pbscale.forward.backends.BackendChoice.for_device`)."""
        return self.choice.for_device(device).name

    def path_for(self, device: torch.device | str) -> str:
        """How :meth:`forward` runs masks (k, d) on (B, features) inputs on ``device``: "mlp_fast"
        for a network the MLP paths take, else :meth:`backend_for`."""
        return "mlp_fast" if self.choice.plan is not None else self.backend_for(device)

    @property
    def _plan(self) -> list[tuple] | None:
        """The MLP plan (:func:`pbscale.forward.backends.mlp_plan`), None off the MLP paths."""
        return self.choice.plan

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
        self.choice = BackendChoice(self, self.choice.requested, self.choice.routes)
        return self

    def _params(self) -> dict[str, torch.Tensor]:
        """The parameters as the forward uses them: detached unless the weights train."""
        params = dict(self.module.named_parameters())
        if self.train_weights:
            return params
        return {k: p.detach() for k, p in params.items()}

    def split(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flat masks (..., d) -> {name: mask of shape (..., *weight.shape)}."""
        lead = z.shape[:-1]
        parts = torch.split(z, self.sizes, dim=-1)
        return {k: p.reshape(*lead, *s) for k, p, s in zip(self.names, parts, self.shapes)}

    def masked_weights(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """{name: masked weight (k, *shape)} for masks z (k, d), through the weight hook."""
        hook = self.weight_hook or plain_weight
        return {k: hook(k, self.base[k], m) for k, m in self.split(z).items()}

    def backend(self, z: torch.Tensor, x: torch.Tensor) -> Backend:
        """The backend :meth:`forward` runs masks z on inputs x with
        (:meth:`pbscale.forward.backends.BackendChoice.choose`)."""
        return self.choice.choose(z, x)

    def forward(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Outputs of the network under each of k masks: z (k, d), x (B, ...) -> (k, B, ...),
        by the backend :meth:`backend` chooses.

        With a leading group dimension, z (G, k, d) and x (G, B, ...) -> (G, k, B, ...): group
        g's k masks see group g's inputs only (G runs stepped together,
        :mod:`pbscale.regression.group`), in one call of a backend that takes groups (the MLP path
        in place), group by group otherwise."""
        grouped = z.dim() == 3
        if z.dim() not in (2, 3) or z.shape[-1] != self.d:
            raise PBInputError(f"masks must have shape (k, {self.d}) or (G, k, {self.d}), "
                               f"got {tuple(z.shape)}")
        if grouped and (x.dim() < 2 or x.shape[0] != z.shape[0]):
            raise PBInputError(f"grouped masks (G, k, d) need inputs (G, B, ...) with the same G;"
                               f" got masks {tuple(z.shape)} and inputs {tuple(x.shape)}")
        backend = self.choice.choose(z, x)
        if grouped and not backend.takes_groups:
            return torch.stack([self.forward(zg, xg) for zg, xg in zip(z, x)])
        return backend(z, x)

    def forward_single(self, weights: dict[str, torch.Tensor], x: torch.Tensor
                       ) -> torch.Tensor:
        """The network on x (B, ...) under one set of weights {name: (*shape)} (one mask's
        masked weights, or every parameter, e.g. a pruned network's), the other parameters and
        the buffers the layout's: the function :class:`pbscale.forward.backends.Vmap` maps over
        masks, one ``functional_call``."""
        return self.choice.vmap.one(weights, x)

    def forward_folded(self, z: torch.Tensor, x: torch.Tensor, per_call: int | None = None
                       ) -> torch.Tensor:
        """:meth:`forward` by the folded backend (:class:`pbscale.forward.backends.Folded`,
        ``per_call`` masks per folded call; 1: the loop backend) whatever the choice; z (k, d)."""
        return (self.choice.folded if per_call is None else Folded(self, per_call))(z, x)

    def forward_vmap(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` by the vmap backend (:class:`pbscale.forward.backends.Vmap`) whatever the
        choice: works for any module; z (k, d)."""
        return self.choice.vmap(z, x)

    def loss_fn(self, x: torch.Tensor, y: torch.Tensor, loss: LossFn = mean_absolute_error):
        """J(z) on the batch (x, y) as a batched function f(z (k, d)) -> (k,), differentiable in
        z (what the MC estimators evaluate and the hybrid estimators differentiate)."""

        def f(z: torch.Tensor) -> torch.Tensor:
            lead = z.shape[:-1]
            out = self.forward(z.reshape(-1, self.d), x)
            return loss(out, y).reshape(lead)

        return f
