"""A run's numbers do not depend on its group: a member of a group is its separate run, bit for
bit, at the scale users meet it.

* Pruning groups (:mod:`pbscale.pruning.group`) on real MNIST, LeNet-300-100, 2 epochs x 50
  batches of 128, every family of ``names("prune-supermask")`` and ``names("prune-joint")``:
  member seed 1 of a group of two (seeds 0 and 1) writes the run folder the separate run
  ``--seed 1`` writes: the same names, masks.pt and pruned.pt byte for byte, metrics.csv and
  summary.json equal in every value but the seconds.
* Regression groups (``python -m pbscale.regress --seeds``) on the paper's MaskedNNRegression
  problem (d = 8,050, 10,000 training points, batches of 100), 2 epochs, every method of
  ``names("regress-group")``: member seed 1 (with its own learning rate) of a group of two has the
  history of ``python -m pbscale.regress --seed 1``, every value but the seconds equal.

The evaluation settings are small (2 evaluation masks scored on 1 batch) and MC methods draw
n = 2 samples, so the whole file fits the test budget (timed in docs/groups.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _mnist import MNIST_DIR, needs_mnist  # noqa: E402

from pbscale.methods import MethodConfig, names
from pbscale.nets import data as datamod
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.regression.group import train_group
from pbscale.regression.problem import make_problem
from pbscale.regression.run import train
from pbscale.runs import io as runio

BASE = dict(model="lenet", data_dir=str(MNIST_DIR), epochs=2, max_batches=50, n=2,
            eval_masks=2, eval_batches=1, gmp_every=10)
TIMING = ("train_seconds", "val_seconds", "seconds_per_epoch", "final_train_seconds",
          "final_val_seconds")


def prune_cases() -> list[tuple[str, str]]:
    return [(mode, m) for mode in ("supermask", "joint") for m in names(f"prune-{mode}")]


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def assert_same_run(sep: Path, member: Path) -> None:
    """The member's folder is the separate run's, bit for bit (seconds aside)."""
    assert member.name == sep.name
    assert sorted(p.name for p in member.iterdir()) == sorted(
        p.name for p in sep.iterdir() if p.name != "checkpoint.pt")
    for name in ("masks.pt", "pruned.pt", "data.json"):
        assert (member / name).read_bytes() == (sep / name).read_bytes(), name
    a, b = runio.read_csv(sep / "metrics.csv"), runio.read_csv(member / "metrics.csv")
    assert len(a) == 3
    assert str(untimed(a)) == str(untimed(b))  # str: NaN == NaN
    sa, sb = runio.read_json(sep / "summary.json"), runio.read_json(member / "summary.json")
    assert str(untimed([sa])) == str(untimed([sb]))
    ca, cb = runio.read_json(sep / "config.json"), runio.read_json(member / "config.json")
    assert {k: v for k, v in ca.items() if k != "info"} == \
        {k: v for k, v in cb.items() if k != "info"}


@pytest.fixture(scope="module")
def mnist_once():
    """MNIST read from disk once for the module (every run here loads the same split)."""
    loaded: dict = {}
    load = datamod.load

    def cached(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in loaded:
            loaded[key] = load(*args, **kwargs)
        return loaded[key]

    datamod.load = cached
    yield
    datamod.load = load


@needs_mnist
@pytest.mark.parametrize("mode,method", prune_cases())
def test_pruning_member_is_its_separate_run(tmp_path: Path, mnist_once, mode: str,
                                            method: str) -> None:
    cfgs = [pconfig.PruneConfig(**BASE, mode=mode, method=method, seed=s) for s in (0, 1)]
    assert prun.run_group(cfgs, tmp_path / "grp", quiet=True) == (0, 2)
    sep = Path(prun.run(cfgs[1], tmp_path / "sep", quiet=True)["folder"])
    assert_same_run(sep, tmp_path / "grp" / sep.name)


@pytest.fixture(scope="module")
def problem():
    return make_problem(0, "cpu")


@pytest.mark.parametrize("method", names("regress-group"))
def test_regression_member_is_its_separate_run(tmp_path: Path, problem, method: str) -> None:
    cfgs = [MethodConfig(method, 2, "sigmoid", lr, "rmsprop", seed)
            for seed, lr in ((0, 0.1), (1, 0.01))]
    group = train_group(cfgs, 2, problem, out=tmp_path / "grp")
    folder = train(cfgs[1], 2, tmp_path / "sep", device="cpu", progress=False, problem=problem)
    alone = untimed(runio.read_csv(folder / "history.csv"))
    assert len(alone) == 3
    assert str(untimed(group[1])) == str(alone)
