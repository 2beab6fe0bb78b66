"""pbscale.sweep with groups (``group = true`` / ``--group``): runs differing only in seed
and lr form product groups, each one ``python -m pbscale.regress`` child; the grouped sweep
gives the ungrouped sweep's results (to the round-off of the grouped forward, the tolerance of
tests/test_regress_group.py), keeps records and status per run, resumes a killed group without
redoing finished runs, and still runs the runs it does not group (a group of one: ST)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
from _launch import sigterm_when
from test_sweep import _env, _histories, _starts, _sweep_cli, _write

from pbexact.errors import PBInputError
from pbscale import sweep
from pbscale.runs import io
from pbscale.runs.records import GROUPS
from pbscale.sweep import engines as sweep_engines

PLAN = """
[sweep]
command = "regress"
out = "{out}"

[base]
epochs = 1
n = 2

[[grid]]              # a product: one group of 4
method = "loorf"
seed = [1, 0]
lr = [0.1, 0.01]

[[grid]]              # (0, 0.1), (1, 0.1), (2, 0.01): not a product, split per lr
method = "arms"
seed = [0, 1]
lr = 0.1
[[grid]]
method = "arms"
seed = 2
lr = 0.01

[[grid]]              # single: CP, ST (a group of one each), a run with its own chunk
method = ["cp", "st"]
[[grid]]
method = "loorf"
seed = [0, 1]
chunk = 1
"""


def test_plan_groups_products_and_keeps_the_rest_single(tmp_path):
    s = sweep.load(_write(tmp_path, PLAN.format(out=tmp_path / "o")))
    assert not s.group
    jobs = sweep.plan(s, s.runs)
    groups = [j for j in jobs if isinstance(j, sweep.Group)]
    singles = [j for j in jobs if isinstance(j, sweep.Run)]
    assert [(g.runs[0].full["method"], g.values) for g in groups] == [
        ("loorf", {"seed": [0, 1], "lr": [0.01, 0.1]}), ("arms", {"seed": [0, 1], "lr": [0.1]})]
    # every run is in exactly one child
    ids = [r.id for j in jobs for r in sweep.members(j)]
    assert sorted(ids) == sorted(r.id for r in s.runs)
    for g in groups:
        assert {(r.full["seed"], r.full["lr"]) for r in g.runs} == {
            (a, b) for a in g.values["seed"] for b in g.values["lr"]}
    assert sorted((r.full["method"], r.full["chunk"]) for r in singles) == [
        ("arms", None), ("cp", None), ("loorf", 1), ("loorf", 1), ("st", None)]
    line = s.command_line(groups[0])
    assert line[:2] == ["-m", "pbscale.regress"]
    opts = dict(zip(line[2::2], line[3::2]))
    assert opts["--lr"] == "0.01,0.1" and opts["--seeds"] == "0,1"
    assert opts["--method"] == "loorf" and opts["--epochs"] == "1" and opts["--n"] == "2"
    assert line[-5:] == ["--out", str(tmp_path / "o"), "--threads", "1", "--quiet"]
    # the same runs (in any order) form the same group: a relaunched group resumes
    again = sweep.plan(s, list(reversed(s.runs)))
    assert {g.id for g in groups} == {j.id for j in again if isinstance(j, sweep.Group)}
    # a prune sweep groups its seeds (and mask learning rates) into pruning groups
    prune = _write(tmp_path, '[sweep]\ncommand = "prune"\nout = "o"\ngroup = true\n'
                   '[[grid]]\nmethod = "arms"\nseed = [0, 1]\n', "p.toml")
    p = sweep.load(prune)
    assert p.group and [len(j.runs) for j in sweep.plan(p, p.runs)] == [2]


def test_paper_regression_sweep_groups_into_19_groups():
    """sweeps/regression.toml: every run is in a group: the 200 MC runs form 15 groups (10
    seeds, x 2 rates where a setting has both), the 80 ST / REBAR / CP runs 4 groups of 20
    (CP one per optimizer)."""
    s = sweep.load(Path(__file__).resolve().parents[1] / "sweeps" / "regression.toml")
    jobs = sweep.plan(s, s.runs)
    assert len(s.runs) == 280 and len(jobs) == 19
    assert all(isinstance(j, sweep.Group) for j in jobs)
    assert sorted(len(g.runs) for g in jobs) == [10] * 10 + [20] * 9
    assert all(g.values["seed"] == list(range(10)) for g in jobs)
    kinds = {(g.runs[0].full["method"], g.runs[0].full["optimizer"]) for g in jobs
             if len(g.values["lr"]) == 2 and g.runs[0].full["method"] in ("cp", "st", "rebar")}
    assert kinds == {("cp", "rmsprop"), ("cp", "sgd"), ("st", "rmsprop"), ("rebar", "rmsprop")}
    line = s.command_line(next(g for g in jobs if g.runs[0].full["method"] == "cp"))
    assert line[:2] == ["-m", "pbscale.regress"] and "--lr" in line


def test_group_key_must_be_boolean(tmp_path):
    with pytest.raises(PBInputError, match="group must be true or false"):
        sweep.load(_write(tmp_path, '[sweep]\ncommand = "regress"\nout = "o"\ngroup = 1\n'))


def test_the_old_batch_key_is_refused_naming_group(tmp_path):
    with pytest.raises(PBInputError, match="batch is now called group; write group = true$"):
        sweep.load(_write(tmp_path, '[sweep]\ncommand = "regress"\nout = "o"\nbatch = true\n'))


def test_ray_engine_launches_groups_as_tasks(tmp_path, monkeypatch):
    """run_ray submits each child (a group too) as one task with the sweep's resources and
    maps its exit code to every member (a stand-in ``ray`` module; the real Ray is tested in
    tests/test_sweep.py when installed)."""
    s = sweep.load(_write(tmp_path, PLAN.format(out=tmp_path / "o")))
    jobs = sweep.plan(s, s.runs)
    declared, launched = [], []

    class Ref:
        def __init__(self, value):
            self.value = value

    class FakeRay:
        @staticmethod
        def is_initialized():
            return False

        @staticmethod
        def init(**kw):
            inits.append(kw)

        @staticmethod
        def shutdown():
            pass

        @staticmethod
        def remote(**kw):
            declared.append(kw)
            return lambda fn: type("T", (), {"remote": staticmethod(lambda *a: Ref(fn(*a)))})

        @staticmethod
        def wait(refs, num_returns=1, timeout=None):
            return refs[:num_returns], refs[num_returns:]

        @staticmethod
        def get(ref):
            return ref.value

    def fake_launch(sw, job, env=None, procs=None):
        launched.append(job)
        return 3 if isinstance(job, sweep.Group) and job.runs[0].full["method"] == "arms" else 0

    inits: list[dict] = []
    monkeypatch.setitem(sys.modules, "ray", FakeRay)
    monkeypatch.setattr(sweep_engines, "launch", fake_launch)
    codes = sweep.run_ray(s, jobs, 2, None)
    assert launched == jobs
    assert declared == [{"num_cpus": 1.0, "num_gpus": 0.0, "max_retries": 0}]
    # the workers find this checkout: its root first on their PYTHONPATH
    root = str(Path(sweep_engines.__file__).resolve().parents[2])
    assert inits[0]["runtime_env"]["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == root
    arms = {r.id for j in jobs if isinstance(j, sweep.Group) and j.runs[0].full["method"] ==
            "arms" for r in j.runs}
    assert codes == {r.id: 3 if r.id in arms else 0 for r in s.runs}


TINY = """
[sweep]
command = "regress"
out = "{out}"
threads = 1
{batch}

[base]
epochs = 6
n = 2

[[grid]]
method = "loorf"
seed = [0, 1]
lr = [0.1, 0.01]

[[grid]]
method = "arms"
seed = [0, 1]

[[grid]]
method = "st"
"""


def _close(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert len(a[name]) == len(b[name]) == 7, name
        for ra, rb in zip(a[name], b[name]):
            assert ra.keys() == rb.keys()
            for k, v in ra.items():
                if v is None or rb[k] is None:
                    assert v is None and rb[k] is None, (name, k)
                elif isinstance(v, float):
                    assert math.isclose(v, rb[k], rel_tol=1e-5, abs_tol=1e-6), (name, k)
                else:
                    assert v == rb[k], (name, k)


@pytest.fixture(scope="module")
def batched_killed_and_resumed(tmp_path_factory):
    """jobs=1, ``group = true``: children run loorf group (4 runs), arms group (2), st. The
    sweep is killed by SIGTERM once the arms group has a checkpoint, then run again; the same
    sweep ungrouped (no ``group`` key) gives the reference."""
    tmp = tmp_path_factory.mktemp("batch")
    out = tmp / "batched"
    path = _write(tmp, TINY.format(out=out, batch="group = true"), "batched.toml")
    s = sweep.load(path)
    facts: dict = {"path": path, "out": out, "sweep": s, "tmp": tmp}
    proc, killed = sigterm_when(
        [sys.executable, "-m", "pbscale.sweep", "run", str(path), "--jobs", "1"], _env(),
        lambda: any((out / GROUPS).glob("group-arms-*/checkpoint.pt")))
    facts["killed"] = killed
    facts["code"] = proc.wait(timeout=120)
    facts["first_stderr"] = proc.stderr.read().decode()
    facts["after_kill"] = {r.id: sweep.state_of(s, r) for r in s.runs}
    facts["status"] = _sweep_cli("status", str(path)).stdout
    folders = sweep.folder_index(out)
    facts["loorf_summaries"] = {r.id: (folders[r.id] / "summary.json").read_bytes()
                                for r in s.runs if r.options["method"] == "loorf"}
    facts["rerun"] = _sweep_cli("run", str(path), "--jobs", "1")
    ref_path = _write(tmp, TINY.format(out=tmp / "single", batch=""), "single.toml")
    facts["ref_path"] = ref_path
    facts["ref"] = _sweep_cli("run", str(ref_path), "--jobs", "2")
    return facts


def test_killed_batched_sweep_resumes_per_run(batched_killed_and_resumed):
    f = batched_killed_and_resumed
    s, out = f["sweep"], f["out"]
    method = {r.id: r.options["method"] for r in s.runs}
    assert "(2 groups, 3 children)" in f["first_stderr"]
    assert f["killed"], "the arms group never reached a checkpoint"
    assert f["code"] == 143
    assert f["after_kill"] == {i: {"loorf": "finished", "arms": "interrupted", "st": "pending"}[m]
                               for i, m in method.items()}
    assert "finished 4, running 0, failed 0, diverged 0, interrupted 2, pending 1" in f["status"]
    # the interrupted members name their group's log
    group_logs = {sweep.read_record(s, r)["log"] for r in s.runs if method[r.id] == "arms"}
    assert len(group_logs) == 1 and "group-g" in f["status"] and group_logs.pop() in f["status"]

    assert f["rerun"].returncode == 0, f["rerun"].stderr
    assert "4 of 7 runs already finished" in f["rerun"].stderr
    assert "(1 groups, 2 children)" in f["rerun"].stderr
    assert all(sweep.state_of(s, r) == "finished" for r in s.runs)
    recs = {r.id: sweep.read_record(s, r) for r in s.runs}
    logs = {i: Path(rec["log"]) for i, rec in recs.items()}
    starts = {m: {_starts(logs[i]) for i in method if method[i] == m} for m in method.values()}
    assert starts == {"loorf": {1}, "arms": {2}, "st": {1}}
    assert {rec.get("group") is None for i, rec in recs.items() if method[i] == "st"} == {True}
    assert len({recs[i]["group"] for i in method if method[i] == "loorf"}) == 1
    folders = sweep.folder_index(out)
    assert sorted(folders) == sorted(method)  # every run's folder carries its own sweep id
    for i, data in f["loorf_summaries"].items():  # finished runs were not redone
        assert (folders[i] / "summary.json").read_bytes() == data
    # the arms group resumed from its checkpoint: one group folder, its metrics complete
    arms_groups = list((out / GROUPS).glob("group-arms-*"))
    assert len(arms_groups) == 1 and len(io.read_csv(arms_groups[0] / "metrics.csv")) == 7


def test_batched_sweep_results_equal_unbatched_sweep(batched_killed_and_resumed):
    f = batched_killed_and_resumed
    assert f["rerun"].returncode == 0 and f["ref"].returncode == 0, f["ref"].stderr
    assert "groups, " not in f["ref"].stderr  # no groups without group
    batched, single = _histories(f["out"]), _histories(f["tmp"] / "single")
    assert len(batched) == 7
    _close(batched, single)
    # different seeds and rates give different runs (the comparison is not vacuous)
    assert len({round(h[-1]["val_loss_chosen"], 9) for h in batched.values()}) == 7

    tables = {}
    for name, path in (("batched", f["path"]), ("single", f["ref_path"])):
        table = f["tmp"] / f"{name}.csv"
        res = _sweep_cli("results", str(path), "--csv", str(table))
        assert res.returncode == 0, res.stderr
        tables[name] = io.read_csv(table)
    assert len(tables["batched"]) == len(tables["single"]) == 7
    for a, b in zip(tables["batched"], tables["single"]):
        assert (a["method"], a.get("seed"), a.get("lr")) == (b["method"], b.get("seed"),
                                                            b.get("lr"))
        assert Path(a["folder"]).name == Path(b["folder"]).name
        assert math.isclose(a["final_val_loss_chosen"], b["final_val_loss_chosen"],
                            rel_tol=1e-5, abs_tol=1e-6)
        assert (a.get("grouped_runs") or 0) == {"loorf": 4, "arms": 2, "st": 0}[a["method"]]
