"""Array-namespace helpers so one formula serves numpy (pbexact) and torch (pbscale).

The estimator and parametrization formulas use only operators and functions whose names and
meaning agree in numpy and torch (``@``, ``*``, ``sum(axis)``, ``where``, ``cos``...); the few that
differ go through here.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np


def namespace(x: Any) -> ModuleType:
    """numpy or torch, whichever owns ``x``."""
    if type(x).__module__.startswith("torch"):
        import torch

        return torch
    return np


def sigmoid(x: Any) -> Any:
    xp = namespace(x)
    if xp is np:
        from scipy.special import expit

        return expit(x)
    return xp.sigmoid(x)


def clip(x: Any, lo: float, hi: float) -> Any:
    xp = namespace(x)
    return xp.clip(x, lo, hi)


def zeros_like(x: Any) -> Any:
    return namespace(x).zeros_like(x)


def cast_like(x: Any, ref: Any) -> Any:
    """x in ``ref``'s dtype (x itself when it already is; numpy or torch, as x)."""
    if x.dtype == ref.dtype:
        return x
    return x.to(ref.dtype) if namespace(x) is not np else x.astype(ref.dtype)
