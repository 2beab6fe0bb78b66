"""pbscale: the estimators of pbexact on masked torch networks (CPU or GPU).

``pbscale.prune_model`` (:func:`pbscale.prune_api.prune_model`) prunes your own torch network
on your own data; it is imported on first use, so ``import pbscale`` stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PruneResult", "prune_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pbscale import prune_api

        return getattr(prune_api, name)
    raise AttributeError(f"module 'pbscale' has no attribute {name!r}")
