"""A full disk (or quota) while a tool writes its results: one line naming the file, the folder
and the space it needed, exit code 2, no traceback, and every file written before intact (the
writes are atomic, `pbexact.io.WriteError`). The disk is made full by making ``os.fsync`` of
the atomic writer's temporary files raise ENOSPC from the k-th write on."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from analysis import arms_table, counterexamples, theorems, variance
from analysis.cli import run
from analysis.microworld import units as report_units
from pbexact import io as pio

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").exists(),
                                reason="finds the written file through /proc (Linux)")


def _disk_full_after(writes: int, monkeypatch) -> list[str]:
    """From the ``writes``-th atomic write on, ``os.fsync`` of its temporary file raises ENOSPC;
    returns the names of the files whose writes were tried."""
    real, seen = os.fsync, []

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}").split("/")[-1]
        if name.endswith(".tmp"):
            seen.append(name)
            if len(seen) >= writes:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write "), err
    assert "No space left on device" in err[0] and "free disk space there" in err[0], err
    assert "Traceback" not in err[0]
    return err[0]


CASES = {
    "variance": (variance.main, ["--d", "2", "--n", "2", "--steps", "2", "--log-every", "1"]),
    "counterexamples": (counterexamples.main, ["--only", "sig_per_temp", "theta_dep_ill",
                                               "--no-progress"]),
    "theorems": (theorems.main, ["--only", "eq:n_multisets", "--max-d", "2", "--max-n", "2",
                                 "--no-progress"]),
}


@pytest.mark.parametrize("tool", sorted(CASES))
def test_a_full_disk_is_one_line_and_the_earlier_files_stay(tool, tmp_path, capsys,
                                                            monkeypatch):
    main, argv = CASES[tool]
    out = tmp_path / "out"
    assert run(main, [*argv, "--out", str(out)]) == 0  # a finished run to keep
    first = _files(out)
    assert first
    capsys.readouterr()
    seen = _disk_full_after(2, monkeypatch)  # the second file of the rerun finds the disk full
    assert run(main, [*argv, "--out", str(out)]) == 2
    line = _one_line(capsys)
    failed = seen[-1][1:].rsplit(".", 3)[0]  # .NAME.<pid>.<random>.tmp
    assert f"{out / failed} (No space left on device): {out} needs " in line
    monkeypatch.undo()
    assert _files(out) == first  # nothing lost, no temporary file left


def test_arms_table_json_on_a_full_disk(tmp_path, capsys, monkeypatch):
    target = tmp_path / "t.json"
    target.write_text("{}")
    _disk_full_after(1, monkeypatch)
    assert run(arms_table.main, ["--n", "2", "--json", str(target)]) == 2
    assert str(target) in _one_line(capsys)
    monkeypatch.undo()
    assert target.read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_a_report_unit_on_a_full_disk_stops_the_study_in_one_line(tmp_path, monkeypatch):
    unit = report_units.Unit("estimators", "exponential", 0, 4)
    settings = report_units.Settings(2, 3, 0, 1)
    _disk_full_after(1, monkeypatch)
    with pytest.raises(report_units.PBInputError,
                       match=r"^unit estimators_d4_exponential_i0: cannot write .*No space left"):
        report_units.run_unit(unit, settings, tmp_path)
    assert not list((tmp_path / "units").iterdir())  # the partial folder is removed


def test_write_error_messages_name_the_fix():
    cause = OSError(errno.EROFS, os.strerror(errno.EROFS))
    err = pio.WriteError(cause, Path("/x/y.csv"), 10)
    assert err.one_line() == ("cannot write /x/y.csv (Read-only file system); make /x writable "
                              "or choose another --out (the files written before are intact)")
    full = pio.WriteError(OSError(errno.ENOSPC, "No space left on device"), Path("/x/y.csv"),
                          3 * 1024**2)
    assert "/x needs 3.0 MiB more for it; free disk space there" in full.one_line()
    assert isinstance(err, OSError) and err.errno == errno.EROFS and err.filename == "/x/y.csv"
