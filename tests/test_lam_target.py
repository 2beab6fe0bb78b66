"""``--lam-target`` at the scale users meet it (real MNIST, LeNet-300-100, CP's own mask-lr
decay at 40% and 60% of the epochs): the run reaches its target within the band or its last
line says it missed, with the fix; a pruning group takes it too, one controller per member,
each member its separate run bit for bit, interrupted and resumed included."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from _mnist import MNIST_DIR, needs_mnist
from test_group_equality import assert_same_run

from pbexact.errors import RunInterrupted
from pbscale import prune
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.pruning.lam_control import BAND
from pbscale.runs import io as runio

#: The issue's reproduction, shortened to 100 batches of 128 per epoch.
REPRO = ["--model", "lenet", "--mode", "supermask", "--method", "cp", "--lam", "1e-5",
         "--lam-target", "0.05", "--epochs", "6", "--max-batches", "100",
         "--data-dir", str(MNIST_DIR)]


@needs_mnist
def test_cp_reaches_five_percent_in_six_epochs(tmp_path: Path, capsys) -> None:
    """The issue's run (CP, --lam-target 0.05 over 6 epochs) ends inside the 10% band around
    5% (measured here: 5.23%) and its last line says so; the earlier once-per-epoch rule
    stopped at 9.58% and said nothing."""
    assert prune.main([*REPRO, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    (folder,) = tmp_path.glob("lenet-*")
    summary = runio.read_json(folder / "summary.json")
    rem = summary["final_remaining"]
    assert abs(rem - 0.05) <= BAND * 0.05, rem
    assert out[-1] == f"lam-target 5.00%: reached {rem:.2%} (final lam {summary['final_lam']:.3g})"


@needs_mnist
def test_a_miss_is_said_with_the_fix_even_when_quiet(tmp_path: Path, capsys) -> None:
    """A target the schedule cannot reach (1% in 2 epochs of 20 batches: the masks move at
    the full rate in epoch 1 only) ends with a warning on stderr naming the target, what was
    reached, the cause and the fix, under --quiet too."""
    argv = [*REPRO, "--lam-target", "0.01", "--epochs", "2", "--max-batches", "20", "--quiet",
            "--out", str(tmp_path)]
    assert prune.main(argv) == 0
    cap = capsys.readouterr()
    (folder,) = tmp_path.glob("lenet-*")
    rem = runio.read_json(folder / "summary.json")["final_remaining"]
    assert abs(rem - 0.01) > BAND * 0.01
    last = cap.err.strip().splitlines()[-1]
    assert last.startswith(f"warning: lam-target 1.00%: reached {rem:.2%}"), last
    assert "only in epoch 1 of 2" in last and "--epochs 4" in last and "--lam " in last


@needs_mnist
@pytest.mark.parametrize("mode,method", [("supermask", "cp"), ("joint", "arms")])
def test_group_members_steer_their_own_lam(tmp_path: Path, mode: str, method: str) -> None:
    """A group of seeds 0 and 1 with --lam-target (one controller each), cut by SIGTERM in
    epoch 2 and resumed: member seed 1 is the separate run --seed 1 bit for bit, its lam
    column included."""
    base = dict(model="lenet", data_dir=str(MNIST_DIR), epochs=2, max_batches=40, n=2,
                eval_masks=2, eval_batches=1, mode=mode, method=method, lam=1e-4,
                lam_target=0.3)
    cfgs = [pconfig.PruneConfig(**base, seed=s) for s in (0, 1)]

    def cut(epoch: int, i: int) -> None:
        if (epoch, i) == (1, 13):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        prun.run_group(cfgs, tmp_path / "grp", quiet=True, step_hook=cut)
    assert prun.run_group(cfgs, tmp_path / "grp", quiet=True) == (0, 2)
    sep = Path(prun.run(cfgs[1], tmp_path / "sep", quiet=True)["folder"])
    assert_same_run(sep, tmp_path / "grp" / sep.name)
    lams = [r["lam"] for r in runio.read_csv(sep / "metrics.csv")]
    assert lams[0] == 1e-4 and len(set(lams)) > 1  # the controller acted
