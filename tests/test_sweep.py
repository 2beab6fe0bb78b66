"""pbscale.sweep: sweep files expand into the right runs and bad ones fail in one line; a tiny
sweep completes on the local process pool; a sweep killed with SIGTERM resumes without redoing
finished runs; Ray (when importable) gives the same numbers as the local engine."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import sigterm_when

from pbexact.errors import PBInputError
from pbscale import sweep
from pbscale.runs import io
from pbscale.sweep.records import saved_text

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("train_seconds", "val_seconds")


def _write(tmp_path: Path, text: str, name: str = "tiny.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


TINY = """
[sweep]
command = "regress"
out = "{out}"
threads = 1

[base]
epochs = {epochs}
n = 2

[[grid]]
method = ["loorf", "arms"]
seed = 0

[[grid]]
method = "loorf"
seed = [1, 0]
"""


def _env() -> dict:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def _sweep_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pbscale.sweep", *args], capture_output=True,
                          text=True, env=_env(), timeout=600, **kw)


def test_expand_grid_union_without_duplicates(tmp_path):
    s = sweep.load(_write(tmp_path, TINY.format(out=tmp_path / "o", epochs=1)))
    opts = [r.options for r in s.runs]
    # grid 1: loorf/arms x seed 0; grid 2: loorf x seeds 1, 0 (loorf seed 0 is a duplicate)
    assert opts == [{"epochs": 1, "n": 2, "method": "loorf", "seed": 0},
                    {"epochs": 1, "n": 2, "method": "arms", "seed": 0},
                    {"epochs": 1, "n": 2, "method": "loorf", "seed": 1}]
    assert len({r.id for r in s.runs}) == 3
    assert s.argv(s.runs[1])[:8] == ["--epochs", "1", "--n", "2", "--method", "arms", "--seed",
                                     "0"]
    assert s.argv(s.runs[0])[-5:] == ["--out", str(tmp_path / "o"), "--threads", "1", "--quiet"]
    assert sweep.expand({"a": 1}, [{"b": [1, 2], "c": [3, 4, 5]}]).__len__() == 6
    assert [r.options for r in sweep.load(s.path, out=tmp_path / "x").runs] == opts


@pytest.mark.parametrize("text, words", [
    ('[sweep]\ncommand = "train"\nout = "o"\n', "command must be one of"),
    ('[sweep]\ncommand = "regress"\n', "no output folder"),
    ('[sweep]\ncommand = "regress"\nout = "o"\n[base]\nlearning_rate = 0.1\n',
     "no option --learning-rate"),
    ('[sweep]\ncommand = "regress"\nout = "o"\n[base]\nout = "p"\n', "set by the sweep"),
    ('[sweep]\ncommand = "regress"\nout = "o"\ngpus = 1.5\n', "GPU fraction"),
    ('[sweep]\ncommand = "regress"\nout = "o"\n[[grid]]\nseed = []\n', "non-empty list"),
    ('[sweep]\ncommand = "regress"\nout = "o"\n[grids]\n', "unknown table"),
    ("[sweep\n", "not valid TOML"),
])
def test_bad_sweep_files(tmp_path, text, words):
    with pytest.raises(PBInputError, match=words):
        sweep.load(_write(tmp_path, text))


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    for args in (["status", str(tmp_path / "missing.toml")],
                 ["run", str(_write(tmp_path, TINY.format(out=tmp_path / "o", epochs=1))),
                  "--engine", "slurm"]):
        proc = _sweep_cli(*args)
        assert proc.returncode == 2
        assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1
        assert "Traceback" not in proc.stderr


def test_shipped_sweep_files_load():
    files = sorted((ROOT / "sweeps").glob("*.toml"))
    assert len(files) >= 4
    for f in files:
        s = sweep.load(f)
        assert s.runs and len({r.id for r in s.runs}) == len(s.runs)


def _histories(out: Path) -> dict[str, list[dict]]:
    """{run folder name: history rows without timing columns}."""
    res = {}
    for f in sorted(out.glob("*/summary.json")):
        rows = io.read_csv(f.parent / "history.csv")
        # NaN (e.g. tau of MC runs) as None, so that equal histories compare equal
        res[f.parent.name] = [{k: None if isinstance(v, float) and math.isnan(v) else v
                               for k, v in r.items() if k not in TIMING} for r in rows]
    return res


def _starts(log: Path) -> int:
    return sum(line.startswith("# ") and " start: " in line for line in log.read_text()
               .splitlines())


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """jobs=1: the sweep is killed by SIGTERM once its second run has a checkpoint; states are
    recorded; then the same command is run again. Returns what the test checks."""
    tmp_path = tmp_path_factory.mktemp("sweep")
    out = tmp_path / "local"
    path = _write(tmp_path, TINY.format(out=out, epochs=4))
    s = sweep.load(path)
    facts: dict = {"path": path, "out": out, "sweep": s, "tmp": tmp_path,
                   "before": {r.id: sweep.state_of(s, r) for r in s.runs}}
    first, second, _ = s.runs
    def second_checkpointed() -> bool:
        folder = sweep.folder_index(out).get(second.id)
        return folder is not None and (folder / "checkpoint.pt").exists()

    proc, killed = sigterm_when(
        [sys.executable, "-m", "pbscale.sweep", "run", str(path), "--jobs", "1"], _env(),
        second_checkpointed)
    facts["killed"] = killed
    facts["stderr"] = proc.communicate(timeout=120)[1].decode()
    facts["code"] = proc.returncode
    facts["after_kill"] = {r.id: sweep.state_of(s, r) for r in s.runs}
    facts["folders"] = sweep.folder_index(out)
    facts["second_summary"] = (facts["folders"][second.id] / "summary.json").exists()
    facts["status"] = _sweep_cli("status", str(path)).stdout
    facts["first_summary"] = (facts["folders"][first.id] / "summary.json").read_bytes()
    facts["rerun"] = _sweep_cli("run", str(path), "--jobs", "1")
    return facts


def test_a_sweep_stopped_early_says_nothing_was_saved(tmp_path):
    """SIGTERM as soon as the first child is running (before its run folder or checkpoint
    exists): the sweep names, per stopped run, what it saved, as the disk holds it ("nothing
    saved yet" here), not "running children checkpointed"."""
    out = tmp_path / "o"
    path = _write(tmp_path, TINY.format(out=out, epochs=50))
    s = sweep.load(path)
    first = s.runs[0]
    proc, killed = sigterm_when(
        [sys.executable, "-m", "pbscale.sweep", "run", str(path), "--jobs", "1"], _env(),
        lambda: sweep.state_of(s, first) == "running")
    err = proc.communicate(timeout=120)[1].decode()
    assert killed and proc.returncode == 143, err
    assert "checkpointed)" not in err
    saved = saved_text(s, first, sweep.folder_index(out))
    assert f"  {first.id}: {saved}" in err.splitlines()
    if sweep.folder_index(out).get(first.id) is None:
        assert saved == "nothing saved yet (stopped before its run folder existed)"
    assert "interrupted: 3 runs not finished (1 stopped, what each saved above)" in err


def test_killed_sweep_resumes_without_redoing_finished_runs(killed_and_resumed):
    f = killed_and_resumed
    s, out, path = f["sweep"], f["out"], f["path"]
    first, second, third = s.runs
    assert set(f["before"].values()) == {"pending"}
    assert f["killed"], "the second run never reached a checkpoint"
    assert f["code"] == 143
    # one line per run started and ended, and how to resume
    assert f"finished    {first.id}" in f["stderr"] and f"started     {second.id}" in f["stderr"]
    assert f"interrupted {second.id}" in f["stderr"]
    assert f"resume with: python -m pbscale.sweep run {path} --jobs 1" in f["stderr"]
    assert f"  {second.id}: checkpoint at " in f["stderr"]  # what the stopped run saved
    assert f["after_kill"] == {first.id: "finished", second.id: "interrupted",
                               third.id: "pending"}
    assert not f["second_summary"]
    assert "finished 1, running 0, failed 0, diverged 0, interrupted 1, pending 1" in f["status"]

    assert f["rerun"].returncode == 0, f["rerun"].stderr
    assert "1 of 3 runs already finished" in f["rerun"].stderr
    assert all(sweep.state_of(s, r) == "finished" for r in s.runs)
    logs = {r.id: s.record_dir / f"{r.id}.log" for r in s.runs}
    assert [_starts(logs[r.id]) for r in s.runs] == [1, 2, 1]
    folders = f["folders"]
    assert (folders[first.id] / "summary.json").read_bytes() == f["first_summary"]
    local = _histories(out)
    assert len(local) == 3 and all(len(h) == 5 for h in local.values())

    table = f["tmp"] / "results.csv"
    res = _sweep_cli("results", str(path), "--csv", str(table))
    assert res.returncode == 0, res.stderr
    rows = io.read_csv(table)
    assert [(r["method"], r["seed"]) for r in rows] == [("loorf", 0), ("arms", 0), ("loorf", 1)]
    for row in rows:
        assert row["final_val_loss_chosen"] == local[Path(row["folder"]).name][-1][
            "val_loss_chosen"]


def test_ray_engine_matches_local_engine(killed_and_resumed):
    """The same sweep on a local 2-CPU Ray, uninterrupted, gives identical histories (so the
    resumed run above equals an uninterrupted one too)."""
    pytest.importorskip("ray")
    f = killed_and_resumed
    assert f["rerun"].returncode == 0
    ray_out = f["tmp"] / "ray"
    ray_run = _sweep_cli("run", str(f["path"]), "--engine", "ray", "--jobs", "2", "--out",
                         str(ray_out))
    assert ray_run.returncode == 0, ray_run.stderr
    ray_hist = _histories(ray_out)
    assert len(ray_hist) == 3 and ray_hist == _histories(f["out"])


def test_ray_missing_is_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    s = sweep.load(_write(tmp_path, TINY.format(out=tmp_path / "o", epochs=1)))
    with pytest.raises(PBInputError, match=r'pip install -e "\.\[ray\]"'):
        sweep.run_ray(s, s.runs, 1, None)


def test_ray_missing_refused_before_anything_and_not_when_all_finished(tmp_path, monkeypatch,
                                                                       capsys):
    """--engine ray without Ray: one line, exit 2, nothing printed before it and nothing
    written (no sweep folder, no .lock); with every run finished, no refusal: nothing to run."""
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    path = _write(tmp_path, TINY.format(out=tmp_path / "o", epochs=1))
    s = sweep.load(path)
    assert sweep.main(["run", str(path), "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --engine ray needs Ray") and len(err.splitlines()) == 1, err
    assert not s.record_dir.exists() and not (s.record_dir / ".lock").exists()
    s.record_dir.mkdir(parents=True)
    for r in s.runs:  # every run finished (its record says so, its folder holds its summary)
        d = s.out / r.id
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"info": {"sweep_id": r.id}}))
        (d / "summary.json").write_text(json.dumps({"final_val_loss": 0.5}))
        (s.record_dir / f"{r.id}.json").write_text(json.dumps({"state": "finished"}))
    assert sweep.main(["run", str(path), "--engine", "ray"]) == 0
    err = capsys.readouterr().err
    assert "nothing to run" in err and "error" not in err


PRUNE = """
[sweep]
command = "prune"
out = "{out}"

[base]
model = "lenet"
synthetic = 256
epochs = 1
max_batches = 2
eval_batches = 1
eval_masks = 2

[[grid]]
method = ["cp", "arms"]
n = 2

[[grid]]
method = "cp"   # a data file that is not there: this run fails when it starts
synthetic = 0
data = "nope.npz"
"""


def test_prune_sweep_feeds_analysis_pareto(tmp_path):
    """A 3-run pruning sweep (synthetic images) on 2 local jobs, one run failing (its log kept,
    the others finished, exit code 1); analysis.pareto reads the sweep's output folder as it
    is."""
    out = tmp_path / "out"
    path = _write(tmp_path, PRUNE.format(out=out), "prune.toml")
    proc = _sweep_cli("run", str(path), "--jobs", "2")
    assert proc.returncode == 1, proc.stderr
    assert "finished 2, running 0, failed 1, diverged 0, interrupted 0, pending 0" in proc.stdout
    s = sweep.load(path)
    failed = s.runs[-1]
    assert sweep.state_of(s, failed) == "failed"
    assert sweep.read_record(s, failed)["returncode"] == 2
    assert "nope.npz: no such file" in (s.record_dir / f"{failed.id}.log").read_text()
    assert str(s.record_dir / f"{failed.id}.log") in proc.stdout
    fig = tmp_path / "fig"
    res = subprocess.run([sys.executable, "-m", "analysis.pareto", str(out), "--out", str(fig)],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    rows = io.read_csv(fig / "runs.csv")
    assert len(rows) == 2
    assert (fig / "pareto_lenet_supermask.png").exists()
