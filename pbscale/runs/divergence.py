"""Divergence checks of the run loop (:func:`pbscale.runs.loop.run`): a step whose training
loss is NaN or inf, mask logits or network weights that became NaN or inf, an evaluation whose
loss is NaN or inf. Each stops the run with a :class:`pbscale.runs.records.Diverged` whose one
line names where, what went non-finite and the learning-rate flag its cause asks to lower (the
tool's names, :data:`pbscale.runs.loop.LR_FLAGS`); ``diverged.json`` records the same, flag
included, and a rerun repeats it (:func:`pbscale.runs.records.diverged_refusal`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from pbexact.errors import PBInputError
from pbscale.runs.contracts import Method
from pbscale.runs.records import Diverged

__all__ = ["check_finite", "check_metrics"]


def check_finite(method: Method, epoch: int, flags: dict[str, str],
                 weights: Sequence[torch.nn.Parameter] = (),
                 step: tuple[int, int, torch.Tensor | None] | None = None) -> None:
    """Stop a diverged run (:class:`pbscale.runs.records.Diverged`) with one line naming where,
    what went non-finite and so the flag to lower (``flags``, see :data:`LR_FLAGS`): the mask
    logits (:meth:`Method.check_finite`: the masks' rate), the network weights (``weights``:
    the weights' rate), both (both rates), after ``epoch`` (0-based); or, with ``step`` = (step
    number, batch, fixed mask), a step whose training loss is not finite. Such a step made no
    update (:func:`train_step`), so the parameters read are those its loss came from: finite
    ones mean the forward overflowed, which where weights train is theirs (masks only switch
    weights on and off: the weights' rate), else the masks'."""
    where = (f"step {step[0]} (epoch {epoch + 1}, batch {step[1]})" if step is not None
             else f"epoch {epoch + 1}")
    at = step[0] if step is not None else None
    logits: PBInputError | None = None
    try:
        method.check_finite(where, flags)
    except Diverged:
        raise
    except PBInputError as exc:
        logits = exc
    bad_weights = any(not bool(torch.isfinite(p).all()) for p in weights)
    if logits is not None and bad_weights:
        both = f"{flags['weights']} and {flags['masks']}"
        raise Diverged(f"the network weights and the mask logits became NaN or inf in {where}: "
                       f"both learning rates are too large; lower {both}", epoch + 1, at,
                       where, both)
    if logits is not None:
        raise Diverged(str(logits), epoch + 1, at, where, flags["masks"])
    if bad_weights:
        raise Diverged(f"the network weights became NaN or inf in {where} (the mask logits "
                       f"are finite): the weight learning rate is too large; lower "
                       f"{flags['weights']}", epoch + 1, at, where, flags["weights"])
    if step is not None:
        if weights:
            big = max(float(p.detach().abs().max()) for p in weights)
            raise Diverged(f"the training loss became NaN or inf at {where} from finite "
                           f"weights (largest |weight| {big:.3g}) and mask logits: the weights' "
                           f"outputs overflowed (masks only switch weights on and off); lower "
                           f"{flags['weights']}", epoch + 1, at, where, flags["weights"])
        raise Diverged(f"the training loss became NaN or inf at {where}: the run diverged; "
                       f"lower {flags['masks']}", epoch + 1, at, where, flags["masks"])


def check_metrics(metrics: dict, epoch: int, flags: dict[str, str], joint: bool) -> None:
    """Stop a run (:class:`pbscale.runs.records.Diverged`) whose evaluation after ``epoch``
    (0-based) has a NaN or inf loss (``*loss`` entries) although every step's loss, the logits
    and the weights were finite: the weights grew past what the network's float32 outputs
    hold. Masks only switch weights on and off, so the flag named is the weight learning rate
    where weights train (``joint``), else the masks'."""
    bad = [k for k, v in metrics.items()
           if k.endswith("loss") and isinstance(v, float) and not math.isfinite(v)]
    if bad:
        flag = flags["weights"] if joint else flags["masks"]
        raise Diverged(f"the evaluation's {bad[0]} became NaN or inf after epoch {epoch + 1}: "
                       f"the run diverged; lower {flag}", epoch + 1, None,
                       f"the evaluation after epoch {epoch + 1}", flag)
