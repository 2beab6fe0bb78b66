"""``python -m pbscale.regress``: train a mask on MaskedNNRegression with one method (the run
itself: :mod:`pbscale.regression.run`).

Each run writes a resumable folder ``<out>/<method>-n<n>-<param>-lr<lr>-<optimizer>-seed<seed>-
<hash>`` (config.json, history.csv, checkpoint.pt, summary.json); running the same command
again resumes from the checkpoint, or returns at once if the run is complete.

``--seeds 0-9`` and a comma list of ``--lr`` (``--lr 0.1,0.01``) train the runs of seeds x
learning rates as one regression group in one process (:mod:`pbscale.regression.group`), each
run's folder and numbers its separate run's; as ``python -m pbscale.prune --seeds`` does for
pruning (docs/groups.md).

Validation (`sec:app_maskednnregression`): MC and hybrid methods sample 5 masks, pick the one
with the lowest loss on 500 random training points and report its loss on the 5,000 validation
points (``val_loss_chosen``; ``val_loss`` is the mean over the 5 masks); CP uses 1[r > 0].
"""

from __future__ import annotations

import sys

from pbexact.cli import (
    ArgumentParser,
    given_options,
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
from pbscale.methods import OPTIMIZERS, MethodConfig, names
from pbscale.methods.options import add_options, foreign, listed, users
from pbscale.regression.group import MAX_RUNS, MaskTrainerGroup, train_unfinished
from pbscale.regression.jobs import GROUP_COMMANDS, SHARED, method_config, own_options
from pbscale.regression.problem import make_problem
from pbscale.regression.run import (
    COMMANDS_HERE,
    DEFAULT_OUT,
    train,
    unused,
)
from pbscale.runs import io
from pbscale.runs.allocator import keep_freed_memory
from pbscale.runs.jobs import listed_values
from pbscale.runs.runtime import resolve_device, set_threads

__all__ = ["build_parser", "main"]


def ignored_options(cfg: MethodConfig, given: set[str]) -> list[str]:
    """The options named on the command line (``given``: dests) that the run does not read:
    shared settings its method does not use, and other methods' own settings."""
    return sorted(given & set(unused(cfg))) + foreign(given, cfg.method, COMMANDS_HERE)


def build_parser() -> ArgumentParser:
    def read_by(setting: str) -> str:  # the methods that read a shared setting, from the registry
        return listed(users(setting, COMMANDS_HERE))

    p = ArgumentParser(
        prog="python -m pbscale.regress",
        description="Optimize a binary weight mask of the MaskedNNRegression backbone "
        "(sec:app_maskednnregression, d = 8,050) with one method; writes a resumable run folder.",
    )
    p.add_argument("--method", default="loorf", choices=list(names("regress")),
                   help="(default loorf)")
    p.add_argument("--n", "--samples", dest="n", type=positive_int, default=10,
                   help=f"samples per step ({read_by('n')}; default 10); under torchrun write "
                   "--samples (torchrun reads --n as an abbreviation of its own options)")
    p.add_argument("--param", default="sigmoid", choices=list(PARAMETRIZATIONS),
                   help=f"parametrization ({read_by('param')}; the others take sigmoid; "
                        "default sigmoid)")
    p.add_argument("--lr", type=one_or_list(positive_float), default=0.1,
                   help="learning rate (default 0.1); a comma list (0.1,0.01) trains one run "
                        "per rate as a regression group")
    p.add_argument("--optimizer", default="rmsprop", choices=list(OPTIMIZERS),
                   help="(default rmsprop)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="method seed (sampling, batches)")
    p.add_argument("--seeds", type=seed_list_at_most(MAX_RUNS), default=None,
                   help="seeds trained as one regression group, e.g. 0-9 or 0,3,5 (instead of "
                        f"--seed; at most {MAX_RUNS:,} runs: seeds x learning rates; methods "
                        f"{listed(names(*GROUP_COMMANDS))})"
                   ).id_when_changed = True  # added after run ids existed
    p.add_argument("--data-seed", type=nonneg_int, default=0,
                   help="seed of data, target and backbone, shared by all runs (default 0)")
    p.add_argument("--epochs", type=positive_int, default=300,
                   help="epochs of 100 steps (default 300)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
    p.add_argument("--chunk", type=positive_int, default=None,
                   help=f"samples evaluated at once ({read_by('chunk')}; default: from free "
                        "memory)")
    p.add_argument("--lam", type=nonneg_float, default=0.0,
                   help=f"dense-mask regularizer weight ({read_by('lam')})")
    p.add_argument("--out", type=out_folder, default=DEFAULT_OUT,
                   help=f"parent folder of runs ({DEFAULT_OUT})")
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is fastest on a shared "
                   "2-core machine, see docs/pbscale.md)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_options(p, COMMANDS_HERE)
    return p


def group(args, parser: ArgumentParser, argv: list[str] | None, seeds: list[int],
          lrs: list[float]) -> int:
    """Train the runs of seeds x ``lrs`` of the parsed ``args`` as one regression group
    (:func:`pbscale.regression.group.train_unfinished`); refused in one line where a group
    cannot hold them (a method without a group step, ``--chunk``, more than
    :data:`MAX_RUNS` runs, torchrun)."""
    if args.method not in names(*GROUP_COMMANDS):
        raise PBInputError(f"--method {args.method} does not train in regression groups (those "
                           f"that do: {listed(names(*GROUP_COMMANDS))}); give one --seed and "
                           "one --lr")
    given = given_options(parser, argv)
    extra = sorted(given - {*SHARED, *own_options(), "seed", "seeds", "lr", "out", "threads",
                            "quiet"})
    if extra:
        raise PBInputError(f"a regression group does not take --{extra[0].replace('_', '-')}; "
                           "leave it out or train the runs one at a time")
    if len(lrs) * len(seeds) > MAX_RUNS:
        raise PBInputError(f"{len(lrs) * len(seeds):,} runs (seeds x learning rates), more than "
                           f"the {MAX_RUNS:,} one group holds; split them over several commands")
    dev = resolve_device(args.device)
    if distributed.from_env(dev) is not None:
        raise PBInputError("regression groups run in one process; launch them without torchrun")
    configs = [method_config({**vars(args), "lr": lr, "seed": seed, "chunk": None})
               for lr in lrs for seed in seeds]
    MaskTrainerGroup.check(configs)  # before drawing the data
    problem = make_problem(args.data_seed, dev)
    skipped, trained = train_unfinished(configs, args.epochs, problem, args.data_seed, args.out,
                                        dev, progress=not args.quiet)
    print(f"{skipped} runs already finished, {trained} trained together in {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args_or_code(argv)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args

    seeds = args.seeds if args.seeds is not None else [args.seed]

    def body() -> int:
        lrs = listed_values(args.lr)
        if len(seeds) * len(lrs) > 1:
            set_threads(args.threads)
            return group(args, parser, argv, seeds, lrs)
        try:
            cfg = method_config({**vars(args), "lr": lrs[0], "seed": seeds[0]})
            given = given_options(parser, argv)
            ignored = ignored_options(cfg, given)
            if ignored:  # e.g. --n with cp: one warning line, the run goes on
                print(f"warning: {cfg.family.text} does not use "
                      f"{', '.join('--' + k.replace('_', '-') for k in ignored)}: ignored",
                      file=sys.stderr)
            keep_freed_memory()  # glibc: no page faults on a step's freed vectors
            set_threads(args.threads)
            shard = distributed.from_env(resolve_device(args.device))  # torchrun: split samples
            folder = train(cfg, epochs=args.epochs, out=args.out, device=args.device,
                           data_seed=args.data_seed, progress=not args.quiet, shard=shard)
            if shard is not None and shard.rank > 0:
                return 0
            summary = io.read_summary(folder / "summary.json",
                                      ("final_val_loss_chosen", "seconds_per_epoch", "device"))
        finally:
            distributed.shutdown()
        print(f"{folder}: final validation loss {summary['final_val_loss_chosen']:.4f}, "
              f"{summary['seconds_per_epoch']:.2f} s/epoch on {summary['device']}")
        return 0

    return run_main(body, resumable=True)


if __name__ == "__main__":
    sys.exit(main())
