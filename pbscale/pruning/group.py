"""Pruning groups: G runs of one model, mode and method (seeds, L0 strengths and mask learning
rates of one setting) trained in one process through the one run loop, :func:`pbscale.runs.loop.run`
(``python -m pbscale.prune ... --seeds 0-7``).

Design (the loop stays single-run; a group is one run of it, as in :mod:`pbscale.regression.group`):

* each member is the separate run, built whole by :func:`pbscale.pruning.run.assemble` (its
  :class:`pbscale.pruning.task.PruneTask` with its own network, batches and evaluation, its method
  from the family's ``make`` with its own generator, its weights' optimizer) and named by the
  same configuration hash (:class:`Member`);
* :class:`GroupMethod` is the loop's method: one training step of the group is each member's
  own step on its own batch, one member after another (:class:`pbscale.execution.group.
  MemberBook`): its surrogate on its own batched loss, its backward, its optimizer updates.
  So a member's numbers are its separate run's, bit for bit (its arithmetic does not depend on
  the group; ``tests/test_group_equality.py`` checks it on real MNIST);
* :class:`GroupTask` is the loop's task: the members' batch orders (row g from member g's
  generator), the members' own losses in the fixed-mask phases (a joint run's dense warm-up and
  frozen epochs), each member's own :class:`pbscale.pruning.evaluation.MaskEvaluation` (columns
  ``run<g>.<metric>``) and frozen mask; after every epoch it writes each member's run folder
  where and as ``python -m pbscale.prune`` writes it (config.json, metrics.csv; after the last
  epoch summary.json, data.json, masks.pt, pruned.pt; seconds are the group's over G);
* the group's own folder ``<out>/.groups/group-<model>-<mode>-<method>-<G>runs-<hash>`` holds
  its checkpoint (every epoch and on SIGTERM / SIGINT; the same command resumes); members
  already finished are left out of the next group, and the group holds each member's folder
  lock while it trains (:func:`pbscale.runs.records.lock_folder`: one writer per run folder; a
  folder another process holds is refused). A member whose folder another process finished
  meanwhile without the lock (another host over NFS, an older pbnn) is left alone: the group
  stops it, writes nothing more there and says so.

A diverging member (a NaN or inf loss, logits, weights or evaluation loss) is recorded in its
folder (``diverged.json``, :func:`pbscale.runs.records.write_diverged`, the message its separate
run gives), stops training and the others go on; :func:`train_group` then ends with a one-line
error naming the diverged members. A member diverged before (its record there) is left out of
the group and named the same way.
"""

from __future__ import annotations

import dataclasses
import math
import resource
import sys
from collections.abc import Callable, Collection
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from pbexact.errors import PBInputError, format_bytes
from pbscale.execution.group import MemberBook, MemberLosses
from pbscale.methods.samplers import free_memory
from pbscale.pruning.assembly import Assembly
from pbscale.pruning.lam_control import LamController
from pbscale.pruning.outputs import export
from pbscale.pruning.task import PruneTask
from pbscale.runs import io as runio
from pbscale.runs.contracts import EvalContext, LoopConfig, Method, RunHooks
from pbscale.runs.loop import LR_FLAGS, check_metrics, run, run_folder, write_summary
from pbscale.runs.loop import check_finite as check_member
from pbscale.runs.records import (
    GROUPS,
    Diverged,
    groups_folder,
    hashed_part,
    last_metrics,
    lock_folder,
    open_folder,
    read_diverged,
    write_diverged,
)


def member_key(full: dict) -> str:
    """The name of a group member in ``$PBSCALE_RUN_INFO``'s "sweep_ids": seed, lam and mask
    lr."""
    return (f"seed{int(full['seed'])}-lam{float(full['lam'])!r}"
            f"-mask_lr{float(full['mask_lr'])!r}")


@dataclass
class Member:
    """One run of a group, assembled as the separate run is (``assembly``: task, method, loop
    settings, weights' optimizer (None: supermask), its ``--lam-target`` controller (None: lam
    fixed; the group names its column)), its run folder, the config.json record a separate run
    writes, whether its weights are rescaled on export, and data.json's content."""

    assembly: Assembly
    folder: Path
    record: dict
    rescale: bool
    data_info: dict

    @property
    def task(self) -> PruneTask:
        return self.assembly.task

    @property
    def method(self) -> Method:
        return self.assembly.method

    @property
    def loop(self) -> LoopConfig:
        return self.assembly.loop

    @property
    def weight_opt(self) -> torch.optim.Optimizer | None:
        return self.assembly.weight_opt

    @property
    def controller(self) -> LamController | None:
        return self.assembly.controller

    @property
    def finished(self) -> bool:
        """Whether its folder holds a finished run's summary.json (a damaged one, which the
        separate run refuses too, is a one-line :class:`PBInputError` naming the file)."""
        path = self.folder / "summary.json"
        if not path.exists() and not path.is_symlink():
            return False
        runio.read_summary(path, self.task.summary_keys)
        return True

    @property
    def diverged(self) -> dict | None:
        """Its folder's divergence record (:func:`pbscale.runs.records.read_diverged`), or None."""
        return read_diverged(self.folder)

    def weights(self) -> list[torch.nn.Parameter]:
        """The weights its separate run's loop checks: the trained ones (joint), else none."""
        return self.task.weights() if self.weight_opt is not None else []


class OptimizerGroup:
    """The members' weight optimizers as the one the loop steps: their parameter groups (the
    loop's learning-rate schedule sets each), one ``zero_grad`` / ``step`` over all (a member
    that stopped has no gradients, so its optimizer leaves its weights alone; one whose loss of
    this step is NaN or inf, ``skip()`` of its index, is not stepped: as its separate run, it
    stops with the weights its loss came from), the state of each."""

    def __init__(self, optimizers: list[torch.optim.Optimizer],
                 skip: Callable[[], Collection[int]] = frozenset) -> None:
        self.optimizers, self.skip = optimizers, skip

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def step(self) -> None:
        skip = self.skip()
        for g, o in enumerate(self.optimizers):
            if g not in skip:
                o.step()

    def state_dict(self) -> dict:
        return {"members": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["members"]) != len(self.optimizers):
            raise ValueError("member count")
        for o, s in zip(self.optimizers, state["members"]):
            o.load_state_dict(s)


class GroupMethod(MemberBook):
    """The loop's method over G members (see the module docstring). ``generator`` is the
    group's stream for the loop (unused: the task draws from the members' own generators);
    ``d`` is G times the members' mask size (masks of the group are the members' side by
    side). ``position`` is the (epoch, step) the loop is at (:meth:`GroupTask.before_step`),
    for the divergence records; ``flags`` the learning-rate flags a divergence names."""

    #: each member's weights are checked here (:meth:`check_finite`), not by the loop
    checks_weights = True

    def __init__(self, members: list[Member], device: torch.device,
                 flags: dict[str, str]) -> None:
        self.members = members
        self.methods = [m.method for m in members]
        self.d = sum(m.task.d for m in members)
        self.generator = torch.Generator(device=device).manual_seed(0)
        self.flags = flags
        self.position = (0, 0)
        #: members whose last step's loss was not finite, checked after the step (settle)
        self.pending: list[tuple[int, torch.Tensor | None]] = []
        super().__init__(self.methods)

    def sample_masks(self, k: int) -> torch.Tensor:
        return torch.cat([m.sample_masks(k) for m in self.methods], dim=1)

    def mode_mask(self) -> torch.Tensor:
        return torch.cat([m.mode_mask() for m in self.methods])

    @property
    def dtype(self) -> torch.dtype:
        return self.methods[0].dtype

    # ------------------------------------------------------------------ divergence

    def diverge(self, g: int, exc: Diverged) -> None:
        """Record member g's divergence in its folder and stop training it; when none is left,
        the group itself stops (:class:`Diverged`, naming every member)."""
        m = self.members[g]
        record = exc.record(last_metrics(m.folder, m.loop.metrics_file))
        write_diverged(m.folder, record)
        self.stopped[g] = record
        if not self.training():
            names = "; ".join(f"{self.members[i].folder.name}: "
                              f"{r.get('reason', 'finished by another process')}"
                              for i, r in sorted(self.stopped.items())[:3])
            more = len(self.stopped) - 3
            raise Diverged(f"every run of the group diverged ({names}"
                           f"{f'; {more} more' if more > 0 else ''})", exc.epoch, exc.step,
                           exc.where)

    def leave(self, g: int) -> None:
        """Stop member g, whose folder another process finished meanwhile (one that did not
        take the folder's lock: another host over NFS, an older pbnn): the group writes
        nothing more there and says so."""
        folder = self.members[g].folder
        print(f"{folder}: finished by another process meanwhile; the group leaves it alone",
              file=sys.stderr)
        self.stopped[g] = {"left": str(folder)}
        if not self.training():
            raise PBInputError(f"every run of the group was finished by another process "
                               f"meanwhile (the last: {folder}); nothing is left to train")

    def surrogate(self, f: MemberLosses, weights: bool = False) -> tuple[torch.Tensor, float]:
        """Each training member's step (:class:`pbscale.execution.group.MemberBook`); a member
        whose loss is NaN or inf is checked after the step (:meth:`settle`, once its optimizers
        stepped, as its separate run's loop checks it); the mean is over the finite losses."""
        value, _ = super().surrogate(f, weights)
        losses = [v for v in self.step_losses.values() if math.isfinite(v)]
        self.pending += [(g, None) for g, v in self.step_losses.items() if not math.isfinite(v)]
        return value, sum(losses) / len(losses) if losses else math.nan

    def pending_members(self) -> set[int]:
        """The members whose loss of this step was NaN or inf (to be settled)."""
        return {g for g, _ in self.pending}

    def apply(self) -> None:
        """Each training member's optimizer step, but those of a member whose loss of this step
        was NaN or inf: it stops with the logits its loss came from, as its separate run does
        (:func:`pbscale.runs.loop.train_step`), so the divergence names the same cause."""
        skip = self.pending_members()
        for g in self.training():
            if g not in skip:
                self.book[g].apply()

    def settle(self) -> None:
        """Record the members whose last step's loss was NaN or inf (``pending``: (index,
        fixed mask of the step or None)) with their separate run's message, and stop them."""
        pending, self.pending = self.pending, []
        epoch, i = self.position
        for g, fixed in pending:
            if g in self.stopped:
                continue
            m = self.members[g]
            step = (epoch * m.task.steps_per_epoch + i + 1, i + 1, fixed)
            try:
                check_member(m.method, epoch, self.flags, m.weights(), step=step)
            except Diverged as exc:
                self.diverge(g, exc)

    def check_finite(self, where: str, flags: dict[str, str]) -> None:
        """After an epoch: each training member's logits and weights, as its separate run's
        loop checks them; a member that fails is recorded and stops."""
        self.settle()
        for g in self.training():
            m = self.members[g]
            try:
                check_member(m.method, self.position[0], flags, m.weights())
            except Diverged as exc:
                self.diverge(g, exc)


class GroupLoss(MemberLosses):
    """The loss of one step of the group: each member's own batched loss (``parts``). Called
    by the loop's fixed-mask step (a joint run's warm-up and frozen epochs) with the members'
    fixed masks side by side, z (1, G d): each training member's loss of its mask, computed and
    differentiated at once (``backward``, as its separate run's step does), its training loss
    kept; returns the members' mean loss (1,), without a graph."""

    def __init__(self, parts: list, d: int, method: GroupMethod) -> None:
        super().__init__(parts)
        self.d, self.method = d, method

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        losses = []
        for g in self.method.training():
            zg = z[:, g * self.d:(g + 1) * self.d]
            J = self.parts[g](zg)[0]
            if J.requires_grad:
                J.backward()
            loss = float(J.detach())
            if not math.isfinite(loss):
                self.method.pending.append((g, zg[0]))
                continue
            self.method.record(g, loss)
            losses.append(loss)
        return torch.tensor([sum(losses) / len(losses) if losses else math.nan])


class GroupTask(RunHooks):
    """The loop's task over G members, and its own hooks (the step's position, frozen masks,
    the members' folders); see the module docstring."""

    lr_flags = PruneTask.lr_flags

    def __init__(self, members: list[Member], method: GroupMethod,
                 device: torch.device) -> None:
        self.members, self.method, self.device = members, method, device
        first = members[0].task
        self.G, self.member_d = len(members), first.d
        self.name = f"group-{first.name}-{self.G}runs"
        self.d = self.G * first.d
        self.steps_per_epoch = first.steps_per_epoch
        self.joint = members[0].weight_opt is not None
        #: each member's history columns (after "epoch"), for the empty cells of one that
        #: stopped
        self.columns: dict[int, list[str]] = {}
        #: the members' --lam-target controllers, by index; member g's lambda column is
        #: "run<g>.lam" of the group's rows
        self.controllers = {g: m.controller for g, m in enumerate(members)
                            if m.controller is not None}
        for g, c in self.controllers.items():
            c.key = f"run{g}.lam"

    def config(self) -> dict:
        """The members' tasks as config.json format 1 hashed them (the group's folder, which
        holds only its checkpoint, keeps the name it had before format 2)."""
        return {"runs": [m.assembly.legacy["task"] for m in self.members]}

    def weights(self) -> list[torch.nn.Parameter]:
        return [p for m in self.members for p in m.task.weights()]

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return torch.stack([m.task.epoch_order(m.method.generator) for m in self.members])

    def batch_loss(self, order: torch.Tensor, i: int) -> GroupLoss:
        training = set(self.method.training())
        parts = [m.task.batch_loss(order[g], i) if g in training else None
                 for g, m in enumerate(self.members)]
        return GroupLoss(parts, self.member_d, self.method)

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        losses = self.method.pop_epoch_losses()
        masks = (list(ctx.mask.view(self.G, self.member_d)) if ctx.mask is not None
                 else [None] * self.G)
        out: dict[str, float] = {}
        for g, m in enumerate(self.members):
            row = None
            if g not in self.method.stopped:
                row = m.task.evaluate(EvalContext(m.method, m.method.generator, ctx.phase,
                                                  masks[g], ctx.epoch))
                try:
                    if ctx.epoch > 0:
                        check_metrics(row, ctx.epoch - 1, self.lr_flags, self.joint)
                except Diverged as exc:
                    self.method.diverge(g, exc)
                    row = None
            if row is None:  # stopped: empty cells
                out.update({f"run{g}.{k}": None for k in self.columns[g]})
                continue
            full = {"train_loss": losses[g], **row}
            self.columns[g] = list(full)
            out.update({f"run{g}.{k}": v for k, v in full.items()})
        return out

    def state_dict(self) -> dict:
        state = {"members": [m.task.state_dict() for m in self.members],
                 "columns": {str(g): list(c) for g, c in self.columns.items()}}
        if self.controllers:
            state["controllers"] = {str(g): c.hook_state() for g, c in self.controllers.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        if len(state["members"]) != self.G:
            raise ValueError("member count")
        for m, st in zip(self.members, state["members"]):
            m.task.load_state_dict(st)
        self.columns = {int(g): list(c) for g, c in state.get("columns", {}).items()}
        for g, kept in state.get("controllers", {}).items():
            self.controllers[int(g)].load_hook_state(kept)

    # ------------------------------------------------------------------ hooks

    def before_step(self, epoch: int, i: int) -> None:
        self.method.position = (epoch, i)

    def after_step(self, epoch: int, i: int) -> None:
        self.method.settle()
        for g, c in self.controllers.items():  # each member's, as in its separate run
            if g not in self.method.stopped:
                c.after_step(epoch, i)

    def epoch_done(self, epoch: int, history: list[dict]) -> None:
        for g, c in self.controllers.items():
            if g in self.method.stopped:
                for row in history:
                    row.setdefault(c.key, None)
            else:
                c.epoch_done(epoch, history)

    def progress(self, row: dict) -> dict:
        """The bar's postfix: the training members' count and their mean metrics."""
        live = [g for g in range(self.G) if g not in self.method.stopped]
        out: dict = {"runs": len(live)}
        for k in ("train_loss", "val_acc", "val_loss", "remaining"):
            vals = [row.get(f"run{g}.{k}") for g in live]
            if vals and all(isinstance(v, float) for v in vals):
                out[f"mean {k}"] = f"{sum(vals) / len(vals):.4g}"
        return out

    def frozen_mask(self, method: object, generator: torch.Generator) -> torch.Tensor:
        return torch.cat([
            m.task.evaluation.frozen_mask(m.method, m.method.generator)
            if g not in self.method.stopped
            else torch.zeros(self.member_d, dtype=self.method.dtype, device=self.device)
            for g, m in enumerate(self.members)])

    def member_row(self, row: dict, g: int) -> dict:
        """Member g's history row as its separate run's loop writes it."""
        p = f"run{g}."
        own = {k[len(p):]: v for k, v in row.items() if k.startswith(p)}
        lam = {"lam": own.pop("lam")} if "lam" in own else {}  # the separate run's last column
        return {"epoch": row["epoch"], "train_loss": own.pop("train_loss"), **own,
                "train_seconds": row["train_seconds"] / self.G,
                "val_seconds": row["val_seconds"] / self.G, **lam}

    def after_epoch(self, history: list[dict], final: bool) -> None:
        for g, m in enumerate(self.members):
            if g in self.method.stopped:
                continue
            if (m.folder / "summary.json").exists():  # not by this group: it writes it last
                self.method.leave(g)
                continue
            rows = [self.member_row(row, g) for row in history]
            runio.write_json(m.folder / "config.json", m.record)
            runio.write_csv(m.folder / m.loop.metrics_file, rows)
            if final:
                extra = export(m.folder, m.task.evaluation, m.rescale)
                runio.write_json(m.folder / "data.json", m.data_info)
                write_summary(m.folder, rows, self.device, **extra)


def member_bytes(member: Member) -> int:
    """About the memory one member holds while its group trains: its network's parameters and
    buffers (joint: with their gradients, SGD momentum and the checkpoint's two copies, 5 P),
    its mask state (logits or mask, their gradient, two optimizer states, the evaluation mask:
    5 d values), twice over (the group's checkpoint is serialized in memory before it is
    written). Measured on LeNet-300-100 (peak resident set of a group of 34 against one of 2,
    2026-11-27): 10.9 MiB per member for CP supermask (this estimate 12.2 MiB), 21.1 MiB for
    ARMS joint (21.3 MiB)."""
    params = sum(p.numel() * p.element_size() for p in member.task.model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in member.task.model.buffers())
    weights = params * (5 if member.weight_opt is not None else 1) + buffers
    return 2 * (weights + 5 * member.task.d * 4)


def available_memory(device: torch.device) -> int:
    """Bytes a group may still take on ``device``: the free memory
    (:func:`pbscale.methods.samplers.free_memory`), on the CPU also bounded by what the
    process's address-space limit (``ulimit -v``) leaves."""
    free = free_memory(device)
    if device.type != "cpu":
        return free
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return free
    try:
        with open("/proc/self/status") as fh:
            used = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return free
    return max(min(free, limit - used), 0)


def check_group_memory(first: Member, runs: int, device: torch.device) -> None:
    """Refuse (one line, before the other members are built) a group of ``runs`` members like
    ``first`` whose state (:func:`member_bytes`) does not fit in :func:`available_memory`,
    naming the largest group that fits."""
    per = member_bytes(first)
    avail = available_memory(device)
    if runs * per <= avail:
        return
    raise PBInputError(
        f"a group of {runs:,} runs needs about {format_bytes(runs * per)} ({format_bytes(per)} "
        f"per run: network, masks, optimizer states and their checkpoint), more than the "
        f"{format_bytes(avail)} available on {device}; train at most {max(avail // per, 1):,} "
        f"runs per group (split --seeds, --lam or --mask-lr over several commands)")


def group_folder(members: list[Member], out: str | Path) -> Path:
    """The group folder of ``members`` under ``out/.groups`` (named as :func:`train_group`'s
    run names it: the members' task (format 1, :meth:`GroupTask.config`) and method
    configurations and the loop's)."""
    loop = dataclasses.replace(members[0].loop, seed=0)
    config = {"task": {"runs": [m.assembly.legacy["task"] for m in members]},
              "method": {"runs": [m.method.config_dict() for m in members]},
              "loop": loop.to_dict()}
    name = f"group-{members[0].task.name}-{len(members)}runs"
    return run_folder(groups_folder(out), name, config)


@dataclass
class GroupResult:
    """What :func:`train_group` did: runs already finished, runs trained to the end, and the
    diverged runs (folder, record), those of this group and those recorded before, of
    ``total`` runs."""

    finished: int
    trained: int
    diverged: list[tuple[Path, dict]]
    total: int

    def refusal(self, out: str | Path) -> PBInputError:
        """The one-line error naming the diverged runs."""
        names = "; ".join(f"{f.name}: {r['reason']}" for f, r in self.diverged[:3])
        more = len(self.diverged) - 3
        return PBInputError(
            f"{len(self.diverged)} of {self.total} runs of the group diverged "
            f"({names}{f'; {more} more' if more > 0 else ''}); the other runs are finished in "
            f"{out}, each diverged run's record is its diverged.json: lower the rate it names "
            f"(another run folder), or delete diverged.json to train it again")


def train_group(members: list[Member], out: str | Path, device: torch.device,
                progress: bool = False, step_hook=None,
                keep_checkpoint: bool = True) -> GroupResult:
    """Train the unfinished ``members`` as one group with :func:`pbscale.runs.loop.run` (or resume
    the group, or return at once). Members diverged before are left out (unless the group
    they diverged in resumes: it skips them itself). ``keep_checkpoint=False``: the group's
    checkpoint.pt is deleted once it finished (``--drop-checkpoint``)."""
    with ExitStack() as locks:  # one writer per run folder, from here to the end
        for m in [m for m in members if not m.finished]:
            locks.enter_context(lock_folder(m.folder))
        return _train_locked(members, out, device, progress, step_hook, keep_checkpoint)


def _train_locked(members: list[Member], out: str | Path, device: torch.device,
                  progress: bool, step_hook, keep_checkpoint: bool) -> GroupResult:
    """:func:`train_group` once the unfinished members' folders are locked (so that "finished"
    is read when no other process can change it)."""
    unfinished = [m for m in members if not m.finished]
    before = [(m, m.diverged) for m in unfinished]
    fresh = [m for m, r in before if r is None]
    todo = fresh
    if len(fresh) < len(unfinished):  # a group that was cut after a member diverged resumes
        ckpt = group_folder(unfinished, out) / "checkpoint.pt"
        if ckpt.exists():
            todo = unfinished
    recorded = [(m.folder, r) for m, r in before if r is not None and m not in todo]
    if not todo:
        return GroupResult(len(members) - len(unfinished), 0, recorded, len(members))
    for m in todo:  # the checks the separate run makes of its folder, before anything trains
        open_folder(out, m.task.name, hashed_part(m.record), m.record,
                    ("config.json", m.loop.metrics_file, "checkpoint.pt", "summary.json"))
    method = GroupMethod(todo, device, {**LR_FLAGS, **GroupTask.lr_flags})
    task = GroupTask(todo, method, device)
    loop = dataclasses.replace(todo[0].loop, seed=0)
    opts = [m.weight_opt for m in todo if m.weight_opt is not None]
    weight_opt = OptimizerGroup(opts, method.pending_members) if opts else None
    folder = group_folder(todo, out)
    for m in todo:
        m.record["info"].update(group=f"{GROUPS}/{folder.name}", grouped_runs=len(todo))
    run(task, method, loop, groups_folder(out), weight_optimizer=weight_opt, device=device,
        progress=progress, info={"runs": [m.folder.name for m in todo]}, step_hook=step_hook,
        hooks=[task], lr_flags=task.lr_flags, method_info=todo[0].record.get("method_info"),
        keep_checkpoint=keep_checkpoint)
    diverged = recorded + [(todo[g].folder, r) for g, r in sorted(method.stopped.items())
                           if "reason" in r]
    left = sum("left" in r for r in method.stopped.values())
    return GroupResult(len(members) - len(unfinished) + left,
                       len(todo) - len(method.stopped), diverged, len(members))

