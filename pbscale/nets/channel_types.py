"""The records of :mod:`.channels`: a variable (:class:`ChannelGroup`), its members and slices,
the coupled groups, the masking of a tensor (:class:`Expansion`) and all of a network's
(:class:`ChannelGroups`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .channel_costs import CostTable


@dataclass(frozen=True)
class Slice:
    """One slice of a tensor a variable owns: ``param[(:,)*dim, index]`` (a parameter or, with
    role "buffer", a BatchNorm running statistic). Role "out": an output-channel slice
    (masked and removed); "in": a consumer's input-channel slice (removed). ``rows``: for a
    grouped convolution's input channel, the range of weight rows (output channels) of its
    block that the slice spans; None: all rows."""

    param: str
    dim: int
    index: int
    role: str
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class Member:
    """Channels of one layer in a group: ``kind`` "out" (its output channels, or the channels
    of a BatchNorm/depthwise convolution) or "in" (a Conv/Linear's input channels)."""

    module: str
    kind: str
    channels: tuple[int, ...]


@dataclass(frozen=True)
class ChannelGroup:
    """One PB variable: ``index`` (its position in z), ``name`` (root layer and channels, e.g.
    ``conv[3]``), the coupled groups it belongs to, its members, the slices it owns, and what
    removing it alone from the dense network saves: ``params`` (parameters, consumers' input
    slices included) and ``macs`` (MACs per example, producer's and consumers')."""

    index: int
    name: str
    coupled: tuple[int, ...]
    members: tuple[Member, ...]
    slices: tuple[Slice, ...]
    params: int
    macs: int


@dataclass(frozen=True)
class Coupled:
    """A coupled group of Torch-Pruning's graph: its root layer, every member, the indices of
    its variables and whether some of its channels are ``frozen`` (in no variable: a grouped
    convolution ties them to channels that cannot be removed; they always stay)."""

    root: str
    members: tuple[Member, ...]
    variables: tuple[int, ...]
    frozen: bool = False


@dataclass(frozen=True, eq=False)
class Expansion:
    """How z of shape (..., d) masks one tensor: along ``dim``, position c is multiplied by
    ``z[..., index[c]]``, where ``index`` (int64, shape (param.shape[dim],)) holds d for a
    position no variable masks (multiplied by 1). See :func:`multiplier`."""

    param: str
    dim: int
    index: torch.Tensor


@dataclass(frozen=True)
class RemovalOp:
    """Removal of the channels ``channels`` (variable ``variables[k]`` of each) on side ``kind``
    of layer ``module``."""

    module: str
    kind: str
    channels: tuple[int, ...]
    variables: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class ChannelGroups:
    """The d variables of a network (``groups``), its coupled groups, the coupled groups not
    pruned and why (``skipped``), the masking (``expansions`` of parameters, ``buffers``
    zeroed by :func:`mask_parameters`), the removal ops and the exact costs (``costs``)."""

    groups: tuple[ChannelGroup, ...]
    coupled: tuple[Coupled, ...]
    skipped: tuple[str, ...]
    head: tuple[str, ...]
    leave_out: tuple[str, ...]
    expansions: tuple[Expansion, ...]
    buffers: tuple[Expansion, ...]
    ops: tuple[RemovalOp, ...]
    costs: CostTable

    @property
    def d(self) -> int:
        return len(self.groups)

    @property
    def emptiable(self) -> tuple[Coupled, ...]:
        """The coupled groups a mask can switch off whole: those with variables and no
        ``frozen`` channel. Removal needs one channel of each
        (:func:`pbscale.nets.channel_ops.remove_channels` refuses an emptied one,
        :func:`pbscale.nets.channel_layout.removable_keep` holds it at one zeroed channel), and
        a cut to ``--target`` never empties one
        (:meth:`pbscale.nets.channel_layout.ChannelLayout.coupled_index`)."""
        return tuple(c for c in self.coupled if c.variables and not c.frozen)

    def cost(self, kind: str = "params") -> np.ndarray:
        """Per-variable cost for the L0 penalty, int64 of shape (d,): ``kind`` "params" or
        "macs" (what removing the variable alone saves)."""
        return self.costs.single(kind)
