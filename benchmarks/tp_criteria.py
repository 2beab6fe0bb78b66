"""Torch-Pruning's criteria as :mod:`benchmarks.bench_structured` runs them (and the GPU
suite's ``structured`` piece, for the shapes): the importance of each arm (``l2``: L2 group
norm, ``taylor``, ``bn``: BatchNorm scale, ``random``), one local ``MetaPruner`` step with the
head (``model.fc``) left out (:func:`tp_prune`), and the pruning ratio that reduces a model's
MACs by a target (:func:`tp_ratio`). Needs the ``structured`` extra (torch-pruning)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from pbscale.nets import channel_costs


def importance(arm: str) -> Any:
    """The Torch-Pruning importance object of criterion ``arm``."""
    import torch_pruning as tp
    return {"l2": lambda: tp.importance.GroupMagnitudeImportance(p=2),
            "taylor": tp.importance.GroupTaylorImportance,
            "bn": tp.importance.BNScaleImportance,
            "random": tp.importance.RandomImportance}[arm]()


def tp_prune(model: nn.Module, arm: str, ratio: float, example: torch.Tensor,
             grads: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """``model`` pruned in place by one ``MetaPruner`` step: ``ratio`` of every coupled group's
    channels (local pruning), by ``arm``'s importance, the head (``model.fc``) left out."""
    import torch_pruning as tp
    pruner = tp.pruner.MetaPruner(model, example, importance=importance(arm),
                                  pruning_ratio=ratio, ignored_layers=[model.fc],
                                  global_pruning=False)
    if grads is not None:
        grads(model)
    pruner.step()
    model.zero_grad(set_to_none=True)
    return model


def tp_ratio(model: nn.Module, target: float, example: torch.Tensor) -> tuple[float, int]:
    """The smallest pruning ratio whose local pruning reduces ``model``'s MACs by at least
    ``target`` (channel counts do not depend on the criterion): the first of a grid of steps
    0.05 that does, refined by bisection to 1e-3 below it; where none does (Torch-Pruning
    leaves a group whole rather than empty it), the grid's largest reduction. Returns the ratio
    and its MACs."""
    _, dense = channel_costs.count(model, example)

    def macs(r: float) -> int:
        return channel_costs.count(tp_prune(copy.deepcopy(model).cpu(), "random", r, example),
                                   example)[1]

    grid = [(r, macs(r)) for r in np.arange(0.05, 1.0, 0.05).round(2).tolist()]
    hit = next((k for k, (_, m) in enumerate(grid) if dense / m >= target), None)
    if hit is None:
        return min(grid, key=lambda rm: rm[1])
    lo, (hi, best) = (grid[hit - 1][0] if hit else 0.0), grid[hit]
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        m = macs(mid)
        if dense / m >= target:
            hi, best = mid, m
        else:
            lo = mid
    return hi, best
