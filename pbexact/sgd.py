"""The microworld's SGD loop, numpy or torch (no torch import): :func:`sgd`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .errors import PBInputError


def sgd(r: Any, gradient: Callable[[int, Any], Any], lr: float, steps: int | Iterable[int],
        project: Callable[[Any], Any] | None = None,
        log: Callable[[int, Any], Any] | None = None, what: str = "the logits",
        fix: str = "lower the learning rate") -> Any:
    """Plain SGD on logits r of any shape (numpy or torch; leading dimensions are independent
    runs, e.g. the microworld's seeds): r <- project(r - lr * gradient(step, r)), with
    ``log(step, r)`` before every step and after the last. ``steps``: a count, or the iterable
    0..steps itself (e.g. a tqdm bar over range(steps + 1)). The microworld loops
    (`analysis.microworld.runs.run_exact`, `analysis.microworld.hybrid.run_torch`) and the
    SGD checks of `analysis.theorems` all run through it; returns the final r. Logits that turn
    NaN or inf stop the run with a PBInputError naming the cause, the learning rate (``what``:
    whose logits, ``fix``: what to change)."""
    steps_iter = range(steps + 1) if isinstance(steps, int) else steps
    last = len(steps_iter) - 1
    for step in steps_iter:
        if log is not None:
            log(step, r)
        if step == last:
            break
        r = r - lr * gradient(step, r)
        if project is not None:
            r = project(r)
        finite = r.isfinite().all() if hasattr(r, "isfinite") else np.isfinite(r).all()
        if not bool(finite):
            raise PBInputError(f"{what} became NaN or inf at step {step + 1}: the learning rate "
                               f"{lr:g} is too large; {fix}")
    return r
