"""The pbscale tools refuse what issue 33 found them doing wrong, each class in one line with exit
code 2 and nothing written outside ``--out``: run folders under ``--out`` that are symlinks to
elsewhere, runs that diverged without a non-finite training loss (every family that trains
weights, from the registry), run files that are FIFOs (a read would block forever), a sample
count whose masks cannot be held in memory, a bad ``$PBSCALE_RUN_INFO``, and a sweep whose
finished run was damaged afterwards (run, status and results agree that it is not finished).
Tiny synthetic runs: 48 images, two epochs of one batch."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from analysis.cli import run
from pbexact.errors import PBInputError
from pbscale import prune
from pbscale.methods import REGISTRY, MaskTrainer, MethodConfig
from pbscale.methods.samplers import SAMPLE_BYTES, check_sample_memory, free_memory
from pbscale.pruning.config import prune_methods
from pbscale.regression.group import MaskTrainerGroup
from pbscale.runs.records import env_info, run_folder
from pbscale.sweep import load, records

TINY = ["--synthetic", "48", "--epochs", "2", "--max-batches", "1", "--quiet",
        "--eval-masks", "2", "--eval-batches", "1"]


def _prune(argv: list[str], capsys) -> tuple[int, str]:
    code = run(prune.main, argv)
    return code, capsys.readouterr().err


def _one_line(err: str) -> str:
    """The refusal: the one line of stderr besides the warnings on flags the method ignores and
    the note on a short joint run's budget."""
    lines = [ln for ln in err.splitlines()
             if ln.strip() and not ln.startswith(("warning: ", "note: "))]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


JOINT = [m for m in prune_methods() if "prune-joint" in REGISTRY[m].caps.commands]


@pytest.mark.parametrize("method", JOINT)
def test_a_diverged_joint_run_stops_naming_the_weight_rate(method, tmp_path, capsys):
    """--lr 1e6 sends the weights so high that the evaluation's loss is NaN (hard-concrete and
    CP used to finish with NaN losses in summary.json, ST-theta and the MC methods to crash in
    choose_mask): exit 2, no summary, the weight learning rate named."""
    code, err = _prune(["--mode", "joint", "--method", method, "--lr", "1e6",
                        "--out", str(tmp_path), *TINY], capsys)
    line = _one_line(err)
    assert code == 2, err
    assert "diverged" in line and line.endswith("lower --lr"), line
    assert not list(tmp_path.glob("*/summary.json"))


@pytest.mark.parametrize("method", ["cp"])
def test_a_huge_l0_strength_is_no_divergence(method, tmp_path, capsys):
    """--lam 1e30 empties the mask; that is a finite result, not a divergence blamed on a
    learning rate."""
    code, err = _prune(["--method", method, "--lam", "1e30", "--out", str(tmp_path), *TINY],
                       capsys)
    assert code == 0, err
    (summary,) = tmp_path.glob("*/summary.json")
    values = json.loads(summary.read_text())
    assert all(math.isfinite(v) for v in values.values() if isinstance(v, float))
    assert values["final_remaining"] == 0.0


def test_a_run_folder_symlinked_out_of_out_is_refused(tmp_path, capsys):
    argv = ["--epochs", "1", "--max-batches", "1", "--synthetic", "48", "--quiet"]
    assert _prune([*argv, "--out", str(tmp_path / "a")], capsys)[0] == 0
    (folder,) = (tmp_path / "a").iterdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / folder.name).symlink_to(elsewhere)
    code, err = _prune([*argv, "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and "outside" in _one_line(err), err
    assert not list(elsewhere.iterdir())


def test_every_run_folder_name_is_checked(tmp_path):
    """run_folder names the folders of prune and regress (runs, members and groups)
    alike: a symlink out of --out, a dangling one, an empty or too long --out are refused."""
    (tmp_path / "out").mkdir()
    name = run_folder(tmp_path / "out", "t", {}).name
    (tmp_path / "out" / name).symlink_to(tmp_path / "gone")  # dangling
    for out in (tmp_path / "out", str(tmp_path / "out")):
        with pytest.raises(PBInputError, match="outside"):
            run_folder(out, "t", {})
    with pytest.raises(PBInputError, match="is empty"):
        run_folder("", "t", {})
    with pytest.raises(PBInputError, match="at most 255"):
        run_folder("y" * 256, "t", {})


def test_a_sweep_record_folder_symlinked_elsewhere_is_refused(tmp_path, capsys):
    sweep = tmp_path / "s.toml"
    sweep.write_text('[sweep]\ncommand = "prune"\nout = "runs"\n[base]\nseed = [0, 1]\n')
    (tmp_path / "runs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs" / "sweep-s").symlink_to(tmp_path / "elsewhere")
    from pbscale.sweep import main as sweep_main
    assert run(sweep_main, ["status", str(sweep)]) == 2
    assert "outside" in _one_line(capsys.readouterr().err)


def test_a_checkpoint_that_is_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    argv = ["--epochs", "1", "--max-batches", "1", "--synthetic", "48", "--quiet",
            "--out", str(tmp_path)]
    assert _prune(argv, capsys)[0] == 0
    (folder,) = tmp_path.iterdir()
    (folder / "summary.json").unlink()
    (folder / "checkpoint.pt").unlink()
    os.mkfifo(folder / "checkpoint.pt")
    code, err = _prune(argv, capsys)
    assert code == 2 and "not a regular file" in _one_line(err), err
    (folder / "checkpoint.pt").unlink()
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")  # every run file, not only the checkpoint
    code, err = _prune(argv, capsys)
    assert code == 2 and "not a regular file" in _one_line(err), err


def test_samples_beyond_memory_are_refused_naming_the_cost(tmp_path, capsys):
    free = free_memory("cpu")
    d = 1000
    fits = (free // 2) // (16 * d)
    check_sample_memory(fits, d, fits, 12 * d, joint=True)
    with pytest.raises(PBInputError, match=r"lower --n to at most [\d,]+$") as err:
        check_sample_memory(2 * free // (12 * d), d, 1, 12 * d, joint=True)
    assert "of masks, activations, indices and losses" in str(err.value)
    code, err = _prune(["--method", "arms", "--mode", "joint", "--synthetic", "48",
                        "--n", str(10**7), "--out", str(tmp_path)], capsys)
    line = _one_line(err)
    assert code == 2 and "of masks" in line and "lower --n" in line, line
    assert not list(tmp_path.iterdir())
    # a regress run and a regression group build their trainers with the same check
    # (d = 8,050): a chunk of all 10^7 samples cannot be held
    huge = MethodConfig("loorf", n=10**7, chunk=10**7, lr=0.1, seed=0)
    with pytest.raises(PBInputError, match="lower --n"):
        MaskTrainer(huge, 8050, 100)
    with pytest.raises(PBInputError, match="lower --n"):
        MaskTrainerGroup.flat([huge, MethodConfig("loorf", n=10**7, chunk=10**7, lr=0.1,
                                                  seed=1)], 8050, 100)


def test_the_sample_memory_check_counts_what_each_path_holds(monkeypatch):
    """A supermask step streams its chunks (the CPU's fused step holds two (k, d) mask buffers,
    ARMS included; a GPU's samplers one chunk and O(k d) scratch), so n samples whose n x d
    float32 masks exceed the free memory are accepted while the chunks fit; a joint step keeps
    all n samples' working sets for the backward and is refused, naming the largest n that
    fits. No memory is allocated: the free memory is injected."""
    import pbscale.methods.samplers as samplers
    d, chunk = 10_000, 8
    free = 64 * 2**20
    monkeypatch.setattr(samplers, "free_memory", lambda device="cpu": free)
    n = 4 * free // (4 * d)  # n x d float32: four times the free memory
    arms = MethodConfig("arms", n=n, chunk=chunk, seed=0)
    trainer = MaskTrainer(arms, d, 10)  # supermask on the CPU: accepted
    assert trainer.chunk == chunk and trainer.stream is not None
    with pytest.raises(PBInputError) as err:
        MaskTrainer(arms, d, 10, joint=True)
    line = str(err.value)
    largest = int(line.rsplit(" ", 1)[1].replace(",", ""))
    assert "\n" not in line and line.endswith(f"lower --n to at most {largest:,}"), line
    # the default working set, 16 d bytes per sample, and the step's indices and losses
    assert largest == free // (16 * d + SAMPLE_BYTES)
    MaskTrainer(MethodConfig("arms", n=largest, chunk=chunk, seed=0), d, 10, joint=True)
    # a joint pruning run tells its trainer (Plan.weight_optimizer set): refused likewise
    from pbscale.methods import Plan, get_family
    from pbscale.regression.group import FlatLayout
    weights = torch.nn.Parameter(torch.zeros(1))
    plan = Plan(weight_optimizer=torch.optim.SGD([weights], lr=0.1))
    with pytest.raises(PBInputError, match="lower --n"):
        get_family("arms").make(arms, FlatLayout(d, torch.device("cpu")), plan)
    get_family("arms").make(arms, FlatLayout(d, torch.device("cpu")), Plan())
    # a GPU supermask step streams too (stick-breaking ARMS); a joint one keeps every chunk
    check_sample_memory(n, d, chunk, 16 * d, "cuda")
    with pytest.raises(PBInputError, match="on cuda; lower --n"):
        check_sample_memory(n, d, chunk, 16 * d, "cuda", joint=True)
    # a chunk too large to hold is refused on any path, at the largest n that fits
    with pytest.raises(PBInputError, match=f"at most {free // (20 * d + SAMPLE_BYTES):,}$"):
        check_sample_memory(n, d, n, 16 * d)


def test_per_sample_arrays_and_torchrun_shares_are_counted(monkeypatch, tmp_path, capsys):
    """Issue 50: the fused step's O(n) index arrays and losses (SAMPLE_BYTES a sample) are
    counted at any n, so --method arms --n 10^9 in supermask mode (whose chunks stream) is
    refused before law_rule would allocate 16 GB of int64 indices, naming the largest n that
    fits; under torchrun a joint step keeps only ceil(n / world) samples' working sets on each
    rank, so the check counts that share (it refused n that two ranks hold). No memory is
    allocated: the free memory is injected."""
    import pbscale.methods.samplers as samplers
    from pbscale.methods import Plan, get_family
    from pbscale.regression.group import FlatLayout

    d, chunk, free = 1000, 8, 64 * 2**20
    monkeypatch.setattr(samplers, "free_memory", lambda device="cpu": free)
    huge = MethodConfig("arms", n=10**9, chunk=chunk, seed=0)
    with pytest.raises(PBInputError) as err:
        MaskTrainer(huge, d, 10)
    line = str(err.value)
    largest = int(line.rsplit(" ", 1)[1].replace(",", ""))
    assert largest == (free - chunk * 20 * d) // SAMPLE_BYTES, line
    MaskTrainer(MethodConfig("arms", n=largest, chunk=chunk, seed=0), d, 10)
    with pytest.raises(PBInputError):
        MaskTrainer(MethodConfig("arms", n=largest + 1, chunk=chunk, seed=0), d, 10)
    # joint: n whose working sets fit on two ranks but not on one
    per = 16 * d
    n = int(1.5 * free // (per + SAMPLE_BYTES))
    with pytest.raises(PBInputError, match="lower --n"):
        check_sample_memory(n, d, chunk, per, joint=True)
    check_sample_memory(n, d, chunk, per, joint=True, world=2)
    weights = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([weights], lr=0.1)
    cfg = MethodConfig("arms", n=n, chunk=chunk, seed=0)
    layout = FlatLayout(d, torch.device("cpu"))
    with pytest.raises(PBInputError, match="lower --n"):
        get_family("arms").make(cfg, layout, Plan(weight_optimizer=opt))
    get_family("arms").make(cfg, layout, Plan(weight_optimizer=opt, world=2))
    # the command line, with the machine's real free memory: one line, nothing written
    monkeypatch.undo()
    code, err = _prune(["--method", "arms", "--mode", "supermask", "--synthetic", "48",
                        "--n", str(10**12), "--out", str(tmp_path)], capsys)
    assert code == 2 and "indices and losses" in _one_line(err), err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("text", ["{", "[1, 2]", '"x"', '{"sweep_ids": 3}'])
def test_a_bad_run_info_is_one_line(text, monkeypatch):
    monkeypatch.setenv("PBSCALE_RUN_INFO", text)
    with pytest.raises(PBInputError, match="PBSCALE_RUN_INFO"):
        env_info()


def test_a_damaged_finished_run_is_not_finished_anywhere(tmp_path):
    """A record says finished, but the run folder's summary.json was damaged afterwards: run
    launches it again (it resumes, or fails naming the file), status does not count it
    finished, results skips it as damaged. With its summary intact it is finished in all
    three."""
    path = tmp_path / "s.toml"
    path.write_text('[sweep]\ncommand = "prune"\nout = "runs"\n[base]\nseed = 0\n')
    sweep = load(path)
    (r,) = sweep.runs
    sweep.record_dir.mkdir(parents=True)
    records.record_path(sweep, r).write_text(json.dumps({"state": "finished"}))
    folder = sweep.out / "lenet-x"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"info": {"sweep_id": r.id}}))
    (folder / "summary.json").write_text('{"final_test_acc": 0.9}')
    assert records.status(sweep)["finished"] == [r]
    assert records.todo(sweep) == ([], [])
    assert len(records.results(sweep)) == 1
    (folder / "summary.json").write_text('{"final_test')  # truncated
    damaged: list[Path] = []
    assert records.state_of(sweep, r) == "pending"
    assert records.todo(sweep) == ([r], [])
    assert records.results(sweep, damaged) == [] and damaged == [folder / "summary.json"]
    (folder / "summary.json").unlink()
    (folder / "config.json").write_text("not json")
    assert records.status(sweep)["finished"] == [] and records.todo(sweep) == ([r], [])


@pytest.mark.parametrize("key,value,words", [
    ("final_test_acc", "NaN", "final_test_acc is 'NaN', not a number"),
    ("final_remaining", -3, "final_remaining is -3, not a fraction in [0, 1]"),
    ("final_remaining_fc1", None, "final_remaining_fc1 is None, not a number"),
    ("seconds_per_epoch", -1, "seconds_per_epoch is -1, a negative time"),
])
def test_a_summary_with_values_of_the_wrong_kind_is_refused_on_rerun(tmp_path, capsys, key,
                                                                      value, words):
    """Issue 50: a finished run's summary.json edited to hold a string, null or a fraction out
    of [0, 1], then the same command: one line naming the file and the value (a3f3b10 raised
    ValueError: Unknown format code 'f' formatting the string)."""
    argv = ["--synthetic", "48", "--epochs", "1", "--max-batches", "1", "--batch-size", "8",
            "--quiet", "--out", str(tmp_path)]
    code, err = _prune(argv, capsys)
    assert code == 0, err
    (folder,) = tmp_path.glob("lenet-*")
    summary = json.loads((folder / "summary.json").read_text())
    summary[key] = value
    (folder / "summary.json").write_text(json.dumps(summary))
    code, err = _prune(argv, capsys)
    line = _one_line(err)
    assert code == 2 and "summary.json" in line and words in line, line
