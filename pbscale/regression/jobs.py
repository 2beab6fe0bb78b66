"""What ``python -m pbscale.regress`` tells a sweep about its runs (the job interface of
:mod:`pbscale.sweep.jobs`): each run's check before anything trains (:func:`check_options`)
and how runs that differ only in seed and learning rate train as one regression group
(:data:`GROUPING`, :mod:`pbscale.regression.group`); also a run's :class:`MethodConfig` from
parsed options (:func:`method_config`), which the commands share."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pbscale.methods import MethodConfig, names
from pbscale.methods.options import options, settings_of
from pbscale.regression.group import member_key
from pbscale.runs.jobs import Grouping, listed_values

__all__ = ["GROUPING", "GROUP_COMMANDS", "SHARED", "check_options", "group_argv", "groupable",
           "method_config", "own_options"]


def method_config(options: Mapping[str, Any]) -> MethodConfig:
    """The run's :class:`MethodConfig` from parsed ``options`` (the parser's dests), validated
    as it is made."""
    o = options
    return MethodConfig(method=o["method"], n=o["n"], param=o["param"], lr=o["lr"],
                        optimizer=o["optimizer"], seed=o["seed"], chunk=o["chunk"],
                        lam=o["lam"], settings=settings_of(dict(o), o["method"]))


def check_options(options: Mapping[str, Any], given: Collection[str] = ()) -> None:
    """Refuse (one-line :class:`PBInputError`) the options of one run (the parser's dests,
    defaults filled in, as a sweep holds them) that the run itself refuses before it trains:
    its method's configuration (:func:`method_config`), one per learning rate of an ``lr``
    list. A sweep checks every run with it before it launches one (:mod:`pbscale.sweep.file`)."""
    for lr in listed_values(options["lr"]):
        method_config({**options, "lr": lr})


#: The ``pbscale.regress`` options a group takes once (the others, seed and lr, as lists; and
#: the methods' own settings, :func:`own_options`).
SHARED = ("method", "n", "param", "optimizer", "epochs", "data_seed", "lam", "device")
#: The registry's command of regression groups (a method claims it to train in one).
GROUP_COMMANDS = ("regress-group",)


def own_options() -> list[str]:
    """The dests of the methods' own settings a group takes (:mod:`pbscale.methods.options`)."""
    return [o.dest for o in options(GROUP_COMMANDS)]


def groupable(full: dict) -> bool:
    """Whether a ``pbscale.regress`` run (every option filled in) can train in a group: a
    method of ``names("regress-group")``, no chunk of its own, one seed and one learning rate
    (not a group itself), no option a group does not take."""
    return (full.get("method") in names(*GROUP_COMMANDS) and full.get("chunk") is None
            and full.get("seeds") is None and not isinstance(full.get("lr"), list)
            and set(full) <= {*SHARED, *own_options(), "seed", "seeds", "lr", "chunk"})


def group_argv(full: dict, values: Mapping[str, Sequence],
               defaults: Mapping[str, object] | None = None) -> list[str]:
    """The options of the group of seeds x lrs (``values["seed"]``, ``values["lr"]``) whose
    shared options are ``full``'s (the methods' own settings among them where set; every one
    spelled out, so ``defaults`` is not read)."""
    args: list[str] = []
    for key in [*SHARED, *(k for k in own_options() if k in full)]:
        args += ["--" + key.replace("_", "-"), str(full[key])]
    return [*args, "--lr", ",".join(repr(float(v)) for v in values["lr"]),
            "--seeds", ",".join(str(int(v)) for v in values["seed"])]


#: How ``pbscale.sweep`` groups ``regress`` runs (:class:`pbscale.sweep.jobs.Grouping`).
GROUPING = Grouping("pbscale.regress", SHARED, groupable, group_argv,
                    lambda full: member_key(full["seed"], full["lr"]))
