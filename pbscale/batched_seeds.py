"""``python -m pbscale.batched_seeds``: a regression group, many seeds and learning rates of one
MaskedNNRegression setting trained as one computation in one process, each member's numbers
its separate run's (:mod:`pbscale.regression.group`; the command keeps the name it had before
"group" became the one word for G runs in one process).

``python -m pbscale.batched_seeds --method loorf --n 10 --lrs 0.1,0.01 --seeds 0-9 --epochs
300`` trains the unfinished runs of those settings as one group; each run's folder is the one
``python -m pbscale.regress`` writes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

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
from pbscale.methods import OPTIMIZERS, MethodConfig, names
from pbscale.methods.options import add_options, options, settings_of
from pbscale.regression.group import MAX_RUNS, MaskTrainerGroup, member_key, train_unfinished
from pbscale.regression.problem import make_problem
from pbscale.regression.run import DEFAULT_OUT
from pbscale.runs.runtime import resolve_device, set_threads
from pbscale.sweep.jobs import Grouping

__all__ = ["GROUPING", "SHARED", "build_parser", "group_argv", "group_seeds", "groupable",
           "lr_list", "main"]


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


#: The ``pbscale.regress`` options a group takes once (the others, seed and lr, as lists; and
#: the methods' own settings, :func:`own_options`).
SHARED = ("method", "n", "param", "optimizer", "epochs", "data_seed", "lam", "device")
#: The registry's command of this tool (a method claims it to train in regression groups).
COMMANDS_HERE = ("regress-group",)


def own_options() -> list[str]:
    """The dests of the methods' own settings a group takes (:mod:`pbscale.methods.options`)."""
    return [o.dest for o in options(COMMANDS_HERE)]


def groupable(full: dict) -> bool:
    """Whether a ``pbscale.regress`` run (every option filled in) can train in a group: a
    method of ``names("regress-group")``, no chunk of its own, no option a group does not
    take."""
    return (full.get("method") in names(*COMMANDS_HERE) and full.get("chunk") is None
            and set(full) <= {*SHARED, *own_options(), "seed", "lr", "chunk"})


def group_argv(full: dict, values: Mapping[str, Sequence]) -> list[str]:
    """The options of the group of seeds x lrs (``values["seed"]``, ``values["lr"]``) whose
    shared options are ``full``'s (the methods' own settings among them where set)."""
    args: list[str] = []
    for key in [*SHARED, *(k for k in own_options() if k in full)]:
        args += ["--" + key.replace("_", "-"), str(full[key])]
    return [*args, "--lrs", ",".join(repr(float(v)) for v in values["lr"]),
            "--seeds", ",".join(str(int(v)) for v in values["seed"])]


#: How ``pbscale.sweep`` groups ``regress`` runs (:class:`pbscale.sweep.jobs.Grouping`).
GROUPING = Grouping("pbscale.batched_seeds", SHARED, groupable, group_argv,
                    lambda full: member_key(full["seed"], full["lr"]))


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m pbscale.batched_seeds",
                       description="Many seeds and learning rates of one MaskedNNRegression "
                                   "setting trained as one regression group, each run's numbers "
                                   "its separate run's; each run's folder is the one python -m "
                                   "pbscale.regress writes.")
    p.add_argument("--method", default="loorf", choices=list(names(*COMMANDS_HERE)),
                   help="estimator of the gradient of the mask probabilities (default loorf)")
    p.add_argument("--n", type=positive_int, default=10,
                   help="samples per step (default 10)")
    p.add_argument("--param", default="sigmoid", choices=list(PARAMETRIZATIONS),
                   help="parametrization of the mask probabilities (default sigmoid)")
    p.add_argument("--optimizer", default="rmsprop", choices=list(OPTIMIZERS),
                   help="optimizer of the mask logits (default rmsprop)")
    p.add_argument("--lrs", type=lr_list, default="0.1", help="comma-separated learning rates")
    p.add_argument("--seeds", type=group_seeds, default="0-9",
                   help=f"e.g. 0-9 or 0,3,5 (at most {MAX_RUNS:,} runs: seeds x learning rates)")
    p.add_argument("--epochs", type=positive_int, default=300,
                   help="training epochs (default 300)")
    p.add_argument("--data-seed", type=nonneg_int, default=0,
                   help="seed of data, target and backbone, shared by all runs (default 0)")
    p.add_argument("--lam", type=nonneg_float, default=0.0,
                   help="dense-mask regularizer weight (default 0)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
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
