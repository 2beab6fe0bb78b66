"""A run folder, a sweep file or a sparse file never runs the code it names (issue 50, item 1).

Each case gives a command a file that names ``evilmod:make`` as its network, where ``evilmod``
is a module on the path that would leave a file behind when imported (and another when
``make`` is called): ``pbscale.export`` of a run folder (without ``--model``, and with another
``--model``), ``load_sparse`` without ``model=``, ``analysis.pareto``, ``analysis.scale_report``
and ``pbscale.sweep status``, ``results``, ``run --dry-run`` and ``run`` (all runs finished).
After each, the module was not imported and nothing was called; the export and ``load_sparse``
refuse in one line and say how to name the network."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from pbexact.errors import PBInputError
from pbscale import export as X
from pbscale import sweep
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.runs import io as runio
from pbscale.sweep import file as sweep_file

EVIL = "evilmod"
EVIL_SOURCE = '''
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("imported")


def make():
    pathlib.Path(__file__).with_name("CALLED").write_text("called")
    raise SystemExit(7)
'''


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    cfg = pconfig.PruneConfig(model="lenet", synthetic=48, epochs=1, max_batches=1, batch_size=8,
                        val_size=16, method="cp")
    return Path(prun.run(cfg, tmp_path_factory.mktemp("runs"), quiet=True)["folder"])


@pytest.fixture
def evil(tmp_path, monkeypatch) -> Path:
    """A folder holding ``evilmod.py``, first on ``sys.path`` and the current folder."""
    home = tmp_path / "home"
    home.mkdir()
    (home / f"{EVIL}.py").write_text(EVIL_SOURCE)
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.chdir(home)
    sys.modules.pop(EVIL, None)
    yield home
    sys.modules.pop(EVIL, None)


def untouched(home: Path) -> None:
    assert EVIL not in sys.modules
    assert not (home / "IMPORTED").exists() and not (home / "CALLED").exists()


def evil_run(finished: Path, dest: Path, name: str | None = None) -> Path:
    """A copy of a finished LeNet run whose config.json names ``evilmod:make`` as its network
    (with a network id, as a run of a user's network records)."""
    run = dest / (name or finished.name)
    shutil.copytree(finished, run)
    cfg = json.loads((run / "config.json").read_text())
    cfg["task"]["model"] = f"{EVIL}:make"
    cfg["task"]["network_id"] = "0123456789abcdef"
    cfg["info"]["masked_sizes"] = {"fc1.weight": 784 * 300, "fc2.weight": 300 * 100}
    (run / "config.json").write_text(json.dumps(cfg))
    return run


def one_line(code: int, err: str) -> str:
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_export_of_a_run_folder_naming_code_imports_nothing(finished, evil, tmp_path, capsys):
    run = evil_run(finished, tmp_path)
    for fmt in ("pt2", "torchscript", "sparse"):
        err = one_line(X.main([str(run), "--format", fmt, "--out", str(tmp_path / "x")]),
                       capsys.readouterr().err)
        assert "never chooses code to run" in err and f"--model {EVIL}:make" in err, err
        untouched(evil)
        # another --model is compared as text before anything is imported
        err = one_line(X.main([str(run), "--format", fmt, "--out", str(tmp_path / "x"),
                               "--model", "othermod:net"]), capsys.readouterr().err)
        assert "not the run's network" in err, err
        untouched(evil)
    with pytest.raises(PBInputError, match="never chooses code"):
        X.export(run, "pt2", tmp_path / "y.pt2")
    untouched(evil)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y.pt2").exists()


def test_load_sparse_of_a_file_naming_code_imports_nothing(finished, evil, tmp_path):
    path = tmp_path / "s.pt"
    X.export(finished, "sparse", path)
    blob = torch.load(path, weights_only=True)
    blob["model"] = f"{EVIL}:make"
    torch.save(blob, path)
    with pytest.raises(PBInputError, match="never chooses code"):
        X.load_sparse(path)
    untouched(evil)


def test_pareto_and_scale_report_read_such_runs_without_importing(finished, evil, tmp_path,
                                                                   capsys):
    from analysis import pareto, scale_report

    runs = tmp_path / "runs"
    runs.mkdir()
    evil_run(finished, runs)
    assert pareto.main([str(runs), "--out", str(tmp_path / "fig")]) == 0
    assert list((tmp_path / "fig").glob(f"pareto_{EVIL}-make_*.png"))  # the run was read
    untouched(evil)
    try:
        scale_report.main(["--runs", str(runs), "--out", str(tmp_path / "claims")])
    except PBInputError:  # no claim's runs among them: refused, which is fine here
        pass
    capsys.readouterr()
    untouched(evil)


def test_sweep_commands_read_such_files_without_importing(finished, evil, tmp_path, capsys):
    toml = tmp_path / "s.toml"
    toml.write_text('[sweep]\ncommand = "prune"\nout = "o"\n[base]\n'
                    f'model = "{EVIL}:make"\ndataset = "mnist"\nsynthetic = 48\nepochs = 1\n')
    loaded = sweep_file.load(toml)
    untouched(evil)
    (run_id,) = [r.id for r in loaded.runs]
    run = evil_run(finished, loaded.out, "make-supermask-cp-0")
    cfg = json.loads((run / "config.json").read_text())
    cfg["info"]["sweep_id"] = run_id
    (run / "config.json").write_text(json.dumps(cfg))
    loaded.record_dir.mkdir(parents=True)
    runio.write_json(loaded.record_dir / f"{run_id}.json", {"id": run_id, "state": "finished"})
    outs = []
    for args in (["status", str(toml)], ["results", str(toml)],
                 ["run", str(toml), "--dry-run"], ["run", str(toml)]):
        assert sweep.main(args) == 0, args
        outs.append(capsys.readouterr().out)
        untouched(evil)
    assert "finished 1," in outs[0] and run.name in outs[1], outs
