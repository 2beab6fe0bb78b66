"""Pruning the user's own network on the user's own data (docs/own_network.md).

* The same machine: the built-in LeNet-300-100 named by its import path and given real MNIST as
  arrays (``--data``) trains the built-in run bit for bit (masks, metrics), supermask ARMS,
  joint CP and a pruning group; the Python API gives the same run again.
* A zoo of networks of different shapes (tests/_zoo.py: a custom-forward MLP, a CNN with
  BatchNorm and a residual block, depthwise/grouped convolutions, 1-D convolutions, a masked
  embedding, tied weights, a regression): each trains one short epoch in supermask and joint
  mode with CP and ARMS, exports, and the exported network reproduces the run's test accuracy
  (test loss for the regression).
* Run identity: other data, or a changed network under the same import path, is another run
  folder; a rerun of the same resumes.
* Bad input (data, network, masks, loss) is one line with exit code 2, before training.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale import export as X
from pbscale import prune as P
from pbscale.nets.data import read_mnist
from pbscale.pruning import config as pconfig
from pbscale.pruning.api import prune_model
from pbscale.runs import io as runio

TESTS = Path(__file__).parent
import _zoo  # noqa: E402  (tests/ is on sys.path: the zoo imports as a user's module would)
from _mnist import MNIST_DIR as MNIST  # noqa: E402
from _mnist import needs_mnist  # noqa: E402


def _rows(folder: Path) -> list[dict]:
    return [r for r in runio.read_csv(folder / "metrics.csv")]


def _masks(folder: Path) -> dict[str, torch.Tensor]:
    blob = torch.load(folder / "masks.pt", weights_only=True)
    return {k: v for k, v in blob.items() if k.startswith("mask.")}


def _same_run(a: Path, b: Path) -> None:
    """Two run folders trained the same: every mask bit, and every metric to 1e-12 relative
    (the golden tolerance of metrics computed by the same float32 code)."""
    ma, mb = _masks(a), _masks(b)
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    ra, rb = _rows(a), _rows(b)
    assert len(ra) == len(rb)
    for x, y in zip(ra, rb):
        assert x.keys() == y.keys()
        for k in x:
            if not k.endswith("_seconds"):
                assert x[k] == pytest.approx(y[k], rel=1e-12, nan_ok=True), k


@pytest.fixture(scope="module")
def mnist_npz(tmp_path_factory) -> Path:
    xtr, ytr, xte, yte = read_mnist(MNIST)
    path = tmp_path_factory.mktemp("data") / "mnist.npz"
    np.savez(path, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    return path


EQUAL_RUNS = {
    "supermask-arms": ["--method", "arms", "--n", "4", "--epochs", "2", "--max-batches", "25",
                       "--eval-masks", "3", "--eval-batches", "2"],
    "joint-cp": ["--mode", "joint", "--method", "cp", "--epochs", "3", "--max-batches", "20",
                 "--lam", "1e-5"],
    "group-loorf": ["--method", "loorf", "--n", "2", "--epochs", "2", "--max-batches", "15",
                    "--seeds", "0-1", "--lam", "1e-4,1e-3", "--eval-masks", "2",
                    "--eval-batches", "2"],
}


@needs_mnist
@pytest.mark.parametrize("name", list(EQUAL_RUNS))
def test_lenet_by_import_path_on_arrays_is_the_builtin_run(name, mnist_npz, tmp_path):
    """Real MNIST: --model pbscale.nets.models:LeNet300100 --data mnist.npz trains the run of
    --model lenet --data-dir MNIST, mask bit for mask bit."""
    args = [*EQUAL_RUNS[name], "--threads", "1", "--quiet"]
    assert P.main([*args, "--data-dir", str(MNIST), "--out", str(tmp_path / "a")]) == 0
    assert P.main([*args, "--model", "pbscale.nets.models:LeNet300100", "--data", str(mnist_npz),
                   "--out", str(tmp_path / "b")]) == 0
    a = sorted(p for p in (tmp_path / "a").iterdir() if p.name.startswith("lenet-"))
    b = sorted(p for p in (tmp_path / "b").iterdir() if p.name.startswith("LeNet300100-"))
    assert len(a) == len(b) == (4 if name.startswith("group") else 1)
    def key(folder: Path) -> tuple:
        task = json.loads((folder / "config.json").read_text())["task"]
        return task["lam"], task["seed"]

    for fa, fb in zip(sorted(a, key=key), sorted(b, key=key)):
        _same_run(fa, fb)
        task = json.loads((fb / "config.json").read_text())["task"]
        assert task["model"] == "pbscale.nets.models:LeNet300100" and task["dataset"] == "arrays"
        assert len(task["network_id"]) == len(task["data_id"]) == 16


@needs_mnist
def test_the_python_api_is_the_same_run(tmp_path):
    """prune_model on MNIST arrays (the LeNet class as the factory) equals the command line."""
    xtr, ytr, xte, yte = read_mnist(MNIST)
    from pbscale.nets.models import LeNet300100

    args = EQUAL_RUNS["supermask-arms"]
    assert P.main([*args, "--threads", "1", "--quiet", "--data-dir", str(MNIST), "--out",
                   str(tmp_path / "cli")]) == 0
    res = prune_model(LeNet300100, (xtr, ytr), (xte, yte), method="arms", n=4, epochs=2,
                      max_batches=25, eval_masks=3, eval_batches=2, out=tmp_path / "api",
                      progress=False, threads=1)
    (cli,) = (tmp_path / "cli").iterdir()
    _same_run(cli, res.folder)
    assert res.summary["final_test_acc"] == json.loads((cli / "summary.json").read_text())[
        "final_test_acc"]
    pruned = res.pruned()
    assert torch.equal(pruned.fc1.weight_mask, res.masks["fc1.weight"])


# ------------------------------------------------------------------ the zoo


@pytest.fixture(scope="module")
def zoo_data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zoo")
    out = {}
    for kind in {k for k, _ in _zoo.ZOO.values()}:
        out[kind] = root / f"{kind}.npz"
        np.savez(out[kind], **_zoo.arrays(kind))
    return out


def _test_inputs(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    with np.load(path) as f:
        return torch.from_numpy(f["x_test"]), torch.from_numpy(f["y_test"])


@pytest.mark.parametrize("factory", list(_zoo.ZOO))
def test_zoo_trains_exports_and_reproduces(factory, zoo_data, tmp_path):
    """Each zoo network: supermask and joint, CP and ARMS, one short epoch; the pt2 export (and
    the sparse file) of each run gives the run's test accuracy (test loss) on the raw test
    arrays."""
    kind, masked = _zoo.ZOO[factory]
    data = zoo_data[kind]
    x, y = _test_inputs(data)
    for mode in ("supermask", "joint"):
        for method in ("cp", "arms"):
            out = tmp_path / f"{mode}-{method}"
            args = ["--model", f"_zoo:{factory}", "--data", str(data), "--mode", mode,
                    "--method", method, "--n", "2", "--epochs", "1", "--batch-size", "32",
                    "--eval-masks", "2", "--eval-batches", "2", "--lam", "1e-3", "--quiet",
                    "--threads", "1", "--out", str(out)]
            if masked:
                args += ["--masked", masked]
            assert P.main(args) == 0, (mode, method)
            (folder,) = out.iterdir()
            summary = json.loads((folder / "summary.json").read_text())
            X.export(folder, "pt2", tmp_path / f"{mode}-{method}.pt2", model=f"_zoo:{factory}")
            net = torch.export.load(str(tmp_path / f"{mode}-{method}.pt2")).module()
            sparse = X.load_sparse(_sparse(folder, tmp_path, f"_zoo:{factory}"),
                                   model=f"_zoo:{factory}")
            with torch.no_grad():
                got, ref = net(x), sparse(x)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
            if kind == "reg":
                mse = float(((got - y) ** 2).mean())
                assert mse == pytest.approx(summary["final_test_loss"], rel=1e-5)
                assert "final_test_acc" not in summary
            else:
                acc = int((got.argmax(1) == y).sum()) / len(y)
                assert acc == summary["final_test_acc"], (mode, method)


def _sparse(folder: Path, tmp: Path, model: str) -> Path:
    path = tmp / f"{folder.name}.sparse.pt"
    X.export(folder, "sparse", path, model=model)
    return path


def test_zoo_masks_follow_the_rule(zoo_data, tmp_path):
    """The paper's rule masks every Linear and convolution weight but the classifier, leaves
    tied weights dense, and --masked masks what it names (the embedding too)."""
    from pbscale.nets.network import masked_names, source_for

    def names(factory: str, patterns=()) -> list[str]:
        return masked_names(source_for(f"_zoo:{factory}").build(0), patterns=patterns)

    assert names("MLP") == ["fc1.weight", "fc2.weight"]
    assert names("Tied") == ["inp.weight"]
    assert names("depthwise") == ["0.weight", "2.weight", "5.weight"]
    assert names("Embed", ["emb.weight", "fc.*"]) == ["emb.weight", "fc.weight"]
    assert names("ResCNN") == ["conv.weight", "conv_a.weight", "conv_b.weight"]


def test_factory_init_model_keeps_its_weights_and_names_them(tmp_path, zoo_data):
    """init="model" keeps the factory's weights (drawn under the run's seed) and hashes them
    into the run's identity; the Kaiming init draws from the seed alone."""
    from pbscale.nets.network import network_id, source_for

    src = source_for("_zoo:MLP")
    a, b = src.build(3, "model"), src.build(3, "model")
    assert torch.equal(a.fc1.weight, b.fc1.weight)
    assert not torch.equal(a.fc1.weight, src.build(4, "model").fc1.weight)
    assert network_id(a, src.spec, "model") != network_id(src.build(4, "model"), src.spec,
                                                         "model")
    assert network_id(a, src.spec, "kaiming_normal") == network_id(
        src.build(4, "model"), src.spec, "kaiming_normal")


# ------------------------------------------------------------------ identity


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(cwd), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pbscale.prune", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_other_data_or_a_changed_network_is_another_folder(tmp_path):
    """The same options with other data, or with the factory's module edited (another width),
    never resume the old folder; the same again resumes it."""
    mod = tmp_path / "mynet.py"
    mod.write_text(textwrap.dedent("""
        from torch import nn
        def net():
            return nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 10))
    """))
    np.savez(tmp_path / "d1.npz", **_zoo.arrays("gray", seed=1))
    np.savez(tmp_path / "d2.npz", **_zoo.arrays("gray", seed=2))
    base = ["--model", "mynet:net", "--epochs", "1", "--batch-size", "32", "--quiet",
            "--threads", "1", "--out", "runs"]
    for data in ("d1.npz", "d2.npz", "d1.npz"):
        assert _cli([*base, "--data", data], tmp_path).returncode == 0
    assert len(list((tmp_path / "runs").iterdir())) == 2
    mod.write_text(mod.read_text().replace("12", "14"))
    assert _cli([*base, "--data", "d1.npz"], tmp_path).returncode == 0
    folders = list((tmp_path / "runs").iterdir())
    assert len(folders) == 3
    ids = {json.loads((f / "config.json").read_text())["task"]["network_id"] for f in folders}
    assert len(ids) == 2


# ------------------------------------------------------------------ bad input

BAD_NETS = '''
import torch
from torch import nn
def not_a_module():
    return 3
def raises():
    raise RuntimeError("no weights file")
def wrong_input():
    return nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 10))
def too_few_logits():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 3))
def ok():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
def tied():
    lin = nn.Linear(64, 64)
    return nn.Sequential(nn.Flatten(), lin, nn.ReLU(), lin, nn.Linear(64, 10))
def bad_loss(out, y):
    return out.mean()
class TiedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(256, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, 256, bias=False)
        self.out.weight = self.emb.weight
    def forward(self, x):
        return self.out(torch.relu(self.mid(self.emb(x).mean(1))))
'''


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad")
    (root / "badnets.py").write_text(BAD_NETS)
    good = _zoo.arrays("gray")
    np.savez(root / "good.npz", **good)
    np.savez(root / "nan.npz", **{**good, "x_train": good["x_train"].astype(np.float32) *
                                  np.where(np.arange(160)[:, None, None, None] == 3, np.nan, 1),
                                  "x_test": good["x_test"].astype(np.float32)})
    np.savez(root / "empty.npz", **{**good, "x_test": good["x_test"][:0],
                                    "y_test": good["y_test"][:0]})
    np.savez(root / "short.npz", **{**good, "y_train": good["y_train"][:-1]})
    np.savez(root / "missing.npz", x_train=good["x_train"], y_train=good["y_train"])
    np.savez(root / "objects.npz", **{**good, "y_test": np.array([{"a": 1}] * 64)})
    np.savez(root / "shapes.npz", **{**good, "x_test": good["x_test"][:, :, :4]})
    np.savez(root / "labels.npz", **{**good, "y_train": good["y_train"] + 20})
    (root / "junk.npz").write_bytes(b"not a zip file at all")
    crafted_npz(root / "huge.npz", good, {"x_train": (10**10, 1, 8, 8), "y_train": (10**10,)})
    crafted_npz(root / "lying.npz", good, {"x_train": (320, 1, 8, 8), "y_train": (320,)})
    u64 = good["y_train"].astype(np.uint64)
    u64[5] = 2**64 - 1
    np.savez(root / "uint64.npz", **{**good, "y_train": u64})
    ids = np.random.default_rng(1).integers(0, 256, (160, 6))
    np.savez(root / "ids.npz", x_train=ids[:128], y_train=ids[:128, 0] % 10, x_test=ids[128:],
             y_test=ids[128:, 0] % 10)
    np.savez(root / "ids8.npz", x_train=ids[:128].astype(np.uint8), y_train=ids[:128, 0] % 10,
             x_test=ids[128:].astype(np.uint8), y_test=ids[128:, 0] % 10)
    np.savez(root / "yfloat.npz", **{**good, "y_train": good["y_train"].astype(np.float64),
                                     "y_test": good["y_test"].astype(np.float64)})
    (root / "folder.npz").mkdir()
    crafted_npz(root / "negative.npz", good, {"x_train": (-5, 1, 8, 8)})
    os.mkfifo(root / "fifo.npz")
    return root


def crafted_npz(path: Path, arrays: dict[str, np.ndarray], lie: dict[str, tuple]) -> None:
    """An .npz of ``arrays`` whose members named in ``lie`` declare that shape in their header
    (their data as it is): what an edited or hostile file holds."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, a in arrays.items():
            buf = io.BytesIO()
            header = np.lib.format.header_data_from_array_1_0(a)
            header["shape"] = lie.get(name, a.shape)
            np.lib.format.write_array_header_1_0(buf, header)
            archive.writestr(f"{name}.npy", buf.getvalue() + a.tobytes())


BAD = [
    (["--model", "badnets:nothing", "--data", "good.npz"], r"badnets has no 'nothing'"),
    (["--model", "nosuchmodule:net", "--data", "good.npz"], r"cannot import nosuchmodule"),
    (["--model", "badnets:not_a_module", "--data", "good.npz"], r"returned a int, not an "
                                                                r"nn.Module"),
    (["--model", "badnets:raises", "--data", "good.npz"], r"calling it failed \(RuntimeError: "
                                                          r"no weights file\)"),
    (["--model", "badnets:wrong_input", "--data", "good.npz"], r"fails on the data's inputs"),
    (["--model", "badnets:too_few_logits", "--data", "good.npz"], r"labels go up to 9"),
    (["--model", "badnets:ok", "--data", "labels.npz"], r"labels go up to 29"),
    (["--model", "badnets:ok"], r"has no data set of its own; give your data with --data"),
    (["--model", "badnets:ok", "--data", "nan.npz"], r"x_train holds NaN"),
    (["--model", "badnets:ok", "--data", "empty.npz"], r"x_test is empty"),
    (["--model", "badnets:ok", "--data", "short.npz"], r"y_train has 159"),
    (["--model", "badnets:ok", "--data", "missing.npz"], r"has no x_test, y_test"),
    (["--model", "badnets:ok", "--data", "objects.npz"], r"Python objects \(pickles\)"),
    (["--model", "badnets:ok", "--data", "shapes.npz"], r"store every split alike"),
    (["--model", "badnets:ok", "--data", "junk.npz"], r"is not a readable .npz"),
    (["--model", "badnets:ok", "--data", "nope.npz"], r"no such file"),
    (["--model", "badnets:ok", "--data", "folder.npz"], r"folder.npz is a folder"),
    (["--model", "badnets:ok", "--data", "huge.npz"],
     r"x_train \[10000000000, 1, 8, 8\] uint8.*store at most [\d,]+ training examples"),
    (["--model", "badnets:ok", "--data", "lying.npz"],
     r"x_train declares \[320, 1, 8, 8\] uint8 \(20,480 bytes\), but the archive holds"),
    (["--model", "badnets:ok", "--data", "negative.npz"], r"\[-5, 1, 8, 8\], with a negative"),
    (["--model", "badnets:ok", "--data", "fifo.npz"], r"fifo.npz is not a regular file"),
    (["--model", "badnets:ok", "--data", "uint64.npz"],
     r"y_train holds 18446744073709551615, past the largest int64"),
    (["--model", "badnets:ok", "--data", "good.npz", "--masked", "conv*"],
     r"pattern 'conv\*' matches no parameter"),
    (["--model", "badnets:ok", "--data", "good.npz", "--masked", "1.bias"],
     r"cannot mask 1.bias: a 1-d parameter"),
    (["--model", "badnets:tied", "--data", "good.npz", "--masked", "1.weight"],
     r"cannot mask 1.weight: the network uses it in two places"),
    (["--model", "badnets:TiedHead", "--data", "ids.npz", "--masked", "out.weight"],
     r"pattern 'out.weight' names out.weight, which is tied to emb.weight .*leave it out"),
    (["--model", "badnets:TiedHead", "--data", "ids.npz", "--mask-head"],
     r"--mask-head: the classifier's weight out.weight is tied to emb.weight .*change nothing"),
    (["--model", "badnets:TiedHead", "--data", "ids8.npz"],
     r"fails on uint8 inputs .*taken for images .*store the ids as int64"),
    (["--model", "badnets:ok", "--data", "yfloat.npz"],
     r"returns 10 logits per example .*targets are floats \(whole numbers 0 to 9\).*store y as "
     r"int64 .*--loss mse"),
    (["--model", "badnets:ok", "--data", "good.npz", "--loss", "badnets:bad_loss"],
     r"returned \[\] for 2 masks"),
    (["--model", "badnets:ok", "--data", "good.npz", "--loss", "huber"], r"unknown --loss"),
    (["--model", "badnets:ok", "--data", "good.npz", "--dataset", "mnist"],
     r"--data gives the data and --dataset mnist"),
    (["--model", "not a path"], r"unknown model 'not a path'"),
]


@pytest.mark.parametrize("args,match", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_input_is_one_line_before_training(args, match, bad_dir, monkeypatch, capsys):
    monkeypatch.chdir(bad_dir)
    monkeypatch.syspath_prepend(str(bad_dir))
    code = P.main([*args, "--epochs", "1", "--out", "runs", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert re.search(match, err[0]), err[0]
    assert not (bad_dir / "runs").exists() or not any((bad_dir / "runs").iterdir())


def test_a_data_files_layout_is_checked_before_its_arrays_are_read(bad_dir, monkeypatch):
    """A zip bomb (here: any file) whose layout is wrong is refused from its headers, before
    numpy decompresses an array: np.load is never called."""
    from pbscale.nets import user_data

    def no_load(*args, **kwargs):
        raise AssertionError("np.load read the arrays before their headers were checked")

    monkeypatch.setattr(np, "load", no_load)
    for name, match in (("short.npz", "y_train has 159"), ("shapes.npz", "alike"),
                        ("huge.npz", "training examples"), ("lying.npz", "archive holds")):
        with pytest.raises(PBInputError, match=match):
            user_data.read_npz(bad_dir / name)


def test_a_float_target_regression_reports_loss_not_accuracy(zoo_data, tmp_path, capsys):
    assert P.main(["--model", "_zoo:regressor", "--data", str(zoo_data["reg"]), "--epochs",
                   "1", "--batch-size", "32", "--out", str(tmp_path), "--threads", "1",
                   "--quiet"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("test_loss ") and "test_acc" not in line
    (folder,) = tmp_path.iterdir()
    header = _rows(folder)[0].keys()
    assert "val_loss" in header and "val_acc" not in header
    assert json.loads((folder / "config.json").read_text())["info"]["loss"] == "mse"


# ------------------------------------------------------------------ the Python API


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def test_api_takes_datasets_loaders_and_tensors_alike(tmp_path):
    """(x, y) arrays, tensors, a Dataset and a shuffling DataLoader of the same examples are the
    same data: the same run folder, read back as finished."""
    a = _zoo.arrays("gray")
    kw = dict(method="cp", epochs=1, batch_size=32, out=tmp_path, progress=False, threads=1)
    r1 = prune_model(_zoo.MLP(), (a["x_train"], a["y_train"]), (a["x_test"], a["y_test"]), **kw)
    r2 = prune_model(_zoo.MLP, (torch.from_numpy(a["x_train"]), torch.from_numpy(a["y_train"])),
                     _Pairs(a["x_test"], a["y_test"]), **kw)
    loader = torch.utils.data.DataLoader(_Pairs(a["x_train"], a["y_train"]), batch_size=7,
                                         shuffle=True)
    r3 = prune_model(_zoo.MLP(), loader, (a["x_test"], a["y_test"]), **kw)
    assert r1.folder == r3.folder and r1.summary == r3.summary
    assert r2.summary["final_test_acc"] == r1.summary["final_test_acc"]
    assert r1.metrics[-1]["epoch"] == 1 and set(r1.masks) == {"fc1.weight", "fc2.weight"}


def test_api_group_returns_one_result_per_run(tmp_path):
    """Lists of seeds and lambdas train as one pruning group; each result is its run."""
    a = _zoo.arrays("gray")
    res = prune_model(_zoo.MLP(), (a["x_train"], a["y_train"]), (a["x_test"], a["y_test"]),
                      method="arms", n=2, seed=[0, 1], lam=[1e-4, 1e-2], epochs=1,
                      batch_size=32, out=tmp_path, progress=False, threads=1, eval_masks=2)
    assert [(r.config.lam, r.config.seed) for r in res] == [(1e-4, 0), (1e-4, 1), (1e-2, 0),
                                                            (1e-2, 1)]
    assert len({r.folder for r in res}) == 4 and all(r.folder.is_dir() for r in res)
    assert res[0].summary["final_remaining"] > res[2].summary["final_remaining"]


def test_api_applies_the_commands_allocator_setting(tmp_path, monkeypatch):
    """prune_model sets glibc's allocator as ``python -m pbscale.prune`` does
    (:func:`pbscale.runs.allocator.keep_freed_memory`, which honours the opt-out itself), once
    its settings are read: not for a call refused on its settings."""
    import pbscale.pruning.api as api
    from pbexact.errors import PBInputError

    calls = []
    monkeypatch.setattr(api, "keep_freed_memory", lambda: calls.append(1) or True)
    a = _zoo.arrays("gray")
    with pytest.raises(PBInputError, match="unknown setting"):
        prune_model(_zoo.MLP(), (a["x_train"], a["y_train"]), (a["x_test"], a["y_test"]),
                    epoch=3, out=tmp_path)
    assert calls == []
    prune_model(_zoo.MLP(), (a["x_train"], a["y_train"]), (a["x_test"], a["y_test"]),
                method="cp", epochs=1, batch_size=32, out=tmp_path, progress=False, threads=1)
    assert calls == [1]


def test_api_bad_input_is_one_line(tmp_path):
    a = _zoo.arrays("gray")
    from pbexact.errors import PBInputError

    with pytest.raises(PBInputError, match="unknown setting 'epoch'"):
        prune_model(_zoo.MLP(), (a["x_train"], a["y_train"]), (a["x_test"], a["y_test"]),
                    epoch=3, out=tmp_path)
    with pytest.raises(PBInputError, match="give both train and test"):
        prune_model(_zoo.MLP(), (a["x_train"], a["y_train"]), out=tmp_path)
    with pytest.raises(PBInputError, match="must be an nn.Module"):
        prune_model(3, (a["x_train"], a["y_train"]), (a["x_test"], a["y_test"]), out=tmp_path)


KILLED = '''
import sys, numpy as np, torch
sys.path.insert(0, {tests!r})
import _zoo
from pbscale.pruning.api import prune_model
a = _zoo.arrays("gray", n_train=2000)
r = prune_model(_zoo.MLP(), (a["x_train"], a["y_train"]), (a["x_test"], a["y_test"]),
                method="arms", n=2, epochs=6, batch_size=16, out={out!r}, progress=False,
                threads=1)
print(r.folder)
'''


def test_api_run_killed_resumes_to_the_same_numbers(tmp_path):
    """SIGKILL in the middle of the third epoch: the rerun resumes from the last checkpoint and
    ends with the uninterrupted run's masks and metrics."""
    import signal
    import time

    def script(out: Path) -> list[str]:
        return [sys.executable, "-c", KILLED.format(tests=str(TESTS), out=str(out))]

    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    ref = subprocess.run(script(tmp_path / "ref"), env=env, capture_output=True, text=True,
                         timeout=300)
    assert ref.returncode == 0, ref.stderr
    proc = subprocess.Popen(script(tmp_path / "cut"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 200
    while time.time() < deadline:
        ckpt = list((tmp_path / "cut").glob("*/checkpoint.pt"))
        rows = list((tmp_path / "cut").glob("*/metrics.csv"))
        if ckpt and rows and len(runio.read_csv(rows[0])) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = subprocess.run(script(tmp_path / "cut"), env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    (a,), (b,) = (tmp_path / "ref").iterdir(), (tmp_path / "cut").iterdir()
    _same_run(a, b)


def test_api_tied_weights_stay_dense_and_train(tmp_path):
    """A network with tied weights trains (the tied pair unmasked) and its pruned form keeps
    the tie."""
    a = _zoo.arrays("gray")
    res = prune_model(_zoo.Tied(), (a["x_train"], a["y_train"]), (a["x_test"], a["y_test"]),
                      method="arms", n=2, mode="joint", epochs=1, batch_size=32, out=tmp_path,
                      progress=False, threads=1, eval_masks=2)
    net = res.pruned()
    assert net.a.weight is net.b.weight and set(res.masks) == {"inp.weight"}
    assert isinstance(net, nn.Module)


# ------------------------------------------------------------------ every family, groups, sweeps


def _family_runs() -> list[tuple[str, str]]:
    from pbscale.methods import REGISTRY
    from pbscale.pruning.config import MODES

    return [(name, mode) for name in pconfig.prune_methods() for mode in MODES
            if f"prune-{mode}" in REGISTRY[name].caps.commands]


@pytest.mark.parametrize("method,mode", _family_runs())
def test_every_family_prunes_a_user_network(method, mode, zoo_data, tmp_path):
    """Each pruning family of the registry, in each mode it runs in, on the CNN with BatchNorm
    and a residual block (the generic path): one short epoch, a finished run folder whose masks
    cover exactly the paper's rule's weights."""
    out = tmp_path / "runs"
    assert P.main(["--model", "_zoo:ResCNN", "--data", str(zoo_data["gray"]), "--mode", mode,
                   "--method", method, "--n", "2", "--epochs", "1", "--batch-size", "40",
                   "--eval-masks", "2", "--eval-batches", "1", "--target", "0.5", "--quiet",
                   "--threads", "1", "--out", str(out)]) == 0
    (folder,) = out.iterdir()
    assert set(_masks(folder)) == {"mask.conv.weight", "mask.conv_a.weight",
                                   "mask.conv_b.weight"}
    assert 0 <= json.loads((folder / "summary.json").read_text())["final_remaining"] <= 1


@pytest.mark.parametrize("factory,method", [("regressor", "arms"), ("ResCNN", "loorf"),
                                            ("Embed", "cp")])
def test_a_group_of_a_user_network_is_its_runs(factory, method, zoo_data, tmp_path, capsys):
    """A pruning group of a user's network (float targets with MSE, the vmap path, a masked
    embedding) trains each member as its separate run; rerun, the finished group reads its
    members back with their task's summary keys (test loss for float targets), trains nothing
    and reports one line per member."""
    kind, masked = _zoo.ZOO[factory]
    args = ["--model", f"_zoo:{factory}", "--data", str(zoo_data[kind]), "--method", method,
            "--n", "2", "--epochs", "2", "--batch-size", "32", "--eval-masks", "2",
            "--quiet", "--threads", "1", *(["--masked", masked] if masked else [])]
    assert P.main([*args, "--seeds", "0,1", "--out", str(tmp_path / "group")]) == 0
    for seed in (0, 1):
        assert P.main([*args, "--seed", str(seed), "--out", str(tmp_path / f"alone{seed}")]) == 0
    group = sorted((tmp_path / "group").glob("*-*-*-*"),
                   key=lambda p: json.loads((p / "config.json").read_text())["task"]["seed"])
    assert len(group) == 2
    for seed, member in enumerate(group):
        (alone,) = (tmp_path / f"alone{seed}").iterdir()
        assert member.name == alone.name
        ma, mb = _masks(member), _masks(alone)
        assert all(torch.equal(ma[k], mb[k]) for k in ma)
        for x, y in zip(_rows(member), _rows(alone)):
            for k in x:
                if not k.endswith("_seconds"):
                    assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7, nan_ok=True), k
    before = {p: p.read_bytes() for p in (tmp_path / "group").rglob("*") if p.is_file()}
    capsys.readouterr()
    assert P.main([*args, "--seeds", "0,1", "--out", str(tmp_path / "group")]) == 0
    said = capsys.readouterr()
    assert all(member.name in said.out for member in group), said.out
    after = {p: p.read_bytes() for p in (tmp_path / "group").rglob("*") if p.is_file()}
    assert after == before


def test_a_sweep_of_a_user_network_runs_as_a_group(tmp_path):
    """A sweep file names the user's network and data; its seeds train as one pruning group
    child, and the sweep reads every run back as finished."""
    (tmp_path / "sweepnet.py").write_text(textwrap.dedent("""
        from torch import nn
        def net():
            return nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 10))
    """))
    np.savez(tmp_path / "d.npz", **_zoo.arrays("gray"))
    (tmp_path / "s.toml").write_text(textwrap.dedent("""
        [sweep]
        command = "prune"
        out = "runs"
        group = true
        threads = 1

        [base]
        model = "sweepnet:net"
        data = "d.npz"
        epochs = 1
        batch_size = 32
        method = "cp"
        seed = [0, 1, 2]
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS.parent)])}

    def sweep(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pbscale.sweep", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)

    res = sweep("run", "s.toml", "--jobs", "1")
    assert res.returncode == 0, res.stderr
    assert len([p for p in (tmp_path / "runs").iterdir() if p.name.startswith("net-")]) == 3
    status = sweep("status", "s.toml")
    assert status.returncode == 0 and "finished 3" in status.stdout, status.stdout
