"""The method registry: every mask-optimization method of pbscale as one :class:`Family` object,
by name, in :data:`REGISTRY`, and :class:`MethodConfig`, the settings of one method's run.

A family says what a method is (name, legend label, colour) and states its capabilities in one
frozen :class:`Capabilities` (the tools it runs in, whether it samples, which shared settings it
reads, how its runs may execute, how pruning treats it; each default a constant, none derived from
another field, in the spirit of scikit-learn's estimator tags), owns the settings no other method
has (a frozen :class:`Settings` dataclass, e.g. CP's final temperature; each an option of every tool
it runs in, :mod:`pbscale.methods.options`) and builds the run loop's
:class:`pbscale.runs.contracts.Method` with :meth:`Family.make`, fully: nothing outside the family
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
take the logits and a frozen :class:`pbscale.methods.trainer.StepArgs`: the step's position,
layers, settings and random stream; :class:`pbscale.methods.MaskTrainer` holds a run's state and
calls them); those without subclass :class:`pbscale.methods.cuts.MaskFamily`. Every list of
methods (CLI choices, sweeps, the microworld's torch methods) is a query of the registry
(:func:`names`). A run's ``config.json`` records what analysis needs to know about its method
(:meth:`Family.info`), so a run reads back after its method is renamed or removed.

The hash of a run folder (:mod:`pbscale.runs.loop`) is taken over :meth:`MethodConfig.to_dict`: the
shared settings, then a family's own settings under the family's name, only those that differ
from their defaults (``{"cp": {"final_tau": 0.01}}``, ``method.cp.final_tau`` in the run's
configuration), so adding a method or a setting renames no existing run. The two settings of CP
that predate this rule keep the keys they always had (``cp_final_tau``, ``cp_every``, in every
run's hash at CP's defaults: :data:`LEGACY_KEYS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from pbexact.continuation import CP_FINAL_TAU
from pbexact.errors import PBInputError, check_n
from pbexact.parametrizations import PARAMETRIZATIONS

from .schedules import KeptFraction

#: The tools a family can run in: ``regress`` (:mod:`pbscale.regress`), ``regress-group``
#: (regression groups, ``python -m pbscale.regress --seeds``), ``prune-supermask`` and
#: ``prune-joint`` (:mod:`pbscale.prune` ``--mode``) and ``microworld`` (the vectorized torch
#: runs of :mod:`analysis.microworld.hybrid`; the MC estimators run there on the exact core).
COMMANDS = ("regress", "regress-group", "prune-supermask", "prune-joint", "microworld")
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
#: :attr:`Capabilities.uses` those it reads.
SHARED = ("n", "param", "lr", "optimizer", "chunk", "lam")
#: The settings of pruning's cut schedule (:class:`pbscale.pruning.config.PruneConfig`) a family
#: may read (:attr:`Capabilities.uses`): the kept fraction, MP's cut, GMP's schedule.
PRUNE_SETTINGS = ("target", "prune_at", "gmp_start", "gmp_end", "gmp_every")
#: Keys of every run's hashed method section from before families owned their settings: CP's
#: final temperature and update period, at CP's defaults (a CP run's own values); the CP
#: settings carry the same keys (:func:`legacy`).
LEGACY_KEYS: dict[str, Any] = {"cp_final_tau": CP_FINAL_TAU, "cp_every": 100}
#: The fields of :class:`MethodConfig` hashed as they are, in the order config.json shows them.
HASHED = ("method", "n", "param", "lr", "optimizer", "seed", "chunk", "lam")


def setting(default: Any, help: str, legacy: str | None = None) -> Any:
    """A field of a :class:`Settings` dataclass: its default, the one line its command-line
    option's help shows (``--<family>-<field>``, :mod:`pbscale.methods.options`) and, for a
    setting that predates the rule of :meth:`Settings.changed`, the old top-level key it is
    hashed under (:data:`LEGACY_KEYS`)."""
    meta = {"help": help, **({"legacy": legacy} if legacy else {})}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    """The settings one family owns (a frozen dataclass subclass with a default for every
    field). :meth:`check` validates them, once, when a :class:`MethodConfig` is made; only the
    fields that differ from their defaults go into a run's hash (:meth:`changed`)."""

    def check(self, text: str) -> None:
        """Refuse (:class:`PBInputError`) a bad value; ``text`` names the method."""

    def differing(self) -> dict[str, Any]:
        """{field: value} of the fields that differ from their defaults."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def changed(self) -> dict[str, Any]:
        """{field: value} of the fields that differ from their defaults and have no legacy
        key (those are hashed under it, :meth:`legacy_entries`)."""
        return {k: v for k, v in self.differing().items()
                if "legacy" not in self.__dataclass_fields__[k].metadata}

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
    (``run``: e.g. :class:`pbscale.pruning.config.PruneConfig`, read by the names of
    :data:`PRUNE_SETTINGS` a family uses), the weights' optimizer of a joint run and the memory
    of one mask in a chunk (None: 16 d bytes) and the number of torchrun ranks that split the
    samples (``world``: 1 in one process; a joint step holds only a rank's share of them).
    ``l0_weights``: per-variable weights c (d,) of the L0 term, lam * sum_i c_i theta_i
    (structured pruning: the variables' costs normalised to mean 1; None: every variable 1).
    ``kept_fraction``: what a kept fraction of the variables is measured by, bool keep masks
    (n, d) -> fractions (n,) of the ``--cost`` each keeps (structured pruning: the run's
    :meth:`pbscale.nets.channel_layout.ChannelLayout.kept_fractions`; None: of the count, one
    cost each). ``coupled``: the variables of each coupled group, int64 (m, L) padded with d,
    which a cut to ``--target`` never empties (structured pruning: the run's
    :meth:`pbscale.nets.channel_layout.ChannelLayout.coupled_index`; None: no such groups)."""

    epochs: int = 1
    steps_per_epoch: int = 1
    mask_steps: int = 1
    layers: tuple[int, ...] | None = None
    run: Any = None
    weight_optimizer: torch.optim.Optimizer | None = None
    bytes_per_sample: int | None = None
    world: int = 1
    l0_weights: torch.Tensor | None = None
    kept_fraction: KeptFraction | None = None
    coupled: torch.Tensor | None = None

    def setting(self, name: str, default: Any) -> Any:
        """The tool's setting ``name`` (``default`` when the tool has none)."""
        return getattr(self.run, name, default)


@dataclass(frozen=True)
class Pruning:
    """How pruning (:mod:`pbscale.prune`) treats a family: its pruning profile
    (``Capabilities.pruning``), read by pruning alone. Each default a constant; a family that
    does not prune keeps the defaults (:class:`Capabilities` refuses others).

    Evaluation: ``eval_sampled`` (evaluated by the best of sampled masks; else its
    deterministic mask; needs ``samples``), ``also_sampled`` (also reports the best of
    ``--eval-masks`` sampled masks, ``sampled_*`` metrics). Training: ``rescale`` (its
    weights rescaled dynamically, :func:`pbscale.forward.rescale.rescaled_weight`),
    ``mask_schedule`` ((milestones, gamma) of its logits' step decay), ``joint_warmup``
    (fraction of a joint run's epochs trained dense first), ``dense_weights`` (trains the
    weights in supermask mode too). Settings: ``prune_param`` (its parametrization when
    ``--param`` is left out), ``prune_n`` (the n of every pruning run, ``--n`` then unused;
    None: ``--n``, where ``uses`` names n). ``channels``: its variables may be channels
    (``--granularity channel``): its step reads nothing of the flat mask's layout but d, so a
    variable may stand for a channel of a coupled group, or (MP, GMP) it reads what the
    channel layout gives it for each variable (the squared norm of the slices it removes, its
    cost), or (edge-popup) it keeps a fraction of the cost the plan's ``kept_fraction``
    measures."""

    eval_sampled: bool = False
    also_sampled: bool = False
    rescale: bool = False
    mask_schedule: tuple[tuple[float, ...], float] = ((), 1.0)
    joint_warmup: float = 0.0
    dense_weights: bool = False
    prune_param: str | None = None
    prune_n: int | None = None
    channels: bool = False


#: The tools of :data:`COMMANDS` that prune (they read :attr:`Capabilities.pruning`).
PRUNE_COMMANDS = ("prune-supermask", "prune-joint")


@dataclass(frozen=True)
class Capabilities:
    """What a method is and reads, stated once (the family's ``caps``; in the spirit of
    scikit-learn's estimator tags): each field's default is a constant, none is derived from
    another field.

    ``commands``: the tools it runs in (a subset of :data:`COMMANDS`). ``uses``: the settings
    of :data:`SHARED` and :data:`PRUNE_SETTINGS` it reads; those it does not are listed as
    unused in a run's config.json, and the trainer adds no L0 term without ``lam``.
    A family that names ``n`` in ``uses`` draws n masks per step and takes ``--n`` in every
    tool (pruning too, unless ``pruning.prune_n`` fixes it); one that does not runs with n = 1.
    ``samples``: one of pbexact's MC estimators (:class:`pbscale.methods.mc.MCFamily`, one per
    estimator of `pbexact.estimators.REGISTRY` without a J table): its runs are described by n
    and the parametrization, and analysis selects the MC runs by it (config.json's
    "method_info"). ``deterministic``: draws nothing (one mask, one microworld seed).
    ``min_samples``: fewest samples per step (given exactly when it uses ``n``).

    How its runs may execute, each False unless stated: ``split_samples`` (torchrun splits its
    samples over the ranks; else data parallelism), ``captures_step`` (a supermask step may be
    replayed from a CUDA graph: the step reads back one value, the sum of its n sampled losses,
    and its Python state is the step count alone).

    ``pruning``: its pruning profile (:class:`Pruning`), other than the defaults only for a
    family whose ``commands`` prune."""

    commands: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    samples: bool = False
    deterministic: bool = False
    min_samples: int | None = None
    split_samples: bool = False
    captures_step: bool = False
    pruning: Pruning = Pruning()

    def __post_init__(self) -> None:
        unknown = set(self.commands) - set(COMMANDS)
        if unknown:
            raise ValueError(f"unknown commands {sorted(unknown)}; choose from {COMMANDS}")
        unknown = set(self.uses) - set(SHARED) - set(PRUNE_SETTINGS)
        if unknown:
            raise ValueError(f"unknown settings in uses {sorted(unknown)}; choose from "
                             f"{SHARED + PRUNE_SETTINGS}")
        if not isinstance(self.pruning, Pruning):
            raise ValueError(f"pruning must be a Pruning, got {self.pruning!r}")
        if self.pruning != Pruning() and not set(self.commands) & set(PRUNE_COMMANDS):
            raise ValueError("a pruning profile other than the defaults needs a pruning tool "
                             f"in commands ({', '.join(PRUNE_COMMANDS)})")
        if ("n" in self.uses) != (self.min_samples is not None):
            raise ValueError("min_samples is given exactly when uses names n")
        prune_n = self.pruning.prune_n
        if prune_n is not None and ("n" not in self.uses or prune_n < (self.min_samples or 1)):
            raise ValueError("pruning.prune_n needs n in uses and at least min_samples")
        if self.samples and self.deterministic:
            raise ValueError("a method that samples is not deterministic")
        if (self.split_samples or self.captures_step or self.pruning.eval_sampled) \
                and not self.samples:
            raise ValueError("split_samples, captures_step and pruning.eval_sampled need "
                             "samples")

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

    def get(self, flag: str) -> Any:
        """A field, property or field of the pruning profile by name (what :func:`names`
        filters on)."""
        if flag not in CAPABILITY_FLAGS:
            raise AttributeError(f"no capability {flag!r}; choose from "
                                 f"{', '.join(CAPABILITY_FLAGS)}")
        if flag in PRUNING_FLAGS:
            return getattr(self.pruning, flag)
        return getattr(self, flag)


#: The fields of the pruning profile, as flags of :func:`names`.
PRUNING_FLAGS = tuple(f.name for f in dataclasses.fields(Pruning))
#: The names :func:`names` filters on: the fields of :class:`Capabilities` and its properties.
CAPABILITY_FLAGS = (*(f.name for f in dataclasses.fields(Capabilities) if f.name != "pruning"),
                    "logits", "any_param", "prune_settings", "trains_weights",
                    *PRUNING_FLAGS)


class Family:
    """One method (or family member): its identity (``name``: CLI value, ``label``: legend
    text, ``text``: messages, ``color``: matplotlib colour of its curves, at least
    :data:`MIN_COLOR_DISTANCE` from every other method's as drawn), its capabilities (``caps``,
    one :class:`Capabilities`), its own settings (``Settings``, a :class:`Settings` subclass)
    and how its run's method is built (:meth:`make`; the bases
    :class:`pbscale.methods.trainer.LogitsFamily` and :class:`pbscale.methods.magnitude.
    MaskFamily` implement it over hooks that take explicit arguments)."""

    name: str = ""
    label: str = ""
    text: str = ""
    color: str = ""
    caps: Capabilities = Capabilities()
    Settings: ClassVar[type[Settings]] = NoSettings

    def __repr__(self) -> str:
        return f"<method {self.name}>"

    def info(self, settings: tuple[str, ...] | None = None) -> dict:
        """What a run's ``config.json`` records about its method ("method_info"), so that the
        run reads back without the registry: name, label, text, colour, whether it samples or
        is deterministic, and the names of the settings it uses (``settings``: the tool's
        names for the shared ones, default ``caps.uses``; then its own settings)."""
        used = list(self.caps.uses if settings is None else settings) + list(
            self.Settings.names())
        return {"name": self.name, "label": self.label, "text": self.text, "color": self.color,
                "samples": bool(self.caps.samples),
                "deterministic": bool(self.caps.deterministic), "settings": list(used)}

    # ------------------------------------------------------------------ checks

    def check(self, config: MethodConfig) -> None:
        """Refuse (:class:`PBInputError`) a parametrization or n this method does not take."""
        if not self.caps.any_param and config.param != "sigmoid":
            raise PBInputError(
                f"{self.text} is defined for the sigmoid parametrization only; use --param "
                f"sigmoid (other parametrizations: {', '.join(names(any_param=True))})")
        if self.caps.min_samples is not None:
            check_n(config.n, self.text, self.caps.min_samples)

    def check_prune(self, config: Any) -> None:
        """Refuse (:class:`PBInputError`) a :class:`pbscale.pruning.config.PruneConfig` setting
        this method does not take (e.g. a --target outside (0, 1])."""

    # ------------------------------------------------------------------ the run's method

    def make(self, config: MethodConfig, layout: Any, plan: Plan) -> Any:
        """The run loop's :class:`pbscale.runs.contracts.Method` of ``config`` over the flat mask
        of ``layout`` (:class:`pbscale.forward.masks.MaskedModule`: d, device, dtype, sizes), fully
        built: its random stream (``generator``, seeded with the run's seed) and its
        evaluation (``eval_sampled``, ``mode_mask()``, ``sample_masks(k)``). How the run
        executes (alone, in a group, captured, split over ranks) is decided outside it."""
        raise NotImplementedError(f"{self.name} builds no method")


#: Every method, by name, in registration order (MC estimators, CP, hybrids, magnitude, beyond).
REGISTRY: dict[str, Family] = {}


#: The least distance, in CIELAB (CIE76 Delta E, D65), between two methods' colours as drawn:
#: 20 is two colours no reader mixes up in a legend ("crimson" beside GMP's "C3", tab:red, is
#: 12; the closest registered pair, RELAX's olive and hard-concrete's goldenrod, 26).
MIN_COLOR_DISTANCE = 20.0


def lab(color: str) -> tuple[float, float, float]:
    """The CIELAB coordinates (L*, a*, b*; D65 white) of a matplotlib colour as drawn."""
    from matplotlib.colors import to_rgb

    linear = [((v + 0.055) / 1.055) ** 2.4 if v > 0.04045 else v / 12.92 for v in to_rgb(color)]
    rows = ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505))
    xyz = [sum(m * v for m, v in zip(row, linear)) for row in rows]

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    fx, fy, fz = (f(v / w) for v, w in zip(xyz, (0.95047, 1.0, 1.08883)))
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def color_distance(a: str, b: str) -> float:
    """CIE76 Delta E between two matplotlib colours as drawn (0: the same colour)."""
    return math.dist(lab(a), lab(b))


#: Whether :func:`register` checks colours (off inside :func:`own_families`).
_colors_checked = [True]


@contextlib.contextmanager
def own_families() -> Iterator[None]:
    """While pbscale registers its own families (:mod:`pbscale.methods` imports them inside):
    their colours are not checked as they register, so a run imports no matplotlib (0.1 s and
    15 MiB at start-up); ``tests/test_method_registry.py`` checks them (each drawn by
    matplotlib, :data:`MIN_COLOR_DISTANCE` apart). A family registered later is checked,
    against these too."""
    _colors_checked[0] = False
    try:
        yield
    finally:
        _colors_checked[0] = True


def register(family: Family | type[Family]) -> Any:
    """Add a family (an instance, or a class instantiated without arguments) to
    :data:`REGISTRY`; returns its argument, so it works as a class decorator. A name that is
    empty, taken, or the name of a shared setting, a colour matplotlib cannot draw, and a
    colour drawn within :data:`MIN_COLOR_DISTANCE` of another method's, are refused (the
    colours of pbscale's own families by the tests: :func:`own_families`)."""
    obj = family() if isinstance(family, type) else family
    if not obj.name or obj.name in REGISTRY or obj.name in MethodConfig.__dataclass_fields__:
        raise ValueError(f"method name {obj.name!r} is empty, registered twice or a setting's")
    if not isinstance(obj.caps, Capabilities):
        raise ValueError(f"{obj.name}: caps must be a Capabilities, got {obj.caps!r}")
    if "microworld" in obj.caps.commands and not callable(getattr(obj, "vector_gradient", None)):
        raise ValueError(f"{obj.name}: runs in the microworld but has no microworld hooks; "
                         "subclass pbscale.methods.MicroworldHooks too")
    if _colors_checked[0]:
        check_color(obj)
    REGISTRY[obj.name] = obj
    return family


def check_color(obj: Family) -> None:
    """Refuse (ValueError) a family's colour that matplotlib cannot draw, or that draws within
    :data:`MIN_COLOR_DISTANCE` of a registered method's."""
    from matplotlib.colors import is_color_like

    if not is_color_like(obj.color):
        raise ValueError(f"{obj.name}: {obj.color!r} is no colour matplotlib draws; choose one "
                         "such as 'C0' or 'teal'")
    close = [(color_distance(obj.color, f.color), f) for f in REGISTRY.values()]
    near = min(close, key=lambda t: t[0], default=None)
    if near is not None and near[0] < MIN_COLOR_DISTANCE:
        raise ValueError(f"{obj.name}: colour {obj.color!r} draws like {near[1].name}'s "
                         f"{near[1].color!r} (Delta E {near[0]:.0f} < {MIN_COLOR_DISTANCE:.0f});"
                         " choose another")


def names(command: str | None = None, **flags: Any) -> tuple[str, ...]:
    """The registered names that run in ``command`` (None: any) and whose capabilities equal
    ``flags`` (e.g. ``names("prune-joint", samples=True)``; :data:`CAPABILITY_FLAGS`), in
    registration order."""
    return tuple(f.name for f in REGISTRY.values()
                 if (command is None or command in f.caps.commands)
                 and all(f.caps.get(k) == v for k, v in flags.items()))


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
