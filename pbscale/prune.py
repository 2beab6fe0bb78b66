"""``python -m pbscale.prune``: pruning as PB optimization (`sec:app_pruning_setup`).

Supermask (`sec:app_supermask_setup`, weights fixed at their random initialization) and joint
pruning (`sec:app_joint_pruning_setup`, weights and masks trained together) of the networks of
:mod:`pbscale.nets.models` on MNIST / CIFAR-10 (:mod:`pbscale.nets.data`), with masks found by CP or
by MC estimators (ARMS, LOORF, DisARM; escort or sigmoid) through
:class:`pbscale.methods.MaskTrainer`, against magnitude pruning (MP, GMP:
:mod:`pbscale.methods.magnitude`) and a dense network, all on the one run loop
:func:`pbscale.runs.loop.run` (run folder by config hash, checkpoints every epoch and on SIGTERM,
exact resume, metrics CSV, progress bar).

Objective per batch and mask z (d masked weights): J(z) = CE(network with weights w * z) +
lambda * sum_i z_i (L0 strength lambda per weight). MC methods: CE of n masks evaluated at once
(:class:`pbscale.forward.masks.MaskedModule`), the L0 term in closed form (lambda * sum theta); CP
differentiates CE(w * sigmoid(r / tau)) + lambda * sum sigmoid(r / tau), tau annealed from 1 to
1/200 over its mask-training steps, and is evaluated with 1[r > 0]. MC runs use dynamic weight
rescaling (:func:`pbscale.forward.rescale.rescaled_weight`; CP does not, as in the paper). Joint MC
runs train the dense network for the first 10% of epochs; joint mask methods freeze their mask for
the last 20% while the weights fine-tune. Evaluation mask of MC runs: 10 masks sampled, each
scored (training loss) on the same 10 training batches, the best kept for validation and test;
BatchNorm running statistics of mask methods are recomputed for the evaluation mask on those
batches before it is scored on validation and test.

The run is assembled in :mod:`pbscale.pruning.run` (its task, method, evaluation, files, and
how it executes: alone, under ``torchrun`` (MC runs split their samples over the ranks, the
others their minibatches; rank i > 0 writes its copy of the run folder under
``OUT/.rank<i>``), replayed from a CUDA graph, or in a pruning group); this module is its
command line; how a sweep checks and groups its runs is :mod:`pbscale.pruning.jobs`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
from pbscale.execution import distributed
from pbscale.forward import routes as gpu_routes
from pbscale.methods.options import add_options, families, listed, users
from pbscale.nets import data as datamod
from pbscale.nets.models import MODELS
from pbscale.nets.network import NETWORK_INITS
from pbscale.nets.network import argument as model_argument
from pbscale.pruning.config import (
    COSTS,
    DEFAULT_PARAM,
    GRANULARITIES,
    MASK_OPTIMIZERS,
    MODES,
    PRUNE_COMMANDS,
    PruneConfig,
    prune_methods,
    reads_n,
    steers_lam,
)
from pbscale.pruning.jobs import config_fields
from pbscale.pruning.run import (
    MAX_GROUP,
    group_configs,
    print_extremes,
    result_line,
    run,
    run_group,
    structured_line,
)
from pbscale.runs.allocator import keep_freed_memory
from pbscale.runs.jobs import listed_values
from pbscale.runs.runtime import resolve_device, set_threads

__all__ = ["build_parser", "main"]

#: argparse type of ``--synthetic``: at most as many random images as MNIST's training set,
#: the largest real one here (all held in memory as float32).
SYNTHETIC_COUNT = int_in_range(0, 60_000, "random images held in memory; MNIST's training "
                               "set has 60,000")

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
    p.add_argument("--mode", default=d.mode, choices=MODES,
                   help=f"supermask: weights fixed at their initialization; joint: weights and "
                        f"masks trained together (default {d.mode})")
    p.add_argument("--method", default=d.method, choices=prune_methods(),
                   help=f"how masks are found (docs/pruning.md; default {d.method})")
    p.add_argument("--param", default=DEFAULT_PARAM, choices=list(PARAMETRIZATIONS),
                   action=_Given,
                   help=f"parametrization ({read_by('param')}; default {DEFAULT_PARAM}, "
                        f"sigmoid for {texts(prune_param='sigmoid')})")
    sampling = listed(f.text for f in families(PRUNE_COMMANDS) if reads_n(f))
    p.add_argument("--n", "--samples", dest="n", type=positive_int, default=d.n,
                   help=f"samples per step ({sampling}; under torchrun write --samples)")
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
                        f"cut to it ({read_by('target')}; L0 methods: --lam-target); with "
                        "--granularity channel, of the prunable part's --cost")
    p.add_argument("--epochs", type=positive_int, default=d.epochs,
                   help=f"training epochs (default {d.epochs})")
    p.add_argument("--batch-size", type=nonneg_int, default=0,
                   help="0: 128 (64 for joint VGG)")
    p.add_argument("--lr", type=positive_float, default=d.lr, help="weight learning rate (joint)")
    p.add_argument("--seed", type=nonneg_int, default=d.seed,
                   help=f"seed of the network's initialization, masks and batch order "
                        f"(default {d.seed})")
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
    p.add_argument("--val-size", type=nonneg_int, default=d.val_size,
                   help=f"training images held out for validation (default {d.val_size:,})")
    p.add_argument("--split-seed", type=nonneg_int, default=d.split_seed,
                   help=f"seed of the training / validation split (default {d.split_seed})")
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
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is fastest on a shared "
                        "2-core machine, see docs/pbscale.md)")
    p.add_argument("--out", type=out_folder, default="runs/prune",
                   help="parent folder of run folders")
    p.add_argument("--routes", type=gpu_routes.argument, default=None,
                   help="GPU routes (pbscale.forward.routes, docs/gpu.md): off, all, or names "
                   f"comma-separated from {', '.join(gpu_routes.ROUTES)}; cuda_graph also "
                   "replays a supermask MC run's whole step from a CUDA graph. The same "
                   "function to float rounding, so not part of the run's name; none applies "
                   "off CUDA (default: $PBNN_ROUTES, else off)").id_when_changed = True
    # flags added after sweeps named their runs: in a sweep run's id only when set
    steered = listed(f.text for f in families(PRUNE_COMMANDS) if steers_lam(f))
    p.add_argument("--lam-target", type=nonneg_float, default=0.0,
                   help=f"L0 methods ({steered}): fraction of masked weights to reach by "
                        "steering --lam (from its value) while the masks train, then hold; "
                        "the last line says what was reached, and warns with the fix on a "
                        "miss; groups too, each run its own (0: off, --lam fixed; "
                        "docs/pruning.md)").id_when_changed = True
    p.add_argument("--budget", type=nonneg_float, default=0.0,
                   help=f"joint runs of the L0 methods ({steered}): the mask frozen for the "
                        "last 20%% of the epochs keeps at most this fraction of the masked "
                        "weights (channels: of the --cost), taken from the evaluated mask and "
                        "filled or cut by the mask probabilities, so that runs compare at one "
                        "size (0: off; pair it with --lam-target near it; docs/pruning.md)"
                   ).id_when_changed = True
    channel_methods = listed(f.text for f in families(PRUNE_COMMANDS) if f.caps.pruning.channels)
    p.add_argument("--granularity", default=d.granularity, choices=GRANULARITIES,
                   help=f"weight: one mask entry a weight (default); channel: one a channel of "
                        f"Torch-Pruning's coupled groups (structured pruning, {channel_methods}, "
                        "supermask or joint; the head is never pruned, no dynamic weight "
                        "rescaling; --masked names the layers that may change, the others are "
                        "left out). The run writes groups.json and structured.pt (the network "
                        "with its pruned channels removed) and reports params, MACs and CPU "
                        "latency (docs/structured.md)").id_when_changed = True
    p.add_argument("--cost", default=d.cost, choices=COSTS,
                   help="--granularity channel: the L0 term is lam * sum_i c_i theta_i, c_i the "
                        "parameters (params) or MACs per example (macs) removing channel "
                        "variable i alone saves, normalised to mean 1; MP and GMP score channel "
                        "i by its squared group norm over c_i and keep --target of that cost; "
                        "the remaining fraction reported is of that cost (default "
                        "params)").id_when_changed = True
    p.add_argument("--drop-checkpoint", action="store_true",
                   help="delete checkpoint.pt once the run has finished (a finished run is "
                        "read from summary.json, masks.pt and pruned.pt)"
                   ).id_when_changed = True
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars and no per-layer counts; the one-line result stays")
    add_options(p, PRUNE_COMMANDS)
    p.set_defaults(given=frozenset())
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args_or_code(argv)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args
    fields = config_fields(vars(args), args.given)
    lams, lrs = fields.pop("lam"), fields.pop("mask_lr")
    seeds = args.seeds if args.seeds is not None else [args.seed]

    def body() -> None:
        with gpu_routes.use(args.routes if args.routes is not None else gpu_routes.default()):
            train()

    def train() -> None:
        try:
            keep_freed_memory()  # glibc: no page faults on a step's freed vectors
            set_threads(args.threads)
            cfg = PruneConfig(**fields, lam=listed_values(lams)[0], mask_lr=listed_values(lrs)[0])
            if len(seeds) * len(listed_values(lams)) * len(listed_values(lrs)) > 1:
                cfgs = group_configs(cfg, seeds, listed_values(lams), listed_values(lrs))
                if distributed.from_env(resolve_device(args.device)) is not None:
                    raise PBInputError("pruning groups run in one process; launch them without "
                                       "torchrun")
                skipped, _ = run_group(cfgs, args.out, args.device, quiet=args.quiet,
                                             download=args.download,
                                             download_url=args.download_url,
                                             given=given_options(parser, argv),
                                             keep_checkpoint=not args.drop_checkpoint)
                if skipped:
                    print(f"({skipped} of these runs had finished before: read back)",
                          file=sys.stderr)
                return
            shard = distributed.from_env(resolve_device(args.device))  # torchrun: split samples
            summary = run(cfg, args.out, args.device, quiet=args.quiet, download=args.download,
                          download_url=args.download_url, shard=shard,
                          given=given_options(parser, argv),
                          keep_checkpoint=not args.drop_checkpoint)
            if args.quiet and (shard is None or shard.rank == 0):
                if summary.get("already_finished"):
                    print(f"{Path(summary['folder']).name}: already finished (its summary.json "
                          "is there); its result:", file=sys.stderr)
                print(result_line(summary))
                if structured_line(summary) is not None:
                    print(structured_line(summary))
                print_extremes(summary, cfg.resolved())
        finally:
            distributed.shutdown()

    return run_main(body, resumable=True)


if __name__ == "__main__":
    sys.exit(main())
