"""``python -m pbscale.regress``: train a mask on MaskedNNRegression with one method.

Each run writes a folder ``<out>/<method>-n<n>-<param>-lr<lr>-<optimizer>-seed<seed>-<hash>``
(the hash over the full configuration: method, epochs, data; :mod:`pbscale.loop`) with
``config.json``, ``history.csv`` (per epoch: training loss, validation loss of the sampled masks
and of the chosen mask, mean theta, CP temperature, seconds), ``checkpoint.pt`` (written
atomically after every epoch) and, when finished, ``summary.json``. Running the same command
again resumes from the checkpoint, or returns at once if the run is complete.

Validation (`sec:app_maskednnregression`): MC and hybrid methods sample 5 masks, pick the one
with the lowest loss on 500 random training points and report its loss on the 5,000 validation
points (``val_loss_chosen``; ``val_loss`` is the mean over the 5 masks); CP uses 1[r > 0].
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pbexact.cli import (
    ArgumentParser,
    given_options,
    nonneg_float,
    nonneg_int,
    out_folder,
    positive_float,
    positive_int,
    run_main,
    thread_count,
)
from pbexact.errors import PBInputError
from pbexact.parametrizations import PARAMETRIZATIONS

from . import distributed, io
from .loop import run
from .loop import run_folder as loop_run_folder
from .loop_types import LoopConfig
from .methods import OPTIMIZERS, MethodConfig, Plan, get_family, names
from .methods.options import add_options, foreign, listed, settings_of, users
from .methods.registry import SHARED
from .regression import RegressionProblem, RegressionTask, make_problem, task_config
from .runtime import resolve_device, set_threads

DEFAULT_OUT = "runs/regression"
#: The registry's command of this tool.
COMMANDS_HERE = ("regress",)
#: The files of a run folder (see the module docstring).
RUN_FILES = ("config.json", "history.csv", "checkpoint.pt", "summary.json")


def unused(cfg: MethodConfig) -> list[str]:
    """The shared settings (:data:`pbscale.methods.registry.SHARED`) the run's method does not
    read (config.json's "info" lists them as "unused"; they stay in the hashed "method")."""
    return [k for k in SHARED if k not in cfg.family.caps.uses]


def ignored_options(cfg: MethodConfig, given: set[str]) -> list[str]:
    """The options named on the command line (``given``: dests) that the run does not read:
    shared settings its method does not use, and other methods' own settings."""
    return sorted(given & set(unused(cfg))) + foreign(given, cfg.method, COMMANDS_HERE)


def run_name(cfg: MethodConfig) -> str:
    """The readable part of a run's folder name (the folder adds a hash of the configuration)."""
    return f"{cfg.method}-n{cfg.n}-{cfg.param}-lr{cfg.lr:g}-{cfg.optimizer}-seed{cfg.seed}"


def _setup(cfg: MethodConfig, epochs: int, device: str, data_seed: int,
           problem: RegressionProblem | None):
    family = get_family(cfg.method, "regress")
    if not isinstance(epochs, int) or epochs < 1:
        raise PBInputError(f"epochs must be a positive integer, got {epochs!r}; give 1 or more")
    dev = resolve_device(device)
    if problem is None:
        problem = make_problem(data_seed, dev)
    task = RegressionTask(problem, data_seed)
    task.name = run_name(cfg)
    steps = epochs * task.steps_per_epoch
    trainer = family.make(cfg, problem.masked, Plan(
        epochs=epochs, steps_per_epoch=task.steps_per_epoch, mask_steps=steps,
        layers=(problem.d,), bytes_per_sample=problem.bytes_per_sample()))
    loop = LoopConfig(epochs=epochs, seed=cfg.seed, metrics_file="history.csv")
    return dev, task, trainer, loop


def run_folder(cfg: MethodConfig, epochs: int = 300, out: str | Path = DEFAULT_OUT,
               data_seed: int = 0, problem: RegressionProblem | None = None) -> Path:
    """The folder :func:`train` writes for these settings, found without training (and, for
    the paper's sizes, ``problem=None``, without drawing the data)."""
    task = (task_config(data_seed) if problem is None
            else RegressionTask(problem, data_seed).config())
    loop = LoopConfig(epochs=epochs, seed=cfg.seed, metrics_file="history.csv")
    config = {"task": task, "method": cfg.to_dict(), "loop": loop.to_dict()}
    return loop_run_folder(out, run_name(cfg), config)


def train(cfg: MethodConfig, epochs: int = 300, out: str | Path = DEFAULT_OUT,
          device: str = "auto", data_seed: int = 0, progress: bool = True,
          problem: RegressionProblem | None = None, shard=None) -> Path:
    """Train (or resume, or skip if finished) one run with :func:`pbscale.loop.run`; returns
    its folder. ``shard`` (:mod:`pbscale.distributed`): MC samples split over ranks; rank i > 0
    writes its copy of the run under ``out/.rank<i>``."""
    dev, task, trainer, loop = _setup(cfg, epochs, device, data_seed, problem)
    info = {"chunk": trainer.chunk, "torch_threads": torch.get_num_threads(), "world_size": 1,
            "unused": unused(cfg)}
    hooks = []
    if shard is not None:
        if not cfg.family.caps.split_samples:
            raise PBInputError(f"{cfg.method} draws no MC samples to split over ranks; run it "
                               f"without torchrun (sample parallelism is for "
                               f"{', '.join(names('regress', split_samples=True))})")
        hooks += distributed.rank_strategy(trainer, shard)[0]
        info["world_size"] = shard.world
        out = distributed.rank_out(out, shard)
        progress = progress and shard.rank == 0
    return run(task, trainer, loop, out, device=dev, progress=progress, info=info, hooks=hooks,
               method_info=cfg.family.info())


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
    p.add_argument("--lr", type=positive_float, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--optimizer", default="rmsprop", choices=list(OPTIMIZERS),
                   help="(default rmsprop)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="method seed (sampling, batches)")
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args_or_code(argv)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args

    def body() -> int:
        try:
            cfg = MethodConfig(method=args.method, n=args.n, param=args.param, lr=args.lr,
                               optimizer=args.optimizer, seed=args.seed, chunk=args.chunk,
                               lam=args.lam, settings=settings_of(vars(args), args.method))
            given = given_options(parser, argv)
            ignored = ignored_options(cfg, given)
            if ignored:  # e.g. --n with cp: one warning line, the run goes on
                print(f"warning: {cfg.family.text} does not use "
                      f"{', '.join('--' + k.replace('_', '-') for k in ignored)}: ignored",
                      file=sys.stderr)
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
