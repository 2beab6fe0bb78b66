"""One run loop for every mask-training task (regression, pruning, ...): :func:`run`.

A task (:class:`Task`) supplies data, the batched loss of k masks and an evaluation; a method
(:class:`Method`, e.g. :class:`pbscale.methods.MaskTrainer`) turns a batched loss into a
surrogate loss over its mask logits (and, in joint mode, the network weights). The loop owns
everything else:

* seeds: one explicit ``torch.Generator``, the method's (``method.generator``, seeded by the
  method with the run's seed), for its sampling, the batch order and the evaluation; torch's
  global generator (dropout) is seeded with ``LoopConfig.seed`` (the tools give the run's
  seed) and checkpointed;
* epochs, step-decay learning-rate schedules (``mask_milestones`` / ``weight_milestones``:
  fractions of the epochs at which the rate is multiplied by ``*_gamma``), a dense warm-up
  (masks all ones and untrained for the first ``mask_warmup`` fraction of epochs) and mask
  freezing (from the ``freeze_masks`` fraction of epochs on, one mask chosen by the task, or the
  method's most probable mask, is fixed while the weights go on training);
* the run folder ``<out>/<task.name>-<hash>``, the hash taken over the task's, the method's and
  the loop's configuration (``config.json``; a folder whose ``config.json`` differs is refused);
  ``checkpoint.pt`` written atomically after every epoch and on SIGTERM or SIGINT (Ctrl-C;
  mid-epoch, with the epoch's batch order, then :class:`pbexact.errors.RunInterrupted` is
  raised, which every tool's :func:`pbexact.cli.run_main` turns into one line saying how to
  resume and exit code 143 or 130), loaded with ``weights_only=True`` (the folder and its
  records: :mod:`pbscale.runs.records`); a resumed run gives the same numbers as an
  uninterrupted one; the metrics CSV (one row per epoch, epoch 0 the evaluation before
  training), a tqdm progress bar with the latest metrics and ``summary.json``;
* what the folder's name does not say but its results depend on, recorded in config.json's
  "info" (:data:`PROVENANCE`: the data's fingerprint, the number of processes): a rerun whose
  values differ is refused;
* divergence: a step whose training loss is NaN or inf, an epoch that leaves NaN or inf mask
  logits or weights, or an evaluation with a NaN or inf loss stops the run with one line naming
  the step and the flag that sets the learning rate to lower (:data:`LR_FLAGS`, the caller's
  ``lr_flags`` overriding them; the weights' where they train, since masks only switch weights
  on and off; :class:`pbscale.runs.records.Diverged`); no summary is written, the last
  checkpoint stays the last finite state and ``diverged.json`` records where and why
  (:func:`pbscale.runs.records.write_diverged`). Running a diverged run again is refused with
  its record (the same settings diverge again) until ``diverged.json`` is deleted; the one
  process that trains a run holds its folder's lock (:func:`pbscale.runs.records.lock_folder`),
  so a second writer is refused.

Phases of an epoch e of E: the first W epochs warm up, the last Z (only with freeze_masks) are
frozen, the rest train masks, with (W, E - W - Z, Z) from :meth:`LoopConfig.phase_epochs`: the
boundaries round(mask_warmup E) and round(freeze_masks E), then a phase given a fraction > 0
that got no epoch takes one from the longest phase (while that has more than one), so a fraction
> 0 lasts at least one epoch: a 5-epoch joint run with mask_warmup = 0.1 warms up for one epoch
(round(0.5) = 0 gave none). :meth:`LoopConfig.mask_epochs` (the mask-training epochs) is what
CP's temperature schedule counts (`pbscale.prune`).

Callers add behaviour through explicit strategy objects, :class:`RunHooks` (every hook a no-op
by default), passed as ``run(..., hooks=[...])``: ``before_step(epoch, i)``,
``training_loss(f)`` (the batched loss the method's surrogate sees while masks train; sample
parallelism hands over the whole batch), ``after_step(epoch, i)`` (after a step's optimizers
stepped), ``masks_step(order, i)`` (a hook that takes a supermask
step itself returns its loss as a device tensor, read with the epoch's others when the epoch
ends: :class:`pbscale.execution.captured.CapturedSteps`), ``epoch_done(epoch, history)`` (after the
epoch's evaluation, before its checkpoint), ``frozen_mask(method, generator)`` (the mask frozen
for the last epochs; default the method's most probable mask), ``stop_requested(flag)`` (SIGTERM
seen here or, under torch.distributed, by any rank) and ``after_epoch(history, final)`` (after
every epoch's checkpoint, ``final`` True after the last epoch and, for a run whose last epoch
was already checkpointed, once more before ``summary.json``). Distribution
(:mod:`pbscale.execution.distributed`) is such a strategy; a regression group
(:mod:`pbscale.regression.group`) writes each member's own run folder from ``after_epoch``.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from pbexact.errors import PBInputError, RunInterrupted
from pbexact.provenance import code_provenance
from pbscale.runs import io
from pbscale.runs.contracts import (
    BatchedLoss,
    EvalContext,
    LoopConfig,
    Method,
    ResumeWarning,
    RunHooks,
    StepHook,
    Task,
)
from pbscale.runs.divergence import check_finite, check_metrics
from pbscale.runs.records import (
    PROVENANCE,
    Diverged,
    check_provenance,
    config_hash,
    diverged_refusal,
    env_info,
    full_config,
    last_metrics,
    lock_folder,
    open_folder,
    read_diverged,
    read_state,
    run_folder,
    run_record,
    write_diverged,
    write_summary,
)

__all__ = ["LOOP_COLUMNS", "LR_FLAGS", "PROVENANCE", "BatchedLoss", "EvalContext", "LoopConfig",
           "Method", "RunHooks", "StepHook", "Task", "Training", "check_finite", "check_metrics",
           "check_provenance", "config_hash", "env_info", "flush_denormals", "full_config",
           "read_state", "run", "run_folder", "run_record", "train_step", "write_summary"]

#: Flags named when a run diverges: the mask learning rate and optimizer, the weight learning
#: rate (those of ``pbscale.regress``; ``run(..., lr_flags=...)`` overrides entries).
LR_FLAGS = {"masks": "--lr", "optimizer": "--optimizer", "weights": "--lr"}
#: Columns the loop writes into every history row.
LOOP_COLUMNS = ("epoch", "train_loss", "train_seconds", "val_seconds")
_CHECKPOINT_KEYS = ("method", "task", "weights", "weight_opt", "generator", "torch_rng",
                    "history", "epoch", "fixed")


@contextmanager
def flush_denormals(device: torch.device) -> Iterator[None]:
    """On the CPU, subnormal floats (below 1.2e-38 in float32) are flushed to zero while the
    block runs, then the default (no flushing) is restored. x86 arithmetic on subnormals is
    about 100 times slower, and CP's relaxed masks sigmoid(r / tau) reach them as tau falls to
    1/200: a LeNet CP epoch took 11.9 s instead of 3.1 s with the same metrics."""
    if device.type != "cpu" or not torch.set_flush_denormal(True):
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


#: Seconds the loop waits at least, after a SIGTERM or SIGINT, for the step in progress to end
#: (and the run to checkpoint before the next one); where the run's steps (or an epoch's
#: evaluation and checkpoint) took longer, twice the longest seen so far, up to
#: :data:`STOP_GRACE_MAX`. A step that takes longer still (a huge --n) is cut then, without a
#: new checkpoint (:func:`_signal_flag`).
STOP_GRACE = 5.0
#: The most seconds the loop waits for the step in progress after a signal (schedulers
#: commonly send SIGKILL 30 s after SIGTERM).
STOP_GRACE_MAX = 25.0


@contextmanager
def _signal_flag() -> Iterator[dict]:
    """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the loop checks after every step (main
    thread only); ``flag["signal"]`` is the last one received. So that a run acts within
    seconds whatever it is doing, a second signal, or the first one not acted on within the
    grace (:data:`STOP_GRACE` seconds, or twice the longest step seen, ``flag["longest"]``, up
    to :data:`STOP_GRACE_MAX`; a timer sends the signal again), raises
    :class:`pbexact.errors.RunInterrupted` where the run is: the step in progress is dropped and
    no checkpoint is written, the last one stays (the run resumes from it, exactly). The loop
    marks the flag ``acting`` once it checkpoints (:func:`_stop_requested`), which stops the
    timer."""
    flag: dict[str, Any] = {"term": False, "signal": signal.SIGTERM, "acting": False,
                            "timer": None, "longest": 0.0, "grace": STOP_GRACE,
                            "mark": time.perf_counter()}

    def handler(signum: int, _frame: Any) -> None:
        if flag["term"]:
            if flag["acting"]:  # the checkpoint is being written: let it finish
                return
            name = signal.Signals(signum).name
            raise RunInterrupted(signum, f"{name}: the step in progress did not end within "
                                         f"{flag['grace']:.3g} s of the signal; stopped "
                                         "without a new checkpoint (the last one is intact and "
                                         "the run resumes from it)")
        flag.update(term=True, signal=signum)
        flag["grace"] = min(max(STOP_GRACE, 2 * flag["longest"]), STOP_GRACE_MAX)
        timer = threading.Timer(flag["grace"], os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        flag["timer"] = timer

    olds = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            olds[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: no handler
        yield flag
        return
    try:
        yield flag
    finally:
        _stop_timer(flag)
        for sig, old in olds.items():
            signal.signal(sig, old)


def _stop_timer(flag: dict) -> None:
    """Cancel the timer a first signal started (:func:`_signal_flag`), if any."""
    timer = flag.get("timer")
    if timer is not None:
        timer.cancel()
        flag["timer"] = None


def _set_lrs(optimizers: list[torch.optim.Optimizer], factor: float) -> None:
    for opt in optimizers:
        for g in opt.param_groups:
            g.setdefault("initial_lr", g["lr"])
            g["lr"] = g["initial_lr"] * factor


def run(task: Task, method: Method, loop: LoopConfig, out: str | Path,
        weight_optimizer: torch.optim.Optimizer | None = None, device: torch.device | str = "cpu",
        progress: bool = True, info: dict | None = None,
        step_hook: Callable[[int, int], None] | None = None,
        hooks: Sequence[RunHooks] = (), lr_flags: dict[str, str] | None = None,
        method_info: dict | None = None, keep_checkpoint: bool = True,
        config: dict | None = None) -> Path:
    """Train (or resume, or return at once if finished) one run; returns its folder.

    ``weight_optimizer`` over ``task.weights()`` (None: supermask, weights fixed). ``info``:
    extra facts written to config.json but not hashed (device, threads, chunk...).
    ``hooks``: :class:`RunHooks` strategies; ``step_hook(epoch, i)`` is short for
    ``StepHook(step_hook)`` after them. ``lr_flags``: the tool's names of the learning-rate
    flags a divergence message tells the user to lower (keys of :data:`LR_FLAGS`).
    ``method_info``: what config.json records about the method (unhashed, "method_info":
    :meth:`pbscale.methods.registry.Family.info`), so the run reads back without the registry.
    A SIGTERM or SIGINT checkpoints the run and raises :class:`RunInterrupted`.
    ``progress``: the epoch bar, an inner bar over the epoch's batches that clears itself
    (shown on a terminal only: tqdm's ``disable=None``) and a note on stderr when the run had
    finished before. ``keep_checkpoint=False``: ``checkpoint.pt`` is deleted once
    ``summary.json`` is written (a finished run needs only its summary to read as finished).
    config.json's "info" also records which code ran ("code": :func:`pbexact.provenance.
    code_provenance`, not hashed). ``config``: what the run folder is named by
    (:func:`full_config` unless given; a pruning run gives the form its folder has,
    :func:`pbscale.runs.records.chosen_config`).
    """
    loop.validate()
    dev = torch.device(device)
    config = full_config(task, method, loop) if config is None else config
    record = run_record(config, dev, info or {}, method_info)
    files = ("config.json", loop.metrics_file, "checkpoint.pt", "summary.json")
    folder = open_folder(out, task.name, config, record, files)
    if (folder / "summary.json").exists():
        if progress:
            print(f"{folder.name}: already finished (its summary.json is there); its result:",
                  file=sys.stderr)
        if not keep_checkpoint:
            (folder / "checkpoint.pt").unlink(missing_ok=True)
        return folder
    with lock_folder(folder):
        return _train(task, method, loop, folder, record, weight_optimizer, dev, progress,
                      hooks, step_hook, lr_flags, keep_checkpoint)


def _train(task: Task, method: Method, loop: LoopConfig, folder: Path, record: dict,
           weight_optimizer: torch.optim.Optimizer | None, dev: torch.device, progress: bool,
           hooks: Sequence[RunHooks], step_hook: Callable[[int, int], None] | None,
           lr_flags: dict[str, str] | None, keep_checkpoint: bool) -> Path:
    """:func:`run`'s training of its opened, locked folder (a diverged run is refused with its
    record; one that diverges now leaves ``diverged.json``)."""
    if (folder / "summary.json").exists():  # finished by another process before the lock
        return folder
    diverged = read_diverged(folder)
    if diverged is not None:
        raise diverged_refusal(folder, diverged)
    record["info"]["code"] = code_provenance()
    if weight_optimizer is not None and not task.weights():
        raise PBInputError("a weight optimizer was given but the task has no trainable "
                           "weights; pass weight_optimizer=None")
    io.write_json(folder / "config.json", record)
    hooks = [*hooks, *([StepHook(step_hook)] if step_hook is not None else [])]
    training = Training(task, method, loop, weight_optimizer, dev, hooks, folder,
                         {**LR_FLAGS, **(lr_flags or {})}, progress)
    bar = tqdm(range(training.start, loop.epochs), initial=training.start, total=loop.epochs,
               disable=not progress, desc=task.name, unit="epoch", file=sys.stderr)
    with _signal_flag() as flag, flush_denormals(dev):
        for epoch in bar:
            try:
                training.epoch(epoch, flag)
            except RunInterrupted:
                bar.close()
                raise
            except Diverged as exc:
                bar.close()
                write_diverged(folder, exc.record(last_metrics(folder, loop.metrics_file)))
                raise
            row = training.history[-1]
            shown = next((p for h in hooks if (p := h.progress(row)) is not None), None)
            bar.set_postfix(shown if shown is not None else
                            {k: f"{v:.4g}" for k, v in list(row.items())[1:5]
                             if isinstance(v, float)})
    io.write_csv(folder / loop.metrics_file, training.history)
    if training.start == loop.epochs:  # trained before, summary missing
        for h in hooks:
            h.after_epoch(training.history, True)
    extra = {k: v for h in hooks if hasattr(h, "summary_extra")
             for k, v in h.summary_extra().items()}
    write_summary(folder, training.history, dev, **extra)
    if not keep_checkpoint:
        training.ckpt.unlink(missing_ok=True)
    return folder


class Training:
    """One run's training state (history, fixed mask, position of an epoch cut by a signal)
    restored from its checkpoint, and the epochs :func:`run` drives. Public so that a profiler
    can time its phases (``__init__``: set-up with the first evaluation, ``epoch``, ``save``:
    the checkpoint; ``benchmarks/profile_run.py``)."""

    def __init__(self, task: Task, method: Method, loop: LoopConfig,
                 weight_optimizer: torch.optim.Optimizer | None, dev: torch.device,
                 hooks: list[RunHooks], folder: Path, flags: dict[str, str],
                 progress: bool = False) -> None:
        self.task, self.method, self.loop, self.dev = task, method, loop, dev
        self.progress = progress
        self.hooks, self.folder, self.flags = hooks, folder, flags
        self.weight_optimizer = weight_optimizer
        self.joint = weight_optimizer is not None
        self.weights = task.weights() if self.joint else []
        #: the weights the divergence checks read (none for a method that checks its own,
        #: ``checks_weights``: a group checks each member's)
        self.checked = [] if getattr(method, "checks_weights", False) else self.weights
        self.generator = method.generator  # the run's stream, seeded by the method
        torch.manual_seed(loop.seed)
        self.opts = method.optimizers + ([weight_optimizer] if self.joint else [])
        self.ckpt = folder / "checkpoint.pt"
        self.fixed: torch.Tensor | None = None
        self.pos: dict | None = None  # (order, next step, losses) of an epoch cut by a signal
        self.history: list[dict] = []
        self.start = 0
        state = io.load_checkpoint(self.ckpt, keys=_CHECKPOINT_KEYS)
        if state is not None:
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", ResumeWarning)
                    self.restore(state)
            except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError):
                raise PBInputError(f"damaged checkpoint {self.ckpt} (its contents do not fit "
                                   f"this run); {io.DAMAGED_FIX}") from None
            self.resume_warnings(caught)
        if not self.history:
            phase0 = loop.phase(0)
            if phase0 == "warmup":
                self.fixed = self.ones()
            self.history.append({"epoch": 0, "train_loss": math.nan,
                                 **self.evaluate(0, phase0), "train_seconds": 0.0,
                                 "val_seconds": 0.0})

    def ones(self) -> torch.Tensor:
        return torch.ones(self.task.d, device=self.dev, dtype=self.method.dtype)

    def resume_warnings(self, caught: list[warnings.WarningMessage]) -> None:
        """Print each distinct :class:`ResumeWarning` of the restore as one ``warning:`` line
        on stderr naming the checkpoint (a group's members warn alike: once); warn the others
        again as they came."""
        seen = []
        for w in caught:
            if not issubclass(w.category, ResumeWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            elif str(w.message) not in seen:
                seen.append(str(w.message))
                print(f"warning: resuming {self.ckpt}: {w.message}; delete it to start the run "
                      "over", file=sys.stderr)

    def restore(self, state: dict) -> None:
        """Load a checkpoint into the method, task, weights, optimizer and RNGs. A checkpoint
        that does not fit the run raises one of the built-in errors the caller turns into a
        one-line error."""
        self.method.load_state_dict(state["method"])
        self.task.load_state_dict(state["task"])
        if self.weight_optimizer is not None:
            if len(state["weights"]) != len(self.weights):
                raise ValueError("weight count")
            with torch.no_grad():
                for p, v in zip(self.weights, state["weights"]):
                    p.copy_(v.to(p.device))
            self.weight_optimizer.load_state_dict(state["weight_opt"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        history, start = list(state["history"]), int(state["epoch"])
        if not 0 <= start <= self.loop.epochs or len(history) != start + 1:
            raise ValueError("history length")
        columns = set(history[0]) if isinstance(history[0], dict) else set()
        if not set(LOOP_COLUMNS) <= columns or any(not isinstance(h, dict) or set(h) != columns
                                                   for h in history):
            raise ValueError("history rows")
        self.history, self.start = history, start
        self.fixed = state["fixed"].to(self.dev) if state["fixed"] is not None else None
        self.pos = state.get("position")
        for i, kept in (state.get("hooks") or {}).items():
            self.hooks[int(i)].load_hook_state(kept)

    def evaluate(self, epoch: int, phase: str) -> dict:
        mask = self.fixed if phase != "train" else None
        return self.task.evaluate(EvalContext(self.method, self.generator, phase, mask, epoch))

    def save(self, epoch: int, position: dict | None) -> None:
        io.save_checkpoint(self.ckpt, {
            "method": self.method.state_dict(), "task": self.task.state_dict(),
            "weights": [p.detach().cpu() for p in self.weights],
            "weight_opt": self.weight_optimizer.state_dict() if self.joint else None,
            "generator": self.generator.get_state(), "torch_rng": torch.get_rng_state(),
            "history": self.history, "epoch": epoch,
            "fixed": None if self.fixed is None else self.fixed.cpu(), "position": position,
            **({"hooks": hooks} if (hooks := {str(i): s for i, h in enumerate(self.hooks)
                                              if (s := h.hook_state()) is not None}) else {}),
        })

    def diverged(self, epoch: int, i: int) -> None:
        """Stop the run whose step i of ``epoch`` had a training loss that is NaN or inf."""
        check_finite(self.method, epoch, self.flags, self.checked,
                     step=(epoch * self.task.steps_per_epoch + i + 1, i + 1, self.fixed))

    def enter_phase(self, epoch: int) -> str:
        """The epoch's phase, its fixed mask (warm-up: ones; the first frozen epoch: the mask
        a hook chooses, unless an epoch cut by a signal resumes) and learning rates."""
        loop, phase = self.loop, self.loop.phase(epoch)
        if phase == "warmup":
            self.fixed = self.ones()
        elif phase == "frozen" and (self.fixed is None or loop.phase(epoch - 1) != "frozen"):
            if self.pos is None:
                self.fixed = _frozen_mask(self.hooks, self.method, self.generator).detach()
        elif phase == "train":
            self.fixed = None
        _set_lrs(self.method.optimizers, loop.lr_factor(epoch, masks=True))
        if self.joint:
            _set_lrs([self.weight_optimizer], loop.lr_factor(epoch, masks=False))
        return phase

    def epoch(self, epoch: int, flag: dict) -> None:
        """Train one epoch (from the position a signal cut it at), evaluate, checkpoint."""
        task, hooks = self.task, self.hooks
        phase = self.enter_phase(epoch)
        t0 = time.perf_counter()
        if self.pos is not None:
            pos, self.pos = self.pos, None
            order, first, losses = pos["order"].to(self.dev), pos["step"], pos["losses"]
        else:
            order, first, losses = task.epoch_order(self.generator), 0, []
        # the batches of the epoch: a bar that clears itself, on a terminal only (disable=None)
        with tqdm(range(first, task.steps_per_epoch), initial=first,
                  total=task.steps_per_epoch, leave=False, unit="batch",
                  desc=f"epoch {epoch + 1}", file=sys.stderr,
                  disable=None if self.progress else True) as steps:
            for i in steps:
                if _stop_requested(hooks, flag):
                    self.save(epoch, {"order": order.cpu(), "step": i,
                                      "losses": _read_losses(losses)})
                    sig = signal.Signals(flag["signal"])
                    raise RunInterrupted(sig.value,
                                         f"{sig.name}: checkpoint written to {self.ckpt}")
                for h in hooks:
                    h.before_step(epoch, i)
                taken = (_masks_step(hooks, order, i)
                         if self.fixed is None and not self.joint else None)
                if taken is not None:  # a hook took the step: its loss is read at the end
                    losses.append(taken)
                    continue
                f = task.batch_loss(order, i)
                if self.fixed is None:
                    for h in hooks:
                        f = h.training_loss(f)
                losses.append(train_step(f, self.method, self.weight_optimizer, self.opts,
                                         self.fixed, self.joint))
                for h in hooks:
                    h.after_step(epoch, i)
                if not math.isfinite(losses[-1]):
                    self.diverged(epoch, i)
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        t1 = time.perf_counter()
        losses = _read_losses(losses)
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if bad is not None:  # a step a hook took diverged
            self.diverged(epoch, bad)
        check_finite(self.method, epoch, self.flags, self.checked)
        metrics = self.evaluate(epoch + 1, phase)
        check_metrics(metrics, epoch, self.flags, self.joint)
        t2 = time.perf_counter()
        self.history.append({"epoch": epoch + 1,
                             "train_loss": sum(losses) / max(len(losses), 1),
                             **metrics, "train_seconds": t1 - t0, "val_seconds": t2 - t1})
        for h in hooks:
            h.epoch_done(epoch, self.history)
        self.save(epoch + 1, None)
        io.write_csv(self.folder / self.loop.metrics_file, self.history)
        for h in hooks:
            h.after_epoch(self.history, epoch + 1 == self.loop.epochs)


def _masks_step(hooks: Sequence[RunHooks], order: torch.Tensor, i: int
                ) -> torch.Tensor | None:
    """The loss of mask-training step i as the first hook that takes the step returns it."""
    for h in hooks:
        taken = h.masks_step(order, i)
        if taken is not None:
            return taken
    return None


def _read_losses(losses: list) -> list[float]:
    """An epoch's step losses as floats: those the steps read back already, and the 0-dim
    tensors of steps a hook took, read with one host transfer."""
    tensors = [v for v in losses if torch.is_tensor(v)]
    if not tensors:
        return losses
    values = iter(torch.stack([t.detach().reshape(()) for t in tensors]).double().tolist())
    return [next(values) if torch.is_tensor(v) else v for v in losses]


def _stop_requested(hooks: Sequence[RunHooks], flag: dict) -> bool:
    """SIGTERM seen by this process or, through the hooks (:class:`pbscale.execution.distributed.
    RankSync`), by any rank, so that all ranks checkpoint before the same step."""
    now = time.perf_counter()  # the time since the last check: one step (or an epoch's end)
    flag["longest"], flag["mark"] = max(flag["longest"], now - flag["mark"]), now
    for h in hooks:
        flag["term"] = h.stop_requested(flag["term"])
    if flag["term"]:  # the loop acts now: it checkpoints, so the timer must not cut it
        flag["acting"] = True
        _stop_timer(flag)
    return flag["term"]


def _frozen_mask(hooks: Sequence[RunHooks], method: Method,
                 generator: torch.Generator) -> torch.Tensor:
    """The first mask a hook chooses to freeze, else the method's most probable mask."""
    for h in hooks:
        z = h.frozen_mask(method, generator)
        if z is not None:
            return z
    return method.mode_mask()


def train_step(f: BatchedLoss, method: Method, weight_optimizer: torch.optim.Optimizer | None,
               opts: list[torch.optim.Optimizer], fixed: torch.Tensor | None,
               joint: bool) -> float:
    """One step: masks train (surrogate of the method) or are fixed (warm-up / frozen: only the
    weights train, on the loss of the fixed mask). Returns the training loss. A loss that is
    NaN or inf makes no update (the run stops on it: :func:`check_finite` then reads the
    parameters the loss came from, to name the cause)."""
    if fixed is not None:
        if not joint:
            with torch.no_grad():
                return float(f(fixed[None])[0])
        weight_optimizer.zero_grad()
        loss = f(fixed[None])[0]
        value = float(loss.detach())
        if not math.isfinite(value):
            return value
        if loss.requires_grad:  # else f differentiated it itself (a group, member by member)
            loss.backward()
        weight_optimizer.step()
        return value
    for opt in opts:
        opt.zero_grad()
    value, loss = method.surrogate(f, weights=joint)
    if isinstance(loss, float) and not math.isfinite(loss):
        return loss
    if value.requires_grad:  # else nothing trains this step (a fixed mask over fixed weights)
        value.backward()
    method.apply()
    if joint:
        weight_optimizer.step()
    return loss
