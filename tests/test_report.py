"""Claims of tab:app_results_summ as predicates (analysis.microworld.claims) and the instance
study's command line (analysis.report): synthetic results with known answers, then --quick end to
end."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from analysis import report as R
from analysis.cli import run
from analysis.microworld import claims as C
from analysis.microworld import units as U

ROOT = Path(__file__).resolve().parent.parent
SEEDS = 100
#: The settings of ``--quick`` (seeds, steps, seed, log interval).
QUICK = U.Settings(5, 50, 0, 10)


def cfg(method: str, n: int, mean: float, se: float, param: str = "sigmoid",
        found: int = 0, seeds: int = SEEDS, curve=None) -> C.ConfigResult:
    """A config whose per-seed finals have exactly this mean and standard error."""
    if se == 0:
        seeds = 1
        final = np.array([mean])
    else:
        x = np.random.default_rng(len(method) + n).standard_normal(seeds)
        x = (x - x.mean()) / (x.std(ddof=1) / math.sqrt(seeds))  # mean 0, s.e. 1
        final = mean + se * x
    flags = np.zeros(final.size, dtype=bool)
    flags[:found] = True
    steps = np.arange(0, 101, 10)
    curve = np.linspace(0.0, mean, steps.size) if curve is None else np.asarray(curve)
    return C.ConfigResult(method, n, param, 0.1, final, flags, steps, curve)


def unit(experiment: str, configs, min_J: float = -10.0, d: int = 10) -> C.UnitResult:
    return C.UnitResult(experiment, "nnloss", 0, d, min_J, 0.0, list(configs))


def test_config_mean_and_stderr_are_the_requested_ones():
    c = cfg("loorf", 4, -3.0, 0.25)
    assert c.mean == pytest.approx(-3.0, abs=1e-12)
    assert c.stderr == pytest.approx(0.25, rel=1e-12)
    assert cfg("true", 0, -2.0, 0.0).stderr == 0.0


def test_compare_uses_two_combined_standard_errors():
    se = 0.1  # combined: 0.1 * sqrt(2)
    edge = C.Z * math.hypot(se, se)
    base = cfg("loorf", 4, 0.0, se)
    assert C.compare(cfg("reinforce", 4, edge * 1.01, se), base) == 1
    assert C.compare(cfg("reinforce", 4, edge * 0.99, se), base) == 0
    assert C.compare(cfg("reinforce", 4, -edge * 0.99, se), base) == 0
    assert C.compare(cfg("reinforce", 4, -edge * 1.01, se), base) == -1
    # deterministic runs compare exactly
    assert C.compare(cfg("true", 0, -1.0, 0.0), cfg("cp", 0, -1.0, 0.0)) == 0
    assert C.compare(cfg("true", 0, -1.0, 0.0), cfg("cp", 0, -1.1, 0.0)) == 1


def _estimators(reinforce_mean: float, se: float = 0.1, true_mean: float = -5.0,
                true_found: int = 0, others=(-1.0, -1.0, -1.0)) -> C.UnitResult:
    rows = [cfg("reinforce", k, reinforce_mean, se) for k in (1, 4, 10)]
    for k in (4, 10):
        rows += [cfg(m, k, v, se) for m, v in zip(("loorf", "arms", "betastar"), others)]
    rows += [cfg("betastar", 1, others[2], se), cfg("true", 0, true_mean, 0.0, found=true_found)]
    return unit("estimators", rows)


def claim(key: str) -> C.Claim:
    return next(c for c in C.CLAIMS if c.key == key)


def test_reinforce_worst_holds_fails_and_within_noise():
    f = claim("est_reinforce_worst_n4").evaluate
    assert f(_estimators(0.0)).outcome == C.HOLDS  # 1.0 worse, 7 s.e.
    assert f(_estimators(-2.0)).outcome == C.FAILS  # better by 7 s.e.
    v = f(_estimators(-0.9))  # 0.1 worse: 0.7 s.e.
    assert v.outcome == C.NOISE
    assert v.values["z[reinforce n=4 - loorf n=4]"] == pytest.approx(0.1 / math.hypot(0.1, 0.1))
    # worse than two of three but significantly better than ARMS: fails
    assert f(_estimators(0.0, others=(-1.0, 1.0, -1.0))).outcome == C.FAILS
    # worse than two of three, tied with the third: within noise
    assert f(_estimators(0.0, others=(-1.0, 0.05, -1.0))).outcome == C.NOISE


def test_similar_holds_and_fails():
    f = claim("est_similar_n10").evaluate
    assert f(_estimators(0.0, others=(-1.0, -1.1, -0.95))).outcome == C.HOLDS
    assert f(_estimators(0.0, others=(-1.0, -1.5, -0.95))).outcome == C.FAILS


def test_true_gradient_claims():
    misses = claim("est_true_misses").evaluate
    assert misses(_estimators(0.0, true_found=0)).outcome == C.HOLDS
    assert misses(_estimators(0.0, true_found=1)).outcome == C.FAILS
    beats = claim("est_true_beats_mc").evaluate
    assert beats(_estimators(0.0, true_mean=-5.0)).outcome == C.HOLDS
    assert beats(_estimators(0.0, true_mean=0.5)).outcome == C.FAILS
    assert beats(_estimators(0.0, true_mean=-1.05)).outcome == C.NOISE


def _params(fast_mean: float, fast_t: int = 20, slow_t: int = 80, found=None) -> C.UnitResult:
    rows, steps = [], np.arange(0, 101, 10)
    for k in (1, 4, 10):
        m = "reinforce" if k == 1 else "loorf"
        for p in ("sigmoid", "cosine", "direct", "escort"):
            fast = p in C.FAST
            t = fast_t if fast else slow_t
            mean = fast_mean if fast else -1.0
            curve = np.where(steps >= t, mean, 0.0)  # all the drop at iteration t
            hits = (found or {}).get((k, p), 0)
            rows.append(cfg(m, k, mean, 0.1, param=p, found=hits, curve=curve))
    return unit("params", rows)


def test_parametrization_claims():
    fast = claim("par_fast_n10").evaluate
    assert fast(_params(-1.0, 20, 80)).outcome == C.HOLDS
    v = fast(_params(-1.0, 80, 20))
    assert v.outcome == C.FAILS and v.values["iters90[direct]"] == 80.0
    assert C.iterations_to_drop(cfg("loorf", 4, 1.0, 0.1, curve=[0.0, 1.0])) == math.inf
    better = claim("par_sigmoid_better_n4").evaluate
    assert better(_params(0.0)).outcome == C.HOLDS
    assert better(_params(-2.0)).outcome == C.FAILS
    assert better(_params(-0.95)).outcome == C.NOISE
    only = claim("par_only_n1_finds").evaluate
    assert only(_params(0.0, found={(1, "sigmoid"): 3})).outcome == C.HOLDS
    assert only(_params(0.0, found={(1, "sigmoid"): 3, (10, "escort"): 1})).outcome == C.FAILS
    assert only(_params(0.0)).outcome == C.FAILS  # nobody finds z*


def _approaches(cp: float, st: float, rebar: float = -1.0, relax: float = -1.0,
                found: int = 0) -> C.UnitResult:
    rows = [cfg("reinforce", 1, -1.0, 0.1, found=found), cfg("st", 1, st, 0.1, found=found),
            cfg("rebar", 1, rebar, 0.1, found=found), cfg("relax", 1, relax, 0.1, found=found),
            cfg("cp", 0, cp, 0.0, found=min(found, 1)),
            cfg("true", 0, -1.0, 0.0, found=min(found, 1))]
    return unit("approaches", rows)


def test_approaches_claims():
    worst = claim("app_cp_st_worst").evaluate
    assert worst(_approaches(0.0, 0.0)).outcome == C.HOLDS
    assert worst(_approaches(0.0, -3.0)).outcome == C.FAILS
    assert worst(_approaches(0.0, -0.9)).outcome == C.NOISE
    help_ = claim("app_grad_no_help").evaluate
    assert help_(_approaches(0.0, 0.0, rebar=-1.1)).outcome == C.HOLDS  # within noise
    assert help_(_approaches(0.0, 0.0, relax=-2.0)).outcome == C.FAILS


def test_d4_claims():
    f = claim("d4_approaches_find").evaluate
    assert f(_approaches(-1.0, -1.0, found=SEEDS)).outcome == C.HOLDS
    v = f(_approaches(-1.0, -1.0, found=90))  # 90% of the MC seeds
    assert v.outcome == C.FAILS and v.values["found_fraction[st n=1]"] == 0.9


def test_every_claim_evaluates_on_a_unit_of_its_experiment():
    units = {"estimators": _estimators(0.0), "params": _params(0.0),
             "approaches": _approaches(0.0, 0.0)}
    assert len({c.key for c in C.CLAIMS}) == len(C.CLAIMS)
    for c in C.CLAIMS:
        v = c.evaluate(units[c.experiment])
        assert v.outcome in C.OUTCOMES, c.key
        assert v.detail and c.criterion and c.paper


def test_plan_units_and_instances():
    units = U.plan_units(U.EXPERIMENTS, [0, 1], 10, True)
    # per instance: estimators x2, params x2, approaches x1 at d=10; estimators x2 + approaches
    # x1 at d=4
    assert len(units) == 2 * (5 + 3)
    assert R.parse_instances("0-3,7") == [0, 1, 2, 3, 7]
    assert run(R.main, ["--instances", "a-b"]) == 2
    assert run(R.main, ["--seeds", "1"]) == 2


# ---------------------------------------------------------------------------------------------
# End to end


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    results, out = base / "results", base / "out"
    assert run(R.main, ["--quick", "--results", str(results), "--out", str(out)]) == 0
    return results, out


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_quick_writes_every_table_and_figure(quick):
    results, out = quick
    rows = _csv(out / "agreement.csv")
    expected = sum(len(c.benchmarks) for c in C.CLAIMS)
    assert len(rows) == expected
    for r in rows:
        assert r["instances"] == "2"
        assert int(r["holds"]) + int(r["fails"]) + int(r["noise"]) == 2
        per = _csv(out / "claims" / f"{r['claim']}.csv")
        mine = [p for p in per if p["benchmark"] == r["benchmark"]]
        assert sorted(int(p["instance"]) for p in mine) == [0, 1]
        assert sum(p["outcome"] == "holds" for p in mine) == int(r["holds"])
    md = (out / "agreement.md").read_text()
    assert md.count("\n| ") == expected + 2  # header, rule, one line per (claim, benchmark)
    for bench in U.BENCHMARKS:
        assert (out / f"final_loss_{bench}_d10.png").stat().st_size > 10_000
    norm = _csv(out / "final_loss_d10.csv")
    # normalized = (final - min J) / (E_0.5[J] - min J), recomputed from the J table
    for r in norm[:5]:
        J = U.instance_table(r["benchmark"], 10, int(r["instance"]))
        want = (float(r["final_mean"]) - J.min()) / (J.mean() - J.min())
        assert float(r["normalized"]) == pytest.approx(want, rel=1e-12)
    assert len(_csv(out / "units.csv")) == 16
    # quick runs are not at the committed scale: nothing to compare instance 0 with
    assert _csv(out / "instance0_check.csv") == []


def test_replot_reproduces_the_tables_and_settings_guard_reuse(quick, tmp_path):
    results, out = quick
    out2 = tmp_path / "out2"
    assert run(R.main, ["--quick", "--replot", "--results", str(results),
                        "--out", str(out2)]) == 0
    for name in ("agreement.csv", "agreement.md", "final_loss_d10.csv"):
        assert (out2 / name).read_text() == (out / name).read_text()
    settings = QUICK
    u = U.Unit("estimators", "nnloss", 0, 10)
    assert U.is_done(results, u, settings)
    assert not U.is_done(results, u, U.Settings(5, 51, 0, 10))  # other steps: rerun
    # --replot refuses results of other settings
    assert run(R.main, ["--replot", "--instances", "0", "--seeds", "5", "--steps", "51",
                        "--results", str(results), "--out", str(tmp_path / "o3")]) == 2


def test_instance0_check_and_wrong_instance(quick, tmp_path):
    results, _ = quick
    u = U.Unit("estimators", "nnloss", 0, 10)
    src = U.unit_dir(results, u, QUICK) / f"{u.stem}.csv"
    ref = tmp_path / "ref"
    ref.mkdir()
    shutil.copy(src, ref / src.name)
    J0 = U.instance_table("nnloss", 10, 0)
    loaded = {u: U.read_unit(src, u, J0)}
    rows = R.instance0_check(loaded, results, QUICK, ref)
    assert rows[0][-1] == 1 and rows[0][5] == repr(0.0)
    # a reference with one seed's final changed is reported as different
    text = (ref / src.name).read_text().splitlines()
    k = next(i for i, line in enumerate(text) if line.startswith("final,"))
    parts = text[k].split(",")
    parts[10] = repr(float(parts[10]) + 0.5)
    text[k] = ",".join(parts)
    (ref / src.name).write_text("\n".join(text) + "\n")
    rows = R.instance0_check(loaded, results, QUICK, ref)
    assert rows[0][-1] == 0 and float(rows[0][5]) == pytest.approx(0.5)
    # results read against another instance's J table are refused
    with pytest.raises(R.PBInputError, match="does not start"):
        U.read_unit(src, u, U.instance_table("nnloss", 10, 1))


def test_parallel_units_give_the_same_numbers(quick, tmp_path):
    results, _ = quick
    args = ["--experiments", "estimators", "--no-d4", "--instances", "1", "--seeds", "5",
            "--steps", "50", "--jobs", "2", "--results", str(tmp_path / "r"),
            "--out", str(tmp_path / "o")]
    assert run(R.main, args) == 0
    for bench in U.BENCHMARKS:
        for i in (1,):
            u = U.Unit("estimators", bench, i, 10)
            a = (U.unit_dir(results, u, QUICK) / f"{u.stem}.csv").read_bytes()
            b = (U.unit_dir(tmp_path / "r", u, QUICK) / f"{u.stem}.csv").read_bytes()
            assert a == b, u.name
            rec = json.loads((U.unit_dir(tmp_path / "r", u, QUICK) / "unit.json").read_text())
            assert rec["settings"]["steps"] == 50


# ---------------------------------------------------------------------------------------------
# Bad input never touches finished results


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("argv, message", [
    (["--seed", "-1"], "--seed: must be an integer >= 0"),
    (["--d", "0"], "--d: invalid choice"),
    (["--d", "3", "--no-d4"], "--d: invalid choice"),
    (["--d", "4", "--no-d4"], "no claim of tab:app_results_summ is defined for params at d = 4"),
    (["--steps", "0"], "--steps"),
    (["--log-every", "0"], "--log-every"),
    (["--jobs", "0"], "--jobs"),
    (["--seeds", "1"], "--seeds"),
    (["--instances", "0-100000000"], "at most 1,000 instances, got the range 0-100000000"),
])
def test_bad_values_are_refused_before_any_folder_is_touched(quick, tmp_path, capsys, argv,
                                                              message):
    results, _ = quick
    mine = tmp_path / "results"
    shutil.copytree(results, mine)
    before = _snapshot(mine)
    out = tmp_path / "out"
    base = [] if "--instances" in argv else ["--instances", "0-1"]
    assert run(R.main, [*base, "--seeds", "5", "--steps", "50", *argv, "--results", str(mine),
                        "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert _snapshot(mine) == before
    assert sorted(p.name for p in (mine / "units").iterdir()) == sorted(
        p.name for p in (results / "units").iterdir())  # no junk unit folders
    assert not out.exists()


def test_unusable_paths_are_refused_before_the_work(quick, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    results, _ = quick
    for argv, message in ((["--out", str(afile)], "--out"),
                          (["--out", str(afile / "sub")], "lies under the file"),
                          (["--results", str(afile)], "--results"),
                          (["--replot", "--results", str(afile)], "--results"),
                          (["--compare-with", str(afile)], "--compare-with")):
        full = ["--quick", "--results", str(tmp_path / "fresh"), "--out", str(tmp_path / "o"),
                *argv]
        assert run(R.main, full) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)
        assert not (tmp_path / "fresh").exists() and afile.read_text() == "x"


def test_a_unit_its_tool_refuses_keeps_the_old_result_and_says_why(tmp_path):
    results = tmp_path / "results"
    settings = U.Settings(2, 12, 0, 1)
    unit = U.Unit("estimators", "exponential", 0, 17)  # the microworld refuses d = 17 itself
    old = U.unit_dir(results, unit, settings)
    old.mkdir(parents=True)
    (old / "unit.json").write_text('{"finished": true}')
    (old / f"{unit.stem}.csv").write_text("old results")
    before = _snapshot(old)
    with pytest.raises(R.PBInputError, match=r"^unit estimators_d17_exponential_i0: .*d"):
        U.run_unit(unit, settings, results)
    assert _snapshot(old) == before
    assert sorted(p.name for p in (results / "units").iterdir()) == [old.name]  # no partials
    with pytest.raises(R.PBInputError, match="unit estimators_d17_exponential_i0"):
        U.run_units([unit], settings, results, jobs=2)  # through the process pool as well
    assert _snapshot(old) == before


def test_units_of_other_settings_stay_beside_each_other(tmp_path, monkeypatch):
    results = tmp_path / "results"
    unit = U.Unit("estimators", "exponential", 0, 4)
    a, b = U.Settings(2, 12, 0, 1), U.Settings(3, 12, 0, 1)  # --seeds 2, then --seeds 3
    U.run_unit(unit, a, results)
    folder = U.unit_dir(results, unit, a)
    first = _snapshot(folder)
    assert U.is_done(results, unit, a) and not U.is_done(results, unit, b)
    rec = json.loads((folder / "unit.json").read_text())
    assert rec["argv"][rec["argv"].index("--out") + 1] == str(folder)
    # a crash mid-unit leaves every finished folder as it was
    import analysis.microworld as M

    def crash(argv):
        raise RuntimeError("killed")

    monkeypatch.setattr(M, "main", crash)
    with pytest.raises(RuntimeError):
        U.run_unit(unit, b, results)
    assert _snapshot(folder) == first
    partial = [p for p in (results / "units").iterdir() if p.name.endswith(".partial")]
    assert len(partial) == 1 and "RuntimeError: killed" in (partial[0] / "log.txt").read_text()
    monkeypatch.undo()
    U.run_unit(unit, b, results)
    # both stay: the --seeds 2 unit (log, CSV, unit.json, figures) is untouched
    assert U.is_done(results, unit, a) and U.is_done(results, unit, b)
    assert _snapshot(folder) == first
    assert U.unit_dir(results, unit, b) != folder
    assert not [p for p in (results / "units").iterdir() if p.name.endswith(".old")]


def test_a_study_with_other_seeds_keeps_the_first_one(quick, tmp_path, capsys):
    results, _ = quick
    mine = tmp_path / "results"
    shutil.copytree(results, mine)
    before = _snapshot(mine)
    argv = ["--experiments", "estimators", "--no-d4", "--instances", "0", "--steps", "50",
            "--results", str(mine), "--out", str(tmp_path / "o")]
    assert run(R.main, [*argv, "--seeds", "3"]) == 0
    after = _snapshot(mine)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing replaced
    assert len({k.parts[1] for k in after} - {k.parts[1] for k in before}) == 2  # 2 new units
    capsys.readouterr()
    assert run(R.main, [*argv, "--seeds", "5", "--replot"]) == 0  # the 5-seed study is intact
    assert (tmp_path / "o" / "agreement.md").read_text().count("5 seeds") == 1


def test_finished_units_of_an_older_layout_are_adopted(quick, tmp_path):
    results, _ = quick
    mine = tmp_path / "results"
    shutil.copytree(results, mine)
    u = U.Unit("estimators", "nnloss", 0, 10)
    keyed = U.unit_dir(mine, u, QUICK)
    keyed.rename(mine / "units" / u.name)  # the folder name before units were keyed
    assert not U.is_done(mine, u, QUICK)
    assert U.adopt_unkeyed(mine, [u], QUICK) == 1 and U.is_done(mine, u, QUICK)
    # one of other settings is left where it is
    keyed.rename(mine / "units" / u.name)
    assert U.adopt_unkeyed(mine, [u], U.Settings(5, 51, 0, 10)) == 0
    assert (mine / "units" / u.name).is_dir()


@pytest.mark.parametrize("argv, message", [
    (["--steps", str(10**20)], "--steps: must be at most"),
    (["--steps", str(2 * 10**9)], "--steps: must be at most 1,000,000,000"),
    (["--compare-with", "/nonexistent-pbnn"], "--compare-with /nonexistent-pbnn does not exist"),
    (["--meth", "x"], "unrecognized arguments: --meth"),
])
def test_more_bad_options_are_one_line(tmp_path, capsys, argv, message):
    assert run(R.main, ["--quick", *argv, "--results", str(tmp_path / "r"),
                        "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()


def test_scale_rows_refuse_a_file_and_a_damaged_run_in_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert run(R.main, ["--experiments", "supermask", "--scale-out", str(afile)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--scale-out" in err[0] and "is a file" in err[0], err
    assert afile.read_text() == "x"
    assert run(R.main, ["--experiments", "supermask", "--scale-runs", str(afile),
                        "--scale-out", str(tmp_path / "s")]) == 2
    assert "--scale-runs" in capsys.readouterr().err
    runs = tmp_path / "runs" / "lenet-0123456789ab"
    runs.mkdir(parents=True)
    (runs / "config.json").write_text("[]")
    (runs / "summary.json").write_text('{"final_test_acc": "high"}')
    code = run(R.main, ["--experiments", "supermask", "--scale-runs", str(tmp_path / "runs"),
                        "--scale-out", str(tmp_path / "s")])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and code in (0, 2)
    if code == 2:
        assert captured.err.strip().splitlines()[-1].startswith("error: ")


# ---------------------------------------------------------------------------------------------
# Stopped studies: one line, the finished units kept, no process left behind


def _state(pid: int) -> str | None:
    """The process state letter of ``pid`` (None when gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _wait_for(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("sig, jobs", [(signal.SIGTERM, 2), (signal.SIGKILL, 2),
                                       (signal.SIGINT, 1)])
def test_a_stopped_study_leaves_no_process_and_says_how_to_resume(tmp_path, sig, jobs):
    results = tmp_path / "r"
    cmd = [sys.executable, "-m", "analysis.report", "--experiments", "estimators", "--no-d4",
           "--instances", "0", "--seeds", "5", "--steps", "300000", "--log-every", "1000",
           "--jobs", str(jobs), "--results", str(results), "--out", str(tmp_path / "o")]
    # the child gets Python's own Ctrl-C handling whatever this process inherited (a test run in
    # the background starts with SIGINT ignored)
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        units = results / "units"
        started = _wait_for(lambda: len(list(units.glob(".*.partial/log.txt"))) >= jobs, 120)
        assert started, proc.stderr.read() if proc.poll() is not None else "no unit started"
        kids = _children(proc.pid)
        assert len(kids) >= (jobs if jobs > 1 else 0), kids  # workers (+ resource tracker)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait_for(lambda: all(_state(p) in (None, "Z") for p in kids), 30), \
        [(p, _state(p)) for p in kids]
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    assert code == 128 + sig, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{signal.Signals(sig).name}: 0 of 2 units finished, kept in "
                               f"{units}; resume with: python -m analysis.report "), lines
    # the next run removes the stopped units' partial folders and starts them again
    assert not list(units.glob("*-*/unit.json"))
