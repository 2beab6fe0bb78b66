"""Budgets of masks: the greedy fill of MP's and GMP's channel cuts
(:func:`pbscale.methods.schedules.fill_within`, :func:`keep_within`) against a plain one-entry
scan on real cost tables, and ``--budget``, the mask a joint L0 run freezes kept within a
fraction of the masked weights or of the channels' cost (:func:`keep_budget`): by hand on a toy
cost, in runs by weights and by channels (at most the budget, and nothing more fits), alone and
in a group (the members equal their separate runs), and its refusals in one line."""

from __future__ import annotations

from pathlib import Path

import _zoo  # tests/ is on sys.path
import pytest
import torch

from pbscale import prune as P
from pbscale.methods import schedules
from pbscale.nets.channel_layout import remaining_costs
from pbscale.nets.models import LeNet300100
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.runs import io as runio

TINY = ["--synthetic", "48", "--max-batches", "2", "--batch-size", "8", "--val-size", "16",
        "--quiet", "--threads", "1"]


def _scan(order: torch.Tensor, candidates: int, fraction: float, kept,
          forced: int = 1) -> torch.Tensor:
    """The greedy rule written as a plain loop: each candidate in order, kept when the mask
    with it stays within ``fraction`` (the first ``forced`` always)."""
    keep = torch.zeros(order.numel(), dtype=torch.bool)
    for j, i in enumerate(order[:candidates].tolist()):
        trial = keep.clone()
        trial[i] = True
        if j < forced or float(kept(trial[None])[0]) <= fraction + 1e-12:
            keep = trial
    return keep


def _floored(scores: torch.Tensor, fraction: float, kept, alive: torch.Tensor | None,
             rows: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """The floor written plainly: the scan; while it empties a group of ``rows`` that has a
    variable on in ``alive``, that group's first variable in the ranking joins the floor, and
    the scan is redone with the floor first (kept whatever it costs). The mask and the floor."""
    order = schedules.ranking(scores, alive)
    n = order.numel() if alive is None else int(alive.sum())
    rank = {i: j for j, i in enumerate(order.tolist())}
    floor: list[int] = []
    keep = _scan(order, n, fraction, kept)
    while True:
        empty = [r for r in rows if not any(keep[i] for i in r)
                 and any(alive is None or bool(alive[i]) for i in r)]
        if not empty:
            return keep, floor
        floor += [b for b in {min(r, key=rank.get) for r in empty} if b not in floor]
        first = [i for i in order.tolist() if i in floor]
        rest = [i for i in order.tolist() if i not in floor]
        keep = _scan(torch.tensor(first + rest), n, fraction, kept, forced=len(first))


def _groups(factory, shape):
    pytest.importorskip("torch_pruning")
    from pbscale.nets.channels import channel_groups
    return channel_groups(factory(), torch.zeros(1, *shape))


@pytest.mark.parametrize("factory,shape", [(LeNet300100, (784,)), (_zoo.ResCNN, (1, 8, 8))])
def test_fill_within_is_the_greedy_scan(factory, shape, monkeypatch):
    """On real cost tables (parameters and MACs, not additive: a kept pair shares the weights
    between them), random scores, fractions and alive masks: the fill equals the one-entry scan,
    whatever the chunk size, and it takes entries past the first that does not fit in some
    draws (where the longest fitting prefix would stop)."""
    groups = _groups(factory, shape)
    d = groups.d
    gen = torch.Generator().manual_seed(0)
    past_prefix = 0
    for trial in range(24):
        kind = ("params", "macs")[trial % 2]

        def kept(k: torch.Tensor, kind: str = kind) -> torch.Tensor:
            return remaining_costs(groups, k, kind)

        scores = torch.rand(d, generator=gen, dtype=torch.float64)
        fraction = float(torch.rand((), generator=gen)) * 0.9 + 0.05
        alive = (torch.rand(d, generator=gen) < 0.8) if trial % 3 == 0 else None
        order = schedules.ranking(scores, alive)
        n = d if alive is None else int(alive.sum())
        want = _scan(order, n, fraction, kept)
        monkeypatch.setattr(schedules, "FILL_CELLS", [1 << 20, 3 * d, 1][trial % 3])
        got = schedules.keep_within(scores, fraction, kept, alive)
        assert torch.equal(got, want), trial
        assert float(kept(got[None])[0]) <= fraction + 1e-12 or int(got.sum()) == 1
        if alive is not None:
            assert not bool((got & ~alive).any())  # never one off in alive
        first_out = next((j for j, i in enumerate(order[:n].tolist()) if not got[i]), n)
        past_prefix += bool(got[order[first_out:n]].any())
    assert past_prefix > 0


def test_the_floor_by_hand():
    """Six variables of additive costs (a fraction of their sum 21) in two coupled groups,
    {0, 1, 2} and {3, 4, 5}, the first group best-scored: the plain fill empties the second; the
    floor keeps its best-scored variable first, and the fill redone around it takes less of the
    first group. A fill that empties no group is returned unchanged; a group with no variable
    alive is not held; a floor over the budget is kept (only the floor is over)."""
    c = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.float64)

    def kept(k: torch.Tensor) -> torch.Tensor:
        return (k.to(torch.float64) @ c) / c.sum()

    scores = torch.tensor([0.9, 0.8, 0.7, 0.2, 0.3, 0.1], dtype=torch.float64)
    rows = torch.tensor([[0, 1, 2], [3, 4, 5]])
    # budget 6/21: plain takes 0, 1, 2 (cost 6): group 2 empty
    assert schedules.keep_within(scores, 6 / 21, kept).tolist() == [1, 1, 1, 0, 0, 0]
    # the floor: 4 (best of group 2, cost 5) first, then 0 (1) fits, 1 and 2 do not
    got = schedules.keep_within(scores, 6 / 21, kept, None, rows)
    assert got.tolist() == [True, False, False, False, True, False]
    # budget 10/21: plain takes 0, 1, 2 (6) and 4 (11 > 10: no), 3 (10): no group empty
    plain = schedules.keep_within(scores, 10 / 21, kept)
    assert plain.tolist() == [1, 1, 1, 1, 0, 0]
    assert torch.equal(schedules.keep_within(scores, 10 / 21, kept, None, rows), plain)
    # group 2 all off in alive: nothing to hold
    alive = torch.tensor([True, True, True, False, False, False])
    got = schedules.keep_within(scores, 6 / 21, kept, alive, rows)
    assert got.tolist() == [True, True, True, False, False, False]
    # budget 1/21: plain keeps 0 (the first, forced); the floor keeps 0 and 4, 6/21 > 1/21
    got = schedules.keep_within(scores, 1 / 21, kept, None, rows)
    assert got.tolist() == [True, False, False, False, True, False]
    # redos that empty other groups (rows padded with d = 6): plain 0, 1, 2 empties {3, 4, 5}
    # (4 held); 4, 0 empties {2} (2 held); 4, 2 (8 > 6) empties {0, 1} (0 held)
    rows3 = torch.tensor([[0, 1, 6], [2, 6, 6], [3, 4, 5]])
    got = schedules.keep_within(scores, 6 / 21, kept, None, rows3)
    want, floor = _floored(scores, 6 / 21, kept, None, [[0, 1], [2], [3, 4, 5]])
    assert torch.equal(got, want) and floor == [4, 2, 0]
    assert got.tolist() == [True, False, True, False, True, False]


@pytest.mark.parametrize("factory,shape", [(LeNet300100, (784,)), (_zoo.ResCNN, (1, 8, 8))])
def test_the_floor_is_the_plain_rule(factory, shape):
    """On real cost tables (parameters and MACs), random scores scaled per coupled group,
    fractions and alive masks: ``keep_within`` with the layout's coupled groups equals the
    floor written plainly, never empties a group with a variable alive, equals the floorless
    fill wherever that empties none, and the floor acts in some draws."""
    from pbscale.nets.channel_layout import ChannelLayout

    groups = _groups(factory, shape)
    d = groups.d
    rows = [sorted(c.variables) for c in groups.coupled if c.variables and not c.frozen]
    index = ChannelLayout(factory(), groups).coupled_index()
    assert [[i for i in r if i < d] for r in index.tolist()] == rows
    gen = torch.Generator().manual_seed(1)
    acted = 0
    for trial in range(24):
        kind = ("params", "macs")[trial % 2]

        def kept(k: torch.Tensor, kind: str = kind) -> torch.Tensor:
            return remaining_costs(groups, k, kind)

        scale = torch.ones(d, dtype=torch.float64)
        for r in rows:
            scale[r] = 10.0 ** float(torch.randn((), generator=gen, dtype=torch.float64) * 2)
        scores = torch.rand(d, generator=gen, dtype=torch.float64) * scale
        fraction = float(torch.rand((), generator=gen)) * 0.3 + 0.01
        alive = (torch.rand(d, generator=gen) < 0.7) if trial % 3 == 0 else None
        want, floor = _floored(scores, fraction, kept, alive, rows)
        got = schedules.keep_within(scores, fraction, kept, alive, index)
        assert torch.equal(got, want), trial
        for r in rows:
            assert bool(got[r].any()) or not (alive is None or bool(alive[r].any()))
        if not floor:
            assert torch.equal(got, schedules.keep_within(scores, fraction, kept, alive))
        acted += bool(floor)
    assert acted > 0


def test_keep_budget_by_hand():
    """Six variables of additive costs 1..6 (a fraction of 21): a mask within the budget keeps
    its variables and gains the best-scored others that fit; one over it loses its worst-scored
    (and a smaller one may then fit); without costs, the count is round(fraction d)."""
    c = torch.arange(1, 7, dtype=torch.float64)

    def kept(k: torch.Tensor) -> torch.Tensor:
        return (k.to(torch.float64) @ c) / c.sum()

    scores = torch.tensor([0.9, 0.1, 0.5, 0.8, 0.3, 0.7], dtype=torch.float64)
    mask = torch.tensor([1, 0, 0, 1, 0, 0], dtype=torch.float64)  # costs 1 + 4 = 5
    assert schedules.budget_order(mask, scores).tolist() == [0, 3, 5, 2, 4, 1]
    # budget 10/21: 0 (1), 3 (4) kept; 5 (cost 6) does not fit, 2 (3) does, 4 (5) not, 1 (2)
    # fills it exactly
    got = schedules.keep_budget(mask, scores, 10 / 21, kept)
    assert got.tolist() == [True, True, True, True, False, False]
    # budget 4/21: the mask (5) is over: 0 stays, 3 (4) goes, then 2 (3) fits
    got = schedules.keep_budget(mask, scores, 4 / 21, kept)
    assert got.tolist() == [True, False, True, False, False, False]
    # weights (no costs): the first round(0.5 * 6) = 3 of the same order
    got = schedules.keep_budget(mask, scores, 0.5)
    assert got.tolist() == [True, False, False, True, False, True]


def _maximal(folder: Path, budget: float, kind: str) -> None:
    """A channel run's frozen mask (structured.pt's keep) keeps at most ``budget`` of the
    --cost, and no variable it left out would still fit."""
    from pbscale.nets.channel_layout import remaining_cost
    from pbscale.nets.channels import channel_groups

    keep = torch.load(folder / "structured.pt", map_location="cpu", weights_only=True)["keep"]
    groups = channel_groups(LeNet300100(), torch.zeros(1, 784))
    assert remaining_cost(groups, keep, kind) <= budget + 1e-12
    for j in (~keep).nonzero().flatten().tolist():
        more = keep.clone()
        more[j] = True
        assert remaining_cost(groups, more, kind) > budget
    summary = runio.read_summary(folder / "summary.json")
    assert summary["final_remaining"] == pytest.approx(remaining_cost(groups, keep, kind),
                                                       rel=1e-12)


@pytest.mark.parametrize("method,lam", [("cp", "1e-4"), ("arms", "1e-4")])
def test_a_channel_run_freezes_a_mask_within_its_budget(tmp_path, method, lam):
    """Joint runs over LeNet's channels by MACs: without --budget CP and ARMS keep more than
    30% after three epochs at a small lam; with --budget 0.3 the frozen epoch's mask keeps at
    most 30% of the MACs of the prunable part and nothing left out would fit; the metrics of
    the frozen epoch are that mask's."""
    pytest.importorskip("torch_pruning")
    args = ["--model", "lenet", "--method", method, "--mode", "joint", "--granularity",
            "channel", "--cost", "macs", "--lam", lam, "--epochs", "3", "--n", "2", *TINY]
    assert P.main([*args, "--out", str(tmp_path / "free")]) == 0
    (free,) = [p for p in (tmp_path / "free").iterdir() if p.is_dir()]
    assert runio.read_summary(free / "summary.json")["final_remaining"] > 0.3
    assert P.main([*args, "--budget", "0.3", "--out", str(tmp_path / "cut")]) == 0
    (cut,) = [p for p in (tmp_path / "cut").iterdir() if p.is_dir()]
    _maximal(cut, 0.3, "macs")
    assert runio.read_json(cut / "config.json")["task"]["budget"] == 0.3
    rows = runio.read_csv(cut / "metrics.csv")
    assert float(rows[-1]["remaining"]) <= 0.3


def test_a_weight_run_freezes_round_budget_d_weights(tmp_path):
    """By weights the budget is a count: round(0.2 d) of LeNet's masked weights."""
    args = ["--model", "lenet", "--method", "cp", "--mode", "joint", "--lam", "0",
            "--epochs", "2", "--budget", "0.2", "--out", str(tmp_path), *TINY]
    assert P.main(args) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    masks = torch.load(folder / "masks.pt", map_location="cpu", weights_only=True)
    kept = {k: int(v.count_nonzero()) for k, v in masks.items() if k.startswith("mask.")}
    d = 784 * 300 + 300 * 100
    assert sorted(kept) == ["mask.fc1.weight", "mask.fc2.weight"]
    assert sum(kept.values()) == round(0.2 * d)
    summary = runio.read_summary(folder / "summary.json")
    assert summary["final_remaining"] == round(0.2 * d) / d


def test_a_group_with_a_budget_equals_its_separate_runs(tmp_path):
    """Each member of a group freezes its own mask within the budget, as its separate run."""
    from test_prune_group import same_folder

    base = dict(model="lenet", synthetic=48, epochs=3, max_batches=2, batch_size=8, n=2,
                eval_masks=2, eval_batches=1, mode="joint", method="arms", lam=1e-3,
                budget=0.25)
    cfgs = [pconfig.PruneConfig(**base, seed=s) for s in (0, 1)]
    assert prun.run_group(cfgs, tmp_path / "grp", quiet=True) == (0, 2)
    for c in cfgs:
        sep = Path(prun.run(c, tmp_path / "sep", quiet=True)["folder"])
        same_folder(sep, tmp_path / "grp" / sep.name)
        assert runio.read_summary(sep / "summary.json")["final_remaining"] <= 0.25


def test_a_budget_leaves_run_names_alone_until_set():
    """Without --budget the hashed configuration has no entry for it (folders keep names);
    with it, the entry is there."""
    c = pconfig.PruneConfig(model="lenet", mode="joint").resolved()
    assert "budget" not in c.hashed() and "budget" not in c.legacy_hashed()
    c = pconfig.PruneConfig(model="lenet", mode="joint", budget=0.3).resolved()
    assert c.hashed()["budget"] == 0.3


@pytest.mark.parametrize("extra,text", [
    (["--budget", "1.5"], "--budget is a fraction of masked weights"),
    (["--budget", "0.3", "--mode", "supermask"], "--budget cuts the mask that a joint run"),
    (["--budget", "0.3", "--method", "mp"], "--budget cuts the mask that a joint run"),
    (["--budget", "0.3", "--epochs", "1"], "leaves none frozen for CP; give --epochs 2 or more"),
])
def test_a_bad_budget_is_one_line(tmp_path, capsys, extra, text):
    args = ["--model", "lenet", "--mode", "joint", "--epochs", "2", "--out", str(tmp_path),
            *TINY, *extra]
    assert P.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and text in err[0], err
    assert not any(tmp_path.iterdir())


def test_budget_is_a_sweep_key(tmp_path, capsys):
    """budget is a sweep key: at its default run ids stay as they were, set it names another
    run; a sweep that sets it for a supermask run is refused before it runs."""
    from pbscale import sweep

    head = ('[sweep]\ncommand = "prune"\nout = "o"\n[[grid]]\nseed = [0]\nsynthetic = 48\n'
            'mode = "joint"\n')
    ids = []
    for i, extra in enumerate(("", "budget = 0.0\n", "budget = 0.3\n")):
        path = tmp_path / f"{i}.toml"
        path.write_text(head + extra)
        ids.append(sweep.load(path).runs[0].id)
    assert ids[0] == ids[1] != ids[2]
    path = tmp_path / "bad.toml"
    path.write_text(head.replace('"joint"', '"supermask"') + "budget = 0.3\n")
    assert sweep.main(["status", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--budget cuts the mask" in err
