"""A ``prune`` sweep with ``group = true``: runs that differ only in seed, lam and mask learning
rate form one pruning group (one ``python -m pbscale.prune --seeds ... --lam ... --mask-lr ...``
child), and
each of its folders reads like a separate run's (``status``, ``results``, ``analysis.pareto``
and ``analysis.scale_report`` unchanged on them)."""

from __future__ import annotations

from pathlib import Path

from test_prune_group import same_folder
from test_sweep import _sweep_cli, _write

from analysis.scale.pareto_rows import find_runs, read_runs
from analysis.scale.study import load
from pbscale import prune, sweep
from pbscale.pruning import config as pconfig
from pbscale.pruning import group as pgroup
from pbscale.pruning import run as prun
from pbscale.runs import io

OPTS = dict(model="lenet", synthetic=48, epochs=1, max_batches=1, batch_size=8, n=2,
            eval_masks=2, eval_batches=1, method="arms")
PLAN = """
[sweep]
command = "prune"
out = "{out}"
group = true

[base]
model = "lenet"
synthetic = 48
epochs = 1
max_batches = 1
batch_size = 8
n = 2
eval_masks = 2
eval_batches = 1
method = "arms"

[[grid]]
seed = [0, 1, 2, 3]
mask_lr = [0.01, 0.1]
"""


def test_prune_plan_groups_seeds_and_mask_lrs(tmp_path):
    s = sweep.load(_write(tmp_path, PLAN.format(out=tmp_path / "o")))
    jobs = sweep.plan(s, s.runs)
    assert len(jobs) == 1 and isinstance(jobs[0], sweep.Group)
    assert jobs[0].values == {"seed": [0, 1, 2, 3], "lam": [pconfig.PruneConfig().lam],
                              "mask_lr": [0.01, 0.1]}
    line = s.command_line(jobs[0])
    assert line[:2] == ["-m", "pbscale.prune"]
    opts = dict(zip(line[2::2], line[3::2]))
    assert opts["--seeds"] == "0,1,2,3" and opts["--mask-lr"] == "0.01,0.1"
    assert opts["--method"] == "arms" and "--seed" not in opts and "--lam" not in opts


def test_prune_plan_groups_lambdas_too(tmp_path):
    """A seeds x lams x mask lrs product is one group whose child takes all three lists, and
    each member's sweep key names its lam; a grid that is not a product splits along its last
    axes into products (here one group per mask lr)."""
    grid = PLAN.replace("mask_lr = [0.01, 0.1]", "mask_lr = [0.01, 0.1]\nlam = [1e-3, 1e-4]")
    s = sweep.load(_write(tmp_path, grid.format(out=tmp_path / "o")))
    jobs = sweep.plan(s, s.runs)
    assert len(jobs) == 1 and len(jobs[0].runs) == 16
    assert jobs[0].values == {"seed": [0, 1, 2, 3], "lam": [1e-4, 1e-3], "mask_lr": [0.01, 0.1]}
    assert jobs[0].text() == "seed 0,1,2,3 x lam 0.0001,0.001 x mask_lr 0.01,0.1"
    opts = dict(zip(*[iter(s.command_line(jobs[0])[2:])] * 2))
    assert opts["--lam"] == "0.0001,0.001" and opts["--seeds"] == "0,1,2,3"
    keys = {pgroup.member_key(r.full) for r in jobs[0].runs}
    assert len(keys) == 16 and "seed0-lam0.001-mask_lr0.1" in keys
    # the child builds exactly the members' runs
    args = prune.build_parser().parse_args(s.command_line(jobs[0])[2:])
    cfgs = prun.group_configs(pconfig.PruneConfig(model="lenet"), args.seeds, args.lam,
                               args.mask_lr)
    assert {(c.seed, c.lam, c.mask_lr) for c in cfgs} == {
        (r.full["seed"], r.full["lam"], r.full["mask_lr"]) for r in jobs[0].runs}
    # not a product: lam 1e-4 only at mask lr 0.1 -> a group per mask lr
    cut = [r for r in s.runs if not (r.full["lam"] == 1e-4 and r.full["mask_lr"] == 0.01)]
    parts = sweep.plan(s, cut)
    assert sorted((len(g.runs), str(g.values)) for g in parts) == sorted([
        (4, str({"seed": [0, 1, 2, 3], "lam": [1e-3], "mask_lr": [0.01]})),
        (8, str({"seed": [0, 1, 2, 3], "lam": [1e-4, 1e-3], "mask_lr": [0.1]}))])


def test_prune_sweep_of_8_runs_is_one_group(tmp_path):
    out = tmp_path / "o"
    path = _write(tmp_path, PLAN.format(out=out))
    s = sweep.load(path)
    first = _sweep_cli("run", str(path), "--jobs", "1")
    assert first.returncode == 0, first.stderr
    assert "(1 groups, 1 children)" in first.stderr
    assert all(sweep.state_of(s, r) == "finished" for r in s.runs)
    assert "finished 8, running 0, failed 0, diverged 0, interrupted 0, pending 0" in \
        _sweep_cli("status", str(path)).stdout
    csv = tmp_path / "r.csv"
    assert _sweep_cli("results", str(path), "--csv", str(csv)).returncode == 0
    assert len(io.read_csv(csv)) == 8
    folders = sweep.folder_index(out)
    assert sorted(folders) == sorted(r.id for r in s.runs)  # each carries its own sweep id
    # two of the members against the same runs trained one at a time
    for seed, lr in ((0, 0.01), (3, 0.1)):
        sep = Path(prun.run(pconfig.PruneConfig(**OPTS, seed=seed, mask_lr=lr),
                             tmp_path / "sep", quiet=True)["folder"])
        same_folder(sep, out / sep.name)
    runs = read_runs(find_runs([out]))
    assert len(runs) == 8
    loaded = load(out)
    assert len(loaded) == 8 and {r.method for r, _ in loaded} == {"arms"}
    again = _sweep_cli("run", str(path), "--jobs", "1")
    assert again.returncode == 0 and "nothing to run" in again.stderr
