"""A sweep whose data file or network module changed after its runs finished (issue 53, item 2).

A real ``.npz`` and a network module of the user's: after one pixel of the data changes,
``sweep run`` stops in one line with the choice (``--rerun-changed`` or ``--keep-changed``)
instead of "nothing to run", ``status`` and ``results`` say so in one warning line;
``--rerun-changed`` trains a new run folder beside the old one, which ``results`` then shows;
``--keep-changed`` keeps the old runs and stops asking. An edited module (a comment added) is
named too; the rerun's child builds the network, finds the same network and reads the old run
back, and the sweep stops asking.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from pbscale import sweep

ROOT = Path(__file__).resolve().parents[1]

NET = '''
from torch import nn


def make():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 3))
'''

SWEEP = '''
[sweep]
command = "prune"
out = "o"
threads = 1

[base]
model = "tinynet:make"
data = "d.npz"
mode = "joint"
method = "cp"
epochs = 1
max_batches = 2
batch_size = 16
'''


def write_data(path: Path, bump: int = 0) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (120, 1, 8, 8)).astype(np.uint8)
    y = rng.integers(0, 3, 120)
    x[0, 0, 0, 0] = (int(x[0, 0, 0, 0]) + bump) % 256  # one byte of the data
    np.savez(path, x_train=x[:90], y_train=y[:90], x_test=x[90:], y_test=y[90:])


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A folder holding the network's module, the data and the sweep file, as the current
    folder; the sweep's children import this checkout."""
    (tmp_path / "tinynet.py").write_text(NET)
    (tmp_path / "sweep.toml").write_text(SWEEP)
    write_data(tmp_path / "d.npz")
    monkeypatch.chdir(tmp_path)
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{path}" if path else str(ROOT))
    return tmp_path


def sweep_cli(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m pbscale.sweep ARGS sweep.toml`` in this process: (exit code, out, err)."""
    code = sweep.main([*args[:1], "sweep.toml", *args[1:]])
    got = capsys.readouterr()
    return code, got.out, got.err


def folders(home: Path) -> list[Path]:
    return sorted(p.parent for p in (home / "o").glob("*/summary.json"))


def data_id(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["task"]["data_id"]


def test_a_sweep_notices_changed_data_and_network(home, capsys):
    code, _, err = sweep_cli(capsys, "run")
    assert code == 0, err
    (old,) = folders(home)

    write_data(home / "d.npz", bump=1)  # one pixel of the training images changes
    code, _, err = sweep_cli(capsys, "run")
    assert code == 2, err
    err = err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "1 of 1 finished runs were trained on other data than d.npz now holds" in err, err
    assert "--rerun-changed" in err and "--keep-changed" in err, err
    assert folders(home) == [old]  # nothing trained
    for action in ("status", "results"):
        code, _, err = sweep_cli(capsys, action)
        assert code == 0, err
        warned = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
        assert len(warned) == 1 and "other data than d.npz" in warned[0], err

    code, _, err = sweep_cli(capsys, "run", "--rerun-changed")
    assert code == 0, err
    new = [f for f in folders(home) if f != old]
    assert len(new) == 1 and old.exists()  # a new run folder beside the old one
    assert data_id(new[0]) != data_id(old)
    code, out, err = sweep_cli(capsys, "results")
    assert new[0].name in out and old.name not in out, out
    assert "warning" not in err, err
    assert "nothing to run" in sweep_cli(capsys, "run")[2]

    (home / "tinynet.py").write_text(NET + "# an edit that leaves the network as it was\n")
    code, _, err = sweep_cli(capsys, "status")
    assert "tinynet.py as it was before an edit" in err, err
    assert sweep_cli(capsys, "run")[0] == 2
    code, _, err = sweep_cli(capsys, "run", "--rerun-changed")
    assert code == 0, err
    assert len(folders(home)) == 2  # the same network: its run read back, none trained
    assert "warning" not in sweep_cli(capsys, "status")[2]

    write_data(home / "d.npz", bump=2)  # changed again: keep the runs as they are
    code, _, err = sweep_cli(capsys, "run", "--keep-changed")
    assert code == 0 and "kept 1 changed runs" in err, err
    assert len(folders(home)) == 2
    for action in ("status", "run"):
        code, _, err = sweep_cli(capsys, action)
        assert code == 0 and "warning" not in err, err
