"""The methods that train mask logits: :class:`LogitsFamily` (the hooks of one gradient step,
which every such family fills in) and :class:`MaskTrainer`, the run loop's method over logits r
of shape (P,) that calls them (one optimizer over r for every method of the registry)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from pbexact.errors import PBInputError
from pbexact.parametrizations import Parametrization, get_parametrization

from ..distributed import RankSync, SampleParallel, Shard
from ..loop_types import BatchedLoss, RunHooks
from .estimate import Estimate, dense_regularizer, surrogate_loss
from .group import MaskTrainerGroup
from .registry import OPTIMIZERS, Family, MethodConfig, Plan, names
from .samplers import BernoulliSampler, auto_chunk, check_sample_memory


class LogitsFamily(Family):
    """A method that trains mask logits with :class:`MaskTrainer`. It reads the mask learning
    rate, optimizer, chunk and L0 weight (add ``"n"`` and ``"param"`` to :attr:`uses` when it
    draws n samples per step and takes any parametrization). Its hooks, each called by the
    trainer with itself (whose fields its constructor set): how the logits start
    (:meth:`initial_logits`), one step's estimate (:meth:`gradient`, and what it records for the
    network weights, :meth:`weight_loss`), the probabilities and masks it is evaluated with
    (:meth:`theta`, :meth:`eval_mask`, :meth:`sample_masks`), its temperature, a learned control
    (:meth:`make_control`), and for the microworld's vectorized runs :meth:`vector_gradient` and
    :meth:`run_theta`."""

    uses = ("lr", "optimizer", "chunk", "lam")

    def make(self, config: MethodConfig, layout: Any, plan: Plan) -> MaskTrainer:
        return MaskTrainer(config, layout.d, plan.mask_steps, layout.device,
                           bytes_per_sample=plan.bytes_per_sample, layers=plan.layers,
                           target=plan.setting("target", 1.0))

    def make_group(self, configs: Sequence[MethodConfig], layout: Any, plan: Plan
                   ) -> MaskTrainerGroup:
        """A :class:`MaskTrainerGroup` of the runs (each member what :meth:`make` builds)."""
        return MaskTrainerGroup(configs, layout, plan)

    # ------------------------------------------------------------------ MaskTrainer hooks

    def initial_logits(self, param: Parametrization, d: int,
                       generator: torch.Generator) -> torch.Tensor:
        """r_0 (d,) float64 of a run (``generator`` seeded with its seed, for random logits):
        theta = 0.5 for every weight (`sec:app_maskednnregression`)."""
        return param.logits(torch.full((d,), 0.5, dtype=torch.float64))

    def make_control(self, d: int, lr: float, generator: torch.Generator,
                     seeds: int | None = None, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None
                     ) -> tuple[Any, list[torch.optim.Optimizer]]:
        """A learned control and its optimizers (REBAR/RELAX); (None, []) for the others."""
        return None, []

    def theta(self, trainer: MaskTrainer) -> torch.Tensor:
        """The mask probabilities (d,) of the trainer's logits."""
        return trainer.param.theta(trainer.r)

    def eval_mask(self, trainer: MaskTrainer) -> torch.Tensor:
        """The deterministic evaluation mask (d,) (default 1[theta > 1/2]; a gate method's
        values in [0, 1], its zeros pruned)."""
        return (trainer.theta() > 0.5).to(trainer.r.dtype)

    def temperature(self, trainer: MaskTrainer) -> float:
        """The relaxation temperature the trainer is at (NaN: no relaxation)."""
        return math.nan

    def gradient(self, trainer: MaskTrainer, f: BatchedLoss, record: list | None
                 ) -> tuple[Estimate, Callable[[torch.Tensor], torch.Tensor]]:
        """One step's estimate over the logits and the map r -> theta of the dense regularizer;
        with ``record``, the losses the weights train on are appended to it."""
        raise NotImplementedError

    def weight_loss(self, record: list[torch.Tensor], n: int) -> torch.Tensor:
        """The loss of the network weights from what :meth:`gradient` recorded."""
        return sum(J.sum() for J in record) / n

    def sample_masks(self, trainer: MaskTrainer, k: int) -> torch.Tensor:
        """k masks (k, d) from the trainer's current distribution."""
        return BernoulliSampler(trainer.theta(), trainer.generator).next(k)

    # ------------------------------------------------------------------ microworld hooks

    def vector_gradient(self, f: BatchedLoss, r: torch.Tensor,
                        uniforms: Callable[[], torch.Tensor], control: Any,
                        control_opts: list[torch.optim.Optimizer], tau: float) -> torch.Tensor:
        """The gradient over sigmoid logits r (seeds, d) of one vectorized microworld step
        (``uniforms()``: (n, seeds, d); ``tau``: CP's temperature at this step)."""
        raise NotImplementedError

    def run_theta(self, r: torch.Tensor) -> torch.Tensor:
        """The probabilities (seeds, d) a vectorized microworld run logs at sigmoid logits r."""
        return torch.sigmoid(r)


class MaskTrainer:
    """Mask logits r of shape (P,) and one optimizer step per call of :meth:`step`; the run
    loop's :class:`pbscale.loop_types.Method` of every :class:`LogitsFamily`.

    theta starts at 0.5 for every weight (`sec:app_maskednnregression`): r = logits(0.5) of the
    parametrization, and r = 0 for CP (sigmoid(0 / tau) = 0.5). ``generator`` (on ``device``,
    seeded with the config's seed) is the run's random stream: the run loop draws the batch
    order and the evaluation from it too. ``layers``: the sizes of the layers the flat logits
    cover (None: one layer of d) and ``target`` the fraction a per-layer method keeps
    (edge-popup); both fixed here.
    """

    def __init__(self, config: MethodConfig, d: int, total_steps: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 bytes_per_sample: int | None = None, *,
                 layers: tuple[int, ...] | None = None, target: float = 1.0) -> None:
        family = config.family
        if not isinstance(family, LogitsFamily):
            raise PBInputError(f"{family.text} trains no mask logits; use one of "
                               f"{', '.join(names(logits=True))}")
        self.config = config
        self.family = family
        self.d = d
        self.total_steps = max(int(total_steps), 1)
        self.device = torch.device(device)
        self.layers: tuple[int, ...] = tuple(layers) if layers is not None else (d,)
        self.target = float(target)
        self.param = get_parametrization(config.param)
        r0 = family.initial_logits(self.param, d, torch.Generator().manual_seed(config.seed))
        self.r = nn.Parameter(r0.to(device=self.device, dtype=dtype))
        self.opt = OPTIMIZERS[config.optimizer]([self.r], lr=config.lr)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        #: the learned control of REBAR/RELAX and its optimizers (None, [] for the others)
        self.control, self.control_opts = family.make_control(
            d, config.lr, torch.Generator().manual_seed(config.seed), device=self.device,
            dtype=dtype)
        per_sample = bytes_per_sample or 16 * d
        if config.chunk is not None:
            self.chunk = min(config.chunk, config.n)
        else:
            self.chunk = auto_chunk(config.n, per_sample, self.device)
        if family.samples:  # n masks of d entries per step: bounded by memory
            check_sample_memory(config.n, d, self.chunk, per_sample, self.device)
        self.step_count = 0
        #: the L0 strength per weight in force (``config.lam`` unless a controller steers it,
        #: :class:`pbscale.lam_control.LamController`; checkpointed)
        self.lam = float(config.lam)
        #: this rank's :class:`pbscale.distributed.Shard` once :meth:`distribute` split the
        #: samples over torchrun ranks (None: all samples here)
        self.shard: Shard | None = None

    @property
    def method(self) -> str:
        return self.config.method

    # ------------------------------------------------------------------ capabilities

    @property
    def eval_sampled(self) -> bool:
        """Evaluated by the best of sampled masks (else by :meth:`mode_mask`)."""
        return self.family.eval_sampled

    @property
    def also_sampled(self) -> bool:
        """Pruning also reports the best of its sampled masks."""
        return self.family.also_sampled

    #: its evaluation mask differs from the masks training saw: pruning recomputes BatchNorm
    #: statistics for it
    recalibrate_bn = True

    def distribute(self, shard: Shard) -> list[RunHooks]:
        """The run-loop strategies of this method under torchrun: its samples split over the
        ranks (:attr:`Family.split_samples`), or data parallelism (the gradient of r averaged
        with the weights', :meth:`synced_params`); either way a SIGTERM stops every rank."""
        if self.family.split_samples:
            self.shard = shard
            return [SampleParallel()]
        return [RankSync()]

    def synced_params(self) -> list[torch.Tensor]:
        """The parameters whose gradients data parallelism averages over the ranks."""
        return [] if self.family.split_samples else [self.r]

    def info(self) -> dict:
        """The unhashed facts of config.json's "info" (the chunk it evaluates at once)."""
        return {"chunk": self.chunk}

    # ------------------------------------------------------------------ one step

    def theta(self) -> torch.Tensor:
        """Mask probabilities, shape (d,) (CP: its hard mask)."""
        with torch.no_grad():
            return self.family.theta(self)

    def temperature(self) -> float:
        """The method's relaxation temperature now (CP: its schedule; NaN for the others)."""
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
        if record is not None and not self.family.trains_weights:
            raise PBInputError(
                f"{self.family.text} cannot train network weights; use one of "
                f"{', '.join(names('prune-joint', logits=True))}"
            )
        est, theta_fn = self.family.gradient(self, f, record)
        if self.lam > 0:
            _, reg_grad = dense_regularizer(self.r, theta_fn, self.lam)
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
            "lam": self.lam,
        }

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.r.copy_(state["r"].to(self.r.device))
        self.opt.load_state_dict(state["opt"])
        self.generator.set_state(state["generator"])
        self.step_count = int(state["step_count"])
        self.lam = float(state.get("lam", self.config.lam))  # older checkpoints: the config's
        if self.control is not None:
            self.control.load_state_dict(state["control"])
        for o, s in zip(self.control_opts, state["control_opts"]):
            o.load_state_dict(s)
