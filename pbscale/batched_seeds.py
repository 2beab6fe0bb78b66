"""Batched seeds for MaskedNNRegression: G runs that share the network and the number of steps
(different seeds and learning rates of one setting of any method of
``pbscale.methods.names("batched")``: the MC estimators, CP, ST, REBAR, RELAX, ST-theta,
hard-concrete, edge-popup) train together through the one run loop, :func:`pbscale.loop.run`,
in one process, each member's step its separate run's step.

Design (the loop stays single-run; a group is one run of it):

* The Method is the family's group (:meth:`pbscale.methods.Family.make_group`; for every
  method over mask logits a :class:`pbscale.methods.MaskTrainerGroup`): G :class:`MaskTrainer`
  members, each with its own logits, optimizer state, generator (seeded with the member's seed,
  as the loop seeds a separate run's), temperature schedule (CP) and learned control with its
  optimizers (REBAR, RELAX). One step of the group is each member's own step, one after another
  (:class:`pbscale.methods.group.MemberBook`): its surrogate on its own batched loss, its
  backward, its optimizer updates; so member g's numbers are the separate run's bit for bit
  (its arithmetic does not depend on the group: ``tests/test_group_equality.py``, every method,
  the paper's problem, 2 epochs).
* :class:`pbscale.regression.RegressionGroupTask` is the Task: epoch orders (G, N), row g from
  member g's generator; the batched loss of a step holds each member's own
  (:meth:`RegressionTask.batch_loss` on its own batch); the evaluation is each member's own
  ``RegressionTask.evaluate``, columns ``run<g>.<metric>``.
* The loop gives the group everything a run gets: its folder
  ``<out>/.groups/group-<method>-n<n>-<param>-<G>runs-<hash>`` (hash over the members'
  configurations), ``checkpoint.pt`` after every epoch and on SIGTERM (then exit code 143;
  rerunning the same command resumes to the same numbers), the NaN check (naming the member) and
  the group's ``metrics.csv``. Per run the random stream is the one a separate run draws
  (``python -m pbscale.regress``): the batch order, then at every step its samples, then the
  evaluation.
* After every epoch (``after_epoch``: the group task is its own :class:`pbscale.loop.RunHooks`)
  each member's run folder is written exactly where and as ``python -m pbscale.regress`` writes it
  (same hash: ``config.json``, ``history.csv``; ``summary.json`` after the last epoch), so a
  killed group leaves each run's progress, and sweeps and ``python -m analysis.regression
  --collect`` read the runs; members already finished there are left out of the group. A member's
  seconds are the group's divided by G. A launcher (``pbscale.sweep`` with batching) names the
  members' sweep ids in ``$PBSCALE_RUN_INFO`` as ``{"sweep_ids": {member_key(seed, lr): id}}``;
  each member's ``config.json`` "info" then holds its own ``sweep_id``, as a separate run's does.

``python -m pbscale.batched_seeds --method loorf --n 10 --lrs 0.1,0.01 --seeds 0-9 --epochs
300`` trains the unfinished runs of those settings as one group.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import torch

from pbexact.cli import (
    ArgumentParser,
    nonneg_float,
    nonneg_int,
    out_folder,
    positive_float,
    positive_int,
    run_main,
    seed_list,
    thread_count,
)
from pbexact.errors import PBInputError
from pbexact.parametrizations import PARAMETRIZATIONS

from . import io
from .jobs import Batching
from .loop import env_info, full_config, run, run_folder, write_summary
from .loop_types import LoopConfig, RunHooks
from .methods import OPTIMIZERS, MaskTrainerGroup, MethodConfig, Plan, names
from .methods.options import add_options, options, settings_of
from .regress import DEFAULT_OUT, RUN_FILES, run_name, unused
from .regress import run_folder as regress_folder
from .regression import RegressionGroupTask, RegressionProblem, RegressionTask, make_problem
from .run_record import GROUPS, groups_folder, lock_folder, open_folder
from .runtime import resolve_device, set_threads

#: Most runs (seeds x learning rates) in one group: each member keeps its logits, gradient and
#: optimizer state (about 4 d floats, 130 kB at d = 8,050) and writes its run folder every
#: epoch, so 10,000 runs hold about 1.3 GB and write 10,000 folders per epoch.
MAX_RUNS = 10_000
TIMING = ("train_seconds", "val_seconds")


def group_seeds(text: str) -> list[int]:
    """argparse type: :func:`pbexact.cli.seed_list`, refused before the list is built when its
    ranges hold more than :data:`MAX_RUNS` seeds (``0-100000000`` would take gigabytes)."""
    count = 0
    for part in text.split(","):
        if "-" in part.strip()[1:]:  # a range, split as seed_list splits it
            a, b = part.split("-", 1)
            try:
                count += max(int(b) - int(a) + 1, 0)
            except ValueError:
                pass  # seed_list names the malformed part
        else:
            count += 1
    if count > MAX_RUNS:
        raise argparse.ArgumentTypeError(f"{count:,} seeds, more than the {MAX_RUNS:,} runs one "
                                         f"group holds; split the seeds over several commands")
    return seed_list(text)


def lr_list(text: str) -> list[float]:
    """argparse type: comma-separated learning rates, each a finite number > 0."""
    parts = [v.strip() for v in text.split(",")]
    if not text.strip() or not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated learning rates like "
                                         f"0.1,0.01, got {text!r}")
    return [positive_float(v) for v in parts]


def member_key(seed: int, lr: float) -> str:
    """The name of a member (seed, learning rate) in ``$PBSCALE_RUN_INFO``'s "sweep_ids"."""
    return f"seed{int(seed)}-lr{float(lr)!r}"


#: The ``pbscale.regress`` options a group takes once (the others, seed and lr, as lists; and
#: the methods' own settings, :func:`own_options`).
SHARED = ("method", "n", "param", "optimizer", "epochs", "data_seed", "lam", "device")
#: The registry's command of this tool (a method claims it to train in regression groups).
COMMANDS_HERE = ("batched",)


def own_options() -> list[str]:
    """The dests of the methods' own settings a group takes (:mod:`pbscale.methods.options`)."""
    return [o.dest for o in options(COMMANDS_HERE)]


def batchable(full: dict) -> bool:
    """Whether a ``pbscale.regress`` run (every option filled in) can train in a group: a
    method of ``names("batched")``, no chunk of its own, no option a group does not take."""
    return (full.get("method") in names("batched") and full.get("chunk") is None
            and set(full) <= {*SHARED, *own_options(), "seed", "lr", "chunk"})


def group_argv(full: dict, values: Mapping[str, Sequence]) -> list[str]:
    """The options of the group of seeds x lrs (``values["seed"]``, ``values["lr"]``) whose
    shared options are ``full``'s (the methods' own settings among them where set)."""
    args: list[str] = []
    for key in [*SHARED, *(k for k in own_options() if k in full)]:
        args += ["--" + key.replace("_", "-"), str(full[key])]
    return [*args, "--lrs", ",".join(repr(float(v)) for v in values["lr"]),
            "--seeds", ",".join(str(int(v)) for v in values["seed"])]


#: How ``pbscale.sweep`` batches ``regress`` runs (:class:`pbscale.jobs.Batching`).
BATCHING = Batching("pbscale.batched_seeds", SHARED, batchable, group_argv,
                    lambda full: member_key(full["seed"], full["lr"]))


class _GroupRun(RegressionGroupTask, RunHooks):
    """The group task that also writes each member's run folder after every epoch (its own
    :class:`pbscale.loop.RunHooks`)."""

    #: The flags named when a run diverges (:func:`pbscale.loop.run`).
    lr_flags = {"masks": "--lrs"}

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
                                                 "batched_runs": len(group.members),
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
                write_summary(folder, rows, self.device, batched_runs=len(self.folders))


def train_batched(configs: list[MethodConfig], epochs: int, problem: RegressionProblem,
                  data_seed: int = 0, out: str | Path | None = None,
                  device: torch.device | str = "cpu", progress: bool = False,
                  step_hook: Callable[[int, int], None] | None = None) -> list[list[dict]]:
    """Train the G runs of ``configs`` (sharing the method, n, parametrization and the method's
    own settings; any seeds, learning rates, optimizers, lam) as one group with
    :func:`pbscale.loop.run` (or resume it, or return at once if it finished); returns each
    run's history as its ``history.csv`` holds it, without the timing columns. Each run's folder
    is written under ``out`` where ``pbscale.regress`` writes it (``out=None``: a temporary
    folder, deleted); the group's own folder (checkpoint, metrics) under ``out/.groups``.
    ``step_hook(epoch, i)`` as in :func:`pbscale.loop.run`."""
    if out is None:
        with tempfile.TemporaryDirectory() as tmp:
            return train_batched(configs, epochs, problem, data_seed, tmp, device, progress,
                                 step_hook)
    dev = torch.device(device)
    if not isinstance(epochs, int) or epochs < 1:
        raise PBInputError(f"epochs must be a positive integer, got {epochs!r}")
    MaskTrainerGroup.check(configs)
    steps = RegressionTask(problem, data_seed).steps_per_epoch
    group = configs[0].family.make_group(configs, problem.masked, Plan(
        epochs=epochs, steps_per_epoch=steps, mask_steps=epochs * steps,
        layers=(problem.d,), bytes_per_sample=problem.bytes_per_sample()))
    task = _GroupRun(problem, group, data_seed, epochs, Path(out), dev)
    loop = LoopConfig(epochs=epochs, seed=0, metrics_file="metrics.csv")
    groups = groups_folder(out)
    group_folder = run_folder(groups, task.name, full_config(task, group, loop))
    for record in task.records:
        record["info"]["group"] = f"{GROUPS}/{group_folder.name}"
    with ExitStack() as locks:  # the separate run's checks and lock of each member's folder
        for folder, t, record in zip(task.folders, task.members, task.records):
            config = {k: record[k] for k in ("task", "method", "loop")}
            open_folder(out, t.name, config, record, RUN_FILES)
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
        train_batched(todo, epochs, problem, data_seed, out, device, progress=progress)
    return len(configs) - len(todo), len(todo)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m pbscale.batched_seeds",
                       description=__doc__.splitlines()[0])
    p.add_argument("--method", default="loorf", choices=list(names("batched")))
    p.add_argument("--n", type=positive_int, default=10)
    p.add_argument("--param", default="sigmoid", choices=list(PARAMETRIZATIONS))
    p.add_argument("--optimizer", default="rmsprop", choices=list(OPTIMIZERS))
    p.add_argument("--lrs", type=lr_list, default="0.1", help="comma-separated learning rates")
    p.add_argument("--seeds", type=group_seeds, default="0-9",
                   help=f"e.g. 0-9 or 0,3,5 (at most {MAX_RUNS:,} runs: seeds x learning rates)")
    p.add_argument("--epochs", type=positive_int, default=300)
    p.add_argument("--data-seed", type=nonneg_int, default=0)
    p.add_argument("--lam", type=nonneg_float, default=0.0)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=thread_count, default=None, help="torch CPU threads")
    p.add_argument("--out", type=out_folder, default=DEFAULT_OUT,
                   help="parent folder of the run folders and the group folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_options(p, COMMANDS_HERE)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args_or_code(argv)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args

    def body() -> int:
        set_threads(args.threads)
        lrs = args.lrs
        if len(lrs) * len(args.seeds) > MAX_RUNS:
            raise PBInputError(f"{len(lrs) * len(args.seeds):,} runs (seeds x learning rates), "
                               f"more than the {MAX_RUNS:,} one group holds; split them over "
                               f"several commands")
        own = settings_of(vars(args), args.method)
        configs = [MethodConfig(args.method, args.n, args.param, lr, args.optimizer, seed,
                                chunk=None, lam=args.lam, settings=own)
                   for lr in lrs for seed in args.seeds]
        MaskTrainerGroup.check(configs)  # before drawing the data
        dev = resolve_device(args.device)
        problem = make_problem(args.data_seed, dev)
        skipped, trained = train_unfinished(configs, args.epochs, problem, args.data_seed,
                                            args.out, dev, progress=not args.quiet)
        print(f"{skipped} runs already finished, {trained} trained together in {args.out}")
        return 0

    return run_main(body, resumable=True)


if __name__ == "__main__":
    sys.exit(main())
