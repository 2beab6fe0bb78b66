"""``python -m pbscale.export RUN --format pt2|torchscript|onnx|sparse --out FILE``: a finished
pruning run (:mod:`pbscale.prune`: ``config.json``, ``data.json``, ``pruned.pt``) as a network
that runs without pbnn.

The exported network takes the raw inputs the run was given: images as uint8 of shape
(N, *input_shape) (MNIST: (N, 784); CIFAR-10: (N, 3, 32, 32)), a user's float or integer
arrays as they are (``data.json``'s ``input_dtype``), and returns the network's outputs (the
logits (N, 10) of the paper's networks): the run's test-time transform (x / 255 - mean) / std
of ``data.json`` is its first operation for images (:class:`Standardized`), and each mask is
folded into its weight (``weight_orig * weight_mask``, a plain weight with exact zeros). A
user's own network is built again only from what the user names (``--model
package.module:factory``, or ``model=`` in Python): a run folder never chooses code to run. The
name must be the import path the run records, checked before anything is imported, and the
network it builds must be the run's (config.json's ``network_id``: the import path and every
parameter's name, shape and dtype); a missing or another one is a one-line refusal
(:func:`network_source`). In Python, :func:`export` also takes the
:class:`pbscale.pruning.api.PruneResult` that ``prune_model`` returned, which carries its
network. ``--out`` may name a file in a folder that does not exist yet: the folder is created
when the file is written, once every check has passed. Formats:

* ``pt2`` (the default): ``torch.export`` of that network (dynamic batch size), what torch
  recommends since it deprecated ``torch.jit.trace``; ``torch.export.load(FILE).module()``
  reads it back;
* ``torchscript``: ``torch.jit.trace`` of that network, ``torch.jit.load`` reads it back
  (deprecated by torch; kept for older consumers);
* ``onnx``: ``torch.onnx.export`` (input "images", output "logits", dynamic batch size); needs
  the ``export`` extra (onnx, onnxscript: ``pip install -e ".[export]"``);
* ``sparse``: a compact ``.pt`` for pbnn or plain torch (:func:`save_sparse`,
  :func:`load_sparse`): each mask as bits (``numpy.packbits``, 1 bit per weight) and only the
  kept weights' values, the other parameters and buffers as they are; at 5% density the
  masked layers take about 1/16 of their dense size (docs/export.md).

A ``--granularity channel`` run (its folder holds ``structured.pt``) exports, in every format,
its smaller network: the pruned channels removed (the tensors shrink), rebuilt from
structured.pt with ``weights_only=True``; its sparse file holds that network's state dict and
keep mask (:data:`STRUCTURED_FORMAT`). ``--masked-network`` (``masked=True``) exports the
dense-shaped network with the channel masks folded in instead (docs/structured.md).
"""

from __future__ import annotations

import io
import logging
import math
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from pbexact.cli import ArgumentParser, run_main
from pbexact.errors import PBInputError
from pbexact.io import path_problem
from pbscale.nets.channel_layout import rebuild
from pbscale.nets.models import MODELS
from pbscale.nets.network import (
    IMPORT_PATH,
    NETWORK_INITS,
    NetworkSource,
    importable,
    network_id,
    source_for,
)
from pbscale.nets.network import argument as model_argument
from pbscale.pruning.api import PruneResult
from pbscale.pruning.outputs import check_masks, load_pruned, pruned_names
from pbscale.runs import io as runio

FORMATS = ("pt2", "torchscript", "onnx", "sparse")
#: What the exported network takes, by ``data.json``'s "input_dtype" (runs written before it
#: was recorded took uint8 images).
INPUT_DTYPES = {"uint8": torch.uint8, "float32": torch.float32, "int64": torch.int64}
#: The version tag of the sparse format (:func:`save_sparse`).
SPARSE_FORMAT = "pbnn-sparse-1"
#: The version tag of the sparse format of a channel run's smaller network (:func:`save_sparse`).
STRUCTURED_FORMAT = "pbnn-structured-1"


class Standardized(nn.Module):
    """``net`` after the test-time transform of a run: uint8 images x -> net((x / 255 - mean)
    / std) in float32, with ``mean`` and ``std`` (one value, or one per channel) as buffers;
    other inputs (``input_dtype`` float32 or int64) go to ``net`` as they are."""

    def __init__(self, net: nn.Module, mean: list[float], std: list[float],
                 input_shape: list[int], input_dtype: str = "uint8") -> None:
        super().__init__()
        shape = (1, len(mean), *([1] * (len(input_shape) - 1))) if len(mean) > 1 else (1, 1)
        self.net = net
        self.images = input_dtype == "uint8"
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).reshape(shape))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).reshape(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.images:
            return self.net(x)
        return self.net((x.float() / 255.0 - self.mean) / self.std)


def read_run(folder: str | Path) -> tuple[str, dict]:
    """(model: a name of :data:`pbscale.nets.models.MODELS` or the user's import path, data.json) of
    a finished pruning run folder; a folder that is not one is a one-line
    :class:`PBInputError`."""
    model, data, _ = read_recorded(folder)
    return model, data


def read_recorded(folder: str | Path) -> tuple[str, dict, dict]:
    """:func:`read_run`'s (model, data.json) and config.json's "task" (the run's settings: its
    seed, initialization and, for the user's network, ``network_id``), all checked; nothing is
    imported."""
    folder = Path(folder)
    problem = path_problem(str(folder))
    if problem:
        raise PBInputError(f"RUN {str(folder)[:60]!r} {problem}; pass a run folder")
    missing = [f for f in ("config.json", "data.json", "pruned.pt") if not (folder / f).is_file()]
    if missing:
        raise PBInputError(f"{folder} is not a finished pruning run folder (no "
                           f"{', '.join(missing)}); pass a folder python -m pbscale.prune wrote")
    config, data = runio.read_json(folder / "config.json"), runio.read_json(folder / "data.json")
    task = config.get("task") if isinstance(config, dict) else None
    model = task.get("model") if isinstance(task, dict) else None
    if (not isinstance(model, str) or not (model in MODELS or IMPORT_PATH.match(model))
            or not isinstance(data, dict) or not {"mean", "std", "input_shape"} <= set(data)
            or data.get("input_dtype", "uint8") not in INPUT_DTYPES):
        raise PBInputError(f"damaged run folder {folder} (config.json or data.json); "
                           f"{runio.DAMAGED_FIX}")
    check_finished(folder)
    check_transform(folder, data)
    return model, data, task


def check_finished(folder: Path) -> None:
    """Refuse (one line) a run folder without a readable summary.json: the run did not finish
    (its pruned.pt may be another run's, or damaged)."""
    path = folder / "summary.json"
    if not path.exists():
        raise PBInputError(f"{folder} holds no summary.json: the run has not finished; finish it "
                           f"(rerun its command) before exporting")
    runio.read_summary(path)


#: Most values one exported input may hold (a 4096 x 4096 RGB image): data.json's input_shape
#: beyond it is damaged (the tracing input alone would not fit in memory).
MAX_INPUT = 3 * 4096 * 4096


def check_transform(folder: Path, data: dict) -> None:
    """Refuse (one line) a data.json whose test-time transform cannot be exported: mean and std
    lists of finite numbers of one length, input_shape a list of positive integers of at most
    :data:`MAX_INPUT` values; for images (uint8 inputs, which the transform standardizes) every
    std > 0 and, with one mean per channel, the first entry of input_shape their count."""
    mean, std, shape = data["mean"], data["std"], data["input_shape"]

    def numbers(v: object) -> bool:
        return (isinstance(v, list) and bool(v) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for x in v))

    images = data.get("input_dtype", "uint8") == "uint8"
    why = None
    if not numbers(mean) or not numbers(std) or len(mean) != len(std):
        why = "mean and std are not lists of finite numbers of one length"
    elif images and any(x <= 0 for x in std):
        why = "a std is 0 or negative"
    elif (not isinstance(shape, list) or not shape or any(
            not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in shape)):
        why = "input_shape is not a list of positive integers"
    elif math.prod(shape) > MAX_INPUT:
        why = f"input_shape {shape} holds more than {MAX_INPUT:,} values"
    elif images and len(mean) > 1 and shape[0] != len(mean):
        why = f"{len(mean)} channel means for input_shape {shape}"
    if why:
        raise PBInputError(f"damaged run file {folder / 'data.json'} ({why}); "
                           f"{runio.DAMAGED_FIX}")


def read_pruned_state(folder: Path) -> dict:
    """The run's pruned.pt (``weights_only=True``), refused in one line when it is damaged (not
    a torch file, or not a state dict of tensors), holds NaN or inf values or a mask that is
    not 0/1 (:func:`pbscale.pruning.outputs.check_masks`: an edited mask would scale the
    weights it keeps)."""
    path = folder / "pruned.pt"
    state = runio.load_checkpoint(path)
    if not isinstance(state, dict) or not all(
            isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise PBInputError(f"damaged run file {path} (not a state dict of tensors); "
                           f"{runio.DAMAGED_FIX}")
    check_finite_state(state, path)
    check_masks(state, path)
    return state


def read_pruned(folder: Path, source: NetworkSource) -> nn.Module:
    """:func:`pbscale.pruning.outputs.load_pruned` of the run's pruned.pt (checked by
    :func:`read_pruned_state`), refused in one line when its keys or shapes are not the
    network's."""
    read_pruned_state(folder)
    try:
        return load_pruned(source, folder / "pruned.pt")
    except (RuntimeError, KeyError, ValueError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PBInputError(f"damaged run file {folder / 'pruned.pt'} (not the run's network: "
                           f"{first[:120]}); {runio.DAMAGED_FIX}") from None


def checked_network(folder: str | Path, model: object = None, masked: bool = False
                    ) -> tuple[nn.Module, torch.Tensor]:
    """:func:`plain_network` and :func:`example_input`, refused in one line when the network
    does not take data.json's input_shape."""
    net, x = plain_network(folder, model, masked), example_input(folder)
    try:
        with torch.no_grad():
            net(x)
    except RuntimeError as exc:
        raise PBInputError(f"damaged run folder {folder}: its network does not take data.json's "
                           f"input_shape ({str(exc).splitlines()[0][:100]}); "
                           f"{runio.DAMAGED_FIX}") from None
    return net, x


def model_hint(spec: str) -> str:
    """How the user names the network ``spec`` of a run: ``--model spec`` where it is an import
    path another process can import, else ``model=`` in Python."""
    if importable(spec):
        return (f"pass --model {spec} (in Python: model={spec!r} or the factory itself) if "
                "that is the code you mean to run")
    return ("it was given as a Python object that no other process can import: export from "
            "Python with model=<that network or its factory>")


def network_source(spec: str, model: object = None) -> NetworkSource:
    """The network ``spec`` (a run's recorded model, or a sparse file's) to build again. A
    built-in model needs nothing (``model`` may name it again). The user's own network is
    built only from ``model`` (an import path, a factory or an ``nn.Module``): the recorded
    name alone never imports or calls anything, so a run folder or file that names code cannot
    run it. ``model`` must name the recorded import path: a string is compared before it is
    imported, an object (or the :class:`NetworkSource` a run was built from) by the import path
    it has. Missing or another: a one-line :class:`PBInputError`."""
    if model is None:
        if spec in MODELS:
            return source_for(spec)
        raise PBInputError(f"the run's network is your own code, {spec}, and a run folder never "
                           f"chooses code to run; {model_hint(spec)}")
    if isinstance(model, str):
        if model != spec:  # compared before anything is imported
            what = "the built-in " if spec in MODELS else ""
            fix = ("leave --model out" if spec in MODELS
                   else f"pass --model {spec}" if importable(spec) else model_hint(spec))
            raise PBInputError(f"--model {model} is not the run's network (it was trained on "
                               f"{what}{spec}); {fix}")
        return source_for(model)
    source = model if isinstance(model, NetworkSource) else source_for(model)  # type: ignore
    if source.spec != spec:
        raise PBInputError(f"model= is {source.spec}, not the run's network {spec} (the import "
                           "path a run records); pass the network or factory it was trained "
                           "with")
    return source


def check_identity(folder: Path, task: dict, source: NetworkSource) -> None:
    """Refuse (one line) a network ``source`` that is not the run's: built with the run's seed
    and initialization, its :func:`pbscale.nets.network.network_id` (the import path, every
    parameter's and buffer's name, shape and dtype, and with ``init`` "model" their values)
    must be config.json's "network_id" (a built-in model, or a run written before the id was
    recorded: nothing to compare)."""
    recorded = task.get("network_id")
    if source.builtin or recorded is None:
        return
    seed, init = task.get("seed", 0), task.get("init", "kaiming_normal")
    if (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0
            or init not in NETWORK_INITS or not isinstance(recorded, str)
            or not re.fullmatch(r"[0-9a-f]{16}", recorded)):
        raise PBInputError(f"damaged run file {folder / 'config.json'} (its task's seed, init "
                           f"or network_id); {runio.DAMAGED_FIX}")
    net = source.build(seed, init)
    if network_id(net, source.spec, init) != recorded:
        shapes = {k: tuple(v.shape) for k, v in net.state_dict().items()}
        state = runio.load_checkpoint(folder / "pruned.pt") or {}
        stored = {k.removesuffix("_orig"): tuple(v.shape) for k, v in state.items()
                  if torch.is_tensor(v) and not k.endswith("_mask")}
        diff = next((f"{k}: {shapes.get(k)} here, {stored.get(k)} in the run"
                     for k in [*shapes, *stored] if shapes.get(k) != stored.get(k)), None)
        detail = (f" ({diff})" if diff else
                  " (its parameters' names, shapes and dtypes" +
                  (", or with --init model their values," if init == "model" else "") +
                  " differ from those config.json records)")
        raise PBInputError(f"{source.spec} now builds another network than the run's"
                           f"{detail}; export with the code the run was trained with")


def check_finite_state(state: dict[str, torch.Tensor], path: Path) -> None:
    """Refuse (one line) a saved network's state dict holding NaN or inf values."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise PBInputError(f"{path} holds NaN or inf values ({bad[0]}): the run diverged; "
                           f"export a run that finished with finite weights")


def is_channel_run(folder: str | Path) -> bool:
    """Whether the run folder holds ``structured.pt`` (a ``--granularity channel`` run: its
    pruned channels can be removed)."""
    return (Path(folder) / "structured.pt").is_file()


def read_structured(folder: Path, source: NetworkSource) -> nn.Module:
    """The smaller network of a channel run's ``structured.pt`` (read once, ``weights_only=True``,
    and rebuilt as :func:`pbscale.pruning.outputs.load_structured` does:
    :func:`pbscale.nets.channel_layout.rebuild`), refused in one line when the file is damaged,
    holds NaN or inf values or is not the run's network's."""
    path = folder / "structured.pt"
    saved = runio.load_checkpoint(path)
    state = saved.get("state_dict") if isinstance(saved, dict) else None
    if (not isinstance(state, dict) or not {"keep", "example", "leave_out"} <= set(saved)
            or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items())):
        raise PBInputError(f"damaged run file {path} (not a structured.pt); "
                           f"{runio.DAMAGED_FIX}")
    check_finite_state(state, path)
    try:
        return rebuild(source.build(0, "model"), saved)
    except (RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PBInputError(f"damaged run file {path} (not the run's network: {first[:120]}); "
                           f"{runio.DAMAGED_FIX}") from None


def plain_network(folder: str | Path, model: object = None, masked: bool = False
                  ) -> nn.Module:
    """The run's pruned network as plain modules, masks folded into the weights
    (``torch.nn.utils.prune.remove``), after its test-time transform (:class:`Standardized`);
    in eval mode. A channel run (:func:`is_channel_run`) gives its smaller network, the pruned
    channels removed (:func:`read_structured`), unless ``masked`` (the dense-shaped network
    with its channel masks folded in). ``model``: the user's network (:func:`network_source`),
    required for a run of one and checked against the run's identity
    (:func:`check_identity`)."""
    spec, data, task = read_recorded(folder)
    source = network_source(spec, model)
    check_identity(Path(folder), task, source)
    if is_channel_run(folder) and not masked:
        return Standardized(read_structured(Path(folder), source), data["mean"], data["std"],
                            data["input_shape"], data.get("input_dtype", "uint8")).eval()
    net = read_pruned(Path(folder), source)
    mods = dict(net.named_modules())
    for name in _masked(net):
        owner, _, param = name.rpartition(".")
        torch_prune.remove(mods[owner], param)
    return Standardized(net, data["mean"], data["std"], data["input_shape"],
                        data.get("input_dtype", "uint8")).eval()


def _masked(net: nn.Module) -> list[str]:
    """The parameters of ``net`` that carry a ``torch.nn.utils.prune`` mask."""
    return pruned_names({k: None for k in net.state_dict()})


def example_input(folder: str | Path, batch: int = 2) -> torch.Tensor:
    """Zeros of the run's input shape and dtype, for tracing."""
    _, data = read_run(folder)
    dtype = INPUT_DTYPES[data.get("input_dtype", "uint8")]
    return torch.zeros((batch, *data["input_shape"]), dtype=dtype)


def save_sparse(folder: str | Path, path: str | Path, masked: bool = False) -> None:
    """The sparse form of the run's network: {"format", "model", "mean", "std",
    "input_shape", "input_dtype", per masked parameter "bits.<name>" (uint8,
    ``numpy.packbits`` of the flat 0/1 mask), "shape.<name>" and "values.<name>" (the kept
    weights, float32, in flat order), "param.<name>" for every other parameter and buffer};
    read by :func:`load_sparse`. A channel run (unless ``masked``) writes its smaller network
    instead: {"format": :data:`STRUCTURED_FORMAT`, "model", the transform's entries as above,
    and structured.pt's "keep" (bool (d,)), "state_dict", "example" and "leave_out"}."""
    model, data = read_run(folder)
    blob: dict = {"format": SPARSE_FORMAT, "model": model, "mean": data["mean"],
                  "std": data["std"], "input_shape": data["input_shape"],
                  "input_dtype": data.get("input_dtype", "uint8")}
    if is_channel_run(folder) and not masked:
        saved = runio.load_checkpoint(Path(folder) / "structured.pt")
        blob.update({k: saved[k] for k in ("keep", "state_dict", "example", "leave_out")},
                    format=STRUCTURED_FORMAT)
        runio.write_output(path, runio.checkpoint_bytes(blob))
        return
    state = read_pruned_state(Path(folder))
    masked = set(pruned_names(state))
    for name in masked:
        value, mask = state[f"{name}_orig"], state[f"{name}_mask"].flatten() != 0
        blob[f"bits.{name}"] = torch.from_numpy(np.packbits(mask.numpy()))
        blob[f"shape.{name}"] = list(value.shape)
        blob[f"values.{name}"] = value.flatten()[mask].clone()
    for key, value in state.items():
        if key.removesuffix("_orig") not in masked and key.removesuffix("_mask") not in masked:
            blob[f"param.{key}"] = value
    runio.write_output(path, runio.checkpoint_bytes(blob))


def load_sparse(path: str | Path, model: object = None) -> nn.Module:
    """The network of a :func:`save_sparse` file (``weights_only=True``), dense again (a channel
    run's: its smaller network, :data:`STRUCTURED_FORMAT`), after its
    test-time transform (:class:`Standardized`); in eval mode. A file of a user's network
    names its import path; that code runs only when the caller passes ``model`` (the path, the
    factory or a network): a file never chooses code to run."""
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("format") not in (SPARSE_FORMAT,
                                                                 STRUCTURED_FORMAT):
        raise PBInputError(f"{path} is not a {SPARSE_FORMAT} file; write one with python -m "
                           "pbscale.export RUN --format sparse")
    spec = blob.get("model")
    if model is None and spec not in MODELS:
        raise PBInputError(f"{path} holds the network {spec!r}, your own code; pass it: "
                           f"load_sparse(path, model={spec!r}) (a file never chooses code to "
                           "run)")
    if blob["format"] == STRUCTURED_FORMAT:
        try:
            net = rebuild(network_source(str(spec), model).build(0, "model"), blob)
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
            first = str(exc).strip().splitlines()
            raise PBInputError(f"{path} does not hold the network model= builds ("
                               f"{first[-1].strip()[:120] if first else 'other parameters'}); "
                               "pass the network the file was exported from") from None
        return Standardized(net, blob["mean"], blob["std"], blob["input_shape"],
                            blob.get("input_dtype", "uint8")).eval()
    state = {k.removeprefix("param."): v for k, v in blob.items() if k.startswith("param.")}
    for key in (k for k in blob if k.startswith("bits.")):
        name = key.removeprefix("bits.")
        shape = blob[f"shape.{name}"]
        n = int(np.prod(shape))
        mask = torch.from_numpy(np.unpackbits(blob[key].numpy(), count=n).astype(bool))
        weight = torch.zeros(n, dtype=blob[f"values.{name}"].dtype)
        weight[mask] = blob[f"values.{name}"]
        state[name] = weight.reshape(shape)
    net = network_source(str(spec), model).build(0, "model")
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise PBInputError(f"{path} does not hold the network model= builds ("
                           f"{first[-1].strip()[:120] if first else 'other parameters'}); pass "
                           f"the network the file was exported from") from None
    return Standardized(net, blob["mean"], blob["std"], blob["input_shape"],
                        blob.get("input_dtype", "uint8")).eval()


def export(folder: str | Path | PruneResult, fmt: str, out: str | Path,
           model: object = None, masked: bool = False) -> Path:
    """Write the run's network to ``out`` in format ``fmt`` (:data:`FORMATS`); returns it.
    ``folder``: the run folder, or the :class:`pbscale.pruning.api.PruneResult` that
    ``prune_model`` returned (its folder, and its network where ``model`` is not given).
    ``model``: for a run of the user's own network, that network (its import path, factory or
    an ``nn.Module``: :func:`network_source`), which must be the run's; nothing the run folder
    names is imported or called. A channel run (``granularity="channel"``, with structured.pt)
    exports its smaller network, the pruned channels removed, unless ``masked`` (the
    dense-shaped network, channel masks folded into the weights). A folder of ``out`` that does
    not exist is created when the file is written, after every check."""
    if isinstance(folder, PruneResult):
        if model is None and not folder.source.builtin:
            model = folder.source
        folder = folder.folder
    out = Path(out)
    if fmt not in FORMATS:
        raise PBInputError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    runio.check_output_file(out)
    if fmt == "sparse":
        checked_network(folder, model, masked)
        save_sparse(folder, out, masked)
        return out
    net, x = checked_network(folder, model, masked)
    buf = io.BytesIO()
    if fmt == "pt2":
        batch = torch.export.Dim("batch", min=1)
        with torch.no_grad():
            program = torch.export.export(net, (x,), dynamic_shapes={"x": {0: batch}})
        torch.export.save(program, buf)
        runio.write_output(out, buf.getvalue())
        return out
    if fmt == "torchscript":
        with torch.no_grad():
            traced = torch.jit.trace(net, x)
        torch.jit.save(traced, buf)
        runio.write_output(out, buf.getvalue())
        return out
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise PBInputError('--format onnx needs onnx and onnxscript; install the extra: pip '
                           'install -e ".[export]"') from None
    batch = torch.export.Dim("batch", min=1)
    with onnx_notes_dropped():
        program = torch.onnx.export(net, (x,), input_names=["images"], output_names=["logits"],
                                    dynamic_shapes={"x": {0: batch}}, dynamo=True,
                                    verbose=False)
    runio.write_output(out, program.model_proto.SerializeToString())
    return out


# What torch's ONNX exporter says on every export that is no news to a user: its notes that
# torchvision (an optional package) is missing, so its detection ops (nms, roi_align, ...) are
# not registered, logged once per op; and the FutureWarning its own pytree code raises
# (``LeafSpec`` deprecated). Everything else it logs or warns still shows.
#: The logger of torch.onnx's notes on unregistered torchvision ops.
ONNX_NOTE_LOGGER = "torch.onnx._internal.exporter._registration"
#: How each of those notes starts.
ONNX_NOTE_START = "torchvision is not installed"
#: The message (a regular expression) of torch.onnx's own pytree FutureWarning.
ONNX_LEAFSPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


class _DropNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ONNX_NOTE_START)


@contextmanager
def onnx_notes_dropped() -> Iterator[None]:
    """Run torch's ONNX export without its torchvision notes (:data:`ONNX_NOTE_LOGGER`,
    :data:`ONNX_NOTE_START`) and its pytree FutureWarning (:data:`ONNX_LEAFSPEC_WARNING`),
    only those."""
    log, note = logging.getLogger(ONNX_NOTE_LOGGER), _DropNote()
    log.addFilter(note)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=ONNX_LEAFSPEC_WARNING,
                                    category=FutureWarning)
            yield
    finally:
        log.removeFilter(note)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m pbscale.export",
                       description="Export a finished pruning run's network (the run's raw "
                                   "inputs in, e.g. uint8 images; outputs, e.g. logits, out; "
                                   "masks folded in) as torch.export, TorchScript, ONNX or a "
                                   "compact sparse .pt (docs/export.md).")
    p.add_argument("run", help="run folder of python -m pbscale.prune (with pruned.pt)")
    p.add_argument("--format", default="pt2", choices=FORMATS,
                   help="pt2: torch.export (read back with torch.export.load(FILE).module()); "
                        "torchscript: torch.jit.trace (deprecated by torch); onnx; sparse: "
                        "masks as bits and the kept weights only")
    p.add_argument("--out", required=True, help="file to write (required; a folder of it that "
                   "does not exist is created)")
    p.add_argument("--model", type=model_argument, default=None,
                   help="a run of your own network: the package.module:factory it was trained "
                        "with (a run folder never chooses code to run; it must match the "
                        "run's recorded network)")
    p.add_argument("--masked-network", action="store_true",
                   help="a --granularity channel run: export the dense-shaped network with its "
                        "channel masks folded in (default: the smaller network, the pruned "
                        "channels removed, from structured.pt)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args_or_code(argv)
    if isinstance(args, int):
        return args

    def body() -> None:
        out = export(args.run, args.format, args.out, model=args.model,
                     masked=args.masked_network)
        print(f"wrote {out} ({args.format}, {out.stat().st_size:,} bytes)")

    return run_main(body)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["FORMATS", "INPUT_DTYPES", "MAX_INPUT", "SPARSE_FORMAT", "STRUCTURED_FORMAT",
           "Standardized", "build_parser", "check_finished", "check_identity", "check_transform",
           "checked_network", "example_input", "export", "is_channel_run", "load_sparse", "main",
           "model_hint", "network_source", "plain_network", "read_pruned", "read_pruned_state",
           "read_recorded", "read_run", "read_structured", "save_sparse"]
