"""G runs of one mask-logits method that step together (:class:`MaskTrainerGroup`), the method
of batched seeds (:mod:`pbscale.batched_seeds`), and the view of its members as one trainer with a
leading run dimension that a family's gradient hook steps (:class:`StackedTrainer`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pbexact.errors import PBInputError

from ..loop_types import BatchedLoss
from .estimate import dense_regularizer, surrogate_loss
from .registry import MethodConfig, Plan, names
from .samplers import auto_chunk


@dataclass
class FlatLayout:
    """What :meth:`pbscale.methods.Family.make` reads of a layout: one flat mask of d weights on
    ``device`` (for a group built without a network, :meth:`MaskTrainerGroup.flat`)."""

    d: int
    device: torch.device


class StackedTrainer:
    """A group's members as one trainer whose logits ``r`` are (G, P): what a family's
    :meth:`pbscale.methods.LogitsFamily.gradient` reads of its trainer, so that the family's own
    step runs once for all members (its masks (k, G, d) through f in one call): the shared
    settings (config, parametrization, step count, layers) are the first member's (a group's
    members share them, :meth:`MaskTrainerGroup.check`); ``generator`` is the members'
    generators (one per run, :func:`pbscale.methods.mc_gradient`), :meth:`uniforms` draws
    (n, G, d), member g's (n, d) from member g's generator, and ``control`` stacks the
    members' learned controls (:meth:`pbscale.methods.HybridControl.stack`)."""

    def __init__(self, members: Sequence[Any], r: torch.Tensor, chunk: int) -> None:
        first = members[0]
        self.members = members
        self.r = r
        self.chunk = chunk
        self.shard = None
        self.generator = [m.generator for m in members]
        for name in ("config", "family", "param", "d", "device", "total_steps", "step_count",
                     "layers", "target"):
            setattr(self, name, getattr(first, name))
        self.control = (None if first.control is None
                        else first.control.stack([m.control for m in members]))
        self.control_opts = [o for m in members for o in m.control_opts]

    def uniforms(self, n: int) -> torch.Tensor:
        """(n, G, d), column g from member g's generator (:meth:`MaskTrainer.uniforms`)."""
        return torch.stack([m.uniforms(n) for m in self.members], dim=1)


class MemberBook:
    """What a group of G runs keeps per member, one definition for the regression groups
    (:class:`MaskTrainerGroup`) and the pruning groups (:mod:`pbscale.prune_group`): each
    member's training losses of the epoch (:meth:`record`, :meth:`pop_epoch_losses`) and the
    group's configuration and checkpoint state, the members' own in order. ``book`` holds the
    members' methods (each with ``optimizers``, ``zero_grad``, ``apply``, ``config_dict``,
    ``state_dict`` and ``load_state_dict``), stepped and saved one by one."""

    def __init__(self, book: Sequence[Any]) -> None:
        self.book = book
        self.epoch_losses: list[list[float]] = [[] for _ in book]

    def record(self, losses: Sequence[float]) -> None:
        """Keep each member's training loss of one step."""
        for kept, loss in zip(self.epoch_losses, losses):
            kept.append(loss)

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
        """Each member's optimizer steps its own parameters."""
        for m in self.book:
            m.apply()

    def config_dict(self) -> dict:
        return {"runs": [m.config_dict() for m in self.book]}

    def state_dict(self) -> dict:
        return {"members": [m.state_dict() for m in self.book],
                "epoch_losses": [list(ls) for ls in self.epoch_losses]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["members"]) != len(self.book):
            raise ValueError("member count")
        for m, st in zip(self.book, state["members"]):
            m.load_state_dict(st)
        self.epoch_losses = [list(ls) for ls in state["epoch_losses"]]


class MaskTrainerGroup(MemberBook):
    """G runs of one method that step together: one :class:`pbscale.loop_types.Method` over G
    members (:class:`MaskTrainer` s made by the family, :meth:`pbscale.methods.Family.make`:
    logits (P,), optimizer, generator and learned control each), whose step is the family's
    own gradient hook called once on the members stacked (:class:`StackedTrainer`): every
    member's samples (or uniforms) drawn from its own generator, all G runs' masks evaluated in
    one batched call f: (k, G, d) -> (k, G), and member g's estimate, step and history those of
    the separate run with its configuration (to the round-off of the batched loss). MC methods
    draw n samples per run in chunks (:func:`pbscale.methods.mc_gradient` with one generator per
    run); CP differentiates its relaxed masks at the members' temperature; ST, REBAR, RELAX,
    ST-theta, hard-concrete and edge-popup differentiate through their masks (REBAR/RELAX train
    each member's control by its own optimizers).

    The members share the method, n, the parametrization and the method's own settings;
    learning rate, optimizer, seed and lam are their own. Masks only (supermask); the group's
    ``generator`` (the loop's stream) is not used (each member's is, and each is checkpointed
    in :meth:`state_dict`). The losses of the current epoch are kept per member
    (:meth:`pop_epoch_losses`). ``r``, :meth:`theta`, :meth:`mode_mask` and
    :meth:`sample_masks` stack the members' (leading dimension G)."""

    def __init__(self, configs: Sequence[MethodConfig], layout: Any, plan: Plan) -> None:
        self.check(configs)
        self.members = [c.family.make(c, layout, plan) for c in configs]
        self.d = layout.d
        self.device = torch.device(layout.device)
        self.family = configs[0].family
        self.param = self.members[0].param
        self.n = configs[0].n
        per_sample = plan.bytes_per_sample or 16 * self.d
        explicit = [c.chunk for c in configs if c.chunk is not None]
        self.chunk = min([auto_chunk(self.n, per_sample * len(configs), self.device), *explicit])
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
            if "batched" not in c.family.commands:
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

    def surrogate(self, f: BatchedLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        """One step's surrogate over the members: f: (k, G, d) -> (k, G); the value's gradient
        in member g's logits is its estimate (with its dense regularizer). Returns (surrogate,
        mean over the members of their training losses); each member's loss is kept for
        :meth:`pop_epoch_losses`."""
        if weights:
            raise PBInputError("batched runs train masks only (supermask); train weights with "
                               "one run at a time")
        R = torch.stack([m.r for m in self.members])
        est, theta_fn = self.family.gradient(StackedTrainer(self.members, R, self.chunk), f,
                                             None)
        grads = list(est.grad.unbind(0))
        for g, m in enumerate(self.members):
            if m.config.lam > 0:
                grads[g] = grads[g] + dense_regularizer(m.r, theta_fn, m.config.lam)[1]
        losses = est.loss.tolist()
        self.record(losses)
        grad = torch.stack(grads).to(R.dtype)
        return surrogate_loss(grad, R), sum(losses) / len(losses)

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


