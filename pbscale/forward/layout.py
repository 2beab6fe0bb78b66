"""What every backend of the masked forward reads of its layout (:class:`MaskLayout`) and what
a backend is (:class:`Backend`): the contract between :class:`pbscale.forward.masks.MaskedModule`
and the ways it evaluates k masks (:mod:`pbscale.forward.backends`, :mod:`pbscale.forward.mlp`)."""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch
from torch import nn

from pbscale.forward.folded import WeightHook


class MaskLayout(Protocol):
    """What a backend reads from its layout (:class:`pbscale.forward.masks.MaskedModule`): the
    network, the masked parameter names with their shapes and sizes (d = sum of sizes), the
    parameters as the forward uses them (``base``: detached unless ``train_weights``), the buffers,
    the weight hook (None: w * z), autocast dtype and channels-last flag, and the split of flat
    masks (..., d) into per-tensor masks. ``per_weight``: whether mask entry i is one weight of
    the tensors in order (the MLP paths need it; False for channel masks, which
    :meth:`split` expands)."""

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
    per_weight: bool

    @property
    def dtype(self) -> torch.dtype: ...

    def split(self, z: torch.Tensor) -> dict[str, torch.Tensor]: ...

    def masked_weights(self, z: torch.Tensor) -> dict[str, torch.Tensor]: ...


class Backend:
    """One way to evaluate k masks: ``backend(z, x)``, masks z (k, d), inputs x (B, ...) ->
    outputs (k, B, ...). ``takes_groups``: whether it also takes z (G, k, d) with x (G, B, ...)
    in one call (otherwise :class:`pbscale.forward.masks.MaskedModule` runs the groups one by
    one)."""

    name: ClassVar[str]
    takes_groups: ClassVar[bool] = False

    def __init__(self, layout: MaskLayout) -> None:
        self.layout = layout

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
