"""The thin run assembly: one mapping from how a tool ends to its exit code
(:func:`pbexact.cli.run_main`) used by every CLI, an interruption that is an exception (no
``sys.exit`` in the run loop), the torch set-up in :mod:`pbscale.runs.runtime` (devices pbscale
cannot use refused in one line), and a pruning run assembled from its parts."""

from __future__ import annotations

import ast
import re
import signal
from pathlib import Path

import pytest
import torch

from analysis.cli import run as analysis_run
from pbexact.cli import run_main
from pbexact.errors import PBInputError, RunInterrupted
from pbscale import prune, regress
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.runs.runtime import available_devices, resolve_device

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("device", ["mps", "meta", "xla", "tpu", "cuda:x", ""])
def test_devices_pbscale_cannot_use_are_refused_in_one_line(device):
    with pytest.raises(PBInputError) as exc:
        resolve_device(device)
    message = str(exc.value)
    assert "\n" not in message
    if not torch.cuda.is_available() and device.startswith("cuda"):
        return
    assert "cpu, auto" in message  # the devices available here are named


def test_available_devices_and_the_ones_that_resolve():
    here = available_devices()
    assert here[:2] == ["cpu", "auto"]
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    if not torch.cuda.is_available():
        assert here == ["cpu", "auto"]
        with pytest.raises(PBInputError, match="no GPU is visible"):
            resolve_device("cuda")


@pytest.mark.parametrize("main", [prune.main, regress.main])
@pytest.mark.parametrize("device", ["mps", "meta"])
def test_every_torch_cli_refuses_mps_and_meta_with_exit_2(main, device, tmp_path, capsys):
    assert main(["--device", device, "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --device") and "\n" not in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_run_main_maps_every_ending_to_its_exit_code(capsys):
    def raising(exc: BaseException):
        def body() -> None:
            raise exc
        return body

    assert run_main(lambda: None) == 0 and run_main(lambda: 3) == 3
    assert run_main(raising(PBInputError("bad value; use a good one"))) == 2
    assert capsys.readouterr().err == "error: bad value; use a good one\n"
    stop = RunInterrupted(signal.SIGTERM, "SIGTERM: checkpoint written to x/checkpoint.pt")
    assert run_main(raising(stop)) == 143
    err = capsys.readouterr().err
    assert err.startswith("SIGTERM: checkpoint written to x/checkpoint.pt; resume with: ")
    assert run_main(raising(RunInterrupted(signal.SIGINT, "SIGINT: ..."))) == 130
    capsys.readouterr()
    assert run_main(raising(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert run_main(raising(KeyboardInterrupt()), resumable=True) == 130
    assert "resume with:" in capsys.readouterr().err
    assert run_main(raising(SystemExit(2))) == 2
    with pytest.raises(ValueError):  # a bug is not bad input: its traceback shows
        run_main(raising(ValueError("a bug")))
    # analysis's entry points share it
    assert analysis_run(lambda argv: (_ for _ in ()).throw(PBInputError("x; y"))) == 2


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_the_run_loop_raises_instead_of_exiting_and_one_run_main_serves_every_cli():
    assert "sys.exit" not in _calls(ROOT / "pbscale" / "runs" / "loop.py")
    defined = [p.relative_to(ROOT).as_posix() for pkg in ("pbexact", "pbscale", "analysis")
               for p in (ROOT / pkg).rglob("*.py")
               if re.search(r"^def run_main\(", p.read_text(), re.M)]
    assert defined == ["pbexact/cli.py"]
    for tool in ("prune", "regress"):
        source = (ROOT / "pbscale" / f"{tool}.py").read_text()
        assert "run_main(" in source and "except PBInputError" not in source, tool
    assert "run_main(" in (ROOT / "analysis" / "cli.py").read_text()


def test_a_pruning_run_is_assembled_from_its_parts():
    """The task holds the network and its batches; evaluation and export are strategies of
    the loop (the evaluation picks the frozen mask); the method is the family's."""
    from pbscale.pruning.evaluation import MaskEvaluation
    from pbscale.runs.contracts import RunHooks, Task

    cfg = pconfig.PruneConfig(model="lenet", synthetic=16, epochs=1, max_batches=1, batch_size=4,
                            val_size=4, method="cp")
    cfg, dev, data = prun.prepare(cfg)
    task, method, loop, _ = prun.build(cfg, data, dev)
    assert isinstance(task, Task) and not isinstance(task, RunHooks)
    assert isinstance(task.evaluation, MaskEvaluation) and isinstance(task.evaluation, RunHooks)
    assert method.layers == tuple(task.layout.sizes) and method.target == cfg.target
    assert method.generator.initial_seed() == cfg.seed
