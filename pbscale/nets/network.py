"""A pruning run's network: a model of :mod:`pbscale.nets.models` by name, or the user's own torch
model, named by an import path ``package.module:factory`` (``--model``) or given as an object
(:func:`pbscale.pruning.api.prune_model`); which of its weights are masked; and what of it goes
into the run's identity.

* :class:`NetworkSource`: how a run builds its network, fresh for every run (a pruning group
  builds one per member): the factory called under a generator seeded with the run's seed,
  then the weights initialized with that seed (``init``: the paper's Kaiming normal, signed
  constant) or kept as the factory made them (``init="model"``, e.g. trained weights).
* :func:`masked_names`: the paper's rule (every Linear and convolution weight but the
  classifier, the last Linear; a model of :mod:`pbscale.nets.models` applies its own rule, which is
  the same rule plus ResNet's 1x1 shortcuts), or the parameters that ``--masked`` patterns
  (``fnmatch``, comma-separated) name. A parameter of fewer than 2 dimensions (a bias, a
  normalization scale) is not masked, nor one the network uses in two places (a reused layer
  or tied weights: the paper's rule leaves it out, :class:`pbscale.forward.masks.MaskedModule`
  refuses it); a pattern that names one is refused in one line.
* :func:`network_id`: the import path, every parameter's and buffer's name, shape and dtype,
  and for ``init="model"`` their values too (the weights are then the user's), hashed: a run
  folder of a changed model is another folder (its config.json's "task" records it).
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import hashlib
import importlib
import importlib.machinery
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale.forward.masks import tied_names
from pbscale.nets.models import INITS, MODELS, PrunableNet, init_weights

#: Weight initializations a run takes: those of :data:`pbscale.nets.models.INITS`, and "model": the
#: weights as the network's factory made them (drawn under the run's seed).
NETWORK_INITS = (*INITS, "model")
#: The import-path form of ``--model``: dotted module, colon, dotted attribute (a Python
#: object's record may hold ``<locals>``: see :func:`importable`).
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_<][\w.<>]*$")


def is_import_path(spec: str) -> bool:
    """Whether ``spec`` names the user's own model (``package.module:factory``)."""
    return ":" in spec


def check_spec(spec: str) -> str:
    """``spec`` if it is a model of :data:`pbscale.nets.models.MODELS` or an import path, else a
    one-line :class:`PBInputError` naming both forms."""
    if spec in MODELS or IMPORT_PATH.match(spec):
        return spec
    raise PBInputError(f"unknown model {spec!r}; choose one of {', '.join(MODELS)}, or name "
                       "your own as package.module:factory (a function or class that returns "
                       "an nn.Module; docs/own_network.md)")


def argument(text: str) -> str:
    """argparse type of ``--model``: a built-in model or an import path (:func:`check_spec`'s
    one-line message as argparse's error)."""
    try:
        return check_spec(text)
    except PBInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def import_factory(spec: str) -> Callable[[], nn.Module]:
    """The object ``package.module:factory`` names (imported with the current folder on the
    path, as ``python -m`` puts it), or a one-line :class:`PBInputError`: a module that does
    not import, an attribute it lacks, an object that cannot be called."""
    check_spec(spec)
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:  # the user's module: any error it raises on import
        raise PBInputError(f"--model {spec}: cannot import {module_name} ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}); run from the folder "
                           "that holds it or add that folder to PYTHONPATH") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PBInputError(f"--model {spec}: {module_name} has no {attr!r}; name a function "
                               "or class defined there")
        obj = getattr(obj, part)
    if not callable(obj):
        raise PBInputError(f"--model {spec}: {attr} is a {type(obj).__name__}, not a function "
                           "or class; name one that returns an nn.Module")
    return obj


def _call(make: Callable[[], nn.Module], spec: str) -> nn.Module:
    try:
        net = make()
    except Exception as e:  # the user's factory: any error it raises
        raise PBInputError(f"--model {spec}: calling it failed ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}); it must build the "
                           "network with no arguments") from None
    if not isinstance(net, nn.Module):
        raise PBInputError(f"--model {spec}: it returned a {type(net).__name__}, not an "
                           "nn.Module; return the network")
    return net


@dataclass(frozen=True)
class NetworkSource:
    """How a run builds its network. ``spec``: what config.json records (a name of
    :data:`pbscale.nets.models.MODELS` or ``module:factory``); ``make``: a fresh network with the
    factory's own initialization, on the CPU."""

    spec: str
    make: Callable[[], nn.Module]

    @property
    def builtin(self) -> bool:
        return self.spec in MODELS

    def build(self, seed: int, init: str = "kaiming_normal") -> nn.Module:
        """The network of a run with ``seed``: the factory called with torch's global generator
        seeded by ``seed`` (restored afterwards), then, unless ``init`` is "model", every Linear,
        convolution, embedding and normalization layer initialized by ``init`` from a generator
        seeded by ``seed`` (:func:`pbscale.nets.models.init_weights`; the built-in models as
        :func:`pbscale.nets.models.build_model` builds them)."""
        if init not in NETWORK_INITS:
            raise PBInputError(f"unknown init {init!r}; choose one of {', '.join(NETWORK_INITS)}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = _call(self.make, self.spec)
        if init != "model":
            init_weights(net, init, torch.Generator().manual_seed(seed))
        return net


def source_for(model: str | Callable[[], nn.Module] | nn.Module) -> NetworkSource:
    """The :class:`NetworkSource` of a ``--model`` value (a built-in name or an import path), a
    factory (function or class) or a network (each run gets a deep copy). An object's spec is
    its import path where Python can import it again (``pbscale.export`` needs that), else its
    module and qualified name all the same (the run trains; export then asks for the object)."""
    if isinstance(model, str):
        check_spec(model)
        if model in MODELS:
            return NetworkSource(model, MODELS[model])
        return NetworkSource(model, import_factory(model))
    if isinstance(model, nn.Module):
        template = copy.deepcopy(model).cpu()
        cls = type(model)
        return NetworkSource(f"{cls.__module__}:{cls.__qualname__}",
                             lambda: copy.deepcopy(template))
    if callable(model):
        name = getattr(model, "__qualname__", type(model).__qualname__)
        return NetworkSource(f"{getattr(model, '__module__', '__main__')}:{name}", model)
    raise PBInputError(f"model must be an nn.Module, a function or class returning one, or an "
                       f"import path 'package.module:factory'; got a {type(model).__name__}")


def importable(spec: str) -> bool:
    """Whether ``spec`` can be imported again by another process (not ``__main__``, not a
    function defined inside another)."""
    return spec in MODELS or (IMPORT_PATH.match(spec) is not None and "<" not in spec
                              and not spec.startswith("__main__:"))


def short_name(spec: str) -> str:
    """A folder-name prefix for the network ``spec``: the built-in name, or the factory's last
    name part (letters, digits, ``_`` and ``-`` only)."""
    base = spec.rpartition(":")[2].rpartition(".")[2] if is_import_path(spec) else spec
    return re.sub(r"[^A-Za-z0-9_-]", "_", base)[:40] or "model"


# ------------------------------------------------------------------ which weights are masked


def _paper_rule(model: nn.Module, mask_head: bool) -> list[str]:
    """Every Linear and convolution weight, the classifier (the last Linear) only with
    ``mask_head``, tied weights left out."""
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]
    heads = [name for name, m in layers if isinstance(m, nn.Linear)]
    head = heads[-1] if heads else None
    tied = tied_names(model)
    if mask_head and head is not None and f"{head}.weight" in tied:
        raise PBInputError(f"--mask-head: the classifier's weight {head}.weight is tied to "
                           f"{tied[f'{head}.weight']} (one parameter the network uses in two "
                           "places), which stays dense: a mask would not reach both uses, so "
                           "--mask-head would change nothing; leave it out, or give the "
                           "classifier its own weight to mask it")
    return [f"{name}.weight" for name, m in layers
            if (mask_head or name != head) and f"{name}.weight" not in tied
            and isinstance(m.weight, nn.Parameter)]


def masked_names(model: nn.Module, mask_head: bool = False, mask_shortcuts: bool = False,
                 patterns: Sequence[str] = ()) -> list[str]:
    """The names of the masked parameters, in ``named_parameters`` order: the weights (2 or more
    dimensions) the patterns match (``fnmatch``; each must match at least one), else the
    model's own rule (a :class:`pbscale.nets.models.PrunableNet`) or the paper's
    (:func:`_paper_rule`)."""
    if not patterns:
        if isinstance(model, PrunableNet):
            return model.masked_names(mask_head, mask_shortcuts)
        names = _paper_rule(model, mask_head)
        if not names:
            raise PBInputError("the network has no Linear or convolution weight to mask (the "
                               "last Linear is the classifier: --mask-head masks it); name the "
                               "parameters to mask with --masked")
        return names
    params = dict(model.named_parameters())
    tied = tied_names(model)
    chosen = set()
    for pat in patterns:
        hits = [k for k in params if fnmatch.fnmatchcase(k, pat)]
        aliases = [k for k in tied if k not in params and fnmatch.fnmatchcase(k, pat)]
        if not hits and aliases:  # a second name of a tied parameter (named_parameters skips it)
            k = aliases[0]
            first = tied[k]  # the name named_parameters keeps
            raise PBInputError(f"--masked pattern {pat!r} names {k}, which is tied to {first} "
                               f"(one parameter the network uses in two places; "
                               f"named_parameters lists it as {first}), and a tied weight stays "
                               "dense: a mask would not reach both uses; leave it out of "
                               "--masked, or give that place its own weight to mask it")
        if not hits:
            shown = ", ".join(list(params)[:8]) + (", ..." if len(params) > 8 else "")
            raise PBInputError(f"--masked pattern {pat!r} matches no parameter; the network's "
                               f"parameters are {shown}")
        weights = [k for k in hits if params[k].dim() >= 2 and params[k].is_floating_point()]
        if not weights:
            k = hits[0]
            raise PBInputError(f"cannot mask {k}: a {params[k].dim()}-d parameter (a bias or a "
                               "normalization scale) is not a connection weight; name weights "
                               "of 2 or more dimensions in --masked")
        chosen.update(weights)
    return [k for k in params if k in chosen]


# ------------------------------------------------------------------ identity


def network_id(model: nn.Module, spec: str, init: str) -> str:
    """16 hex digits of the SHA-256 over ``spec`` and every parameter's and buffer's name,
    shape and dtype, with their values when ``init`` is "model" (the factory's weights are
    the run's). Built-in weights drawn by :func:`pbscale.nets.models.init_weights` from the run's
    seed are named by the seed, not by their values."""
    h = hashlib.sha256(spec.encode())
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, t in tensors:
        h.update(f"|{name}:{tuple(t.shape)}:{t.dtype}".encode())
        if init == "model":
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def source_file(spec: str) -> str | None:
    """The file of the module an import path ``package.module:factory`` names, found as
    ``python -m`` finds it (the current folder first, then ``sys.path``) but without importing
    anything (no package's ``__init__`` runs), or None: a built-in model, ``__main__``, a
    module that is not a source file on the path. An imported module's own ``__file__`` where
    it is loaded already."""
    if not is_import_path(spec):
        return None
    module = spec.partition(":")[0]
    loaded = sys.modules.get(module)
    if loaded is not None:
        file = getattr(loaded, "__file__", None)
        return file if isinstance(file, str) and file.endswith(".py") else None
    if module == "__main__":
        return None
    path: list[str] | None = [os.getcwd(), *sys.path]
    found = None
    for part in module.split("."):
        try:
            found = importlib.machinery.PathFinder.find_spec(part, path)
        except (ImportError, ValueError, OSError):
            return None
        if found is None:
            return None
        path = list(found.submodule_search_locations or [])
    origin = getattr(found, "origin", None)
    return origin if isinstance(origin, str) and origin.endswith(".py") else None


def source_digest(spec: str) -> str | None:
    """16 hex digits of the SHA-256 of the source file of the module ``spec`` names
    (:func:`source_file`), or None where there is none: what a run of the user's network records
    (config.json's "info" ``network_source``), so that a sweep can tell that the file changed
    since without importing it."""
    file = source_file(spec)
    if file is None:
        return None
    try:
        with open(file, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError:
        return None


def layer_counts(model: nn.Module, names: Sequence[str]) -> dict[str, int]:
    """{name: number of weights} of the masked parameters ``names``."""
    params = dict(model.named_parameters())
    return {k: params[k].numel() for k in names}


__all__ = ["IMPORT_PATH", "NETWORK_INITS", "NetworkSource", "argument", "check_spec",
           "import_factory", "importable", "is_import_path", "layer_counts", "masked_names",
           "network_id", "short_name", "source_digest", "source_file", "source_for"]
