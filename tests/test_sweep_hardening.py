"""pbscale.sweep refuses bad sweep files, paths and values in one line (exit 2); checks each value
with the command's own parser and names a run by its canonical options (a run in two spellings
is one run, and ids of runs written canonically are unchanged); holds one lock per sweep folder;
its children die with it (SIGKILL of the sweep leaves no orphan, and the rerun finishes exactly
the unfinished runs); a child stopped after its summary was written is finished; a relative out
is relative to the sweep file; status -v and results name the run folders; --help shows every
default."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch import worker_env

from pbexact.errors import PBInputError
from pbscale import sweep
from pbscale.runs import io
from pbscale.sweep import file as sweep_file
from pbscale.sweep import records as sweep_records

ROOT = Path(__file__).resolve().parents[1]
HEAD = '[sweep]\ncommand = "regress"\nout = "o"\n'


def _write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _main(capsys, *args: str) -> tuple[int, str, str]:
    code = sweep.main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _one_line_error(code: int, err: str) -> None:
    assert code == 2
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


# ---------------------------------------------------------------------- bad files and paths


@pytest.mark.parametrize("text, words", [
    ('sweep = 3\n', "sweep must be a table"),
    ('sweep = ["regress"]\n', "sweep must be a table"),
    ("grid = [1, 2]\n" + HEAD, "array of tables"),
    ("grid = 3\n" + HEAD, "array of tables"),
    ("base = [1]\n" + HEAD, "must be a table"),
    (HEAD + "cpus = inf\n", "cpus must be"),
    (HEAD + "cpus = nan\n", "cpus must be"),
    (HEAD + "cpus = 1e12\n", "cpus must be"),
    (HEAD + "cpus = true\n", "cpus must be"),
    (HEAD + "gpus = inf\n", "GPU fraction"),
    (HEAD + "gpus = 1e9\n", "GPU fraction"),
    (HEAD + "gpus = true\n", "GPU fraction"),
    (HEAD + "threads = true\n", "threads must be"),
    (HEAD + "threads = 100000\n", "threads must be"),
    ('[sweep]\ncommand = "regress"\nout = 3\n', "out must be a folder name"),
])
def test_bad_sweep_tables_and_resources(tmp_path, capsys, text, words):
    path = _write(tmp_path, text)
    with pytest.raises(PBInputError, match=words):
        sweep.load(path)
    code, _, err = _main(capsys, "status", str(path))
    _one_line_error(code, err)


def test_non_utf8_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes((HEAD + '[base]\nmethod = "lo\xe9rf"\n').encode("latin-1"))
    code, _, err = _main(capsys, "status", str(path))
    _one_line_error(code, err)
    assert "not UTF-8" in err


def test_absurd_jobs_refused_before_anything_runs(tmp_path, capsys):
    path = _write(tmp_path, HEAD + "[base]\nepochs = 1\n")
    for jobs in ("100000", "-1", "nan", "1e3"):
        with pytest.raises(SystemExit) as exc:
            sweep.main(["run", str(path), "--jobs", jobs, "--dry-run"])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: argument --jobs") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_run_out_a_file_or_under_a_file_is_one_line(tmp_path, capsys):
    path = _write(tmp_path, HEAD + "[base]\nepochs = 1\n")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        code, _, err = _main(capsys, "run", str(path), "--out", str(out))
        _one_line_error(code, err)
        assert str(afile) in err
    assert afile.read_text() == "x"


def _fake_finished_run(s: sweep.Sweep, run: sweep.Run, name: str, summary: object = None) -> Path:
    """A run folder as the command leaves it: config.json naming the sweep id, summary.json."""
    folder = s.out / name
    folder.mkdir(parents=True)
    io.write_json(folder / "config.json", {"info": {"sweep_id": run.id}})
    io.write_json(folder / "summary.json", {"final_val_loss": 0.5} if summary is None
                  else summary)
    return folder


def test_results_prints_compact_table_by_default(tmp_path, capsys):
    """``results`` without --csv: a table on stdout, one line per finished run with the
    options that differ, the summary's main metrics and the folder; nothing written."""
    path = _write(tmp_path, HEAD + "[[grid]]\nseed = [0, 1, 2]\nepochs = [3]\n")
    s = sweep.load(path)
    _fake_finished_run(s, s.runs[0], "first", {"final_val_loss": 0.123456, "device": "cpu"})
    _fake_finished_run(s, s.runs[2], "third", {"final_val_loss": 0.5, "device": "cpu"})
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, out, err = _main(capsys, "results", str(path))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["seed", "val_loss", "folder"]  # epochs is the same everywhere
    assert [line.split() for line in lines[1:]] == [["0", "0.1235", "first"],
                                                     ["2", "0.5", "third"]]
    assert "2 of 3 runs finished" in err and "--csv" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_results_csv_paths_and_damaged_run_folders(tmp_path, capsys):
    path = _write(tmp_path, HEAD + "[[grid]]\nseed = [0, 1, 2]\n")
    s = sweep.load(path)
    good = _fake_finished_run(s, s.runs[0], "good")
    _fake_finished_run(s, s.runs[1], "badsummary", summary=[1, 2])
    other = s.out / "badconfig"
    other.mkdir()
    (other / "config.json").write_text("[]")
    trunc = s.out / "truncated"
    trunc.mkdir()
    (trunc / "config.json").write_text('{"info": {"sweep_')
    for csv in (tmp_path, tmp_path / "nofolder" / "x.csv", good / "summary.json" / "x.csv"):
        code, _, err = _main(capsys, "results", str(path), "--csv", str(csv))
        _one_line_error(code, err)
    table = tmp_path / "r.csv"
    code, out, err = _main(capsys, "results", str(path), "--csv", str(table))
    assert code == 0, err
    assert "Traceback" not in err
    skipped = [line for line in err.splitlines() if line.startswith("warning: skipped")]
    assert sorted(Path(line.split()[2].rstrip(":")).parent.name for line in skipped) == [
        "badconfig", "badsummary", "truncated"]
    rows = io.read_csv(table)
    assert [(r["seed"], r["folder"]) for r in rows] == [(0, str(good))]
    code, out, _ = _main(capsys, "status", str(path), "-v")
    assert code == 0 and f"folder: {good}" in out


def test_results_skip_wrong_values_and_a_damaged_record_defers_to_the_folder(tmp_path,
                                                                             capsys):
    """Issue 50: a summary.json whose values are of the wrong kind or out of range
    (``final_test_acc: "x"``, ``final_remaining: -3``) is not a finished run: ``results`` skips
    it with one warning naming the value (as analysis.pareto does) and ``status`` does not
    count it; a truncated record of a run whose folder holds a readable summary shows it
    finished, not pending."""
    path = _write(tmp_path, HEAD + "[[grid]]\nseed = [0, 1, 2, 3]\n")
    s = sweep.load(path)
    good = _fake_finished_run(s, s.runs[0], "good")
    _fake_finished_run(s, s.runs[1], "letters", {"final_val_loss": 0.5, "final_test_acc": "x"})
    _fake_finished_run(s, s.runs[2], "negative", {"final_val_loss": 0.5,
                                                  "final_remaining": -3})
    _fake_finished_run(s, s.runs[3], "empty", {})  # as the run refuses it: not finished
    code, out, err = _main(capsys, "results", str(path))
    assert code == 0, err
    assert [line.split()[-1] for line in out.splitlines()[1:]] == ["good"]
    skipped = [line for line in err.splitlines() if line.startswith("warning: skipped")]
    assert len(skipped) == 3, err
    assert any("empty JSON object" in line for line in skipped), skipped
    assert any("final_test_acc is 'x', not a number" in line for line in skipped), skipped
    assert any("final_remaining is -3, not a fraction" in line for line in skipped), skipped
    code, out, _ = _main(capsys, "status", str(path))
    assert code == 0 and "finished 1," in out and "pending 3" in out, out
    record = s.record_dir / f"{s.runs[0].id}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    io.write_json(record, {"id": s.runs[0].id, "state": "finished", "returncode": 0})
    record.write_text(record.read_text()[:20])  # truncated
    code, out, _ = _main(capsys, "status", str(path), "-v")
    assert code == 0 and "finished 1," in out and f"folder: {good}" in out, out
    code, out, err = _main(capsys, "run", str(path), "--dry-run")
    assert code == 0 and good.name not in out


# ---------------------------------------------------------------------- values


@pytest.mark.parametrize("table, words", [
    ("lr = false", "--lr takes a value, not false"),
    ("n = true", "--n takes a value, not true"),
    ('lr = "fast"', "--lr fast: expected a number"),
    ("n = 0", "--n 0: must be a positive integer"),
    ("seed = -1", "--seed -1: must be an integer >= 0"),
    ("lr = inf", "finite"),
    ('lr = "nan"', "finite"),
    ("seed = 1.5", "--seed 1.5: expected an integer"),
    ("quiet = true", "set by the sweep"),
    ("epochs = 2020-01-01", "number or a string"),
])
def test_values_checked_with_the_commands_parser(tmp_path, table, words):
    with pytest.raises(PBInputError, match=re.escape(words)):
        sweep.load(_write(tmp_path, HEAD + f"[[grid]]\n{table}\n"))


@pytest.mark.parametrize("command, table, words", [
    ("prune", 'method = "cp"\nlam_target = 5.0', "--lam-target is a fraction"),
    ("prune", 'method = "cp"\ncp_final_tau = [0.5, 0.0]', "0 < final_tau <= 1"),
    ("prune", 'method = "arms"\nmask_lr = "0.1,0.2"\nlam_target = 0.5\nlam = 0.0',
     "give --lam > 0"),
    ("regress", 'method = "loorf"\nn = 1', "LOORF needs n >= 2"),
])
def test_runs_are_checked_as_the_run_checks_them_before_anything_starts(tmp_path, capsys,
                                                                        command, table, words):
    """Issue 50: values each flag's parser accepts but the run itself refuses when it starts
    (a3f3b10 passed them, and --dry-run listed the runs; every child then failed) are
    refused by the sweep's check of every run, before status, results or run do anything:
    one line naming the file, the run and the run's own message."""
    path = _write(tmp_path, f'[sweep]\ncommand = "{command}"\nout = "o"\n[[grid]]\n{table}\n'
                  + ('synthetic = 48\n' if command == "prune" else ""))
    for args in (["status", str(path)], ["run", str(path), "--dry-run"],
                 ["results", str(path)]):
        code, out, err = _main(capsys, *args)
        _one_line_error(code, err)
        assert str(path) in err and "would be refused when it starts" in err and words in err
    assert not (tmp_path / "o").exists()


def test_switches_take_booleans_only(tmp_path):
    text = ('[sweep]\ncommand = "prune"\nout = "o"\n[[grid]]\nmask_head = [true, false]\n'
            'synthetic = 8\n')
    s = sweep.load(_write(tmp_path, text))
    argvs = [s.argv(r) for r in s.runs]
    assert "--mask-head" in argvs[0] and "--mask-head" not in argvs[1]
    assert all("True" not in a and "False" not in a for a in argvs)
    # mask_head = false is the default: the same run as leaving it out
    again = sweep.load(_write(tmp_path, text.replace("mask_head = [true, false]\n", ""), "b.toml"))
    assert again.runs[0].id == s.runs[1].id
    with pytest.raises(PBInputError, match="--mask-head is a switch; give true or false"):
        sweep.load(_write(tmp_path, text.replace("[true, false]", "1"), "c.toml"))


def test_spellings_of_one_run_are_one_run(tmp_path):
    """"0.1" and 0.1, 1 and 1.0 for a float flag, and a default spelled out are one run each."""
    text = HEAD + """[base]
epochs = 1
[[grid]]
seed = 0
[[grid]]
seed = "0"
lr = ["0.1", 0.1, 1e-1]
n = 10
method = "loorf"
[[grid]]
seed = [0, 1]
lr = [1, 1.0, "1"]
lam = [0, 0.0]
"""
    s = sweep.load(_write(tmp_path, text))
    assert [(r.full["seed"], r.full["lr"]) for r in s.runs] == [(0, 0.1), (0, 1.0), (1, 1.0)]
    assert s.runs[0].options == {"epochs": 1, "seed": 0}
    assert s.argv(s.runs[1])[:6] == ["--epochs", "1", "--seed", "0", "--lr", "1.0"]


def test_ids_of_canonical_runs_unchanged():
    """The run ids of the shipped sweep files, as ids were before values were checked (a
    digest of each file's ordered ids): every existing record is still found."""
    pinned = {"pruning_broad.toml": (2210, "8503ee2fc4eba210"),
              "pruning_specialized.toml": (390, "686bf8618fb88f23"),
              "regression.toml": (280, "85a863cce9d48976"),
              "supermask.toml": (3780, "33048b061636210d")}
    for name, (n, digest) in pinned.items():
        ids = [r.id for r in sweep.load(ROOT / "sweeps" / name).runs]
        assert (len(ids), hashlib.sha256(",".join(ids).encode()).hexdigest()[:16]) == (n, digest)


def test_flags_added_later_enter_ids_only_when_set(tmp_path):
    """prune's --lam-target and --drop-checkpoint (and no tool's --version) at their defaults
    leave run ids as they were; set, they name another run."""
    head = '[sweep]\ncommand = "prune"\nout = "o"\n[[grid]]\nseed = [0]\n'
    ids = [sweep.load(_write(tmp_path, head + extra, f"{i}.toml")).runs[0].id
           for i, extra in enumerate(("", "lam_target = 0.0\ndrop_checkpoint = false\n",
                                      "lam_target = 0.2\n"))]
    assert ids[0] == ids[1] != ids[2]


def test_record_under_the_spelled_id_is_still_found(tmp_path):
    """``lam = 0`` for a float flag: the canonical id differs from the id the spelled value had;
    a record kept under the spelled id is this run's record."""
    path = _write(tmp_path, HEAD + "[[grid]]\nlam = 0\nseed = [0, 1]\n")
    s = sweep.load(path)
    first = s.runs[0]
    actions = sweep_file.command_actions("pbscale.regress")
    spelled = sweep_file.run_id("regress", sweep_file.in_run_id(
        actions, {**{k: a.default for k, a in actions.items()}, "lam": 0, "seed": 0}))
    assert first.spelled_id == spelled != first.id
    s.record_dir.mkdir(parents=True)
    io.write_json(s.record_dir / f"{spelled}.json", {"id": spelled, "state": "failed"})
    again = sweep.load(path)
    assert again.runs[0].id == spelled and again.runs[1].id == s.runs[1].id
    assert sweep.state_of(again, again.runs[0]) == "failed"


# ---------------------------------------------------------------------- out, help


def test_relative_out_is_relative_to_the_sweep_file(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "sweeps"
    folder.mkdir()
    path = _write(folder, HEAD + "[base]\nepochs = 1\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    s = sweep.load(path)
    assert s.out == folder / "o" and not s.notes
    assert sweep.load(path, out="p").out == elsewhere / "p"  # --out: relative to the cwd
    # an older sweep whose records are only under the cwd-relative folder keeps that folder
    old = elsewhere / "o" / f"sweep-{path.stem}"
    old.mkdir(parents=True)
    io.write_json(old / f"{s.runs[0].id}.json", {"state": "failed"})
    kept = sweep.load(path)
    assert kept.out == elsewhere / "o"
    assert len(kept.notes) == 1 and str(folder / "o") in kept.notes[0]
    code, out, err = _main(capsys, "status", str(path))
    assert code == 0 and err.startswith("note: using") and "failed 1" in out
    (folder / "o" / f"sweep-{path.stem}").mkdir(parents=True)
    io.write_json(folder / "o" / f"sweep-{path.stem}" / "x.json", {})
    assert sweep.load(path).out == folder / "o"  # both hold records: the file's folder


def test_help_shows_every_default_and_choice():
    parser = sweep.build_parser()
    subs = next(a for a in parser._actions if a.choices and "run" in a.choices).choices
    for name, sub in subs.items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            if action.required:
                assert "(required)" in action.help
                continue
            assert f"default: {action.default}" in text, (name, action.dest)
    run_help = " ".join(subs["run"].format_help().split())
    assert "{local,ray}" in run_help


# ---------------------------------------------------------------------- records and processes


def test_child_killed_after_its_summary_counts_as_finished(tmp_path, monkeypatch):
    """A child that wrote its summary.json and was then stopped by SIGTERM: finished."""
    path = _write(tmp_path, HEAD + "[[grid]]\nseed = [0, 1]\n")
    s = sweep.load(path)
    script = ("import json, os, signal, sys, pathlib; info = json.loads(os.environ"
              "['PBSCALE_RUN_INFO']); d = pathlib.Path(sys.argv[1]) / info['sweep_id']; "
              "d.mkdir(parents=True); (d / 'config.json').write_text(json.dumps({'info': info}));"
              " (d / 'summary.json').write_text('{\"final_val_loss\": 0.5}') if sys.argv[2] == '1'"
              " else None; "
              "os.kill(os.getpid(), signal.SIGTERM)")
    lines = {s.runs[0].id: "1", s.runs[1].id: "0"}
    monkeypatch.setattr(sweep.Sweep, "command_line",
                        lambda self, job: ["-c", script, str(self.out), lines[job.id]])
    codes = [sweep.launch(s, r) for r in s.runs]
    assert codes == [143] * 2  # killed by SIGTERM before any handler: recorded as the docs say
    assert [sweep.read_record(s, r)["returncode"] for r in s.runs] == [143, 143]
    assert [sweep.state_of(s, r) for r in s.runs] == ["finished", "interrupted"]


def test_dead_or_reused_pid_is_not_running_and_live_child_is_not_relaunched(tmp_path, capsys):
    path = _write(tmp_path, HEAD + "[[grid]]\nseed = [0, 1, 2]\n")
    s = sweep.load(path)
    s.record_dir.mkdir(parents=True)
    host = os.uname().nodename
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = os.getpid()
        recs = [{"state": "running", "host": host, "pid": live.pid,
                 "pid_start": sweep_records.process_start(live.pid)},
                # this test's pid with another start time: a reused pid, not the child
                {"state": "running", "host": host, "pid": me,
                 "pid_start": sweep_records.process_start(me) + 1},
                {"state": "running", "host": host, "pid": 2 ** 22 + 1}]
        for r, rec in zip(s.runs, recs):
            io.write_json(s.record_dir / f"{r.id}.json", rec)
        assert [sweep.state_of(s, r) for r in s.runs] == ["running", "interrupted",
                                                          "interrupted"]
        launch, running = sweep.todo(s)
        assert [r.id for r in running] == [s.runs[0].id]
        assert [r.id for r in launch] == [r.id for r in s.runs[1:]]
        code, out, err = _main(capsys, "run", str(path), "--dry-run")
        assert code == 0 and f"pid {live.pid}" in err
        assert len(out.strip().splitlines()) == 2 and "--seed 0" not in out
    finally:
        live.kill()
        live.wait()


def test_second_run_on_a_locked_sweep_folder_refused(tmp_path, capsys):
    path = _write(tmp_path, HEAD + "[base]\nepochs = 1\n")
    s = sweep.load(path)
    with sweep_records.SweepLock(s.record_dir):
        code, _, err = _main(capsys, "run", str(path))
        _one_line_error(code, err)
        assert f"pid {os.getpid()}" in err and "status works" in err
        assert not list(s.record_dir.glob("*.log"))
        code, out, _ = _main(capsys, "status", str(path))
        assert code == 0 and "pending 1" in out
    with sweep_records.SweepLock(s.record_dir):  # released: taken again
        pass


# ---------------------------------------------------------------------- end to end


def _env() -> dict:
    return worker_env()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pbscale.sweep", *args], capture_output=True,
                          text=True, env=_env(), timeout=900)


def test_run_listed_twice_with_a_default_spelled_out_runs_once(tmp_path):
    text = ('[sweep]\ncommand = "regress"\nout = "o"\n[base]\nepochs = 1\nn = 2\n'
            '[[grid]]\nseed = 0\n'
            '[[grid]]\nseed = "0"\nlr = 0.1\nmethod = "loorf"\nlam = 0\n')
    path = _write(tmp_path, text)
    proc = _cli("run", str(path), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert "running 1 " in proc.stderr
    assert len(re.findall(r"started +\w{12}", proc.stderr)) == 1
    assert len(re.findall(r"finished +\w{12}.*\[1/1\]", proc.stderr)) == 1
    out = tmp_path / "o"
    folders = [p for p in out.iterdir() if (p / "summary.json").exists()]
    assert len(folders) == 1
    s = sweep.load(path)
    assert len(s.runs) == 1 and len(list(s.record_dir.glob("*.json"))) == 1
    dry = _cli("run", str(path), "--dry-run")
    assert dry.returncode == 0 and dry.stdout == "" and "nothing to do" in dry.stderr
    status = _cli("status", str(path), "-v")
    assert f"folder: {folders[0]}" in status.stdout


FOUR = """
[sweep]
command = "regress"
out = "o"
[base]
epochs = 6
n = 2
[[grid]]
method = ["loorf", "arms"]
seed = [0, 1]
"""


def _starts(log: Path) -> int:
    return sum(" start: " in line for line in log.read_text().splitlines()) if log.exists() \
        else 0


def test_sigkill_of_the_sweep_leaves_no_orphan_and_rerun_finishes_the_rest(tmp_path):
    path = _write(tmp_path, FOUR)
    s = sweep.load(path)
    out = s.out
    proc = subprocess.Popen([sys.executable, "-m", "pbscale.sweep", "run", str(path), "--jobs",
                             "2"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def ready() -> bool:
        folders = sweep.folder_index(out)
        done = [f for f in folders.values() if (f / "summary.json").exists()]
        mid = [f for f in folders.values() if (f / "checkpoint.pt").exists()
               and not (f / "summary.json").exists()]
        return bool(done) and bool(mid)

    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before a run was half done"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    recs = {r.id: sweep.read_record(s, r) or {} for r in s.runs}
    children = [(rec["pid"], rec.get("pid_start")) for rec in recs.values()
                if rec.get("state") == "running"]
    assert children, "no child was running when the sweep was killed"
    deadline = time.time() + 120  # the children checkpoint and exit on their SIGTERM
    while time.time() < deadline and any(sweep_records.alive(*c) for c in children):
        time.sleep(0.1)
    assert not any(sweep_records.alive(*c) for c in children), "orphan children"
    states = {r.id: sweep.state_of(s, r) for r in s.runs}
    assert "running" not in states.values()
    finished = {i for i, st in states.items() if st == "finished"}
    assert finished and len(finished) < 4
    starts = {r.id: _starts(s.record_dir / f"{r.id}.log") for r in s.runs}

    rerun = _cli("run", str(path), "--jobs", "2")
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(finished)} of 4 runs already finished; running {4 - len(finished)}" in \
        rerun.stderr
    assert all(sweep.state_of(s, r) == "finished" for r in s.runs)
    after = {r.id: _starts(s.record_dir / f"{r.id}.log") for r in s.runs}
    assert after == {i: starts[i] + (i not in finished) for i in starts}
    summaries = sorted(out.glob("*/summary.json"))
    assert len(summaries) == 4
    for f in summaries:  # each run trained its epochs once: no double run in one folder
        rows = io.read_csv(f.parent / "history.csv")
        assert [r["epoch"] for r in rows] == list(range(7))
        assert json.loads(f.read_text())


def test_ray_interrupt_cancels_tasks_and_says_so(tmp_path, monkeypatch):
    """SIGINT during a Ray sweep cancels every pending task (a stand-in ``ray`` module: the
    first task ends, then Ctrl-C arrives); the tasks cancelled before they started stay
    pending and :class:`Interrupted` carries the finished one's code."""
    from pbscale.sweep import engines as sweep_engines

    s = sweep.load(_write(tmp_path, HEAD + "[[grid]]\nseed = [0, 1, 2]\n"))
    cancelled: list[int] = []

    class Ref:
        def __init__(self, job):
            self.job = job

    class FakeRay:
        calls = 0

        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def remote(**kw):
            return lambda fn: type("T", (), {"remote": staticmethod(lambda cwd, sw, job:
                                                                     Ref(job))})

        @staticmethod
        def wait(refs, num_returns=1, timeout=None):
            FakeRay.calls += 1
            if FakeRay.calls == 2:
                os.kill(os.getpid(), signal.SIGINT)
            if cancelled:
                return refs, []
            return ([refs[0]], refs[1:]) if FakeRay.calls == 1 else ([], refs)

        @staticmethod
        def cancel(ref):
            cancelled.append(ref.job.full["seed"])

        @staticmethod
        def get(ref):
            if ref.job.full["seed"] in cancelled:
                raise RuntimeError("TaskCancelledError")
            return 0

    monkeypatch.setitem(sys.modules, "ray", FakeRay)

    def found(signum, frame):  # the handler run_ray must put back (not assumed: set here)
        raise AssertionError("SIGINT reached the handler run_ray should have replaced")

    before = signal.signal(signal.SIGINT, found)
    try:
        with pytest.raises(sweep_engines.Interrupted) as exc:
            sweep.run_ray(s, list(s.runs), 2, None)
        assert signal.getsignal(signal.SIGINT) is found
    finally:
        signal.signal(signal.SIGINT, before)  # what the test found (ignored when started so)
    assert exc.value.codes == {s.runs[0].id: 0}
    assert cancelled == [1, 2]
