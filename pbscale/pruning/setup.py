"""What a pruning run is built from, checked against each other before anything trains: its data
(MNIST or CIFAR-10 from ``--data-dir``, random images for tests, or the user's arrays:
:mod:`pbscale.nets.user_data`) and its network (:mod:`pbscale.nets.network`), with the loss
(:mod:`pbscale.nets.objectives`) the targets call for.

A user's network or data is probed once: the network built with the run's seed, its masked
parameters chosen, and two masks run on two training examples. A network that fails on the
data's inputs, a layer the masks cannot pass through, outputs that do not fit the targets
(classes: (B, C) logits with C above every label; float targets: the targets' shape) or a loss
of the wrong shape is one line naming it and the fix, before any run folder is written.
"""

from __future__ import annotations

import fnmatch

import torch

from pbexact.errors import PBInputError
from pbscale.forward.masks import MaskedModule
from pbscale.nets import data as datamod
from pbscale.nets import user_data
from pbscale.nets.channel_layout import ChannelLayout
from pbscale.nets.channel_types import ChannelGroups
from pbscale.nets.channels import channel_groups
from pbscale.nets.network import NetworkSource, masked_names, source_for
from pbscale.nets.objectives import Objective, objective_for
from pbscale.pruning.config import PruneConfig


def patterns(cfg: PruneConfig) -> list[str]:
    """The ``--masked`` patterns of ``cfg`` (comma-separated), [] for the paper's rule."""
    return [p.strip() for p in cfg.masked.split(",") if p.strip()]


def leave_out(model: torch.nn.Module, pats: list[str]) -> tuple[str, ...]:
    """Channel granularity: the layers ``--masked`` leaves out, each layer with parameters of
    its own none of which a pattern (``fnmatch`` of parameter names; each must match one)
    matches; () without patterns (every layer may change)."""
    if not pats:
        return ()
    params = [k for k, _ in model.named_parameters()]
    for pat in pats:
        if not any(fnmatch.fnmatchcase(k, pat) for k in params):
            shown = ", ".join(params[:8]) + (", ..." if len(params) > 8 else "")
            raise PBInputError(f"--masked pattern {pat!r} matches no parameter; the network's "
                               f"parameters are {shown}")
    out = []
    for name, m in model.named_modules():
        own = [f"{name}.{k}" if name else k for k, _ in m.named_parameters(recurse=False)]
        if own and not any(fnmatch.fnmatchcase(k, p) for k in own for p in pats):
            out.append(name)
    return tuple(out)


def channel_groups_of(model: torch.nn.Module, cfg: PruneConfig, data: datamod.Data,
                      device: torch.device) -> ChannelGroups:
    """The channel variables of a run of ``cfg`` (``--granularity channel``): ``model``'s
    coupled groups traced on one training example (MACs per example), the layers ``--masked``
    leaves out (:func:`leave_out`) not pruned; a network or layer Torch-Pruning cannot handle
    is one line naming it and the fix (--masked without it)."""
    x = data.prepare(data.train.x[:1].to(device))
    was = model.training
    saved = {k: b.clone() for k, b in model.named_buffers()}  # the trace runs the network
    try:
        return channel_groups(model, x, leave_out=leave_out(model, patterns(cfg)))
    finally:
        model.train(was)
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(saved[k])


def load_data(cfg: PruneConfig, device: torch.device, download: bool = False,
              download_url: str | None = None) -> datamod.Data:
    """The data of a validated, resolved ``cfg`` on ``device``: random images
    (``--synthetic``), the user's ``--data`` file, or the built-in data set from
    ``--data-dir`` (fetched first with ``download``)."""
    if cfg.synthetic:
        return datamod.synthetic(cfg.dataset, n_train=cfg.synthetic, n_test=cfg.synthetic // 2,
                                 seed=cfg.split_seed, device=device,
                                 val_size=min(cfg.val_size, cfg.synthetic // 2))
    if cfg.data:
        return user_data.arrays_data(user_data.read_npz(cfg.data), device, cfg.val_size,
                                     cfg.split_seed)
    if not cfg.data_dir:
        raise PBInputError("--data-dir is required (e.g. ../shared/data/mnist); add --download "
                           "to fetch the data there, or give your own arrays with --data "
                           "FILE.npz")
    if download:
        datamod.download(cfg.dataset, cfg.data_dir, url=download_url)
    datamod.check_data(cfg.dataset, cfg.data_dir)
    return datamod.load(cfg.dataset, cfg.data_dir, device, cfg.val_size, cfg.split_seed)


def objective(cfg: PruneConfig, data: datamod.Data) -> Objective:
    """The loss of a run of ``cfg`` on ``data`` (:func:`pbscale.nets.objectives.objective_for`)."""
    return objective_for(cfg.loss, data.classes)


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def wants_ids(net: torch.nn.Module, error: Exception) -> bool:
    """Whether a network that failed on float inputs wanted integer ids: it holds an embedding,
    or the error names indices."""
    embeds = any(isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
                 for m in net.modules())
    return embeds or "indices" in str(error)


def fit(cfg: PruneConfig, data: datamod.Data, device: torch.device,
        source: NetworkSource | None = None) -> None:
    """The probe of the module docstring (nothing to probe for a built-in model on its own data
    with the built-in loss and masks); ``source``: the network when it is an object, else
    ``cfg.model``'s."""
    source = source or source_for(cfg.model)
    if (source.builtin and cfg.dataset in datamod.DATASETS and not cfg.masked
            and not cfg.loss):
        return
    obj = objective(cfg, data)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        net = source.build(cfg.seed, cfg.init)
        channel = cfg.granularity == "channel"
        names = [] if channel else masked_names(net, cfg.mask_head, cfg.mask_shortcuts,
                                                 patterns(cfg))
        net = net.to(device)
        try:
            layout = (ChannelLayout(net, channel_groups_of(net, cfg, data, device)) if channel
                      else MaskedModule(net, names))
        except PBInputError as e:
            raise PBInputError(f"--model {cfg.model}: {e}") from None
        x, y = data.prepare(data.train.x[:2]), data.train.y[:2]
        z = torch.ones(2, layout.d, device=device, dtype=layout.dtype)
        net.train()
        try:
            with torch.no_grad():
                out = layout.forward(z, x)
        except Exception as e:  # the user's network: whatever its forward raises
            if data.inputs == "image" and wants_ids(net, e):
                raise PBInputError(
                    f"--model {cfg.model} fails on uint8 inputs ({_first_line(e)}): uint8 "
                    "inputs are taken for images and standardized to floats, and the network "
                    "wants integer ids (an nn.Embedding); store the ids as int64 "
                    "(x.astype(numpy.int64)), which go in as they are") from None
            raise PBInputError(
                f"--model {cfg.model} fails on the data's inputs ({data.inputs}, "
                f"{list(x.shape[1:])} per example) under masks ({_first_line(e)}); make its "
                "forward take (B, *shape) inputs, or leave a layer the masks cannot pass "
                "through out of --masked") from None
    _check_outputs(cfg, data, obj, out, y)


def _check_outputs(cfg: PruneConfig, data: datamod.Data, obj: Objective, out: torch.Tensor,
                   y: torch.Tensor) -> None:
    """One line where the network's outputs (k, B, ...) do not fit the targets or the loss."""
    got = list(out.shape[2:])
    if data.classes and obj.accuracy:
        top = max(int(s.y.max()) for s in (data.train, data.val, data.test) if len(s))
        if out.dim() != 3 or out.shape[2] <= top:
            raise PBInputError(
                f"--model {cfg.model} returns outputs of shape {got} per example, and the labels "
                f"go up to {top}; a classifier returns {top + 1} or more logits per example "
                "(B, C)")
    elif not data.classes and got != list(y.shape[1:]):
        labels = data.train.y
        if labels.dim() == 1 and len(got) == 1 and got[0] > 1 and bool(
                (labels == labels.round()).all()):
            raise PBInputError(
                f"--model {cfg.model} returns {got[0]} logits per example (a classifier) and "
                f"the targets are floats (whole numbers {int(labels.min())} to "
                f"{int(labels.max())}), which are regressed; a classifier takes integer class "
                "labels: store y as int64 (y.astype(numpy.int64)), or, to regress them, give "
                "--loss mse and y with the outputs' shape")
        raise PBInputError(f"--model {cfg.model} returns {got} per example and the float "
                           f"targets are {list(y.shape[1:])}; store y with the outputs' shape "
                           "(e.g. (N, 1) for one output)")
    try:
        loss = obj.per_mask(out, y)
    except Exception as e:  # the user's loss function
        raise PBInputError(f"--loss {obj.name} fails on outputs {list(out.shape)} and targets "
                           f"{list(y.shape)} ({_first_line(e)}); it maps (k, B, ...) outputs "
                           "and (B, ...) targets to (k,) losses") from None
    if not isinstance(loss, torch.Tensor) or tuple(loss.shape) != (out.shape[0],):
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise PBInputError(f"--loss {obj.name} returned {shape} for {out.shape[0]} masks; it "
                           "returns one loss per mask, shape (k,)")


__all__ = ["channel_groups_of", "fit", "leave_out", "load_data", "objective", "patterns",
           "wants_ids"]
