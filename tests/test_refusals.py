"""Every command-line tool refuses bad input as docs/refusals.md says: exactly one line on stderr,
``error: <problem>; <fix>`` (the problem, then after ``; `` what to do), exit code 2, no
traceback, and nothing created in the current folder.

One table of bad invocations covers every tool with a ``main`` (the walk of
``tests/test_cli_help.py``: a tool added without a row here fails
``test_every_tool_has_a_row``). Refusals known to lack the ``; <fix>`` part are marked
``xfail(strict=True)`` with the file that says it, so they stay visible and the mark must go
once the message is fixed.
"""

from __future__ import annotations

import importlib
import re

import pytest
from test_cli_help import cli_modules

from analysis.cli import run

#: ``error: <problem>; <fix>``: one line, a problem, ``; ``, then a fix.
FORMAT = re.compile(r"^error: \S.*?; \S.*$")


def lacks_fix(where: str):
    """The mark of a refusal whose message has no ``; <fix>`` part yet (``where``: its file)."""
    return pytest.mark.xfail(strict=True, reason=f"the message in {where} has no '; <fix>' part")


def _sweep(text: str) -> str:
    return "[sweep]\ncommand = \"prune\"\nout = \"runs\"\n" + text


#: (module, argv, words the line must hold, mark). ``{tmp}`` in argv is the test's folder
#: (holding ``a_file``, ``good.csv`` (a d = 1 J table), ``empty/``, sweep files ``<name>.toml``
#: from SWEEPS); the current folder is ``{tmp}/cwd``, which must stay empty.
CASES = [
    # the exact side
    ("analysis.arms_table", ["--n", "1"], "--n", None),
    ("analysis.arms_table", ["--n", "40"], "n=20", None),
    ("analysis.arms_table", ["--json", "{tmp}/a_file/t.json"], "is a file", None),
    ("analysis.bias", ["--bogus"], "unrecognized arguments", None),
    ("analysis.gap_calibration", ["--study", "{tmp}/missing"], "does not exist", None),
    ("analysis.gap_calibration", ["--study", "{tmp}/empty"], "holds no pruning runs", None),
    ("analysis.gap_calibration", ["--rho", "1"], "share in [0, 1)", None),
    ("analysis.counterexamples", ["--final-tau", "2"], "--final-tau", None),
    ("analysis.counterexamples", ["--only", "nope"], "--only: invalid choice", None),
    ("analysis.counterexamples", ["--temperatures", "0"], "--temperatures", None),
    ("analysis.theorems", ["--max-n", "1"], "--max-n", None),
    ("analysis.theorems", ["--seed", str(10**20)], "2**63 - 1", None),
    ("analysis.theorems", ["--cor-max-d", "30"], "--cor-max-d", None),
    ("analysis.theorems", ["--epsilon", "1.5"], "--epsilon", None),
    ("analysis.variance", ["--lr", "1e308"], "float32", None),
    ("analysis.variance", ["--seed", str(10**20)], "2**63 - 1", None),
    ("analysis.variance", ["--steps", "2000000000"], "at most 1,000,000,000", None),
    ("analysis.variance", ["--steps", "1000000000", "--log-every", "1"], "--log-every", None),
    ("analysis.variance", ["--d", "21", "--method", "closed"], "d=20", None),
    ("analysis.variance", ["--n", "1"], "n >= 2", None),
    ("analysis.variance", ["--meth", "mc"], "unrecognized arguments: --meth", None),
    ("analysis.variance", ["--table", "{tmp}/missing.csv"], "cannot read the J table", None),
    ("analysis.variance", ["--table", "{tmp}/a_file"], "header 'h,J'", None),
    ("analysis.variance", ["--table", "{tmp}/two.csv"], "two columns", None),
    ("analysis.variance", ["--table", "{tmp}/nan.csv"], "NaN or inf", None),
    ("analysis.variance", ["--table", "{tmp}/three.csv"], "2^d entries", None),
    ("analysis.variance", ["--table", "{tmp}/gap.csv"], "cover 0..1", None),
    ("analysis.variance", ["--table", "{tmp}/twice.csv"], "repeated", None),
    ("analysis.variance", ["--table", "{tmp}/word.csv"], "'h,J' numbers", None),
    ("analysis.variance", ["--table", "{tmp}/good.csv", "--d", "3"], "does not match", None),
    ("analysis.variance_compare", ["--lr", "0"], "--lr", None),
    ("analysis.variance_compare", ["--d", "25"], "d=20", None),
    ("analysis.variance_table", ["--table", "{tmp}/good.csv", "--d", "3"], "--table", None),
    ("analysis.variance_table", ["--estimator", "nope"], "--estimator", None),
    ("analysis.variance_table", ["--table", "{tmp}/nan.csv"], "NaN or inf", None),
    ("analysis.microworld", ["estimators", "--lrs", "1e308"], "float32", None),
    ("analysis.microworld", ["estimators", "--d", "20"], "d=20", None),
    ("analysis.microworld", ["estimators", "--steps", "1000000000"], "--log-every", None),
    ("analysis.microworld", ["approaches", "--n", "100000000000"], "lower --n", None),
    ("analysis.report", ["--steps", str(10**20)], "--steps", None),
    ("analysis.report", ["--compare-with", "{tmp}/missing"], "--compare-with", None),
    ("analysis.report", ["--experiments", "supermask", "--scale-out", "{tmp}/a_file"],
     "--scale-out", None),
    ("analysis.report", ["--d", "4", "--no-d4"], "no claim", None),
    ("analysis.bias", ["--d", "13"], "above 12", None),
    ("analysis.bias", ["--estimators", "nope"], "nope", None),
    ("analysis.regression", ["--ns", "0,10"], "--ns", None),
    ("analysis.regression", ["--threads", "5000"], "at most 1,024", None),
    # the claims tools (pareto and scale_report are another helper's; their own tests hold
    # their damaged-run refusals)
    ("analysis.pareto", ["{tmp}/a_file", "--out", "{tmp}/o", "--layer-max", "nan"],
     "--layer-max", None),
    ("analysis.scale_report", ["--bogus"], "unrecognized arguments", None),
    ("pbscale.export", ["{tmp}", "--out", "{tmp}/net.pt"], "not a finished pruning run", None),
    # benchmarks
    ("benchmarks.bench_arms_step", ["--ns", ""], "--ns", None),
    ("benchmarks.bench_arms_step", ["--ns", "1"], "n >= 2", None),
    ("benchmarks.bench_arms_step", ["--device", "nope"], "unknown device", None),
    ("benchmarks.op_count", ["--models", "foo"], "unknown model 'foo'", None),
    ("benchmarks.op_count", ["--steps", "nope"], "unknown step 'nope'", None),
    ("benchmarks.bench_routes", ["--device", "nope"], "--device: invalid choice", None),
    ("benchmarks.bench_routes", ["--n", "0"], "--n", None),
    ("benchmarks.bench_sampling_floor", ["--models", "foo"], "unknown model 'foo'", None),
    ("benchmarks.bench_sampling_floor", ["--models", ""], "--models", None),
    ("benchmarks.bench_regress_group", ["--method", "cp,mp"], "--method: invalid choice", None),
    ("benchmarks.bench_regress_group", ["--modes", "batched,fast"], "--modes: invalid choice",
     None),
    ("benchmarks.bench_prune_group", ["--groups", "0", "--synthetic", "8"], "group sizes",
     None),
    ("benchmarks.bench_prune_group", [], "--data-dir", None),
    ("benchmarks.bench_run_cost", ["--cases", "import,foo"], "unknown case 'foo'", None),
    ("benchmarks.bench_run_cost", [], "--data-dir", None),
    ("benchmarks.bench_run_cost", ["--cases", "import", "--baseline-path", "{tmp}/empty"],
     "no pbnn checkout", None),
    ("benchmarks.profile_run", ["--code", "{tmp}/empty", "--", "--epochs", "1"],
     "no pbnn checkout", None),
    ("benchmarks.profile_run", [], "give them after --", None),
    ("pbscale.prune", ["--synthetic", "8", "--seeds", "0,1", "--lam", "0,0"], "listed twice",
     None),
    ("benchmarks.bench_regress_group", ["--lrs", "0.1,"], "--lrs", None),
    ("benchmarks.bench_structured", ["--models", "alexnet"], "invalid model 'alexnet'", None),
    ("benchmarks.bench_structured", ["--targets", "1"], "MACs reductions > 1", None),
    ("benchmarks.bench_regress_group", ["--seeds", "100000"], "lower --seeds", None),
    ("benchmarks.bench_closed_form", ["--bogus"], "unrecognized arguments", None),
    ("benchmarks.bench_distributed", ["--device", "nope"], "unknown device", None),
    ("benchmarks.bench_distributed", ["--ks", ""], "--ks", None),
    ("benchmarks.bench_microworld", ["--seeds", "100000000000"], "lower --n or --seeds", None),
    ("benchmarks.bench_microworld", ["--steps", "0"], "--steps", None),
    ("benchmarks.bench_own_network", ["--ns", "0"], "--ns", None),
    ("benchmarks.bench_pbscale", ["--ns", "1"], "n >= 2", None),
    ("benchmarks.bench_pbscale", ["--estimator", "cp"], "--estimator", None),
    ("benchmarks.bench_prune", ["--models", "foo"], "unknown model", None),
    ("benchmarks.bench_prune", ["--device", "gpu"], "--device", None),
    ("benchmarks.bench_prune", ["--ns", "0"], "--ns", None),
    ("benchmarks.bench_variance", ["--bogus"], "unrecognized arguments", None),
    ("benchmarks.check_gpu_sync", ["--bogus"], "unrecognized arguments", None),
    ("benchmarks.gpu_suite", [], "required: --out", None),
    # the scaled side (pbscale/)
    ("pbscale.prune", ["--meth", "cp"], "unrecognized arguments: --meth", None),
    ("pbscale.prune", ["--model", "mymod:net", "--data", "nope.npz"], "no such file", None),
    ("pbscale.prune", ["--model", "no_such_module_here:net", "--dataset", "mnist",
                       "--synthetic", "8"], "cannot import no_such_module_here", None),
    ("pbscale.prune", ["--data", "x.npz", "--dataset", "cifar10"], "--data gives the data", None),
    ("pbscale.prune", ["--seed", str(10**20)], "2**63 - 1", None),
    ("pbscale.prune", ["--split-seed", str(10**20)], "2**63 - 1", None),
    ("pbscale.prune", ["--synthetic", str(10**20)], "2**63 - 1", None),
    ("pbscale.prune", ["--mask-lr", "1e308"], "float32", None),
    ("pbscale.prune", ["--prune-at", "2", "--synthetic", "64"], "--prune-at", None),
    ("pbscale.prune", ["--gmp-start", "0.5", "--gmp-end", "0.1", "--synthetic", "64",
                       "--method", "gmp", "--mode", "joint"], "--gmp-end", None),
    ("pbscale.prune", ["--data-dir", "{tmp}/empty", "--out", "{tmp}/o"], "not found", None),
    ("pbscale.regress", ["--lr", "0"], "--lr", None),
    ("pbscale.regress", ["--n", str(10**20)], "2**63 - 1", None),
    ("pbscale.regress", ["--threads", str(2**40)], "at most 1,024", None),
    ("pbscale.regress", ["--lr", "", "--seeds", "0-1"], "--lr", None),
    ("pbscale.regress", ["--seeds", "0-100000"], "at most 10,000 seeds", None),
    ("pbscale.sweep", ["run", "{tmp}/threads.toml"], "threads", None),
    ("pbscale.sweep", ["run", "{tmp}/command.toml"], "command", None),
    ("pbscale.sweep", ["run", "{tmp}/batch.toml"], "batch", None),
    ("pbscale.sweep", ["run", "{tmp}/out.toml"], "out", None),
    ("pbscale.sweep", ["run", "{tmp}/nan.toml"], "finite", None),
    ("pbscale.sweep", ["run", "{tmp}/seed.toml"], "--seed", None),
    ("pbscale.sweep", ["run", "{tmp}/huge.toml"], "1,000,000,000,000 runs", None),
    ("pbscale.sweep", ["status", "--out", "", "{tmp}/seed.toml"], "is empty", None),
    ("pbscale.sweep", ["run", "{tmp}/emptyout.toml"], "no output folder", None),
    ("pbscale.prune", ["--out", ""], "is empty", None),
    ("pbscale.prune", ["--out", "x" * 300], "at most 255", None),
    ("pbscale.prune", ["--synthetic", "100000"], "--synthetic", None),
    ("pbscale.prune", ["--threads", "5000"], "at most 1,024", None),
    ("pbscale.prune", ["--routes", "warp"], "unknown route", None),
    ("pbscale.regress", ["--out", ""], "is empty", None),
    ("pbscale.regress", ["--out", "", "--seeds", "0-1"], "is empty", None),
    ("pbscale.regress", ["--threads", "5000", "--seeds", "0-1"], "1,024", None),
    ("pbscale.sweep", ["run", "--jobs", "5000", "{tmp}/seed.toml"], "--jobs", None),
]

#: Sweep files the cases name, by stem.
SWEEPS = {
    "threads": _sweep("threads = 0\n"),
    "command": "[sweep]\ncommand = \"nope\"\nout = \"runs\"\n",
    "batch": _sweep("batch = 3\n"),
    "out": "[sweep]\ncommand = \"prune\"\nout = 3\n",
    "nan": _sweep("[base]\nlr = nan\n"),
    "seed": _sweep("[base]\nseed = -1\n"),
    "huge": _sweep("[base]\n" + "".join(f"{k} = {list(range(1, 1001))}\n"
                                          for k in ("seed", "split_seed", "epochs", "n"))),
    "emptyout": "[sweep]\ncommand = \"prune\"\nout = \"\"\n",
}
TABLES = {
    "good.csv": "h,J\n0,1.0\n1,2.0\n",
    "two.csv": "h,J\n0,1.0,7\n1,2.0\n",
    "nan.csv": "h,J\n0,1.0\n1,nan\n",
    "three.csv": "h,J\n0,1.0\n1,2.0\n2,3.0\n",
    "gap.csv": "h,J\n0,1.0\n2,2.0\n",
    "twice.csv": "h,J\n0,1.0\n0,2.0\n",
    "word.csv": "h,J\n0,1.0\n1,abc\n",
}


def test_every_tool_has_a_row():
    assert sorted({c[0] for c in CASES}) == cli_modules()


def _params():
    for module, argv, words, mark in CASES:
        yield pytest.param(module, argv, words, id=f"{module} {' '.join(argv)}"[:90],
                           marks=() if mark is None else (mark,))


@pytest.mark.parametrize("module, argv, words", list(_params()))
def test_a_refusal_is_one_line_problem_then_fix(module, argv, words, tmp_path, capsys,
                                                 monkeypatch):
    (tmp_path / "a_file").write_text("keep me")
    (tmp_path / "empty").mkdir()
    for name, text in TABLES.items():
        (tmp_path / name).write_text(text)
    for stem, text in SWEEPS.items():
        (tmp_path / f"{stem}.toml").write_text(text)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    main = importlib.import_module(module).main
    code = run(main, argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert words in lines[0], lines[0]
    assert FORMAT.match(lines[0]), f"not 'error: <problem>; <fix>': {lines[0]}"
    assert not list(cwd.iterdir()), sorted(p.name for p in cwd.iterdir())
    assert (tmp_path / "a_file").read_text() == "keep me"


def test_the_format_check_can_fail():
    assert FORMAT.match("error: --x must be >= 1, got 0; give --x 1 or more")
    for bad in ("error: --x must be >= 1", "error: x; ", "warning: x; y", "error: x;y",
                "error: a\nb; c"):
        assert not FORMAT.match(bad), bad
