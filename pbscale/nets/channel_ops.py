"""Masking and removing the channel variables of :func:`.channels.channel_groups`, and the
record of groups.json (:mod:`.channels` re-exports them)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from pbexact.errors import PBInputError

from .channel_types import ChannelGroups, Expansion


def multiplier(z: torch.Tensor, e: Expansion, ndim: int) -> torch.Tensor:
    """The mask of one tensor: z of shape (..., d) gives shape (..., 1, ..., C, ..., 1) with
    C = len(e.index) at position ``e.dim`` of the tensor's ``ndim`` dimensions, so that
    ``param * multiplier(z, e, param.dim())`` has shape (..., *param.shape)."""
    zp = torch.cat([z, z.new_ones(z.shape[:-1] + (1,))], -1)
    m = zp[..., e.index.to(z.device)]
    return m.reshape(z.shape[:-1] + (1,) * e.dim + (m.shape[-1],) + (1,) * (ndim - e.dim - 1))


def masked_parameters(model: nn.Module, groups: ChannelGroups, z: torch.Tensor
                      ) -> dict[str, torch.Tensor]:
    """The masked parameters for masks z of shape (..., d): {parameter name: tensor of shape
    (..., *param.shape)}, only the parameters the variables mask (the others are unchanged).
    Pure: the model is not modified; differentiable in z and the parameters."""
    params = dict(model.named_parameters())
    return {e.param: params[e.param] * multiplier(z, e, params[e.param].dim())
            for e in groups.expansions}


def mask_parameters(model: nn.Module, groups: ChannelGroups,
                    z: torch.Tensor | np.ndarray | Sequence[float]) -> None:
    """Zero, in place, the output slices of the variables with z = 0 (z of shape (d,)):
    Conv/Linear weight rows and bias, BatchNorm/InstanceNorm weight, bias and running mean,
    so that the model computes what :func:`remove_channels` (same z as keep) computes."""
    z = _keep(groups, z).to(torch.float32)
    named = dict(model.named_parameters())
    named.update(dict(model.named_buffers()))
    with torch.no_grad():
        for e in groups.expansions + groups.buffers:
            t = named[e.param]
            t.mul_(multiplier(z.to(t.device, t.dtype), e, t.dim()))


def _keep(groups: ChannelGroups, keep) -> torch.Tensor:
    k = torch.as_tensor(np.asarray(keep, dtype=np.float64)
                        if not isinstance(keep, torch.Tensor) else keep.detach().cpu())
    if k.shape != (groups.d,):
        raise PBInputError(f"the keep mask must have shape ({groups.d},), one entry a "
                           f"variable, got {tuple(k.shape)}")
    return k.to(torch.float64) > 0.5


def remove_channels(model: nn.Module, groups: ChannelGroups,
                    keep: torch.Tensor | np.ndarray | Sequence[bool]) -> nn.Module:
    """A deep copy of ``model`` with the channels of the variables where ``keep`` (shape (d,))
    is False removed by Torch-Pruning's pruning functions (the tensors shrink). Refuses, with
    :class:`PBInputError`, a mask that removes every channel of a coupled group."""
    from torch_pruning.ops import module2type
    from torch_pruning.pruner.function import PrunerBox

    k = _keep(groups, keep)
    for c in groups.emptiable:
        if not bool(k[list(c.variables)].any()):
            raise PBInputError(f"the mask removes every channel of layer '{c.root}'; keep at "
                               f"least one of its variables {list(c.variables)}")
    new = copy.deepcopy(model)
    mods = dict(new.named_modules())
    kinds = {op.module: module2type(mods[op.module]) for op in groups.ops}
    for op in groups.ops:
        idxs = sorted(a for a, v in zip(op.channels, op.variables) if not k[v])
        if idxs:
            pruner = PrunerBox[kinds[op.module]]
            fn = pruner.prune_out_channels if op.kind == "out" else pruner.prune_in_channels
            fn(mods[op.module], idxs)
    return new


def flat_outputs(out: object) -> list[torch.Tensor]:
    """The tensors of a forward result (a tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat_outputs(o)]
    return []


def same_outputs(a, b) -> bool:
    """Whether two forward results (tensors, or nested tuples/lists/dicts of them) agree to
    float32 rounding: rtol 1e-4, atol 1e-5 times the largest magnitude (at least 1)."""
    xa, xb = flat_outputs(a), flat_outputs(b)
    if len(xa) != len(xb) or any(x.shape != y.shape for x, y in zip(xa, xb)):
        return False
    return all(torch.allclose(x.double(), y.double(), rtol=1e-4,
                              atol=1e-5 * max(1.0, float(x.abs().max()) if x.numel() else 1.0))
               for x, y in zip(xa, xb))


def groups_record(groups: ChannelGroups) -> dict:
    """The JSON-serialisable record of groups.json: every variable (members, channels,
    parameters, MACs), the coupled groups, those not pruned and why, the dense network's
    parameters and MACs and the totals of the variables' costs."""
    return {
        "d": groups.d,
        "cost": {"params": "elements of the distinct parameters removed with the variable "
                           "alone (consumers' input slices included)",
                 "macs": "multiply-accumulates per example of Conv/Linear weights removed "
                         "with the variable alone (producer's and consumers')"},
        "dense": {"params": groups.costs.dense_params, "macs": groups.costs.dense_macs},
        "variables": [{"index": g.index, "name": g.name, "coupled": list(g.coupled),
                       "members": [{"module": m.module, "kind": m.kind,
                                    "channels": list(m.channels)} for m in g.members],
                       "params": g.params, "macs": g.macs} for g in groups.groups],
        "coupled": [{"root": c.root, "variables": list(c.variables),
                     "members": [{"module": m.module, "kind": m.kind,
                                  "channels": len(m.channels)} for m in c.members]}
                    for c in groups.coupled],
        "skipped": list(groups.skipped),
        "head": list(groups.head),
        "leave_out": list(groups.leave_out),
        "totals": {"params": int(sum(g.params for g in groups.groups)),
                   "macs": int(sum(g.macs for g in groups.groups))},
    }
