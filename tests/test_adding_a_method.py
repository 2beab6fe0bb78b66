"""docs/adding_a_method.md is executed, from both places a method can live.

As a plugin outside the package: each ``python`` block of the page is copied into a module of
a temporary package (its ``# file:`` line names it), imported (which registers the method), and
each method trains one synthetic epoch through ``python -m pbscale.prune`` (and
``pbscale.regress`` where it runs there), ``analysis.pareto`` and a sweep, whose children find
the methods through ``$PBSCALE_METHODS``. As files inside ``pbscale/methods/``: a copy of the
package gets each block as a module and its name in ``FAMILY_MODULES`` (the one registration
line), and its commands run in a fresh process. The page's ``bash`` and ``toml`` blocks set the
concrete family's own temperature from the command line and from a sweep, in both places. A
plugin that fails to import is refused in one line."""

from __future__ import annotations

import csv
import importlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from io import BytesIO
from pathlib import Path

import pytest
import torch

from analysis import pareto
from pbexact import estimators as E
from pbexact.parametrizations import get_parametrization
from pbscale import prune, sweep
from pbscale.methods import FAMILY_MODULES, REGISTRY, MethodConfig, mc_gradient
from pbscale.methods.schedules import keep_count
from pbscale.nets.models import build_model
from pbscale.pruning import config as pconfig
from pbscale.regression import run as rrun
from pbscale.regression.group import TIMING, train_group
from pbscale.regression.problem import make_problem
from pbscale.runs import io

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding_a_method.md"
PACKAGE = "doc_methods"
#: The methods the page defines, by module.
DEFINED = {"reinforce_pairs": "reinforce-pairs", "concrete": "concrete",
           "reinforce_ma": "reinforce-ma", "random_mask": "random"}


def doc_blocks(text: str) -> dict[str, str]:
    """{file name: code} of the page's ``python`` blocks (first line ``# file: NAME.py``)."""
    out = {}
    for code in re.findall(r"```python\n(.*?)```", text, re.S):
        first, _, rest = code.partition("\n")
        match = re.fullmatch(r"# file: (\w+)\.py", first.strip())
        assert match, f"a python block of {DOC.name} does not start with '# file: NAME.py'"
        out[match.group(1)] = rest
    return out


def doc_command() -> list[str]:
    """The arguments of the page's ``bash`` block (one ``python -m pbscale.prune`` line)."""
    (block,) = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    words = shlex.split(block)
    assert words[:3] == ["python", "-m", "pbscale.prune"], words
    return words[3:]


def doc_sweep() -> str:
    """The page's ``toml`` block (a sweep file)."""
    (block,) = re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S)
    return block


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
        if "n" in REGISTRY[method].caps.uses:  # --n 4 honoured: the run draws 4 masks a step
            assert record["task"]["n"] == 4 and "n" in info["settings"], method
            assert "n" not in record["info"]["unused"], method
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
    for method in ("reinforce-pairs", "concrete", "reinforce-ma"):
        cfg = MethodConfig(method=method, n=4, lr=0.05, seed=1,
                           settings={"tau": 0.3} if method == "concrete" else None)
        folder = rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                               problem=problem)
        history = io.read_csv(folder / "history.csv")
        assert len(history) == 2 and history[-1]["val_loss_chosen"] >= 0
    # the concrete temperature is its own setting: hashed under its name, off its default only
    assert MethodConfig(method="concrete", settings={"tau": 0.3}).to_dict()["concrete"] == {
        "tau": 0.3}
    assert "concrete" not in MethodConfig(method="concrete").to_dict()


def test_a_group_keeps_the_family_settings_by_construction(doc_methods, tmp_path):
    """Concrete claims ``batched``: each member of a regression group is its separate run,
    temperature included (the group copies nothing: each member is built from its own
    configuration), and another temperature gives other numbers."""
    problem = make_problem(0, n_train=200, n_valid=100, backbone_hidden=(6, 6),
                           target_hidden=(12, 12))

    def config(seed: int, tau: float) -> MethodConfig:
        return MethodConfig(method="concrete", n=4, lr=0.05, seed=seed, settings={"tau": tau})

    grouped = train_group([config(0, 0.3), config(1, 0.3)], 1, problem,
                                          out=tmp_path / "group")
    for g, seed in enumerate((0, 1)):
        folder = rrun.train(config(seed, 0.3), epochs=1, out=tmp_path / "alone",
                               device="cpu", progress=False, problem=problem)
        alone = [{k: v for k, v in row.items() if k not in TIMING}
                 for row in io.read_csv(folder / "history.csv")]
        assert json.dumps(grouped[g]) == json.dumps(alone)  # bit for bit (NaN cells too)
    other = train_group([config(0, 1.0), config(1, 1.0)], 1, problem)
    assert other[0][-1]["train_loss"] != grouped[0][-1]["train_loss"]


def test_the_per_run_state_steps_resumes_and_stays_per_member(doc_methods, tmp_path):
    """reinforce-ma's baseline (its per-run state): 0 before the first step, the moving average
    of the mean losses after it (checked against the losses the run logged), checkpointed: a
    run interrupted after one epoch and resumed gives the numbers of an uninterrupted one bit
    for bit, and each member of a regression group keeps its own baseline (a group's
    histories equal the separate runs')."""
    from pbscale.methods import MaskTrainer

    trainer = MaskTrainer(MethodConfig(method="reinforce-ma", n=4, lr=0.1, seed=0,
                                       settings={"decay": 0.5}), 6, 10)
    assert float(trainer.state["baseline"]) == 0.0
    target = torch.linspace(0, 1, 6)

    def f(z: torch.Tensor) -> torch.Tensor:
        return ((z - target) ** 2).sum(-1)

    means = []
    for _ in range(3):
        means.append(trainer.step(f))
    expected = 0.0
    for m in means:  # b <- 0.5 b + 0.5 mean J (the step's reported loss is that mean)
        expected = 0.5 * expected + 0.5 * m
    assert float(trainer.state["baseline"]) == pytest.approx(expected, rel=1e-12)
    buffer = BytesIO()  # through a file's bytes, as a checkpoint is written and read
    torch.save(trainer.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert float(state["state"]["baseline"]) == pytest.approx(expected, rel=1e-12)
    again = MaskTrainer(MethodConfig(method="reinforce-ma", n=4, lr=0.1, seed=0,
                                     settings={"decay": 0.5}), 6, 10)
    again.load_state_dict(state)
    assert trainer.step(f) == again.step(f)
    assert torch.equal(trainer.r, again.r)

    problem = make_problem(0, n_train=200, n_valid=100, backbone_hidden=(6, 6),
                           target_hidden=(12, 12))

    def config(seed: int) -> MethodConfig:
        return MethodConfig(method="reinforce-ma", n=4, lr=0.05, seed=seed)

    whole = rrun.train(config(0), epochs=2, out=tmp_path / "whole", device="cpu",
                       progress=False, problem=problem)
    rrun.train(config(0), epochs=1, out=tmp_path / "parts", device="cpu", progress=False,
               problem=problem)
    parts = rrun.train(config(0), epochs=2, out=tmp_path / "parts", device="cpu",
                       progress=False, problem=problem)

    def rows(folder: Path) -> list[dict]:
        return [{k: v for k, v in row.items() if k not in TIMING}
                for row in io.read_csv(folder / "history.csv")]

    assert json.dumps(rows(whole)) == json.dumps(rows(parts))
    grouped = train_group([config(0), config(1)], 2, problem, out=tmp_path / "group")
    alone = rrun.train(config(1), epochs=2, out=tmp_path / "alone", device="cpu",
                       progress=False, problem=problem)
    assert json.dumps(grouped[0]) == json.dumps(rows(whole))
    assert json.dumps(grouped[1]) == json.dumps(rows(alone))


def test_the_doc_methods_pass_the_registry_tests(doc_methods, tmp_path):
    """tests/test_method_registry.py's checks, run with the page's methods registered: each
    is complete, its colour apart from every other's, runs one step in every command it
    claims, is refused by the others; the MC list is pbexact's estimator registry's."""
    import test_method_registry as R

    R.test_every_family_is_complete()
    R.test_no_two_methods_share_a_colour()
    mc = tuple(n for n, s in E.REGISTRY.items() if not s.needs_table)
    assert "reinforce-pairs" in mc and R.names(samples=True) == mc
    for i, name in enumerate(DEFINED.values()):
        commands = REGISTRY[name].caps.commands
        if "regress" in commands:
            R.test_regress_step(name)
        else:
            R.test_regress_refuses_the_others(name, tmp_path)
        if "regress-group" in commands:
            R.test_batched_step(name)
        else:
            R.test_batched_refuses_the_others(name)
        for mode in pconfig.MODES:
            if f"prune-{mode}" in commands:
                R.test_prune_step(tmp_path / f"{i}-{mode}", mode, name)
            else:
                R.test_prune_refuses_the_others(mode, name)


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


def _plugin_env(monkeypatch, root: Path) -> None:
    monkeypatch.setenv("PBSCALE_METHODS", ",".join(f"{PACKAGE}.{m}" for m in DEFINED))
    monkeypatch.setenv("PYTHONPATH", f"{root}:{ROOT}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_a_sweep_runs_the_doc_methods_in_its_children(doc_methods, tmp_path, monkeypatch):
    root, _ = doc_methods
    _plugin_env(monkeypatch, root)
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


def _taus(out: Path) -> dict[float, dict]:
    """{concrete temperature: config.json} of the concrete run folders under ``out``, the
    temperature read from the run's hashed task, under its option's name (absent: the
    default, 0.5)."""
    found = {}
    for cfg in out.glob("lenet-supermask-concrete-*/config.json"):
        record = json.loads(cfg.read_text())
        found[record["task"].get("concrete_tau", 0.5)] = record
    return found


def test_the_concrete_setting_from_the_command_line_and_a_sweep(doc_methods, tmp_path,
                                                               monkeypatch, capsys):
    """The page's command sets --concrete-tau (shown in --help with its default); the page's
    sweep sets concrete_tau per run; each temperature is its own run folder, recorded in the
    hashed task under its option's name; a bad temperature is one line."""
    root, _ = doc_methods
    assert prune.main(["--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--concrete-tau X binary concrete: the relaxation temperature, in (0, 10] " \
           "(default: 0.5)" in shown
    monkeypatch.chdir(tmp_path)
    assert prune.main([*doc_command(), "--quiet"]) == 0
    runs = _taus(tmp_path / "runs" / "concrete")
    assert set(runs) == {0.3}
    assert runs[0.3]["task"]["concrete_tau"] == 0.3 and "settings" not in runs[0.3]["task"]
    assert runs[0.3]["task"]["n"] == 4  # the page's --n 4, honoured
    assert "tau" in runs[0.3]["method_info"]["settings"]
    assert prune.main([*doc_command(), "--concrete-tau", "0", "--quiet"]) == 2
    assert "0 < tau <= 10" in capsys.readouterr().err
    _plugin_env(monkeypatch, root)
    path = tmp_path / "doc.toml"
    path.write_text(doc_sweep())
    assert sweep.main(["run", str(path), "--jobs", "1"]) == 0
    swept = _taus(tmp_path / "runs" / "concrete-sweep")
    assert set(swept) == {0.3, 1.0}
    # the sweep's 0.3 run is the command line's run: the same settings, the same folder name
    alone = {p.name for p in (tmp_path / "runs" / "concrete").glob("lenet-*")}
    assert alone and alone <= {p.name for p in (tmp_path / "runs" / "concrete-sweep").iterdir()}


def test_the_doc_methods_as_files_inside_the_package(tmp_path):
    """The page's blocks as modules of a copy of ``pbscale/methods/``, each named in
    ``FAMILY_MODULES`` (one edited line): registered in that order after pbscale's own, each
    importing the contract from ``pbscale.methods``; the concrete temperature then reaches
    the command line (--help, a run) and a sweep of a fresh process."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "pbscale", copy / "pbscale",
                    ignore=shutil.ignore_patterns("__pycache__"))
    methods = copy / "pbscale" / "methods"
    blocks = doc_blocks(DOC.read_text())
    for name, code in blocks.items():
        (methods / f"{name}.py").write_text(code)
    init = methods / "__init__.py"
    text = init.read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("FAMILY_MODULES = (")]
    assert eval(line.partition("=")[2]) == FAMILY_MODULES  # noqa: S307 - a tuple of names
    new = line[:-1] + "".join(f', "{name}"' for name in blocks) + ")"
    init.write_text(text.replace(line, new))
    changed = [a for a, b in zip(text.splitlines(), init.read_text().splitlines()) if a != b]
    assert changed == [line]  # the one registration line
    env = {"PYTHONPATH": f"{copy}:{ROOT}", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}

    def python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)

    done = python("-c", "import pbscale.methods as m; print(m.__file__); "
                        "print(','.join(m.names()))")
    assert done.returncode == 0, done.stderr
    where, names = done.stdout.split()
    assert Path(where).is_relative_to(copy)
    assert names.split(",")[-len(DEFINED):] == list(DEFINED.values())
    shown = python("-m", "pbscale.prune", "--help")
    assert shown.returncode == 0 and "--concrete-tau" in shown.stdout, shown.stderr
    ran = python("-m", "pbscale.prune", *doc_command(), "--quiet")
    assert ran.returncode == 0, ran.stderr
    assert set(_taus(tmp_path / "runs" / "concrete")) == {0.3}
    (tmp_path / "doc.toml").write_text(doc_sweep())
    swept = python("-m", "pbscale.sweep", "run", "doc.toml", "--jobs", "1")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert set(_taus(tmp_path / "runs" / "concrete-sweep")) == {0.3, 1.0}


#: A family whose gradient hook has the signature of an older pbnn.
OLD_HOOK = '''
import torch
from pbscale.methods import Capabilities, Estimate, LogitsFamily, register


@register
class OldConcrete(LogitsFamily):
    name, label, text, color = "old-concrete", "Old", "old", "purple"
    caps = Capabilities(commands=("regress", "prune-supermask", "prune-joint"),
                        uses=("n", "lr", "optimizer", "lam"), min_samples=1)

    def gradient(self, trainer, f, record):
        return Estimate(trainer.r * 0, 0.0), torch.sigmoid
'''


def test_a_plugin_that_fails_to_import_is_one_line(tmp_path):
    """A hook with other arguments than the contract's (here the old gradient(trainer, f,
    record)) fails where it is defined, in one line naming what to write; under a command, a
    $PBSCALE_METHODS module that fails is ``error:`` in one line and exit code 2."""
    with pytest.raises(TypeError, match=r"gradient\(self, trainer, f, record\) does not take "
                                        r"the contract.s arguments; write gradient\(self, f, r, "
                                        r"at\) \(from pbscale.methods import Gradient"):
        exec(OLD_HOOK, {})  # noqa: S102 - a plugin's code, run as it would be
    assert "old-concrete" not in REGISTRY
    (tmp_path / "old_concrete.py").write_text(OLD_HOOK)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PBSCALE_METHODS": "old_concrete",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pbscale.prune", "--help"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: $PBSCALE_METHODS names "
                                                   "'old_concrete'"), done.stderr
    assert "write gradient(self, f, r, at)" in lines[0]
