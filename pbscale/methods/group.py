"""G MC runs that step together (:class:`MaskTrainerGroup`), the method of batched seeds
(:mod:`pbscale.batched_seeds`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from pbexact.errors import PBInputError

from ..loop_types import BatchedLoss
from .estimate import dense_regularizer, surrogate_loss
from .mc import mc_gradient
from .registry import MethodConfig, names
from .samplers import auto_chunk
from .trainer import MaskTrainer


class MaskTrainerGroup:
    """G MC runs that step together: one :class:`pbscale.loop_types.Method` over G
    :class:`MaskTrainer` members (logits (P,), optimizer and generator each), whose n samples
    per step are drawn member by member from the members' own generators and evaluated in one
    batched call f: (k, G, d) -> (k, G) (:func:`mc_gradient` with leading dimension G and one
    generator per run), so member g's estimate, step and history are those of the separate run
    with its configuration (to the round-off of the batched loss).

    The members share the estimator, n and the parametrization (one :func:`mc_gradient` call);
    learning rate, optimizer, seed and lam are their own. Masks only (supermask); the group's
    ``generator`` (the loop's stream) is not used (each member's is, and each is checkpointed
    in :meth:`state_dict`). The losses of the current epoch are kept per member
    (:meth:`pop_epoch_losses`). ``r``, :meth:`theta`, :meth:`mode_mask` and
    :meth:`sample_masks` stack the members' (leading dimension G)."""

    def __init__(self, configs: Sequence[MethodConfig], d: int, total_steps: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 bytes_per_sample: int | None = None) -> None:
        self.check(configs)
        self.members = [MaskTrainer(c, d, total_steps, device, dtype, bytes_per_sample)
                        for c in configs]
        self.d = d
        self.device = torch.device(device)
        self.param = self.members[0].param
        self.n = configs[0].n
        per_sample = bytes_per_sample or 16 * d
        explicit = [c.chunk for c in configs if c.chunk is not None]
        self.chunk = min([auto_chunk(self.n, per_sample * len(configs), self.device), *explicit])
        #: the run's stream for the loop (the members draw from their own generators)
        self.generator = torch.Generator(device=self.device).manual_seed(0)
        self.epoch_losses: list[list[float]] = [[] for _ in configs]

    @staticmethod
    def check(configs: Sequence[MethodConfig]) -> None:
        """Refuse (:class:`PBInputError`) configurations that cannot form a group."""
        if not configs:
            raise PBInputError("no runs to train; give at least one seed and learning rate")
        for c in configs:
            if "batched" not in c.family.commands:
                raise PBInputError(f"batched runs are MC runs ({', '.join(names('batched'))}); "
                                   f"run {c.method} with python -m pbscale.regress")
        seen = [repr(sorted(c.to_dict().items())) for c in configs]
        if len(set(seen)) != len(seen):
            raise PBInputError("a run is listed twice in the batch (same seed, learning rate and "
                               "settings); list each once")
        for field in ("n", "method", "param"):
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
        est = mc_gradient(f, R, self.param, self.method, self.n,
                          [m.generator for m in self.members], self.chunk)
        grads = list(est.grad.unbind(0))
        for g, m in enumerate(self.members):
            if m.config.lam > 0:
                grads[g] = grads[g] + dense_regularizer(m.r, m.param.theta, m.config.lam)[1]
        losses = est.loss.tolist()
        for kept, loss in zip(self.epoch_losses, losses):
            kept.append(loss)
        grad = torch.stack(grads).to(R.dtype)
        return surrogate_loss(grad, R), sum(losses) / len(losses)

    def pop_epoch_losses(self) -> list[float]:
        """Each member's mean training loss over the steps since the last call (NaN if none),
        as a separate run's loop computes it; then starts afresh."""
        out = [sum(ls) / len(ls) if ls else math.nan for ls in self.epoch_losses]
        self.epoch_losses = [[] for _ in self.members]
        return out

    def check_finite(self, where: str, flags: dict[str, str]) -> None:
        """Refuse logits that became NaN or inf, naming the member and its learning rate."""
        for m in self.members:
            if not bool(torch.isfinite(m.r).all()):
                c = m.config
                raise PBInputError(
                    f"the mask logits of the run with lr={c.lr}, seed={c.seed} became NaN or inf "
                    f"in {where}: the learning rate is too large for {flags['optimizer']} "
                    f"{c.optimizer}; lower it in {flags['masks']} or leave it out of the batch")

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for m in self.members for o in m.optimizers]

    def zero_grad(self) -> None:
        for m in self.members:
            m.zero_grad()

    def apply(self) -> None:
        for m in self.members:
            m.apply()

    def mode_mask(self) -> torch.Tensor:
        """(G, d)."""
        return torch.stack([m.mode_mask() for m in self.members])

    def sample_masks(self, k: int) -> torch.Tensor:
        """(G, k, d), member g's from its generator."""
        return torch.stack([m.sample_masks(k) for m in self.members])

    def config_dict(self) -> dict:
        return {"runs": [m.config_dict() for m in self.members]}

    def state_dict(self) -> dict:
        return {"members": [m.state_dict() for m in self.members],
                "epoch_losses": [list(ls) for ls in self.epoch_losses]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["members"]) != len(self.members):
            raise ValueError("member count")
        for m, st in zip(self.members, state["members"]):
            m.load_state_dict(st)
        self.epoch_losses = [list(ls) for ls in state["epoch_losses"]]

