"""Pruning groups (:mod:`pbscale.pruning.group`): every pruning family of the registry, supermask
and joint, trained as a group of runs equals the same runs trained one at a time, bit for bit
(the same run folders, names and files; masks.pt and pruned.pt byte for byte; every metric but
the seconds; at MNIST scale in ``tests/test_group_equality.py``), and an interrupted group
(SIGTERM-style stop mid-epoch, or a kill after a checkpoint) resumes to the uninterrupted
numbers."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest

from pbexact.errors import RunInterrupted
from pbscale import prune
from pbscale.methods import names
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.runs import io as runio

BASE = dict(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8, n=2,
            gmp_every=1, eval_masks=2, eval_batches=1)
SEEDS = (0, 1)


def cases() -> list[tuple[str, str]]:
    return [(mode, m) for mode in ("supermask", "joint") for m in names(f"prune-{mode}")]


def same_folder(sep: Path, grp: Path) -> None:
    """``grp`` (a member's folder) is the separate run's folder ``sep``, bit for bit (the
    seconds aside)."""
    assert grp.name == sep.name
    assert sorted(p.name for p in grp.iterdir()) == sorted(
        p.name for p in sep.iterdir() if p.name != "checkpoint.pt")
    for name in ("masks.pt", "pruned.pt", "data.json"):
        assert (grp / name).read_bytes() == (sep / name).read_bytes(), name
    timing = ("train_seconds", "val_seconds")
    a, b = runio.read_csv(sep / "metrics.csv"), runio.read_csv(grp / "metrics.csv")
    assert str([{k: v for k, v in r.items() if k not in timing} for r in a]) == \
        str([{k: v for k, v in r.items() if k not in timing} for r in b])
    ca, cb = runio.read_json(sep / "config.json"), runio.read_json(grp / "config.json")
    assert {k: v for k, v in ca.items() if k != "info"} == \
        {k: v for k, v in cb.items() if k != "info"}
    assert cb["info"]["group"].startswith(".groups/")
    sa, sb = runio.read_json(sep / "summary.json"), runio.read_json(grp / "summary.json")
    assert set(sa) == set(sb)


@pytest.mark.parametrize("mode,method", cases())
def test_group_equals_separate_runs(tmp_path: Path, mode: str, method: str) -> None:
    cfgs = [pconfig.PruneConfig(**BASE, mode=mode, method=method, seed=s) for s in SEEDS]
    assert prun.run_group(cfgs, tmp_path / "grp", quiet=True) == (0, len(SEEDS))
    for c in cfgs:
        sep = Path(prun.run(c, tmp_path / "sep", quiet=True)["folder"])
        same_folder(sep, tmp_path / "grp" / sep.name)
    # finished runs are skipped
    assert prun.run_group(cfgs, tmp_path / "grp", quiet=True) == (len(SEEDS), 0)


@pytest.mark.parametrize("method", ["arms", "cp"])
def test_interrupted_group_resumes(tmp_path: Path, method: str) -> None:
    """A group stopped mid-epoch (the loop's SIGTERM path) and one killed after its first
    checkpoint (the stop raised outside the loop's handler) both resume to the numbers of the
    uninterrupted group."""
    base = dict(BASE, mode="joint", method=method, epochs=3)
    cfgs = [pconfig.PruneConfig(**base, seed=s) for s in SEEDS]
    prun.run_group(cfgs, tmp_path / "ref", quiet=True)

    def stop_at(epoch: int, step: int, kill: bool):
        def hook(e: int, i: int) -> None:
            if (e, i) == (epoch, step):
                if kill:  # no checkpoint here: the group restarts from the last epoch's
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signal.SIGTERM)  # checkpoint before the next step
        return hook

    for where, kill in (((1, 0), False), ((2, 0), True)):
        out = tmp_path / f"cut{where}"
        with pytest.raises((RunInterrupted, KeyboardInterrupt)):
            prun.run_group(cfgs, out, quiet=True, step_hook=stop_at(*where, kill))
        assert prun.run_group(cfgs, out, quiet=True) == (0, len(SEEDS))
        for folder in (tmp_path / "ref").iterdir():
            if folder.name.startswith("lenet-"):
                a = runio.read_csv(folder / "metrics.csv")
                b = runio.read_csv(out / folder.name / "metrics.csv")
                for ra, rb in zip(a, b):
                    assert all(ra[k] == rb[k] or (isinstance(ra[k], float) and math.isnan(ra[k])
                                                  and math.isnan(rb[k]))
                               for k in ra if "seconds" not in k)


def test_cli_seeds_and_lists(tmp_path: Path) -> None:
    """``--seeds`` with comma lists of --lam and --mask-lr trains the grid as one group; bad
    combinations are one-line errors (exit 2)."""
    args = ["--model", "lenet", "--synthetic", "48", "--epochs", "1", "--max-batches", "1",
            "--batch-size", "8", "--method", "cp", "--quiet", "--out", str(tmp_path)]
    assert prune.main([*args, "--seeds", "0,1", "--lam", "0,0.001", "--mask-lr", "0.01"]) == 0
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("lenet-")]) == 4
    assert prune.main([*args, "--seeds", "0,1", "--lam", "0,0"]) == 2


def test_a_groups_folder_that_leads_outside_out_is_refused(tmp_path: Path, capsys) -> None:
    """``OUT/.groups`` as a symlink to another folder: the group is refused in one line (exit
    2) before it trains, and nothing is written where the link points."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / ".groups").symlink_to(elsewhere)
    args = ["--model", "lenet", "--synthetic", "48", "--epochs", "1", "--max-batches", "1",
            "--batch-size", "8", "--method", "cp", "--quiet", "--out", str(out)]
    assert prune.main([*args, "--seeds", "0,1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "outside" in err and "--out" in err
    assert not any(elsewhere.iterdir())


@pytest.mark.parametrize("mode", ["supermask", "joint"])
def test_mc_members_draw_their_masks_once(tmp_path: Path, mode: str, monkeypatch) -> None:
    """An MC member draws its samples as its separate run does (each sampler chunk once per
    step), and with n = 4 in chunks of 1 (four calls of the batched loss a step) the group
    still equals the separate runs."""
    from pbscale.methods import samplers

    draws = []
    for cls in (samplers.BernoulliSampler, samplers.CopulaSampler):
        orig = cls.next

        def counted(self, k, _orig=orig):
            draws.append(k)
            return _orig(self, k)
        monkeypatch.setattr(cls, "next", counted)
    opts = {**BASE, "n": 4, "chunk": 1, "epochs": 1}
    for method in ("arms", "loorf"):
        cfgs = [pconfig.PruneConfig(**opts, mode=mode, method=method, seed=s) for s in SEEDS]
        draws.clear()
        prun.run_group(cfgs, tmp_path / "grp", quiet=True)
        in_group = len(draws)
        draws.clear()
        for c in cfgs:
            sep = Path(prun.run(c, tmp_path / "sep", quiet=True)["folder"])
            same_folder(sep, tmp_path / "grp" / sep.name)
        assert in_group == len(draws) > 0, (method, in_group, len(draws))


def test_group_reports_like_runs(tmp_path: Path, capsys, monkeypatch) -> None:
    """A group's bar shows the group (its training runs and their mean metrics, not run0's);
    it ends with one line per member (folder, test accuracy, remaining: the separate run's
    --quiet line), and a rerun prints them again with how many had finished before."""
    from pbscale.runs import loop as loopmod

    shown: list[dict] = []

    class Bar:
        def __init__(self, iterable, **_kw) -> None:
            self.iterable = iterable

        def __iter__(self):
            return iter(self.iterable)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

        def set_postfix(self, values: dict) -> None:
            shown.append(values)

        def close(self) -> None:
            return None

    monkeypatch.setattr(loopmod, "tqdm", Bar)
    args = ["--model", "lenet", "--synthetic", "48", "--epochs", "2", "--max-batches", "1",
            "--batch-size", "8", "--method", "cp", "--out", str(tmp_path), "--seeds", "0-2"]
    assert prune.main(args) == 0
    cap = capsys.readouterr()
    assert shown and all(s["runs"] == 3 and "mean val_acc" in s for s in shown), shown
    assert not any(k.startswith("run0") for s in shown for k in s)
    lines = cap.out.strip().splitlines()
    folders = sorted(tmp_path.glob("lenet-*"))
    assert len(lines) == 3 and "trained together" not in cap.out
    for folder in folders:
        summary = runio.read_json(folder / "summary.json")
        seed = runio.read_json(folder / "config.json")["task"]["seed"]
        line = next(li for li in lines if li.startswith(f"{folder} (seed {seed}): "))
        assert f"test_acc {summary['final_test_acc']:.4f}" in line
        assert f"({summary['final_remaining']:.4%})" in line
    assert prune.main([*args, "--quiet"]) == 0
    cap = capsys.readouterr()
    assert sorted(cap.out.strip().splitlines()) == sorted(lines)
    assert "3 of these runs had finished before" in cap.err
