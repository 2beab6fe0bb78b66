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
  mid-epoch, with the epoch's batch order, then one line saying how to resume and exit code 143
  or 130), loaded with ``weights_only=True``; a resumed run gives the same numbers as an
  uninterrupted one; the metrics CSV (one row per epoch, epoch 0 the evaluation before
  training), a tqdm progress bar with the latest metrics and ``summary.json``;
* what the folder's name does not say but its results depend on, recorded in config.json's
  "info" (:data:`PROVENANCE`: the data's fingerprint, the number of processes): a rerun whose
  values differ is refused;
* divergence: a step whose training loss is NaN or inf, or an epoch that leaves NaN or inf mask
  logits or weights, stops the run with one line naming the step and the flag that sets the
  learning rate to lower (:data:`LR_FLAGS`, the caller's ``lr_flags`` overriding them); no summary
  is written and the last checkpoint stays the last finite state.

Phases of an epoch e of E: the first W epochs warm up, the last Z (only with freeze_masks) are
frozen, the rest train masks, with (W, E - W - Z, Z) from :meth:`LoopConfig.phase_epochs`: the
boundaries round(mask_warmup E) and round(freeze_masks E), then a phase given a fraction > 0
that got no epoch takes one from the longest phase (while that has more than one), so a fraction
> 0 lasts at least one epoch: a 5-epoch joint run with mask_warmup = 0.1 warms up for one epoch
(round(0.5) = 0 gave none). :meth:`LoopConfig.mask_epochs` (the mask-training epochs) is what
CP's temperature schedule counts (`pbscale.prune`).

Callers add behaviour through explicit strategy objects, :class:`RunHooks` (every hook a
no-op by default), passed as ``run(..., hooks=[...])``: ``before_step(epoch, i)``,
``training_loss(f)`` (the batched loss the method's surrogate sees while masks train; sample
parallelism hands over the whole batch), ``frozen_mask(method, generator)`` (the mask frozen for
the last epochs; default the method's most probable mask), ``stop_requested(flag)`` (SIGTERM seen
here or, under torch.distributed, by any rank) and ``after_epoch(history, final)`` (after every
epoch's checkpoint, ``final`` True after the last epoch and, for a run whose last epoch was
already checkpointed, once more before ``summary.json``). Distribution
(:mod:`pbscale.distributed`) is such a strategy; batched runs (:mod:`pbscale.batched_seeds`)
write each member's own run folder from ``after_epoch``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from pbexact.errors import PBInputError
from pbexact.io import check_out_dir

from . import io
from .loop_types import BatchedLoss, EvalContext, LoopConfig, Method, RunHooks, StepHook, Task

#: Flags named when a run diverges: the mask learning rate and optimizer, the weight learning
#: rate (those of ``pbscale.regress``; ``run(..., lr_flags=...)`` overrides entries).
LR_FLAGS = {"masks": "--lr", "optimizer": "--optimizer", "weights": "--lr"}
#: Entries of ``info`` (config.json, unhashed) that must match when a run folder is reused:
#: the fingerprint of the data and the number of processes (torchrun) that made the run.
PROVENANCE = ("data", "world_size")
#: Columns the loop writes into every history row.
LOOP_COLUMNS = ("epoch", "train_loss", "train_seconds", "val_seconds")


def config_hash(config: dict) -> str:
    """First 12 hex digits of the SHA-256 of the canonical JSON of ``config``."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_folder(out: str | Path, task_name: str, config: dict) -> Path:
    """``<out>/<task_name>-<config_hash(config)>``."""
    return Path(out) / f"{task_name}-{config_hash(config)}"


def full_config(task: Task, method: Method, loop: LoopConfig) -> dict:
    """The configuration a run folder is named by: task, method and loop."""
    return {"task": task.config(), "method": method.config_dict(), "loop": loop.to_dict()}


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


@contextmanager
def _sigterm_flag() -> Iterator[dict]:
    """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the loop checks after every step (main
    thread only); ``flag["signal"]`` is the last one received."""
    flag: dict[str, Any] = {"term": False, "signal": signal.SIGTERM}

    def handler(signum: int, _frame: Any) -> None:
        flag.update(term=True, signal=signum)

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
        for sig, old in olds.items():
            signal.signal(sig, old)


def resume_command() -> str:
    """The command line that started this process (``python -m MODULE ARGS`` for a module),
    which resumes an interrupted run."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None and spec.name else (
        ["python", sys.argv[0]] if sys.argv and sys.argv[0] else [])
    return shlex.join(head + sys.argv[1:]) if head else "the same command"


def check_provenance(folder: Path, old: Any, new: dict) -> None:
    """Refuse (one line) to reuse ``folder`` when its recorded :data:`PROVENANCE` (``old``:
    config.json's "info") differs from this run's (``new``); an entry missing on either side
    (a folder written before it was recorded) is not compared."""
    old = old if isinstance(old, dict) else {}
    for key in PROVENANCE:
        if key in old and key in new and old[key] != new[key]:
            what = ("other data (fingerprint {} there, {} now)" if key == "data" else
                    "{} processes (torchrun), this run has {}")
            raise PBInputError(
                f"{folder} holds a run made from {what.format(old[key], new[key])}; choose "
                f"another --out or delete the folder")


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
        method_info: dict | None = None) -> Path:
    """Train (or resume, or return at once if finished) one run; returns its folder.

    ``weight_optimizer`` over ``task.weights()`` (None: supermask, weights fixed). ``info``:
    extra facts written to config.json but not hashed (device, threads, chunk...).
    ``hooks``: :class:`RunHooks` strategies; ``step_hook(epoch, i)`` is short for
    ``StepHook(step_hook)`` after them. ``lr_flags``: the tool's names of the learning-rate
    flags a divergence message tells the user to lower (keys of :data:`LR_FLAGS`).
    ``method_info``: what config.json records about the method (unhashed, "method_info":
    :meth:`pbscale.methods.registry.Family.info`), so the run reads back without the registry.
    """
    flags = {**LR_FLAGS, **(lr_flags or {})}
    hooks = [*hooks, *([StepHook(step_hook)] if step_hook is not None else [])]
    loop.validate()
    dev = torch.device(device)
    config = full_config(task, method, loop)
    check_out_dir(Path(out))
    folder = run_folder(out, task.name, config)
    for name in ("config.json", loop.metrics_file, "checkpoint.pt", "summary.json"):
        if (folder / name).is_dir():
            raise PBInputError(f"damaged run folder: {folder / name} is a folder, not a file; "
                               f"{io.DAMAGED_FIX}")
    record = {**config, "info": {"device": str(dev), **(info or {}), **env_info()}}
    if method_info is not None:
        record["method_info"] = method_info
    if (folder / "config.json").exists():
        old = io.read_json(folder / "config.json")
        if not isinstance(old, dict):
            raise PBInputError(f"damaged run file {folder / 'config.json'} (not a JSON object); "
                               f"{io.DAMAGED_FIX}")
        if {k: old.get(k) for k in config} != json.loads(json.dumps(config)):
            raise PBInputError(
                f"{folder} holds a run with another configuration; choose another --out "
                "or delete the folder"
            )
        check_provenance(folder, old.get("info"), record["info"])
    if (folder / "summary.json").exists():
        return folder
    joint = weight_optimizer is not None
    weights = task.weights() if joint else []
    if joint and not weights:
        raise PBInputError("a weight optimizer was given but the task has no trainable weights")
    io.write_json(folder / "config.json", record)

    generator = method.generator  # the run's stream, seeded by the method
    torch.manual_seed(loop.seed)
    opts = method.optimizers + ([weight_optimizer] if joint else [])
    ckpt_path = folder / "checkpoint.pt"
    fixed: torch.Tensor | None = None
    state = io.load_checkpoint(ckpt_path, keys=_CHECKPOINT_KEYS)
    pos = None  # (order, next step, losses) of an epoch cut by SIGTERM
    if state is not None:
        try:
            history, start, fixed, pos = _restore(state, method, task, weights, weight_optimizer,
                                                  generator, loop.epochs, dev)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError):
            raise PBInputError(
                f"damaged checkpoint {ckpt_path} (its contents do not fit this run); "
                f"{io.DAMAGED_FIX}"
            ) from None
    else:
        history, start = [], 0

    def evaluate(epoch: int, phase: str) -> dict:
        mask = fixed if phase != "train" else None
        return task.evaluate(EvalContext(method, generator, phase, mask, epoch))

    def save(epoch: int, position: dict | None) -> None:
        io.save_checkpoint(ckpt_path, {
            "method": method.state_dict(), "task": task.state_dict(),
            "weights": [p.detach().cpu() for p in weights],
            "weight_opt": weight_optimizer.state_dict() if joint else None,
            "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
            "history": history, "epoch": epoch, "fixed": None if fixed is None else fixed.cpu(),
            "position": position,
        })

    if not history:
        phase0 = loop.phase(0)
        if phase0 == "warmup":
            fixed = torch.ones(task.d, device=dev, dtype=method.dtype)
        history.append({"epoch": 0, "train_loss": math.nan, **evaluate(0, phase0),
                        "train_seconds": 0.0, "val_seconds": 0.0})
    bar = tqdm(range(start, loop.epochs), initial=start, total=loop.epochs,
               disable=not progress, desc=task.name, unit="epoch", file=sys.stderr)
    with _sigterm_flag() as flag, flush_denormals(dev):
        for epoch in bar:
            phase = loop.phase(epoch)
            if phase == "warmup":
                fixed = torch.ones(task.d, device=dev, dtype=method.dtype)
            elif phase == "frozen" and (fixed is None or loop.phase(epoch - 1) != "frozen"):
                if pos is None:
                    fixed = _frozen_mask(hooks, method, generator).detach()
            elif phase == "train":
                fixed = None
            _set_lrs(method.optimizers, loop.lr_factor(epoch, masks=True))
            if joint:
                _set_lrs([weight_optimizer], loop.lr_factor(epoch, masks=False))
            t0 = time.perf_counter()
            if pos is not None:
                order, first, losses = pos["order"].to(dev), pos["step"], pos["losses"]
                pos = None
            else:
                order, first, losses = task.epoch_order(generator), 0, []
            for i in range(first, task.steps_per_epoch):
                if _stop_requested(hooks, flag):
                    save(epoch, {"order": order.cpu(), "step": i, "losses": losses})
                    bar.close()
                    sig = signal.Signals(flag["signal"])
                    print(f"{sig.name}: checkpoint written to {ckpt_path}; resume with: "
                          f"{resume_command()}", file=sys.stderr)
                    sys.exit(128 + sig.value)
                for h in hooks:
                    h.before_step(epoch, i)
                f = task.batch_loss(order, i)
                if fixed is None:
                    for h in hooks:
                        f = h.training_loss(f)
                losses.append(train_step(f, method, weight_optimizer, opts, fixed, joint))
                if not math.isfinite(losses[-1]):
                    _check_finite(method, epoch, flags, weights,
                                  step=(epoch * task.steps_per_epoch + i + 1, i + 1, fixed))
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t1 = time.perf_counter()
            _check_finite(method, epoch, flags, weights)
            metrics = evaluate(epoch + 1, phase)
            t2 = time.perf_counter()
            history.append({"epoch": epoch + 1, "train_loss": sum(losses) / max(len(losses), 1),
                            **metrics, "train_seconds": t1 - t0, "val_seconds": t2 - t1})
            save(epoch + 1, None)
            io.write_csv(folder / loop.metrics_file, history)
            for h in hooks:
                h.after_epoch(history, epoch + 1 == loop.epochs)
            bar.set_postfix({k: f"{v:.4g}" for k, v in list(history[-1].items())[1:5]
                             if isinstance(v, float)})
    io.write_csv(folder / loop.metrics_file, history)
    if start == loop.epochs:  # trained before, summary missing
        for h in hooks:
            h.after_epoch(history, True)
    write_summary(folder, history, dev)
    return folder


def write_summary(folder: Path, history: list[dict], device: torch.device | str,
                  **extra: Any) -> None:
    """``summary.json`` of a finished run: ``final_<column>`` of the last history row, the
    training seconds (sum of ``train_seconds``) and per epoch, the device and ``extra``."""
    train_s = sum(h["train_seconds"] for h in history)
    summary = {f"final_{k}": v for k, v in history[-1].items() if k != "epoch"}
    summary.update({"train_seconds": train_s,
                    "seconds_per_epoch": train_s / max(len(history) - 1, 1),
                    "device": str(device), **extra})
    io.write_json(folder / "summary.json", summary)


_CHECKPOINT_KEYS = ("method", "task", "weights", "weight_opt", "generator", "torch_rng",
                    "history", "epoch", "fixed")


def _restore(state: dict, method: Method, task: Task, weights: list[torch.nn.Parameter],
             weight_optimizer: torch.optim.Optimizer | None, generator: torch.Generator,
             epochs: int, dev: torch.device) -> tuple[list, int, torch.Tensor | None, Any]:
    """Load a checkpoint into the method, task, weights, optimizer and RNGs; returns (history,
    next epoch, fixed mask, position of an epoch cut by SIGTERM). A checkpoint that does not fit
    the run raises one of the built-in errors that :func:`run` turns into a one-line error."""
    method.load_state_dict(state["method"])
    task.load_state_dict(state["task"])
    if weight_optimizer is not None:
        if len(state["weights"]) != len(weights):
            raise ValueError("weight count")
        with torch.no_grad():
            for p, v in zip(weights, state["weights"]):
                p.copy_(v.to(p.device))
        weight_optimizer.load_state_dict(state["weight_opt"])
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    history, start = list(state["history"]), int(state["epoch"])
    if not 0 <= start <= epochs or len(history) != start + 1:
        raise ValueError("history length")
    columns = set(history[0]) if isinstance(history[0], dict) else set()
    if not set(LOOP_COLUMNS) <= columns or any(not isinstance(h, dict) or set(h) != columns
                                               for h in history):
        raise ValueError("history rows")
    fixed = state["fixed"].to(dev) if state["fixed"] is not None else None
    return history, start, fixed, state.get("position")


def _stop_requested(hooks: Sequence[RunHooks], flag: dict) -> bool:
    """SIGTERM seen by this process or, through the hooks (:class:`pbscale.distributed.
    RankSync`), by any rank, so that all ranks checkpoint before the same step."""
    for h in hooks:
        flag["term"] = h.stop_requested(flag["term"])
    return flag["term"]


def _frozen_mask(hooks: Sequence[RunHooks], method: Method,
                 generator: torch.Generator) -> torch.Tensor:
    """The first mask a hook chooses to freeze, else the method's most probable mask."""
    for h in hooks:
        z = h.frozen_mask(method, generator)
        if z is not None:
            return z
    return method.mode_mask()


def _check_finite(method: Method, epoch: int, flags: dict[str, str],
                  weights: Sequence[torch.nn.Parameter] = (),
                  step: tuple[int, int, torch.Tensor | None] | None = None) -> None:
    """Stop a diverged run with one line naming where and the flag to lower (``flags``, see
    :data:`LR_FLAGS`): mask logits (:meth:`Method.check_finite`) or weights that became NaN or
    inf after an epoch, or, with ``step`` = (step number, batch, fixed mask), a step whose
    training loss is not finite."""
    where = (f"step {step[0]} (epoch {epoch + 1}, batch {step[1]})" if step is not None
             else f"epoch {epoch + 1}")
    method.check_finite(where, flags)
    if any(not bool(torch.isfinite(p).all()) for p in weights):
        raise PBInputError(f"the network weights became NaN or inf in {where}: the weight "
                           f"learning rate is too large; lower {flags['weights']}")
    if step is not None:
        masks_train = bool(method.optimizers) and step[2] is None
        lower = " or ".join(dict.fromkeys(
            ([flags["masks"]] if masks_train else []) + ([flags["weights"]] if weights else [])))
        raise PBInputError(f"the training loss became NaN or inf at {where}: the run diverged; "
                           f"lower {lower or flags['masks']}")


def env_info() -> dict:
    """Facts a launcher (``pbscale.sweep``) passes in ``$PBSCALE_RUN_INFO`` (a JSON object)
    for config.json's unhashed "info" (e.g. the sweep's run id)."""
    text = os.environ.get("PBSCALE_RUN_INFO")
    return json.loads(text) if text else {}


def train_step(f: BatchedLoss, method: Method, weight_optimizer: torch.optim.Optimizer | None,
               opts: list[torch.optim.Optimizer], fixed: torch.Tensor | None,
               joint: bool) -> float:
    """One step: masks train (surrogate of the method) or are fixed (warm-up / frozen: only the
    weights train, on the loss of the fixed mask). Returns the training loss."""
    if fixed is not None:
        if not joint:
            with torch.no_grad():
                return float(f(fixed[None])[0])
        weight_optimizer.zero_grad()
        loss = f(fixed[None])[0]
        loss.backward()
        weight_optimizer.step()
        return float(loss.detach())
    for opt in opts:
        opt.zero_grad()
    value, loss = method.surrogate(f, weights=joint)
    value.backward()
    method.apply()
    if joint:
        weight_optimizer.step()
    return loss


def read_state(path: str | Path) -> dict[str, Any] | None:
    """A run's checkpoint (``weights_only=True``), or None."""
    return io.load_checkpoint(path)
