"""pbscale.export refuses damaged or tampered run folders and unsafe ``--out`` paths in one
line (exit 2), in every format, and writes atomically: the cases of issue 38 (a damaged or
edited pruned.pt, config.json or data.json; a run without summary.json; NaN weights; an
``--out`` that is a device node, FIFO or symlink; a full disk under ``ulimit -f``) and of
issue 50 (a run of the user's network exported without its --model, with another one, or with
a factory that now builds another network; a mask that is not 0/1)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pbexact.errors import PBInputError
from pbscale import export as X
from pbscale import prune as P
from pbscale.pruning import config as pconfig
from pbscale.pruning import outputs as poutputs
from pbscale.pruning import run as prun

FORMATS = ["torchscript", "sparse"] + (
    ["onnx"] if all(__import__("importlib").util.find_spec(m) for m in ("onnx", "onnxscript"))
    else [])


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    cfg = pconfig.PruneConfig(model="lenet", synthetic=48, epochs=1, max_batches=1, batch_size=8,
                        val_size=16, method="cp")
    return Path(prun.run(cfg, tmp_path_factory.mktemp("runs"), quiet=True)["folder"])


def copy(folder: Path, dest: Path) -> Path:
    out = dest / folder.name
    shutil.copytree(folder, out)
    return out


def refused(capsys, run: Path, fmt: str, out: Path) -> str:
    assert X.main([str(run), "--format", fmt, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def pruned_cases(good: dict) -> dict:
    wrong = dict(good)
    wrong["fc1.weight_orig"] = torch.zeros(3, 3)
    missing = {k: v for k, v in good.items() if k != "fc2.bias"}
    nan = dict(good)
    nan["fc2.weight_orig"] = good["fc2.weight_orig"].clone()
    nan["fc2.weight_orig"][0, 0] = float("nan")
    return {"empty": b"", "random": os.urandom(4096), "list": pickle.dumps([1, 2]),
            "wrong shape": wrong, "missing key": missing, "nan": nan}


def test_damaged_pruned_pt_is_one_line_in_every_format(finished, tmp_path, capsys) -> None:
    good = torch.load(finished / "pruned.pt", weights_only=True)
    raw = (finished / "pruned.pt").read_bytes()
    cases = {**pruned_cases(good), "truncated": raw[: len(raw) // 2]}
    for name, content in cases.items():
        run = copy(finished, tmp_path / name.replace(" ", "_"))
        if isinstance(content, bytes):
            (run / "pruned.pt").write_bytes(content)
        else:
            torch.save(content, run / "pruned.pt")
        for fmt in FORMATS:
            err = refused(capsys, run, fmt, tmp_path / f"{fmt}.out")
            assert "pruned.pt" in err, (name, err)
            assert not (tmp_path / f"{fmt}.out").exists()


def edit(run: Path, name: str, key: tuple, value) -> None:
    path = run / name
    obj = json.loads(path.read_text())
    target = obj
    for k in key[:-1]:
        target = target[k]
    if key:
        target[key[-1]] = value
    else:
        obj = value
    path.write_text(json.dumps(obj))


@pytest.mark.parametrize("name,key,value", [
    ("config.json", ("task", "model"), "conv6"),
    ("config.json", ("task", "model"), ["lenet"]),
    ("config.json", ("task",), "lenet"),
    ("data.json", ("mean",), ["a"]),
    ("data.json", ("mean",), "0.1"),
    ("data.json", ("std",), [0.0]),
    ("data.json", ("input_shape",), []),
    ("data.json", ("input_shape",), [-784]),
    ("data.json", ("input_shape",), [784.0]),
    ("data.json", ("input_shape",), ["784"]),
    ("data.json", ("input_shape",), [10**12]),
    ("data.json", ("input_shape",), [783]),
    ("summary.json", None, None),
])
def test_edited_run_files_are_one_line(finished, tmp_path, capsys, name, key, value) -> None:
    run = copy(finished, tmp_path)
    if key is None:
        (run / name).unlink()
    else:
        edit(run, name, key, value)
    for fmt in FORMATS:
        err = refused(capsys, run, fmt, tmp_path / f"{fmt}.out")
        assert name.split(".")[0] in err or "run folder" in err, err
        assert not (tmp_path / f"{fmt}.out").exists()


def test_out_that_is_a_fifo_or_symlink_is_refused(finished, tmp_path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    for fmt in FORMATS:
        assert "not a regular file" in refused(capsys, finished, fmt, fifo)
        assert "symlink" in refused(capsys, finished, fmt, link)
    assert fifo.is_fifo() and target.read_bytes() == b"keep" and link.is_symlink()
    if os.geteuid() == 0:  # a character device: mknod needs root
        dev = tmp_path / "null"
        os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
        assert "not a regular file" in refused(capsys, finished, "sparse", dev)
        assert not dev.is_file()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_full_disk_is_one_line_and_keeps_the_old_file(finished, tmp_path, fmt) -> None:
    """Under ``ulimit -f 200`` (200 blocks: the export is larger) the write fails with one line
    and exit 2; the --out already there keeps its content and no temporary file is left."""
    out = tmp_path / "net.out"
    out.write_bytes(b"old")
    code = (f"ulimit -f 200; exec {sys.executable} -m pbscale.export {finished} --format {fmt} "
            f"--out {out}")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(X.__file__).parents[1])})
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "ulimit -f" in proc.stderr
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.out"]


# ------------------------------------------------------------------ the user's network (issue 50)

NET = '''
from torch import nn


def net():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 10))


def other():
    return net()
'''


@pytest.fixture
def own_run(tmp_path, monkeypatch) -> Path:
    """A finished run of ``ownnet:net`` (a module on the path) on small arrays."""
    import _zoo
    import numpy as np

    home = tmp_path / "home"
    home.mkdir()
    (home / "ownnet.py").write_text(NET)
    monkeypatch.syspath_prepend(str(home))
    sys.modules.pop("ownnet", None)
    np.savez(home / "d.npz", **_zoo.arrays("gray", seed=1))
    assert P.main(["--model", "ownnet:net", "--data", str(home / "d.npz"), "--epochs", "1",
                   "--batch-size", "32", "--max-batches", "2", "--quiet", "--threads", "1",
                   "--out", str(tmp_path / "runs")]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    yield run
    sys.modules.pop("ownnet", None)


def test_the_users_network_must_be_named_and_be_the_runs(own_run, tmp_path, capsys) -> None:
    """Without --model, with another import path, or with a factory that now builds another
    network, the export is refused in one line naming the fix; --model with the run's import
    path (or the factory itself in Python) exports."""
    out = tmp_path / "net.pt2"
    assert "--model ownnet:net" in refused(capsys, own_run, "pt2", out)
    for fmt in ("pt2", "sparse"):
        assert X.main([str(own_run), "--format", fmt, "--out", str(out), "--model",
                       "ownnet:other"]) == 2
        assert "not the run's network" in capsys.readouterr().err
    import ownnet

    with pytest.raises(PBInputError, match="not the run's network ownnet:net"):
        X.export(own_run, "pt2", out, model=ownnet.other)
    assert not out.exists()
    assert X.main([str(own_run), "--out", str(out), "--model", "ownnet:net"]) == 0
    assert out.is_file()
    assert X.export(own_run, "sparse", tmp_path / "s.pt", model=ownnet.net).is_file()
    sys.modules.pop("ownnet")
    original = (own_run / "config.json").read_text()
    path = Path(ownnet.__file__)
    path.write_text(NET.replace("12", "140"))  # the same import path, another network
    capsys.readouterr()
    assert X.main([str(own_run), "--out", str(tmp_path / "again.pt2"), "--model",
                   "ownnet:net"]) == 2
    err = capsys.readouterr().err
    assert "another network than the run's" in err and "(140, 64)" in err, err
    for key, value in (("network_id", 5), ("network_id", "zz"), ("seed", "x"),
                       ("init", "bogus")):  # edited: damaged, not another network
        (own_run / "config.json").write_text(original)
        edit(own_run, "config.json", ("task", key), value)
        assert X.main([str(own_run), "--out", str(tmp_path / "again.pt2"), "--model",
                       "ownnet:net"]) == 2
        assert "damaged run file" in capsys.readouterr().err


def test_a_mask_that_is_not_binary_is_refused(finished, tmp_path, capsys) -> None:
    """pruned.pt's mask edited to mask * 3 - 7 (the weights it keeps would be scaled by -4
    and the pruned ones by -7) is refused in every format, and by load_pruned."""
    run = copy(finished, tmp_path)
    state = torch.load(run / "pruned.pt", weights_only=True)
    state["fc1.weight_mask"] = state["fc1.weight_mask"] * 3 - 7
    torch.save(state, run / "pruned.pt")
    for fmt in FORMATS:
        err = refused(capsys, run, fmt, tmp_path / f"{fmt}.out")
        assert "fc1.weight_mask holds" in err and "not only 0 and 1" in err, err
        assert not (tmp_path / f"{fmt}.out").exists()
    with pytest.raises(PBInputError, match="not only 0 and 1"):
        poutputs.load_pruned("lenet", run / "pruned.pt")


def test_out_under_a_file_and_a_dangling_symlink_are_refused(finished, tmp_path, capsys) -> None:
    """--out FILE/x names the file it is under (a3f3b10 said the folder does not exist); a
    dangling symlink as --out is refused and stays a dangling symlink (the injected bug of
    issue 50: without export's symlink check the atomic write put a regular file in the
    link's place)."""
    afile = tmp_path / "afile"
    afile.write_text("keep")
    err = refused(capsys, finished, "sparse", afile / "x")
    assert f"is under {afile}, which is a file" in err, err
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for fmt in FORMATS:
        assert "symlink" in refused(capsys, finished, fmt, dangling)
        assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()
    assert afile.read_text() == "keep"


def test_a_full_disk_says_export_again_not_resume(finished, tmp_path, capsys,
                                                  monkeypatch) -> None:
    """ENOSPC while the export is written (emulated): one line saying that a file already at
    --out is intact and how to go on; nothing there resumes, so it does not say so."""
    import errno

    from pbscale.runs import io as runio

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runio, "atomic_write_bytes", full)
    out = tmp_path / "net.pt"
    out.write_bytes(b"old")
    err = refused(capsys, finished, "sparse", out)
    assert "No space left on device" in err and "a file already there is intact" in err, err
    assert "free disk space" in err and "resume" not in err
    assert out.read_bytes() == b"old"


def test_export_takes_the_python_apis_result(tmp_path, monkeypatch, capsys) -> None:
    """``export(result, ...)`` with the PruneResult of ``prune_model`` (a network object and
    arrays given in Python) exports with the network the result carries (into folders that do
    not exist yet), the same network in every format; without it, the run folder alone is
    refused in one line and makes no folder."""
    import _zoo

    from pbscale import prune_model

    home = tmp_path / "home"
    home.mkdir()
    (home / "ownnet.py").write_text(NET)
    monkeypatch.syspath_prepend(str(home))
    sys.modules.pop("ownnet", None)
    import ownnet

    data = _zoo.arrays("gray", seed=1)
    result = prune_model(ownnet.net(), (data["x_train"], data["y_train"]),
                         (data["x_test"], data["y_test"]), epochs=1, batch_size=32,
                         max_batches=2, out=tmp_path / "runs", progress=False)
    try:
        out = X.export(result, "pt2", tmp_path / "new" / "deeper" / "net.pt2")
        assert out.is_file()
        x = torch.from_numpy(data["x_test"][:8])
        sparse = X.load_sparse(X.export(result, "sparse", tmp_path / "s.pt"),
                               model=result.source)
        with torch.no_grad():
            assert torch.allclose(torch.export.load(out).module()(x), sparse(x), atol=1e-5)
        assert X.main([str(result.folder), "--out", str(tmp_path / "no" / "net.pt2")]) == 2
        assert "never chooses code" in capsys.readouterr().err
        assert not (tmp_path / "no").exists()
    finally:
        sys.modules.pop("ownnet", None)


def test_out_in_a_folder_that_does_not_exist_is_created(own_run, tmp_path, capsys) -> None:
    """--out in folders that do not exist yet: created once every check has passed, as every
    other tool's --out; a refused export (another --model) creates none."""
    assert X.main([str(own_run), "--model", "ownnet:other", "--out",
                   str(tmp_path / "no" / "net.pt2")]) == 2
    assert "not the run's network" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()
    for fmt in ("pt2", "sparse"):
        out = tmp_path / "a" / fmt / "net.out"
        assert X.main([str(own_run), "--model", "ownnet:net", "--format", fmt, "--out",
                       str(out)]) == 0, capsys.readouterr().err
        assert out.is_file()
