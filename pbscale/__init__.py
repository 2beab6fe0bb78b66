"""pbscale: the estimators of pbexact on masked torch networks (CPU or GPU).

The commands stay where ``python -m`` names them: :mod:`pbscale.prune`, :mod:`pbscale.regress`,
:mod:`pbscale.export` and the package :mod:`pbscale.sweep`. The
machinery is in sub-packages named for what they hold, each importing only those below it
(``tests/test_architecture.py``): :mod:`pbscale.runs` (the run loop and its records) and
:mod:`pbscale.forward` (how k masks of a network are evaluated) at the bottom;
:mod:`pbscale.methods` (the method registry and its families) and :mod:`pbscale.nets` (networks,
data, losses) above them; :mod:`pbscale.execution` (how a run executes: torchrun, CUDA graphs,
groups); :mod:`pbscale.pruning` and :mod:`pbscale.regression` (the two kinds of run) on top.

``pbscale.prune_model`` (:func:`pbscale.pruning.api.prune_model`) prunes your own torch network
on your own data; it is imported on first use, so ``import pbscale`` stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PruneResult", "prune_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pbscale.pruning import api as prune_api

        return getattr(prune_api, name)
    raise AttributeError(f"module 'pbscale' has no attribute {name!r}")
