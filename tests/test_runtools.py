"""The run tools (pbscale.prune, pbscale.regress) as a careless user meets
them: damaged finished runs, bad folders, a full disk, damaged checkpoints, huge seed lists, bad
flag values, diverging runs, cut data files, reruns on other data or process counts, Ctrl-C,
reusing a pruned network in plain PyTorch, and config.json's record of unused settings."""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_prune_data import MNIST_DIR

from pbexact import cli
from pbexact.errors import PBInputError, RunInterrupted
from pbexact.parametrizations import PARAMETRIZATIONS, Direct, get_parametrization
from pbscale import prune as P
from pbscale import regress
from pbscale.forward import routes
from pbscale.methods import METHODS, OPTIMIZERS, MaskTrainer, MethodConfig
from pbscale.nets import data, network
from pbscale.nets.models import INITS, MODELS
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.pruning import task as ptask
from pbscale.regression import run as rrun
from pbscale.regression.group import MAX_RUNS, GroupRun
from pbscale.regression.problem import make_problem
from pbscale.runs import io
from pbscale.runs.loop import PROVENANCE, config_hash
from pbscale.runs.loop import run as loop_run

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--synthetic", "48", "--epochs", "2", "--max-batches", "2", "--batch-size", "8",
        "--val-size", "16", "--n", "2", "--quiet"]


def tiny_cfg(**kw) -> pconfig.PruneConfig:
    base = dict(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8, n=2,
                val_size=16, gmp_every=1)
    base.update(kw)
    return pconfig.PruneConfig(**base)


def tiny_problem():
    return make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# ------------------------------------------------------------- finished runs with a bad summary


@pytest.mark.parametrize("damage", ["[]", "{}", '{"final_test_acc": 0.5}'])
def test_prune_refuses_a_finished_run_whose_summary_is_damaged(tmp_path, capsys, damage):
    argv = [*TINY[:10], "--quiet", "--out", str(tmp_path)]  # CP reads no --n: no warning
    assert P.main(argv) == 0
    capsys.readouterr()
    (summary,) = tmp_path.glob("*/summary.json")
    summary.write_text(damage)
    assert P.main(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(summary) in line and "delete the run folder" in line


def test_regress_and_prune_share_one_summary_check(tmp_path):
    path = tmp_path / "summary.json"
    for text, keys, why in [("[]", (), "not a JSON object"), ("{}", (), "empty"),
                            ("{}", ("a",), "no 'a' entry"), ('{"a": 1}', ("a", "b"), "'b'")]:
        path.write_text(text)
        with pytest.raises(PBInputError, match=re.escape(why)):
            io.read_summary(path, keys)
    path.write_text('{"a": 1, "b": 2}')
    assert io.read_summary(path, ("a", "b")) == {"a": 1, "b": 2}


# ------------------------------------------------------------------------------ bad folders


def test_download_into_a_folder_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    argv = ["--data-dir", str(blocker / "mnist"), "--download", "--out", str(tmp_path / "o")]
    assert P.main(argv) == 2
    assert "lies under the file" in one_line_error(capsys.readouterr().err)
    # a folder without write permission (simulated: the tests may run as root)
    target = tmp_path / "ro"
    target.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == target
                        else real_access(p, mode))
    with pytest.raises(PBInputError, match="--data-dir .* is not writable"):
        data.download("mnist", target, url=(tmp_path / "nowhere").as_uri())


# ------------------------------------------------------------------------------- disk full


def _fail_fsync_of(name: str, after: int, monkeypatch) -> list[int]:
    """Make os.fsync raise ENOSPC for the ``after``-th and later writes of files called
    ``name`` (atomic writes fsync their temporary file before the rename)."""
    real, seen = os.fsync, [0]

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").split("/")[-1].startswith(f".{name}."):
            seen[0] += 1
            if seen[0] >= after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


@pytest.mark.parametrize("name,after", [("checkpoint.pt", 2), ("metrics.csv", 2),
                                        ("summary.json", 1)])
def test_disk_full_is_one_line_and_the_last_checkpoint_resumes(tmp_path, capsys, monkeypatch,
                                                               name, after):
    if not Path("/proc/self/fd").exists():
        pytest.skip("needs /proc (Linux)")
    argv = [*TINY, "--epochs", "3", "--method", "arms", "--out", str(tmp_path / "cut")]
    whole = prun.run(tiny_cfg(epochs=3, method="arms"), tmp_path / "whole", quiet=True)
    capsys.readouterr()
    _fail_fsync_of(name, after, monkeypatch)  # the after-th write of the file fails
    assert P.main(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert name in line and "No space left on device" in line and "intact" in line
    (folder,) = (tmp_path / "cut").glob("lenet-*")
    assert not (folder / "summary.json").exists()
    assert not list(folder.glob(".*.tmp"))  # the failed temporary file is removed
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert state["epoch"] >= 1
    monkeypatch.undo()
    assert P.main(argv) == 0  # resumes from the intact checkpoint
    assert io.read_json(folder / "summary.json")["final_test_acc"] == whole["final_test_acc"]


# ------------------------------------------------------------------ damaged regress checkpoint


@pytest.mark.parametrize("damage", ["drop_key", "not_a_row", "drop_loop_column"])
def test_regress_checkpoint_with_incomplete_history_rows_is_refused(tmp_path, damage):
    cfg = MethodConfig(method="loorf", n=2, lr=0.1, seed=0)
    problem = tiny_problem()
    folder = rrun.train(cfg, epochs=2, out=tmp_path, device="cpu", progress=False,
                           problem=problem)
    ckpt = folder / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=True)
    rows = state["history"]
    if damage == "drop_key":
        rows[1] = {k: v for k, v in rows[1].items() if k != "val_loss"}
    elif damage == "not_a_row":
        rows[1] = [1.0, 2.0]
    else:
        rows = [{k: v for k, v in r.items() if k != "train_seconds"} for r in rows]
    state["history"] = rows
    io.save_checkpoint(ckpt, state)
    (folder / "summary.json").unlink()
    with pytest.raises(PBInputError, match="damaged checkpoint .*checkpoint.pt"):
        rrun.train(cfg, epochs=2, out=tmp_path, device="cpu", progress=False,
                      problem=problem)


# ------------------------------------------------------------------------- huge seed lists


def test_huge_seed_list_is_refused_up_front(tmp_path, capsys):
    t0 = time.perf_counter()
    assert _exit_code(regress.main, ["--seeds", "0-100000000", "--out", str(tmp_path)]) == 2
    assert time.perf_counter() - t0 < 5  # refused before the list is built
    line = one_line_error(capsys.readouterr().err)
    assert "100,000,001" in line and f"at most {MAX_RUNS:,} seeds" in line
    seeds = cli.seed_list_at_most(MAX_RUNS)
    assert seeds("0-3,7") == [0, 1, 2, 3, 7]
    assert len(seeds(f"0-{MAX_RUNS - 1}")) == MAX_RUNS
    with pytest.raises(argparse.ArgumentTypeError):
        seeds(f"0-{MAX_RUNS}")
    # seeds x learning rates beyond what a group holds
    half = MAX_RUNS // 2
    assert _exit_code(regress.main, ["--seeds", f"0-{half}", "--lr", "0.1,0.2,0.3",
                                     "--out", str(tmp_path)]) == 2
    assert "runs (seeds x learning rates)" in one_line_error(capsys.readouterr().err)
    assert not any(tmp_path.iterdir())


def _exit_code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


# --------------------------------------------------------------- every flag has a shared type


SHARED_TYPES = {cli.positive_int, cli.nonneg_int, cli.positive_float, cli.nonneg_float,
                cli.integer, cli.finite_float, cli.boolean, cli.seed_list, cli.positive_int_list,
                cli.thread_count, cli.out_folder,
                P.SYNTHETIC_COUNT,
                routes.argument, network.argument}
#: Flags whose values are free text by nature (paths, device names, name patterns, import
#: paths checked when the run starts).
FREE_TEXT = {"data_dir", "download_url", "out", "device", "data", "masked", "loss"}


@pytest.mark.parametrize("build", [P.build_parser, regress.build_parser])
def test_every_value_flag_has_a_shared_type_or_choices(build):
    for action in build()._actions:
        if not action.option_strings or action.nargs == 0 or action.dest in FREE_TEXT:
            continue
        kind = getattr(action.type, "kind", action.type)  # a comma list of a shared type
        assert kind in SHARED_TYPES or action.choices is not None, action.dest


@pytest.mark.parametrize("flag,value", [
    ("--seed", "-1"), ("--split-seed", "-1"), ("--n", "0"), ("--lam", "-1"), ("--lam", "nan"),
    ("--mask-lr", "0"), ("--mask-lr", "inf"), ("--lr", "-0.1"), ("--target", "0"),
    ("--epochs", "0"), ("--batch-size", "-8"), ("--prune-at", "-0.5"), ("--gmp-start", "nan"),
    ("--gmp-every", "0"), ("--chunk", "-1"), ("--max-batches", "-1"), ("--val-size", "-1"),
    ("--synthetic", "-5"), ("--eval-masks", "0"), ("--eval-batches", "0"), ("--threads", "0"),
    ("--model", "lenet5"), ("--method", "foo"), ("--mode", "both"), ("--param", "tanh"),
    ("--dataset", "svhn"), ("--mask-opt", "adam"), ("--init", "zeros"), ("--epochs", "1.5")])
def test_prune_bad_flag_values_exit_2_before_any_work(tmp_path, capsys, flag, value):
    out = tmp_path / "out"
    assert _exit_code(P.main, [*TINY, flag, value, "--out", str(out)]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert flag in line
    assert not out.exists()


def test_choices_come_from_the_registries():
    def choices(parser, dest):
        return list(next(a for a in parser._actions if a.dest == dest).choices)

    p = P.build_parser()
    model_help = next(a for a in p._actions if a.dest == "model").help
    assert model_help.startswith(", ".join(MODELS) + ", or your own network")
    assert choices(p, "method") == list(pconfig.PRUNE_METHODS)
    assert choices(p, "mode") == list(pconfig.MODES)
    assert choices(p, "param") == list(PARAMETRIZATIONS)
    assert choices(p, "dataset") == list(data.DATASETS)
    assert choices(p, "init") == [*INITS, "model"]
    assert choices(p, "mask_opt") == list(pconfig.MASK_OPTIMIZERS)
    r = regress.build_parser()
    assert choices(r, "method") == list(METHODS)
    assert choices(r, "param") == list(PARAMETRIZATIONS)
    assert choices(r, "optimizer") == list(OPTIMIZERS)
    assert "--init {" in P.build_parser().format_help().replace("\n", " ")


# --------------------------------------------------------------------------- diverging runs


@pytest.mark.parametrize("args,flag,what", [
    (["--mode", "joint", "--method", "dense", "--lr", "1e30"], "--lr", "weights"),
    (["--mode", "joint", "--method", "gmp", "--lr", "1e30"], "--lr", "weights"),
    (["--method", "arms", "--mask-lr", "1e30"], "--mask-lr", "mask logits")])
def test_a_diverging_run_stops_naming_the_step_and_flag(tmp_path, capsys, args, flag, what):
    given = TINY if "arms" in args else [*TINY[:10], "--quiet"]  # --n only where it is read
    assert P.main([*given, *args, "--out", str(tmp_path)]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert what in line and "NaN or inf" in line and re.search(r"(step|epoch) \d+", line)
    assert line.endswith(f"lower {flag}")
    assert "--optimizer" not in line
    assert not list(tmp_path.glob("*/summary.json"))


def test_a_non_finite_training_loss_names_the_step(tmp_path):
    """A step whose loss turns NaN (here: poisoned inputs from the second step on) stops the run
    at that step, not at the end of the epoch."""
    cfg, dev, d = prun.prepare(tiny_cfg(mode="joint", method="dense", epochs=2, max_batches=3))
    task, method, loop, wopt = prun.build(cfg, d, dev)
    clean = d.prepare

    def hook(epoch, i):
        if (epoch, i) == (0, 1):
            d.prepare = lambda x: clean(x) * math.nan

    with pytest.raises(PBInputError, match=r"NaN or inf (in|at) step 2 \(epoch 1, batch 2\)"
                                           r".*lower --lr$"):
        loop_run(task, method, loop, tmp_path, weight_optimizer=wopt, progress=False,
                 step_hook=hook)
    (folder,) = tmp_path.glob("lenet-*")
    assert not (folder / "summary.json").exists() and not (folder / "checkpoint.pt").exists()


def test_each_tool_names_its_own_learning_rate_flag():
    """The divergence message names the flag of the tool that ran: pbscale.prune's mask flags
    are --mask-lr / --mask-opt, pbscale.regress's --lr / --optimizer (one run or a group)."""
    from pbscale.runs.loop import LR_FLAGS, check_finite

    def flags(task) -> dict:
        return {**LR_FLAGS, **getattr(task, "lr_flags", {})}

    trainer = MaskTrainer(MethodConfig(method="arms", n=2, lr=3.0, param="sigmoid"), 4, 1)
    with torch.no_grad():
        trainer.r[1] = math.nan
    cases = [(ptask.PruneTask, "for --mask-opt rmsprop; lower --mask-lr"),
             (object, "for --optimizer rmsprop; lower --lr")]
    for task, words in cases:
        with pytest.raises(PBInputError, match=re.escape(words) + "$"):
            check_finite(trainer, 2, flags(task))
    with torch.no_grad():
        trainer.r[1] = 0.0
    weight = torch.nn.Parameter(torch.tensor([math.inf]))
    with pytest.raises(PBInputError, match="weights became NaN or inf in epoch 3.*lower --lr$"):
        check_finite(trainer, 2, flags(ptask.PruneTask), [weight])
    # a finite state with a non-finite loss (the step made no update): the mask flag, or the
    # weights' where weights train (issue 50: masks only switch weights on and off)
    step = (7, 3, None)
    with pytest.raises(PBInputError, match=r"at step 7 \(epoch 3, batch 3\).*lower --lr$"):
        check_finite(trainer, 2, flags(GroupRun), [], step=step)
    with pytest.raises(PBInputError, match="from finite weights.*lower --lr$"):
        check_finite(trainer, 2, flags(ptask.PruneTask), [torch.nn.Parameter(torch.ones(1))],
                      step=step)


# --------------------------------------------------------------------------------- CIFAR files


def _cifar_file(path: Path, n: int) -> None:
    rng = np.random.default_rng(n)
    rec = rng.integers(0, 256, (n, data.CIFAR10_RECORD)).astype(np.uint8)
    rec[:, 0] %= 10
    path.write_bytes(rec.tobytes())


def test_a_cifar_batch_file_cut_to_whole_records_is_refused(tmp_path):
    assert data.CIFAR10_FILE_RECORDS == 10_000
    path = tmp_path / "data_batch_1.bin"
    _cifar_file(path, 7)
    with pytest.raises(PBInputError, match="cut short .*7 records.*10,000"):
        data.read_cifar_file(path)  # the official count by default
    with pytest.raises(PBInputError, match="cut short .*7 records.*8"):
        data.read_cifar_file(path, records=8)
    x, y = data.read_cifar_file(path, records=7)
    assert x.shape == (7, 3, 32, 32) and y.shape == (7,)
    assert data.read_cifar_file(path, records=None)[0].shape == (7, 3, 32, 32)
    # the whole data set: every file must have the count
    root = tmp_path / "set"
    root.mkdir()
    for name in (*data.CIFAR10_TRAIN, data.CIFAR10_TEST):
        _cifar_file(root / name, 5)
    assert data.read_cifar10(root, records=5)[0].shape == (25, 3, 32, 32)
    _cifar_file(root / "data_batch_4.bin", 4)
    with pytest.raises(PBInputError, match="data_batch_4.bin is corrupt or cut short"):
        data.read_cifar10(root, records=5)


# ----------------------------------------------------------------- other data, other ranks


def test_rerun_on_other_data_or_process_count_is_refused(tmp_path, capsys):
    argv = [*TINY[:10], "--quiet", "--out", str(tmp_path)]  # CP reads no --n: no warning
    assert P.main(argv) == 0
    (cfg_path,) = tmp_path.glob("*/config.json")
    record = io.read_json(cfg_path)
    info = record["info"]
    assert set(PROVENANCE) <= set(info) and info["world_size"] == 1
    assert info["data"] == prun.prepare(tiny_cfg(n=10))[2].fingerprint
    assert P.main(argv) == 0  # same data, same process count: read back
    capsys.readouterr()
    for key, other, words in [("data", "0123456789abcdef", "other data"),
                              ("world_size", 2, "2 processes")]:
        io.write_json(cfg_path, {**record, "info": {**info, key: other}})
        assert P.main(argv) == 2
        line = one_line_error(capsys.readouterr().err)
        assert words in line and str(cfg_path.parent) in line
    # a folder written before these were recorded is still read back
    io.write_json(cfg_path, {**record, "info": {k: v for k, v in info.items()
                                                if k not in PROVENANCE}})
    assert P.main(argv) == 0


def test_regress_rerun_with_another_process_count_is_refused(tmp_path):
    cfg = MethodConfig(method="loorf", n=2, lr=0.1, seed=0)
    problem = tiny_problem()
    folder = rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                           problem=problem)
    record = io.read_json(folder / "config.json")
    assert record["info"]["world_size"] == 1
    record["info"]["world_size"] = 2
    io.write_json(folder / "config.json", record)
    with pytest.raises(PBInputError, match="made from 2 processes .*this run has 1"):
        rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                      problem=problem)


def test_data_fingerprint_follows_the_bytes():
    a = data.synthetic("mnist", 20, 10, seed=0, val_size=5)
    b = data.synthetic("mnist", 20, 10, seed=0, val_size=5)
    c = data.synthetic("mnist", 20, 10, seed=1, val_size=5)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    x = np.zeros((3, 4), np.uint8)
    assert data.fingerprint(x) != data.fingerprint(x.reshape(4, 3))
    y = x.copy()
    y[2, 3] = 1
    assert data.fingerprint(x) != data.fingerprint(y)


# ----------------------------------------------------------------------------------- Ctrl-C


def _sigint_after_first_checkpoint(cmd: list[str], folder_glob: str, out: Path
                                   ) -> tuple[int, str, Path]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # the tool starts as from a terminal, with SIGINT at its default (a shell that starts this
    # test in the background hands down SIGINT ignored)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        found = list(out.glob(f"{folder_glob}/checkpoint.pt"))
        if found:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err, found[0]


@pytest.mark.parametrize("tool", ["prune", "regress"])
def test_ctrl_c_checkpoints_says_how_to_resume_and_exits_130(tmp_path, tool):
    out = tmp_path / "out"
    if tool == "prune":
        args = ["--synthetic", "64", "--epochs", "40", "--max-batches", "4", "--batch-size", "8",
                "--val-size", "16", "--n", "2", "--method", "arms", "--quiet", "--out", str(out)]
        glob = "lenet-*"
    else:
        args = ["--method", "loorf", "--n", "2", "--epochs", "30", "--device", "cpu",
                "--quiet", "--out", str(out)]
        glob = "loorf-*"
    cmd = [sys.executable, "-m", f"pbscale.{tool}", *args]
    code, err, ckpt = _sigint_after_first_checkpoint(cmd, glob, out)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 130, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("SIGINT: checkpoint written to")
    assert lines[0].endswith(f"resume with: python -m pbscale.{tool} {' '.join(args)}")
    state = torch.load(ckpt, weights_only=True)
    assert state["position"] is not None  # the partial epoch is kept
    assert not (ckpt.parent / "summary.json").exists()


def test_sigint_resume_equals_uninterrupted(tmp_path):
    cfg = tiny_cfg(method="arms", epochs=3, max_batches=3)
    whole = prun.run(cfg, tmp_path / "whole", quiet=True)

    def hook(epoch, i):
        if (epoch, i) == (1, 1):
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(RunInterrupted) as exc:
        prun.run(cfg, tmp_path / "cut", quiet=True, step_hook=hook)
    assert exc.value.code == 130
    cut = prun.run(cfg, tmp_path / "cut", quiet=True)
    drop = ("train_seconds", "val_seconds")
    rows = [[{k: str(v) for k, v in r.items() if k not in drop}
             for r in io.read_csv(Path(s["folder"]) / "metrics.csv")] for s in (whole, cut)]
    assert rows[0] == rows[1]


# ---------------------------------------------------------------- reusing a pruned network


DOC = ROOT / "docs" / "using_pruned_networks.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("method,mode", [("cp", "supermask"), ("arms", "supermask"),
                                         ("gmp", "joint")])
def test_the_docs_example_reproduces_the_reported_accuracy(tmp_path, method, mode):
    summary = prun.run(tiny_cfg(method=method, mode=mode, synthetic=40, epochs=2), tmp_path,
                    quiet=True)
    folder = Path(summary["folder"])
    norm = io.read_json(folder / "data.json")
    _, _, d = prun.prepare(tiny_cfg(method=method, mode=mode, synthetic=40, epochs=2))
    assert norm["mean"] == d.mean.flatten().tolist() and norm["std"] == d.std.flatten().tolist()
    assert "no augmentation" in norm["test_transform"]
    (example,) = [b for b in _python_blocks(DOC.read_text()) if "pruned.pt" in b]
    assert len(example.strip().splitlines()) <= 14
    code, count = re.subn(r"^run = .*$", f"run = {str(folder)!r}", example, flags=re.M)
    assert count == 1
    namespace = {"images": d.test.x, "labels": d.test.y}
    exec(compile(code, str(DOC), "exec"), namespace)  # our own docs
    assert namespace["accuracy"] == summary["final_test_acc"]


def test_docs_give_the_exact_mnist_constants():
    if not MNIST_DIR.exists():
        pytest.skip("shared MNIST not present")
    d = data.load("mnist", MNIST_DIR)
    text = DOC.read_text()
    t = d.transform()
    assert f"mean = {t['mean'][0]!r}" in text and f"std = {t['std'][0]!r}" in text


def test_cifar_data_json_is_per_channel():
    t = data.synthetic("cifar10", 20, 10, val_size=5).transform()
    assert len(t["mean"]) == len(t["std"]) == 3 and t["input_shape"] == [3, 32, 32]
    assert "per channel" in t["test_transform"]


# ------------------------------------------------------------ config.json: unused settings


#: Run folder names that the code before "unused", the data fingerprint and the process count
#: were recorded gave two tiny configurations (computed with that code): existing runs must keep
#: their folders to resume. Since config.json format 2 they are the names of format 1
#: (:func:`pbscale.pruning.run.legacy_config`).
OLD_NAMES = {("cp", "supermask"): "lenet-supermask-cp-7c45b7f7fed1",
             ("gmp", "joint"): "lenet-joint-gmp-441f4d610e2c"}


@pytest.mark.parametrize("method,mode,unused,used", [
    ("cp", "supermask", {"param", "n", "target", "eval_masks", "lr"}, {"lam", "mask_lr"}),
    ("gmp", "joint", {"lam", "mask_lr", "n", "prune_at"}, {"target", "gmp_start", "lr"}),
    ("arms", "joint", {"target", "prune_at"}, {"n", "param", "lam", "lr"}),
    ("dense", "supermask", {"lam", "target", "mask_lr"}, {"lr"})])
def test_config_json_holds_each_setting_it_reads_once(tmp_path, method, mode, unused, used):
    """Format 2: the task holds the settings the run reads (those it does not are listed in
    "info", not hashed), no method section repeats them under other names, the loop does not
    repeat the epochs and seed; the folder is named by exactly that."""
    cfg = tiny_cfg(method=method, mode=mode)
    summary = prun.run(cfg, tmp_path, quiet=True)
    folder = Path(summary["folder"])
    record = io.read_json(folder / "config.json")
    listed = set(record["info"]["unused"])
    assert unused <= listed and not used & listed
    assert used <= set(record["task"]) and not listed & set(record["task"])
    assert set(record) == {"format", "task", "loop", "info", "method_info"}
    assert record["format"] == pconfig.CONFIG_FORMAT == 2
    assert not {"epochs", "seed"} & set(record["loop"])
    task, meth, loop, _ = prun.build(*_prepared(cfg))
    assert folder.name == f"{task.name}-{config_hash(prun.run_config(task, loop))}"
    # format 1 hashed every field and the method's section
    legacy = prun.legacy_config(task, meth, loop)
    assert set(legacy["task"]) == set(pconfig.PruneConfig().legacy_hashed())
    assert legacy["method"] == meth.config_dict() and legacy["loop"] == loop.to_dict()


def _prepared(cfg):
    c, dev, d = prun.prepare(cfg)
    return c, d, dev


@pytest.mark.parametrize("method,settings", [("cp", {"final_tau": 0.5}), ("gmp", {}),
                                             ("arms", {})])
def test_analysis_reads_one_configuration_alike_from_either_format(tmp_path, method, settings):
    """The same run read from its format 2 folder and from a format 1 copy: one set of
    settings for analysis (the unused ones of format 1 left out, a method's own under
    "settings"), so studies mixing old and new folders group them as one configuration. Format
    2 names a method's own setting as its option does (``cp_final_tau``)."""
    from analysis.scale.run_files import read_prune

    cfg = tiny_cfg(method=method, mode="joint" if method == "gmp" else "supermask",
                   settings=settings)
    new = Path(prun.run(cfg, tmp_path / "new", quiet=True)["folder"])
    shutil.copytree(new, tmp_path / "old" / new.name)
    old = _as_format_1(tmp_path / "old" / new.name, cfg)
    task = io.read_json(new / "config.json")["task"]
    assert {f"cp_{k}" for k in settings} <= set(task) and "settings" not in task
    a, b = read_prune(new), read_prune(old)
    assert a.task == b.task and a.metrics == b.metrics
    assert a.task.get("settings", {}) == settings
    assert not set(io.read_json(new / "config.json")["info"]["unused"]) & set(a.task)


def test_a_pruning_group_finds_its_members_format_1_folders(tmp_path):
    """A group whose members' folders are format 1 reads them back there (nothing trained, no
    new folder); a group of one format 1 member and one missing trains the missing one only,
    into a format 2 folder, to the numbers of that run alone."""
    cfgs = [tiny_cfg(method="loorf", seed=s) for s in (0, 1)]
    assert prun.run_group(cfgs, tmp_path / "g", quiet=True) == (0, 2)
    folders = sorted(p for p in (tmp_path / "g").iterdir() if not p.name.startswith("."))
    olds = sorted(_as_format_1(f, c) for f, c in zip(folders, cfgs, strict=True))
    assert prun.run_group(cfgs, tmp_path / "g", quiet=True) == (2, 0)
    assert sorted(p for p in (tmp_path / "g").iterdir() if not p.name.startswith(".")) == olds
    alone = prun.run(cfgs[1], tmp_path / "alone", quiet=True)
    shutil.rmtree(next(f for f in olds if io.read_json(f / "config.json")["task"]["seed"] == 1))
    assert prun.run_group(cfgs, tmp_path / "g", quiet=True) == (1, 1)
    again = prun.run(cfgs[1], tmp_path / "g", quiet=True)
    assert again["already_finished"] and Path(again["folder"]).name == Path(alone["folder"]).name
    assert again["final_test_acc"] == alone["final_test_acc"]


def test_a_folder_written_before_the_new_records_resumes(tmp_path):
    """Interrupt a run, strip what older code did not write (data.json, the new info entries),
    and resume: same folder, same numbers as an uninterrupted run."""
    cfg = tiny_cfg(method="arms", epochs=3)
    whole = prun.run(cfg, tmp_path / "whole", quiet=True)

    def hook(epoch, i):
        if (epoch, i) == (1, 1):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        prun.run(cfg, tmp_path / "old", quiet=True, step_hook=hook)
    (cfg_path,) = (tmp_path / "old").glob("*/config.json")
    record = io.read_json(cfg_path)
    record["info"] = {"device": "cpu", "data_dir": ""}
    io.write_json(cfg_path, record)
    resumed = prun.run(cfg, tmp_path / "old", quiet=True)
    assert Path(resumed["folder"]).name == Path(whole["folder"]).name
    assert resumed["final_test_acc"] == whole["final_test_acc"]
    assert json.loads((cfg_path.parent / "data.json").read_text())["dataset"] == "mnist"


def test_pinned_run_folder_names_of_existing_runs(tmp_path):
    """A folder made by format 1 code keeps its name: the legacy configuration names it as
    the old code did, and a run whose format 1 folder is there reads back from it."""
    for (method, mode), name in OLD_NAMES.items():
        task, meth, loop, _ = prun.build(*_prepared(tiny_cfg(method=method, mode=mode)))
        assert f"{task.name}-{config_hash(prun.legacy_config(task, meth, loop))}" == name
        assert f"{task.name}-{config_hash(prun.run_config(task, loop))}" != name


def _as_format_1(folder: Path, cfg) -> Path:
    """Rename a run folder to the name format 1 gave its run and write its config.json as
    format 1 code wrote it (the legacy configuration, the same unhashed entries)."""
    task, meth, loop, _ = prun.build(*_prepared(cfg))
    legacy = prun.legacy_config(task, meth, loop)
    old = folder.parent / f"{task.name}-{config_hash(legacy)}"
    folder.rename(old)
    record = io.read_json(old / "config.json")
    io.write_json(old / "config.json", {**legacy, "info": record["info"],
                                        "method_info": record["method_info"]})
    return old


def test_a_format_1_folder_is_read_back_resumed_and_kept(tmp_path):
    """A finished format 1 folder reads back where it is (no second folder); an interrupted
    one resumes there to the numbers of an uninterrupted run, its config.json still format
    1; a pruning group finds its members' format 1 folders too."""
    cfg = tiny_cfg(method="arms", epochs=3)
    whole = prun.run(cfg, tmp_path / "whole", quiet=True)
    done = prun.run(cfg, tmp_path / "done", quiet=True)
    old = _as_format_1(Path(done["folder"]), cfg)
    again = prun.run(cfg, tmp_path / "done", quiet=True)
    assert again["already_finished"] and Path(again["folder"]) == old
    assert [p.name for p in (tmp_path / "done").iterdir()] == [old.name]

    def hook(epoch, i):
        if (epoch, i) == (1, 1):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        prun.run(cfg, tmp_path / "cut", quiet=True, step_hook=hook)
    (cut,) = (tmp_path / "cut").iterdir()
    old = _as_format_1(cut, cfg)
    resumed = prun.run(cfg, tmp_path / "cut", quiet=True)
    assert Path(resumed["folder"]) == old and not resumed["already_finished"]
    assert resumed["final_test_acc"] == whole["final_test_acc"]
    assert resumed["final_remaining"] == whole["final_remaining"]
    assert "format" not in io.read_json(old / "config.json")
    assert [p.name for p in (tmp_path / "cut").iterdir()] == [old.name]


# ------------------------------------------------------------------------------ pinned values


def test_direct_parametrization_clamps_at_eps_1e_3():
    """The direct parametrization's clamp: eps = 1e-3 by default, everywhere it is built."""
    assert Direct().eps == 1e-3
    direct = get_parametrization("direct")
    assert direct.eps == 1e-3
    r = np.array([-5.0, 0.0, 0.0005, 0.001, 0.5, 0.999, 0.9995, 1.0, 7.0])
    assert np.array_equal(direct.project(r), [1e-3, 1e-3, 1e-3, 1e-3, 0.5, 0.999, 0.999,
                                              0.999, 0.999])
    assert MaskTrainer(MethodConfig(method="loorf", n=2, param="direct"), 4, 1).param.eps \
        == 1e-3
