"""``python -m pbscale.prune``: pruning as PB optimization (`sec:app_pruning_setup`).

Supermask (`sec:app_supermask_setup`, weights fixed at their random initialization) and joint
pruning (`sec:app_joint_pruning_setup`, weights and masks trained together) of the networks of
:mod:`pbscale.models` on MNIST / CIFAR-10 (:mod:`pbscale.data`), with masks found by CP or by
MC estimators (ARMS, LOORF, DisARM; escort or sigmoid) through :class:`pbscale.methods.MaskTrainer`,
against magnitude pruning (MP, GMP: :mod:`pbscale.methods.magnitude`) and a dense network, all
on the one run loop :func:`pbscale.loop.run` (run folder by config hash, checkpoints every epoch
and on SIGTERM, exact resume, metrics CSV, progress bar).

Objective per batch and mask z (d masked weights): J(z) = CE(network with weights w * z) +
lambda * sum_i z_i (L0 strength lambda per weight). MC methods: CE of n masks evaluated at once
(:class:`pbscale.masks.MaskedModule`), the L0 term in closed form (lambda * sum theta); CP
differentiates CE(w * sigmoid(r / tau)) + lambda * sum sigmoid(r / tau), tau annealed from 1 to
1/200 over its mask-training steps, and is evaluated with 1[r > 0]. MC runs use dynamic weight
rescaling (:func:`pbscale.masks.rescaled_weight`; CP does not, as in the paper). Joint MC runs
train the dense network for the first 10% of epochs; joint mask methods freeze their mask for
the last 20% while the weights fine-tune. Evaluation mask of MC runs: 10 masks sampled, each
scored (training loss) on the same 10 training batches, the best kept for validation and test;
BatchNorm running statistics of mask methods are recomputed for the evaluation mask on those
batches before it is scored on validation and test.

The run is assembled here from its parts: the task (:mod:`pbscale.prune_task`: network, batches),
the method its family builds (:meth:`pbscale.methods.registry.Family.make`), the evaluation
(:mod:`pbscale.prune_eval`) and the export (:mod:`pbscale.prune_export`).

Under ``torchrun`` (:func:`distribute`, :mod:`pbscale.distributed`) MC runs split their samples
over the ranks and CP, MP, GMP and dense runs their minibatches (data parallelism, gradients
averaged by one flat all-reduce per step); evaluation is split too; rank i > 0 writes its copy
of the run folder under ``OUT/.rank<i>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import torch

from pbexact.cli import (
    ArgumentParser,
    given_options,
    int_in_range,
    nonneg_float,
    nonneg_int,
    one_or_list,
    out_folder,
    positive_float,
    positive_int,
    run_main,
    seed_list_at_most,
    thread_count,
)
from pbexact.errors import PBInputError
from pbexact.parametrizations import PARAMETRIZATIONS
from pbexact.provenance import code_provenance
from pbscale import data as datamod
from pbscale import distributed
from pbscale import io as runio
from pbscale import prune_setup as setup
from pbscale import routes as gpu_routes
from pbscale.captured_step import CapturedSteps
from pbscale.jobs import Batching
from pbscale.lam_control import LamController
from pbscale.loop import env_info, full_config, run_folder
from pbscale.loop import run as loop_run
from pbscale.loop_types import LoopConfig, RunHooks
from pbscale.methods import Plan
from pbscale.methods.options import add_options, families, listed, settings_of, users
from pbscale.models import MODELS
from pbscale.network import NETWORK_INITS, NetworkSource, layer_counts
from pbscale.network import argument as model_argument
from pbscale.prune_config import (
    DEFAULT_PARAM,
    FREEZE_AT,
    MASK_OPTIMIZERS,
    MODES,
    PRUNE_COMMANDS,
    PRUNE_METHODS,
    SUMMARY_KEYS,
    WEIGHT_DECAY,
    WEIGHT_GAMMA,
    WEIGHT_MILESTONES,
    WEIGHT_MOMENTUM,
    PruneConfig,
    prune_methods,
    steers_lam,
)
from pbscale.prune_export import Export, load_pruned
from pbscale.prune_group import Member, check_group_memory, train_group
from pbscale.prune_task import PruneTask
from pbscale.runtime import resolve_device, set_threads

__all__ = ["BATCHING", "GROUP_FREE", "MAX_GROUP", "MODES", "PRUNE_METHODS", "PruneConfig",
           "PruneTask", "build", "build_parser", "distribute", "group_argv", "group_configs",
           "load_pruned", "main", "member", "member_key", "prepare", "report", "result_line",
           "run", "run_group"]

#: The options the runs of one pruning group may differ in (``--seeds``, and comma lists of
#: ``--lam`` and ``--mask-lr``); a group shares every other option.
GROUP_FREE = ("seed", "lam", "mask_lr")
#: Most runs in one pruning group (each holds its network, masks and optimizer state).
MAX_GROUP = 4096


#: argparse type of ``--synthetic``: at most as many random images as MNIST's training set,
#: the largest real one here (all held in memory as float32).
SYNTHETIC_COUNT = int_in_range(0, 60_000, "random images held in memory; MNIST's training "
                               "set has 60,000")

# ---------------------------------------------------------------------- one run


def prepare(cfg: PruneConfig, device: str = "cpu", download: bool = False,
            download_url: str | None = None, *, data: datamod.Data | None = None,
            source: NetworkSource | None = None
            ) -> tuple[PruneConfig, torch.device, datamod.Data]:
    """Validate everything (config, device, data presence), load the data (unless ``data`` is
    given: the Python API's arrays) and fit the network to it (:func:`pbscale.prune_setup.fit`:
    a user's network or data probed; ``source``: the network when it is an object, not a
    ``--model`` name)."""
    cfg = cfg.resolved().validate()
    dev = resolve_device(device)
    if data is None:
        data = setup.load_data(cfg, dev, download, download_url)
    setup.fit(cfg, data, dev, source)
    return cfg, dev, data


def build(cfg: PruneConfig, data: datamod.Data, dev: torch.device,
          shard: distributed.Shard | None = None, source: NetworkSource | None = None):
    """(task, method, loop config, weight optimizer) of a validated, resolved config
    (``shard``: this rank's share under torchrun; ``source``: the network when it is an object,
    else ``cfg.model``'s). The method is its family's
    (:meth:`pbscale.methods.registry.Family.make`), built from the run's plan: epochs, steps,
    the steps in which masks train (the loop's phases: a joint run's dense warm-up and frozen
    epochs), the layers of the flat mask, the pruning settings and the weights' optimizer."""
    task = PruneTask(cfg, data, dev, shard, source)
    S, E = task.steps_per_epoch, cfg.epochs
    joint = task.trains_weights
    weight_opt = (torch.optim.SGD(task.weights(), lr=cfg.lr, momentum=WEIGHT_MOMENTUM,
                                  nesterov=True, weight_decay=WEIGHT_DECAY) if joint else None)
    wm = WEIGHT_MILESTONES if joint else ()
    family = cfg.family
    if not family.caps.logits:  # one mask throughout: no mask schedule, warm-up or freezing
        loop = LoopConfig(epochs=E, seed=cfg.seed, weight_milestones=wm,
                          weight_gamma=WEIGHT_GAMMA)
    else:
        warmup = family.caps.joint_warmup if cfg.mode == "joint" else 0.0
        freeze = FREEZE_AT if cfg.mode == "joint" else None
        milestones, gamma = family.caps.mask_schedule
        loop = LoopConfig(epochs=E, seed=cfg.seed, mask_milestones=milestones,
                          mask_gamma=gamma, weight_milestones=wm,
                          weight_gamma=WEIGHT_GAMMA, mask_warmup=warmup, freeze_masks=freeze)
    plan = Plan(epochs=E, steps_per_epoch=S, mask_steps=max(loop.mask_epochs() * S, 1),
                layers=tuple(task.layout.sizes), run=cfg, weight_optimizer=weight_opt)
    method = family.make(cfg.method_config(), task.layout, plan)
    return task, method, loop, weight_opt


def run(cfg: PruneConfig, out: str | Path, device: str = "cpu", *, quiet: bool = False,
        download: bool = False, download_url: str | None = None, step_hook=None,
        shard=None, given: Collection[str] = (), keep_checkpoint: bool = True,
        data: datamod.Data | None = None, source: NetworkSource | None = None) -> dict:
    """Train (or resume, or read back) the run of ``cfg`` under ``out``; returns its summary
    with the run folder, both weight counts and the final metrics. ``shard``
    (:mod:`pbscale.distributed`, a torchrun launch): MC samples split over the ranks, CP, MP,
    GMP and dense runs (and the fixed-mask epochs of joint MC runs) data-parallel, evaluation
    split; rank i > 0 writing its copy under ``out/.rank<i>``. ``given``: the settings the user
    named (:func:`pbexact.cli.given_options`); those the run does not read are warned about
    on stderr (even when ``quiet``) and listed in config.json's "info" as "ignored". ``quiet``:
    nothing on stdout, no progress (``--quiet`` prints :func:`result_line`).
    ``keep_checkpoint=False``: ``checkpoint.pt``
    deleted once the run has finished (``--drop-checkpoint``). ``data`` and ``source``: the
    data and the network when they are Python objects (:mod:`pbscale.prune_api`)."""
    cfg, dev, data = prepare(cfg, device, download, download_url, data=data, source=source)
    ignored = cfg.ignored(given)
    if ignored and (shard is None or shard.rank == 0):
        print(cfg.ignored_warning(ignored), file=sys.stderr)
    task, method, loop, weight_opt = build(cfg, data, dev, shard, source)
    hooks: list[RunHooks] = [task.evaluation]  # the evaluation rule picks the frozen mask
    if cfg.lam_target:
        hooks.append(LamController(method, cfg.lam_target, loop))
    if shard is not None:
        hooks += distribute(task, method, weight_opt, shard)
        out = distributed.rank_out(out, shard)
        quiet = quiet or shard.rank > 0
    asked = gpu_routes.default()
    if shard is None and captures_steps(cfg, dev, asked):
        hooks.append(CapturedSteps(task, method))
    folder = run_folder(out, task.name, full_config(task, method, loop))
    hooks.append(Export(folder, task.evaluation, cfg.family.caps.rescale))
    if shard is not None:  # every rank resumes from rank 0's checkpoint
        distributed.sync_resume_files(folder, shard, dev)
    if not quiet:
        print(f"{folder.name}: {cfg.model} on {cfg.data or cfg.dataset}, {cfg.mode} "
              f"{cfg.method}; {task.d:,} masked weights of {task.num_all:,} parameters; "
              f"device {dev}", file=sys.stderr)
    info = {**run_info(cfg, data, task), "world_size": 1 if shard is None else shard.world,
            **({"ignored": ignored} if ignored else {}),
            **({"routes": str(asked)} if asked.on else {})}
    folder = loop_run(task, method, loop, out, weight_optimizer=weight_opt, device=dev,
                      progress=not quiet, info=info, step_hook=step_hook, hooks=hooks,
                      lr_flags=task.lr_flags, method_info=cfg.family.info(cfg.method_settings()),
                      keep_checkpoint=keep_checkpoint)
    summary = runio.read_summary(folder / "summary.json", summary_keys(task))
    runio.write_json(folder / "data.json", data.transform())
    summary.update({"folder": str(folder), "masked": task.d, "parameters": task.num_all})
    if not quiet:
        report(summary, task)
    return summary


def summary_keys(task: PruneTask) -> tuple[str, ...]:
    """The entries of a finished run's summary.json that :func:`run` and :func:`report` read:
    :data:`SUMMARY_KEYS`, with the test loss in place of the accuracy where the run's loss has
    none (float targets)."""
    if task.objective.accuracy:
        return SUMMARY_KEYS
    return tuple(k.replace("test_acc", "test_loss") for k in SUMMARY_KEYS)


def run_info(cfg: PruneConfig, data: datamod.Data, task: PruneTask) -> dict:
    """What config.json's unhashed "info" records of a run's data and network: the data folder
    (or the user's data file) and fingerprint, the settings it does not read, and for a user's
    network or data the masked parameters with their sizes, the loss, the network's source and
    the examples in each split."""
    info = {"data_dir": cfg.data_dir, "data": data.fingerprint, "unused": cfg.unused()}
    if cfg.data or not task.source.builtin or cfg.masked or cfg.loss:
        info.update({"data_file": cfg.data, "masked_sizes": layer_counts(task.model, task.names),
                     "loss": task.objective.name, "network": task.source.spec,
                     "examples": {s: len(getattr(data, s)) for s in ("train", "val", "test")}})
    return info


def captures_steps(cfg: PruneConfig, dev: torch.device, routes: gpu_routes.Routes) -> bool:
    """Whether a run's steps are replayed from a CUDA graph (:class:`pbscale.captured_step.
    CapturedSteps`): the ``cuda_graph`` route asked for, a CUDA device, supermask pruning (the
    weights fixed) and a method whose step is captured (the MC estimators)."""
    return (routes.cuda_graph and dev.type == "cuda" and cfg.mode == "supermask"
            and cfg.family.caps.captures_step and not cfg.family.caps.dense_weights)


def member(cfg: PruneConfig, data: datamod.Data, dev: torch.device, out: str | Path,
           source: NetworkSource | None = None, ignored: Sequence[str] = ()) -> Member:
    """The run of ``cfg`` (validated, resolved) as a member of a pruning group: built as
    :func:`run` builds it, with the folder and the config.json record :func:`run` gives it
    (``ignored``: the settings named that it does not read, as :func:`run` records them)."""
    task, method, loop, weight_opt = build(cfg, data, dev, source=source)
    config = full_config(task, method, loop)
    info = {**run_info(cfg, data, task), "world_size": 1,
            **({"ignored": list(ignored)} if ignored else {})}
    env = env_info()
    sweep_ids = env.pop("sweep_ids", {})
    record = {**config, "info": {"device": str(dev), **info, **env, "code": code_provenance()},
              "method_info": cfg.family.info(cfg.method_settings())}
    key = member_key({"seed": cfg.seed, "lam": cfg.lam, "mask_lr": cfg.mask_lr})
    if key in sweep_ids:  # launched by a sweep: the run's own id, as a separate run records
        record["info"]["sweep_id"] = sweep_ids[key]
    return Member(task, method, loop, weight_opt, run_folder(out, task.name, config), record,
                  cfg.family.caps.rescale, data.transform())


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
    (:mod:`pbscale.prune_group`): each run's folder under ``out`` is the one :func:`run`
    writes; runs already finished are skipped. One run alone is :func:`run`. ``data``,
    ``source``, ``given`` and ``keep_checkpoint``: as :func:`run` takes them (the group's
    checkpoint is the one dropped). Returns (runs already finished, runs trained); a run that
    diverged (now or before) is a one-line :class:`PBInputError` naming it, once the others
    are trained."""
    if len(cfgs) == 1:
        summary = run(cfgs[0], out, device, quiet=quiet, download=download,
                      download_url=download_url, step_hook=step_hook, data=data,
                      source=source, given=given, keep_checkpoint=keep_checkpoint)
        return 0, 1 if summary else 0
    if any(c.lam_target for c in cfgs):
        raise PBInputError("--lam-target steers each run's lam after its own epochs and does not "
                           "run in a pruning group; train these runs one at a time (one --seed, "
                           "one --lam, one --mask-lr)")
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
    if result.diverged:
        raise result.refusal(out)
    return result.finished, result.trained


def distribute(task: PruneTask, method, weight_opt: torch.optim.Optimizer | None,
               shard: distributed.Shard) -> list[RunHooks]:
    """The strategies of a run built for torch.distributed (see :mod:`pbscale.distributed`):
    the method's own (MC samples split over the ranks, or data parallelism), and the gradients
    of the weights (joint, dense) and of the logits a data-parallel method names averaged by
    one flat all-reduce per step, with the BatchNorm running statistics; batches and
    evaluation are split by the task (built with the shard)."""
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
    return (f"{score}  remaining {round(rem * d):,} of {d:,} "
            f"masked weights ({rem:.4%}), {round(rem_all * n_all):,} of {n_all:,} parameters "
            f"({rem_all:.4%})")


def report(summary: dict, task: PruneTask) -> None:
    """Both weight counts of a finished run, overall (:func:`result_line`) and per layer."""
    print(result_line(summary))
    sizes = layer_counts(task.model, task.names)
    for k, size in sizes.items():
        layer = k.removesuffix(".weight")
        frac = summary[f"final_remaining_{layer}"]
        print(f"  {layer:<24} {round(frac * size):>10,} / {size:>10,}  ({frac:.4%})")


def _listed(value: float | list[float]) -> list[float]:
    out = value if isinstance(value, list) else [value]
    if len(set(out)) != len(out):
        raise PBInputError(f"a value is listed twice in {','.join(map(str, out))}; list each "
                           "once")
    return out


class _Given(argparse.Action):
    """Store the value and note the option as given (``namespace.given``), so that a left-out
    ``--param`` takes the method's own default while the parser's default stays the one that
    sweeps name their runs by."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", set()), self.dest}


def build_parser() -> ArgumentParser:
    d = PruneConfig()

    def read_by(setting: str) -> str:  # the methods that read a shared setting, from the registry
        return listed(users(setting, PRUNE_COMMANDS))

    def texts(**flags: object) -> str:
        return listed(f.text for f in families(PRUNE_COMMANDS)
                      if all(f.caps.get(k) == v for k, v in flags.items()))

    p = ArgumentParser(
        prog="python -m pbscale.prune",
        description=f"Supermask / joint pruning with one method ({texts()}); writes a run "
                    "folder (config.json, data.json, metrics.csv, masks.pt, pruned.pt) under "
                    "--out and resumes an interrupted run.")
    p.add_argument("--model", default=d.model, type=model_argument,
                   help=f"{', '.join(MODELS)}, or your own network as package.module:factory "
                        "(a function or class returning an nn.Module, imported from the current "
                        "folder or PYTHONPATH; docs/own_network.md)")
    p.add_argument("--dataset", default="", choices=datamod.DATASETS,
                   help="default: the model's (a built-in model), or --data's arrays")
    p.add_argument("--mode", default=d.mode, choices=MODES)
    p.add_argument("--method", default=d.method, choices=prune_methods())
    p.add_argument("--param", default=DEFAULT_PARAM, choices=list(PARAMETRIZATIONS),
                   action=_Given,
                   help=f"parametrization ({read_by('param')}; default {DEFAULT_PARAM}, "
                        f"sigmoid for {texts(prune_param='sigmoid')})")
    p.add_argument("--n", "--samples", dest="n", type=positive_int, default=d.n,
                   help=f"samples per step ({texts(samples=True)}; under torchrun write "
                        "--samples)")
    p.add_argument("--lam", type=one_or_list(nonneg_float), default=d.lam,
                   help=f"L0 strength per weight ({read_by('lam')}; a comma list: one run of a "
                        "group each)")
    p.add_argument("--mask-opt", default=d.mask_opt, choices=MASK_OPTIMIZERS,
                   help=f"optimizer of the mask logits ({read_by('optimizer')})")
    p.add_argument("--mask-lr", type=one_or_list(positive_float), default=d.mask_lr,
                   help=f"mask learning rate ({read_by('lr')}; a comma list: one run of a "
                        "group each)")
    p.add_argument("--target", type=positive_float, default=d.target,
                   help=f"fraction of the masked weights kept, in (0, 1], by the methods that "
                        f"cut to it ({read_by('target')}; L0 methods: --lam-target)")
    p.add_argument("--epochs", type=positive_int, default=d.epochs)
    p.add_argument("--batch-size", type=nonneg_int, default=0,
                   help="0: 128 (64 for joint VGG)")
    p.add_argument("--lr", type=positive_float, default=d.lr, help="weight learning rate (joint)")
    p.add_argument("--seed", type=nonneg_int, default=d.seed)
    p.add_argument("--seeds", type=seed_list_at_most(MAX_GROUP), default=None,
                   help="seeds of a pruning group, e.g. 0-7 or 0,3,5 (replaces --seed): the "
                        "runs seeds x --lam x --mask-lr train as one computation, each "
                        "writing its own run folder").id_when_changed = True
    p.add_argument("--init", default=d.init, choices=list(NETWORK_INITS),
                   help="weight initialization from the seed (signed_constant: +-Kaiming std, "
                        "random signs; model: the weights your --model factory makes, e.g. "
                        "trained ones)")
    p.add_argument("--mask-head", action="store_true",
                   help="mask the classifier (the last Linear) too")
    p.add_argument("--mask-shortcuts", action="store_true",
                   help="mask ResNet 1x1 projection shortcuts too")
    p.add_argument("--prune-at", type=nonneg_float, default=d.prune_at,
                   help=f"{read_by('prune_at')}: fraction of epochs trained dense before the "
                        "one-shot cut, in [0, 1]")
    p.add_argument("--gmp-start", type=nonneg_float, default=d.gmp_start,
                   help=f"{read_by('gmp_start')}: fraction of training when cutting starts, "
                        "in [0, 1]")
    p.add_argument("--gmp-end", type=nonneg_float, default=d.gmp_end,
                   help=f"{read_by('gmp_end')}: fraction of training when the target is "
                        "reached, in [0, 1]")
    p.add_argument("--gmp-every", type=positive_int, default=d.gmp_every,
                   help=f"{read_by('gmp_every')}: steps between cuts")
    p.add_argument("--chunk", type=nonneg_int, default=0,
                   help=f"masks per forward ({read_by('chunk')}; 0: automatic)")
    p.add_argument("--max-batches", type=nonneg_int, default=0,
                   help="training batches per epoch (0: all)")
    p.add_argument("--val-size", type=nonneg_int, default=d.val_size)
    p.add_argument("--split-seed", type=nonneg_int, default=d.split_seed)
    p.add_argument("--synthetic", type=SYNTHETIC_COUNT, default=0,
                   help="random images instead of data (that many training images; tests)")
    p.add_argument("--eval-masks", type=positive_int, default=d.eval_masks,
                   help=f"masks sampled for the evaluation, the best kept "
                        f"({texts(eval_sampled=True)}; also {texts(also_sampled=True)})")
    p.add_argument("--eval-batches", type=positive_int, default=d.eval_batches,
                   help="training batches each evaluation mask is scored on")
    p.add_argument("--data-dir", default="", help="where the data set's files are")
    p.add_argument("--data", default="",
                   help="your own data: an .npz file with x_train y_train x_test y_test "
                        "(optional x_val y_val); uint8 inputs are standardized images, float "
                        "inputs are fed as they are; integer labels train with cross-entropy, "
                        "float targets with MSE (docs/own_network.md)").id_when_changed = True
    p.add_argument("--masked", default="",
                   help="the parameters to mask, as comma-separated patterns of their names "
                        "(e.g. 'features.*.weight,fc1.weight'; default: every Linear and "
                        "convolution weight but the classifier, the paper's rule)"
                   ).id_when_changed = True
    p.add_argument("--loss", default="",
                   help="ce, mse, or your own package.module:function mapping outputs "
                        "(k, B, ...) and targets (B, ...) to (k,) losses (default: ce for "
                        "integer labels, mse for float targets)").id_when_changed = True
    p.add_argument("--download", action="store_true",
                   help="fetch the official files into --data-dir first (needs a network)")
    p.add_argument("--download-url", default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0 or auto")
    p.add_argument("--threads", type=thread_count, default=None)
    p.add_argument("--out", type=out_folder, default="runs/prune",
                   help="parent folder of run folders")
    p.add_argument("--routes", type=gpu_routes.argument, default=None,
                   help="GPU routes (pbscale.routes, docs/gpu.md): off, all, or names "
                   f"comma-separated from {', '.join(gpu_routes.ROUTES)}; cuda_graph also "
                   "replays a supermask MC run's whole step from a CUDA graph. The same "
                   "function to float rounding, so not part of the run's name; none applies "
                   "off CUDA (default: $PBNN_ROUTES, else off)").id_when_changed = True
    # flags added after sweeps named their runs: in a sweep run's id only when set
    steered = listed(f.text for f in families(PRUNE_COMMANDS) if steers_lam(f))
    p.add_argument("--lam-target", type=nonneg_float, default=0.0,
                   help=f"L0 methods ({steered}): fraction of masked weights to reach by "
                        "steering --lam after every epoch, then hold (0: off, --lam fixed; "
                        "docs/pruning.md)").id_when_changed = True
    p.add_argument("--drop-checkpoint", action="store_true",
                   help="delete checkpoint.pt once the run has finished (a finished run is "
                        "read from summary.json, masks.pt and pruned.pt)"
                   ).id_when_changed = True
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars and no per-layer counts; the one-line result stays")
    add_options(p, PRUNE_COMMANDS)
    p.set_defaults(given=frozenset())
    return p


#: Options a sweep never passes to a group's child (its own, or the grid axes).
_NOT_SHARED = (*GROUP_FREE, "seeds", "out", "threads", "quiet", "download", "download_url",
               "help")


def member_key(full: dict) -> str:
    """The name of a group member in ``$PBSCALE_RUN_INFO``'s "sweep_ids": seed, lam and mask
    lr."""
    return (f"seed{int(full['seed'])}-lam{float(full['lam'])!r}"
            f"-mask_lr{float(full['mask_lr'])!r}")


def group_argv(full: dict, values: Mapping[str, Sequence]) -> list[str]:
    """The options of the group of the product of ``values`` (:data:`GROUP_FREE`: seeds, lams,
    mask learning rates) whose other options are ``full``'s: each option that differs from its
    default, as the sweep names a run (a default spelled out is the default left out; so is a
    lam list of the default alone, which a method without L0 strength never reads)."""
    defaults = {a.dest: a.default for a in build_parser()._actions}  # noqa: SLF001
    args: list[str] = []
    for key, value in full.items():
        if key in _NOT_SHARED or value == defaults.get(key) or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    lams = [float(v) for v in values["lam"]]
    if lams != [defaults["lam"]]:
        args += ["--lam", ",".join(map(repr, lams))]
    return [*args, "--seeds", ",".join(str(int(v)) for v in values["seed"]),
            "--mask-lr", ",".join(repr(float(v)) for v in values["mask_lr"])]


#: How ``pbscale.sweep`` batches ``prune`` runs (:class:`pbscale.jobs.Batching`): runs that
#: differ only in seed, lam and mask learning rate train as one pruning group (a run that
#: steers its lam to a target, ``--lam-target``, trains alone).
BATCHING = Batching("pbscale.prune", (), lambda full: not full.get("lam_target"), group_argv,
                    member_key, axes=GROUP_FREE)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args_or_code(argv)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args
    fields = {k: v for k, v in vars(args).items() if k in PruneConfig.__dataclass_fields__}
    fields["settings"] = settings_of(vars(args), args.method)
    if "param" not in args.given:  # left out: the method's own default (PruneConfig.resolved)
        fields["param"] = ""
    lams, lrs = fields.pop("lam"), fields.pop("mask_lr")
    seeds = args.seeds if args.seeds is not None else [args.seed]

    def body() -> None:
        with gpu_routes.use(args.routes if args.routes is not None else gpu_routes.default()):
            train()

    def train() -> None:
        try:
            set_threads(args.threads)
            cfg = PruneConfig(**fields, lam=_listed(lams)[0], mask_lr=_listed(lrs)[0])
            if len(seeds) * len(_listed(lams)) * len(_listed(lrs)) > 1:
                cfgs = group_configs(cfg, seeds, _listed(lams), _listed(lrs))
                if distributed.from_env(resolve_device(args.device)) is not None:
                    raise PBInputError("pruning groups run in one process; launch them without "
                                       "torchrun")
                skipped, trained = run_group(cfgs, args.out, args.device, quiet=args.quiet,
                                             download=args.download,
                                             download_url=args.download_url,
                                             given=given_options(parser, argv),
                                             keep_checkpoint=not args.drop_checkpoint)
                print(f"{skipped} runs already finished, {trained} trained together in "
                      f"{args.out}")
                return
            shard = distributed.from_env(resolve_device(args.device))  # torchrun: split samples
            summary = run(cfg, args.out, args.device, quiet=args.quiet, download=args.download,
                          download_url=args.download_url, shard=shard,
                          given=given_options(parser, argv),
                          keep_checkpoint=not args.drop_checkpoint)
            if args.quiet and (shard is None or shard.rank == 0):
                print(result_line(summary))
        finally:
            distributed.shutdown()

    return run_main(body, resumable=True)


if __name__ == "__main__":
    sys.exit(main())
