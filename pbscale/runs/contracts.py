"""The contracts of the run loop :func:`pbscale.runs.loop.run`: what a method (:class:`Method`) and
a task (:class:`Task`) provide, what an evaluation sees (:class:`EvalContext`), the loop's settings
and phases (:class:`LoopConfig`), and the strategies it calls at fixed points
(:class:`RunHooks`, :class:`StepHook`). See :mod:`pbscale.runs.loop` for how a run uses them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

import torch

from pbexact.errors import PBInputError


class ResumeWarning(UserWarning):
    """Warned by a method's or task's ``load_state_dict`` when the checkpoint it loads resumes
    the run, but not to the numbers an uninterrupted run gives (e.g. it holds no state of a
    random stream the code now has); the message says what happens. The loop prints each as
    one ``warning:`` line on stderr naming the checkpoint (:func:`pbscale.runs.loop.run`)."""


#: A batched loss (the one definition): masks z of shape (..., d) to losses (...), e.g. (k, d)
#: -> (k,); the methods evaluate it, and differentiate it in z where they relax the mask.
BatchedLoss = Callable[[torch.Tensor], torch.Tensor]


@runtime_checkable
class Method(Protocol):
    """A mask-optimization method, built whole by its family
    (:meth:`pbscale.methods.registry.Family.make`; e.g. :class:`pbscale.methods.MaskTrainer`).

    ``generator`` is the run's random stream, seeded by the method from the run's seed: the loop
    draws the batch order and hands it to the evaluation (it never replaces or reseeds it).
    Pruning (:mod:`pbscale.prune`) also reads the capabilities of :class:`MaskMethod`. A
    method that checks the network weights itself in :meth:`check_finite` (a pruning group:
    each member's, :mod:`pbscale.pruning.group`) sets ``checks_weights = True``; the loop then
    checks no weights of its own."""

    generator: torch.Generator
    d: int

    def surrogate(self, f: BatchedLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        """(scalar whose gradient in r is the estimate [and in the weights, their gradient],
        training loss)."""
        ...

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]: ...

    def zero_grad(self) -> None: ...

    def apply(self) -> None:
        """Optimizer step on r from r.grad (and any projection)."""
        ...

    def sample_masks(self, k: int) -> torch.Tensor: ...

    def mode_mask(self) -> torch.Tensor: ...

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of its masks."""
        ...

    def check_finite(self, where: str, flags: dict[str, str]) -> None:
        """Refuse (:class:`PBInputError`) logits that became NaN or inf, naming ``where``
        (e.g. "epoch 3") and the flag that sets their learning rate (``flags["masks"]``, its
        optimizer ``flags["optimizer"]``; :data:`LR_FLAGS`)."""
        ...

    def config_dict(self) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s state; a state it can resume only inexactly warns
        :class:`ResumeWarning`."""
        ...


class MaskMethod(Method, Protocol):
    """What pruning reads of a method besides :class:`Method`: ``eval_sampled`` (evaluated by the
    best of sampled masks, else by its :meth:`mode_mask`), ``also_sampled`` (the best sampled
    mask is reported too), ``recalibrate_bn`` (BatchNorm statistics are recomputed for its
    evaluation mask) and ``info()`` (unhashed facts for config.json's "info"). How it runs
    under torchrun is chosen outside it (:func:`pbscale.execution.distributed.rank_strategy`)."""

    eval_sampled: bool
    also_sampled: bool
    recalibrate_bn: bool

    def info(self) -> dict: ...


@runtime_checkable
class Task(Protocol):
    """What a task supplies to :func:`run`.

    ``name``: a readable prefix of the run folder. ``d``: mask size. ``config()``: its JSON
    configuration (hashed into the folder name). ``weights()``: the network parameters that
    train (empty: supermask). ``steps_per_epoch``. ``epoch_order(generator)``: a tensor fixing
    the epoch's batches (e.g. a permutation), drawn from the loop's generator at the start of
    each epoch and checkpointed. ``batch_loss(order, i)``: the batched loss of step i.
    ``evaluate(ctx)``: metrics of the current state (a flat dict of numbers; ``ctx`` is an
    :class:`EvalContext`). ``state_dict`` / ``load_state_dict``: task state beyond
    ``weights()`` (may be empty). Behaviour beyond this comes from :class:`RunHooks`."""

    name: str
    d: int
    steps_per_epoch: int

    def config(self) -> dict: ...

    def weights(self) -> list[torch.nn.Parameter]: ...

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor: ...

    def batch_loss(self, order: torch.Tensor, i: int) -> BatchedLoss: ...

    def evaluate(self, ctx: EvalContext) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class EvalContext:
    """What :meth:`Task.evaluate` sees: the method, the loop's generator, the phase
    ("warmup", "train", "frozen") and the fixed mask (d,) of warm-up (ones) and frozen epochs
    (None while masks are sampled)."""

    method: Method
    generator: torch.Generator
    phase: str
    mask: torch.Tensor | None
    epoch: int


@dataclass
class LoopConfig:
    """Options of :func:`run` (all hashed into the run folder's name)."""

    epochs: int
    seed: int = 0
    mask_milestones: tuple[float, ...] = ()
    mask_gamma: float = 0.1
    weight_milestones: tuple[float, ...] = ()
    weight_gamma: float = 0.1
    mask_warmup: float = 0.0
    freeze_masks: float | None = None
    metrics_file: str = "metrics.csv"

    def validate(self) -> LoopConfig:
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise PBInputError(f"epochs must be a positive integer, got {self.epochs!r}; give 1 "
                               "or more")
        for name in ("mask_milestones", "weight_milestones"):
            if any(not 0 <= m <= 1 for m in getattr(self, name)):
                raise PBInputError(f"{name} are fractions of the epochs; give values in [0, 1]")
        for name in ("mask_gamma", "weight_gamma"):
            if not getattr(self, name) > 0:
                raise PBInputError(f"{name} must be > 0, got {getattr(self, name)}; give a "
                                   "positive factor")
        if not 0 <= self.mask_warmup <= 1:
            raise PBInputError(f"mask_warmup is a fraction of the epochs, got "
                               f"{self.mask_warmup}; give a value in [0, 1]")
        if self.freeze_masks is not None and not self.mask_warmup <= self.freeze_masks <= 1:
            raise PBInputError(f"freeze_masks {self.freeze_masks} is before mask_warmup "
                               f"{self.mask_warmup} or past 1; give a fraction in [mask_warmup, "
                               "1] or None")
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mask_milestones"] = list(self.mask_milestones)
        d["weight_milestones"] = list(self.weight_milestones)
        return d

    def lr_factor(self, epoch: int, masks: bool) -> float:
        """gamma^(number of milestones m with epoch >= round(m epochs))."""
        ms = self.mask_milestones if masks else self.weight_milestones
        gamma = self.mask_gamma if masks else self.weight_gamma
        return gamma ** sum(epoch >= round(m * self.epochs) for m in ms)

    def phase_epochs(self) -> tuple[int, int, int]:
        """Epochs of warm-up, mask training and frozen masks, summing to E: the boundaries
        round(mask_warmup E) and round(freeze_masks E) (freeze_masks None: 1), then each phase
        whose fraction is > 0 but got no epoch takes one from the longest phase while that has
        more than one (phases in that order), so a fraction > 0 gives at least one epoch."""
        E = self.epochs
        f = 1.0 if self.freeze_masks is None else self.freeze_masks
        w_end, f_end = round(self.mask_warmup * E), round(f * E)
        counts = [w_end, f_end - w_end, E - f_end]
        for i, frac in enumerate((self.mask_warmup, f - self.mask_warmup, 1 - f)):
            if frac > 0 and counts[i] == 0:
                longest = max(range(3), key=lambda j: counts[j])
                if counts[longest] > 1:
                    counts[longest] -= 1
                    counts[i] = 1
        return counts[0], counts[1], counts[2]

    def mask_epochs(self) -> int:
        """The epochs in which masks train (CP's temperature schedule counts their steps)."""
        return self.phase_epochs()[1]

    def phase(self, epoch: int) -> str:
        """"warmup", "frozen" or "train" (see the module docstring for the rounding rule)."""
        warm, train, _ = self.phase_epochs()
        if epoch < warm:
            return "warmup"
        if self.freeze_masks is not None and epoch >= warm + train:
            return "frozen"
        return "train"


class RunHooks:
    """Callbacks of :func:`run` (see the module docstring); each does nothing by default.
    Several hook objects compose: ``training_loss`` and ``stop_requested`` are chained in
    order, ``frozen_mask`` takes the first answer that is not None, the others are called in
    order."""

    def before_step(self, epoch: int, i: int) -> None:
        """Called before step i of ``epoch``."""

    def after_step(self, epoch: int, i: int) -> None:
        """Called after step i of ``epoch`` (its optimizers stepped), before the loop checks
        the step's loss."""

    def training_loss(self, f: BatchedLoss) -> BatchedLoss:
        """The batched loss the method's surrogate is given while masks train."""
        return f

    def masks_step(self, order: torch.Tensor, i: int) -> torch.Tensor | None:
        """Take step i of the epoch whose batch order is ``order`` while masks train over
        fixed weights (supermask) and return its training loss as a 0-dim tensor, which the
        loop reads when the epoch ends (no host read-back per step), or None: the loop's own
        step (:class:`pbscale.execution.captured.CapturedSteps` replays it from a CUDA graph)."""
        return None

    def frozen_mask(self, method: Method, generator: torch.Generator) -> torch.Tensor | None:
        """The mask (d,) to freeze for the last epochs, or None (the method's mode mask)."""
        return None

    def stop_requested(self, flag: bool) -> bool:
        """Whether the run stops before the next step, given this process's SIGTERM flag."""
        return flag

    def epoch_done(self, epoch: int, history: list[dict]) -> None:
        """Called after epoch ``epoch`` (0-based) is evaluated (its row ``history[-1]``),
        before its checkpoint: state changed here (e.g. the method's L0 strength,
        :class:`pbscale.pruning.lam_control.LamController`) is checkpointed with the epoch, so a
        resumed run is exact."""

    def after_epoch(self, history: list[dict], final: bool) -> None:
        """Called after every epoch's checkpoint (``final``: the last epoch is done)."""

    def summary_extra(self) -> dict:
        """Entries added to a finished run's summary.json, asked for after the last
        :meth:`after_epoch` (e.g. the measured costs of a structured pruning run; default
        none); several hooks' entries are merged in order."""
        return {}

    def progress(self, row: dict) -> dict | None:
        """The progress bar's postfix after an epoch whose history row is ``row`` (None: the
        row's first metrics); the first answer that is not None is shown."""
        return None

    def hook_state(self) -> dict | None:
        """State of the hook that the run's checkpoint keeps (None: none); a resumed run
        hands it back to :meth:`load_hook_state` before its first step."""
        return None

    def load_hook_state(self, state: dict) -> None:
        """Take back the :meth:`hook_state` a checkpoint kept."""


class StepHook(RunHooks):
    """``fn(epoch, i)`` before every step (tests interrupt a run with it)."""

    def __init__(self, fn: Callable[[int, int], None]) -> None:
        self.fn = fn

    def before_step(self, epoch: int, i: int) -> None:
        self.fn(epoch, i)
