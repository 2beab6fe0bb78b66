"""Pruning groups: G runs of one model, mode and method (seeds, L0 strengths and mask learning
rates of one setting) trained as one computation through the one run loop,
:func:`pbscale.loop.run` (``python -m pbscale.prune ... --seeds 0-7``).

Design (the loop stays single-run; a group is one run of it, as in :mod:`pbscale.batched_seeds`):

* each member is the separate run, built whole by :func:`pbscale.prune.build` (its
  :class:`pbscale.prune_task.PruneTask` with its own network, batches and evaluation, its method
  from the family's ``make`` with its own generator, its weights' optimizer) and named by the
  same configuration hash (:class:`Member`);
* :class:`GroupMethod` is the loop's method: one training step of all members is one
  :class:`pbscale.group_forward.ReplayStep` (every member's masks of the step, G x n for MC
  methods and G x 1 or 2 for the others, in one grouped forward), then each member's own
  optimizer update (its own learning rate and schedule); the members' per-step losses are kept
  per member;
* :class:`GroupTask` is the loop's task: the members' batch orders (row g from member g's
  generator), the grouped loss of the fixed-mask phases (a joint run's dense warm-up and frozen
  epochs), each member's own :class:`pbscale.prune_eval.MaskEvaluation` (columns
  ``run<g>.<metric>``) and frozen mask; after every epoch it writes each member's run folder
  where and as ``python -m pbscale.prune`` writes it (config.json, metrics.csv; after the last
  epoch summary.json, data.json, masks.pt, pruned.pt; seconds are the group's over G);
* the group's own folder ``<out>/.groups/group-<model>-<mode>-<method>-<G>runs-<hash>`` holds
  its checkpoint (every epoch and on SIGTERM / SIGINT; the same command resumes), and members
  already finished are left out of the next group.

A member's numbers equal the separate run's to the round-off of the grouped products
(``tests/test_prune_group.py`` states the tolerance measured). A diverging member stops the
group (the NaN check names it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from pbscale import io as runio
from pbscale.group_forward import Batch, GroupForward, ReplayStep
from pbscale.loop import full_config, run, run_folder, write_summary
from pbscale.loop_types import EvalContext, LoopConfig, RunHooks
from pbscale.methods.group import MemberBook
from pbscale.methods.samplers import auto_chunk
from pbscale.prune_export import export
from pbscale.prune_task import PruneTask
from pbscale.run_record import GROUPS, groups_folder


@dataclass
class Member:
    """One run of a group, built as the separate run builds it: task, method, loop settings,
    weights' optimizer (None: supermask), its run folder, the config.json record a separate
    run writes, whether its weights are rescaled on export, and data.json's content."""

    task: PruneTask
    method: object
    loop: LoopConfig
    weight_opt: torch.optim.Optimizer | None
    folder: Path
    record: dict
    rescale: bool
    data_info: dict

    @property
    def finished(self) -> bool:
        return (self.folder / "summary.json").exists()


class OptimizerGroup:
    """The members' weight optimizers as the one the loop steps: their parameter groups (the
    loop's learning-rate schedule sets each), one ``zero_grad`` / ``step`` over all, the state
    of each."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict:
        return {"members": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["members"]) != len(self.optimizers):
            raise ValueError("member count")
        for o, s in zip(self.optimizers, state["members"]):
            o.load_state_dict(s)


class GroupLoss:
    """The batched loss of one step of the group: each member's batch; called by the loop in
    the fixed-mask phases with masks (k, G d) -> the sum over the members of their losses (k,),
    each member's first loss kept (``sink``) as its training loss."""

    def __init__(self, forward: GroupForward, batches: list[Batch], d: int, sink) -> None:
        self.forward, self.batches, self.d, self.sink = forward, batches, d, sink

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        G = len(self.batches)
        parts = z.reshape(z.shape[0], G, self.d).unbind(1)
        J = self.forward([[p] for p in parts], self.batches)
        self.sink([float(j[0].detach()) for j in J])
        return torch.stack(J, 1).sum(1)


class GroupMethod(MemberBook):
    """The loop's method over G members (see the module docstring). ``generator`` is the
    group's stream for the loop (unused: the task draws from the members' own generators);
    ``d`` is G times the members' mask size (masks of the group are the members' side by
    side)."""

    def __init__(self, members: list[Member], step: ReplayStep, device: torch.device) -> None:
        self.members = members
        self.methods = [m.method for m in members]
        self.step = step
        self.d = sum(m.task.d for m in members)
        self.generator = torch.Generator(device=device).manual_seed(0)
        super().__init__(self.methods)

    def surrogate(self, f: GroupLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        results = self.step(self.methods, f.batches, weights)
        losses = [loss for _, loss in results]
        self.record(losses)
        return sum(v for v, _ in results), sum(losses) / len(losses)

    def sample_masks(self, k: int) -> torch.Tensor:
        return torch.cat([m.sample_masks(k) for m in self.methods], dim=1)

    def mode_mask(self) -> torch.Tensor:
        return torch.cat([m.mode_mask() for m in self.methods])

    @property
    def dtype(self) -> torch.dtype:
        return self.methods[0].dtype

    def check_finite(self, where: str, flags: dict[str, str]) -> None:
        for m in self.members:
            m.method.check_finite(f"{where} of run {m.folder.name}", flags)



class GroupTask(RunHooks):
    """The loop's task over G members, and its own hooks (frozen masks, the members' folders);
    see the module docstring."""

    lr_flags = {"masks": "--mask-lr", "optimizer": "--mask-opt", "weights": "--lr"}

    def __init__(self, members: list[Member], method: GroupMethod, forward: GroupForward,
                 device: torch.device) -> None:
        self.members, self.method, self.forward, self.device = members, method, forward, device
        first = members[0].task
        self.G, self.member_d = len(members), first.d
        self.name = f"group-{first.name}-{self.G}runs"
        self.d = self.G * first.d
        self.steps_per_epoch = first.steps_per_epoch

    def config(self) -> dict:
        return {"runs": [m.task.config() for m in self.members]}

    def weights(self) -> list[torch.nn.Parameter]:
        return [p for m in self.members for p in m.task.weights()]

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return torch.stack([m.task.epoch_order(m.method.generator) for m in self.members])

    def batch_loss(self, order: torch.Tensor, i: int) -> GroupLoss:
        batches = [m.task.batches.batch(order[g], i) for g, m in enumerate(self.members)]
        return GroupLoss(self.forward, batches, self.member_d, self.method.record)

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        losses = self.method.pop_epoch_losses()
        masks = (list(ctx.mask.view(self.G, self.member_d)) if ctx.mask is not None
                 else [None] * self.G)
        out: dict[str, float] = {}
        for g, m in enumerate(self.members):
            row = m.task.evaluate(EvalContext(m.method, m.method.generator, ctx.phase,
                                              masks[g], ctx.epoch))
            out[f"run{g}.train_loss"] = losses[g]
            out.update({f"run{g}.{k}": v for k, v in row.items()})
        return out

    def state_dict(self) -> dict:
        return {"members": [m.task.state_dict() for m in self.members]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["members"]) != self.G:
            raise ValueError("member count")
        for m, st in zip(self.members, state["members"]):
            m.task.load_state_dict(st)

    # ------------------------------------------------------------------ hooks

    def frozen_mask(self, method: object, generator: torch.Generator) -> torch.Tensor:
        return torch.cat([m.task.evaluation.frozen_mask(m.method, m.method.generator)
                          for m in self.members])

    def member_row(self, row: dict, g: int) -> dict:
        """Member g's history row as its separate run's loop writes it."""
        p = f"run{g}."
        own = {k[len(p):]: v for k, v in row.items() if k.startswith(p)}
        return {"epoch": row["epoch"], "train_loss": own.pop("train_loss"), **own,
                "train_seconds": row["train_seconds"] / self.G,
                "val_seconds": row["val_seconds"] / self.G}

    def after_epoch(self, history: list[dict], final: bool) -> None:
        for g, m in enumerate(self.members):
            rows = [self.member_row(row, g) for row in history]
            runio.write_json(m.folder / "config.json", m.record)
            runio.write_csv(m.folder / m.loop.metrics_file, rows)
            if final:
                export(m.folder, m.task.evaluation, m.rescale)
                runio.write_json(m.folder / "data.json", m.data_info)
                write_summary(m.folder, rows, self.device)


def group_rows(n_masks: int, d: int, device: torch.device) -> int:
    """The most masks one grouped forward evaluates (the memory guard of MC chunks,
    :func:`pbscale.methods.samplers.auto_chunk`, over all members' masks)."""
    return auto_chunk(max(n_masks, 1), 16 * d, device)


def train_group(members: list[Member], out: str | Path, device: torch.device,
                progress: bool = False, step_hook=None) -> tuple[int, int]:
    """Train the unfinished ``members`` as one group with :func:`pbscale.loop.run` (or resume
    the group, or return at once); returns (runs already finished, runs trained)."""
    todo = [m for m in members if not m.finished]
    if not todo:
        return len(members), 0
    forward = GroupForward([m.task.layout for m in todo], todo[0].task.objective.per_mask)
    n = max(getattr(getattr(m.method, "config", None), "n", 1) for m in todo)
    step = ReplayStep(forward, group_rows(len(todo) * (n + 1), todo[0].task.d, device))
    method = GroupMethod(todo, step, device)
    task = GroupTask(todo, method, forward, device)
    loop = dataclasses.replace(todo[0].loop, seed=0)
    opts = [m.weight_opt for m in todo if m.weight_opt is not None]
    weight_opt = OptimizerGroup(opts) if opts else None
    groups = groups_folder(out)
    folder = run_folder(groups, task.name, full_config(task, method, loop))
    for m in todo:
        m.record["info"].update(group=f"{GROUPS}/{folder.name}", grouped_runs=len(todo))
    run(task, method, loop, groups, weight_optimizer=weight_opt, device=device,
        progress=progress, info={"runs": [m.folder.name for m in todo]}, step_hook=step_hook,
        hooks=[task], lr_flags=task.lr_flags,
        method_info=todo[0].record.get("method_info"))
    return len(members) - len(todo), len(todo)
