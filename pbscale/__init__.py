"""pbscale: the estimators of pbexact on masked torch networks (CPU or GPU).

The commands stay where ``python -m`` names them: :mod:`pbscale.prune`, :mod:`pbscale.regress`,
:mod:`pbscale.batched_seeds`, :mod:`pbscale.export` and the package :mod:`pbscale.sweep`. The
machinery is in sub-packages named for what they hold, each importing only those below it
(``tests/test_architecture.py``): :mod:`pbscale.runs` (the run loop and its records) and
:mod:`pbscale.forward` (how k masks of a network are evaluated) at the bottom;
:mod:`pbscale.methods` (the method registry and its families) and :mod:`pbscale.nets` (networks,
data, losses) above them; :mod:`pbscale.execution` (how a run executes: torchrun, CUDA graphs,
groups); :mod:`pbscale.pruning` and :mod:`pbscale.regression` (the two kinds of run) on top.

``pbscale.prune_model`` (:func:`pbscale.pruning.api.prune_model`) prunes your own torch network
on your own data; it is imported on first use, so ``import pbscale`` stays light. A module
imported from where it was before this layout is told its new place in one line
(:mod:`pbexact.moved`).
"""

from __future__ import annotations

from typing import Any

from pbexact.moved import install

__all__ = ["PruneResult", "prune_model"]

#: The modules of pbscale that moved into its sub-packages, old name -> new.
MOVED = {
    "pbscale.masks": "pbscale.forward.masks", "pbscale.backends": "pbscale.forward.backends",
    "pbscale.batched": "pbscale.forward.folded", "pbscale.routes": "pbscale.forward.routes",
    "pbscale.route_ops": "pbscale.forward.route_ops", "pbscale.graphs": "pbscale.forward.graphs",
    "pbscale.loop": "pbscale.runs.loop", "pbscale.loop_types": "pbscale.runs.contracts",
    "pbscale.run_record": "pbscale.runs.records", "pbscale.io": "pbscale.runs.io",
    "pbscale.runtime": "pbscale.runs.runtime", "pbscale.memory": "pbscale.runs.memory",
    "pbscale.jobs": "pbscale.sweep.jobs", "pbscale.distributed": "pbscale.execution.distributed",
    "pbscale.captured_step": "pbscale.execution.captured",
    "pbscale.methods.group": "pbscale.execution.group", "pbscale.models": "pbscale.nets.models",
    "pbscale.network": "pbscale.nets.network", "pbscale.data": "pbscale.nets.data",
    "pbscale.user_data": "pbscale.nets.user_data", "pbscale.objectives": "pbscale.nets.objectives",
    "pbscale.prune_config": "pbscale.pruning.config", "pbscale.prune_task": "pbscale.pruning.task",
    "pbscale.prune_eval": "pbscale.pruning.evaluation",
    "pbscale.prune_export": "pbscale.pruning.outputs",
    "pbscale.prune_setup": "pbscale.pruning.setup", "pbscale.prune_group": "pbscale.pruning.group",
    "pbscale.prune_api": "pbscale.pruning.api",
    "pbscale.lam_control": "pbscale.pruning.lam_control",
}
install(MOVED)


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pbscale.pruning import api as prune_api

        return getattr(prune_api, name)
    raise AttributeError(f"module 'pbscale' has no attribute {name!r}")
