"""The methods that train mask logits: :class:`LogitsFamily` (the hooks of one gradient step,
each with explicit arguments: the logits and a :class:`StepArgs`, returning a
:class:`Gradient`) and :class:`MaskTrainer`, the run loop's method over logits r of shape (P,)
that holds the run's state and calls them (one optimizer over r for every method of the
registry)."""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from pbexact.errors import PBInputError
from pbexact.parametrizations import Parametrization, get_parametrization
from pbscale.runs.contracts import BatchedLoss, ResumeWarning

from .counter_stream import CounterStream
from .estimate import Estimate, dense_regularizer, surrogate_loss
from .optimizers import mask_optimizer
from .registry import Capabilities, Family, MethodConfig, Plan, Settings, names
from .samplers import BernoulliSampler, auto_chunk, check_sample_memory
from .schedules import KeptFraction


@dataclass(frozen=True)
class StepArgs:
    """What one step (or evaluation) of a method over mask logits is given besides the loss
    and the logits: every argument explicit, built afresh by :class:`MaskTrainer` for each call
    (a method reads no trainer state, in the spirit of optax's explicit state).

    ``index``: the mask-training steps taken before this one, of ``total`` (>= 1; CP's
    temperature schedule counts them). ``layers``: the sizes of the layers the flat logits
    cover, summing to ``d``. ``n``: samples per step; ``param``: the parametrization;
    ``settings``: the family's own :class:`pbscale.methods.registry.Settings`; ``target``: the
    kept fraction of a per-layer method (edge-popup; 1 where the tool has none), of the
    count of each layer's variables, or, with ``kept_fraction`` (channel variables), of the
    cost that maps bool keep masks (n, d) to the fractions (n,) each keeps
    (:data:`pbscale.methods.schedules.KeptFraction`; None: of the count), and ``coupled`` the
    coupled groups such a budgeted cut never empties (int64 (m, L) padded with d; None: none,
    :func:`pbscale.methods.schedules.keep_within`); ``chunk``:
    samples evaluated at once. ``generator``: the run's random stream (``dtype`` and ``device``:
    the logits'); ``stream``: on the CPU the run's counter-based stream of MC samples
    (:class:`pbscale.methods.counter_stream.CounterStream`, seeded with the run's seed; None on a
    GPU, where the MC samples come from ``generator``). ``weights``: the network weights train
    on this step's loss (joint pruning:
    :attr:`Gradient.weight_loss` is wanted). ``shard``: this rank's rows under sample
    parallelism (:class:`pbscale.execution.distributed.Shard`, set by that strategy; None: all
    samples here). ``control``, ``control_opts``: a learned control and its optimizers
    (REBAR/RELAX). ``state``: the family's own per-run state as the last step left it
    ({name: tensor}, from :meth:`LogitsFamily.initial_state`; a step returns the next one in
    :attr:`Gradient.state`; checkpointed with the run)."""

    index: int
    total: int
    d: int
    layers: tuple[int, ...]
    n: int
    param: Parametrization
    settings: Settings
    target: float
    chunk: int
    generator: torch.Generator
    dtype: torch.dtype
    device: torch.device
    weights: bool = False
    kept_fraction: KeptFraction | None = None
    coupled: torch.Tensor | None = None
    shard: Any = None
    stream: CounterStream | None = None
    control: Any = None
    control_opts: tuple[torch.optim.Optimizer, ...] = ()
    state: dict[str, torch.Tensor] = field(default_factory=dict)

    def uniforms(self, n: int) -> torch.Tensor:
        """(n, d) uniforms from the run's generator (the noise of ST, the hybrids, the
        gates)."""
        return torch.rand((n, self.d), generator=self.generator, dtype=self.dtype,
                          device=self.device)


@dataclass
class Gradient:
    """What one step of a method over logits returns: its estimate over the logits
    (:class:`Estimate`), the map r -> theta of its dense L0 regularizer (None: it has no L0
    term, so ``lam`` is not among its ``caps.uses``), and, when the step's
    :attr:`StepArgs.weights` asks for it, the loss the network weights train on (with its
    autograd graph; None: nothing for the weights). ``state``: the family's per-run state after
    this step (it replaces :attr:`StepArgs.state`; None: unchanged)."""

    estimate: Estimate
    theta: Callable[[torch.Tensor], torch.Tensor] | None
    weight_loss: torch.Tensor | None = None
    state: dict[str, torch.Tensor] | None = None


class LogitsFamily(Family):
    """A method that trains mask logits with :class:`MaskTrainer`. Its hooks take explicit
    arguments (the logits r and a :class:`StepArgs`): how the logits start
    (:meth:`initial_logits`), its own per-run state (:meth:`initial_state`: passed in as
    :attr:`StepArgs.state`, the next returned in :attr:`Gradient.state`, checkpointed with the
    run), one step's estimate (:meth:`gradient`, returning a :class:`Gradient`), the
    probabilities and masks it is evaluated with (:meth:`theta`, :meth:`eval_mask`,
    :meth:`sample_masks`), its temperature and a learned control (:meth:`make_control`);
    the microworld's vectorized runs take a family that also implements
    :class:`MicroworldHooks`. Its capabilities name ``lr`` and ``optimizer`` (mask logits), and
    ``lam`` when it has an L0 term."""

    caps = Capabilities(uses=("lr", "optimizer", "lam"))

    #: The arguments of each hook a family may write, as it must take them.
    HOOKS: ClassVar[dict[str, tuple[str, ...]]] = {
        "gradient": ("self", "f", "r", "at"), "initial_state": ("self", "at"),
        "theta": ("self", "r", "at"), "eval_mask": ("self", "r", "at"),
        "sample_masks": ("self", "r", "k", "at"), "temperature": ("self", "at")}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse, where the family is defined, a hook that does not take the contract's
        arguments (:data:`HOOKS`), in one line naming what to write."""
        super().__init_subclass__(**kwargs)
        for name, wanted in cls.HOOKS.items():
            hook = vars(cls).get(name)
            if hook is None:
                continue
            got = tuple(inspect.signature(hook).parameters)
            if got != wanted:
                raise TypeError(
                    f"{cls.__name__}.{name}({', '.join(got)}) does not take the contract's "
                    f"arguments; write {name}({', '.join(wanted)}) (from pbscale.methods import "
                    "Gradient, StepArgs; at.n, at.settings, at.state, at.uniforms(n); "
                    "docs/adding_a_method.md)")

    def make(self, config: MethodConfig, layout: Any, plan: Plan) -> MaskTrainer:
        return MaskTrainer(config, layout.d, plan.mask_steps, layout.device,
                           bytes_per_sample=plan.bytes_per_sample, layers=plan.layers,
                           target=plan.setting("target", 1.0),
                           joint=plan.weight_optimizer is not None, world=plan.world,
                           l0_weights=plan.l0_weights, kept_fraction=plan.kept_fraction,
                           coupled=plan.coupled)

    # ------------------------------------------------------------------ the method

    def initial_logits(self, param: Parametrization, d: int,
                       generator: torch.Generator) -> torch.Tensor:
        """r_0 (d,) float64 of a run (``generator`` seeded with its seed, for random logits):
        theta = 0.5 for every weight (`sec:app_maskednnregression`)."""
        return param.logits(torch.full((d,), 0.5, dtype=torch.float64))

    def initial_state(self, at: StepArgs) -> dict[str, torch.Tensor]:
        """The family's own per-run state before the first step ({name: tensor} on
        ``at.device``, e.g. a moving-average baseline; default none). Each step reads it as
        ``at.state`` and returns the next in :attr:`Gradient.state`; the trainer keeps it, per
        run (a group member has its own) and in the run's checkpoint."""
        return {}

    def make_control(self, d: int, lr: float, generator: torch.Generator,
                     seeds: int | None = None, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None
                     ) -> tuple[Any, list[torch.optim.Optimizer]]:
        """A learned control and its optimizers (REBAR/RELAX); (None, []) for the others."""
        return None, []

    def gradient(self, f: BatchedLoss, r: torch.Tensor, at: StepArgs) -> Gradient:
        """One step's estimate over the logits r (d,) of the batched loss f (masks (k, d) ->
        (k,)), from the step's arguments ``at`` (its draws from ``at.generator``)."""
        raise NotImplementedError

    def theta(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        """The mask probabilities (d,) at logits r."""
        return at.param.theta(r)

    def keep_score(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        """How strongly the method keeps each variable at logits r (d,), larger first: what
        ``--budget`` fills and cuts the evaluated mask by (default the probabilities theta)."""
        return self.theta(r, at)

    def eval_mask(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        """The deterministic evaluation mask (d,) at logits r (default 1[theta > 1/2]; a gate
        method's values in [0, 1], its zeros pruned)."""
        return (self.theta(r, at) > 0.5).to(r.dtype)

    def temperature(self, at: StepArgs) -> float:
        """The relaxation temperature at the step ``at`` (NaN: no relaxation)."""
        return math.nan

    def sample_masks(self, r: torch.Tensor, k: int, at: StepArgs) -> torch.Tensor:
        """k masks (k, d) from the distribution at logits r (drawn from ``at.generator``)."""
        return BernoulliSampler(self.theta(r, at), at.generator).next(k)



class MicroworldHooks:
    """The microworld profile of a family over mask logits: the hooks of the vectorized torch
    runs of :mod:`analysis.microworld.hybrid` (every seed's logits at once, sigmoid logits
    only). Only the families whose ``caps.commands`` name ``microworld`` implement it (CP, ST,
    REBAR, RELAX: ``class CPFamily(LogitsFamily, MicroworldHooks)``); the MC estimators run
    in the microworld on pbexact's exact core instead."""

    def vector_gradient(self, f: BatchedLoss, r: torch.Tensor,
                        uniforms: Callable[[], torch.Tensor], control: Any,
                        control_opts: list[torch.optim.Optimizer], tau: float) -> torch.Tensor:
        """The gradient over sigmoid logits r (seeds, d) of one vectorized microworld step
        (``uniforms()``: (n, seeds, d); ``tau``: CP's temperature at this step)."""
        raise NotImplementedError

    def run_theta(self, r: torch.Tensor) -> torch.Tensor:
        """The probabilities (seeds, d) a vectorized microworld run logs at sigmoid logits r."""
        return torch.sigmoid(r)


#: What a resumed run does when its checkpoint holds no state of the MC samples' stream.
STREAM_NOT_RESUMED = (
    "it holds no state of the MC samples' stream (written before the stream existed, or on a "
    "GPU), so the samples go on from the run's seed at the stream's start: from here the run's "
    "numbers differ from an uninterrupted run's")


#: What a resumed run does when its checkpoint holds the CPU's stream of MC samples and the run
#: has none (on a GPU, whose samplers draw from the run's generator).
STREAM_NOT_USED = (
    "it holds the MC samples' CPU stream (written on the CPU), which the run on {device} does "
    "not use: its samples come from the device's generator, so from here the run's numbers "
    "differ from an uninterrupted run's (resume on the CPU, --device cpu, to continue the "
    "stream)")


class MaskTrainer:
    """Mask logits r of shape (P,) and one optimizer step per call of :meth:`step`; the run
    loop's :class:`pbscale.runs.contracts.Method` of every :class:`LogitsFamily`, which it calls
    with explicit arguments (:meth:`args`, a :class:`StepArgs` of the step it is at).

    theta starts at 0.5 for every weight (`sec:app_maskednnregression`): r = logits(0.5) of the
    parametrization, and r = 0 for CP (sigmoid(0 / tau) = 0.5). ``generator`` (on ``device``,
    seeded with the config's seed) is the run's random stream: the run loop draws the batch
    order and the evaluation from it too. ``layers``: the sizes of the layers the flat logits
    cover (None: one layer of d) and ``target`` the fraction a per-layer method keeps
    (edge-popup); both fixed here. ``shard``: set by sample parallelism
    (:func:`pbscale.execution.distributed.rank_strategy`), passed to each step. ``joint``: the
    network weights will train on its steps' loss (a joint run), so a step keeps all its n
    samples' masks and activations until the backward (:func:`check_sample_memory`); under
    torchrun (``world`` ranks splitting the samples) each rank keeps only its share.
    ``l0_weights``: per-variable weights c (d,) of the L0 term, lam * sum_i c_i theta_i (None:
    lam * sum_i theta_i, computed as it always was). ``kept_fraction``: what ``target``
    budgets over channel variables (:attr:`StepArgs.kept_fraction`; None: a count), and
    ``coupled`` the coupled groups that budget never empties (:attr:`StepArgs.coupled`).
    """

    def __init__(self, config: MethodConfig, d: int, total_steps: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 bytes_per_sample: int | None = None, *,
                 layers: tuple[int, ...] | None = None, target: float = 1.0,
                 joint: bool = False, world: int = 1,
                 l0_weights: torch.Tensor | None = None,
                 kept_fraction: KeptFraction | None = None,
                 coupled: torch.Tensor | None = None) -> None:
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
        #: what ``target`` is a fraction of over channel variables (None: of the count)
        self.kept_fraction = kept_fraction
        #: the coupled groups a budgeted cut never empties (None: none)
        self.coupled = coupled
        if l0_weights is not None and tuple(l0_weights.shape) != (d,):
            raise PBInputError(f"l0_weights must have shape ({d},), one weight a variable, got "
                               f"{tuple(l0_weights.shape)}")
        #: the L0 term's per-variable weights (d,) on the device, or None (all 1)
        self.l0_weights = (None if l0_weights is None
                           else l0_weights.to(device=device, dtype=torch.float64))
        self.param = get_parametrization(config.param)
        r0 = family.initial_logits(self.param, d, torch.Generator().manual_seed(config.seed))
        self.r = nn.Parameter(r0.to(device=self.device, dtype=dtype))
        self.opt = mask_optimizer(config.optimizer, [self.r], config.lr)  # torch's on a GPU
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed)
        #: on the CPU the MC samples' own counter-based stream (the fused step,
        #: :mod:`pbscale.methods.fused`), seeded with the run's seed; None on a GPU
        self.stream = CounterStream(config.seed) if self.device.type == "cpu" else None
        #: the learned control of REBAR/RELAX and its optimizers (None, [] for the others)
        self.control, self.control_opts = family.make_control(
            d, config.lr, torch.Generator().manual_seed(config.seed), device=self.device,
            dtype=dtype)
        per_sample = bytes_per_sample or 16 * d
        if config.chunk is not None and "chunk" in family.caps.uses:
            self.chunk = min(config.chunk, config.n)
        else:
            self.chunk = auto_chunk(config.n, per_sample, self.device)
        if "n" in family.caps.uses:  # n masks of d entries per step: bounded by memory
            check_sample_memory(config.n, d, self.chunk, per_sample, self.device, joint=joint,
                                itemsize=torch.empty((), dtype=dtype).element_size(),
                                world=world)
        self.step_count = 0
        #: the L0 strength per weight in force (``config.lam`` unless a controller steers it,
        #: :class:`pbscale.pruning.lam_control.LamController`; checkpointed); acts only for a family
        #: whose capabilities use ``lam``
        self.lam = float(config.lam)
        #: this rank's :class:`pbscale.execution.distributed.Shard` once sample parallelism split
        #: the samples over torchrun ranks (None: all samples here)
        self.shard: Any = None
        #: the family's own per-run state (:meth:`LogitsFamily.initial_state`; checkpointed)
        self.state: dict[str, torch.Tensor] = {}
        self.state = dict(family.initial_state(self.args()))

    @property
    def method(self) -> str:
        return self.config.method

    def args(self, weights: bool = False) -> StepArgs:
        """The explicit arguments of the step the trainer is at (``weights``: the network
        weights train on its loss)."""
        return StepArgs(
            index=self.step_count, total=self.total_steps, d=self.d, layers=self.layers,
            n=self.config.n, param=self.param, settings=self.config.settings,
            target=self.target, chunk=self.chunk, generator=self.generator,
            dtype=self.r.dtype, device=self.device, weights=weights,
            kept_fraction=self.kept_fraction, coupled=self.coupled, shard=self.shard,
            stream=self.stream, control=self.control, control_opts=tuple(self.control_opts),
            state=dict(self.state))

    # ------------------------------------------------------------------ capabilities

    @property
    def eval_sampled(self) -> bool:
        """Evaluated by the best of sampled masks (else by :meth:`mode_mask`)."""
        return self.family.caps.pruning.eval_sampled

    @property
    def also_sampled(self) -> bool:
        """Pruning also reports the best of its sampled masks."""
        return self.family.caps.pruning.also_sampled

    #: its evaluation mask differs from the masks training saw: pruning recomputes BatchNorm
    #: statistics for it
    recalibrate_bn = True

    def info(self) -> dict:
        """The unhashed facts of config.json's "info" (the chunk it evaluates at once)."""
        return {"chunk": self.chunk}

    # ------------------------------------------------------------------ one step

    def theta(self) -> torch.Tensor:
        """Mask probabilities, shape (d,) (CP: its hard mask)."""
        with torch.no_grad():
            return self.family.theta(self.r, self.args())

    def keep_scores(self) -> torch.Tensor:
        """The family's :meth:`LogitsFamily.keep_score` (d,) now."""
        with torch.no_grad():
            return self.family.keep_score(self.r, self.args())

    def temperature(self) -> float:
        """The method's relaxation temperature now (CP: its schedule; NaN for the others)."""
        return self.family.temperature(self.args())

    def uniforms(self, n: int) -> torch.Tensor:
        """(n, d) uniforms from the trainer's generator (:meth:`StepArgs.uniforms`)."""
        return self.args().uniforms(n)

    def step_gradient(self, f: BatchedLoss, weights: bool = False) -> Gradient:
        """The family's :class:`Gradient` of this step, its L0 term added to the estimate
        (``weights``: with the loss the network weights train on; refused for a method that
        trains none)."""
        if weights and not self.family.caps.trains_weights:
            raise PBInputError(
                f"{self.family.text} cannot train network weights; use one of "
                f"{', '.join(names('prune-joint', logits=True))}"
            )
        out = self.family.gradient(f, self.r, self.args(weights))
        if out.state is not None:
            self.state = dict(out.state)
        if self.lam > 0 and "lam" in self.family.caps.uses:
            _, reg_grad = dense_regularizer(self.r, out.theta, self.lam, self.l0_weights)
            out.estimate.grad = out.estimate.grad + reg_grad
        return out

    def gradient(self, f: BatchedLoss) -> Estimate:
        """This step's gradient estimate over r (P,) and training loss (with the L0 term),
        without updating r."""
        return self.step_gradient(f).estimate

    def surrogate(self, f: BatchedLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        """This step's estimate as a surrogate loss (:func:`surrogate_loss`): a scalar whose
        autograd gradient in r is the method's gradient estimate (with the dense regularizer),
        and, with ``weights=True``, whose gradient in the network weights is that of the method's
        loss on the weights (MC: the mean of J over the n sampled masks; CP: the relaxed loss),
        so that one ``backward`` fills both. Returns (surrogate (), training loss)."""
        out = self.step_gradient(f, weights)
        est = out.estimate
        weight_loss = out.weight_loss if out.weight_loss is not None else 0.0
        return surrogate_loss(est.grad.to(self.r.dtype), self.r, weight_loss), est.loss

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers over r (the learning-rate schedules of :mod:`pbscale.runs.loop` act on
        these; the REBAR/RELAX control optimizers keep their own rates)."""
        return [self.opt]

    def zero_grad(self) -> None:
        self.opt.zero_grad()

    def apply(self) -> None:
        """The optimizer step on r from r.grad, then the parametrization's projection (the
        direct parametrization's clamp to [eps, 1 - eps])."""
        self.opt.step()
        with torch.no_grad():
            projected = self.param.project(self.r)
            if projected is not self.r:  # only direct clamps; the others return r itself
                self.r.copy_(projected)
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
            return self.family.eval_mask(self.r, self.args())

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
        with torch.no_grad():
            return self.family.sample_masks(self.r, k, self.args())

    def state_dict(self) -> dict:
        return {
            "r": self.r.detach().cpu(),
            "opt": self.opt.state_dict(),
            "generator": self.generator.get_state(),
            "stream": self.stream.state_dict() if self.stream is not None else None,
            "step_count": self.step_count,
            "control": self.control.state_dict() if self.control is not None else None,
            "control_opts": [o.state_dict() for o in self.control_opts],
            "lam": self.lam,
            "state": {k: v.detach().cpu() for k, v in self.state.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s state. A state without the MC samples' stream (written
        before it existed, or on a GPU) while this trainer has one warns
        :class:`pbscale.runs.contracts.ResumeWarning` (:data:`STREAM_NOT_RESUMED`): the samples
        go on from the fresh stream of the run's seed; a state with the stream (written on the
        CPU) while this trainer has none (on a GPU) warns too (:data:`STREAM_NOT_USED`): the
        stream is not silently dropped."""
        with torch.no_grad():
            self.r.copy_(state["r"].to(self.r.device))
        self.opt.load_state_dict(state["opt"])
        self.generator.set_state(state["generator"])
        if self.stream is not None:
            if state.get("stream") is not None:
                self.stream.load_state_dict(state["stream"])
            else:
                warnings.warn(STREAM_NOT_RESUMED, ResumeWarning, stacklevel=2)
        elif state.get("stream") is not None:
            warnings.warn(STREAM_NOT_USED.format(device=self.device), ResumeWarning,
                          stacklevel=2)
        self.step_count = int(state["step_count"])
        self.lam = float(state.get("lam", self.config.lam))  # older checkpoints: the config's
        if "state" in state:  # older checkpoints hold none: the family's initial state stays
            self.state = {k: v.to(self.device) for k, v in state["state"].items()}
        if self.control is not None:
            self.control.load_state_dict(state["control"])
        for o, s in zip(self.control_opts, state["control_opts"]):
            o.load_state_dict(s)
