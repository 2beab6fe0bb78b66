"""A run's folder and the records in it: the folder named by a hash of the run's configuration,
``config.json`` (what is hashed, what is not: "info" and "method_info"), the provenance a
reused folder must match, ``summary.json``, the checkpoint, read with ``weights_only=True``,
``diverged.json`` (:data:`DIVERGED`, :func:`write_diverged`, :func:`read_diverged`, defined in
:mod:`pbscale.runs.io` beside ``summary.json``'s reader so that sweeps read them too: where and why
a run diverged) and the lock that keeps one writer per run folder (:func:`lock_folder`).
:func:`pbscale.runs.loop.run` opens the folder with :func:`open_folder`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from pbexact.errors import PBInputError
from pbexact.io import check_out_dir, inside, path_problem
from pbscale.runs import io
from pbscale.runs.contracts import LoopConfig, Method, Task
from pbscale.runs.io import DIVERGED, read_diverged, write_diverged

__all__ = ["DIVERGED", "GROUPS", "PROVENANCE", "UNHASHED", "Diverged", "check_provenance",
           "chosen_config", "config_hash", "diverged_refusal", "env_info", "full_config",
           "groups_folder", "hashed_part", "last_metrics",
           "lock_folder", "open_folder", "read_diverged", "read_state", "run_folder", "run_record",
           "write_diverged", "write_summary"]

#: Entries of ``info`` (config.json, unhashed) that must match when a run folder is reused:
#: the fingerprint of the data and the number of processes (torchrun) that made the run.
PROVENANCE = ("data", "world_size")


def config_hash(config: dict) -> str:
    """First 12 hex digits of the SHA-256 of the canonical JSON of ``config``."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_folder(out: str | Path, task_name: str, config: dict) -> Path:
    """``<out>/<task_name>-<config_hash(config)>``, refused in one line (before anything is
    written) when ``out`` given as text cannot name a folder (empty: the current folder; a name
    over 255 bytes) or when the folder is there and resolves outside ``out`` (a symlink to
    elsewhere), so every tool writes runs only under its ``--out``."""
    problem = path_problem(out) if isinstance(out, str) else None
    if problem:
        raise PBInputError(f"--out {out[:60]!r} {problem}; name another folder")
    folder = Path(out) / f"{task_name}-{config_hash(config)}"
    if folder.is_symlink() or folder.exists():
        inside(folder, out)
    return folder


#: The folder under ``--out`` that holds the groups' own folders (checkpoint, metrics).
GROUPS = ".groups"


def groups_folder(out: str | Path) -> Path:
    """``<out>/.groups``, refused in one line when it is there and resolves outside ``out``
    (a symlink to elsewhere): a group's folder in it is then checked against it by
    :func:`run_folder`, so a group, too, writes only under ``--out``."""
    folder = Path(out) / GROUPS
    if folder.is_symlink() or folder.exists():
        inside(folder, out)
    return folder


#: Entries of a config.json record that are not hashed (:func:`run_record`).
UNHASHED = ("info", "method_info")


def hashed_part(record: dict) -> dict:
    """The configuration a config.json ``record`` holds: every entry but :data:`UNHASHED`."""
    return {k: v for k, v in record.items() if k not in UNHASHED}


def chosen_config(out: str | Path, task_name: str, config: dict, legacy: dict | None) -> dict:
    """The configuration a run is named by under ``out``: ``config``, or ``legacy`` (the
    same run as an older form of the configuration named it) where only ``legacy``'s folder
    is there, so that a run folder made before the form changed is found, resumed and read
    back where it is, under the name it has."""
    if legacy is None or run_folder(out, task_name, config).exists():
        return config
    return legacy if run_folder(out, task_name, legacy).exists() else config


def full_config(task: Task, method: Method, loop: LoopConfig) -> dict:
    """The configuration a run folder is named by: task, method and loop."""
    return {"task": task.config(), "method": method.config_dict(), "loop": loop.to_dict()}


def run_record(config: dict, device: torch.device | str, info: dict,
               method_info: dict | None = None, env: dict | None = None) -> dict:
    """A run's config.json record: its configuration (``config``: :func:`full_config`, hashed)
    and, unhashed, "info" (the device, ``info``, and ``env``: the launcher's facts,
    :func:`env_info` unless given) and "method_info" (what the method's family says of it,
    :meth:`pbscale.methods.registry.Family.info`, where given). One builder for a run alone
    (:func:`pbscale.runs.loop.run`) and a group member (:mod:`pbscale.pruning.group`)."""
    record = {**config, "info": {"device": str(device), **info,
                                 **(env_info() if env is None else env)}}
    if method_info is not None:
        record["method_info"] = method_info
    return record


def env_info() -> dict:
    """Facts a launcher (``pbscale.sweep``) passes in ``$PBSCALE_RUN_INFO`` (a JSON object)
    for config.json's unhashed "info" (e.g. the sweep's run id)."""
    text = os.environ.get("PBSCALE_RUN_INFO")
    if not text:
        return {}
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("sweep_ids", {}), dict):
        raise PBInputError(f"$PBSCALE_RUN_INFO {text[:60]!r} is not a JSON object (its "
                           "'sweep_ids' an object); unset it (pbscale.sweep sets it for the "
                           "runs it launches)")
    return info


def check_provenance(folder: Path, old: Any, new: dict) -> None:
    """Refuse (one line) to reuse ``folder`` when its recorded :data:`PROVENANCE` (``old``:
    config.json's "info") differs from this run's (``new``); an entry missing on either side
    (a folder written before it was recorded) is not compared."""
    old = old if isinstance(old, dict) else {}
    for key in PROVENANCE:
        if key in old and key in new and old[key] != new[key]:
            what = ("other data (fingerprint {} there, {} now)" if key == "data" else
                    "{} processes (torchrun), this run has {}")
            raise PBInputError(
                f"{folder} holds a run made from {what.format(old[key], new[key])}; choose "
                f"another --out or delete the folder")


def open_folder(out: str | Path, name: str, config: dict, record: dict,
                files: tuple[str, ...]) -> Path:
    """The run folder of ``config`` under ``out``, checked: ``files`` (the run's files) are not
    folders, and a ``config.json`` already there holds the same configuration and
    provenance (else a one-line :class:`PBInputError`). ``record`` is what this run writes to
    config.json: ``config`` plus its unhashed "info" (and "method_info")."""
    folder = run_folder(out, name, config)
    check_out_dir(out)
    if folder.exists() and not folder.is_dir():
        raise PBInputError(f"damaged run folder: {folder} is a file, not a folder; "
                           f"{io.DAMAGED_FIX}")
    for f in files:
        if (folder / f).is_dir():
            raise PBInputError(f"damaged run folder: {folder / f} is a folder, not a file; "
                               f"{io.DAMAGED_FIX}")
        io.regular_file(folder / f)  # a FIFO would block the resume forever
    if (folder / "config.json").exists():
        old = io.read_json(folder / "config.json")
        if not isinstance(old, dict):
            raise PBInputError(f"damaged run file {folder / 'config.json'} (not a JSON object); "
                               f"{io.DAMAGED_FIX}")
        if {k: old.get(k) for k in config} != json.loads(json.dumps(config)):
            raise PBInputError(
                f"{folder} holds a run with another configuration; choose another --out "
                "or delete the folder"
            )
        check_provenance(folder, old.get("info"), record["info"])
    return folder


def write_summary(folder: Path, history: list[dict], device: torch.device | str,
                  **extra: Any) -> None:
    """``summary.json`` of a finished run: ``final_<column>`` of the last history row, the
    training seconds (sum of ``train_seconds``) and per epoch, the device and ``extra``."""
    train_s = sum(h["train_seconds"] for h in history)
    summary = {f"final_{k}": v for k, v in history[-1].items() if k != "epoch"}
    summary.update({"train_seconds": train_s,
                    "seconds_per_epoch": train_s / max(len(history) - 1, 1),
                    "device": str(device), **extra})
    io.write_json(folder / "summary.json", summary)


def read_state(path: str | Path) -> dict[str, Any] | None:
    """A run's checkpoint (``weights_only=True``), or None."""
    return io.load_checkpoint(path)


class Diverged(PBInputError):
    """A run diverged (a NaN or inf training loss, mask logits, weights or evaluation loss):
    the one-line message names where, what went non-finite and the flag to lower; ``epoch``
    (1-based, as the message counts), ``step`` (the global step, 1-based, or None for a check
    after the epoch) and ``where`` (the message's place, e.g. "step 2880 (epoch 7, batch 80)")
    say where, ``flag`` the learning-rate flag (or flags) the cause asks to lower."""

    def __init__(self, message: str, epoch: int, step: int | None, where: str,
                 flag: str | None = None) -> None:
        super().__init__(message)
        self.epoch, self.step, self.where, self.flag = int(epoch), step, where, flag

    def record(self, last_metrics: dict) -> dict:
        """What :func:`write_diverged` writes: epoch, step, where, reason (the message), the
        flag to lower (when known) and ``last_metrics`` (the last finished epoch's metrics
        row, {} if none)."""
        return {"epoch": self.epoch, "step": self.step, "where": self.where,
                "reason": str(self), **({"flag": self.flag} if self.flag else {}),
                "last_metrics": last_metrics}


def last_metrics(folder: Path, metrics_file: str) -> dict:
    """The last row of the run folder's metrics file (the last finished epoch's metrics,
    non-finite numbers as None, so the record is plain JSON), or {} when none was written or
    it cannot be read."""
    try:
        rows = io.read_csv(folder / metrics_file)
    except (OSError, ValueError):
        return {}
    if not rows:
        return {}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in rows[-1].items()}


def diverged_refusal(folder: Path, record: dict) -> PBInputError:
    """The one-line refusal to train again a run that diverged before: its record's cause and
    the flag it names (a record written before the flag was recorded: "the rate it names")."""
    flag = record.get("flag")
    lower = f"lower {flag}" if isinstance(flag, str) and flag else "lower the rate it names"
    return PBInputError(
        f"{folder} diverged before, at {record.get('where', '?')} (recorded in {DIVERGED}: "
        f"{record['reason'].split(';')[0]}); the same settings diverge again: {lower} "
        f"(another run folder), or delete {folder / DIVERGED} to train it again from its last "
        f"checkpoint")


@contextmanager
def lock_folder(folder: str | Path) -> Iterator[Path]:
    """Hold an exclusive lock on the run folder (``flock`` on the folder itself, created if
    need be; released when the block ends or the process dies) while this process trains it:
    a run folder has one writer. A folder another process holds is refused in one line."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PBInputError(f"damaged run folder: {folder} is a file, not a folder; "
                           f"{io.DAMAGED_FIX}")
    with io.writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise PBInputError(
                f"{folder} is being trained by another process (a separate run or a group "
                f"holds it); wait for that process to finish (finished runs are then "
                f"skipped) or choose another --out") from None
        yield folder
    finally:
        os.close(fd)
