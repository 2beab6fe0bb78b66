"""``python -m pbscale.regress``: train a mask on MaskedNNRegression with one method.

Each run writes a folder ``<out>/<method>-n<n>-<param>-lr<lr>-<optimizer>-seed<seed>`` with
``config.json``, ``history.csv`` (per epoch: training loss, validation loss of the sampled masks
and of the chosen mask, mean theta, CP temperature, seconds), ``checkpoint.pt`` (written
atomically after every epoch) and, when finished, ``summary.json``. Running the same command
again resumes from the checkpoint, or returns at once if the run is complete.

Validation (`sec:app_maskednnregression`): MC and hybrid methods sample 5 masks, pick the one
with the lowest loss on 500 random training points and report its loss on the 5,000 validation
points (``val_loss_chosen``; ``val_loss`` is the mean over the 5 masks); CP uses 1[r > 0].
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from pbexact.errors import (
    ArgumentParser,
    PBInputError,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
)
from pbexact.io import check_out_dir

from . import io
from .methods import METHODS, OPTIMIZERS, MaskTrainer, MethodConfig
from .regression import BATCH, SELECT_POINTS, VALID_MASKS, RegressionProblem, make_problem

DEFAULT_OUT = "runs/regression"
#: The files of a run folder (see the module docstring).
RUN_FILES = ("config.json", "history.csv", "checkpoint.pt", "summary.json")


def run_name(cfg: MethodConfig) -> str:
    return f"{cfg.method}-n{cfg.n}-{cfg.param}-lr{cfg.lr:g}-{cfg.optimizer}-seed{cfg.seed}"


def set_threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise PBInputError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise PBInputError(f"unknown device {device!r}; use cpu, cuda, cuda:0 or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PBInputError("--device cuda was asked for but no GPU is visible; use --device cpu")
    return dev


def _tau(trainer: MaskTrainer) -> float:
    return trainer.tau() if trainer.method == "cp" else math.nan


def validate(problem: RegressionProblem, trainer: MaskTrainer) -> dict:
    """Validation losses of the current mask distribution (see the module docstring)."""
    with torch.no_grad():
        if trainer.method == "cp":
            masks = trainer.sample_masks(1)
            val = problem.valid_loss()(masks)
            return {"val_loss": float(val[0]), "val_loss_chosen": float(val[0])}
        masks = trainer.sample_masks(VALID_MASKS)
        pick = torch.randperm(problem.x_train.shape[0], generator=trainer.generator,
                              device=trainer.device)[:SELECT_POINTS]
        best = int(torch.argmin(problem.batch_loss(pick)(masks)))
        val = problem.valid_loss()(masks)
        return {"val_loss": float(val.mean()), "val_loss_chosen": float(val[best])}


def train(cfg: MethodConfig, epochs: int = 300, out: str | Path = DEFAULT_OUT,
          device: str = "auto", data_seed: int = 0, progress: bool = True,
          problem: RegressionProblem | None = None) -> Path:
    """Train (or resume, or skip if finished) one run; returns its folder."""
    cfg.validate()
    if not isinstance(epochs, int) or epochs < 1:
        raise PBInputError(f"epochs must be a positive integer, got {epochs!r}")
    dev = resolve_device(device)
    folder = Path(out) / run_name(cfg)
    check_out_dir(Path(out))
    for name in RUN_FILES:
        if (folder / name).is_dir():
            raise PBInputError(f"damaged run folder: {folder / name} is a folder, not a file; "
                               f"{io.DAMAGED_FIX}")
    record = {"method": cfg.to_dict(), "epochs": epochs, "data_seed": data_seed,
              "device": str(dev)}
    if (folder / "config.json").exists():
        old = io.read_json(folder / "config.json")
        if not isinstance(old, dict):
            raise PBInputError(f"damaged run file {folder / 'config.json'} (not a JSON object); "
                               f"{io.DAMAGED_FIX}")
        same = {k: old.get(k) for k in ("method", "epochs", "data_seed")}
        if same != {k: record[k] for k in same}:
            raise PBInputError(
                f"{folder} holds a run with another configuration; choose another --out "
                "or delete the folder"
            )
    if (folder / "summary.json").exists():
        return folder
    if problem is None:
        problem = make_problem(data_seed, dev)
    n_train = problem.x_train.shape[0]
    steps_per_epoch = n_train // BATCH
    trainer = MaskTrainer(cfg, problem.d, epochs * steps_per_epoch, dev,
                          bytes_per_sample=problem.bytes_per_sample())
    record["chunk"] = trainer.chunk
    record["d"] = problem.d
    record["torch_threads"] = torch.get_num_threads()
    io.write_json(folder / "config.json", record)

    state = io.load_checkpoint(folder / "checkpoint.pt", keys=("trainer", "history", "epoch"))
    if state is not None:
        try:
            trainer.load_state_dict(state["trainer"])
            history, start = list(state["history"]), int(state["epoch"])
            if not 0 <= start <= epochs or len(history) != start + 1:
                raise ValueError
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError):
            raise PBInputError(
                f"damaged checkpoint {folder / 'checkpoint.pt'} (its contents do not fit this "
                f"run); {io.DAMAGED_FIX}"
            ) from None
    else:
        history = [{"epoch": 0, "train_loss": math.nan, **validate(problem, trainer),
                    "theta_mean": float(trainer.theta().mean()), "tau": _tau(trainer),
                    "train_seconds": 0.0, "val_seconds": 0.0}]
        start = 0
    bar = tqdm(range(start, epochs), initial=start, total=epochs, disable=not progress,
               desc=run_name(cfg), unit="epoch", file=sys.stderr)
    for epoch in bar:
        t0 = time.perf_counter()
        perm = torch.randperm(n_train, generator=trainer.generator, device=dev)
        losses = [trainer.step(problem.batch_loss(perm[i * BATCH : (i + 1) * BATCH]))
                  for i in range(steps_per_epoch)]
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t1 = time.perf_counter()
        if not bool(torch.isfinite(trainer.r).all()):
            raise PBInputError(
                f"the mask logits became NaN or inf in epoch {epoch + 1}: the learning rate "
                f"{cfg.lr:g} is too large for --optimizer {cfg.optimizer}; lower --lr"
            )
        val = validate(problem, trainer)
        t2 = time.perf_counter()
        history.append({"epoch": epoch + 1, "train_loss": sum(losses) / len(losses), **val,
                        "theta_mean": float(trainer.theta().mean()), "tau": _tau(trainer),
                        "train_seconds": t1 - t0, "val_seconds": t2 - t1})
        io.save_checkpoint(folder / "checkpoint.pt",
                           {"trainer": trainer.state_dict(), "history": history,
                            "epoch": epoch + 1})
        io.write_csv(folder / "history.csv", history)
        bar.set_postfix(train=f"{history[-1]['train_loss']:.4f}",
                        val=f"{val['val_loss_chosen']:.4f}")
    io.write_csv(folder / "history.csv", history)
    train_s = sum(h["train_seconds"] for h in history)
    io.write_json(folder / "summary.json", {
        "final_val_loss_chosen": history[-1]["val_loss_chosen"],
        "final_train_loss": history[-1]["train_loss"],
        "train_seconds": train_s,
        "seconds_per_epoch": train_s / max(len(history) - 1, 1),
        "device": str(dev),
    })
    return folder


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m pbscale.regress",
        description="Optimize a binary weight mask of the MaskedNNRegression backbone "
        "(sec:app_maskednnregression, d = 8,050) with one method; writes a resumable run folder.",
    )
    p.add_argument("--method", default="loorf", help=f"one of {', '.join(METHODS)} (default loorf)")
    p.add_argument("--n", type=positive_int, default=10,
                   help="samples per step (ignored by cp; default 10)")
    p.add_argument("--param", default="sigmoid",
                   help="parametrization: sigmoid, cosine, direct, escort (default sigmoid)")
    p.add_argument("--lr", type=positive_float, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--optimizer", default="rmsprop", help=f"one of {', '.join(OPTIMIZERS)}")
    p.add_argument("--seed", type=nonneg_int, default=0, help="method seed (sampling, batches)")
    p.add_argument("--data-seed", type=nonneg_int, default=0,
                   help="seed of data, target and backbone, shared by all runs (default 0)")
    p.add_argument("--epochs", type=positive_int, default=300,
                   help="epochs of 100 steps (default 300)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
    p.add_argument("--chunk", type=positive_int, default=None,
                   help="samples evaluated at once (default: from free memory)")
    p.add_argument("--lam", type=nonneg_float, default=0.0, help="dense-mask regularizer weight")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"parent folder of runs ({DEFAULT_OUT})")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is fastest on a shared "
                   "2-core machine, see the README)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's own one-line errors (exit 2) and --help (exit 0)
        return int(exc.code or 0)
    cfg = MethodConfig(method=args.method, n=args.n, param=args.param, lr=args.lr,
                       optimizer=args.optimizer, seed=args.seed, chunk=args.chunk, lam=args.lam)
    try:
        set_threads(args.threads)
        folder = train(cfg, epochs=args.epochs, out=args.out, device=args.device,
                       data_seed=args.data_seed, progress=not args.quiet)
        summary = io.read_json(folder / "summary.json")
        if not isinstance(summary, dict) or not {"final_val_loss_chosen", "seconds_per_epoch",
                                                 "device"} <= set(summary):
            raise PBInputError(f"damaged run file {folder / 'summary.json'} (entries missing); "
                               f"{io.DAMAGED_FIX}")
    except PBInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{folder}: final validation loss {summary['final_val_loss_chosen']:.4f}, "
          f"{summary['seconds_per_epoch']:.2f} s/epoch on {summary['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
