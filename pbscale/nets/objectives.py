"""What a pruning run minimizes besides the L0 term, and how it is scored: the paper's
cross-entropy with accuracy for integer labels, the mean squared error for float targets, or
a user's loss of the batched shape (``--loss package.module:function``).

J(z) on a batch is :attr:`Objective.per_mask` of the network's outputs under k masks:
outputs (k, B, ...) and targets (B, ...) -> (k,) (one mean over the batch per mask). The
evaluation scores one network at a time with :meth:`Objective.score`: outputs (B, ...) ->
(sum of the per-example losses, correct predictions), accuracy only where the labels are
integer classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from pbexact.errors import PBInputError
from pbscale.forward.folded import PerMaskLoss, cross_entropy_per_mask

#: ``--loss`` values that name a built-in objective ("" picks by the targets' dtype).
LOSSES = ("", "ce", "mse")


def mse_per_mask(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the batch and the output's elements for each mask: outputs
    (k, B, ...) against float targets (B, ...) -> (k,)."""
    return (out.float() - y).square().flatten(1).mean(1)


@dataclass(frozen=True)
class Objective:
    """A run's loss: ``name`` (what config.json records: "ce", "mse" or the user's import
    path), ``per_mask`` (outputs (k, B, ...), targets (B, ...) -> (k,)) and whether accuracy
    is reported (integer labels, outputs (B, classes))."""

    name: str
    per_mask: PerMaskLoss
    accuracy: bool
    #: outputs (B, ...), targets (B, ...) -> the loss summed over the batch (0-d); None: the
    #: batch mean of :attr:`per_mask` times B
    total: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def score(self, out: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        """(sum over the batch of the loss, correct predictions) of one network's outputs
        (B, ...) against targets (B, ...); correct is 0 without accuracy."""
        if self.total is not None:
            loss = float(self.total(out, y))
        else:
            loss = float(self.per_mask(out[None], y)[0]) * len(y)
        correct = int((out.argmax(1) == y).sum()) if self.accuracy else 0
        return loss, correct


def _ce_total(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="sum")


def _mse_total(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out.float() - y).square().flatten(1).mean(1).sum()


CROSS_ENTROPY = Objective("ce", cross_entropy_per_mask, True, _ce_total)
MEAN_SQUARED_ERROR = Objective("mse", mse_per_mask, False, _mse_total)


def import_loss(spec: str) -> Callable:
    """The function ``package.module:function`` names (the network's import rules,
    :func:`pbscale.nets.network.import_factory`)."""
    from pbscale.nets.network import import_factory  # the one import rule for user code

    try:
        return import_factory(spec)
    except PBInputError as e:
        raise PBInputError(str(e).replace("--model", "--loss").replace(
            "that returns an nn.Module", "(outputs (k, B, ...), targets (B, ...)) -> (k,)")
        ) from None


def objective_for(spec: str, classes: bool) -> Objective:
    """The objective of ``--loss`` ``spec`` for targets that are integer ``classes`` or not:
    "" cross-entropy for classes and MSE otherwise, "ce" (classes only), "mse", or a user's
    function ``package.module:function`` (accuracy reported for classes)."""
    if spec == "":
        return CROSS_ENTROPY if classes else MEAN_SQUARED_ERROR
    if spec == "ce":
        if not classes:
            raise PBInputError("--loss ce needs integer class labels, and the targets are "
                               "floats; store y as integers, or use --loss mse")
        return CROSS_ENTROPY
    if spec == "mse":
        return MEAN_SQUARED_ERROR
    if ":" not in spec:
        raise PBInputError(f"unknown --loss {spec!r}; choose ce, mse, or your own function as "
                           "package.module:function")
    return Objective(spec, import_loss(spec), classes)


__all__ = ["CROSS_ENTROPY", "LOSSES", "MEAN_SQUARED_ERROR", "Objective", "import_loss",
           "mse_per_mask", "objective_for"]
