"""G runs of one method trained in one process, each member's step exactly its separate run's
(:class:`MemberBook`, shared by the pruning groups of :mod:`pbscale.prune_group`), and
:class:`MaskTrainerGroup`, the method of batched seeds (:mod:`pbscale.batched_seeds`).

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
from dataclasses import dataclass
from typing import Any

import torch

from pbexact.errors import PBInputError

from ..loop_types import BatchedLoss
from .registry import MethodConfig, Plan, names


@dataclass
class FlatLayout:
    """What :meth:`pbscale.methods.Family.make` reads of a layout: one flat mask of d weights on
    ``device`` (for a group built without a network, :meth:`MaskTrainerGroup.flat`)."""

    d: int
    device: torch.device


class MemberLosses:
    """The batched loss of one step of a group, as its members see it: ``parts[g]`` is member
    g's batched loss, (k, d) -> (k,), the one its separate run's task gives for this step (None
    for a member that no longer trains)."""

    def __init__(self, parts: Sequence[BatchedLoss | None]) -> None:
        self.parts = list(parts)


class MemberBook:
    """G runs trained one after another in each step, one definition for the regression groups
    (:class:`MaskTrainerGroup`) and the pruning groups (:mod:`pbscale.prune_group`).

    ``book`` holds the members' methods (each a :class:`pbscale.loop_types.Method`). A step
    (:meth:`surrogate`) calls each training member's own surrogate on its own loss
    (:class:`MemberLosses`) and differentiates it at once (``backward``: one member's graph
    alive at a time), as the loop's :func:`pbscale.loop.train_step` does for its separate run;
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


class MaskTrainerGroup(MemberBook):
    """G runs of one method that train together (:mod:`pbscale.batched_seeds`): one
    :class:`pbscale.loop_types.Method` over G members (:class:`MaskTrainer` s made by the
    family, :meth:`pbscale.methods.Family.make`: logits (P,), optimizer, generator, learned
    control each), whose step is each member's own step on its own batch
    (:class:`MemberBook`), so member g's estimate, step and history are those of the separate
    run with its configuration, bit for bit.

    The members share the method, n, the parametrization and the method's own settings;
    learning rate, optimizer, seed and lam are their own. Masks only (supermask); the group's
    ``generator`` (the loop's stream) is not used (each member's is, and each is checkpointed
    in :meth:`state_dict`). ``r``, :meth:`theta`, :meth:`mode_mask` and :meth:`sample_masks`
    stack the members' (leading dimension G)."""

    def __init__(self, configs: Sequence[MethodConfig], layout: Any, plan: Plan) -> None:
        self.check(configs)
        self.members = [c.family.make(c, layout, plan) for c in configs]
        self.d = layout.d
        self.device = torch.device(layout.device)
        self.family = configs[0].family
        self.param = self.members[0].param
        self.n = configs[0].n
        #: the chunk of the first member (each member evaluates its masks in its own chunks)
        self.chunk = self.members[0].chunk
        #: the run's stream for the loop (the members draw from their own generators)
        self.generator = torch.Generator(device=self.device).manual_seed(0)
        super().__init__(self.members)

    @classmethod
    def flat(cls, configs: Sequence[MethodConfig], d: int, total_steps: int,
             device: torch.device | str = "cpu", bytes_per_sample: int | None = None
             ) -> MaskTrainerGroup:
        """A group over one flat mask of d weights (no network), trained for ``total_steps``."""
        return cls(configs, FlatLayout(d, torch.device(device)),
                   Plan(mask_steps=total_steps, bytes_per_sample=bytes_per_sample))

    @staticmethod
    def check(configs: Sequence[MethodConfig]) -> None:
        """Refuse (:class:`PBInputError`) configurations that cannot form a group."""
        if not configs:
            raise PBInputError("no runs to train; give at least one seed and learning rate")
        for c in configs:
            if "batched" not in c.family.caps.commands:
                raise PBInputError(f"{c.family.text} runs do not train as a group; batched "
                                   f"runs are runs of {', '.join(names('batched'))}")
        seen = [repr(sorted(c.to_dict().items())) for c in configs]
        if len(set(seen)) != len(seen):
            raise PBInputError("a run is listed twice in the batch (same seed, learning rate and "
                               "settings); list each once")
        for field in ("n", "method", "param", "settings"):
            values = sorted({str(getattr(c, field)) for c in configs})
            if len(values) != 1:
                raise PBInputError(f"batched runs share {field}; got {field} in "
                                   f"{', '.join(values)}: batch each {field} separately")

    @property
    def method(self) -> str:
        return self.members[0].method

    @property
    def r(self) -> torch.Tensor:
        """The members' logits, (G, P) (a detached copy)."""
        return torch.stack([m.r.detach() for m in self.members])

    def theta(self) -> torch.Tensor:
        return torch.stack([m.theta() for m in self.members])

    @property
    def dtype(self) -> torch.dtype:
        return self.members[0].dtype

    def surrogate(self, f: MemberLosses, weights: bool = False) -> tuple[torch.Tensor, float]:
        """One step of every member on its own loss (:class:`MemberBook`); masks only."""
        if weights:
            raise PBInputError("batched runs train masks only (supermask); train weights with "
                               "one run at a time")
        return super().surrogate(f, weights=False)

    def check_finite(self, where: str, flags: dict[str, str]) -> None:
        """Refuse logits that became NaN or inf, naming the member and its learning rate."""
        for m in self.members:
            if not bool(torch.isfinite(m.r).all()):
                c = m.config
                raise PBInputError(
                    f"the mask logits of the run with lr={c.lr}, seed={c.seed} became NaN or inf "
                    f"in {where}: the learning rate is too large for {flags['optimizer']} "
                    f"{c.optimizer}; lower it in {flags['masks']} or leave it out of the batch")

    def mode_mask(self) -> torch.Tensor:
        """(G, d)."""
        return torch.stack([m.mode_mask() for m in self.members])

    def sample_masks(self, k: int) -> torch.Tensor:
        """(G, k, d), member g's from its generator."""
        return torch.stack([m.sample_masks(k) for m in self.members])
