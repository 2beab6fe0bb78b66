"""Pruning groups take the separate run's care (issue 38, parts 2 and 3): one writer per run
folder (a folder a group trains refuses a separate run, and the other way round; a member
finished meanwhile by a process that ignored the lock is left alone, and the group says so);
a damaged member summary.json is refused, not counted as finished; the ignored-flag warning
and record, ``--drop-checkpoint``; member folders that are files, run files that are folders
and a sweep record that is a folder are one line naming the fix, before anything trains; a
group larger than memory is refused naming the largest that fits; paths over PATH_MAX are one
line in every tool. Tiny synthetic LeNet runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.cli import run
from pbexact.errors import PBInputError
from pbscale import export as X
from pbscale import prune, regress
from pbscale.pruning import config as pconfig
from pbscale.pruning import group as prune_group
from pbscale.pruning import run as prun
from pbscale.regression import group as regression_group
from pbscale.runs import io as runio
from pbscale.runs.records import lock_folder

TINY = dict(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8, n=2,
            eval_masks=2, eval_batches=1, method="cp")


def argv(out: Path, *extra: str, **opts) -> list[str]:
    flags = []
    for k, v in {**TINY, **opts}.items():
        flags += [f"--{k.replace('_', '-')}", str(v)]
    return [*flags, "--quiet", "--out", str(out), *extra]


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("warning: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def cfgs(**opts) -> list[pconfig.PruneConfig]:
    return [pconfig.PruneConfig(**{**TINY, **opts}, seed=s) for s in (0, 1)]


def test_a_member_folder_has_one_writer(tmp_path, capsys) -> None:
    """While a group trains seed 0, the separate run of seed 0 is refused in one line (and
    trains nothing); while the separate run trains, the group is refused."""
    seen = {}

    def during_group(epoch: int, i: int) -> None:
        if (epoch, i) == (1, 0):
            seen["code"] = run(prune.main, argv(tmp_path, "--seed", "0"))
            seen["err"] = capsys.readouterr().err

    prun.run_group(cfgs(), tmp_path, quiet=True, step_hook=during_group)
    assert seen["code"] == 2 and "being trained by another process" in one_line(seen["err"])
    out2 = tmp_path / "two"

    def during_run(epoch: int, i: int) -> None:
        if (epoch, i) == (0, 1):
            with pytest.raises(PBInputError, match="being trained by another process"):
                prun.run_group(cfgs(), out2, quiet=True)

    prun.run(cfgs()[0], out2, quiet=True, step_hook=during_run)


def test_a_member_finished_meanwhile_is_left_alone(tmp_path, capsys) -> None:
    """A process that ignores the lock finishes seed 0's folder while the group trains: the
    group leaves that folder's files as they are, says so, and finishes seed 1."""
    sep = Path(prun.run(cfgs()[0], tmp_path / "sep", quiet=True)["folder"])
    grp = tmp_path / "grp"
    written = {}

    def finish_elsewhere(epoch: int, i: int) -> None:
        if (epoch, i) == (1, 0):
            for f in ("summary.json", "metrics.csv", "masks.pt", "pruned.pt"):
                (grp / sep.name / f).write_bytes((sep / f).read_bytes())
                written[f] = (sep / f).read_bytes()

    assert prun.run_group(cfgs(), grp, quiet=True, step_hook=finish_elsewhere) == (1, 1)
    assert "finished by another process meanwhile; the group leaves it alone" in \
        capsys.readouterr().err
    assert {f: (grp / sep.name / f).read_bytes() for f in written} == written
    assert len(list(grp.glob("lenet-*/summary.json"))) == 2


@pytest.mark.parametrize("damage", ["truncated", "empty object", "fifo"])
def test_a_damaged_member_summary_is_refused(tmp_path, capsys, damage) -> None:
    assert run(prune.main, argv(tmp_path, "--seeds", "0,1")) == 0
    capsys.readouterr()
    summary = sorted(tmp_path.glob("lenet-*/summary.json"))[0]
    summary.unlink()
    if damage == "fifo":
        os.mkfifo(summary)
    else:
        summary.write_text('{"final_test' if damage == "truncated" else "{}")
    assert run(prune.main, argv(tmp_path, "--seeds", "0,1")) == 2
    line = one_line(capsys.readouterr().err)
    assert "damaged run file" in line and str(summary) in line


def test_ignored_flags_and_drop_checkpoint_in_a_group(tmp_path, capsys) -> None:
    """--n and --target with CP: the warning, and "ignored" in each member's config.json, as
    the separate run records them; --drop-checkpoint deletes the group's checkpoint."""
    assert run(prune.main, argv(tmp_path / "sep", "--target", "0.5")) == 0
    alone = capsys.readouterr().err
    (sep,) = (tmp_path / "sep").glob("lenet-*/config.json")
    assert run(prune.main, argv(tmp_path, "--seeds", "0,1", "--target", "0.5",
                                "--drop-checkpoint")) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "--target" in err and "--n" in err
    assert err.splitlines()[0] == alone.splitlines()[0]
    ignored = runio.read_json(sep)["info"]["ignored"]
    assert {"n", "target"} <= set(ignored)
    for cfg in tmp_path.glob("lenet-*/config.json"):
        assert runio.read_json(cfg)["info"]["ignored"] == ignored
    assert list(tmp_path.glob(".groups/*/summary.json"))
    assert not list(tmp_path.glob(".groups/*/checkpoint.pt"))


def test_run_paths_of_the_wrong_kind_are_one_line_before_training(tmp_path, capsys) -> None:
    members = []
    for c in cfgs():
        cfg, dev, data = prun.prepare(c)
        members.append(prun.member(cfg, data, dev, tmp_path))
    members[0].folder.parent.mkdir(parents=True, exist_ok=True)
    members[0].folder.write_text("a file")
    assert run(prune.main, argv(tmp_path, "--seeds", "0,1")) == 2
    line = one_line(capsys.readouterr().err)
    assert "is a file, not a folder" in line and "free disk space" not in line
    members[0].folder.unlink()
    (members[1].folder / "metrics.csv").mkdir(parents=True)
    assert run(prune.main, argv(tmp_path, "--seeds", "0,1")) == 2
    line = one_line(capsys.readouterr().err)
    assert "metrics.csv is a folder" in line and "free disk space" not in line
    assert not list(tmp_path.glob(".groups/*/checkpoint.pt"))  # refused before training


def test_a_write_into_a_folder_names_the_folder_not_the_disk(tmp_path) -> None:
    """io.writing's fix follows the cause: a folder where a file belongs (a sweep record that
    is a folder) is not "free disk space"."""
    (tmp_path / "rec.json").mkdir()
    with pytest.raises(PBInputError) as exc:
        runio.write_json(tmp_path / "rec.json", {})
    assert "folder is where a file belongs" in str(exc.value)
    assert "free disk space" not in str(exc.value)


def test_a_group_larger_than_memory_is_refused(tmp_path, monkeypatch, capsys) -> None:
    per = prune_group.member_bytes
    monkeypatch.setattr(prune_group, "available_memory", lambda dev: 0)
    assert run(prune.main, argv(tmp_path, "--seeds", "0-3")) == 2
    line = one_line(capsys.readouterr().err)
    assert "a group of 4 runs needs about" in line and "at most 1 runs per group" in line
    assert per is prune_group.member_bytes


def test_a_group_under_an_address_space_limit_is_refused(tmp_path) -> None:
    """4,000 runs under ``ulimit -v 8000000`` (8 GB): one line naming the largest group that
    fits, before the members are built."""
    code = (f"ulimit -v 8000000; exec {sys.executable} -m pbscale.prune --synthetic 48 "
            f"--seeds 0-3999 --epochs 1 --quiet --out {tmp_path}")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ,
                               "PYTHONPATH": str(Path(prune.__file__).parents[1])})
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc.stderr)
    assert "a group of 4,000 runs needs about" in line and "runs per group" in line


def test_paths_longer_than_path_max_are_one_line(tmp_path, capsys) -> None:
    long = str(tmp_path / "/".join(["a" * 200] * 21))
    for main, args in ((prune.main, argv(Path(long))),
                       (regress.main, ["--epochs", "1", "--out", long]),
                       (regress.main, ["--epochs", "1", "--seeds", "0-1", "--out", long]),
                       (X.main, [str(tmp_path), "--out", long + "/x"]),
                       (X.main, [long, "--out", str(tmp_path / "x")])):
        assert run(main, args) == 2
        line = one_line(capsys.readouterr().err)
        assert "bytes long as an absolute path" in line, line


def test_lock_folder_refuses_a_second_holder(tmp_path) -> None:
    with lock_folder(tmp_path / "run"):
        with pytest.raises(PBInputError, match="being trained by another process"):
            with lock_folder(tmp_path / "run"):
                pass
    with lock_folder(tmp_path / "run"):
        pass


def test_regression_groups_take_the_same_care(tmp_path) -> None:
    """Batched seeds: a damaged member summary.json is refused (not counted as finished), a
    member folder another process holds is refused, and a history.csv that is a folder is one
    line before training."""
    from pbscale.methods import MethodConfig
    from pbscale.regression.problem import make_problem
    from pbscale.regression.run import run_folder as regress_folder

    p = make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6), target_hidden=(12, 12))
    cfgs = [MethodConfig("loorf", 2, "sigmoid", 0.1, seed=s) for s in (0, 1)]
    assert regression_group.train_unfinished(cfgs, 1, p, out=tmp_path) == (0, 2)
    summary = regress_folder(cfgs[0], 1, tmp_path, 0, p) / "summary.json"
    summary.write_text("{}")
    with pytest.raises(PBInputError, match="damaged run file .*summary.json"):
        regression_group.train_unfinished(cfgs, 1, p, out=tmp_path)
    out = tmp_path / "two"
    folder = regress_folder(cfgs[1], 1, out, 0, p)
    with lock_folder(folder):
        with pytest.raises(PBInputError, match="being trained by another process"):
            regression_group.train_unfinished(cfgs, 1, p, out=out)
    (folder / "history.csv").mkdir()
    with pytest.raises(PBInputError, match="history.csv is a folder"):
        regression_group.train_unfinished(cfgs, 1, p, out=out)
    assert not list(out.glob(".groups/*/checkpoint.pt"))
