"""The Python API of pruning: :func:`prune_model` prunes the user's own torch network on the
user's own data with any pruning method of the registry, in supermask or joint mode, alone or
as a pruning group (several seeds, L0 strengths and mask learning rates trained together), and
returns :class:`PruneResult`: the masks, the metrics, the run folder and the pruned network in
``torch.nn.utils.prune`` form.

It is ``python -m pbscale.prune`` called from Python: the same run (:func:`pbscale.pruning.run.
run`, :func:`pbscale.pruning.run.run_group`), the same run folder (so ``analysis.pareto``,
``analysis.scale_report --compare`` and ``pbscale.export`` read it), resumed where it stopped
(a SIGINT or SIGTERM checkpoints it and raises :class:`pbexact.errors.RunInterrupted`; a
killed run resumes from its last checkpoint), with the memory guard, the GPU routes and the
allocator setting that apply. Bad input raises :class:`pbexact.errors.PBInputError` with a
one-line message.

    result = prune_model(net, (x_train, y_train), (x_test, y_test), method="cp", lam=1e-5,
                         epochs=10, out="runs/mine")
    result.summary["final_test_acc"], result.masks["fc1.weight"], result.pruned()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale.nets import user_data
from pbscale.nets.network import NetworkSource, source_for
from pbscale.pruning import run as P
from pbscale.pruning.config import PruneConfig
from pbscale.pruning.outputs import load_pruned, load_structured
from pbscale.runs import io as runio
from pbscale.runs.allocator import keep_freed_memory
from pbscale.runs.jobs import listed_values
from pbscale.runs.runtime import resolve_device, set_threads

#: What a run records as its data file when the data came as Python objects.
IN_MEMORY = "(arrays given in Python)"

Split = Any  # (x, y) arrays or tensors, a torch Dataset, or a DataLoader


@dataclass(frozen=True)
class PruneResult:
    """One finished run: its ``folder`` (what ``python -m pbscale.prune`` writes), its
    ``summary`` (``summary.json``: ``final_test_acc``, ``final_remaining`` ...), its ``config``
    and the network's ``source``. :attr:`metrics` (``metrics.csv``, one row per epoch),
    :attr:`masks` ({parameter: 0/1 mask of its shape}) and :meth:`pruned` read the folder."""

    folder: Path
    summary: dict
    config: PruneConfig
    source: NetworkSource

    @property
    def metrics(self) -> list[dict]:
        """``metrics.csv``: one dict per epoch (epoch 0: before training)."""
        return runio.read_csv(self.folder / "metrics.csv")

    @property
    def masks(self) -> dict[str, torch.Tensor]:
        """{masked parameter name: its 0/1 mask (float, the parameter's shape)}."""
        blob = runio.load_checkpoint(self.folder / "masks.pt") or {}
        return {k.removeprefix("mask."): v for k, v in blob.items() if k.startswith("mask.")}

    def pruned(self) -> nn.Module:
        """The pruned network in ``torch.nn.utils.prune`` form (``<p>_orig`` and ``<p>_mask``
        of every masked parameter, the weights as trained), built again by the run's source,
        on the CPU, in eval mode (:func:`pbscale.pruning.outputs.load_pruned`)."""
        return load_pruned(self.source, self.folder / "pruned.pt")

    def structured(self) -> nn.Module:
        """A ``granularity="channel"`` run's network with its pruned channels removed (the
        tensors shrink), from ``structured.pt``, on the CPU, in eval mode
        (:func:`pbscale.pruning.outputs.load_structured`)."""
        if not (self.folder / "structured.pt").exists():
            raise PBInputError(f"{self.folder} has no structured.pt: only a run with "
                               "granularity='channel' removes channels; use pruned()")
        return load_structured(self.source, self.folder / "structured.pt")


def _listed(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _config(settings: dict[str, Any]) -> PruneConfig:
    known = {f.name for f in fields(PruneConfig)}
    bad = sorted(set(settings) - known)
    if bad:
        raise PBInputError(f"prune_model got the unknown setting {bad[0]!r}; settings are the "
                           f"fields of PruneConfig: {', '.join(sorted(known))}")
    return PruneConfig(**settings)


def prune_model(model: nn.Module | Callable[[], nn.Module] | str, train: Split | None = None,
                test: Split | None = None, *, val: Split | None = None, method: str = "cp",
                mode: str = "supermask", lam: float | Sequence[float] = PruneConfig.lam,
                mask_lr: float | Sequence[float] = PruneConfig.mask_lr,
                seed: int | Sequence[int] = 0, epochs: int = PruneConfig.epochs,
                masked: str | Sequence[str] | None = None, loss: str = "",
                granularity: str = PruneConfig.granularity, cost: str = PruneConfig.cost,
                out: str | Path = "runs/prune", device: str = "cpu",
                threads: int | None = None, progress: bool = True,
                **settings: Any) -> PruneResult | list[PruneResult]:
    """Prune ``model`` on ``train`` (scored on ``val`` and ``test``) and return its
    :class:`PruneResult`, or a list of them when ``seed``, ``lam`` or ``mask_lr`` is a list
    (the grid of their product, trained as one pruning group, in the order lams x mask lrs x
    seeds).

    ``model``: an ``nn.Module`` (each run trains a deep copy), a function or class returning
    one, an import path ``package.module:factory`` or a built-in name (``lenet`` ...). Its
    weights are re-initialized from the seed as in the paper (``init="kaiming_normal"``) unless
    ``init="model"`` keeps them (e.g. trained weights). ``train``, ``test``, ``val``: each
    ``(x, y)`` arrays or tensors, a torch ``Dataset`` of (input, target) items or a
    ``DataLoader`` (its dataset, read once in order); uint8 inputs are standardized images,
    float inputs go in as they are; integer labels train with cross-entropy (accuracy reported),
    float targets with MSE (``loss``: "ce", "mse" or ``package.module:function``). Without
    ``val``, a tenth of ``train`` (at most 5,000 examples) validates. Leave ``train`` and
    ``test`` out to use ``data_dir=`` (MNIST, CIFAR-10) or ``data=`` (an .npz file).
    ``masked``: patterns of the parameters to mask (default: every Linear and convolution
    weight but the classifier; ``granularity="channel"``: the layers that may change, the
    others left out). ``granularity``: "weight" (one variable a weight) or "channel" (one a
    channel of Torch-Pruning's coupled groups, CP and the MC estimators: the run also writes
    groups.json and structured.pt, :meth:`PruneResult.structured`, and reports parameters, MACs
    and CPU latency of the dense and pruned network in its summary); ``cost``: what the L0 term
    weighs a channel by, "params" or "macs" (normalised to mean 1). ``settings``: any other field of
    :class:`pbscale.pruning.config.PruneConfig` (``n``, ``mask_opt``, ``target``, ``batch_size``,
    ``init`` ...), as ``python -m pbscale.prune`` takes them. ``progress``: progress bars and
    the per-layer counts on the console.

    Like the command, once its settings are read it applies the training commands' allocator
    setting (:func:`pbscale.runs.allocator.keep_freed_memory`): on Linux with glibc, for the
    whole calling process and for good, freed blocks up to 32 MiB stay in the process instead
    of being page-faulted in again (about 30% of a LeNet REINFORCE n = 1 step), so the
    process's resident set does not shrink after a peak.
    ``PBNN_KEEP_FREED_MEMORY=0`` in the environment keeps glibc's defaults."""
    if (train is None) != (test is None):
        raise PBInputError("give both train and test (or neither, with data_dir= or data=)")
    pattern = ",".join(_listed(masked)) if masked is not None else ""
    source = source_for(model)
    base = _config({**settings, "model": source.spec, "method": method, "mode": mode,
                    "epochs": epochs,
                    "masked": pattern, "loss": loss, "granularity": granularity,
                    "cost": cost, "lam": _listed(lam)[0],
                    "mask_lr": _listed(mask_lr)[0], "seed": _listed(seed)[0],
                    **({"data": IN_MEMORY} if train is not None else {})})
    keep_freed_memory()  # glibc: no page faults on a step's freed vectors, as the command
    set_threads(threads)
    data = None
    if train is not None:
        cfg = base.resolved().validate()
        arrays = user_data.object_arrays(train, test, val)
        data = user_data.arrays_data(arrays, resolve_device(device), cfg.val_size,
                                     cfg.split_seed)
    elif base.data == IN_MEMORY:
        raise PBInputError("data=... names a file; give train and test as Python objects "
                           "instead")
    seeds, lams, lrs = (listed_values(_listed(v)) for v in (seed, lam, mask_lr))
    if len(seeds) * len(lams) * len(lrs) == 1:
        summary = P.run(base, out, device, quiet=not progress, data=data, source=source)
        if not progress:  # the run printed nothing: an extreme mask still says so
            P.print_extremes(summary, base.resolved())
        return _result(summary["folder"], base, source)
    cfgs = P.group_configs(base, seeds, lams, lrs)
    P.run_group(cfgs, out, device, quiet=not progress, data=data, source=source)
    folders = _group_folders(cfgs, out, device, data, source)
    return [_result(f, c, source) for f, c in zip(folders, cfgs)]


def _group_folders(cfgs: list[PruneConfig], out: str | Path, device: str, data, source
                   ) -> list[Path]:
    """The run folders of a group's members (as :func:`pbscale.pruning.run.member` names them)."""
    _, dev, data = P.prepare(cfgs[0], device, data=data, source=source)
    return [P.member(c.resolved().validate(), data, dev, out, source).folder for c in cfgs]


def _result(folder: str | Path, cfg: PruneConfig, source: NetworkSource) -> PruneResult:
    folder = Path(folder)
    return PruneResult(folder, runio.read_summary(folder / "summary.json"), cfg, source)


__all__ = ["IN_MEMORY", "PruneResult", "prune_model"]
