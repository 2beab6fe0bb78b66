"""Per-mask references the masked-forward backends are tested against: one plain
``functional_call`` per mask, no batching over masks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call

from pbscale.forward.folded import (
    PerMaskLoss,
    WeightHook,
    cross_entropy_per_mask,
    forward_masked,
    plain_weight,
)
from pbscale.forward.masks import MaskedModule


def forward_one(layout: MaskedModule, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Output of ``layout``'s network under one mask z (d,) on x (B, ...): one
    ``functional_call`` with the hooked masked weights and the layout's buffers."""
    return layout.forward_single({k: w[0] for k, w in layout.masked_weights(z[None]).items()}, x)


def forward_masked_loop(module: nn.Module, masks: Mapping[str, torch.Tensor],
                        x: torch.Tensor, weight_hook: WeightHook = plain_weight) -> torch.Tensor:
    """:func:`pbscale.forward.folded.forward_masked` by a loop over the k masks, one
    ``functional_call`` each (running statistics are not updated): masks {name: (k, *shape)},
    x (B, ...) -> (k, B, ...)."""
    params = dict(module.named_parameters())
    buffers = {n: b.clone() for n, b in module.named_buffers()}
    k = next(iter(masks.values())).shape[0]
    outs = []
    for i in range(k):
        p = {n: (weight_hook(n, v, masks[n][i : i + 1])[0] if n in masks else v)
             for n, v in params.items()}
        outs.append(functional_call(module, {**p, **buffers}, (x,)))
    return torch.stack(outs)


def masked_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor,
                names: Sequence[str] | None = None, loss: PerMaskLoss = cross_entropy_per_mask,
                *, amp: torch.dtype | None = None, channels_last: bool = False,
                weight_hook: WeightHook = plain_weight) -> Callable[[torch.Tensor], torch.Tensor]:
    """J(z) on the batch (x, y) by :func:`pbscale.forward.folded.forward_masked` as a batched
    function f(z (..., d)) -> (...,); z laid out as in :class:`pbscale.forward.masks.MaskedModule`
    over ``names`` (default: every weight with >= 2 dimensions)."""
    layout = MaskedModule(module, names)

    def f(z: torch.Tensor) -> torch.Tensor:
        lead = z.shape[:-1]
        z2 = z.reshape(-1, layout.d).to(layout.dtype)
        out = forward_masked(module, layout.split(z2), x, amp=amp, channels_last=channels_last,
                             weight_hook=weight_hook)
        return loss(out, y).reshape(lead)

    return f


def randomize_bn(net: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial running statistics and affine parameters (BN starts at 0 / 1 otherwise)."""
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
