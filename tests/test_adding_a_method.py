"""docs/adding_a_method.md is executed: each ``python`` block of the page is copied into a module
of a temporary package (its ``# file:`` line names it), imported (which registers the method),
and each method trains one synthetic epoch through ``python -m pbscale.prune`` (and
``pbscale.regress`` where it runs there), ``analysis.pareto`` and a sweep, whose children find
the methods through ``$PBSCALE_METHODS``. Each block is one file with one registration line."""

from __future__ import annotations

import csv
import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

from analysis import pareto
from pbexact import estimators as E
from pbexact.parametrizations import get_parametrization
from pbscale import io, prune, regress, sweep
from pbscale.methods import REGISTRY, MethodConfig, mc_gradient
from pbscale.methods.schedules import keep_count
from pbscale.models import build_model
from pbscale.regression import make_problem

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding_a_method.md"
PACKAGE = "doc_methods"
#: The methods the page defines, by module.
DEFINED = {"reinforce_pairs": "reinforce-pairs", "concrete": "concrete", "random_mask": "random"}


def doc_blocks(text: str) -> dict[str, str]:
    """{file name: code} of the page's ``python`` blocks (first line ``# file: NAME.py``)."""
    out = {}
    for code in re.findall(r"```python\n(.*?)```", text, re.S):
        first, _, rest = code.partition("\n")
        match = re.fullmatch(r"# file: (\w+)\.py", first.strip())
        assert match, f"a python block of {DOC.name} does not start with '# file: NAME.py'"
        out[match.group(1)] = rest
    return out


@pytest.fixture(scope="module")
def doc_methods(tmp_path_factory):
    """The page's modules in a package on sys.path, imported; the registries as they were
    afterwards."""
    root = tmp_path_factory.mktemp("doc")
    pkg = root / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    blocks = doc_blocks(DOC.read_text())
    assert set(blocks) == set(DEFINED)
    for name, code in blocks.items():
        (pkg / f"{name}.py").write_text(code)
    before, estimators = dict(REGISTRY), dict(E.REGISTRY)
    sys.path.insert(0, str(root))
    try:
        for name in blocks:
            importlib.import_module(f"{PACKAGE}.{name}")
        yield root, blocks
    finally:
        sys.path.remove(str(root))
        for name in blocks:
            sys.modules.pop(f"{PACKAGE}.{name}", None)
        sys.modules.pop(PACKAGE, None)
        REGISTRY.clear()
        REGISTRY.update(before)
        E.REGISTRY.clear()
        E.REGISTRY.update(estimators)


def test_each_block_is_one_file_with_one_registration_line(doc_methods):
    _, blocks = doc_methods
    for name, code in blocks.items():
        calls = re.findall(r"^@register$|^register(?:_estimator)?\(", code, re.M)
        assert len(calls) == 1, (name, calls)
        assert DEFINED[name] in REGISTRY, name


def _prune(tmp_path: Path, method: str, mode: str, out: Path) -> Path:
    args = ["--method", method, "--mode", mode, "--synthetic", "24", "--epochs", "1",
            "--max-batches", "2", "--batch-size", "8", "--val-size", "8", "--n", "4",
            "--target", "0.3", "--eval-masks", "2", "--eval-batches", "1", "--quiet",
            "--out", str(out)]
    assert prune.main(args) == 0, method
    (folder,) = [p for p in out.glob(f"lenet-{mode}-{method}-*") if p.is_dir()]
    return folder


@pytest.mark.parametrize("mode", ["supermask", "joint"])
def test_the_doc_methods_prune_and_plot(doc_methods, tmp_path, mode):
    runs = tmp_path / "runs"
    for method in DEFINED.values():
        folder = _prune(tmp_path, method, mode, runs)
        record = io.read_json(folder / "config.json")
        info = record["method_info"]
        assert info["name"] == method and info["label"] == REGISTRY[method].label
        summary = io.read_json(folder / "summary.json")
        assert 0 < summary["final_remaining"] <= 1
        assert (folder / "pruned.pt").exists()
        if method == "random":  # exactly round(target d) kept, the same mask every epoch
            net = build_model("lenet")
            d = sum(net.get_parameter(k).numel() for k in net.masked_names())
            rows = io.read_csv(folder / "metrics.csv")
            assert {r["remaining"] for r in rows} == {keep_count(0.3, d) / d}
    out = tmp_path / "plots"
    assert pareto.main([str(runs), "--out", str(out)]) == 0
    with open(out / "runs.csv") as fh:
        labels = {r["label"].split("-n")[0].removesuffix("-escort").removesuffix("-sigmoid")
                  for r in csv.DictReader(fh)}
    assert set(DEFINED.values()) <= labels
    assert (out / f"pareto_lenet_{mode}.png").exists()


def test_the_doc_methods_regress(doc_methods, tmp_path):
    problem = make_problem(0, n_train=200, n_valid=100, backbone_hidden=(6, 6),
                           target_hidden=(12, 12))
    for method in ("reinforce-pairs", "concrete"):
        cfg = MethodConfig(method=method, n=4, lr=0.05, seed=1,
                           settings={"tau": 0.3} if method == "concrete" else None)
        folder = regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                               problem=problem)
        history = io.read_csv(folder / "history.csv")
        assert len(history) == 2 and history[-1]["val_loss_chosen"] >= 0
    # the concrete temperature is its own setting: hashed under its name, off its default only
    assert MethodConfig(method="concrete", settings={"tau": 0.3}).to_dict()["concrete"] == {
        "tau": 0.3}
    assert "concrete" not in MethodConfig(method="concrete").to_dict()


def test_reinforce_pairs_is_unbiased(doc_methods):
    """The new estimator against the exact gradient of E[sum (z - c)^2] = sum theta (1 - 2c)
    + const at sigmoid logits r: (1 - 2c) theta (1 - theta), within 5 standard errors."""
    c = torch.tensor([0.2, 0.7, 0.4], dtype=torch.float64)
    r = torch.tensor([0.3, -0.5, 1.0], dtype=torch.float64)
    param = get_parametrization("sigmoid")
    theta = torch.sigmoid(r)
    exact = (1 - 2 * c) * theta * (1 - theta)
    draws = torch.stack([
        mc_gradient(lambda z: ((z - c) ** 2).sum(-1), r, param, "reinforce-pairs", 40,
                    torch.Generator().manual_seed(s), chunk=7).grad
        for s in range(400)])
    se = draws.std(0) / len(draws) ** 0.5
    assert bool(((draws.mean(0) - exact).abs() < 5 * se).all()), (draws.mean(0), exact)


def test_a_sweep_runs_the_doc_methods_in_its_children(doc_methods, tmp_path, monkeypatch):
    root, _ = doc_methods
    monkeypatch.setenv("PBSCALE_METHODS", ",".join(f"{PACKAGE}.{m}" for m in DEFINED))
    monkeypatch.setenv("PYTHONPATH", f"{root}:{ROOT}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = tmp_path / "doc.toml"
    path.write_text(f"""[sweep]
command = "prune"
out = "out"

[base]
synthetic = 24
epochs = 1
max_batches = 2
batch_size = 8
val_size = 8
n = 4
eval_masks = 2
eval_batches = 1

[[grid]]
method = {list(DEFINED.values())!r}
""".replace("'", '"'))
    assert sweep.main(["run", str(path), "--jobs", "1"]) == 0
    assert sweep.main(["results", str(path), "--csv", str(tmp_path / "r.csv")]) == 0
    with open(tmp_path / "r.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["method"] for r in rows} == set(DEFINED.values())
    for r in rows:
        info = io.read_json(Path(r["folder"]) / "config.json")["method_info"]
        assert info["name"] == r["method"]
