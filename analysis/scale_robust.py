"""How firm each verdict of the claims study is: every claim under the reported reading and
under each of :data:`analysis.scale_runs.READINGS` (another accuracy floor, balanced seeds, the
pooled s.e. without collapsed or stalled settings, a bootstrap s.e.). A row is **robust** when
every reading that acts on it gives its verdict, **fragile** otherwise, and **unjudged** when
neither the reported reading nor any other has data for it (:class:`Judged`).

:func:`by_study` sets the pruning rows of several studies (e.g. 4 and 20 epochs) side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from analysis.claims import Verdict
from analysis.scale_claims import SCALE_CLAIMS, ScaleClaim
from analysis.scale_fronts import pooled_sd
from analysis.scale_runs import (
    AS_REPORTED,
    MISSING,
    READINGS,
    Reading,
    RunRecord,
    points,
    select,
)

ROBUST, FRAGILE, UNJUDGED = "robust", "fragile", "unjudged"


@dataclass(frozen=True)
class Judged:
    """A claim's verdict as reported, and its outcome under each reading of ``readings``
    (reading key -> outcome; None where the reading does not act on the claim)."""

    claim: ScaleClaim
    verdict: Verdict
    readings: dict[str, str | None]

    @property
    def robust(self) -> bool:
        return all(o == self.verdict.outcome for o in self.readings.values() if o is not None)

    @property
    def judged(self) -> bool:
        """Whether any reading has data for the claim (else it is unjudged)."""
        return any(o not in (None, MISSING) for o in (self.verdict.outcome,
                                                      *self.readings.values()))

    @property
    def robustness(self) -> str:
        if not self.judged:
            return UNJUDGED
        return ROBUST if self.robust else FRAGILE

    def disagreeing(self) -> list[str]:
        """The readings whose outcome differs from the reported one."""
        return [k for k, o in self.readings.items()
                if o is not None and o != self.verdict.outcome]


def for_experiment(reading: Reading, records: Sequence[RunRecord], experiment: str) -> Reading:
    """The reading with what it borrows from an experiment's runs filled in: with
    ``borrow_sd``, the pooled seed s.d. of accuracy over the experiment's settings of several
    seeds (none: the fixed fallback stays)."""
    if not reading.borrow_sd:
        return reading
    sd, known = pooled_sd(points(select(records, experiment)))
    return replace(reading, fallback_sd=sd if known else None)


def judge_claim(claim: ScaleClaim, records: Sequence[RunRecord],
                readings: Sequence[Reading] = READINGS) -> Judged:
    verdict = claim.evaluate(records, AS_REPORTED)
    return Judged(claim, verdict, {
        r.key: claim.evaluate(records, for_experiment(r, records, claim.experiment)).outcome
        if claim.applies(r) else None for r in readings})


def judge(records: Sequence[RunRecord], experiments: Sequence[str] | None = None,
          readings: Sequence[Reading] = READINGS) -> list[Judged]:
    """Every claim (of ``experiments``, default all) as reported and under each reading."""
    return [judge_claim(c, records, readings) for c in SCALE_CLAIMS
            if experiments is None or c.experiment in experiments]


def training_length_claims() -> list[ScaleClaim]:
    """The rows a study of another training length re-runs: the paper's supermask and joint
    pruning rows (1-8)."""
    return [c for c in SCALE_CLAIMS if not c.beyond and c.experiment != "regression"]


def epochs_text(records: Sequence[RunRecord], experiment: str) -> str:
    """The epochs a study's runs of an experiment were trained for: ``4 ep``, ``10/20 ep``;
    ``not run``."""
    epochs = sorted({int(r.get("epochs")) for r in records if r.experiment == experiment
                     and r.get("epochs") is not None})
    return f"{'/'.join(map(str, epochs))} ep" if epochs else "not run"


@dataclass(frozen=True)
class StudyRow:
    """One claim in several studies: (study name, the runs' epochs, judged) per study."""

    claim: ScaleClaim
    cells: tuple[tuple[str, str, Judged], ...]

    @property
    def compared(self) -> bool:
        """Whether at least two studies have data for the claim."""
        return sum(j.verdict.outcome != MISSING for _, _, j in self.cells) >= 2

    @property
    def changed(self) -> bool:
        """Whether the studies with data for the claim disagree on its outcome."""
        return len({j.verdict.outcome for _, _, j in self.cells} - {MISSING}) > 1


def by_study(studies: Sequence[tuple[str, Sequence[RunRecord]]],
             readings: Sequence[Reading] = READINGS) -> list[StudyRow]:
    """Rows 1-8 judged in each study (name, records), in the order given."""
    rows = []
    for claim in training_length_claims():
        rows.append(StudyRow(claim, tuple(
            (name, epochs_text(records, claim.experiment),
             judge_claim(claim, records, readings)) for name, records in studies)))
    return rows
