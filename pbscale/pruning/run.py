"""One pruning run assembled from its parts (``python -m pbscale.prune`` is its command line):
the task (:mod:`pbscale.pruning.task`: network, batches), the method its family builds
(:meth:`pbscale.methods.registry.Family.make`), the evaluation (:mod:`pbscale.pruning.
evaluation`), the files it leaves (:mod:`pbscale.pruning.outputs`), and how it executes: alone
on the run loop :func:`pbscale.runs.loop.run`, under ``torchrun`` (:func:`distribute`,
:mod:`pbscale.execution.distributed`: MC runs split their samples over the ranks, the others
their minibatches), replayed from a CUDA graph (:func:`captures_steps`) or as a member of a
pruning group (:func:`member`, :func:`run_group`, :mod:`pbscale.pruning.group`). A run alone
and a group member are assembled by one builder, :func:`assemble` (the Python API,
:mod:`pbscale.pruning.api`, runs through :func:`run` and :func:`run_group`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Collection, Sequence
from pathlib import Path

import torch

from pbexact.errors import PBInputError
from pbexact.provenance import code_provenance
from pbscale.execution import distributed
from pbscale.execution.captured import CapturedSteps
from pbscale.forward import routes as gpu_routes
from pbscale.methods import Plan
from pbscale.nets import data as datamod
from pbscale.nets.channel_layout import weight_layers
from pbscale.nets.network import NetworkSource, layer_counts, source_digest
from pbscale.pruning import setup
from pbscale.pruning.assembly import Assembly
from pbscale.pruning.config import (
    CONFIG_FORMAT,
    FREEZE_AT,
    WEIGHT_DECAY,
    WEIGHT_GAMMA,
    WEIGHT_MILESTONES,
    WEIGHT_MOMENTUM,
    PruneConfig,
)
from pbscale.pruning.group import Member, check_group_memory, member_key, train_group
from pbscale.pruning.lam_control import LamController, target_line
from pbscale.pruning.outputs import Export
from pbscale.pruning.task import PruneTask
from pbscale.runs import io as runio
from pbscale.runs.contracts import LoopConfig, Method, RunHooks
from pbscale.runs.loop import env_info, run_folder, run_record
from pbscale.runs.loop import run as loop_run
from pbscale.runs.records import chosen_config
from pbscale.runs.runtime import resolve_device

#: The options the runs of one pruning group may differ in (``--seeds``, and comma lists of
#: ``--lam`` and ``--mask-lr``); a group shares every other option.
GROUP_FREE = ("seed", "lam", "mask_lr")
#: Most runs in one pruning group (each holds its network, masks and optimizer state).
MAX_GROUP = 4096



def prepare(cfg: PruneConfig, device: str = "cpu", download: bool = False,
            download_url: str | None = None, *, data: datamod.Data | None = None,
            source: NetworkSource | None = None
            ) -> tuple[PruneConfig, torch.device, datamod.Data]:
    """Validate everything (config, device, data presence), load the data (unless ``data`` is
    given: the Python API's arrays) and fit the network to it (:func:`pbscale.pruning.setup.fit`:
    a user's network or data probed; ``source``: the network when it is an object, not a
    ``--model`` name)."""
    cfg = cfg.resolved().validate()
    dev = resolve_device(device)
    if data is None:
        data = setup.load_data(cfg, dev, download, download_url)
    setup.fit(cfg, data, dev, source)
    return cfg, dev, data


def loop_config(cfg: PruneConfig) -> LoopConfig:
    """The loop of a run of ``cfg``: the weights' step decay where they train; for mask
    logits their family's schedule, and in joint mode its dense warm-up and the frozen masks
    (:data:`FREEZE_AT`). A ``--budget`` that no frozen epoch would apply is a one-line
    :class:`PBInputError` naming the epochs it needs."""
    E, family = cfg.epochs, cfg.family
    wm = WEIGHT_MILESTONES if cfg.trains_weights else ()
    if not family.caps.logits:  # one mask throughout: no mask schedule, warm-up or freezing
        return LoopConfig(epochs=E, seed=cfg.seed, weight_milestones=wm,
                          weight_gamma=WEIGHT_GAMMA)
    warmup = family.caps.pruning.joint_warmup if cfg.mode == "joint" else 0.0
    freeze = FREEZE_AT if cfg.mode == "joint" else None
    milestones, gamma = family.caps.pruning.mask_schedule
    loop = LoopConfig(epochs=E, seed=cfg.seed, mask_milestones=milestones,
                      mask_gamma=gamma, weight_milestones=wm,
                      weight_gamma=WEIGHT_GAMMA, mask_warmup=warmup, freeze_masks=freeze)
    if cfg.budget and not loop.phase_epochs()[2]:
        need = next(e for e in range(E + 1, E + 8)
                    if dataclasses.replace(loop, epochs=e).phase_epochs()[2])
        raise PBInputError(f"--budget cuts the mask frozen for the last epochs, and --epochs "
                           f"{E} leaves none frozen for {family.text}; give --epochs {need} "
                           "or more")
    return loop


def build(cfg: PruneConfig, data: datamod.Data, dev: torch.device,
          shard: distributed.Shard | None = None, source: NetworkSource | None = None):
    """(task, method, loop config, weight optimizer) of a validated, resolved config
    (``shard``: this rank's share under torchrun; ``source``: the network when it is an object,
    else ``cfg.model``'s). The method is its family's
    (:meth:`pbscale.methods.registry.Family.make`), built from the run's plan: epochs, steps,
    the steps in which masks train (the loop's phases: a joint run's dense warm-up and frozen
    epochs), the layers of the flat mask, the pruning settings, the weights' optimizer and,
    over channels, the variables' L0 weights and what ``--target`` is a fraction of."""
    loop = loop_config(cfg)
    task = PruneTask(cfg, data, dev, shard, source)
    S, E = task.steps_per_epoch, cfg.epochs
    weight_opt = (torch.optim.SGD(task.weights(), lr=cfg.lr, momentum=WEIGHT_MOMENTUM,
                                  nesterov=True, weight_decay=WEIGHT_DECAY)
                  if task.trains_weights else None)
    family = cfg.family
    world = shard.world if shard is not None and family.caps.split_samples else 1
    plan = Plan(epochs=E, steps_per_epoch=S, mask_steps=max(loop.mask_epochs() * S, 1),
                layers=tuple(task.layout.sizes), run=cfg, weight_optimizer=weight_opt,
                world=world, l0_weights=task.l0_weights(), kept_fraction=task.kept_fraction(),
                coupled=task.coupled_index(), bytes_per_sample=task.bytes_per_sample())
    method = family.make(cfg.method_config(), task.layout, plan)
    return task, method, loop, weight_opt


def assemble(cfg: PruneConfig, data: datamod.Data, dev: torch.device, *,
             shard: distributed.Shard | None = None, source: NetworkSource | None = None,
             ignored: Sequence[str] = (), routes: gpu_routes.Routes | None = None) -> Assembly:
    """The :class:`Assembly` of the run of ``cfg`` (validated, resolved): :func:`build`'s
    pieces, its configuration, its "info" (:func:`run_info`, the processes, the settings named
    that it does not read (``ignored``) and the GPU routes asked for where any is on) and its
    lam controller."""
    task, method, loop, weight_opt = build(cfg, data, dev, shard, source)
    info = {**run_info(cfg, data, task), "world_size": 1 if shard is None else shard.world,
            **({"ignored": list(ignored)} if ignored else {}),
            **({"routes": str(routes)} if routes is not None and routes.on else {})}
    kept = task.kept_fraction()  # channels: the --cost kept; weights: the controller's count
    measure = None if kept is None else (lambda z: float(kept(z[None])[0]))
    controller = (LamController(method, cfg.lam_target, loop, task.steps_per_epoch,
                                measure=measure) if cfg.lam_target else None)
    return Assembly(task, method, loop, weight_opt, run_config(task, loop),
                    legacy_config(task, method, loop), info,
                    cfg.family.info(cfg.method_settings()), controller)


#: The loop's entries that the task holds already (one entry per setting).
LOOP_IN_TASK = ("epochs", "seed")


def run_config(task: PruneTask, loop: LoopConfig) -> dict:
    """What a pruning run's folder is named by (config.json :data:`~pbscale.pruning.config.
    CONFIG_FORMAT` 2): the settings the run reads (:meth:`PruneTask.config`) and the loop's
    schedule that its method's family derives from them, each entry once (the method's
    section of format 1 repeated the task's settings under other names)."""
    schedule = {k: v for k, v in loop.to_dict().items() if k not in LOOP_IN_TASK}
    return {"format": CONFIG_FORMAT, "task": task.config(), "loop": schedule}


def legacy_config(task: PruneTask, method: Method, loop: LoopConfig) -> dict:
    """What named the same run in config.json format 1 (:func:`pbscale.runs.loop.full_config`
    with the task's every field, :meth:`PruneTask.legacy_config`): a folder of that name, made
    before format 2, is found, resumed and read back (:func:`pbscale.runs.records.
    chosen_config`)."""
    return {"task": task.legacy_config(), "method": method.config_dict(), "loop": loop.to_dict()}


def run(cfg: PruneConfig, out: str | Path, device: str = "cpu", *, quiet: bool = False,
        download: bool = False, download_url: str | None = None, step_hook=None,
        shard=None, given: Collection[str] = (), keep_checkpoint: bool = True,
        data: datamod.Data | None = None, source: NetworkSource | None = None) -> dict:
    """Train (or resume, or read back) the run of ``cfg`` under ``out``; returns its summary
    with the run folder, both weight counts and the final metrics. ``shard``
    (:mod:`pbscale.execution.distributed`, a torchrun launch): MC samples split over the ranks, CP,
    MP, GMP and dense runs (and the fixed-mask epochs of joint MC runs) data-parallel, evaluation
    split; rank i > 0 writing its copy under ``out/.rank<i>``. ``given``: the settings the user
    named (:func:`pbexact.cli.given_options`); those the run does not read are warned about
    on stderr (even when ``quiet``) and listed in config.json's "info" as "ignored". ``quiet``:
    nothing on stdout, no progress (``--quiet`` prints :func:`result_line`).
    ``keep_checkpoint=False``: ``checkpoint.pt``
    deleted once the run has finished (``--drop-checkpoint``). ``data`` and ``source``: the
    data and the network when they are Python objects (:mod:`pbscale.pruning.api`)."""
    cfg, dev, data = prepare(cfg, device, download, download_url, data=data, source=source)
    ignored = cfg.ignored(given)
    if ignored and (shard is None or shard.rank == 0):
        print(cfg.ignored_warning(ignored), file=sys.stderr)
    asked = gpu_routes.default()
    a = assemble(cfg, data, dev, shard=shard, source=source, ignored=ignored, routes=asked)
    task, method, loop, weight_opt = a.task, a.method, a.loop, a.weight_opt
    note = budget_note(cfg, loop, task.steps_per_epoch)
    if note is not None and (shard is None or shard.rank == 0):
        print(note, file=sys.stderr)
    hooks: list[RunHooks] = [task.evaluation]  # the evaluation rule picks the frozen mask
    if a.controller is not None:
        hooks.append(a.controller)
    if shard is not None:
        hooks += distribute(task, method, weight_opt, shard)
        out = distributed.rank_out(out, shard)
        quiet = quiet or shard.rank > 0
    if shard is None and captures_steps(cfg, dev, asked):
        hooks.append(CapturedSteps(task, method))
    config = chosen_config(out, task.name, a.config, a.legacy)  # a format 1 folder kept
    folder = run_folder(out, task.name, config)
    finished_before = (folder / "summary.json").exists()
    hooks.append(Export(folder, task.evaluation, task.rescales))
    if shard is not None:  # every rank resumes from rank 0's checkpoint
        distributed.sync_resume_files(folder, shard, dev)
    if not quiet:
        print(f"{folder.name}: {cfg.model} on {cfg.data or cfg.dataset}, {cfg.mode} "
              f"{cfg.method}; {task.d:,} {'channel variables' if task.groups else 'masked weights'}"
              f" of {task.num_all:,} parameters; "
              f"device {dev}", file=sys.stderr)
    folder = loop_run(task, method, loop, out, weight_optimizer=weight_opt, device=dev,
                      progress=not quiet, info=a.info, step_hook=step_hook, hooks=hooks,
                      lr_flags=task.lr_flags, method_info=a.method_info,
                      keep_checkpoint=keep_checkpoint, config=config)
    summary = runio.read_summary(folder / "summary.json", task.summary_keys)
    runio.write_json(folder / "data.json", data.transform())
    summary.update({"folder": str(folder), "masked": task.d, "parameters": task.num_all,
                    "already_finished": finished_before, "granularity": cfg.granularity})
    if not quiet:
        report(summary, task)
    if cfg.lam_target:
        print_target_line(cfg.lam_target, folder, loop, quiet=quiet)
    if not quiet:
        print_extremes(summary, cfg)
    return summary


#: How far (a fraction of the run) a joint run's mask-training share may round away from its
#: nominal share before :func:`budget_note` says so.
BUDGET_SLACK = 0.05


def budget_note(cfg: PruneConfig, loop: LoopConfig, steps: int) -> str | None:
    """One ``note:`` line for a joint run of a mask method whose whole-epoch phases
    (:meth:`pbscale.runs.contracts.LoopConfig.phase_epochs`: the dense warm-up of the MC
    methods, 10%; the frozen masks, the last 20%) round its mask-training share more than
    :data:`BUDGET_SLACK` away from the nominal one: what the run gives its masks, in epochs
    and steps (a 3-epoch run of 10 steps an epoch: ARMS 10 of 30 steps, CP 20); None for
    other runs."""
    if loop.freeze_masks is None:
        return None
    E = loop.epochs
    warm, train, frozen = loop.phase_epochs()
    nominal = loop.freeze_masks - loop.mask_warmup
    if abs(train / E - nominal) <= BUDGET_SLACK + 1e-9:
        return None

    def epochs(k: int) -> str:
        return f"{k} epoch{'' if k == 1 else 's'}"

    parts = []
    if warm:
        how = "rounded up to a whole epoch" if round(loop.mask_warmup * E) == 0 else "rounded"
        parts.append(f"trains the weights dense for {epochs(warm)} (its {loop.mask_warmup:.0%} "
                     f"warm-up, {how})")
    if frozen:
        parts.append(f"freezes its masks for the last {epochs(frozen)} "
                     f"({1 - loop.freeze_masks:.0%}, rounded)")
    if not parts:
        parts.append("has no whole epoch for its warm-up or its frozen masks")
    return (f"note: {epochs(E)} of {steps} steps: {cfg.family.text} {' and '.join(parts)}, so "
            f"its masks train for {train * steps} of {E * steps} steps ({train / E:.0%} of the "
            f"run, not {nominal:.0%}); more epochs come nearer (docs/pruning.md)")


def extremes_line(summary: dict, cfg: PruneConfig) -> str | None:
    """One ``warning:`` line for a finished run of a method with an L0 strength whose mask
    ended at an extreme: every masked weight off, or none off although lam > 0 (a lam far too
    strong, or too weak for the run's length), or (channel granularity) a layer with every
    channel off, with the fix; None otherwise (the methods that cut to ``--target`` over
    channels never empty a layer: :func:`pbscale.methods.schedules.keep_within`'s floor)."""
    zeroed = summary.get("zeroed_groups") or []
    if "lam" in cfg.unused() or "final_remaining" not in summary:
        return None
    d, rem = summary.get("masked"), summary["final_remaining"]
    lam = summary.get("final_lam", cfg.lam)
    of = f" of {d:,}" if isinstance(d, int) else ""
    unit, steer = "masked weight", " or give --lam-target F to steer it to a fraction"
    if cfg.granularity == "channel":
        rem = summary.get("final_remaining_channels", rem)
        unit, steer = "channel variable", ""
        if zeroed and 0 < rem:
            return (f"warning: every channel of layer{'s' if len(zeroed) > 1 else ''} "
                    f"{', '.join(repr(z) for z in zeroed)} is off at lam {lam:g} (structured.pt "
                    "keeps one zeroed channel there): no signal passes it; lower --lam (e.g. "
                    f"{lam / 10:g})")
    if rem == 0:
        return (f"warning: every {unit} is off (0{of} remain) at lam {lam:g}: the L0 "
                f"term outweighs the loss; lower --lam (e.g. {lam / 10:g}){steer}")
    if rem == 1 and lam > 0:
        return (f"warning: no {unit} was pruned (all{of} remain) at lam {lam:g}: raise "
                f"--lam, train longer (--epochs){',' if steer else ' or'}{steer}")
    return None


def print_extremes(summary: dict, cfg: PruneConfig, name: str = "") -> None:
    """Print :func:`extremes_line` of a finished run on stderr (after ``name: `` when given),
    where there is one: a run's last line."""
    line = extremes_line(summary, cfg)
    if line is not None:
        print(f"{name}: {line}" if name else line, file=sys.stderr)


def print_target_line(target: float, folder: Path, loop: LoopConfig, *, quiet: bool = False,
                      name: str = "") -> None:
    """Print a finished ``--lam-target`` run's :func:`target_line` (from its metrics in
    ``folder``), after ``name: `` when given: a miss on stderr, even when ``quiet``; a reached
    target on stdout unless ``quiet``."""
    line = target_line(target, runio.read_csv(folder / loop.metrics_file), loop)
    missed = line.startswith("warning")
    if missed or not quiet:
        print(f"{name}: {line}" if name else line, file=sys.stderr if missed else sys.stdout)


def run_info(cfg: PruneConfig, data: datamod.Data, task: PruneTask) -> dict:
    """What config.json's unhashed "info" records of a run's data and network: the data folder
    (or the user's data file) and fingerprint, the settings it does not read, and for a user's
    network or data (or a channel run) the masked parameters (channels: the weights removal
    shrinks) with their sizes, the loss, the network's source and the examples in each split;
    for a network named by an import path, the digest of its module's file
    (``network_source``, :func:`pbscale.nets.network.source_digest`: a sweep compares it with
    the file as it is now, without importing it)."""
    info = {"data_dir": cfg.data_dir, "data": data.fingerprint, "unused": cfg.unused()}
    if (cfg.data or not task.source.builtin or cfg.masked or cfg.loss
            or cfg.granularity == "channel"):  # channels: the layers removal shrinks
        info.update({"data_file": cfg.data, "masked_sizes": layer_counts(task.model, task.names),
                     "loss": task.objective.name, "network": task.source.spec,
                     "examples": {s: len(getattr(data, s)) for s in ("train", "val", "test")}})
        digest = None if task.source.builtin else source_digest(task.source.spec)
        if digest is not None:
            info["network_source"] = digest
    return info


def captures_steps(cfg: PruneConfig, dev: torch.device, routes: gpu_routes.Routes) -> bool:
    """Whether a run's steps are replayed from a CUDA graph (:class:`pbscale.execution.captured.
    CapturedSteps`): the ``cuda_graph`` route asked for, a CUDA device, supermask pruning (the
    weights fixed) and a method whose step is captured (the MC estimators)."""
    return (routes.cuda_graph and dev.type == "cuda" and cfg.mode == "supermask"
            and not cfg.lam_target  # the controller changes lam between the steps
            and cfg.granularity == "weight"
            and cfg.family.caps.captures_step and not cfg.family.caps.pruning.dense_weights)


def member(cfg: PruneConfig, data: datamod.Data, dev: torch.device, out: str | Path,
           source: NetworkSource | None = None, ignored: Sequence[str] = ()) -> Member:
    """The run of ``cfg`` (validated, resolved) as a member of a pruning group: assembled as
    :func:`run` assembles it (:func:`assemble`), with the folder and the config.json record
    (:func:`pbscale.runs.loop.run_record`) :func:`run` gives it (``ignored``: the settings
    named that it does not read, as :func:`run` records them)."""
    a = assemble(cfg, data, dev, source=source, ignored=ignored)
    env = env_info()
    sweep_ids = env.pop("sweep_ids", {})
    config = chosen_config(out, a.task.name, a.config, a.legacy)
    record = run_record(config, dev, a.info, a.method_info, env)
    record["info"]["code"] = code_provenance()
    key = member_key({"seed": cfg.seed, "lam": cfg.lam, "mask_lr": cfg.mask_lr})
    if key in sweep_ids:  # launched by a sweep: the run's own id, as a separate run records
        record["info"]["sweep_id"] = sweep_ids[key]
    return Member(a, run_folder(out, a.task.name, config), record, a.task.rescales,
                  data.transform())


def group_configs(cfg: PruneConfig, seeds: list[int], lams: list[float],
                  mask_lrs: list[float]) -> list[PruneConfig]:
    """The runs of the grid seeds x lams x mask_lrs of ``cfg`` (its other options shared)."""
    runs = [dataclasses.replace(cfg, seed=s, lam=lam, mask_lr=lr)
            for lam in lams for lr in mask_lrs for s in seeds]
    if len(runs) > MAX_GROUP:
        raise PBInputError(f"{len(runs):,} runs (seeds x lams x mask learning rates), more "
                           f"than the {MAX_GROUP:,} one group holds; split them over commands")
    return runs


def run_group(cfgs: list[PruneConfig], out: str | Path, device: str = "cpu", *,
              quiet: bool = False, download: bool = False, download_url: str | None = None,
              step_hook=None, data: datamod.Data | None = None,
              source: NetworkSource | None = None, given: Collection[str] = (),
              keep_checkpoint: bool = True) -> tuple[int, int]:
    """Train the runs of ``cfgs`` (differing only in :data:`GROUP_FREE`) as one pruning group
    (:mod:`pbscale.pruning.group`): each run's folder under ``out`` is the one :func:`run`
    writes; runs already finished are skipped. One run alone is :func:`run`. ``data``,
    ``source``, ``given`` and ``keep_checkpoint``: as :func:`run` takes them (the group's
    checkpoint is the one dropped). Each finished run ends with one line (:func:`member_report`:
    folder, test accuracy, remaining). Returns (runs already finished, runs trained); a run that
    diverged (now or before) is a one-line :class:`PBInputError` naming it, once the others
    are trained."""
    if len(cfgs) == 1:
        summary = run(cfgs[0], out, device, quiet=quiet, download=download,
                      download_url=download_url, step_hook=step_hook, data=data,
                      source=source, given=given, keep_checkpoint=keep_checkpoint)
        return 0, 1 if summary else 0
    first, dev, data = prepare(cfgs[0], device, download, download_url, data=data,
                               source=source)
    resolved = [first] + [c.resolved().validate() for c in cfgs[1:]]
    shared = [{k: v for k, v in c.hashed().items() if k not in GROUP_FREE} for c in resolved]
    if any(s != shared[0] for s in shared):
        raise PBInputError("the runs of a pruning group differ only in --seeds, --lam and "
                           "--mask-lr; train other settings as separate groups")
    ignored = first.ignored(given)
    if ignored:
        print(first.ignored_warning(ignored), file=sys.stderr)
    members = [member(resolved[0], data, dev, out, source, ignored)]
    note = budget_note(first, members[0].loop, members[0].task.steps_per_epoch)
    if note is not None:
        print(note, file=sys.stderr)
    check_group_memory(members[0], len(resolved), dev)
    members += [member(c, data, dev, out, source, ignored) for c in resolved[1:]]
    if len({m.folder for m in members}) != len(members):
        raise PBInputError("a run is listed twice in the group (same seed, --lam and "
                           "--mask-lr); list each once")
    if not quiet:
        print(f"group of {len(members)} runs: {first.model} on {first.data or first.dataset}, "
              f"{first.mode} {first.method}; device {dev}", file=sys.stderr)
    result = train_group(members, out, dev, progress=not quiet, step_hook=step_hook,
                         keep_checkpoint=keep_checkpoint)
    varying = [k for k in GROUP_FREE if len({getattr(c, k) for c in resolved}) > 1]
    for m, c in zip(members, resolved):
        if m.finished:
            member_report(m, c, varying)
    if result.diverged:
        raise result.refusal(out)
    return result.finished, result.trained


def member_report(m: Member, cfg: PruneConfig, varying: Sequence[str] = ()) -> None:
    """The end of a finished group member, as its separate run's ``--quiet`` ends: its folder,
    the settings ``varying`` over the group (e.g. ``seed 1``), :func:`result_line`, and for a
    ``--lam-target`` run its :func:`target_line` (a miss on stderr)."""
    summary = {**runio.read_summary(m.folder / "summary.json", m.task.summary_keys),
               "masked": m.task.d, "parameters": m.task.num_all}
    which = ", ".join(f"{k.replace('_', '-')} {getattr(cfg, k):g}" for k in varying)
    print(f"{m.folder}{f' ({which})' if which else ''}: {result_line(summary)}")
    line = structured_line(summary)
    if line is not None:
        print(f"  {line}")
    if cfg.lam_target:
        print_target_line(cfg.lam_target, m.folder, m.loop, name=m.folder.name)
    print_extremes(summary, cfg, name=m.folder.name)


def distribute(task: PruneTask, method, weight_opt: torch.optim.Optimizer | None,
               shard: distributed.Shard) -> list[RunHooks]:
    """The strategies of a run built for torch.distributed (see
    :mod:`pbscale.execution.distributed`): the method's own (MC samples split over the ranks, or
    data parallelism), and the gradients of the weights (joint, dense) and of the logits a
    data-parallel method names averaged by one flat all-reduce per step, with the BatchNorm running
    statistics; batches and evaluation are split by the task (built with the shard)."""
    hooks, params = distributed.rank_strategy(method, shard)
    task.share_gradients(params, [*method.optimizers, *([weight_opt] if weight_opt else [])])
    return hooks


def result_line(summary: dict) -> str:
    """The one-line result of a finished run (:func:`run`'s summary): test accuracy (test loss
    where the run has no accuracy) and both weight counts (what ``--quiet`` prints)."""
    d, n_all = summary["masked"], summary["parameters"]
    rem, rem_all = summary["final_remaining"], summary["final_remaining_all"]
    score = (f"test_acc {summary['final_test_acc']:.4f}" if "final_test_acc" in summary
             else f"test_loss {summary['final_test_loss']:.4g}")
    if "final_remaining_channels" in summary:  # --granularity channel
        rc, macs = summary["final_remaining_channels"], summary["final_remaining_macs"]
        return (f"{score}  remaining {round(rc * d):,} of {d:,} channel variables "
                f"({rc:.2%}), {round(rem_all * n_all):,} of {n_all:,} parameters "
                f"({rem_all:.4%}), MACs {macs:.2%} (prunable part: {rem:.2%})")
    return (f"{score}  remaining {round(rem * d):,} of {d:,} "
            f"masked weights ({rem:.4%}), {round(rem_all * n_all):,} of {n_all:,} parameters "
            f"({rem_all:.4%})")


def structured_line(summary: dict) -> str | None:
    """A channel run's physically pruned network against the dense one (summary.json's
    entries): parameters, MACs per example and CPU latency at batch 1 and 128; None for a
    weight run."""
    if "pruned_params" not in summary:
        return None

    def pair(key: str, fmt: str) -> str:
        return f"{format(summary[f'dense_{key}'], fmt)} -> {format(summary[f'pruned_{key}'], fmt)}"

    def ms(b: int) -> str:
        d, p = summary[f"dense_latency_b{b}"] * 1e3, summary[f"pruned_latency_b{b}"] * 1e3
        return f"batch {b} {d:.3g} -> {p:.3g} ms"

    return (f"structured.pt: params {pair('params', ',')}, MACs {pair('macs', ',')}, CPU "
            f"latency {ms(1)}, {ms(128)}")


def report(summary: dict, task: PruneTask) -> None:
    """Both weight counts of a finished run, overall (:func:`result_line`) and per layer (and
    a channel run's :func:`structured_line`)."""
    print(result_line(summary))
    line = structured_line(summary)
    if line is not None:
        print(line)
    sizes = layer_counts(task.model, task.names)
    if task.groups is not None:  # channel granularity: the weights removal shrinks
        sizes = weight_layers(task.groups)
    for k, size in sizes.items():
        layer = k.removesuffix(".weight")
        frac = summary[f"final_remaining_{layer}"]
        print(f"  {layer:<24} {round(frac * size):>10,} / {size:>10,}  ({frac:.4%})")
