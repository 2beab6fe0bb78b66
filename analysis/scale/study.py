"""A claims study's run folders: finding the finished ones under a folder
(:func:`find_run_folders`), reading each into a :class:`~analysis.scale.runs.RunRecord`
(:func:`read_record`, :func:`load`, :func:`study_records`) and copying their small files
(:data:`SMALL_FILES`) under ``OUT/runs`` (:func:`plan_copies`, :func:`copy_small_files`), as
``python -m analysis.scale_report`` does before it judges the claims from those copies only.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from analysis.scale.outputs import Outputs, check_in_folder, inside
from analysis.scale.run_files import (
    DIVERGED,
    DamagedRun,
    DivergedRun,
    PruneRun,
    finished_or_diverged,
    read_columns,
    read_each,
    read_run,
)
from analysis.scale.runs import RunRecord
from pbexact.errors import PBInputError

#: The files of a run folder the report reads (and copies); checkpoints and masks stay behind.
SMALL_FILES = ("config.json", "metrics.csv", "history.csv", "summary.json", DIVERGED)


def check_root(root: Path, flag: str = "--runs") -> Path:
    """A folder of run folders (``--runs``, a ``--baseline`` study): it must exist and be a
    folder (one line naming ``flag`` otherwise)."""
    fix = ("pass folders holding run folders" if flag == "--runs" else
           "pass a study's --out folder (it holds runs/)")
    return check_in_folder(root, f"{flag} ", fix)


def find_run_folders(roots: Sequence[Path]) -> list[Path]:
    """Run folders that ended (``config.json`` with ``summary.json``, or with the record of a
    diverged run) at any depth under roots, sorted."""
    found: set[Path] = set()
    for root in map(check_root, roots):
        try:
            for s in root.rglob("config.json"):
                if finished_or_diverged(s.parent):
                    found.add(s.parent)
        except OSError as exc:
            raise PBInputError(f"cannot list {root} ({exc.strerror}); pass a readable "
                               "folder") from None
    return sorted(found)


def prune_record(run: PruneRun) -> RunRecord:
    """The :class:`RunRecord` of a pruning run, whose accuracy must be a number and whose
    ``metrics.csv`` must hold every epoch's layers."""
    task = run.task
    if not math.isfinite(run.metrics["test_acc"]):
        raise DamagedRun(f"final_test_acc is {run.metrics['test_acc']}, not an accuracy")
    sizes = run.sizes
    read_columns(run.folder / "metrics.csv", ["epoch", *(f"remaining_{k}" for k in sizes)])
    settings = {k: v for k, v in task.items() if k != "seed"}
    return RunRecord(task["mode"], task["method"], settings, run.seed,
                     run.metrics["remaining"], run.metrics["test_acc"], dict(run.layers),
                     sizes, info=run.info)


def read_record(folder: Path) -> RunRecord | None:
    """The :class:`RunRecord` of one finished run folder; None for folders of other tools;
    :class:`~analysis.scale.run_files.DamagedRun` with the reason for a damaged one."""
    import numpy as np

    run = read_run(folder)
    if run is None:
        return None
    if isinstance(run, DivergedRun):
        return RunRecord(run.experiment, run.method, run.settings, run.seed, info=run.info,
                         diverged=run.record)
    if isinstance(run, PruneRun):
        return prune_record(run)
    return RunRecord("regression", run.method, run.settings, run.seed,
                     final_loss=run.final_loss, epochs=np.array(run.epochs),
                     losses=np.array(run.losses), info=run.info)


def load(runs_dir: Path) -> list[tuple[RunRecord, Path]]:
    """(record, folder) of every readable run folder under runs_dir, sorted by folder; a
    damaged one is skipped with one warning line."""
    def pair(folder: Path) -> tuple[RunRecord, Path] | None:
        r = read_record(folder)
        return None if r is None else (r, folder)
    return read_each(find_run_folders([runs_dir]), pair)


def study_records(folder: Path, experiments: Sequence[str]) -> list[RunRecord]:
    """The records of a study: its ``runs/`` folder (or the folder itself when it has none)."""
    runs = folder / "runs"
    return [r for r, _ in load(runs if runs.is_dir() else check_root(folder, "--baseline"))
            if r.experiment in experiments]


def copy_names(roots: Sequence[Path]) -> dict[Path, str]:
    """The folder under OUT/runs of each --runs root (roots that resolve to one folder taken
    once): its name, or, where two roots share one, enough of their parents' names to tell them
    apart (``a-runs``, ``b-runs``)."""
    real: dict[Path, tuple[str, ...]] = {}
    for root in roots:
        parts = root.resolve().parts[1:]
        if parts not in real.values():
            real[root] = parts
    depth = dict.fromkeys(real, 1)
    while True:
        out = {r: "-".join(p[-depth[r]:]) or "root" for r, p in real.items()}
        clash = {n for n in out.values() if list(out.values()).count(n) > 1}
        if not clash:
            return out
        grow = [r for r in real if out[r] in clash and depth[r] < len(real[r])]
        if not grow:
            return {r: f"{n}-{i}" if n in clash else n for i, (r, n) in enumerate(out.items())}
        for r in grow:
            depth[r] += 1


def same_run(a: bytes, b: bytes) -> bool:
    """Whether two config.json files describe the same run (their ``info`` aside)."""
    try:
        ja, jb = json.loads(a), json.loads(b)
    except ValueError:
        return a == b
    if isinstance(ja, dict) and isinstance(jb, dict):
        ja.pop("info", None)
        jb.pop("info", None)
    return ja == jb


def plan_copies(roots: Sequence[Path], out: Path) -> tuple[Outputs, int]:
    """The small files of every finished run folder under roots (not those already under
    OUT/runs) as files of OUT/runs/<root's folder>/<path under the root>, and the number of run
    folders. A folder there that holds another run (config.json differs) is refused."""
    dest = out / "runs"
    dest_real = dest.resolve()
    names = copy_names(roots)
    files = Outputs(out)
    seen: set[Path] = set()
    for root, name in names.items():
        found = find_run_folders([root])
        if not found:
            raise PBInputError(f"--runs {root} holds no finished run folders (config.json and "
                               "summary.json); pass folders holding run folders")
        for folder in found:
            real = folder.resolve()
            if real.is_relative_to(dest_real) or real in seen:
                continue
            seen.add(real)
            rel = Path("runs") / name / folder.relative_to(root)
            inside(out / rel, out)
            try:
                data = {n: (folder / n).read_bytes() for n in SMALL_FILES
                        if (folder / n).is_file()}
            except OSError as exc:
                print(f"warning: skipped the unreadable run {folder} ({exc.strerror})",
                      file=sys.stderr)
                continue
            old = out / rel / "config.json"
            if old.is_file() and not same_run(old.read_bytes(), data.get("config.json", b"")):
                raise PBInputError(f"{out / rel} holds another run than {folder} (config.json "
                                   "differs); choose another --out or move that folder away")
            for n, b in data.items():
                files.add(rel / n, b)
    return files, len(seen)


def copy_small_files(roots: Sequence[Path], out: Path) -> int:
    """Copy the small files of every finished run under roots to OUT/runs
    (:func:`plan_copies`); returns the number of run folders copied."""
    files, n = plan_copies(roots, out)
    files.write()
    return n
