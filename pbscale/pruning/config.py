"""The settings of one :mod:`pbscale.prune` run: :class:`PruneConfig` (every field but the data
folder goes into the run folder's hash), its defaults that depend on other fields, its checks,
the settings its method does not read, and the pruning experiments' constants (modes, methods,
schedules of `tab:app_supermask_hypers` and `tab:app_pruning_broad`, the evaluation rule).
"""

from __future__ import annotations

import copy
import importlib.util
import math
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields

from pbexact.errors import PBInputError
from pbexact.parametrizations import PARAMETRIZATIONS
from pbscale.methods import OPTIMIZERS, REGISTRY, Family, MethodConfig, Settings
from pbscale.methods.options import foreign, option_dest
from pbscale.methods.registry import MC_START, PRUNE_COMMANDS, PRUNE_SETTINGS
from pbscale.nets import data as datamod
from pbscale.nets.models import MODELS
from pbscale.nets.network import NETWORK_INITS, check_spec, is_import_path
from pbscale.nets.objectives import LOSSES
from pbscale.nets.user_data import ARRAYS

#: The modes of a pruning run (``--mode``), one per pruning command of the registry.
MODES = tuple(c.removeprefix("prune-") for c in PRUNE_COMMANDS)


def prune_methods() -> tuple[str, ...]:
    """The methods of the registry that prune (in either mode), as registered now."""
    return tuple(n for n, f in REGISTRY.items() if set(PRUNE_COMMANDS) & set(f.caps.commands))


#: The methods that prune when pbscale is imported (:func:`prune_methods` adds those
#: registered since).
PRUNE_METHODS = prune_methods()
#: The optimizers of the mask logits (``--mask-opt``): the registry's table.
MASK_OPTIMIZERS = tuple(OPTIMIZERS)
#: The parametrization of MC runs when --param is left out (a family's ``prune_param`` first).
DEFAULT_PARAM = "escort"
#: Default model -> data set (the user's own models have none: --dataset or --data).
MODEL_DATA = {"lenet": "mnist", "conv6": "cifar10", "resnet20": "cifar10", "vgg19": "cifar10"}
#: Weight optimizer of joint runs (`sec:app_joint_pruning_setup`): SGD, Nesterov momentum.
WEIGHT_LR, WEIGHT_MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4
#: Step decay of the weights (`tab:app_supermask_hypers` / `tab:app_pruning_broad`; fractions
#: of epochs, multiplier): x0.1 at 40% and 60%. The masks' decay is their family's
#: ``mask_schedule``, the dense start of joint runs its ``joint_warmup``.
WEIGHT_MILESTONES, WEIGHT_GAMMA = (0.4, 0.6), 0.1
#: Joint runs: masks frozen for the last 20% of the epochs.
FREEZE_AT = 0.8
#: Evaluation rule of MC runs: masks sampled x training batches scored.
EVAL_MASKS, EVAL_BATCHES = 10, 10
#: The fields of :class:`PruneConfig` whose use depends on the method (:meth:`PruneConfig.unused`).
METHOD_DEPENDENT = ("n", "param", "lam", "lam_target", "mask_opt", "mask_lr", "target",
                    "prune_at", "gmp_start", "gmp_end", "gmp_every", "chunk", "eval_masks",
                    "budget")
#: Fields hashed only when set (:data:`CHANGED_ONLY`) that :meth:`PruneConfig.unused` does not
#: list: a run that does not read one refuses it set.
SET_ONLY = ("lam_target", "budget")
#: The fields that hold a shared method setting (:data:`pbscale.methods.registry.SHARED`) other
#: than n and the parametrization, with its name there: a run's method reads one when its
#: family's ``caps.uses`` names it.
SHARED_FIELDS = {"lam": "lam", "mask_opt": "optimizer", "mask_lr": "lr", "chunk": "chunk"}
#: Why a flag a run does not read may have been given, and what to use instead.
IGNORED_HINTS = {"target": "for a target fraction with an L0 method use --lam-target, or "
                           "--budget in joint mode"}
#: What a PB variable is (``--granularity``): one weight, or one channel of a coupled group
#: (structured pruning, :mod:`pbscale.nets.channels`).
GRANULARITIES = ("weight", "channel")
#: What the L0 term weighs each channel variable by (``--cost``): the parameters or the MACs
#: per example removing it alone saves (normalised to mean 1).
COSTS = ("params", "macs")
#: Entries of a finished run's summary.json that :func:`run` and :func:`report` read.
SUMMARY_KEYS = ("final_test_acc", "final_remaining", "final_remaining_all")


def steers_lam(family: Family) -> bool:
    """Whether ``--lam-target`` can steer the family's L0 strength: it trains mask logits under
    the L0 penalty and keeps no fixed count (edge-popup's ``--target`` fixes its count)."""
    return family.caps.logits and "lam" in family.caps.uses and "target" not in family.caps.uses


def reads_n(family: Family) -> bool:
    """Whether a pruning run of ``family`` takes ``--n``: its ``caps.uses`` names n and its
    ``caps.pruning.prune_n`` does not fix it."""
    return "n" in family.caps.uses and family.caps.pruning.prune_n is None


def pruning_n(family: Family, n: int) -> int:
    """The n a pruning run of ``family`` draws given ``--n`` = ``n``: ``n`` where it reads it
    (:func:`reads_n`), its ``caps.pruning.prune_n`` where that fixes it, else 1."""
    return n if reads_n(family) else family.caps.pruning.prune_n or 1


def method_reads(family: Family) -> list[str]:
    """The fields of :data:`METHOD_DEPENDENT` a pruning run of ``family`` reads, in that order
    (config.json's "method_info" "settings"; the others are "unused"), from its capabilities:
    n where :func:`reads_n` (the others run with :func:`pruning_n`), the parametrization
    where it takes any, the shared settings and the cut schedule its ``caps.uses`` names,
    ``lam_target`` and ``budget`` where it can steer its L0 strength, ``eval_masks`` where its
    evaluation samples masks."""
    caps = family.caps
    reads = {"n": reads_n(family), "param": caps.any_param, "lam_target": steers_lam(family),
             "budget": steers_lam(family),
             "eval_masks": caps.pruning.eval_sampled or caps.pruning.also_sampled,
             **{k: shared in caps.uses for k, shared in SHARED_FIELDS.items()},
             **{k: k in caps.uses for k in PRUNE_SETTINGS}}
    return [k for k in METHOD_DEPENDENT if reads[k]]


#: The form of a pruning run's hashed configuration (config.json's "format"): 2, each setting
#: once, under its option's name, and only those the run reads (:meth:`PruneConfig.hashed`;
#: the method and the loop derive from them). Format 1 (no "format" entry) hashed every field
#: and the method's section besides; its folders are still found
#: (:meth:`PruneConfig.legacy_hashed`).
CONFIG_FORMAT = 2
#: Marks a field hashed only when it differs from its default (settings added later, so that
#: existing run folders keep their names).
CHANGED_ONLY = {"hash": "changed"}


@dataclass
class PruneConfig:
    """One pruning run; every field goes into the run folder's hash (``config.json``) but the
    data folder, and the fields added later, which go in only when they differ from their
    defaults (:data:`CHANGED_ONLY`)."""

    model: str = "lenet"
    dataset: str = ""
    mode: str = "supermask"
    method: str = "cp"
    param: str = ""
    n: int = 10
    lam: float = 1e-4
    mask_opt: str = "rmsprop"
    mask_lr: float = 0.01
    target: float = 0.1
    epochs: int = 200
    batch_size: int = 0
    lr: float = WEIGHT_LR
    seed: int = 0
    init: str = "kaiming_normal"
    mask_head: bool = False
    mask_shortcuts: bool = False
    prune_at: float = 0.4
    gmp_start: float = MC_START
    gmp_end: float = FREEZE_AT
    gmp_every: int = 100
    chunk: int = 0
    max_batches: int = 0
    val_size: int = datamod.VAL_SIZE
    split_seed: int = 0
    synthetic: int = 0
    eval_masks: int = EVAL_MASKS
    eval_batches: int = EVAL_BATCHES
    data_dir: str = field(default="", metadata={"hash": False})
    lam_target: float = field(default=0.0, metadata=CHANGED_ONLY)
    #: ``--budget``: the fraction (of the masked weights; channels: of the ``--cost``) that the
    #: mask a joint L0 run freezes keeps at most (0: off; :func:`pbscale.methods.schedules.
    #: keep_budget`)
    budget: float = field(default=0.0, metadata=CHANGED_ONLY)
    #: the user's data file (``--data``, not hashed: its content is, as ``data_id``)
    data: str = field(default="", metadata={"hash": False})
    #: patterns of the masked parameters (comma-separated ``fnmatch``; "": the paper's rule)
    masked: str = field(default="", metadata=CHANGED_ONLY)
    #: ``--loss``: "" (cross-entropy for integer labels, MSE for float targets), "ce", "mse"
    #: or ``package.module:function``
    loss: str = field(default="", metadata=CHANGED_ONLY)
    #: the method's own settings, {field: value} (``--<method>-<field>``,
    #: :mod:`pbscale.methods.options`); hashed only those that differ from their defaults
    settings: dict = field(default_factory=dict, metadata=CHANGED_ONLY)
    #: ``--granularity``: "weight" (one variable a weight) or "channel" (one a channel)
    granularity: str = field(default="weight", metadata=CHANGED_ONLY)
    #: ``--cost``: the channel variables' L0 weights, "params" or "macs"
    cost: str = field(default="params", metadata=CHANGED_ONLY)

    def resolved(self) -> PruneConfig:
        """Defaults that depend on other fields filled in (data set, batch size)."""
        c = copy.copy(self)
        if c.data:
            c.dataset = c.dataset or ARRAYS
        if not c.dataset:
            c.dataset = MODEL_DATA.get(c.model, "")
        if not c.param:  # the method's default parametrization (escort for MC)
            family = REGISTRY.get(c.method)
            own = family.caps.pruning.prune_param if family is not None else None
            c.param = own or DEFAULT_PARAM
        if not c.batch_size:
            c.batch_size = 64 if (c.model == "vgg19" and c.mode == "joint") else 128
        return c

    def validate(self) -> PruneConfig:
        """Raise :class:`PBInputError` (one line: the problem and the fix) on the first bad
        setting; nothing is trained or loaded before this passes."""
        c = self
        check_spec(c.model)
        if c.data and c.dataset != ARRAYS:
            raise PBInputError(f"--data gives the data and --dataset {c.dataset} names another "
                               "data set; give one of them")
        if not c.dataset:
            raise PBInputError(f"--model {c.model} has no data set of its own; give your data "
                               "with --data FILE.npz, or --dataset mnist or cifar10 with "
                               "--data-dir")
        if c.dataset not in (*datamod.DATASETS, ARRAYS) or (c.dataset == ARRAYS
                                                            and not c.data):
            raise PBInputError(f"unknown dataset {c.dataset!r}; choose one of "
                               f"{', '.join(datamod.DATASETS)}, or give --data FILE.npz")
        if c.model in MODEL_DATA and c.dataset in datamod.DATASETS \
                and c.dataset != MODEL_DATA[c.model]:
            raise PBInputError(f"{c.model} takes {MODEL_DATA[c.model]} inputs, not {c.dataset}; "
                               f"use --dataset {MODEL_DATA[c.model]}")
        if c.loss not in LOSSES and not is_import_path(c.loss):
            raise PBInputError(f"unknown --loss {c.loss!r}; choose ce, mse, or your own "
                               "function as package.module:function")
        if c.data and c.synthetic:
            raise PBInputError("--synthetic draws random images in place of --data; give one "
                               "of them")
        if c.mode not in MODES:
            raise PBInputError(f"unknown mode {c.mode!r}; choose one of {', '.join(MODES)}")
        if c.method not in prune_methods():
            raise PBInputError(f"unknown method {c.method!r}; choose one of "
                               f"{', '.join(prune_methods())}")
        family = c.family
        if f"prune-{c.mode}" not in family.caps.commands:
            modes = [m for m in MODES if f"prune-{m}" in family.caps.commands]
            raise PBInputError(f"{family.text} does not run in --mode {c.mode}; use --mode "
                               f"{' or '.join(modes)}")
        if c.param not in PARAMETRIZATIONS:
            raise PBInputError(f"unknown parametrization {c.param!r}; choose one of "
                               f"{', '.join(PARAMETRIZATIONS)}")
        if not (isinstance(c.lam, (int, float)) and math.isfinite(c.lam) and c.lam >= 0):
            raise PBInputError(f"--lam is an L0 strength and must be >= 0, got {c.lam}; give a "
                               "finite --lam >= 0")
        if c.mask_opt not in MASK_OPTIMIZERS:
            raise PBInputError(f"unknown mask optimizer {c.mask_opt!r}; choose one of "
                               f"{', '.join(MASK_OPTIMIZERS)}")
        for name in ("mask_lr", "lr"):
            v = getattr(c, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise PBInputError(f"--{name.replace('_', '-')} must be a positive number, "
                                   f"got {v}; give a finite rate > 0")
        family.check_prune(c)
        c.settings = c.own_settings()  # built once, checked with the method's config below
        if not isinstance(c.epochs, int) or c.epochs < 1:
            raise PBInputError(f"--epochs must be a positive integer, got {c.epochs}; give 1 "
                               "or more")
        if c.batch_size < 1:
            raise PBInputError(f"--batch-size must be positive, got {c.batch_size}; give 1 or "
                               "more (0: the default)")
        if c.init not in NETWORK_INITS:
            raise PBInputError(f"unknown init {c.init!r}; choose one of "
                               f"{', '.join(NETWORK_INITS)}")
        for name in ("prune_at", "gmp_start", "gmp_end"):
            if not 0 <= getattr(c, name) <= 1:
                raise PBInputError(f"--{name.replace('_', '-')} is a fraction of training in "
                                   f"[0, 1], got {getattr(c, name)}; give a value from 0 to 1")
        if c.gmp_end < c.gmp_start:
            raise PBInputError(f"--gmp-end {c.gmp_end} comes before --gmp-start {c.gmp_start}; "
                               "give --gmp-end >= --gmp-start")
        if c.eval_masks < 1 or c.eval_batches < 1:
            raise PBInputError("--eval-masks and --eval-batches must be >= 1; give 1 or more")
        if c.gmp_every < 1 or c.chunk < 0 or c.max_batches < 0 or c.synthetic < 0:
            raise PBInputError("--gmp-every must be >= 1 and --chunk, --max-batches, "
                               "--synthetic >= 0; give such values (0: off)")
        c.method_config()  # the method's own rules (n, parametrization, its settings), once
        if not (isinstance(c.lam_target, (int, float)) and 0 <= c.lam_target <= 1):
            raise PBInputError(f"--lam-target is a fraction of masked weights (channels: of "
                               f"the --cost) in (0, 1] (0: off), got {c.lam_target}; give e.g. "
                               f"--lam-target 0.05 for 5% of the masked weights")
        if c.lam_target and not steers_lam(family):
            raise PBInputError(f"--lam-target steers the L0 strength of "
                               f"{', '.join(n for n, f in REGISTRY.items() if steers_lam(f))}; "
                               f"{family.text} has none to steer (use --target for MP, GMP "
                               "and edge-popup)")
        if c.lam_target and not c.lam > 0:
            raise PBInputError("--lam-target starts from --lam and scales it; give --lam > 0")
        if not (isinstance(c.budget, (int, float)) and 0 <= c.budget <= 1):
            raise PBInputError(f"--budget is a fraction of masked weights (channels: of the "
                               f"--cost) in (0, 1] (0: off), got {c.budget}; give e.g. "
                               f"--budget 0.25")
        if c.budget and not (steers_lam(family) and c.mode == "joint"):
            raise PBInputError(f"--budget cuts the mask that a joint run of an L0 method "
                               f"({', '.join(n for n, f in REGISTRY.items() if steers_lam(f))})"
                               f" freezes for its last epochs, not a {c.mode} run of "
                               f"{family.text}; use --mode joint with one of them (--target "
                               "for MP, GMP and edge-popup)")
        c.check_granularity()
        return c

    def check_granularity(self) -> None:
        """Refuse (one line) an unknown ``--granularity`` or ``--cost``, and channel
        granularity with a method, setting or installation that does not take it."""
        c = self
        if c.granularity not in GRANULARITIES:
            raise PBInputError(f"unknown --granularity {c.granularity!r}; choose one of "
                               f"{', '.join(GRANULARITIES)}")
        if c.cost not in COSTS:
            raise PBInputError(f"unknown --cost {c.cost!r}; choose one of {', '.join(COSTS)}")
        if c.granularity != "channel":
            return
        if not c.family.caps.pruning.channels:
            able = ", ".join(n for n in prune_methods() if REGISTRY[n].caps.pruning.channels)
            raise PBInputError(f"--granularity channel runs with {able}; use --granularity "
                               f"weight for {c.family.text}")
        if importlib.util.find_spec("torch_pruning") is None:
            raise PBInputError("--granularity channel needs Torch-Pruning, which is not "
                               "installed; pip install 'pbnn[structured]' (or torch-pruning)")

    @property
    def trains_weights(self) -> bool:
        """Whether the run trains the network's weights: joint mode, or a family that trains
        them in every mode (dense)."""
        return self.mode == "joint" or self.family.caps.pruning.dense_weights

    @property
    def family(self) -> Family:
        """The method's family in the registry (:mod:`pbscale.methods.registry`)."""
        return REGISTRY[self.method]

    def own_settings(self) -> Settings:
        """The method's own settings (:class:`pbscale.methods.registry.Settings`):
        :attr:`settings` itself once :meth:`validate` built it, else built from the dict; an
        unknown one is a one-line :class:`PBInputError`."""
        family = self.family
        if isinstance(self.settings, family.Settings):
            return self.settings
        return family.Settings.build(dict(self.settings), family.text)

    def method_config(self) -> MethodConfig:
        """The :class:`MethodConfig` of the run's method (its logits' optimizer, samples and
        parametrization; n as :func:`pruning_n` says, one that takes only the sigmoid gets
        it; validated as it is made), made once per distinct set of the fields it reads (a
        copy with other values makes its own)."""
        family = self.family
        key = (self.method, pruning_n(family, self.n),
               self.param if family.caps.any_param else "sigmoid", self.mask_lr, self.mask_opt,
               self.seed, self.chunk or None, self.lam, self.own_settings())
        cached = self.__dict__.get("_method_config")
        if cached is None or cached[0] != key:
            method, n, param, lr, opt, seed, chunk, lam, settings = key
            cached = (key, MethodConfig(method=method, n=n, param=param, lr=lr, optimizer=opt,
                                        seed=seed, chunk=chunk, lam=lam,
                                        settings=settings))
            self.__dict__["_method_config"] = cached
        return cached[1]

    def method_settings(self) -> list[str]:
        """The settings of :meth:`hashed` that depend on the method and that this run's method
        reads (config.json's "method_info"), in field order: :func:`method_reads`."""
        return method_reads(self.family)

    def hashed(self) -> dict:
        """The settings that define the run and that it reads, each once under its option's
        name (config.json's "task" of :data:`CONFIG_FORMAT` 2): :meth:`legacy_hashed` without
        the fields of :meth:`unused`, the method's own settings that differ from their defaults
        under their options' names (``cp_final_tau``, as ``--cp-final-tau`` and the sweep key;
        format 1 nested them under "settings")."""
        d = self.legacy_hashed()
        for k in self.unused():
            d.pop(k, None)
        own = d.pop("settings", {})
        d.update({option_dest(self.method, k): v for k, v in own.items()})
        return d

    def legacy_hashed(self) -> dict:
        """The run's "task" as config.json format 1 hashed it (every field but where its data
        lives, read or not): what a run folder made before format 2 is named by
        (:func:`pbscale.runs.records.chosen_config` finds it)."""
        d = asdict(self)
        d.pop("data_dir")
        d.pop("data")
        for f in fields(self):
            if f.metadata.get("hash") == "changed" and d[f.name] == f.default:
                d.pop(f.name)
        own = self.own_settings().differing()
        d.pop("settings")
        if own:
            d["settings"] = own
        return d

    def ignored(self, given: Collection[str]) -> list[str]:
        """The options named on the command line (``given``: dests) that this run does not
        read: fields of :meth:`unused`, and other methods' own settings
        (:func:`pbscale.methods.options.foreign`)."""
        return [k for k in self.unused() if k in given] + foreign(given, self.method,
                                                                   PRUNE_COMMANDS)

    def ignored_warning(self, ignored: list[str]) -> str:
        """One ``warning:`` line naming the flags given for ``ignored`` (fields of
        :meth:`unused`) that this run does not read, with a hint where one applies."""
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in ignored)
        hints = "".join(f"; {IGNORED_HINTS[k]}" for k in ignored if k in IGNORED_HINTS)
        return (f"warning: {self.family.text} ({self.mode}, {self.model}) does not use "
                f"{flags}: ignored (config.json lists it under \"ignored\"){hints}")

    def unused(self) -> list[str]:
        """The fields of :meth:`hashed` that this run's method, mode and model do not read
        (config.json's "info" lists them as "unused"; they stay in the hashed "task" so that
        run folders keep their names), from the settings its family uses
        (:attr:`pbscale.methods.registry.Capabilities.uses`): --n only where it names n and
        ``prune_n`` does not fix it (config.json's "method" records the n and parametrization a
        method runs with); the
        others' evaluation samples no masks unless they also report sampled masks; the mask
        optimizer, learning rate, chunk and L0 weight (:data:`SHARED_FIELDS`) and the cut
        schedule are read by the methods that name them; supermask runs other than dense train
        no weights."""
        family = REGISTRY[self.method]
        reads = method_reads(family)
        out = [k for k in METHOD_DEPENDENT if k not in reads and k not in SET_ONLY]
        caps = family.caps
        if self.mode == "supermask" and not caps.pruning.dense_weights:
            out.append("lr")
        if self.masked or getattr(MODELS.get(self.model), "shortcut_marker", None) is None:
            out.append("mask_shortcuts")
        if self.masked:
            out.append("mask_head")
        if self.granularity == "channel":  # the head is never pruned, shortcuts are coupled
            out += [k for k in ("mask_head", "mask_shortcuts") if k not in out]
        elif self.cost != COSTS[0]:  # read by channel granularity only (hashed when set)
            out.append("cost")
        return out
