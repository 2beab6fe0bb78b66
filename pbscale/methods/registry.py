"""The method registry: every mask-optimization method of pbscale as one :class:`Family` object,
by name, in :data:`REGISTRY`.

A family is a class whose hooks the trainers and tools call instead of testing method names
(in the spirit of ``torch.nn.utils.prune.BasePruningMethod``): how the logits start, the gradient
of one step (and what it records for the network weights), the probabilities and masks it is
evaluated with, its temperature, its pruning schedule, and the tools it runs in
(:data:`COMMANDS`). The families are registered where they are defined:

* :class:`pbscale.methods.mc.MCFamily`: one per MC estimator of `pbexact.estimators.REGISTRY`
  that needs no J table, derived from the estimator's spec;
* :class:`pbscale.methods.cp.CPFamily` (CP);
* :mod:`pbscale.methods.hybrids`: ST, REBAR and RELAX;
* :mod:`pbscale.methods.magnitude`: MP, GMP and dense training (no mask logits);
* :mod:`pbscale.methods.beyond`: ST-theta (Zhou et al.), hard-concrete L0 and edge-popup.

Every list of methods (CLI choices, sweeps, the microworld's torch methods) is a query of the
registry (:func:`names`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from pbexact.continuation import CP_FINAL_TAU
from pbexact.errors import PBInputError, check_n
from pbexact.parametrizations import PARAMETRIZATIONS, Parametrization

from .samplers import BernoulliSampler

#: The tools a family can run in: ``regress`` (:mod:`pbscale.regress`), ``batched``
#: (:mod:`pbscale.batched_seeds`), ``prune-supermask`` and ``prune-joint`` (:mod:`pbscale.prune`
#: ``--mode``) and ``microworld`` (the vectorized torch runs of
#: :mod:`analysis.microworld_hybrid`; the MC estimators run there on the exact core).
COMMANDS = ("regress", "batched", "prune-supermask", "prune-joint", "microworld")
#: Mask step decays of the pruning experiments (`tab:app_supermask_hypers`,
#: `tab:app_pruning_broad`; fractions of the epochs, multiplier): CP's logits x0.1 at 40% and
#: 60%, MC logits x0.5 at 60%.
CP_MILESTONES, CP_GAMMA = (0.4, 0.6), 0.1
MC_MILESTONES, MC_GAMMA = (0.6,), 0.5
#: Joint MC runs train the dense network for the first 10% of the epochs.
MC_START = 0.1


#: A batched loss: masks z of shape (..., d) to losses (...).
BatchedLoss = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Estimate:
    """One step's gradient over the logits, shape (..., P) (the shape of r), and the mean sampled
    loss: a float for r of shape (P,), else a float64 CPU tensor of shape (...), one per run."""

    grad: torch.Tensor
    loss: float | torch.Tensor



class Trainer(Protocol):
    """What the hooks of a :class:`Family` read and update of one run of mask logits
    (:class:`pbscale.methods.MaskTrainer`): its configuration, logits r (P,), parametrization,
    generator, chunk size, torchrun shard, step counts, REBAR/RELAX control, device, layer sizes
    and kept fraction of per-layer methods, theta (d,) and (n, d) uniforms."""

    config: MethodConfig
    d: int
    r: torch.nn.Parameter
    param: Parametrization
    generator: torch.Generator
    chunk: int
    shard: Any
    step_count: int
    total_steps: int
    control: Any
    control_opts: list[torch.optim.Optimizer]
    device: torch.device
    layers: tuple[int, ...]
    target: float

    def theta(self) -> torch.Tensor: ...

    def uniforms(self, n: int) -> torch.Tensor: ...


class Family:
    """One method (or family member) and the hooks that define it.

    Attributes: ``name`` (CLI value), ``label`` (legend text), ``text`` (messages), ``color``
    (matplotlib colour of its curves), ``commands`` (a subset of :data:`COMMANDS`),
    ``min_samples`` (fewest samples per step; None: the method draws none and ignores n),
    ``any_param`` (every parametrization; else sigmoid only), ``samples`` (draws masks from
    prod Bern(theta) for its estimate: its samples split over torchrun ranks, its evaluation
    mask is the best of sampled masks, pruning rescales its weights dynamically),
    ``deterministic`` (draws nothing: one mask, evaluated as is), ``logits`` (trains mask logits
    with :class:`pbscale.methods.MaskTrainer`; False: a method object of its own),
    ``trains_weights`` (its step gives a loss for the network weights too: joint pruning),
    ``dense_weights`` (trains the weights even in supermask mode), ``cuts`` (prunes to
    ``--target`` by magnitude), ``data_parallel_logits`` (torchrun averages the gradient of
    its logits over the ranks), ``mask_schedule`` ((milestones, gamma) of its logits in
    pruning) and ``joint_warmup`` (fraction of a joint run's epochs trained dense first)."""

    name: str = ""
    label: str = ""
    text: str = ""
    color: str = ""
    commands: tuple[str, ...] = ()
    min_samples: int | None = None
    any_param: bool = False
    samples: bool = False
    deterministic: bool = False
    logits: bool = True
    trains_weights: bool = False
    dense_weights: bool = False
    cuts: bool = False
    data_parallel_logits: bool = False
    mask_schedule: tuple[tuple[float, ...], float] = ((), 1.0)
    joint_warmup: float = 0.0
    #: The pruning settings of its cut schedule that it reads (:mod:`pbscale.prune`: of
    #: ``target``, ``prune_at``, ``gmp_start``, ``gmp_end``, ``gmp_every``).
    prune_settings: tuple[str, ...] = ()
    #: pruning also reports the best of ``--eval-masks`` sampled masks (``sampled_*`` metrics)
    also_sampled: bool = False
    #: the parametrization pruning uses when --param is left out (None: pruning's default)
    prune_param: str | None = None

    def __repr__(self) -> str:
        return f"<method {self.name}>"

    # ------------------------------------------------------------------ configuration

    def check(self, config: MethodConfig) -> None:
        """Refuse (:class:`PBInputError`) a parametrization or n this method does not take."""
        if not self.any_param and config.param != "sigmoid":
            raise PBInputError(
                f"{self.text} is defined for the sigmoid parametrization only; use --param "
                f"sigmoid (other parametrizations: {', '.join(names(any_param=True))})")
        if self.min_samples is not None:
            check_n(config.n, self.text, self.min_samples)

    # ------------------------------------------------------------------ MaskTrainer hooks

    def initial_logits(self, param: Parametrization, d: int) -> torch.Tensor:
        """r_0 (d,) float64: theta = 0.5 for every weight (`sec:app_maskednnregression`)."""
        return param.logits(torch.full((d,), 0.5, dtype=torch.float64))

    def initial_scores(self, param: Parametrization, d: int,
                       generator: torch.Generator) -> torch.Tensor:
        """r_0 (d,) float64 of a run, ``generator`` seeded with its seed (default:
        :meth:`initial_logits`, which draws nothing)."""
        return self.initial_logits(param, d)

    def check_prune(self, config: Any) -> None:
        """Refuse (:class:`PBInputError`) a :class:`pbscale.prune.PruneConfig` setting this
        method does not take (e.g. edge-popup's --target)."""

    def make_control(self, d: int, lr: float, generator: torch.Generator,
                     seeds: int | None = None, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None
                     ) -> tuple[Any, list[torch.optim.Optimizer]]:
        """A learned control and its optimizers (REBAR/RELAX); (None, []) for the others."""
        return None, []

    def theta(self, trainer: Trainer) -> torch.Tensor:
        """The mask probabilities (d,) of the trainer's logits."""
        return trainer.param.theta(trainer.r)

    def eval_mask(self, trainer: Trainer) -> torch.Tensor:
        """The deterministic evaluation mask (d,) (default 1[theta > 1/2]; a gate method's
        values in [0, 1], its zeros pruned)."""
        return (trainer.theta() > 0.5).to(trainer.r.dtype)

    def temperature(self, trainer: Trainer) -> float:
        """The relaxation temperature the trainer is at (NaN: no relaxation)."""
        return math.nan

    def gradient(self, trainer: Trainer, f: BatchedLoss, record: list | None
                 ) -> tuple[Estimate, Callable[[torch.Tensor], torch.Tensor]]:
        """One step's estimate over the logits and the map r -> theta of the dense regularizer;
        with ``record``, the losses the weights train on are appended to it."""
        raise NotImplementedError

    def weight_loss(self, record: list[torch.Tensor], n: int) -> torch.Tensor:
        """The loss of the network weights from what :meth:`gradient` recorded."""
        return sum(J.sum() for J in record) / n

    def sample_masks(self, trainer: Trainer, k: int) -> torch.Tensor:
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


#: Every method, by name, in registration order (MC estimators, CP, hybrids, magnitude).
REGISTRY: dict[str, Family] = {}


def register(family: Family | type[Family]) -> Any:
    """Add a family (an instance, or a class instantiated without arguments) to
    :data:`REGISTRY`; returns its argument, so it works as a class decorator."""
    obj = family() if isinstance(family, type) else family
    if not obj.name or obj.name in REGISTRY:
        raise ValueError(f"method name {obj.name!r} is empty or registered twice")
    unknown = set(obj.commands) - set(COMMANDS)
    if unknown:
        raise ValueError(f"{obj.name}: unknown commands {sorted(unknown)}")
    REGISTRY[obj.name] = obj
    return family


def names(command: str | None = None, **flags: Any) -> tuple[str, ...]:
    """The registered names that run in ``command`` (None: any) and whose attributes equal
    ``flags`` (e.g. ``names("prune-joint", samples=True)``), in registration order."""
    return tuple(f.name for f in REGISTRY.values()
                 if (command is None or command in f.commands)
                 and all(getattr(f, k) == v for k, v in flags.items()))


def get_family(name: str, command: str | None = None) -> Family:
    """The family of method ``name`` (one that runs in ``command``, if given); anything else is
    a one-line :class:`PBInputError` listing the choices."""
    choices = names(command)
    if not isinstance(name, str) or name not in choices:
        raise PBInputError(f"unknown method {name!r}; choose one of {', '.join(choices)}")
    return REGISTRY[name]


OPTIMIZERS = ("rmsprop", "sgd")


@dataclass
class MethodConfig:
    """A mask-optimization method and its hyperparameters (validated before training)."""

    method: str = "loorf"
    n: int = 10
    param: str = "sigmoid"
    lr: float = 0.1
    optimizer: str = "rmsprop"
    seed: int = 0
    chunk: int | None = None
    lam: float = 0.0
    cp_final_tau: float = CP_FINAL_TAU
    cp_every: int = 100

    def validate(self) -> MethodConfig:
        """Raise :class:`PBInputError` on the first bad setting."""
        family = get_family(self.method, "regress")
        if self.param not in PARAMETRIZATIONS:
            raise PBInputError(
                f"unknown parametrization {self.param!r}; "
                f"choose one of {', '.join(PARAMETRIZATIONS)}"
            )
        family.check(self)
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise PBInputError(f"the learning rate must be a positive number, got lr={self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise PBInputError(
                f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
            )
        if self.chunk is not None and (not isinstance(self.chunk, int) or self.chunk < 1):
            raise PBInputError(f"chunk must be a positive integer (or omitted), got {self.chunk}")
        if not (math.isfinite(self.lam) and self.lam >= 0):
            raise PBInputError(f"the regularization weight must be >= 0, got lam={self.lam}")
        if not 0 < self.cp_final_tau <= 1 or self.cp_every < 1:
            raise PBInputError("CP needs 0 < final tau <= 1 and a schedule period >= 1")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def family(self) -> Family:
        """The method's :class:`pbscale.methods.registry.Family`."""
        return get_family(self.method, "regress")
