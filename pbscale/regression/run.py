"""One run of MaskedNNRegression, assembled: the task of :mod:`pbscale.regression.problem`, the
method its family builds (:meth:`pbscale.methods.registry.Family.make`) and the one run loop,
:func:`pbscale.runs.loop.run` (``python -m pbscale.regress`` is its command line).

Each run writes a folder ``<out>/<method>-n<n>-<param>-lr<lr>-<optimizer>-seed<seed>-<hash>``
(the hash over the full configuration: method, epochs, data; :mod:`pbscale.runs.loop`) with
``config.json``, ``history.csv`` (per epoch: training loss, validation loss of the sampled masks
and of the chosen mask, mean theta, CP temperature, seconds), ``checkpoint.pt`` (written
atomically after every epoch) and, when finished, ``summary.json``. Training the same settings
again resumes from the checkpoint, or returns at once if the run is complete.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pbexact.errors import PBInputError
from pbscale.execution import distributed
from pbscale.methods import MethodConfig, Plan, get_family, names
from pbscale.methods.registry import SHARED
from pbscale.regression.problem import RegressionProblem, RegressionTask, make_problem, task_config
from pbscale.runs.contracts import LoopConfig
from pbscale.runs.loop import run
from pbscale.runs.loop import run_folder as loop_run_folder
from pbscale.runs.runtime import resolve_device

DEFAULT_OUT = "runs/regression"
#: The registry's command of these runs.
COMMANDS_HERE = ("regress",)
#: The files of a run folder (see the module docstring).
RUN_FILES = ("config.json", "history.csv", "checkpoint.pt", "summary.json")


def unused(cfg: MethodConfig) -> list[str]:
    """The shared settings (:data:`pbscale.methods.registry.SHARED`) the run's method does not
    read (config.json's "info" lists them as "unused"; they stay in the hashed "method")."""
    return [k for k in SHARED if k not in cfg.family.caps.uses]


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
    """Train (or resume, or skip if finished) one run with :func:`pbscale.runs.loop.run`; returns
    its folder. ``shard`` (:mod:`pbscale.execution.distributed`): MC samples split over ranks; rank
    i > 0 writes its copy of the run under ``out/.rank<i>``."""
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
