"""Pruning groups (:mod:`pbscale.prune_group`): every pruning family of the registry, supermask
and joint, trained as a group of runs equals the same runs trained one at a time: the same run
folders (names, files), the same mask bits, metrics and exported weights within
:data:`REL` (float32 round-off of the grouped products; measured worst 1e-7 relative; gate
values :data:`GATE_ABS`), and an
interrupted group (SIGTERM-style stop mid-epoch, or a kill after a checkpoint) resumes to the
uninterrupted numbers."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest
import torch

from pbexact.errors import RunInterrupted
from pbscale import io as runio
from pbscale import prune
from pbscale.group_forward import GroupForward
from pbscale.masks import MaskedModule
from pbscale.methods import names
from pbscale.models import build_model

#: Relative tolerance of a member's metrics and weights against the separate run's.
REL = 1e-6
#: Absolute tolerance of hard-concrete's exported gate values: RMSprop's first steps divide a
#: gradient by its own root mean square, so a logit whose gradient is round-off sized moves by
#: a step whose size the round-off decides (measured 1.6e-5 on gates in [0, 1]; mask bits equal).
GATE_ABS = 1e-4
BASE = dict(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8, n=2,
            gmp_every=1, eval_masks=2, eval_batches=1)
SEEDS = (0, 1)


def cases() -> list[tuple[str, str]]:
    return [(mode, m) for mode in ("supermask", "joint") for m in names(f"prune-{mode}")]


def close(a: float, b: float) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return abs(a - b) <= REL * max(abs(a), 1e-3)


def same_folder(sep: Path, grp: Path) -> None:
    """``grp`` (a member's folder) reads like the separate run's folder ``sep``."""
    assert grp.name == sep.name
    assert sorted(p.name for p in grp.iterdir()) == sorted(
        p.name for p in sep.iterdir() if p.name != "checkpoint.pt")
    a, b = runio.read_csv(sep / "metrics.csv"), runio.read_csv(grp / "metrics.csv")
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert list(ra) == list(rb)
        bad = {k: (ra[k], rb[k]) for k in ra if "seconds" not in k and not close(ra[k], rb[k])}
        assert not bad, bad
    ca, cb = runio.read_json(sep / "config.json"), runio.read_json(grp / "config.json")
    assert {k: v for k, v in ca.items() if k != "info"} == \
        {k: v for k, v in cb.items() if k != "info"}
    assert cb["info"]["group"].startswith(".groups/")
    sa, sb = runio.read_json(sep / "summary.json"), runio.read_json(grp / "summary.json")
    assert set(sa) == set(sb)
    ma = torch.load(sep / "masks.pt", weights_only=True)
    mb = torch.load(grp / "masks.pt", weights_only=True)
    assert set(ma) == set(mb)
    for k in ma:
        if k.startswith("mask."):
            assert torch.equal(ma[k], mb[k]), k
        elif k.startswith("gate."):
            assert float((ma[k] - mb[k]).abs().max()) <= GATE_ABS, k
        else:
            scale = max(float(ma[k].abs().max()), 1e-3)
            assert float((ma[k] - mb[k]).abs().max()) <= REL * scale, k


@pytest.mark.parametrize("mode,method", cases())
def test_group_equals_separate_runs(tmp_path: Path, mode: str, method: str) -> None:
    cfgs = [prune.PruneConfig(**BASE, mode=mode, method=method, seed=s) for s in SEEDS]
    assert prune.run_group(cfgs, tmp_path / "grp", quiet=True) == (0, len(SEEDS))
    for c in cfgs:
        sep = Path(prune.run(c, tmp_path / "sep", quiet=True)["folder"])
        same_folder(sep, tmp_path / "grp" / sep.name)
    # finished runs are skipped
    assert prune.run_group(cfgs, tmp_path / "grp", quiet=True) == (len(SEEDS), 0)


def test_grouped_forward_is_one_computation_equal_to_each_run() -> None:
    """LeNet takes the grouped MLP path; its losses and mask gradients equal each layout's."""
    lays = [MaskedModule(build_model("lenet", s), train_weights=bool(s)) for s in (0, 1)]
    fwd = GroupForward(lays)
    g = torch.Generator().manual_seed(0)
    zs = [torch.rand(3, lays[0].d, generator=g).requires_grad_(True) for _ in lays]
    batches = [(torch.randn(5, 784, generator=g), torch.randint(0, 10, (5,), generator=g))
               for _ in lays]
    assert fwd.grouped(zs, batches)
    got = fwd([[z] for z in zs], batches)
    from pbscale.batched import cross_entropy_per_mask
    for lay, z, (x, y), J in zip(lays, zs, batches, got):
        want = lay.loss_fn(x, y, cross_entropy_per_mask)(z)
        torch.testing.assert_close(J, want, rtol=REL, atol=0)
        (ga,) = torch.autograd.grad(J.sum(), z, retain_graph=True)
        (gb,) = torch.autograd.grad(want.sum(), z)
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", ["arms", "cp"])
def test_interrupted_group_resumes(tmp_path: Path, method: str) -> None:
    """A group stopped mid-epoch (the loop's SIGTERM path) and one killed after its first
    checkpoint (the stop raised outside the loop's handler) both resume to the numbers of the
    uninterrupted group."""
    base = dict(BASE, mode="joint", method=method, epochs=3)
    cfgs = [prune.PruneConfig(**base, seed=s) for s in SEEDS]
    prune.run_group(cfgs, tmp_path / "ref", quiet=True)

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
            prune.run_group(cfgs, out, quiet=True, step_hook=stop_at(*where, kill))
        assert prune.run_group(cfgs, out, quiet=True) == (0, len(SEEDS))
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
    """An MC member's replay takes the masks its probe drew (its family ``replays_samples``):
    each sampler chunk is drawn once per step, not twice, and with n = 4 in chunks of 1 (four
    calls of the batched loss a step) the group still equals the separate runs."""
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
        cfgs = [prune.PruneConfig(**opts, mode=mode, method=method, seed=s) for s in SEEDS]
        draws.clear()
        prune.run_group(cfgs, tmp_path / "grp", quiet=True)
        in_group = len(draws)
        draws.clear()
        for c in cfgs:
            sep = Path(prune.run(c, tmp_path / "sep", quiet=True)["folder"])
            same_folder(sep, tmp_path / "grp" / sep.name)
        assert in_group == len(draws) > 0, (method, in_group, len(draws))


@pytest.mark.parametrize("mode,method", [("supermask", "arms"), ("joint", "arms"),
                                         ("supermask", "cp")])
def test_memory_guard_slices_equal_separate_runs(tmp_path: Path, mode: str, method: str,
                                                 monkeypatch) -> None:
    """Where the group's masks exceed the memory guard (group_rows), its members are evaluated
    in slices, each through its own runs' layouts: a group of 3 evaluated one member at a time
    equals the separate runs."""
    from pbscale import prune_group

    monkeypatch.setattr(prune_group, "group_rows", lambda n_masks, d, device: 1)
    cfgs = [prune.PruneConfig(**{**BASE, "epochs": 1}, mode=mode, method=method, seed=s)
            for s in (0, 1, 2)]
    assert prune.run_group(cfgs, tmp_path / "grp", quiet=True) == (0, 3)
    for c in cfgs:
        sep = Path(prune.run(c, tmp_path / "sep", quiet=True)["folder"])
        same_folder(sep, tmp_path / "grp" / sep.name)
