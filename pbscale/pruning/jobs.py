"""What ``python -m pbscale.prune`` tells a sweep about its runs (the job interface of
:mod:`pbscale.sweep.jobs`): how runs that differ only in seed, lam and mask learning rate train
as one pruning group (:data:`GROUPING`), each run's check before anything trains
(:func:`check_options`) and what a run would record of the user's files (:func:`run_identity`);
also how parsed options become :class:`pbscale.pruning.config.PruneConfig` fields
(:func:`config_fields`), which the command shares."""

from __future__ import annotations

import functools
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pbscale.methods.options import settings_of
from pbscale.nets import user_data
from pbscale.nets.network import source_digest, source_file
from pbscale.pruning.config import PruneConfig
from pbscale.pruning.group import member_key
from pbscale.pruning.run import GROUP_FREE
from pbscale.runs.jobs import Grouping, Identity, listed_values

__all__ = ["GROUPING", "check_options", "config_fields", "group_argv", "run_identity"]


#: Options a sweep never passes to a group's child (its own, or the grid axes).
_NOT_SHARED = (*GROUP_FREE, "seeds", "out", "threads", "quiet", "download", "download_url",
               "help")


def group_argv(full: dict, values: Mapping[str, Sequence],
               defaults: Mapping[str, object]) -> list[str]:
    """The options of the group of the product of ``values`` (:data:`GROUP_FREE`: seeds, lams,
    mask learning rates) whose other options are ``full``'s: each option that differs from its
    default (``defaults``: the parser's, by dest), as the sweep names a run (a default spelled out
    is the default left out; so is a lam list of the default alone, which a method without L0
    strength never reads)."""
    args: list[str] = []
    for key, value in full.items():
        if key in _NOT_SHARED or value == defaults.get(key) or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    lams = [float(v) for v in values["lam"]]
    if lams != [defaults["lam"]]:
        args += ["--lam", ",".join(map(repr, lams))]
    return [*args, "--seeds", ",".join(str(int(v)) for v in values["seed"]),
            "--mask-lr", ",".join(repr(float(v)) for v in values["mask_lr"])]


#: How ``pbscale.sweep`` groups ``prune`` runs (:class:`pbscale.sweep.jobs.Grouping`): runs
#: that differ only in seed, lam and mask learning rate train as one pruning group (with
#: ``--lam-target``, each member steers its own lam).
GROUPING = Grouping("pbscale.prune", (), lambda full: True, group_argv, member_key,
                    axes=GROUP_FREE)


def config_fields(options: Mapping[str, Any], given: Collection[str]) -> dict:
    """The :class:`PruneConfig` fields of parsed ``options`` (the parser's dests), the method's
    own settings gathered, ``param`` left to the method's default unless ``given``; ``lam`` and
    ``mask_lr`` as the parser holds them (a value or a list: one run of a group each)."""
    fields = {k: v for k, v in options.items() if k in PruneConfig.__dataclass_fields__}
    fields["settings"] = settings_of(dict(options), options["method"])
    if "param" not in given:  # left out: the method's own default (PruneConfig.resolved)
        fields["param"] = ""
    return fields


@functools.lru_cache(maxsize=64)
def _file_data_id(path: str, stamp: tuple[int, int]) -> str | None:
    """The ``data_id`` a run of the data file ``path`` records (``stamp``: its modification
    time and size, so that an edited file is read again), None where it cannot be read."""
    try:
        return user_data.data_id(user_data.read_npz(path))
    except (OSError, ValueError):  # PBInputError is a ValueError: the run says why
        return None


def run_identity(options: Mapping[str, Any]) -> list[Identity]:
    """What a run of ``options`` (the parser's dests, defaults filled in, as a sweep holds
    them) would record now of the user's files (:class:`pbscale.sweep.jobs.Identity`): the
    ``--data`` file's ``data_id`` (config.json's "task": the arrays' fingerprint) and the
    digest of the module file ``--model package.module:factory`` names ("info"
    ``network_source``, :func:`pbscale.nets.network.source_digest`: the file read as bytes,
    never imported)."""
    out = []
    data, model = options.get("data"), options.get("model")
    if isinstance(data, str) and data:
        try:
            st = os.stat(data)
            value = _file_data_id(os.path.abspath(data), (st.st_mtime_ns, st.st_size))
        except OSError:
            value = None
        out.append(Identity("data", data, ("task", "data_id"), value))
    if isinstance(model, str) and ":" in model:
        out.append(Identity("network", source_file(model) or model,
                            ("info", "network_source"), source_digest(model)))
    return out


def check_options(options: Mapping[str, Any], given: Collection[str] = ()) -> None:
    """Refuse (one-line :class:`PBInputError`) the options of one run (the parser's dests,
    defaults filled in, as a sweep holds them; ``given``: those set) that the run itself
    refuses before it trains: each of its configurations (a lam or mask-lr list makes several),
    resolved and validated as ``python -m pbscale.prune`` does (:meth:`PruneConfig.validate`:
    fractions such as --lam-target in [0, 1], the method's own settings such as --cp-final-tau
    in (0, 1]).
    A sweep checks every run with it before it launches one (:mod:`pbscale.sweep.file`)."""
    fields = config_fields(options, given)
    lams, lrs = listed_values(fields.pop("lam")), listed_values(fields.pop("mask_lr"))
    for lam in lams:
        for lr in lrs:
            PruneConfig(**fields, lam=lam, mask_lr=lr).resolved().validate()
