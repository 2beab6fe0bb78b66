"""What a network costs, for structured (channel) pruning: its parameters, its MACs and its CPU
latency (:func:`count`, :func:`latency`), and :class:`CostTable`, the exact parameters and MACs
of the network left when some channel variables are removed (:mod:`.channels` builds it).

The conventions, the same everywhere in :mod:`.channels`:

* **parameters**: the elements of the network's distinct parameters (a tied weight counts once;
  buffers such as BatchNorm's running statistics do not count).
* **MACs**: the multiply-accumulates of the Conv (1-D, 2-D, 3-D, transposed) and Linear weights
  for *one example*: ``positions * weight.numel()`` per call of the layer, where positions is
  the number of output positions per example (a convolution's output spatial size, a
  transposed one's input spatial size, 1 for a Linear on (B, F), T on (B, T, F)). Bias
  additions, normalisation, activations and pooling are not counted. Torch-Pruning's counter
  (``tp.utils.count_ops_and_params``) counts, per Conv/Linear layer and batch 1, these MACs
  plus the bias additions (tests/test_channel_groups.py checks it), and adds elementwise
  layers on top.

Removing channels shrinks a weight along one dimension for its output channels and another
for its input channels, so what is left of a weight is a *product* (kept rows times kept
columns): the exact cost of a keep mask is a multilinear polynomial in the mask, which
:meth:`CostTable.kept` evaluates. The per-variable cost :meth:`CostTable.single` (what removing
that variable alone saves, the L0 penalty's weight) is exact for one removed variable; for
several it adds the elements at the crossing of two removed variables twice, so the sum of the
removed variables' costs is at least, and where no two removed variables share a weight exactly,
the saving.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

Inputs = torch.Tensor | tuple[torch.Tensor, ...] | list[torch.Tensor]


def as_args(example_inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """The positional arguments of ``model(*args)``: a tensor becomes a 1-tuple."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    return tuple(example_inputs)


def _mac_layer(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, nn.modules.conv._ConvNd))


def positions(model: nn.Module, example_inputs: Inputs) -> dict[str, int]:
    """Output positions per example of every Conv/Linear layer that runs on ``example_inputs``
    (batch first), summed over the layer's calls: {module name: positions}. The model runs once
    in eval mode under ``torch.no_grad`` (its mode is restored)."""
    names = {m: n for n, m in model.named_modules()}
    found: dict[str, int] = {}

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if isinstance(module, nn.Linear):
            per = output.numel() // max(1, output.shape[0] * output.shape[-1])
        else:
            spatial = (inputs[0] if module.transposed else output).shape[2:]
            per = int(np.prod(spatial, dtype=np.int64)) if len(spatial) else 1
        name = names[module]
        found[name] = found.get(name, 0) + int(per)

    handles = [m.register_forward_hook(hook) for m in model.modules() if _mac_layer(m)]
    was = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(*as_args(example_inputs))
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return found


def count_params(model: nn.Module) -> int:
    """Elements of the model's distinct parameters (a tied parameter once)."""
    return int(sum(p.numel() for p in model.parameters()))


def count(model: nn.Module, example_inputs: Inputs) -> tuple[int, int]:
    """(parameters, MACs per example) of ``model`` on ``example_inputs`` (any batch size, batch
    first), by the module's conventions."""
    pos = positions(model, example_inputs)
    mods = dict(model.named_modules())
    macs = sum(p * mods[n].weight.numel() for n, p in pos.items())
    return count_params(model), int(macs)


def latency(model: nn.Module, example_inputs: Inputs, repeats: int = 30, warmup: int = 5
            ) -> float:
    """Median seconds of ``repeats`` forward passes of ``model`` on ``example_inputs`` (its batch
    is the batch measured) where they are (CPU, or a CUDA device: each pass then ends with
    ``torch.cuda.synchronize``), in eval mode under ``torch.inference_mode``, after ``warmup``
    unmeasured passes; timed with ``time.perf_counter``. The model's mode is restored."""
    if repeats < 1 or warmup < 0:
        from pbexact.errors import PBInputError
        raise PBInputError(f"latency needs repeats >= 1 and warmup >= 0, got {repeats} and "
                           f"{warmup}; give e.g. repeats=30, warmup=5")
    args = as_args(example_inputs)
    cuda = [a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda]

    def done() -> None:  # a CUDA pass is timed to its end, not to its launch
        if cuda:
            torch.cuda.synchronize(cuda[0])

    was = model.training
    times = []
    try:
        model.eval()
        with torch.inference_mode():
            for _ in range(warmup):
                model(*args)
            done()
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(*args)
                done()
                times.append(time.perf_counter() - t0)
    finally:
        model.train(was)
    return float(statistics.median(times))


@dataclass(frozen=True, eq=False)
class Axis:
    """One dimension of a tensor that loses ``counts[k]`` slices when variable ``variables[k]``
    is removed (full: its dense size)."""

    full: int
    variables: np.ndarray  # (m,) int64
    counts: np.ndarray  # (m,) int64


@dataclass(frozen=True, eq=False)
class TensorCost:
    """A parameter tensor that channel removal shrinks: ``rest`` elements per kept index of
    its pruned ``axes``; it counts ``params`` (1 or 0: a weight counts, a buffer not) times its
    elements as parameters and ``positions`` times them as MACs."""

    name: str
    rest: int
    axes: tuple[Axis, ...]
    params: int
    positions: int

    def dense(self) -> int:
        return self.rest * int(np.prod([a.full for a in self.axes], dtype=np.int64))


@dataclass(frozen=True, eq=False)
class CostTable:
    """The exact parameters and MACs of the network with some of its d channel variables
    removed: ``dense_params``/``dense_macs`` of the dense network and the tensors that
    removal shrinks."""

    d: int
    dense_params: int
    dense_macs: int
    tensors: tuple[TensorCost, ...]

    def _weight(self, t: TensorCost, kind: str) -> int:
        if kind == "params":
            return t.params
        if kind == "macs":
            return t.positions
        from pbexact.errors import PBInputError
        raise PBInputError(f"cost kind must be 'params' or 'macs', got {kind!r}")

    def kept(self, keep: torch.Tensor | np.ndarray, kind: str = "params") -> torch.Tensor:
        """Parameters (``kind="params"``) or MACs per example (``"macs"``) of the network left
        by ``keep`` of shape (..., d) (1/True: the variable stays, 0/False: removed; fractional
        values give the polynomial's value): a float64 tensor of shape (...), exact integers
        below 2^53."""
        z = torch.as_tensor(keep).to(torch.float64)
        if z.shape[-1:] != (self.d,):
            from pbexact.errors import PBInputError
            raise PBInputError(f"keep must have shape (..., {self.d}), got {tuple(z.shape)}")
        gone = 1.0 - z
        dense = self.dense_params if kind == "params" else self.dense_macs
        total = torch.full(z.shape[:-1], float(dense), dtype=torch.float64)
        for t in self.tensors:
            w = self._weight(t, kind)
            if w == 0:
                continue
            left = torch.full(z.shape[:-1], float(t.rest), dtype=torch.float64)
            for a in t.axes:
                cut = (gone[..., torch.as_tensor(a.variables)]
                       * torch.as_tensor(a.counts, dtype=torch.float64)).sum(-1)
                left = left * (a.full - cut)
            total = total + w * (left - t.dense())
        return total

    def single(self, kind: str = "params") -> np.ndarray:
        """What removing each variable alone saves: int64 array of shape (d,), exact for one
        removed variable, an upper bound on each one's share of a joint removal (see the
        module's docstring)."""
        out = np.zeros(self.d, dtype=np.int64)
        for t in self.tensors:
            w = self._weight(t, kind)
            if w == 0 or not t.axes:
                continue
            vs = np.unique(np.concatenate([a.variables for a in t.axes]))
            left = np.full(len(vs), t.rest, dtype=np.int64)
            for a in t.axes:
                cut = np.zeros(len(vs), dtype=np.int64)
                np.add.at(cut, np.searchsorted(vs, a.variables), a.counts)
                left = left * (a.full - cut)
            np.add.at(out, vs, w * (t.dense() - left))
        return out


def axis(full: int, pairs: Sequence[tuple[int, int]]) -> Axis:
    """An :class:`Axis` of dense size ``full`` from (variable, slices) pairs (a variable listed
    twice has its slices summed)."""
    acc: dict[int, int] = {}
    for v, c in pairs:
        acc[v] = acc.get(v, 0) + int(c)
    vs = np.array(sorted(acc), dtype=np.int64)
    return Axis(int(full), vs, np.array([acc[v] for v in vs.tolist()], dtype=np.int64))
