"""Whether a finished sweep run was trained on the files its options name now.

A sweep names a run by its options, and these stay the same when the user edits a data file
or a network's module in place; the run's command, given the same options, then trains a new
run folder (the folder's hash holds the data's identity and the network's), but the sweep would
find the old folder by its sweep id and call the run finished. So the sweep compares: for each
finished run, what its command would record now of the user's files (the job interface's
``run_identity``, :class:`pbscale.sweep.jobs.Identity`: for ``prune``, the ``--data`` file's
``data_id`` and the digest of the ``--model`` module's file, read as bytes and never imported)
against what its run folder's config.json records. A run that differs is *changed*: its
results are the old file's. The sweep says so in one line with the choice: ``sweep run
--rerun-changed`` launches them again (each child trains a new run folder beside the old one
where its data or network really differs; for an edited module it builds the network and
reads back the old folder where the network is the same), ``--keep-changed`` keeps the old
runs. The choice is kept in the run's record (``identity``: what its options named when it was
launched or kept), so it is asked once per change.

Where several run folders hold one sweep run (the old data's and the new), the one whose
recorded identity is what the options name now is the run's (:func:`chooser`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pbscale.runs import io

from . import jobs
from .file import Run, Sweep


@dataclass(frozen=True)
class Change:
    """A finished ``run`` whose run ``folder`` records another identity of a file than the
    run's options name now: ``what`` ("data", "network"), the file's ``name``, the identity
    in the folder (``then``) and now (``now``)."""

    run: Run
    folder: Path
    what: str
    name: str
    then: str
    now: str


def recorded(folder: Path, where: tuple[str, str]) -> str | None:
    """The value a run folder's config.json holds at ``where`` (section, key), None where it
    holds none (a run written before it was recorded, a damaged file)."""
    try:
        cfg = io.read_json(folder / "config.json")
    except (OSError, ValueError):
        return None
    part = cfg.get(where[0]) if isinstance(cfg, dict) else None
    value = part.get(where[1]) if isinstance(part, dict) else None
    return value if isinstance(value, str) else None


class Identities:
    """What each run of ``sweep`` would record now of the user's files (:func:`now`), each run
    asked once."""

    def __init__(self, sweep: Sweep) -> None:
        self.ask = jobs.identity(sweep.command)
        self._now: dict[str, list[jobs.Identity]] = {}

    def now(self, run: Run) -> list[jobs.Identity]:
        if self.ask is None:
            return []
        if run.id not in self._now:
            self._now[run.id] = [i for i in self.ask(run.full) if i.value is not None]
        return self._now[run.id]


def kept_value(record: dict | None, what: str) -> str | None:
    """The identity of ``what`` a run's record keeps (a choice made: launched or kept with it)."""
    kept = (record or {}).get("identity")
    value = kept.get(what) if isinstance(kept, dict) else None
    return value if isinstance(value, str) else None


def changes(ids: Identities, run: Run, folder: Path, record: dict | None) -> list[Change]:
    """The files on which ``run``'s ``folder`` differs from what its options name now, leaving
    out a value now that its ``record`` keeps."""
    out = []
    for i in ids.now(run):
        then = recorded(folder, i.where)
        if then is not None and then != i.value and kept_value(record, i.what) != i.value:
            out.append(Change(run, folder, i.what, i.name, then, i.value))
    return out


def identity_now(ids: Identities, run: Run) -> dict[str, str]:
    """{what: value} of what ``run`` names now: what its record keeps once it is launched or
    kept."""
    return {i.what: i.value for i in ids.now(run) if i.value is not None}


def chooser(ids: Identities, runs: Sequence[Run]) -> Callable[[str, list[Path]], Path]:
    """How the sweep picks among several run folders of one run: the one whose recorded
    identities are all what the run names now, then the one written last (its config.json's
    time), then the last by name."""
    by_id = {r.id: r for r in runs}

    def choose(run_id: str, folders: list[Path]) -> Path:
        run = by_id.get(run_id)
        now = ids.now(run) if run is not None else []

        def rank(folder: Path) -> tuple:
            try:
                when = (folder / "config.json").stat().st_mtime
            except OSError:
                when = 0.0
            same = all(recorded(folder, i.where) in (None, i.value) for i in now)
            return (same, when, folder.name)

        return max(folders, key=rank)

    return choose


def changed_line(found: Sequence[Change], total: int) -> str:
    """The problem, in one line's words: how many finished runs changed and how, with the
    identities of the first and the ids of a few."""
    runs = list(dict.fromkeys(c.run.id for c in found))
    shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    parts = []
    data = sorted({c.name for c in found if c.what == "data"})
    if data:
        parts.append(f"other data than {', '.join(data)} now hold"
                     f"{'s' if len(data) == 1 else ''}")
    nets = sorted({c.name for c in found if c.what == "network"})
    if nets:
        parts.append(f"{', '.join(nets)} as it was before an edit (the network may differ; the "
                     "sweep never runs your code to tell)")
    first = found[0]
    return (f"{len(runs)} of {total} finished runs were trained on {' and '.join(parts)} "
            f"({first.what} id {first.then} in the run folder, {first.now} now; runs {shown})")


#: The choice a changed sweep offers (the fix of its one line).
CHOICE = ("rerun them into this sweep with sweep run --rerun-changed (new run folders beside "
          "the old ones), or keep the old runs with sweep run --keep-changed")

__all__ = ["CHOICE", "Change", "Identities", "changed_line", "changes", "chooser",
           "identity_now", "kept_value", "recorded"]
