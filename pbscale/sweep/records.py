"""Sweep records: one ``<id>.json`` record and ``<id>.log`` per run in ``OUT/sweep-<stem>/``,
the lock that keeps one ``sweep run`` per sweep folder, launching one child, and reading the runs'
folders back (status and results).

A record holds the run's state (running, finished, failed, interrupted), the child's process id
and start time, its return code, log and times. A record left "running" on this host whose
process is gone (or whose process id now names another process: the start time differs) is
interrupted. Children die with the sweep: each is started in its own session (a Ctrl-C at the
terminal reaches the sweep only, which passes SIGTERM on) and, on Linux, asks the kernel for a
SIGTERM when the sweep dies (``PR_SET_PDEATHSIG``), so a sweep killed with SIGKILL leaves no
child running; the children checkpoint and exit, and the next ``sweep run`` resumes them.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from pbexact.errors import PBInputError
from pbexact.processes import die_with_parent
from pbscale.runs import io

from . import identity
from .file import Group, Run, Sweep, members

STATES = ("finished", "running", "failed", "diverged", "interrupted", "pending")
#: Exit codes of a child stopped by SIGTERM (it checkpointed: its run is interrupted); records
#: hold 143 (:func:`shell_code`), older records may hold -15.
TERMINATED = (143, -signal.SIGTERM)


def shell_code(code: int) -> int:
    """A child's exit code as a shell reports it: a child killed by signal N before its own
    handler was in place (``Popen.returncode`` -N, e.g. SIGTERM while Python starts) is
    128 + N (143 for SIGTERM, the code of a child that checkpointed and exited), the rest as
    they are."""
    return 128 - code if code < 0 else code


def record_path(sweep: Sweep, run: Run) -> Path:
    """``OUT/sweep-<stem>/<id>.json``."""
    return sweep.record_dir / f"{run.id}.json"


def read_record(sweep: Sweep, run: Run) -> dict | None:
    """A run's record, or None when there is none or it is damaged (the run is then pending;
    launching it again finds its run folder)."""
    p = record_path(sweep, run)
    if not p.exists():
        return None
    try:
        rec = io.read_json(p)
    except (OSError, ValueError):  # PBInputError is a ValueError
        return None
    return rec if isinstance(rec, dict) else None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat`` field 22), or
    None where that cannot be read (no such process, no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` runs, and (with ``start``) is the process that started then,
    not a later one given the same id."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False
    return True


def state_of(sweep: Sweep, run: Run, done: set[str] | None = None,
             diverged: set[str] | None = None) -> str:
    """finished / running / failed / diverged / interrupted / pending (no record). A record
    left "running" on this host by a process that no longer exists counts as interrupted, and
    an interrupted run whose run folder holds its summary.json (the child was stopped, or the
    sweep killed, after the summary was written) as finished. A run that is not finished or
    running and whose folder holds ``diverged.json`` is diverged (:func:`diverged_folders`).
    ``done`` / ``diverged``: the ids of the runs with a summary (:func:`finished_folders`) /
    a divergence record, computed here when not given."""
    state = _state(sweep, run, done)
    if state in ("failed", "interrupted", "pending"):
        if diverged is None:
            diverged = set(diverged_folders(sweep))
        if run.id in diverged:
            return "diverged"
    return state


def _state(sweep: Sweep, run: Run, done: set[str] | None) -> str:
    """:func:`state_of` without the divergence records."""
    rec = read_record(sweep, run)
    state = rec.get("state", "pending") if rec is not None else "pending"
    if rec is None or state not in STATES:  # no record, or a damaged one: its folder decides
        if done is None:
            done = set(finished_folders(sweep))
        return "finished" if run.id in done else "pending"
    if state == "finished":  # only while its folder still holds a readable summary
        if done is None:
            done = set(finished_folders(sweep))
        return "finished" if run.id in done else "pending"
    if state == "running" and rec.get("host") == os.uname().nodename:
        try:
            pid, start = int(rec.get("pid", 0)), rec.get("pid_start")
        except (TypeError, ValueError):
            pid, start = 0, None
        if not alive(pid, start if isinstance(start, int) else None):
            state = "interrupted"
    if state == "interrupted":
        if done is None:
            done = set(finished_folders(sweep))
        if run.id in done:
            return "finished"
    return state


def todo(sweep: Sweep, retry_failed: bool = True) -> tuple[list[Run], list[Run]]:
    """(runs to launch, runs still running in a child of an earlier sweep on this host). A
    run to launch is not finished, not running, not diverged (its rerun would repeat the
    refusal: the user decides, see ``diverged.json``), and not failed unless
    ``retry_failed``."""
    skip = {"finished", "diverged"} | (set() if retry_failed else {"failed"})
    done, div = set(finished_folders(sweep)), set(diverged_folders(sweep))
    launch_, running = [], []
    for r in sweep.runs:
        state = state_of(sweep, r, done, div)
        if state == "running" and (read_record(sweep, r) or {}).get("host") == \
                os.uname().nodename:
            running.append(r)
        elif state not in skip:
            launch_.append(r)
    return launch_, running


class SweepLock:
    """The lock of a sweep folder (``OUT/sweep-<stem>/.lock``, ``flock``): one ``sweep run``
    at a time. The lock file holds the holder's process id; the kernel drops the lock when the
    holder exits, however it ends. Creating the folder, or a folder that cannot be written, is
    a one-line :class:`PBInputError`."""

    def __init__(self, record_dir: Path):
        self.path = record_dir / ".lock"
        self.fh: IO[str] | None = None

    def __enter__(self) -> SweepLock:
        folder = self.path.parent
        if folder.parent.exists() and not folder.parent.is_dir():
            raise PBInputError(f"output folder {folder.parent} is a file; give a folder with "
                               "--out or [sweep] out")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+")
        except OSError as e:
            raise PBInputError(f"cannot write the sweep folder {folder} ({e.strerror}); give a "
                               "writable folder with --out or [sweep] out") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            pid = fh.read().strip() or "unknown"
            fh.close()
            raise PBInputError(f"another sweep run (pid {pid}) is running this sweep in "
                               f"{folder}; wait for it to end or stop it (kill {pid}); status "
                               "works meanwhile") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self.fh = fh
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None


def launch(sweep: Sweep, job: Run | Group, env: dict | None = None,
           procs: dict | None = None) -> int:
    """Run one child (a run, or a :class:`Group` of runs trained together) to its end, output
    appended to ``<id>.log`` (a group: ``group-<id>.log``); writes each run's record before and
    after; returns the child's exit code. ``procs`` (id -> Popen) lets the caller signal children.
    A child stopped by SIGTERM is interrupted, unless its run wrote ``summary.json`` first
    (then finished). An exception here (e.g. a cancelled Ray task) stops the child with
    SIGTERM, records it as interrupted and is raised again. A child killed by a signal
    before it could handle it returns and records 128 + the signal (:func:`shell_code`)."""
    sweep.record_dir.mkdir(parents=True, exist_ok=True)
    grouped = isinstance(job, Group)
    log = sweep.record_dir / (f"group-{job.id}.log" if grouped else f"{job.id}.log")
    cmd = [sys.executable, *sweep.command_line(job)]
    if grouped:
        key = sweep.grouping.member_key
        info = {"sweep": sweep.path.stem, "sweep_ids": {key(r.full): r.id for r in job.runs}}
    else:
        info = {"sweep": sweep.path.stem, "sweep_id": job.id}
    ids = identity.Identities(sweep)
    recs = {r.id: {"id": r.id, "command": sweep.command, "options": r.options,
                   "argv": cmd[1:], "log": str(log), "host": os.uname().nodename,
                   "identity": identity.identity_now(ids, r),
                   **({"group": job.id} if grouped else {})} for r in members(job)}
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(cmd[1:])}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {}),
                                     "PBSCALE_RUN_INFO": json.dumps(info)},
                                start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
        if procs is not None:
            procs[job.id] = proc
        running = {"state": "running", "pid": proc.pid, "pid_start": process_start(proc.pid),
                   "started": t0}
        for r in members(job):
            io.write_json(record_path(sweep, r), {**recs[r.id], **running})
        try:
            code = shell_code(proc.wait())
        except BaseException:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
            _finish(sweep, job, recs, shell_code(-int(signal.SIGTERM)), t0)
            raise
        finally:
            if procs is not None:
                procs.pop(job.id, None)
        fh.write(f"# exit code {code}\n")
    _finish(sweep, job, recs, code, t0)
    return code


def _finish(sweep: Sweep, job: Run | Group, recs: dict, code: int, t0: float) -> None:
    """Write each member's final record: finished (exit 0, or stopped after its summary was
    written), interrupted (stopped by SIGTERM) or failed."""
    done = finished_folders(sweep) if code in TERMINATED else {}
    for r in members(job):
        if code == 0 or r.id in done:
            state = "finished"
        else:
            state = "interrupted" if code in TERMINATED else "failed"
        io.write_json(record_path(sweep, r), {**recs[r.id], "state": state, "returncode": code,
                                              "started": t0, "seconds": time.time() - t0})


def per_run(jobs: list[Run | Group], codes: list[int]) -> dict[str, int]:
    """{run id: exit code of the child that ran it}."""
    return {r.id: c for job, c in zip(jobs, codes) for r in members(job)}


def folder_index(out: Path, damaged: list[Path] | None = None,
                 choose: Callable[[str, list[Path]], Path] | None = None) -> dict[str, Path]:
    """{sweep run id: run folder} over the run folders directly under ``out``. A folder whose
    config.json is damaged or of the wrong shape is left out (and appended to ``damaged``).
    Where several folders hold one id (a run trained again on changed data), ``choose(id,
    folders)`` picks one (:func:`pbscale.sweep.identity.chooser`), else the last by name."""
    found: dict[str, list[Path]] = {}
    for cfg in sorted(out.glob("*/config.json")):
        try:
            info = io.read_json(cfg).get("info", {})
            sweep_id = info.get("sweep_id") if isinstance(info, dict) else None
        except (OSError, ValueError, AttributeError):
            sweep_id = None
            if damaged is not None:
                damaged.append(cfg)
        if isinstance(sweep_id, str):
            found.setdefault(sweep_id, []).append(cfg.parent)
    return {k: v[-1] if len(v) == 1 or choose is None else choose(k, v)
            for k, v in found.items()}


def sweep_folders(sweep: Sweep, damaged: list[Path] | None = None) -> dict[str, Path]:
    """:func:`folder_index` of the sweep's out, several folders of one run told apart by what
    the run's options name now (:func:`pbscale.sweep.identity.chooser`)."""
    return folder_index(sweep.out, damaged, identity.chooser(identity.Identities(sweep),
                                                             sweep.runs))


def changed_runs(sweep: Sweep) -> list[identity.Change]:
    """The finished runs whose run folder was trained on another data file or network module
    than the run's options name now, and that no choice of the user keeps
    (:mod:`pbscale.sweep.identity`)."""
    ids = identity.Identities(sweep)
    if ids.ask is None:
        return []
    folders = {k: v for k, v in sweep_folders(sweep).items() if readable_summary(v) is not None}
    out: list[identity.Change] = []
    for r in sweep.runs:
        if r.id in folders and state_of(sweep, r, set(folders), set()) == "finished":
            out += identity.changes(ids, r, folders[r.id], read_record(sweep, r))
    return out


def keep_identity(sweep: Sweep, runs: Sequence[Run]) -> None:
    """Record in each run's record that the user keeps it as it is: what its options name now
    (``identity``), so that its change is not asked again until the files change again."""
    ids = identity.Identities(sweep)
    for r in runs:
        rec = read_record(sweep, r) or {"id": r.id, "command": sweep.command,
                                         "options": r.options, "state": "finished"}
        io.write_json(record_path(sweep, r), {**rec, "identity": identity.identity_now(ids, r)})


def finished_folders(sweep: Sweep) -> dict[str, Path]:
    """{run id: run folder} of the sweep's runs whose folder holds a readable summary.json (a
    JSON object), the one test of "finished" that ``run``, ``status`` and ``results`` share: a
    run whose files were damaged after it finished is not finished, so ``run`` launches it
    again (it resumes from its checkpoint, or fails naming the damaged file)."""
    return {k: v for k, v in sweep_folders(sweep).items() if readable_summary(v) is not None}


def diverged_folders(sweep: Sweep) -> dict[str, Path]:
    """{run id: run folder} of the sweep's runs whose folder holds ``diverged.json`` (the
    record :mod:`pbscale.runs.records` writes when a run diverges) and no readable summary."""
    return {k: v for k, v in sweep_folders(sweep).items()
            if (v / io.DIVERGED).exists() and readable_summary(v) is None}


def divergence(folder: Path) -> str:
    """The recorded reason of a diverged run folder (or why the record cannot be read)."""
    try:
        record = io.read_diverged(folder)
    except ValueError as exc:  # PBInputError: a damaged record
        return str(exc)
    return "" if record is None else f"{record.get('where', '?')}: {record['reason']}"


def readable_summary(folder: Path) -> dict | None:
    """The run folder's summary.json when it is a regular file holding a JSON object whose
    values read back (:func:`pbscale.runs.io.summary_problem`: metrics that are numbers,
    fractions in [0, 1]), else None (:func:`summary_damage` says why)."""
    path = folder / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = io.read_json(path)
    except (OSError, ValueError):  # PBInputError is a ValueError
        return None
    if not isinstance(summary, dict) or not summary or io.summary_problem(summary):
        return None  # an empty object is no finished run's (as the run itself refuses it)
    return summary


def summary_damage(folder: Path) -> str | None:
    """Why the run folder's summary.json cannot be read as a finished run's (missing, not a
    regular file, truncated, not a JSON object, a value of the wrong kind or out of its range:
    the one-line reason), or None when it can (:func:`readable_summary`)."""
    path = folder / "summary.json"
    if not path.is_file():
        return f"no summary.json in {folder}"
    try:
        summary = io.read_json(path)
    except OSError as exc:
        return f"cannot read {path} ({exc.strerror})"
    except ValueError as exc:  # PBInputError is a ValueError
        return str(exc).split(";")[0]
    if not isinstance(summary, dict):
        return f"{path} holds a {type(summary).__name__}, not a JSON object"
    if not summary:
        return f"{path} is an empty JSON object"
    return io.summary_problem(summary)


def saved_text(sweep: Sweep, run: Run, folders: dict[str, Path]) -> str:
    """What an interrupted run left to resume from, in words: its checkpoint (its own, or its
    group's under ``OUT/.groups``) at an epoch's end or mid-epoch at a step, or nothing (a child
    stopped before its run folder or first checkpoint existed: the rerun starts it afresh);
    ``folders``: :func:`folder_index` of the sweep's out."""
    folder = folders.get(run.id)
    if folder is None:
        return "nothing saved yet (stopped before its run folder existed)"
    try:
        info = io.read_json(folder / "config.json").get("info", {})
        group = info.get("group") if isinstance(info, dict) else None
        ckpt = (folder.parent / group if isinstance(group, str) else folder) / "checkpoint.pt"
        state = io.load_checkpoint(ckpt, keys=("epoch",))
    except (OSError, ValueError, AttributeError):  # PBInputError is a ValueError
        return f"checkpoint unreadable, {folder.name} resumes or fails naming it"
    if state is None:
        return "nothing saved yet (stopped before its first checkpoint)"
    epoch, pos = int(state["epoch"]), state.get("position")
    where = (f"epoch {epoch + 1}, step {int(pos['step'])}" if isinstance(pos, dict)
             else f"the end of epoch {epoch}")
    return f"checkpoint at {where}{' (its group)' if isinstance(group, str) else ''}"


def status(sweep: Sweep) -> dict[str, list[Run]]:
    """Runs grouped by state (STATES order)."""
    groups: dict[str, list[Run]] = {s: [] for s in STATES}
    done, div = set(finished_folders(sweep)), set(diverged_folders(sweep))
    for r in sweep.runs:
        groups[state_of(sweep, r, done, div)].append(r)
    return groups


def unread_options(folder: Path) -> set[str]:
    """The options a run did not read, as its config.json "info" lists them ("unused": the
    settings its method, mode and model do not read; "ignored": those given that it ignored),
    or none where it lists none."""
    try:
        info = io.read_json(folder / "config.json").get("info", {})
    except (OSError, ValueError, AttributeError):
        return set()
    if not isinstance(info, dict):
        return set()
    names = [*info.get("unused", []), *info.get("ignored", [])]
    return {k for k in names if isinstance(k, str)}


def results(sweep: Sweep, damaged: list[Path] | None = None) -> list[dict]:
    """One row per finished run: its options (those the run read: an option its config.json
    lists as unused or ignored is left empty), then ``folder`` and the run's summary.json
    (``final_*`` metrics, seconds). A run's folder is the one under ``out`` whose config.json
    "info" holds the run's sweep id (the sweep passes it to the child in $PBSCALE_RUN_INFO).
    Run folders whose config.json or summary.json is damaged or not a JSON object are left out
    and appended to ``damaged``."""
    bad: list[Path] = []
    folders = sweep_folders(sweep, bad)
    rows = []
    for r in sweep.runs:
        folder = folders.get(r.id)
        if folder is None or not (folder / "summary.json").exists():
            continue
        summary = readable_summary(folder)
        if summary is None:
            bad.append(folder / "summary.json")
            continue
        unread = unread_options(folder)
        rows.append({**{k: v for k, v in r.options.items() if k not in unread},
                     "folder": str(folder), **summary})
    if damaged is not None:
        damaged.extend(bad)
    return rows
