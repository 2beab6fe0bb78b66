"""What one pruning run is made of once assembled (:class:`Assembly`): the one product of
:func:`pbscale.pruning.run.assemble`, which a run alone trains on the run loop and a group member
(:class:`pbscale.pruning.group.Member`) holds."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pbscale.pruning.lam_control import LamController
from pbscale.pruning.task import PruneTask
from pbscale.runs.contracts import LoopConfig, Method

__all__ = ["Assembly"]


@dataclass
class Assembly:
    """One pruning run's pieces, built once by :func:`pbscale.pruning.run.assemble` for a run
    alone and a group member (:class:`pbscale.pruning.group.Member` holds one): task, method,
    loop, the weights' optimizer (None: supermask), its configuration (``config``: what its
    folder is named by, :func:`pbscale.pruning.run.run_config`; ``legacy``: what named it in
    config.json format 1, :func:`pbscale.pruning.run.legacy_config`), what config.json records
    unhashed (``info``, ``method_info``) and its lam controller (``--lam-target``; else
    None)."""

    task: PruneTask
    method: Method
    loop: LoopConfig
    weight_opt: torch.optim.Optimizer | None
    config: dict
    legacy: dict
    info: dict
    method_info: dict
    controller: LamController | None
