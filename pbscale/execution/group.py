"""A group: G runs trained in one process, each member's step exactly its separate run's
(:class:`MemberBook`, the loop's method of the regression groups of
:mod:`pbscale.regression.group` and the pruning groups of :mod:`pbscale.pruning.group`).

A group is a group of separate runs: member g's step is member g's own method called on member
g's own batched loss (:class:`MemberLosses`, the loss its separate run's task gives), then
differentiated and applied by member g's own optimizers, one member after another. So a
member's arithmetic does not depend on the group (its size, the other members, the order): a
run trained in a group of any size, alone (a group of one) or by its separate command gives the
same numbers, bit for bit, on any device (the same kernels on the same shapes; tested on real
MNIST and on the paper's regression problem, docs/scaling.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from pbscale.runs.contracts import BatchedLoss


class MemberLosses:
    """The batched loss of one step of a group, as its members see it: ``parts[g]`` is member
    g's batched loss, (k, d) -> (k,), the one its separate run's task gives for this step (None
    for a member that no longer trains)."""

    def __init__(self, parts: Sequence[BatchedLoss | None]) -> None:
        self.parts = list(parts)


class MemberBook:
    """G runs trained one after another in each step, one definition for the regression groups
    (:class:`pbscale.regression.group.MaskTrainerGroup`) and the pruning groups
    (:mod:`pbscale.pruning.group`).

    ``book`` holds the members' methods (each a :class:`pbscale.runs.contracts.Method`). A step
    (:meth:`surrogate`) calls each training member's own surrogate on its own loss
    (:class:`MemberLosses`) and differentiates it at once (``backward``: one member's graph
    alive at a time), as the loop's :func:`pbscale.runs.loop.train_step` does for its separate run;
    :meth:`apply` then steps each member's own optimizers. Returned is a value without a graph
    and the members' mean training loss; each member's loss is kept for
    :meth:`pop_epoch_losses`. A subclass may stop members (``stopped`` maps a member's index
    to why; kept in the state, so a resumed group skips them too)."""

    def __init__(self, book: Sequence[Any]) -> None:
        self.book = book
        self.epoch_losses: list[list[float]] = [[] for _ in book]
        self.stopped: dict[int, dict] = {}

    def training(self) -> list[int]:
        """The indices of the members still training."""
        return [g for g in range(len(self.book)) if g not in self.stopped]

    def surrogate(self, f: MemberLosses, weights: bool = False) -> tuple[torch.Tensor, float]:
        """One step of every training member (see the class docstring): (a 0-dim tensor
        without a graph, the mean over the members of their training losses); each member's
        loss of the step is in ``step_losses`` ({index: loss})."""
        self.step_losses: dict[int, float] = {}
        for g in self.training():
            value, loss = self.book[g].surrogate(f.parts[g], weights=weights)
            if value.requires_grad:
                value.backward()
            self.record(g, loss)
            self.step_losses[g] = loss
        losses = list(self.step_losses.values())
        return torch.zeros(()), sum(losses) / len(losses) if losses else math.nan

    def record(self, g: int, loss: float) -> None:
        """Keep member g's training loss of one step."""
        self.epoch_losses[g].append(loss)

    def pop_epoch_losses(self) -> list[float]:
        """Each member's mean training loss over the steps since the last call (NaN if none),
        as a separate run's loop computes it; then starts afresh."""
        out = [sum(ls) / len(ls) if ls else math.nan for ls in self.epoch_losses]
        self.epoch_losses = [[] for _ in self.book]
        return out

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for m in self.book for o in m.optimizers]

    def zero_grad(self) -> None:
        for m in self.book:
            m.zero_grad()

    def apply(self) -> None:
        """Each training member's optimizer steps its own parameters."""
        for g in self.training():
            self.book[g].apply()

    def config_dict(self) -> dict:
        return {"runs": [m.config_dict() for m in self.book]}

    def state_dict(self) -> dict:
        return {"members": [m.state_dict() for m in self.book],
                "epoch_losses": [list(ls) for ls in self.epoch_losses],
                "stopped": {str(g): dict(why) for g, why in self.stopped.items()}}

    def load_state_dict(self, state: dict) -> None:
        if len(state["members"]) != len(self.book):
            raise ValueError("member count")
        for m, st in zip(self.book, state["members"]):
            m.load_state_dict(st)
        self.epoch_losses = [list(ls) for ls in state["epoch_losses"]]
        self.stopped = {int(g): dict(why) for g, why in state.get("stopped", {}).items()}
