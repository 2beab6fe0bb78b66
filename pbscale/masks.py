"""Binary masks on the weights of any torch network, evaluated for many masks at once.

A :class:`MaskedModule` wraps an ``nn.Module`` and a list of its weight tensors; a mask is a flat
vector z of shape (d,), d = total number of masked weights, laid out tensor after tensor in the
order given (row-major within a tensor). :meth:`MaskedModule.forward` runs a batch of k masks
(k, d) through the network at once with ``torch.func.vmap`` over ``functional_call`` (memory
O(k d) plus activations), which is how the n samples of one step are evaluated in chunks
(`alg:iter_loorf`, `alg:iter_arms`). Masks may be soft (values in [0, 1]) so that CP and the
hybrid estimators can differentiate through them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap

from pbexact.errors import PBInputError

#: Loss of the network output against targets per mask: (k, B, ...) outputs -> (k,) losses.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def mean_absolute_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """MAE per mask: outputs (k, B, 1) against targets (B, 1) -> (k,)."""
    return (out - y).abs().flatten(1).mean(1)


class MaskedModule:
    """Masks over chosen weight tensors of ``module``; the rest of the network is fixed.

    ``names`` are parameter names as in ``module.named_parameters()``; by default every
    parameter whose name ends in ``weight`` and has at least two dimensions (the Linear and
    convolution weights). Every parameter is detached: the network is a fixed backbone and
    only the mask is optimized (`sec:app_maskednnregression`).
    """

    def __init__(self, module: nn.Module, names: Sequence[str] | None = None) -> None:
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
        self.module = module
        self.names = names
        self.base = {k: p.detach() for k, p in params.items()}
        self.buffers = {k: b for k, b in module.named_buffers()}
        self.shapes = [tuple(self.base[k].shape) for k in names]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.d = sum(self.sizes)

    @property
    def device(self) -> torch.device:
        return self.base[self.names[0]].device

    @property
    def dtype(self) -> torch.dtype:
        return self.base[self.names[0]].dtype

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """Move (and cast) the module and the cached weights; returns self."""
        self.module.to(device=device, dtype=dtype)
        self.base = {k: p.detach() for k, p in self.module.named_parameters()}
        self.buffers = {k: b for k, b in self.module.named_buffers()}
        return self

    def split(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flat masks (..., d) -> {name: mask of shape (..., *weight.shape)}."""
        lead = z.shape[:-1]
        parts = torch.split(z, self.sizes, dim=-1)
        return {k: p.reshape(*lead, *s) for k, p, s in zip(self.names, parts, self.shapes)}

    def _single(self, masks: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        params = dict(self.base)
        for k, m in masks.items():
            params[k] = self.base[k] * m
        return functional_call(self.module, {**params, **self.buffers}, (x,))

    def forward(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Outputs of the network under each of k masks: z (k, d), x (B, ...) -> (k, B, ...)."""
        if z.dim() != 2 or z.shape[-1] != self.d:
            raise PBInputError(f"masks must have shape (k, {self.d}), got {tuple(z.shape)}")
        return vmap(self._single, in_dims=(0, None))(self.split(z), x)

    def forward_one(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Output under one mask z (d,) without vmap (the per-sample loop of the benchmark)."""
        return self._single(self.split(z), x)

    def loss_fn(self, x: torch.Tensor, y: torch.Tensor, loss: LossFn = mean_absolute_error):
        """J(z) on the batch (x, y) as a batched function f(z (k, d)) -> (k,), differentiable in
        z (what the MC estimators evaluate and the hybrid estimators differentiate)."""

        def f(z: torch.Tensor) -> torch.Tensor:
            lead = z.shape[:-1]
            out = self.forward(z.reshape(-1, self.d), x)
            return loss(out, y).reshape(lead)

        return f
