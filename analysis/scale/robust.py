"""How firm each verdict of the claims study is: every claim under the reported reading and
under each of :data:`analysis.scale.runs.READINGS`, each varying one real choice of the
criterion (the accuracy floor, step against interpolated fronts, the grid, leaving one setting
out, pairing the seeds, balanced seeds).

A reading **acts** on a claim when it changes the claim's numbers; one that gives exactly the
reported numbers could not have changed the verdict and reads n/a. A row is **robust** when
every reading that acts on it gives its verdict, **fragile** otherwise, and **unjudged** when
neither the reported reading nor any other has data for it (:class:`Judged`). "Leave one setting
out" judges the claim again without each setting of its experiment in turn; it reads the first
outcome that differs from the reported one, and names the setting.

:func:`by_study` sets the pruning rows of several studies (e.g. 4 and 20 epochs) side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from analysis.microworld.claims import Verdict
from analysis.scale.claims import SCALE_CLAIMS, ScaleClaim
from analysis.scale.fronts import recording
from analysis.scale.runs import (
    AS_REPORTED,
    MISSING,
    READINGS,
    Reading,
    RunRecord,
    leaves,
    setting_text,
)

ROBUST, FRAGILE, UNJUDGED = "robust", "fragile", "unjudged"


@dataclass(frozen=True)
class Judged:
    """A claim's verdict as reported, and its outcome under each reading of ``readings``
    (reading key -> outcome; None where the reading does not act on the claim), with a note per
    reading where it says more than its outcome (the setting whose omission changes it)."""

    claim: ScaleClaim
    verdict: Verdict
    readings: dict[str, str | None]
    notes: dict[str, str] = field(default_factory=dict)

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


def numbers(v: Verdict) -> list:
    """What a verdict's numbers are, to tell whether a reading changed them: every part's
    values (rounded off to 1e-12)."""
    return [(name, sorted((k, round(float(x), 12)) for k, x in pv.values.items()))
            for name, pv in leaves(v)]


def left_out(claim: ScaleClaim, records: Sequence[RunRecord], verdict: Verdict
             ) -> tuple[str | None, str]:
    """"Leave one setting out": the claim without each setting of its experiment in turn. None
    when no omission changes its numbers; else the first outcome that differs from the
    reported one (the reported outcome when none does) and a note naming the settings that
    change it."""
    mine = [r for r in records if r.experiment == claim.experiment]
    with recording() as compared:
        claim.evaluate(records, AS_REPORTED)
    read = {k for a, b, _ in compared for k in (*a.names, *b.names)}
    # a front claim reads only the settings of the fronts it compares; the others read all
    settings = [k for k in dict.fromkeys(r.setting for r in mine) if not read or k in read]
    acted, flips = False, []
    for key in settings:
        v = claim.evaluate([r for r in records if r.setting != key], AS_REPORTED)
        if numbers(v) == numbers(verdict):
            continue
        acted = True
        if v.outcome not in (verdict.outcome, MISSING):  # a group left with no setting: no data
            name = setting_text(next(r for r in mine if r.setting == key))
            flips.append((v.outcome, name))
    if not acted:
        return None, ""
    if not flips:
        return verdict.outcome, ""
    return flips[0][0], "; ".join(f"without {name}: {o}" for o, name in flips)


def judge_claim(claim: ScaleClaim, records: Sequence[RunRecord],
                readings: Sequence[Reading] = READINGS) -> Judged:
    verdict = claim.evaluate(records, AS_REPORTED)
    out: dict[str, str | None] = {}
    notes: dict[str, str] = {}
    for r in readings:
        if r.leave_out:
            out[r.key], note = left_out(claim, records, verdict)
            if note:
                notes[r.key] = note
            continue
        v = claim.evaluate(records, r)
        out[r.key] = None if numbers(v) == numbers(verdict) else v.outcome
    return Judged(claim, verdict, out, notes)


def judge(records: Sequence[RunRecord], experiments: Sequence[str] | None = None,
          readings: Sequence[Reading] = READINGS) -> list[Judged]:
    """Every claim (of ``experiments``, default all) as reported and under each reading."""
    return [judge_claim(c, records, readings) for c in SCALE_CLAIMS
            if experiments is None or c.experiment in experiments]


def training_length_claims() -> list[ScaleClaim]:
    """The rows a study of another training length re-runs: the paper's supermask and joint
    pruning rows (1-8) and the rows beyond the paper (12-14)."""
    return [c for c in SCALE_CLAIMS if c.experiment != "regression"]


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
             judged: dict[str, Sequence[Judged]] | None = None,
             readings: Sequence[Reading] = READINGS) -> list[StudyRow]:
    """Rows 1-8 and 12-14 judged in each study (name, records), in the order given; ``judged``:
    studies already judged, by name (not judged again)."""
    done = {name: {j.claim.key: j for j in js} for name, js in (judged or {}).items()}
    rows = []
    for claim in training_length_claims():
        rows.append(StudyRow(claim, tuple(
            (name, epochs_text(records, claim.experiment),
             done.get(name, {}).get(claim.key) or judge_claim(claim, records, readings))
            for name, records in studies)))
    return rows
