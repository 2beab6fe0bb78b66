"""pbscale.prune as a user meets it: flags the method does not read are warned about and
recorded, --lam-target steers the L0 strength (rule by hand, exact resume, folder names of
runs without it unchanged), --quiet keeps the one-line result, a rerun says it had finished,
--drop-checkpoint leaves a finished run that still reads as finished, config.json records which
code ran (not hashed), and the inner per-batch bar clears itself."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from analysis.scale.pareto_rows import find_runs
from pbexact.errors import RunInterrupted
from pbexact.provenance import code_provenance, version_text
from pbscale import prune as P
from pbscale import sweep
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.pruning.lam_control import CHECKS, STEP, foreseen, next_lam
from pbscale.runs import loop as loopmod
from pbscale.runs.io import read_csv
from pbscale.sweep.records import finished_folders

TINY = ["--synthetic", "48", "--epochs", "2", "--max-batches", "2", "--batch-size", "8",
        "--val-size", "16", "--n", "2"]


def tiny_cfg(**kw) -> pconfig.PruneConfig:
    base = dict(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8, n=2,
                val_size=16)
    base.update(kw)
    return pconfig.PruneConfig(**base)


def _config(out: Path) -> dict:
    (folder,) = out.iterdir()
    return json.loads((folder / "config.json").read_text())


def test_flags_the_method_does_not_use_are_warned_and_recorded(tmp_path, capsys):
    """--target (read by MP/GMP/edge-popup) and --n (sampling methods) given to CP: one
    warning line naming both, with the hint to --lam-target, even under --quiet; config.json
    lists them under "ignored". A default value given explicitly counts as given."""
    out = tmp_path / "a"
    code = P.main([*TINY, "--method", "cp", "--target", "0.1", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, err
    assert "--target" in warnings[0] and "--n" in warnings[0] and "--lam-target" in warnings[0]
    assert _config(out)["info"]["ignored"] == ["n", "target"]


def test_next_lam_and_foreseen_by_hand():
    lam, t = 1e-3, 0.2
    assert next_lam(lam, 0.21, t) == pytest.approx(1.05e-3)  # too many weights: raise by m / t
    assert next_lam(lam, 0.19, t) == pytest.approx(0.95e-3)  # too few: lower
    assert next_lam(lam, 1.0, t) == pytest.approx(lam * STEP)  # at most STEP per check
    assert next_lam(lam, 0.0, t) == pytest.approx(lam / STEP)
    assert foreseen(0.3, None) == 0.3 and foreseen(0.3, 0.0) == 0.3  # no trend yet
    assert foreseen(0.0, 0.5) == 0.0
    assert foreseen(0.3, 0.3) == 0.3  # flat: stays
    assert foreseen(0.25, 0.3) == pytest.approx(0.25 * (0.25 / 0.3) ** CHECKS)  # an epoch on


def test_lam_target_off_keeps_folder_names_and_bad_use_is_refused():
    cfg = tiny_cfg(method="cp")
    assert "lam_target" not in cfg.hashed()  # runs without it keep their folders' names
    assert tiny_cfg(method="cp", lam_target=0.2).hashed()["lam_target"] == 0.2
    for kw, match in ((dict(method="gmp", mode="joint"), "GMP has none to steer"),
                      (dict(method="edgepopup"), "use --target"),
                      (dict(method="cp", lam=0.0), "give --lam > 0"),
                      (dict(method="cp", lam_target=1.5), r"in \(0, 1\]")):
        kw.setdefault("lam_target", 0.2)
        with pytest.raises(pconfig.PBInputError, match=match):
            tiny_cfg(**kw).resolved().validate()


def test_lam_target_steers_lam_and_resumes_exactly(tmp_path):
    """CP with --lam-target: the "lam" column starts at --lam and moves; a run stopped by
    SIGTERM mid-epoch and at an epoch's start resumes to the same
    metrics, lam column included (lam is checkpointed with the method)."""
    cfg = tiny_cfg(method="cp", epochs=4, lam=1e-3, lam_target=0.3)
    a = prun.run(cfg, tmp_path / "a", quiet=True)
    rows = read_csv(Path(a["folder"]) / "metrics.csv")
    lams = [r["lam"] for r in rows]
    assert lams[0] == 1e-3  # row 0: the starting --lam
    assert len(set(lams)) > 2  # it moved, within epochs (checks every step of 2)
    out = tmp_path / "b"
    for stop_at in ((1, 1), (3, 0)):
        def hook(epoch, i, stop_at=stop_at):
            if (epoch, i) == stop_at:
                os.kill(os.getpid(), signal.SIGTERM)

        with pytest.raises(RunInterrupted):
            prun.run(cfg, out, quiet=True, step_hook=hook)
    b = prun.run(cfg, out, quiet=True)

    def same(rs: list[dict]) -> list[dict]:  # timings differ, NaN (row 0's loss) != NaN
        return [{k: None if v != v else v for k, v in r.items()
                 if k not in ("train_seconds", "val_seconds")} for r in rs]

    assert same(rows) == same(read_csv(Path(b["folder"]) / "metrics.csv"))


def test_quiet_result_rerun_note_drop_checkpoint_and_code_record(tmp_path, capsys,
                                                                 monkeypatch):
    """--quiet prints the one-line result and no bar; flags the method reads give no warning;
    a rerun says it had finished and prints the result again; --drop-checkpoint leaves no
    checkpoint.pt, and the run still reads as finished (sweep status, analysis.pareto);
    config.json records the code (version, path, commit), not part of the folder's name."""
    out = tmp_path / "runs"
    monkeypatch.setenv("PBSCALE_RUN_INFO", json.dumps({"sweep": "s", "sweep_id": "abc"}))
    bars = _spy_bars(monkeypatch)
    args = [*TINY[:-2], "--method", "cp", "--out", str(out), "--drop-checkpoint"]
    assert P.main([*args, "--quiet"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("test_acc ") and len(cap.out.splitlines()) == 1
    assert "warning" not in cap.err and "ignored" not in _config(out)["info"]
    assert [(kw["leave"], kw["disable"]) for kw in bars if kw.get("unit") == "batch"] == [
        (False, True)] * 2  # two epochs, no bar
    (folder,) = out.iterdir()
    assert not (folder / "checkpoint.pt").exists()
    assert {"summary.json", "masks.pt", "pruned.pt"} <= {p.name for p in folder.iterdir()}
    assert find_runs([out]) == [folder]
    s = sweep.load(_sweep_file(tmp_path, out))
    assert finished_folders(s) == {"abc": folder}
    code = json.loads((folder / "config.json").read_text())["info"]["code"]
    assert code == {**code_provenance(), "dirty": code["dirty"]}  # what ran, read again
    assert P.main(args) == 0  # a rerun: the note, then the result with the per-layer counts
    cap = capsys.readouterr()
    assert f"{folder.name}: already finished" in cap.err
    assert cap.out.startswith("test_acc ") and "fc1" in cap.out


def _sweep_file(tmp_path: Path, out: Path) -> Path:
    p = tmp_path / "s.toml"
    p.write_text(f'[sweep]\ncommand = "prune"\nout = "{out}"\n[[grid]]\nseed = [0]\n')
    return p


def test_version_names_version_path_and_commit(capsys):
    assert P.main(["--version"]) == 0
    with pytest.raises(SystemExit) as exc:  # sweep's parser exits as argparse does
        sweep.main(["--version"])
    assert exc.value.code == 0
    c = code_provenance()
    for line in capsys.readouterr().out.splitlines():
        assert f"{c['version']} from {c['path']}, " in line
        assert (c["commit"][:12] in line) if c["commit"] else (c["git"] in line)
    assert version_text("x").startswith("x ")


def _spy_bars(monkeypatch) -> list[dict]:
    """The keyword arguments of every tqdm bar the run loop makes from now on."""
    seen: list[dict] = []
    real = loopmod.tqdm

    def spy(*args, **kw):
        seen.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(loopmod, "tqdm", spy)
    return seen


def test_inner_batch_bar_clears_itself(tmp_path, monkeypatch, capsys):
    """With progress, the loop's per-batch bar has leave=False (it clears itself) and
    disable=None (tqdm shows it on a terminal only), over the epoch's batches."""
    bars = _spy_bars(monkeypatch)
    prun.run(tiny_cfg(method="cp", epochs=1), tmp_path / "a")
    assert [(kw["leave"], kw["disable"], kw["total"]) for kw in bars
            if kw.get("unit") == "batch"] == [(False, None, 2)]


def test_pareto_commands_name_the_data_folder(tmp_path):
    """runs.md's commands (analysis.scale.pareto_rows.command) end with the --data-dir the run
    read."""
    from analysis.scale.pareto_rows import command, data_dir_of

    task = pconfig.PruneConfig(method="gmp", mode="joint", target=0.05).resolved().hashed()
    assert command(task, "../shared/data/mnist").endswith(
        "--method gmp --target 0.05 --data-dir ../shared/data/mnist")
    assert "--data-dir" not in command(task)
    (tmp_path / "config.json").write_text(json.dumps({"info": {"data_dir": "d/mnist"}}))
    assert data_dir_of(tmp_path) == "d/mnist"
    assert data_dir_of(tmp_path / "none") == ""


def test_regress_warns_on_settings_the_method_does_not_use(tmp_path, capsys):
    from pbscale import regress

    # the warning comes before anything runs; a bad --device then stops it cheaply
    assert regress.main(["--method", "cp", "--n", "3", "--epochs", "1", "--device", "nope",
                         "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "warning: CP does not use --n: ignored" and err[1].startswith("error:")
    assert regress.main(["--method", "arms", "--n", "3", "--device", "nope"]) == 2
    assert "warning" not in capsys.readouterr().err


def test_a_quiet_rerun_of_a_finished_run_says_so(tmp_path, capsys):
    """--quiet on a finished run prints that it had finished (stderr) and its result line."""
    args = [*TINY, "--method", "cp", "--out", str(tmp_path / "runs"), "--quiet"]
    assert P.main(args) == 0
    first = capsys.readouterr()
    assert "already finished" not in first.err
    assert P.main(args) == 0
    again = capsys.readouterr()
    (folder,) = (tmp_path / "runs").iterdir()
    assert f"{folder.name}: already finished" in again.err, again.err
    assert again.out == first.out and again.out.startswith("test_acc "), again.out


def test_a_run_whose_masks_end_at_an_extreme_says_so_last(tmp_path, capsys):
    """A run with an L0 strength that ends with every masked weight off says so in its last
    line (the command, quiet or not, a group member, the Python API without progress), with
    the fix; one that ends with none off at lam > 0 too; a method without an L0 strength, or a
    run in between, says nothing."""
    from pbscale import prune_model

    args = [*TINY[:-2], "--method", "cp", "--lam", "30"]
    for i, extra in enumerate((["--quiet"], [], ["--seeds", "0,1", "--quiet"])):
        assert P.main([*args, *extra, "--out", str(tmp_path / f"runs{i}")]) == 0
        cap = capsys.readouterr()
        err = cap.err.strip().splitlines()
        assert "every masked weight is off (0 of 265,200 remain) at lam 30" in err[-1], err
        assert "lower --lam (e.g. 3)" in err[-1], err
    capsys.readouterr()
    prune_model("lenet", method="cp", lam=30.0, synthetic=48, epochs=2, max_batches=2,
                batch_size=8, val_size=16, out=tmp_path / "api", progress=False)
    assert "every masked weight is off" in capsys.readouterr().err
    from pbscale.pruning.run import extremes_line

    cfg = tiny_cfg(method="arms", lam=1e-4).resolved()
    none_off = {"final_remaining": 1.0, "masked": 100}
    assert "no masked weight was pruned (all of 100 remain) at lam 0.0001" in \
        extremes_line(none_off, cfg)
    assert extremes_line({**none_off, "final_remaining": 0.4}, cfg) is None
    assert extremes_line(none_off, tiny_cfg(method="arms", lam=0.0).resolved()) is None
    assert extremes_line({**none_off, "final_remaining": 0.0},
                         tiny_cfg(method="gmp", mode="joint").resolved()) is None


def test_a_short_joint_run_says_what_its_masks_get(tmp_path, capsys):
    """A 3-epoch joint run of 10 steps an epoch: ARMS warms up for a whole epoch and freezes in
    the last, so its masks train for 10 of 30 steps, CP's for 20; each run says so in one line
    at its start (under --quiet too, a group once). A 10-epoch joint run or a supermask run
    rounds to its shares and says nothing."""
    from pbscale.pruning.run import budget_note
    from pbscale.runs.contracts import LoopConfig

    args = ["--synthetic", "96", "--val-size", "16", "--batch-size", "8", "--max-batches",
            "10", "--epochs", "3", "--mode", "joint", "--quiet"]
    want = {"arms": "ARMS trains the weights dense for 1 epoch (its 10% warm-up, rounded up to "
                    "a whole epoch) and freezes its masks for the last 1 epoch (20%, rounded), "
                    "so its masks train for 10 of 30 steps (33% of the run, not 70%)",
            "cp": "CP freezes its masks for the last 1 epoch (20%, rounded), so its masks train "
                  "for 20 of 30 steps (67% of the run, not 80%)"}
    for method, text in want.items():
        for extra in ([], ["--seeds", "0,1"]):
            out = tmp_path / f"{method}{len(extra)}"
            assert P.main([*args, "--method", method, "--n", "2", *extra, "--out", str(out)]) == 0
            notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
            assert notes == [f"note: 3 epochs of 10 steps: {text}; more epochs come nearer "
                             "(docs/pruning.md)"], notes
    cfg = tiny_cfg(method="arms", mode="joint").resolved()
    assert budget_note(cfg, LoopConfig(epochs=10, seed=0, mask_warmup=0.1, freeze_masks=0.8),
                       10) is None
    assert budget_note(cfg, LoopConfig(epochs=3, seed=0), 10) is None  # supermask: no phases
    one = budget_note(cfg, LoopConfig(epochs=1, seed=0, mask_warmup=0.1, freeze_masks=0.8), 4)
    assert one == ("note: 1 epoch of 4 steps: ARMS has no whole epoch for its warm-up or its "
                   "frozen masks, so its masks train for 4 of 4 steps (100% of the run, not "
                   "70%); more epochs come nearer (docs/pruning.md)")
