"""Error control over a whole report (`tab:app_results_summ`): each front comparison is judged at
95% (:func:`analysis.scale.front_verdict.compare_fronts`), and a report makes many (13 in the
20-epoch study), so some would read holds or fails by chance alone; a row of several parts that
"fails" when any part fails would do so more often the more parts it has.

The family is every front comparison of the report (the parts of rows 1-5, 8 and 12-14 whose
numbers carry a p-value). Holm's step-down rule (Holm 1979) keeps the chance of one or more false
holds or fails in the family at most 5%: with the m p-values sorted, p_(1) <= ... <= p_(m), the
part of rank i is decided when p_(j) <= 0.05 / (m - j + 1) for every j <= i; its adjusted p-value
is max_(j <= i) min(1, (m - j + 1) p_(j)). A part decided by its own interval but not by Holm's
rule reads noise family-wise; a row's family-wise verdict combines its parts' as the row does
(:func:`analysis.scale.runs.combine`). The rows judged by other criteria (6, 7, 9-11) are outside
the family and keep their verdicts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.microworld.claims import FAILS, HOLDS, NOISE, Verdict
from analysis.scale.gap_test import LEVEL
from analysis.scale.robust import Judged
from analysis.scale.runs import combine, leaves

#: The family-wise error rate Holm's rule keeps (that of one part's interval).
ALPHA = 1 - LEVEL


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's adjusted p-values, in the order given (a part is decided at level ALPHA when its
    adjusted p-value is at most ALPHA)."""
    p = np.asarray(p_values, dtype=float)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


@dataclass(frozen=True)
class FamilyPart:
    """One front comparison of the family: its row (claim key), part name, outcome as judged
    alone, p-value, Holm's adjusted p-value and the family-wise outcome."""

    claim: str
    part: str
    outcome: str
    p_value: float
    adjusted: float
    family_outcome: str


@dataclass(frozen=True)
class Family:
    """Every part of the family (:class:`FamilyPart`) and each row's family-wise verdict (claim
    key -> outcome; rows outside the family keep theirs)."""

    parts: tuple[FamilyPart, ...]
    rows: dict[str, str]

    def part(self, claim: str, name: str) -> FamilyPart | None:
        return next((p for p in self.parts if p.claim == claim and p.part == name), None)


def family_wise(judged: Sequence[Judged],
                adjust: Callable[[Sequence[float]], np.ndarray] = holm) -> Family:
    """Holm's rule (``adjust``: the p-value adjustment) over every front comparison of the
    judged rows (module docstring)."""
    found = [(j.claim.key, name, v) for j in judged for name, v in leaves(j.verdict)
             if "p_value" in v.values]
    adjusted = adjust([v.values["p_value"] for _, _, v in found])
    parts = []
    for (key, name, v), adj in zip(found, adjusted):
        keep = v.outcome not in (HOLDS, FAILS) or adj <= ALPHA
        parts.append(FamilyPart(key, name, v.outcome, float(v.values["p_value"]), float(adj),
                                v.outcome if keep else NOISE))
    decided = {(p.claim, p.part): p.family_outcome for p in parts}
    rows = {}
    for j in judged:
        leaf = leaves(j.verdict)
        if not any((j.claim.key, name) in decided for name, _ in leaf):
            rows[j.claim.key] = j.verdict.outcome
            continue
        rows[j.claim.key] = combine([
            (name, Verdict(decided.get((j.claim.key, name), v.outcome), "", {}))
            for name, v in leaf]).outcome
    return Family(tuple(parts), rows)
