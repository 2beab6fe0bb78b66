"""``python -m analysis.pareto --overlay``: the items it takes (:func:`parse_overlay`) and the
(mode, label) series of the runs they name (:func:`overlay_selection`), drawn on shared axes by
:func:`analysis.scale.pareto_plots.plot_overlay`.
"""

from __future__ import annotations

import argparse

from pbexact.errors import PBInputError


def parse_overlay(text: str) -> list[tuple[str, str | None]]:
    """``--overlay``: ``all``, or comma-separated ``MODE`` or ``MODE:LABEL`` items (e.g.
    ``supermask:cp,joint:gmp``) -> [(mode, label or None for every label of the mode)]; ``all``
    is ``[]``."""
    text = text.strip()
    parts = [part.strip() for part in text.split(",")]
    if "all" in parts:  # all, alone or beside other items, is every series
        return []
    items: list[tuple[str, str | None]] = []
    for part in parts:
        mode, _, lab = part.partition(":")
        if not mode or (":" in part and not lab):
            raise argparse.ArgumentTypeError(
                f"expected all or MODE[:LABEL],... such as supermask:cp,joint:gmp, got {text!r}")
        if (mode, lab or None) not in items:
            items.append((mode, lab or None))
    return items


def overlay_selection(points: list[dict], items: list[tuple[str, str | None]]
                      ) -> list[tuple[str, str]]:
    """The (mode, label) series an ``--overlay`` names, in its order (``all``: every one; a
    label split by budget is named by its label or its series, ``cp`` for ``cp-e2`` and
    ``cp-e3``); an item that matches no run is a :class:`PBInputError` listing the ones there
    are."""
    have = sorted({(p["mode"], p["label"]) for p in points})
    series = {(p["mode"], p["label"]): p["series"] for p in points}
    if not items:
        return have
    out: list[tuple[str, str]] = []
    for mode, lab in items:
        match = [h for h in have if h[0] == mode and (lab is None or lab in (h[1], series[h]))]
        if not match:
            raise PBInputError(
                f"--overlay {mode}{':' + lab if lab else ''} matches no run; the runs have "
                f"{', '.join(f'{m}:{la}' for m, la in have)}")
        out += [m for m in match if m not in out]
    return out
