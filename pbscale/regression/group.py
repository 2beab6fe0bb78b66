"""Regression groups (``python -m pbscale.regress --seeds 0-9 --lr 0.1,0.01``): G runs of
MaskedNNRegression that share the network and the number of steps (different seeds and
learning rates of one setting of any method of ``pbscale.methods.names("regress-group")``)
train together through the one run loop,
:func:`pbscale.runs.loop.run`, in one process, each member's step its separate run's step.

Design (the loop stays single-run; a group is one run of it):

* The method is a :class:`MaskTrainerGroup`: G :class:`pbscale.methods.MaskTrainer` members,
  each built by the family from its own configuration (:meth:`pbscale.methods.Family.make`:
  own logits, optimizer state, generator seeded with the member's seed, the family's own
  settings, temperature schedule (CP) and learned control (REBAR, RELAX)). One step of the
  group is each member's own step, one after another (:class:`pbscale.execution.group.
  MemberBook`): its surrogate on its own batched loss, its backward, its optimizer updates; so
  member g's numbers are the separate run's bit for bit (its arithmetic does not depend on the
  group: ``tests/test_group_equality.py``, every method, the paper's problem, 2 epochs).
* :class:`pbscale.regression.problem.RegressionGroupTask` is the task: epoch orders (G, N),
  row g from member g's generator; the batched loss of a step holds each member's own
  (:meth:`RegressionTask.batch_loss` on its own batch); the evaluation is each member's own
  ``RegressionTask.evaluate``, columns ``run<g>.<metric>``.
* The loop gives the group everything a run gets: its folder
  ``<out>/.groups/group-<method>-n<n>-<param>-<G>runs-<hash>`` (hash over the members'
  configurations), ``checkpoint.pt`` after every epoch and on SIGTERM (then exit code 143;
  rerunning the same command resumes to the same numbers), the NaN check (naming the member) and
  the group's ``metrics.csv``. Per run the random stream is the one a separate run draws
  (``python -m pbscale.regress``): the batch order, then at every step its samples, then the
  evaluation.
* After every epoch (``after_epoch``: the group task is its own
  :class:`pbscale.runs.contracts.RunHooks`) each member's run folder is written exactly where
  and as ``python -m pbscale.regress`` writes it (same hash: ``config.json``, ``history.csv``;
  ``summary.json`` after the last epoch), so a killed group leaves each run's progress, and
  sweeps and ``python -m analysis.regression --collect`` read the runs; members already finished
  there are left out of the group. A member's seconds are the group's divided by G. A launcher
  (``pbscale.sweep`` with groups) names the members' sweep ids in ``$PBSCALE_RUN_INFO`` as
  ``{"sweep_ids": {member_key(seed, lr): id}}``; each member's ``config.json`` "info" then
  holds its own ``sweep_id``, as a separate run's does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pbexact.errors import PBInputError
from pbscale.execution.group import MemberBook, MemberLosses
from pbscale.methods import MethodConfig, Plan, names
from pbscale.regression.problem import RegressionGroupTask, RegressionProblem, RegressionTask
from pbscale.regression.run import DEFAULT_OUT, RUN_FILES, run_name, unused
from pbscale.regression.run import run_folder as regress_folder
from pbscale.runs import io
from pbscale.runs.contracts import LoopConfig, RunHooks
from pbscale.runs.loop import env_info, full_config, run, run_folder, write_summary
from pbscale.runs.records import GROUPS, groups_folder, hashed_part, lock_folder, open_folder

#: Most runs (seeds x learning rates) in one group: each member keeps its logits, gradient and
#: optimizer state (about 4 d floats, 130 kB at d = 8,050) and writes its run folder every
#: epoch, so 10,000 runs hold about 1.3 GB and write 10,000 folders per epoch.
MAX_RUNS = 10_000
TIMING = ("train_seconds", "val_seconds")


def member_key(seed: int, lr: float) -> str:
    """The name of a member (seed, learning rate) in ``$PBSCALE_RUN_INFO``'s "sweep_ids"."""
    return f"seed{int(seed)}-lr{float(lr)!r}"



@dataclass
class FlatLayout:
    """What :meth:`pbscale.methods.Family.make` reads of a layout: one flat mask of d weights on
    ``device`` (for a group built without a network, :meth:`MaskTrainerGroup.flat`)."""

    d: int
    device: torch.device




class MaskTrainerGroup(MemberBook):
    """G runs of one method that train together (``python -m pbscale.regress --seeds``): one
    :class:`pbscale.runs.contracts.Method` over G members (:class:`MaskTrainer` s made by the
    family, :meth:`pbscale.methods.Family.make`: logits (P,), optimizer, generator, learned
    control each), whose step is each member's own step on its own batch
    (:class:`MemberBook`), so member g's estimate, step and history are those of the separate
    run with its configuration, bit for bit.

    The members share the method, n, the parametrization and the method's own settings;
    learning rate, optimizer, seed and lam are their own. Masks only (supermask); the group's
    ``generator`` (the loop's stream) is not used (each member's is, and each is checkpointed
    in :meth:`state_dict`). ``r``, :meth:`theta`, :meth:`mode_mask` and :meth:`sample_masks`
    stack the members' (leading dimension G)."""

    def __init__(self, configs: Sequence[MethodConfig], layout: Any, plan: Plan) -> None:
        self.check(configs)
        self.members = [c.family.make(c, layout, plan) for c in configs]
        self.d = layout.d
        self.device = torch.device(layout.device)
        self.family = configs[0].family
        self.param = self.members[0].param
        self.n = configs[0].n
        #: the chunk of the first member (each member evaluates its masks in its own chunks)
        self.chunk = self.members[0].chunk
        #: the run's stream for the loop (the members draw from their own generators)
        self.generator = torch.Generator(device=self.device).manual_seed(0)
        super().__init__(self.members)

    @classmethod
    def flat(cls, configs: Sequence[MethodConfig], d: int, total_steps: int,
             device: torch.device | str = "cpu", bytes_per_sample: int | None = None
             ) -> MaskTrainerGroup:
        """A group over one flat mask of d weights (no network), trained for ``total_steps``."""
        return cls(configs, FlatLayout(d, torch.device(device)),
                   Plan(mask_steps=total_steps, bytes_per_sample=bytes_per_sample))

    @staticmethod
    def check(configs: Sequence[MethodConfig]) -> None:
        """Refuse (:class:`PBInputError`) configurations that cannot form a group."""
        if not configs:
            raise PBInputError("no runs to train; give at least one seed and learning rate")
        for c in configs:
            if "regress-group" not in c.family.caps.commands:
                raise PBInputError(f"{c.family.text} runs do not train as a group; the runs of a "
                                   f"regression group are runs of "
                                   f"{', '.join(names('regress-group'))}")
        seen = [repr(sorted(c.to_dict().items())) for c in configs]
        if len(set(seen)) != len(seen):
            raise PBInputError("a run is listed twice in the group (same seed, learning rate and "
                               "settings); list each once")
        for field in ("n", "method", "param", "settings"):
            values = sorted({str(getattr(c, field)) for c in configs})
            if len(values) != 1:
                raise PBInputError(f"the runs of a group share {field}; got {field} in "
                                   f"{', '.join(values)}: group each {field} separately")

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

    def surrogate(self, f: MemberLosses, weights: bool = False) -> tuple[torch.Tensor, float]:
        """One step of every member on its own loss (:class:`MemberBook`); masks only."""
        if weights:
            raise PBInputError("the runs of a regression group train masks only (supermask); "
                               "train weights with one run at a time")
        return super().surrogate(f, weights=False)

    def check_finite(self, where: str, flags: dict[str, str]) -> None:
        """Refuse logits that became NaN or inf, naming the member and its learning rate."""
        for m in self.members:
            if not bool(torch.isfinite(m.r).all()):
                c = m.config
                raise PBInputError(
                    f"the mask logits of the run with lr={c.lr}, seed={c.seed} became NaN or inf "
                    f"in {where}: the learning rate is too large for {flags['optimizer']} "
                    f"{c.optimizer}; lower it in {flags['masks']} or leave it out of the group")

    def mode_mask(self) -> torch.Tensor:
        """(G, d)."""
        return torch.stack([m.mode_mask() for m in self.members])

    def sample_masks(self, k: int) -> torch.Tensor:
        """(G, k, d), member g's from its generator."""
        return torch.stack([m.sample_masks(k) for m in self.members])


class GroupRun(RegressionGroupTask, RunHooks):
    """The group task that also writes each member's run folder after every epoch (its own
    :class:`pbscale.runs.loop.RunHooks`)."""

    #: The flags named when a run diverges (:func:`pbscale.runs.loop.run`).
    lr_flags = {"masks": "--lr"}

    def __init__(self, problem: RegressionProblem, group: MaskTrainerGroup, data_seed: int,
                 epochs: int, out: Path, device: torch.device) -> None:
        super().__init__(problem, group, data_seed,
                         [run_name(m.config) for m in group.members])
        self.records, self.folders = [], []
        env = env_info()
        sweep_ids = env.pop("sweep_ids", {})
        for t, m in zip(self.members, group.members):
            loop = LoopConfig(epochs=epochs, seed=m.config.seed, metrics_file="history.csv")
            cfg = full_config(t, m, loop)
            self.folders.append(run_folder(out, t.name, cfg))
            self.records.append({**cfg, "info": {"device": str(device), "chunk": group.chunk,
                                                 "torch_threads": torch.get_num_threads(),
                                                 "grouped_runs": len(group.members),
                                                 "world_size": 1, "unused": unused(m.config),
                                                 **env},
                                 "method_info": m.family.info()})
            key = member_key(m.config.seed, m.config.lr)
            if key in sweep_ids:
                self.records[-1]["info"]["sweep_id"] = sweep_ids[key]
        self.device = device

    def after_epoch(self, history: list[dict], final: bool) -> None:
        for g, (folder, record) in enumerate(zip(self.folders, self.records)):
            rows = [self.member_row(row, g) for row in history]
            io.write_json(folder / "config.json", record)
            io.write_csv(folder / "history.csv", rows)
            if final:
                write_summary(folder, rows, self.device, grouped_runs=len(self.folders))


def train_group(configs: list[MethodConfig], epochs: int, problem: RegressionProblem,
                  data_seed: int = 0, out: str | Path | None = None,
                  device: torch.device | str = "cpu", progress: bool = False,
                  step_hook: Callable[[int, int], None] | None = None) -> list[list[dict]]:
    """Train the G runs of ``configs`` (sharing the method, n, parametrization and the method's
    own settings; any seeds, learning rates, optimizers, lam) as one group with
    :func:`pbscale.runs.loop.run` (or resume it, or return at once if it finished); returns each
    run's history as its ``history.csv`` holds it, without the timing columns. Each run's folder
    is written under ``out`` where ``pbscale.regress`` writes it (``out=None``: a temporary
    folder, deleted); the group's own folder (checkpoint, metrics) under ``out/.groups``.
    ``step_hook(epoch, i)`` as in :func:`pbscale.runs.loop.run`."""
    if out is None:
        with tempfile.TemporaryDirectory() as tmp:
            return train_group(configs, epochs, problem, data_seed, tmp, device, progress,
                                 step_hook)
    dev = torch.device(device)
    if not isinstance(epochs, int) or epochs < 1:
        raise PBInputError(f"epochs must be a positive integer, got {epochs!r}")
    MaskTrainerGroup.check(configs)
    steps = RegressionTask(problem, data_seed).steps_per_epoch
    group = MaskTrainerGroup(configs, problem.masked, Plan(
        epochs=epochs, steps_per_epoch=steps, mask_steps=epochs * steps,
        layers=(problem.d,), bytes_per_sample=problem.bytes_per_sample()))
    task = GroupRun(problem, group, data_seed, epochs, Path(out), dev)
    loop = LoopConfig(epochs=epochs, seed=0, metrics_file="metrics.csv")
    groups = groups_folder(out)
    group_folder = run_folder(groups, task.name, full_config(task, group, loop))
    for record in task.records:
        record["info"]["group"] = f"{GROUPS}/{group_folder.name}"
    with ExitStack() as locks:  # the separate run's checks and lock of each member's folder
        for folder, t, record in zip(task.folders, task.members, task.records):
            open_folder(out, t.name, hashed_part(record), record, RUN_FILES)
            locks.enter_context(lock_folder(folder))
        run(task, group, loop, groups, device=dev, progress=progress,
            info={"chunk": group.chunk, "torch_threads": torch.get_num_threads()},
            step_hook=step_hook, hooks=[task], lr_flags=task.lr_flags,
            method_info=group.members[0].family.info())
    return [[{k: v for k, v in row.items() if k not in TIMING}
             for row in io.read_csv(folder / "history.csv")] for folder in task.folders]


def train_unfinished(configs: list[MethodConfig], epochs: int, problem: RegressionProblem,
                     data_seed: int = 0, out: str | Path = DEFAULT_OUT,
                     device: torch.device | str = "cpu", progress: bool = False
                     ) -> tuple[int, int]:
    """Train, as one group, the runs of ``configs`` whose run folder under ``out`` is not
    finished (no ``summary.json``; a run finished by ``pbscale.regress`` counts; a damaged one
    is a one-line :class:`PBInputError` naming it, as the separate run refuses it); returns
    (runs skipped, runs trained)."""

    def finished(c: MethodConfig) -> bool:
        path = regress_folder(c, epochs, out, data_seed, problem) / "summary.json"
        if not path.exists() and not path.is_symlink():
            return False
        io.read_summary(path)
        return True

    todo = [c for c in configs if not finished(c)]
    if todo:
        train_group(todo, epochs, problem, data_seed, out, device, progress=progress)
    return len(configs) - len(todo), len(todo)
