"""The GPU suite (`benchmarks/gpu_suite.py`): its ``--smoke`` mode writes every piece's CSV, a
summary with each piece's status and the goals computed from the numbers, and the environment;
a failing or overrunning piece is reported without stopping the others; bad input is one line
and exit code 2."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest
import torch

from analysis.cli import run
from benchmarks import gpu_suite as gs
from pbscale.runs import io

ENV_KEYS = {"device", "device_name", "driver", "torch", "cuda", "cudnn", "tf32_matmul",
            "tf32_cudnn", "commit", "hostname", "date", "smoke", "budget_s"}


def _goal(key: str) -> str:
    """The summary text of the goal ``key``."""
    return next(g.text for g in gs.GOALS if g.key == key)


def _folder(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def _piece_rows(summary: str) -> dict[str, list[str]]:
    """{piece: its cells} of the summary's pieces table."""
    rows = {}
    for line in summary.split("## Goals")[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in gs.PIECES:
            rows[cells[0]] = cells
    return rows


def _goal_rows(summary: str) -> dict[str, list[str]]:
    section = summary.split("## Goals")[1].split("\n## ")[0]
    return {cells[0]: cells for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| "))}


def test_smoke_writes_every_piece_the_goals_and_the_environment(tmp_path: Path):
    assert gs.main(["--out", str(tmp_path), "--smoke"]) == 0
    folder = _folder(tmp_path)
    assert re.fullmatch(r"cpu-\d{4}-\d{2}-\d{2}-smoke", folder.name)
    for piece in gs.PIECES.values():
        path = folder / piece.csv.format(dev="cpu")
        header = path.read_text().splitlines()[0].split(",")
        assert set(piece.columns) <= set(header), (piece.name, header)
        assert len(path.read_text().splitlines()) >= 2, piece.name  # rows under the header
    summary = (folder / "summary.md").read_text()
    pieces = _piece_rows(summary)
    assert set(pieces) == set(gs.PIECES)
    assert all(cells[1] == "ok" for cells in pieces.values()), pieces
    goals = _goal_rows(summary)
    for goal in gs.GOALS:
        status = goals[goal.text][3]
        assert status.startswith(("met (smoke", "not met (smoke")), (goal.key, status)
    env = json.loads((folder / "environment.json").read_text())
    assert ENV_KEYS <= set(env) and env["smoke"] is True and env["device"] == "cpu"
    assert env["torch"] == torch.__version__

    # bench_prune rows cover both amps and both layouts; per_dense_train is the MC step over
    # the dense training step timed in the same configuration
    prune = io.read_csv(folder / "bench_prune_cpu.csv")
    assert {r["amp"] for r in prune} == {"none", "bf16"}
    assert {str(r["channels_last"]) for r in prune if r["model"] == "resnet20"} == {"True",
                                                                                     "False"}
    for r in prune:
        if r["what"] == "mc_step":
            (dense,) = [d for d in prune if d["what"] == "dense_train" and
                        (d["model"], d["amp"], d["channels_last"]) ==
                        (r["model"], r["amp"], r["channels_last"])]
            assert r["per_dense_train"] == pytest.approx(r["ms_median"] / dense["ms_median"])
    # the goals' values are the CSVs' numbers
    best = min(r["per_dense_train"] for r in prune if r["what"] == "mc_step"
               and r["model"] == "resnet20" and r["amp"] == "none" and r["n"] == 2)
    assert goals[_goal("resnet20_fp32")][2] == f"{best:.3g}"
    arms = io.read_csv(folder / "bench_arms_step.csv")[-1]
    assert arms["ratio"] == pytest.approx(arms["arms_ms"] / arms["loorf_ms"])
    assert goals[_goal("arms_loorf")][2] == f"{arms['ratio']:.3g}"
    sweep = io.read_csv(folder / "regression_sweep.csv")
    assert sum(r["runs"] for r in sweep) == 280  # the paper's sweep, as the sweep file says
    assert sum(r["jobs"] for r in sweep) == 19  # every method's runs in groups
    assert all(r["runs_per_job"] >= 10 for r in sweep)
    assert 1 <= sum(str(r["measured"]) == "True" for r in sweep) < len(sweep)
    # masks evaluated per step: n for the sampling methods, one mask for CP (the registry says
    # which draws samples, not a method name in the suite)
    for r in sweep:
        per_run = 1 if r["method"] == "cp" else r["n"]
        assert r["masks_per_step"] == r["runs_per_job"] * per_run, r
    assert {r["method"] for r in sweep} >= {"cp", "st", "rebar", "arms"}
    hours = sum(r["projected_s"] for r in sweep) / 3600
    assert goals[_goal("sweep_hours")][2] == f"{hours:.3g}"
    assert not list(folder.glob(".tmp-*"))  # the pieces' scratch folders are gone


def _boom(ctx: gs.Context) -> gs.Outcome:
    raise RuntimeError("injected failure\nsecond line")


def test_a_failing_piece_is_reported_and_the_others_run(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(gs.PIECES, "arms_loorf", dataclasses.replace(gs.PIECES["arms_loorf"],
                                                                     run=_boom))
    code = gs.main(["--out", str(tmp_path), "--smoke", "--pieces", "arms_loorf,regress_group"])
    assert code == 1
    folder = _folder(tmp_path)
    summary = (folder / "summary.md").read_text()
    pieces = _piece_rows(summary)
    assert pieces["arms_loorf"][1] == "failed"
    assert pieces["arms_loorf"][-1] == "RuntimeError: injected failure"  # one line
    assert pieces["regress_group"][1] == "ok"
    assert (folder / "bench_regress_group.csv").exists()
    assert not (folder / "bench_arms_step.csv").exists()
    goals = _goal_rows(summary)
    assert goals[_goal("arms_loorf")][3] == "not measured"
    assert goals[_goal("batched_speedup")][3].startswith(("met", "not met"))


def test_a_piece_past_its_budget_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def slow(ctx: gs.Context) -> gs.Outcome:
        ctx.save([{"a": 1}])
        time.sleep(30)
        return gs.Outcome()

    monkeypatch.setattr(gs, "HARD_GRACE_S", 0.0)
    piece = dataclasses.replace(gs.PIECES["sync"], run=slow, csv="slow.csv")
    t0 = time.perf_counter()
    res = gs.run_piece(piece, torch.device("cpu"), True, tmp_path, 0.2)
    assert time.perf_counter() - t0 < 10
    assert res.status == "timed out" and "budget" in res.note
    assert res.rows == [{"a": 1}] and (tmp_path / "slow.csv").exists()  # kept what it had


def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture):
    afile = tmp_path / "f"
    afile.write_text("x")
    cases = [(["--out", str(afile), "--smoke"], "is a file"),
             (["--out", str(tmp_path), "--budget-s", "0", "--smoke"], "--budget-s"),
             (["--out", str(tmp_path), "--pieces", "sync,bogus", "--smoke"], "bogus"),
             (["--out", str(tmp_path), "--device", "gpu"], "--device"),
             (["--out", str(tmp_path), "--smoke", "--routes", "bogus"], "unknown route 'bogus'"),
             (["--out", str(tmp_path), "--smoke", "--label", "a/b"], "--label"),
             (["--smoke"], "--out")]
    if not torch.cuda.is_available():
        cases.append((["--out", str(tmp_path), "--device", "cuda"], "use --smoke"))
    for argv, words in cases:
        assert run(gs.main, argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "\n" not in err and words in err, (argv, err)
    assert not list(tmp_path.glob("cpu-*"))  # nothing was written
    assert run(gs.main, ["--help"]) == 0
    out = capsys.readouterr().out
    assert "default 480" in out and "default cuda, or cpu with --smoke" in out


def test_alarms_nest():
    t0 = time.perf_counter()
    with pytest.raises(gs.PieceTimeout):
        with gs.alarm(1.0):
            with pytest.raises(gs.PieceTimeout):
                with gs.alarm(0.1):  # the inner one fires first
                    time.sleep(5)
            assert time.perf_counter() - t0 < 0.9
            time.sleep(5)  # the outer one still fires, on its own time
    assert 0.9 < time.perf_counter() - t0 < 3


def test_the_commit_named_in_the_environment_wins_over_an_enclosing_checkout(
        monkeypatch: pytest.MonkeyPatch):
    """A tree copied onto a device machine may sit inside another checkout, whose commit git
    would name (the H100 run recorded one): GPU_SUITE_COMMIT, when set, is the commit."""
    cpu = torch.device("cpu")
    monkeypatch.delenv("GPU_SUITE_COMMIT", raising=False)
    from_git = gs.environment(cpu, True, 1.0, ["sync"])
    assert from_git["commit_source"] == "git" and re.fullmatch(r"[0-9a-f]{40}",
                                                               from_git["commit"])
    named = "9b1e895b3dc8def59339c26dba6a866b703c737b"
    assert named != from_git["commit"]
    monkeypatch.setenv("GPU_SUITE_COMMIT", named)
    env = gs.environment(cpu, True, 1.0, ["sync"])
    assert env["commit"] == named and env["commit_source"] == "GPU_SUITE_COMMIT"
    assert env["commit_dirty"] is None  # unknown for a copy


def test_the_session_script_runs_the_tests_and_both_suites(tmp_path: Path):
    """benchmarks/gpu_session.sh, what a session lent a GPU runs, on the CPU with --smoke: the
    GPU route tests (skipped here: pytest's code 5, "no tests ran"), the suite with the routes
    off and then on, both folders packed with their logs, the summaries beside."""
    import os
    import subprocess
    import sys
    import tarfile

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable,
           "GPU_SUITE_ARGS": "--smoke", "GPU_BEFORE_PIECES": "sync", "GPU_AFTER_PIECES": "sync",
           "GPU_SUITE_COMMIT": "9b1e895b3dc8def59339c26dba6a866b703c737b"}
    res = subprocess.run(["bash", str(root / "benchmarks" / "gpu_session.sh")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == (0 if torch.cuda.is_available() else 5), res.stdout[-2000:]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["gpu_session.log", "gpu_suite.tar.gz", "summary-routes-all.md",
                     "summary-routes-off.md", "test_gpu_routes.log"]
    with tarfile.open(tmp_path / "gpu_suite.tar.gz") as tar:
        members = tar.getnames()
        envs = {m.split("/")[0]: json.load(tar.extractfile(m)) for m in members
                if m.endswith("environment.json")}
    assert len(envs) == 2 and all(f"{m}/gpu_suite.log" in members for m in envs)
    by_label = {("all" if "routes-all" in m else "off"): e for m, e in envs.items()}
    assert by_label["off"]["routes"] == "off" and by_label["all"]["routes"].count(",") == 4
    assert {e["commit"] for e in envs.values()} == {env["GPU_SUITE_COMMIT"]}
    assert "GPU routes off" in (tmp_path / "summary-routes-off.md").read_text()
