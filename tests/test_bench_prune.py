"""benchmarks.bench_prune: argument errors exit 2 with one line; a tiny run writes every row."""

from __future__ import annotations

import math

import pytest

from analysis.cli import run
from benchmarks import bench_prune
from pbscale.runs import io


@pytest.mark.parametrize("argv,match", [
    (["--device", "gpu"], "--device 'gpu' is neither cpu nor cuda"),
    (["--amp", "fp8"], "--amp 'fp8' is not none, bf16 or both"),
    (["--ns", "1,x"], "comma-separated integers"),
    (["--ns", "0"], "positive integers"),
    (["--models", "alexnet"], "unknown model 'alexnet'"),
    (["--batch", "1"], "--batch: must be an integer >= 2"),
    (["--chunk", "0"], "--chunk: must be a positive integer"),
    (["--layouts", "nhwc"], "--layouts 'nhwc' is not nchw"),
    (["--groups", "0"], "--per-call must be positive"),
    (["--param", "nope"], "unknown parametrization"),
])
def test_bad_arguments_exit_2(argv, match, capsys, tmp_path):
    assert run(bench_prune.main, argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and match in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_tiny_run_writes_every_measurement(tmp_path, capsys):
    argv = ["--models", "lenet,resnet20", "--batch", "4", "--ns", "1,3", "--chunk", "2",
            "--repeats", "1", "--no-memory", "--out", str(tmp_path)]
    assert run(bench_prune.main, argv) == 0
    rows = io.read_csv(tmp_path / "bench_prune_cpu.csv")
    whats = {(r["model"], r["what"], int(r["n"])) for r in rows}
    for model in ("lenet", "resnet20"):
        for key in (("dense_forward", 1), ("dense_train", 1), ("mc_step", 1), ("mc_step", 3),
                    ("fwd_fast", 2), ("fwd_vmap", 2), ("fwd_loop", 2)):
            assert (model, *key) in whats
    assert ("lenet", "fwd_mlp_fast", 2) in whats
    # what pruning runs on the CPU: the MLP fast path (LeNet), a loop over masks (conv nets)
    assert {(r["model"], r["backend"]) for r in rows} == {("lenet", "mlp_fast"),
                                                          ("resnet20", "loop")}
    for model in ("lenet", "resnet20"):
        assert (model, "fwd_module", 2) in whats
    for r in rows:
        assert float(r["ms_median"]) > 0 and float(r["per_dense_forward"]) > 0
        if r["what"] == "mc_step":
            assert r["estimator"] == ("reinforce" if int(r["n"]) == 1 else "arms")
            assert int(r["chunk"]) == min(2, int(r["n"]))
        if r["what"].startswith("fwd_"):  # the fast forward agrees with the loop
            assert float(r["max_rel_diff"]) < 1e-5
    dense = [r for r in rows if r["what"] == "dense_forward"]
    assert all(math.isclose(float(r["per_dense_forward"]), 1.0) for r in dense)
    out = capsys.readouterr().out
    assert "MC step n=   3 (arms, chunk   2)" in out and "fast/vmap speedup" in out


def test_tiny_run_bf16_and_both_layouts(tmp_path):
    argv = ["--models", "resnet20", "--batch", "2", "--ns", "2", "--chunk", "2", "--repeats",
            "1", "--no-memory", "--amp", "none,bf16", "--layouts", "nchw,channels_last",
            "--groups", "1", "--out", str(tmp_path)]
    assert run(bench_prune.main, argv) == 0
    rows = io.read_csv(tmp_path / "bench_prune_cpu.csv")
    configs = {(r["amp"], str(r["channels_last"])) for r in rows if r["what"] == "mc_step"}
    assert configs == {("none", "False"), ("none", "True"), ("bf16", "False"), ("bf16", "True")}
    for r in rows:
        if r["what"] in ("fwd_fast", "fwd_module", "fwd_group1"):  # bf16: to its precision
            assert float(r["max_rel_diff"]) < (5e-2 if r["amp"] == "bf16" else 1e-5)
    assert {r["backend"] for r in rows} == {"loop"}
    assert len([r for r in rows if r["what"] == "fwd_module"]) == 4
    assert len([r for r in rows if r["what"] == "fwd_group1"]) == 4
    for r in rows:  # an MC step's ratio is against the dense forward timed beside it
        if r["what"] == "mc_step":
            assert math.isclose(float(r["per_dense_forward"]),
                                float(r["ms_median"]) / (2 * float(r["dense_forward_ms"])))


def test_in_process_peak_branch_restores_the_chunk():
    """The in-process peak measurement (the cuda branch, run here on a CPU setup) measures a
    step with the requested chunk and leaves --chunk as it was."""
    args = bench_prune.check_args(bench_prune.build_parser().parse_args(
        ["--models", "lenet", "--batch", "4", "--ns", "4", "--chunk", "2"]))
    setup = bench_prune.Setup("lenet", args)
    args.device = "cuda"  # only selects the in-process branch; the setup stays on the CPU
    peak = bench_prune._peak(args, "lenet", "mc_step", 4, setup, chunk=4)
    assert args.chunk == 2
    # a CPU resident-set difference in a warm process: finite, possibly slightly negative
    assert isinstance(peak, float) and math.isfinite(peak)
