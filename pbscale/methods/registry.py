"""The method registry: every mask-optimization method of pbscale as one :class:`Family` object,
by name, in :data:`REGISTRY`, and :class:`MethodConfig`, the settings of one method's run.

A family says what a method is (name, legend label, colour, the tools it runs in, whether it
samples, which shared settings it reads), owns the settings no other method has (a frozen
:class:`Settings` dataclass, e.g. CP's final temperature) and builds the run loop's
:class:`pbscale.loop_types.Method` with :meth:`Family.make`, fully: nothing outside the family
writes into what it returns (in the spirit of ``torch.nn.utils.prune.BasePruningMethod``, whose
subclasses own their arguments and one hook). The families are registered where they are
defined:

* :class:`pbscale.methods.mc.MCFamily`: one per MC estimator of `pbexact.estimators.REGISTRY`
  that needs no J table, derived from the estimator's spec;
* :class:`pbscale.methods.cp.CPFamily` (CP);
* :mod:`pbscale.methods.hybrids`: ST, REBAR and RELAX;
* :mod:`pbscale.methods.magnitude`: MP, GMP and dense training (no mask logits);
* :mod:`pbscale.methods.beyond`: ST-theta (Zhou et al.), hard-concrete L0 and edge-popup.

The families with mask logits subclass :class:`pbscale.methods.trainer.LogitsFamily` (its hooks
are those of one gradient step; :class:`pbscale.methods.MaskTrainer` calls them). Every list of
methods (CLI choices, sweeps, the microworld's torch methods) is a query of the registry
(:func:`names`). A run's ``config.json`` records what analysis needs to know about its method
(:meth:`Family.info`), so a run reads back after its method is renamed or removed.

The hash of a run folder (:mod:`pbscale.loop`) is taken over :meth:`MethodConfig.to_dict`: the
shared settings, then a family's own settings under the family's name, only those that differ
from their defaults (``{"cp": {"final_tau": 0.01}}``, ``method.cp.final_tau`` in the run's
configuration), so adding a method or a setting renames no existing run. The two settings of CP
that predate this rule keep the keys they always had (``cp_final_tau``, ``cp_every``, in every
run's hash at CP's defaults: :data:`LEGACY_KEYS`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from pbexact.continuation import CP_FINAL_TAU
from pbexact.errors import PBInputError, check_n
from pbexact.parametrizations import PARAMETRIZATIONS

#: The tools a family can run in: ``regress`` (:mod:`pbscale.regress`), ``batched``
#: (:mod:`pbscale.batched_seeds`), ``prune-supermask`` and ``prune-joint`` (:mod:`pbscale.prune`
#: ``--mode``) and ``microworld`` (the vectorized torch runs of
#: :mod:`analysis.microworld_hybrid`; the MC estimators run there on the exact core).
COMMANDS = ("regress", "batched", "prune-supermask", "prune-joint", "microworld")
#: Mask step decays of the pruning experiments (`tab:app_supermask_hypers`,
#: `tab:app_pruning_broad`; fractions of the epochs, multiplier): CP's logits x0.1 at 40% and
#: 60%, MC logits x0.5 at 60%.
CP_MILESTONES, CP_GAMMA = (0.4, 0.6), 0.1
MC_MILESTONES, MC_GAMMA = (0.6,), 0.5
#: Joint MC runs train the dense network for the first 10% of the epochs.
MC_START = 0.1
#: The optimizers of mask logits, by name (``--optimizer``, ``--mask-opt``).
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "rmsprop": torch.optim.RMSprop, "sgd": torch.optim.SGD}
#: The settings every method's run has (:class:`MethodConfig`); a family lists in
#: :attr:`Family.uses` those it reads.
SHARED = ("n", "param", "lr", "optimizer", "chunk", "lam")
#: The settings of pruning's cut schedule (:class:`pbscale.prune_config.PruneConfig`) a family
#: may read (:attr:`Family.uses`): the kept fraction, MP's cut, GMP's schedule.
PRUNE_SETTINGS = ("target", "prune_at", "gmp_start", "gmp_end", "gmp_every")
#: Keys of every run's hashed method section from before families owned their settings: CP's
#: final temperature and update period, at CP's defaults (a CP run's own values); the CP
#: settings carry the same keys (:func:`legacy`).
LEGACY_KEYS: dict[str, Any] = {"cp_final_tau": CP_FINAL_TAU, "cp_every": 100}
#: The fields of :class:`MethodConfig` hashed as they are, in the order config.json shows them.
HASHED = ("method", "n", "param", "lr", "optimizer", "seed", "chunk", "lam")


def legacy(key: str) -> dict:
    """Field metadata of a setting hashed under an old top-level key (:data:`LEGACY_KEYS`)."""
    return {"legacy": key}


@dataclass(frozen=True)
class Settings:
    """The settings one family owns (a frozen dataclass subclass with a default for every
    field). :meth:`check` validates them, once, when a :class:`MethodConfig` is made; only the
    fields that differ from their defaults go into a run's hash (:meth:`changed`)."""

    def check(self, text: str) -> None:
        """Refuse (:class:`PBInputError`) a bad value; ``text`` names the method."""

    def changed(self) -> dict[str, Any]:
        """{field: value} of the fields that differ from their defaults (and have no legacy
        key)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if "legacy" not in f.metadata and getattr(self, f.name) != f.default}

    def legacy_entries(self) -> dict[str, Any]:
        """{old key: value} of the fields hashed under a key of :data:`LEGACY_KEYS`."""
        return {f.metadata["legacy"]: getattr(self, f.name) for f in dataclasses.fields(self)
                if "legacy" in f.metadata}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def build(cls, given: Settings | dict | None, text: str) -> Settings:
        """An instance from an instance, a {field: value} dict or None (the defaults); an
        unknown field is a one-line :class:`PBInputError`."""
        if isinstance(given, cls):
            return given
        if given is None:
            return cls()
        if not isinstance(given, dict):
            raise PBInputError(f"the settings of {text} are {cls.__name__} or a dict of "
                               f"{', '.join(cls.names()) or 'nothing'}, got {given!r}; give one "
                               "of those")
        unknown = sorted(set(given) - set(cls.names()))
        if unknown:
            own = ", ".join(cls.names()) or "none"
            raise PBInputError(f"{text} has no setting {unknown[0]!r}; its settings: {own}")
        return cls(**given)


@dataclass(frozen=True)
class NoSettings(Settings):
    """A family without settings of its own."""


@dataclass
class Plan:
    """What a tool tells :meth:`Family.make` about the run: the epochs and training steps per
    epoch, the steps in which the masks train (CP's temperature schedule counts them), the
    sizes of the layers the flat mask covers (None: one layer of d), the tool's own settings
    (``run``: e.g. :class:`pbscale.prune_config.PruneConfig`, read by the names of
    :data:`PRUNE_SETTINGS` a family uses), the weights' optimizer of a joint run and the memory
    of one mask in a chunk (None: 16 d bytes)."""

    epochs: int = 1
    steps_per_epoch: int = 1
    mask_steps: int = 1
    layers: tuple[int, ...] | None = None
    run: Any = None
    weight_optimizer: torch.optim.Optimizer | None = None
    bytes_per_sample: int | None = None

    def setting(self, name: str, default: Any) -> Any:
        """The tool's setting ``name`` (``default`` when the tool has none)."""
        return getattr(self.run, name, default)


class Family:
    """One method (or family member): what it is, what it reads, and how its run's method is
    built (:meth:`make`).

    Attributes: ``name`` (CLI value), ``label`` (legend text), ``text`` (messages), ``color``
    (matplotlib colour of its curves; no two methods share one), ``commands`` (a subset of
    :data:`COMMANDS`), ``samples`` (draws masks from a distribution for its estimate: its runs
    are described by n and the parametrization; in pruning only such methods take ``--n``),
    ``deterministic`` (draws nothing: one mask, one microworld seed), ``uses`` (the settings of
    :data:`SHARED` and :data:`PRUNE_SETTINGS` it reads; those it does not are listed as unused
    in a run's config.json), ``Settings`` (its own settings, :class:`Settings`), ``min_samples``
    (fewest samples per step; None: it ignores n).

    Four behaviours default to ``samples`` and can be set apart: ``split_samples`` (torchrun
    splits its samples over the ranks; else data parallelism), ``eval_sampled`` (evaluated by
    the best of sampled masks; else its deterministic mask), ``rescale`` (pruning rescales
    its weights dynamically, :func:`pbscale.masks.rescaled_weight`), ``captures_step`` (a
    supermask step may be replayed from a CUDA graph, :class:`pbscale.captured_step.
    CapturedSteps`: its step reads back one value, the sum of its n sampled losses, and its
    Python state is the step count alone).

    Pruning (:mod:`pbscale.prune`): ``mask_schedule`` ((milestones, gamma) of its logits),
    ``joint_warmup`` (fraction of a joint run's epochs trained dense first), ``dense_weights``
    (trains the weights in supermask mode too), ``also_sampled`` (also reports the best of
    ``--eval-masks`` sampled masks, ``sampled_*`` metrics) and ``prune_param`` (its
    parametrization when ``--param`` is left out)."""

    name: str = ""
    label: str = ""
    text: str = ""
    color: str = ""
    commands: tuple[str, ...] = ()
    samples: bool = False
    deterministic: bool = False
    uses: tuple[str, ...] = ()
    Settings: ClassVar[type[Settings]] = NoSettings
    mask_schedule: tuple[tuple[float, ...], float] = ((), 1.0)
    joint_warmup: float = 0.0
    dense_weights: bool = False
    also_sampled: bool = False
    prune_param: str | None = None

    def __repr__(self) -> str:
        return f"<method {self.name}>"

    # ------------------------------------------------------------------ what it reads

    @property
    def min_samples(self) -> int | None:
        return 1 if "n" in self.uses else None

    @property
    def split_samples(self) -> bool:
        return self.samples

    @property
    def eval_sampled(self) -> bool:
        return self.samples

    @property
    def rescale(self) -> bool:
        return self.samples

    @property
    def captures_step(self) -> bool:
        return self.samples

    @property
    def logits(self) -> bool:
        """Whether it trains mask logits (reads the mask learning rate)."""
        return "lr" in self.uses

    @property
    def any_param(self) -> bool:
        """Whether it takes every parametrization (else the sigmoid only)."""
        return "param" in self.uses

    @property
    def prune_settings(self) -> tuple[str, ...]:
        """The settings of pruning's cut schedule it reads (:data:`PRUNE_SETTINGS`)."""
        return tuple(s for s in PRUNE_SETTINGS if s in self.uses)

    @property
    def trains_weights(self) -> bool:
        """Whether its step also gives a loss for the network weights (joint pruning)."""
        return "prune-joint" in self.commands

    def info(self, settings: tuple[str, ...] | None = None) -> dict:
        """What a run's ``config.json`` records about its method ("method_info"), so that the
        run reads back without the registry: name, label, text, colour, whether it samples or
        is deterministic, and the names of the settings it uses (``settings``: the tool's
        names for the shared ones, default :attr:`uses`; then its own settings)."""
        used = list(self.uses if settings is None else settings) + list(self.Settings.names())
        return {"name": self.name, "label": self.label, "text": self.text, "color": self.color,
                "samples": bool(self.samples), "deterministic": bool(self.deterministic),
                "settings": list(used)}

    # ------------------------------------------------------------------ checks

    def check(self, config: MethodConfig) -> None:
        """Refuse (:class:`PBInputError`) a parametrization or n this method does not take."""
        if not self.any_param and config.param != "sigmoid":
            raise PBInputError(
                f"{self.text} is defined for the sigmoid parametrization only; use --param "
                f"sigmoid (other parametrizations: {', '.join(names(any_param=True))})")
        if self.min_samples is not None:
            check_n(config.n, self.text, self.min_samples)

    def check_prune(self, config: Any) -> None:
        """Refuse (:class:`PBInputError`) a :class:`pbscale.prune_config.PruneConfig` setting
        this method does not take (e.g. a --target outside (0, 1])."""

    # ------------------------------------------------------------------ the run's method

    def make(self, config: MethodConfig, layout: Any, plan: Plan) -> Any:
        """The run loop's :class:`pbscale.loop_types.Method` of ``config`` over the flat mask
        of ``layout`` (:class:`pbscale.masks.MaskedModule`: d, device, dtype, sizes), fully
        built: its random stream (``generator``, seeded with the run's seed), its capabilities
        (distribution over torchrun ranks, evaluation, what pruning exports)."""
        raise NotImplementedError(f"{self.name} builds no method")

    def make_group(self, configs: Sequence[MethodConfig], layout: Any, plan: Plan) -> Any:
        """The run loop's :class:`pbscale.loop_types.Method` of the G runs ``configs`` of this
        method (different seeds, learning rates, optimizers, lam) trained in one process over
        the flat mask of ``layout``: each step is each run's own step, so that run g's numbers
        are those of the method :meth:`make` builds for ``configs[g]``, bit for bit. A family
        that does not batch refuses (:class:`PBInputError`)."""
        raise PBInputError(f"{self.text} runs do not train as a group; run them one at a time")


#: Every method, by name, in registration order (MC estimators, CP, hybrids, magnitude, beyond).
REGISTRY: dict[str, Family] = {}


def register(family: Family | type[Family]) -> Any:
    """Add a family (an instance, or a class instantiated without arguments) to
    :data:`REGISTRY`; returns its argument, so it works as a class decorator. A name that is
    empty, taken, or the name of a shared setting, and a colour another method has, are
    refused."""
    obj = family() if isinstance(family, type) else family
    if not obj.name or obj.name in REGISTRY or obj.name in MethodConfig.__dataclass_fields__:
        raise ValueError(f"method name {obj.name!r} is empty, registered twice or a setting's")
    unknown = set(obj.commands) - set(COMMANDS)
    if unknown:
        raise ValueError(f"{obj.name}: unknown commands {sorted(unknown)}")
    unknown = set(obj.uses) - set(SHARED) - set(PRUNE_SETTINGS)
    if unknown:
        raise ValueError(f"{obj.name}: unknown settings in uses {sorted(unknown)}")
    taken = {f.color: f.name for f in REGISTRY.values()}
    if obj.color in taken:
        raise ValueError(f"{obj.name}: colour {obj.color!r} is {taken[obj.color]}'s; choose "
                         "another")
    REGISTRY[obj.name] = obj
    return family


def names(command: str | None = None, **flags: Any) -> tuple[str, ...]:
    """The registered names that run in ``command`` (None: any) and whose attributes equal
    ``flags`` (e.g. ``names("prune-joint", samples=True)``), in registration order."""
    return tuple(f.name for f in REGISTRY.values()
                 if (command is None or command in f.commands)
                 and all(getattr(f, k) == v for k, v in flags.items()))


def get_family(name: str, command: str | None = None) -> Family:
    """The family of method ``name`` (one that runs in ``command``, if given); anything else is
    a one-line :class:`PBInputError` listing the choices."""
    choices = names(command)
    if not isinstance(name, str) or name not in choices:
        raise PBInputError(f"unknown method {name!r}; choose one of {', '.join(choices)}")
    return REGISTRY[name]


@dataclass
class MethodConfig:
    """A mask-optimization method, the settings every method's run has, and the method's own
    (``settings``: its family's :class:`Settings`, or a dict of them, or None for their
    defaults). Validated once, when it is made (:class:`PBInputError` on the first bad
    setting): a MethodConfig that exists is a valid one."""

    method: str = "loorf"
    n: int = 10
    param: str = "sigmoid"
    lr: float = 0.1
    optimizer: str = "rmsprop"
    seed: int = 0
    chunk: int | None = None
    lam: float = 0.0
    settings: Any = field(default=None, compare=True)

    def __post_init__(self) -> None:
        family = get_family(self.method)
        self.settings = family.Settings.build(self.settings, family.text)
        if self.param not in PARAMETRIZATIONS:
            raise PBInputError(
                f"unknown parametrization {self.param!r}; "
                f"choose one of {', '.join(PARAMETRIZATIONS)}"
            )
        family.check(self)
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise PBInputError(f"the learning rate must be a positive number, got lr={self.lr}; "
                               "give a finite rate > 0")
        if self.optimizer not in OPTIMIZERS:
            raise PBInputError(
                f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
            )
        if self.chunk is not None and (not isinstance(self.chunk, int) or self.chunk < 1):
            raise PBInputError(f"chunk must be a positive integer, got {self.chunk}; give 1 or "
                               "more, or leave it out (from free memory)")
        if not (math.isfinite(self.lam) and self.lam >= 0):
            raise PBInputError(f"the regularization weight must be >= 0, got lam={self.lam}; "
                               "give a finite lam >= 0")
        self.settings.check(family.text)

    def validate(self) -> MethodConfig:
        """Itself (it was validated when it was made)."""
        return self

    def to_dict(self) -> dict:
        """The hashed form (see the module docstring): the shared settings, :data:`LEGACY_KEYS`
        (a CP run's own values), and the family's own settings that differ from their
        defaults under the family's name."""
        out = {k: getattr(self, k) for k in HASHED}
        out.update(LEGACY_KEYS)
        out.update(self.settings.legacy_entries())
        own = self.settings.changed()
        if own:
            out[self.method] = own
        return out

    @classmethod
    def from_dict(cls, data: dict) -> MethodConfig:
        """The configuration a run's hashed method section (:meth:`to_dict`, any version)
        describes."""
        family = get_family(data["method"])
        fields = {k: data[k] for k in HASHED if k in data}
        own = dict(data.get(data["method"], {}))
        for f in dataclasses.fields(family.Settings):
            if "legacy" in f.metadata and f.metadata["legacy"] in data:
                own[f.name] = data[f.metadata["legacy"]]
        return cls(**fields, settings=own)

    @property
    def family(self) -> Family:
        """The method's :class:`Family`."""
        return REGISTRY[self.method]
