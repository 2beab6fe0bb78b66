"""What a finished pruning run leaves besides its metrics: ``masks.pt`` and ``pruned.pt``
(:func:`export`, written after the last epoch by :class:`Export`, a
:class:`pbscale.runs.contracts.RunHooks`), and :func:`load_pruned`, which reads ``pruned.pt`` back
with plain PyTorch; with channel granularity also ``groups.json`` and ``structured.pt``, the
network with its pruned channels removed (:func:`export_structured`, :func:`load_structured`)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from pbexact.errors import PBInputError
from pbscale.nets.channel_layout import (
    rebuild,
    structured_blob,
    structured_network,
    structured_report,
)
from pbscale.nets.channels import groups_record
from pbscale.nets.network import NetworkSource, source_for
from pbscale.pruning.evaluation import MaskEvaluation
from pbscale.runs import io as runio
from pbscale.runs.contracts import RunHooks


def export(folder: Path, evaluation: MaskEvaluation, rescale: bool) -> dict:
    """``masks.pt``: {"mask.<param>": 0/1 mask, "weight.<name>": every parameter and buffer as
    trained} plus, for a method that rescales its weights (``rescale``: MC), "scale.<param>":
    the dynamic-rescaling factor (0-dim), and for a gate method "gate.<param>": its gate values;
    ``pruned.pt``: the network's state dict in ``torch.nn.utils.prune`` form
    (``<layer>.weight_orig`` = the weight the forward uses, rescaling and gates folded in;
    ``<layer>.weight_mask``), for :func:`load_pruned`. The mask is the evaluation's.

    Channel granularity (the evaluation's layout has ``groups``) also writes
    :func:`export_structured`'s files and returns its numbers (summary.json's entries); weight
    granularity returns {}."""
    z, layout, model = evaluation.mask, evaluation.layout, evaluation.model
    values = {k: m[0].detach().cpu() for k, m in layout.split(z[None]).items()}
    # a gate method's mask holds gate values: 0/1 by its zeros, the values folded into
    # the weights (weight_orig) and kept as "gate.<param>"
    masks = {k: (v != 0).to(v.dtype) for k, v in values.items()}
    used = {k: v.cpu() for k, v in evaluation.eval_params(z).items() if k in masks}
    blob = {f"mask.{k}": v for k, v in masks.items()}
    blob.update({f"gate.{k}": v for k, v in values.items() if not torch.equal(v, masks[k])})
    for k, m in masks.items():
        mean = float(m.mean())
        if rescale:
            blob[f"scale.{k}"] = torch.tensor(1.0 / mean if mean > 0 else 1.0)
    blob.update({f"weight.{k}": v.detach().cpu() for k, v in model.state_dict().items()})
    runio.save_checkpoint(folder / "masks.pt", blob)
    net = copy.deepcopy(model).cpu()
    mods = dict(net.named_modules())
    with torch.no_grad():
        for k, m in masks.items():
            owner, _, name = k.rpartition(".")
            getattr(mods[owner], name).copy_(used[k])
            torch_prune.custom_from_mask(mods[owner], name, m)
    runio.save_checkpoint(folder / "pruned.pt", net.state_dict())
    if getattr(layout, "groups", None) is None:
        return {}
    return export_structured(folder, evaluation)


def export_structured(folder: Path, evaluation: MaskEvaluation) -> dict:
    """Channel granularity: ``groups.json`` (:func:`pbscale.nets.channels.groups_record`, the
    variables, their members and costs) and ``structured.pt`` = {"keep": bool (d,),
    "state_dict": the state dict of the network with the pruned channels removed}, readable with
    ``torch.load(weights_only=True)`` (:func:`load_structured` rebuilds the network); returns
    the dense and pruned networks' parameters, MACs per example and CPU latency at batch 1 and
    128 (:func:`pbscale.nets.channel_layout.structured_report`), the channels kept and the
    coupled groups kept at one zeroed channel (every variable off: removal needs one)."""
    layout, model, z = evaluation.layout, evaluation.model, evaluation.mask
    groups = layout.groups
    runio.write_json(folder / "groups.json", groups_record(groups))
    pruned, keep, held = structured_network(model, groups, z, evaluation.eval_params(z))
    data = evaluation.data
    example = data.prepare(data.train.x[:1])
    runio.save_checkpoint(folder / "structured.pt", structured_blob(pruned, groups, keep,
                                                                    example))
    dense = copy.deepcopy(model).cpu()
    out: dict = structured_report(dense, pruned, example)
    out.update({"channels": groups.d, "channels_kept": int((z != 0).sum()),
                "zeroed_groups": held})
    return out


def load_structured(model: str | NetworkSource | nn.Module, path: str | Path) -> nn.Module:
    """The physically pruned network of ``structured.pt`` (``torch.load(weights_only=True)``):
    the run's network (a model name, import path, :class:`pbscale.nets.network.NetworkSource`
    or the dense module itself; its weights are replaced) rebuilt by
    :func:`pbscale.nets.channel_layout.rebuild`, its channels removed and the saved state
    loaded; on the CPU, in eval mode."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(model, nn.Module):
        source = model if isinstance(model, NetworkSource) else source_for(model)
        model = source.build(0, "model")
    return rebuild(copy.deepcopy(model), saved)


class Export(RunHooks):
    """Writes :func:`export` into ``folder`` once the last epoch is done."""

    def __init__(self, folder: Path, evaluation: MaskEvaluation, rescale: bool) -> None:
        self.folder, self.evaluation, self.rescale = folder, evaluation, rescale
        self.extra: dict = {}

    def after_epoch(self, history: list[dict], final: bool) -> None:
        if final:
            self.extra = export(self.folder, self.evaluation, self.rescale)

    def summary_extra(self) -> dict:
        """:func:`export`'s numbers (channel granularity), for summary.json."""
        return dict(self.extra)


def pruned_names(state: dict) -> list[str]:
    """The masked parameters of a ``pruned.pt`` state dict: each name ``p`` stored as
    ``p_orig`` and ``p_mask`` (``torch.nn.utils.prune`` form) and not as ``p`` itself."""
    return [k.removesuffix("_mask") for k in state
            if k.endswith("_mask") and k.removesuffix("_mask") + "_orig" in state
            and k.removesuffix("_mask") not in state]


def check_masks(state: dict, path: str | Path) -> None:
    """Refuse (one-line :class:`PBInputError` naming the file) a ``pruned.pt`` state dict whose
    masks (``<p>_mask`` of :func:`pruned_names`) hold anything but 0 and 1: ``prune`` multiplies
    the weights by the mask, so an edited mask (``mask * 3 - 7``) would scale the weights it
    keeps instead of keeping or pruning them."""
    for name in pruned_names(state):
        mask = state[f"{name}_mask"]
        if not torch.is_tensor(mask):
            continue
        wrong = (mask != 0) & (mask != 1)
        if bool(wrong.any()):
            value = mask[wrong].flatten()[0].item()
            raise PBInputError(f"damaged run file {path} ({name}_mask holds {value:g}, not only "
                               f"0 and 1: the file was edited); {runio.DAMAGED_FIX}")


def load_pruned(model: str | NetworkSource, path: str | Path) -> nn.Module:
    """The run's network (a name of :data:`pbscale.nets.models.MODELS`, the user's import path
    ``module:factory``, or a :class:`pbscale.nets.network.NetworkSource`) with the pruned weights of
    ``pruned.pt``, by plain PyTorch: ``prune.identity`` on the masked parameters, then
    ``load_state_dict`` of ``torch.load(path, weights_only=True)``; in eval mode. A mask that is
    not 0/1 is refused (:func:`check_masks`)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict):
        check_masks(state, path)
    source = model if isinstance(model, NetworkSource) else source_for(model)
    net = source.build(0, "model")  # every weight comes from the file
    mods = dict(net.named_modules())
    for name in pruned_names(state):
        owner, _, param = name.rpartition(".")
        torch_prune.identity(mods[owner], param)
    net.load_state_dict(state)
    return net.eval()
