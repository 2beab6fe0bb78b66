"""Structured (channel) pruning as a masked layout: :class:`ChannelLayout`, a
:class:`pbscale.forward.masks.MaskedModule` whose flat mask z (..., d) holds one entry per
channel variable of :func:`pbscale.nets.channels.channel_groups` (not one per weight), and what a
finished run reports and leaves of it: the evaluation's counts (:func:`channel_row`), the
physically smaller network (:func:`structured_network`) and its measured costs
(:func:`structured_report`).

A variable's entry multiplies every output slice it owns (Conv/Linear weight rows and bias,
BatchNorm weight and bias): :meth:`ChannelLayout.split` expands z to one mask per masked
tensor, shape (..., *param.shape), which the folded, loop and vmap backends of
:mod:`pbscale.forward.backends` run as they run weight masks (the MLP paths, which take one mask
entry per weight, are not taken: ``per_weight`` is False). Weights are multiplied by the mask as
they are: dynamic weight rescaling (w z / mean z per tensor) is defined per weight and not
applied to channel masks.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale.forward.folded import plain_weight
from pbscale.forward.masks import MaskedModule
from pbscale.forward.routes import Routes
from pbscale.nets.channel_costs import TensorCost, count, latency
from pbscale.nets.channel_ops import multiplier, remove_channels
from pbscale.nets.channel_types import ChannelGroups, Slice

#: Batch sizes the CPU latency of the dense and the pruned network is measured at.
LATENCY_BATCHES = (1, 128)
#: Timed forward passes (the median is reported) and unmeasured passes before them.
LATENCY_REPEATS, LATENCY_WARMUP = 20, 3


@dataclass(frozen=True, eq=False)
class SliceTable:
    """The parameter slices of the d variables (:attr:`ChannelGroup.slices
    <pbscale.nets.channel_types.ChannelGroup.slices>`, the running statistics left out),
    arranged for :func:`squared_norms`: ``whole`` (param, dim, positions (m,), variables (m,),
    int64): slice ``param[(:,)*dim, positions[k]]`` belongs to variable ``variables[k]``;
    ``parts`` (variable, slice): the slices that span only some rows (a grouped convolution's
    input channels); ``crossings`` (variable, slice on dim 0, slice on dim 1): two slices of one
    tensor owned by one variable (a layer whose inputs and outputs are tied, e.g. ``h +
    conv(h)``), whose shared elements the slices count twice."""

    d: int
    whole: tuple[tuple[str, int, torch.Tensor, torch.Tensor], ...]
    parts: tuple[tuple[int, Slice], ...]
    crossings: tuple[tuple[int, Slice, Slice], ...]


def slice_table(groups: ChannelGroups) -> SliceTable:
    """The :class:`SliceTable` of ``groups``: every parameter slice of every variable (out:
    Conv/Linear weight rows, bias, BatchNorm weight and bias; in: the consumers' input slices),
    read from the variables' own :attr:`slices`."""
    whole: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    parts, crossings = [], []
    for g in groups.groups:
        own = [s for s in g.slices if s.role != "buffer"]
        for s in own:
            if s.rows is None:
                pos, var = whole.setdefault((s.param, s.dim), ([], []))
                pos.append(s.index)
                var.append(g.index)
            else:
                parts.append((g.index, s))
        crossings += [(g.index, a, b) for a in own for b in own
                      if a.param == b.param and a.dim == 0 and b.dim == 1]
    return SliceTable(groups.d, tuple((p, dim, torch.tensor(pos), torch.tensor(var))
                                      for (p, dim), (pos, var) in whole.items()),
                      tuple(parts), tuple(crossings))


def _slice_of(p: torch.Tensor, s: Slice) -> torch.Tensor:
    """The elements of slice ``s`` of tensor ``p``."""
    t = p.select(s.dim, s.index)
    return t if s.rows is None else t[s.rows[0]:s.rows[1]]


def squared_norms(table: SliceTable, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """||W_i||_2^2 of every variable i, float64 of shape (d,) on the parameters' device: the
    sum of squares of the parameter elements that removing variable i alone removes (every
    slice of :func:`slice_table`, its Conv/Linear weight rows and bias, BatchNorm weight and
    bias, and the consumers' input slices; an element two of its slices share counted once;
    running statistics are buffers, not counted) of ``params`` {name: tensor}. MP and GMP rank
    channel variables by it (:class:`pbscale.methods.cuts.MagnitudeMethod`); Torch-Pruning's
    "group norm" is its square root."""
    device = next(iter(params.values())).device if params else torch.device("cpu")
    out = torch.zeros(table.d, dtype=torch.float64, device=device)

    def energy(t: torch.Tensor) -> torch.Tensor:  # sum of squares, in float64
        return t.detach().to(torch.float64).square().sum()

    for name, dim, pos, var in table.whole:
        t = params[name].detach().to(torch.float64).square()
        per = t.movedim(dim, 0).reshape(t.shape[dim], -1).sum(1)  # (size of dim,)
        out.index_add_(0, var.to(device), per[pos.to(device)])
    for v, s in table.parts:
        out[v] += energy(_slice_of(params[s.param], s))
    for v, a, b in table.crossings:  # a on dim 0, b on dim 1: element [a.index, b.index, ...]
        if b.rows is None or b.rows[0] <= a.index < b.rows[1]:
            out[v] -= energy(params[a.param][a.index, b.index])
    return out


class ChannelLayout(MaskedModule):
    """Masks over the d channel variables of ``groups`` (:class:`ChannelGroups` of ``module``):
    z (..., d) -> one mask per masked tensor (:meth:`split`); ``train_weights``, ``backend``,
    ``amp``, ``channels_last`` and ``routes`` as :class:`MaskedModule` takes them (no weight
    hook: plain w * z). Refuses, in one line, a network with no channel to prune."""

    per_weight = False

    def __init__(self, module: nn.Module, groups: ChannelGroups, train_weights: bool = False,
                 backend: str = "auto", amp: torch.dtype | None = None,
                 channels_last: bool = False, routes: Routes | str | None = None) -> None:
        if groups.d == 0:
            why = "; ".join(groups.skipped[:3]) or "no Conv or Linear layer"
            raise PBInputError(f"no channel can be pruned ({why}); prune single weights with "
                               "--granularity weight")
        names = [e.param for e in groups.expansions]
        super().__init__(module, names, train_weights=train_weights, weight_hook=plain_weight,
                         backend=backend, amp=amp, channels_last=channels_last, routes=routes)
        self.groups = groups
        self.expansions = {e.param: e for e in groups.expansions}
        self.d = groups.d
        self.sizes = [groups.d]
        self.slices = slice_table(groups)

    def coupled_index(self) -> torch.Tensor:
        """The variables of each coupled group a mask can switch off whole
        (:attr:`ChannelGroups.emptiable`, the groups removal holds at one channel), int64
        (m, L) on the layout's device, rows in the groups' order, each the group's variables
        ascending and padded with d: the groups a cut to ``--target`` (MP, GMP, edge-popup)
        never empties (:func:`pbscale.methods.schedules.keep_within`'s ``groups``; the run's
        ``Plan.coupled``)."""
        rows = [sorted(c.variables) for c in self.groups.emptiable]
        width = max((len(r) for r in rows), default=0)
        out = torch.full((len(rows), width), self.d, dtype=torch.int64)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r, dtype=torch.int64)
        return out.to(self.device)

    def squared_norms(self) -> torch.Tensor:
        """||W_i||_2^2 (d,) of the network's parameters now (:func:`squared_norms`): what MP
        and GMP rank the channel variables by."""
        return squared_norms(self.slices, dict(self.module.named_parameters()))

    def kept_fractions(self, keeps: torch.Tensor, kind: str) -> torch.Tensor:
        """The fraction of the prunable part's cost ``kind`` left by each mask of ``keeps``
        (n, d) (:func:`remaining_costs`), float64 (n,): what MP's and GMP's channel cuts,
        edge-popup and ``--budget`` fill (:func:`pbscale.methods.schedules.fill_within`) and
        the ``--lam-target`` controller measures (through ``PruneTask.kept_fraction``)."""
        return remaining_costs(self.groups, keeps, kind)

    def split(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Channel masks z (..., d) -> {name: mask of shape (..., *param.shape)}: entry c along
        the tensor's channel dimension is z[..., index[c]] (1 where no variable masks it);
        expanded views, differentiable in z."""
        lead = z.shape[:-1]
        out = {}
        for k, s in zip(self.names, self.shapes):
            m = multiplier(z, self.expansions[k], len(s))
            out[k] = m.expand(*lead, *s)
        return out


def prunable(groups: ChannelGroups, kind: str) -> int:
    """The parameters (``kind`` "params") or MACs per example ("macs") of the tensors that
    channel removal shrinks, dense: what a remaining fraction of the prunable part divides by."""
    if kind not in ("params", "macs"):
        raise PBInputError(f"cost kind must be 'params' or 'macs', got {kind!r}")
    return int(sum((t.params if kind == "params" else t.positions) * t.dense()
                   for t in groups.costs.tensors))


def tensor_kept(t: TensorCost, keep: torch.Tensor) -> int:
    """Elements of tensor ``t`` left by ``keep`` (d,) (exact: its rest times the kept slices of
    each pruned axis)."""
    gone = 1 - keep.detach().cpu().to(torch.int64).numpy()
    left = t.rest
    for a in t.axes:
        left *= a.full - int((gone[a.variables] * a.counts).sum())
    return int(left)


def remaining_cost(groups: ChannelGroups, keep: torch.Tensor, kind: str) -> float:
    """The fraction of the prunable part's cost ``kind`` ("params" or "macs",
    :func:`prunable`) left by ``keep`` (d,) (nonzero: the variable stays), exact
    (:meth:`pbscale.nets.channel_costs.CostTable.kept`): the evaluation's ``remaining``
    (:func:`channel_row`) and the budget of MP's and GMP's channel cuts."""
    return float(remaining_costs(groups, keep, kind))


def remaining_costs(groups: ChannelGroups, keep: torch.Tensor, kind: str) -> torch.Tensor:
    """:func:`remaining_cost` of each mask of ``keep`` (..., d): float64 (...)."""
    k = (keep.detach().cpu() != 0).to(torch.float64)
    costs = groups.costs
    dense = costs.dense_params if kind == "params" else costs.dense_macs
    part = prunable(groups, kind)
    if not part:
        return torch.ones(k.shape[:-1], dtype=torch.float64)
    return (part - (dense - costs.kept(k, kind))) / part


def channel_row(groups: ChannelGroups, keep: torch.Tensor, kind: str, num_all: int
                ) -> dict[str, float]:
    """The evaluation's counts of a channel mask ``keep`` (d,) (nonzero: the variable stays):
    ``remaining`` (cost ``kind`` kept over that of the prunable part, :func:`prunable`),
    ``remaining_all`` (parameters kept over all ``num_all``), ``remaining_channels`` (variables
    kept over d), ``remaining_macs`` (MACs per example kept over the dense network's) and, per
    Conv/Linear weight that removal shrinks, ``remaining_<layer>`` (its elements kept)."""
    k = (keep.detach().cpu() != 0).to(torch.float64)
    costs = groups.costs
    params = float(costs.kept(k, "params"))
    macs = float(costs.kept(k, "macs"))
    row = {"remaining": remaining_cost(groups, k, kind),
           "remaining_all": params / num_all,
           "remaining_channels": float(k.sum()) / groups.d,
           "remaining_macs": macs / costs.dense_macs if costs.dense_macs else 1.0}
    for t in costs.tensors:
        if t.positions and t.name.endswith(".weight"):
            row[f"remaining_{t.name.removesuffix('.weight')}"] = tensor_kept(t, k) / t.dense()
    return row


def weight_layers(groups: ChannelGroups) -> dict[str, int]:
    """{Conv/Linear weight that removal shrinks: its dense elements}, the per-layer counts of
    :func:`channel_row`."""
    return {t.name: t.dense() for t in groups.costs.tensors
            if t.positions and t.name.endswith(".weight")}


def removable_keep(groups: ChannelGroups, keep: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """``keep`` (d,) as a bool mask :func:`remove_channels` takes: a coupled group whose every
    variable is off keeps its first variable (the layer needs one channel; its masked values
    are zero, so the network computes the same), and the roots of those groups."""
    k = keep.detach().cpu() != 0
    held = []
    for c in groups.emptiable:
        if not bool(k[list(c.variables)].any()):
            k[c.variables[0]] = True
            held.append(c.root)
    return k, held


def structured_network(model: nn.Module, groups: ChannelGroups, keep: torch.Tensor,
                       params: Mapping[str, torch.Tensor] | None = None
                       ) -> tuple[nn.Module, torch.Tensor, list[str]]:
    """The physically pruned network (a copy on the CPU): ``model`` with ``params`` (e.g. the
    evaluation's masked parameters; None: its own) and its buffers, the variables off in
    ``keep`` (d,) removed; the bool keep mask removed by and the roots of the coupled groups
    held at one zeroed channel (:func:`removable_keep`)."""
    net = copy.deepcopy(model).cpu()
    if params is not None:
        own = dict(net.named_parameters())
        with torch.no_grad():
            for k, v in params.items():
                own[k].copy_(v.detach().cpu())
    k, held = removable_keep(groups, keep)
    return remove_channels(net, groups, k), k, held


def structured_blob(pruned: nn.Module, groups: ChannelGroups, keep: torch.Tensor,
                    example: torch.Tensor) -> dict:
    """What ``structured.pt`` holds (plain tensors, strings and lists: ``torch.load(...,
    weights_only=True)`` reads it): "keep" (bool (d,)), "state_dict" (the pruned network's),
    "example" (zeros of one input's shape and dtype, (1, ...)) and "leave_out" (the layers
    left out), from which :func:`rebuild` finds the same variables again."""
    return {"keep": keep.detach().cpu().to(torch.bool).clone(),
            "state_dict": {k: v.detach().cpu() for k, v in pruned.state_dict().items()},
            "example": torch.zeros_like(example[:1].detach().cpu()),
            "leave_out": list(groups.leave_out)}


def rebuild(model: nn.Module, saved: Mapping, groups: ChannelGroups | None = None
            ) -> nn.Module:
    """The pruned network of a ``structured.pt`` blob ``saved`` (:func:`structured_blob`): the
    dense ``model`` (the run's network as built, any weights) traced again on the saved
    example (or ``groups`` when given), :func:`remove_channels` by the saved keep mask, then
    ``load_state_dict``; on the CPU, in eval mode."""
    from pbscale.nets.channels import channel_groups

    model = model.cpu()
    if groups is None:
        groups = channel_groups(model, saved["example"], leave_out=saved["leave_out"],
                                check=False)
    keep = torch.as_tensor(saved["keep"]).to(torch.bool)
    net = remove_channels(model, groups, keep)
    net.load_state_dict(saved["state_dict"])
    return net.eval()


def structured_report(dense: nn.Module, pruned: nn.Module, example: torch.Tensor
                      ) -> dict[str, float]:
    """Parameters, MACs per example (:func:`pbscale.nets.channel_costs.count`) and CPU latency
    in seconds (:func:`pbscale.nets.channel_costs.latency`: the median of
    :data:`LATENCY_REPEATS` forward passes, batch 1 and 128 of ``example`` (1, ...) repeated) of
    the ``dense`` and the ``pruned`` network: {"dense_params", "pruned_params", "dense_macs",
    "pruned_macs", "dense_latency_b1", "pruned_latency_b1", "dense_latency_b128", ...}."""
    x = example[:1].detach().cpu()
    out: dict[str, float] = {}
    for name, net in (("dense", dense), ("pruned", pruned)):
        net = net.cpu()
        params, macs = count(net, x)
        out[f"{name}_params"], out[f"{name}_macs"] = params, macs
        for b in LATENCY_BATCHES:
            xb = x.expand(b, *x.shape[1:]).contiguous()
            out[f"{name}_latency_b{b}"] = latency(net, xb, LATENCY_REPEATS, LATENCY_WARMUP)
    return out


def l0_weights(groups: ChannelGroups, kind: str) -> torch.Tensor:
    """The L0 term's per-variable weights (d,): each variable's cost ``kind`` (what removing it
    alone saves, :meth:`ChannelGroups.cost`) over the mean cost, so that they average 1 (a
    variable of average cost weighs as one weight does in weight pruning)."""
    c = np.asarray(groups.cost(kind), dtype=np.float64)
    mean = c.mean() if len(c) else 1.0
    return torch.as_tensor(c / mean if mean > 0 else np.ones_like(c))


__all__ = ["LATENCY_BATCHES", "ChannelLayout", "SliceTable", "channel_row", "l0_weights",
           "prunable", "rebuild", "remaining_cost", "removable_keep", "slice_table",
           "squared_norms", "structured_blob", "structured_network", "structured_report",
           "tensor_kept", "weight_layers"]
