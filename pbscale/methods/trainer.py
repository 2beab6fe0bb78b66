"""One optimizer over mask logits for every method of the registry: :class:`MethodConfig`,
:class:`MaskTrainer` (one run; the method's behaviour comes from its
:class:`pbscale.methods.registry.Family`) and :class:`MaskTrainerGroup` (G MC runs stepping
together)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from pbexact.errors import PBInputError
from pbexact.parametrizations import get_parametrization

from .cp import cp_temperature
from .mc import BatchedLoss, Estimate, dense_regularizer, mc_gradient, surrogate_loss
from .registry import MethodConfig, names
from .samplers import auto_chunk


class MaskTrainer:
    """Mask logits r of shape (P,) and one optimizer step per call of :meth:`step`.

    theta starts at 0.5 for every weight (`sec:app_maskednnregression`): r = logits(0.5) of the
    parametrization, and r = 0 for CP (sigmoid(0 / tau) = 0.5).
    """

    def __init__(self, config: MethodConfig, d: int, total_steps: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 bytes_per_sample: int | None = None) -> None:
        self.config = config.validate()
        self.d = d
        self.total_steps = max(int(total_steps), 1)
        self.device = torch.device(device)
        self.param = get_parametrization(config.param)
        self.family = config.family
        r0 = self.family.initial_scores(self.param, d,
                                        torch.Generator().manual_seed(config.seed))
        self.r = nn.Parameter(r0.to(device=self.device, dtype=dtype))
        opt_cls = torch.optim.RMSprop if config.optimizer == "rmsprop" else torch.optim.SGD
        self.opt = opt_cls([self.r], lr=config.lr)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        #: the learned control of REBAR/RELAX and its optimizers (None, [] for the others)
        self.control, self.control_opts = self.family.make_control(
            d, config.lr, torch.Generator().manual_seed(config.seed), device=self.device,
            dtype=dtype)
        if config.chunk is not None:
            self.chunk = min(config.chunk, config.n)
        else:
            per_sample = bytes_per_sample or 16 * d
            self.chunk = auto_chunk(config.n, per_sample, self.device)
        self.step_count = 0
        #: :class:`pbscale.distributed.Shard` of a torchrun launch (MC samples split over ranks)
        self.shard = None
        #: sizes of the layers the flat logits cover and the fraction kept per layer (edge-popup;
        #: pruning sets them from the network and --target)
        self.layers: tuple[int, ...] = (d,)
        self.target = 1.0

    @property
    def method(self) -> str:
        return self.config.method

    def theta(self) -> torch.Tensor:
        """Mask probabilities, shape (d,) (CP: its hard mask)."""
        with torch.no_grad():
            return self.family.theta(self)

    def tau(self) -> float:
        """CP's temperature schedule at this step (:func:`cp_temperature`)."""
        c = self.config
        return cp_temperature(self.step_count, self.total_steps, c.cp_final_tau, c.cp_every)

    def temperature(self) -> float:
        """The method's relaxation temperature now (CP: :meth:`tau`; NaN for the others)."""
        return self.family.temperature(self)

    def uniforms(self, n: int) -> torch.Tensor:
        """(n, d) uniforms from the trainer's generator (the hybrid estimators' noise)."""
        return torch.rand((n, self.d), generator=self.generator, dtype=self.r.dtype,
                          device=self.device)

    def gradient(self, f: BatchedLoss, record: list | None = None) -> Estimate:
        """This step's gradient estimate over r (P,) and training loss, without updating r.

        With ``record`` (a list), the losses the weights are trained on are appended to it with
        their autograd graphs (MC: J of the n sampled masks, in chunks; CP: the relaxed loss);
        the hybrid methods do not support it."""
        c = self.config
        if record is not None and not self.family.trains_weights:
            raise PBInputError(
                f"{self.family.text} cannot train network weights; use one of "
                f"{', '.join(names('prune-joint', logits=True))}"
            )
        est, theta_fn = self.family.gradient(self, f, record)
        if c.lam > 0:
            _, reg_grad = dense_regularizer(self.r, theta_fn, c.lam)
            est.grad = est.grad + reg_grad
        return est

    def surrogate(self, f: BatchedLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        """This step's estimate as a surrogate loss (:func:`surrogate_loss`): a scalar whose
        autograd gradient in r is the method's gradient estimate (with the dense regularizer),
        and, with ``weights=True``, whose gradient in the network weights is that of the method's
        loss on the weights (MC: the mean of J over the n sampled masks; CP: the relaxed loss),
        so that one ``backward`` fills both. Returns (surrogate (), training loss)."""
        record: list | None = [] if weights else None
        est = self.gradient(f, record)
        weight_loss: torch.Tensor | float = 0.0
        if record:
            weight_loss = self.family.weight_loss(record, self.config.n)
        return surrogate_loss(est.grad.to(self.r.dtype), self.r, weight_loss), est.loss

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers over r (the learning-rate schedules of :mod:`pbscale.loop` act on
        these; the REBAR/RELAX control optimizers keep their own rates)."""
        return [self.opt]

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def apply(self) -> None:
        """The optimizer step on r from r.grad, then the parametrization's projection (the
        direct parametrization's clamp to [eps, 1 - eps])."""
        self.opt.step()
        with torch.no_grad():
            self.r.copy_(self.param.project(self.r))
        self.step_count += 1

    def step(self, f: BatchedLoss) -> float:
        """One optimizer step on r with this method's gradient of E[f]; returns the training loss
        (mean sampled loss; CP: loss of its hard mask)."""
        self.zero_grad()
        value, loss = self.surrogate(f)
        value.backward()
        self.apply()
        return loss

    def mode_mask(self) -> torch.Tensor:
        """The family's deterministic mask (d,): the most probable mask 1[theta > 1/2] (CP:
        1[r > 0]; hard-concrete: its test-time gates)."""
        with torch.no_grad():
            return self.family.eval_mask(self)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the logits and masks."""
        return self.r.dtype

    def check_finite(self, where: str, flags: dict[str, str]) -> None:
        """Refuse logits that became NaN or inf, naming the cause (the learning rate and the
        tool's flag for it, ``flags["masks"]``)."""
        if not bool(torch.isfinite(self.r).all()):
            c = self.config
            raise PBInputError(
                f"the mask logits became NaN or inf in {where}: the learning rate "
                f"{c.lr} is too large for {flags['optimizer']} {c.optimizer}; "
                f"lower {flags['masks']}"
            )

    def config_dict(self) -> dict:
        return self.config.to_dict()

    def sample_masks(self, k: int) -> torch.Tensor:
        """k masks (k, d) from the current distribution (CP: its hard mask k times)."""
        return self.family.sample_masks(self, k)

    def state_dict(self) -> dict:
        return {
            "r": self.r.detach().cpu(),
            "opt": self.opt.state_dict(),
            "generator": self.generator.get_state(),
            "step_count": self.step_count,
            "control": self.control.state_dict() if self.control is not None else None,
            "control_opts": [o.state_dict() for o in self.control_opts],
        }

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.r.copy_(state["r"].to(self.r.device))
        self.opt.load_state_dict(state["opt"])
        self.generator.set_state(state["generator"])
        self.step_count = int(state["step_count"])
        if self.control is not None:
            self.control.load_state_dict(state["control"])
        for o, s in zip(self.control_opts, state["control_opts"]):
            o.load_state_dict(s)


class MaskTrainerGroup:
    """G MC runs that step together: one :class:`pbscale.loop_types.Method` over G
    :class:`MaskTrainer` members (logits (P,), optimizer and generator each), whose n samples
    per step are drawn member by member from the members' own generators and evaluated in one
    batched call f: (k, G, d) -> (k, G) (:func:`mc_gradient` with leading dimension G and one
    generator per run), so member g's estimate, step and history are those of the separate run
    with its configuration (to the round-off of the batched loss).

    The members share the estimator, n and the parametrization (one :func:`mc_gradient` call);
    learning rate, optimizer, seed and lam are their own. Masks only (supermask); the loop's
    own ``generator`` is not used (each member's is, and each is checkpointed in
    :meth:`state_dict`). The losses of the current epoch are kept per member
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
        self.generator = torch.Generator(device=self.device)  # the loop's; members use theirs
        self.epoch_losses: list[list[float]] = [[] for _ in configs]

    @staticmethod
    def check(configs: Sequence[MethodConfig]) -> None:
        """Refuse (:class:`PBInputError`) configurations that cannot form a group."""
        if not configs:
            raise PBInputError("no runs to train; give at least one seed and learning rate")
        for c in configs:
            c.validate()
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

