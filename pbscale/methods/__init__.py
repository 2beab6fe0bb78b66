"""Every mask-optimization method of the paper, in torch, for any batched loss f(z), and the one
method registry (:mod:`pbscale.methods.registry`).

The loss is a batched function ``f(z)`` of masks z of shape (..., d) returning (...); for the
MC estimators it is only evaluated, for CP and the hybrid estimators it is differentiated
(soft masks in [0, 1]). Nothing here knows about ``nn.Module`` masking: :mod:`pbscale.forward.masks`
supplies f for a masked network, and the microworld (NNLoss) can supply its own.

Modules, by concern. The contract, which a method is written against:

* :mod:`~pbscale.methods.registry`: :class:`Family` (a method's identity, its
  :class:`Capabilities` and how its run's method is built), :class:`Settings` (a family's own
  settings) and :func:`setting`, :class:`MethodConfig`, :data:`REGISTRY`, :func:`register`,
  :func:`get_family`, :func:`names`;
* :mod:`~pbscale.methods.trainer`: :class:`LogitsFamily` (a method over mask logits: its
  gradient with explicit arguments, :class:`StepArgs`, returning a :class:`Gradient`) and
  :class:`MaskTrainer`, which holds a run's logits and calls it;
* :mod:`~pbscale.methods.cuts`: :class:`MaskFamily` (a method without logits: a binary mask cut
  on its :class:`CutSchedule`) and :class:`MagnitudeMethod`;
* :mod:`~pbscale.methods.estimate`: :class:`Estimate`, the surrogate loss and the dense
  regularizer; :mod:`~pbscale.methods.samplers`: the estimators' laws in torch, per-run
  samplers and the chunk size; :mod:`~pbscale.methods.schedules`: the kept fraction, the
  magnitude cut, GMP's schedule and the per-layer top-k, one definition each;
* :mod:`~pbscale.methods.options`: every family's own settings as command-line options, and
  the help texts that name methods;
* :mod:`~pbscale.methods.optimizers`: the mask logits' RMSprop and SGD on the CPU (torch.optim's
  numbers and ``state_dict``, without the import of torch._dynamo its first call makes).

The families (:data:`FAMILY_MODULES`, imported in that order, the registration order of
:data:`REGISTRY`, which every list of methods follows):

* :mod:`~pbscale.methods.mc`: the chunked MC estimators (`ch:monte_carlo`) and their surrogate
  loss; one registered family per estimator of `pbexact.estimators.REGISTRY` that needs no J
  table (:func:`register_estimator` for one defined elsewhere);
* :mod:`~pbscale.methods.cp`: CP (`sec:pb_application`) and its temperature schedule;
* :mod:`~pbscale.methods.hybrids`: ST, REBAR and RELAX (`ch:other`) and their controls;
* :mod:`~pbscale.methods.magnitude`: MP, GMP and dense training
  (`sec:app_joint_pruning_setup`);
* :mod:`~pbscale.methods.beyond`: ST-theta, hard-concrete L0 and edge-popup (outside the
  paper's comparison).

Every name of the contract is bound here before the family modules are imported, so a family
module in this package imports them as a plugin does (``from pbscale.methods import ...``);
a new method's module is one more name in :data:`FAMILY_MODULES` (docs/adding_a_method.md).
Methods defined outside pbscale register when their module is imported; the modules named in
``$PBSCALE_METHODS`` (comma-separated) are imported after pbscale's own, so that every tool,
and every child a sweep launches, has them.
"""

# ruff: noqa: E402 (the contract is imported first, then the family modules, in order)
from __future__ import annotations

import os
import sys
from importlib import import_module

from pbexact.estimators import REGISTRY as ESTIMATORS

#: The modules that define the registered families, in registration order.
FAMILY_MODULES = ("mc", "cp", "hybrids", "magnitude", "beyond")
#: The environment variable naming modules outside pbscale that define methods.
PLUGINS_ENV = "PBSCALE_METHODS"


from .cuts import CutSchedule, MagnitudeMethod, MaskFamily
from .estimate import Estimate, dense_regularizer, sample_mean, surrogate_loss
from .registry import (
    COMMANDS,
    OPTIMIZERS,
    REGISTRY,
    Capabilities,
    Family,
    MethodConfig,
    NoSettings,
    Plan,
    Pruning,
    Settings,
    get_family,
    names,
    own_families,
    register,
    setting,
)
from .samplers import (
    SAMPLERS,
    AntitheticSampler,
    BernoulliSampler,
    CopulaSampler,
    FixedSampler,
    PerRunSampler,
    auto_chunk,
    standard_gamma,
    uniform_bits24,
)
from .trainer import Gradient, LogitsFamily, MaskTrainer, MicroworldHooks, StepArgs

# the families, in registration order (FAMILY_MODULES), each importing the names above;
# their colours are checked by the tests, not with matplotlib at start-up (own_families)
with own_families():
    from .mc import MCFamily, mc_gradient, mc_surrogate, register_estimator  # isort: skip
    from .cp import (  # isort: skip
        CPFamily,
        CPSettings,
        CPStep,
        cp_hard_mask,
        cp_relaxed_loss,
        cp_step,
        cp_temperature,
    )
    from .hybrids import (  # isort: skip
        RELAX_HIDDEN,
        RELAX_LR,
        RELAX_WEIGHT_DECAY,
        HybridControl,
        HybridFamily,
        PerSeedControl,
        PerSeedMLP,
        make_control,
        rebar_relax,
        rebar_relax_step,
        straight_through,
    )
    from .magnitude import MagnitudeFamily  # isort: skip

    for _module in FAMILY_MODULES:  # beyond, and any module added to the tuple, in its order
        import_module(f".{_module}", __name__)


def load_plugins(value: str) -> None:
    """Import the modules ``value`` names (comma-separated; ``$PBSCALE_METHODS``). One that
    fails (it cannot be found, or its family breaks the contract: e.g. a family written for
    an older pbnn, which is told what to change) is one line: under a command of this project
    (``python -m pbscale.prune`` ...) ``error: ...`` on stderr and exit code 2, else an
    :class:`ImportError` with that line."""
    for module in filter(None, (m.strip() for m in value.split(","))):
        try:
            import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module is one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            message = (f"${PLUGINS_ENV} names {module!r}, which cannot be imported: {first}; "
                       f"fix the module, {PLUGINS_ENV} or PYTHONPATH")
            spec = getattr(sys.modules.get("__main__"), "__spec__", None)
            if spec is not None and spec.name.partition(".")[0] in ("pbscale", "analysis",
                                                                    "benchmarks"):
                print(f"error: {message}", file=sys.stderr)
                raise SystemExit(2) from None
            raise ImportError(message) from None


# the methods of modules outside pbscale, once every name above exists
load_plugins(os.environ.get(PLUGINS_ENV, ""))

#: The methods :class:`MaskTrainer` trains (``pbscale.regress --method``).
METHODS = names("regress")
#: The MC estimators: every estimator of `pbexact.estimators.REGISTRY` without a J table (each
#: one :class:`MCFamily`), in that registry's order.
MC_METHODS = tuple(n for n, s in ESTIMATORS.items() if not s.needs_table)
#: The hybrid estimators of `ch:other`.
HYBRID_METHODS = tuple(n for n in METHODS if isinstance(REGISTRY[n], HybridFamily))

__all__ = [
    "AntitheticSampler", "BernoulliSampler", "COMMANDS", "CPFamily", "CPSettings", "CPStep",
    "Capabilities", "CopulaSampler", "CutSchedule", "Estimate", "Family", "FixedSampler",
    "Gradient", "HYBRID_METHODS", "HybridControl", "HybridFamily", "LogitsFamily", "MCFamily",
    "MC_METHODS", "METHODS", "MagnitudeFamily", "MagnitudeMethod", "MaskFamily", "MaskTrainer",
    "MethodConfig", "MicroworldHooks", "NoSettings", "OPTIMIZERS", "PerRunSampler",
    "PerSeedControl", "PerSeedMLP",
    "Plan", "Pruning", "REGISTRY", "RELAX_HIDDEN", "RELAX_LR", "RELAX_WEIGHT_DECAY", "SAMPLERS",
    "Settings",
    "StepArgs", "auto_chunk", "cp_hard_mask", "cp_relaxed_loss", "cp_step", "cp_temperature",
    "dense_regularizer", "get_family", "load_plugins", "make_control", "mc_gradient",
    "mc_surrogate", "names", "rebar_relax", "rebar_relax_step", "register", "register_estimator",
    "sample_mean", "setting", "standard_gamma", "straight_through", "surrogate_loss",
    "uniform_bits24",
]
