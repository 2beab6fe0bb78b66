"""benchmarks.bench_run_cost and benchmarks.profile_run: medians, ratios and goals from the
measured rows; one measured process; a profile of a tiny run names its phases."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import bench_run_cost as brc

ROOT = Path(__file__).resolve().parent.parent


def test_summary_medians_ratios_and_goals():
    rows = [{"case": "batch1", "code": code, "repeat": r, "wall_s": w, "cpu_s": w - 0.5,
             "peak_mib": m}
            for code, walls, m in (("current", (2.0, 9.0, 2.5), 480.0),
                                   ("baseline", (6.0, 7.0, 5.0), 1000.0))
            for r, w in enumerate(walls, 1)]
    rows.append({"case": "regress", "code": "current", "repeat": 1, "wall_s": 8.0,
                 "cpu_s": 7.5, "peak_mib": 400.0})
    cases = [brc.CASES["batch1"], brc.CASES["regress"]]
    batch1 = brc.summarize([r for r in rows if r["case"] == "batch1"], cases[:1],
                           ["current", "baseline"])[0]
    assert batch1["current_wall_s"] == 2.5 and batch1["baseline_wall_s"] == 6.0  # medians
    assert batch1["ratio_wall_s"] == 6.0 / 2.5 and batch1["ratio_peak_mib"] == 1000 / 480
    assert batch1["wall_met"] is True and batch1["peak_met"] is True  # <= 3 s, <= 500 MiB
    regress = brc.summarize(rows[-1:], cases[1:], ["current"])[0]
    assert regress["wall_met"] is False and regress["peak_met"] == ""  # 8 s > 7 s; no goal
    assert regress["baseline_wall_s"] == "" and regress["ratio_wall_s"] == ""
    text = brc.table([batch1, regress])
    assert "<= 3 s met" in text and "<= 7 s NOT met" in text


def test_one_process_is_measured():
    m = brc.run_once(ROOT, ("-c", "x = bytearray(200 << 20); x[::4096] = b'1' * len(x[::4096])"),
                     "")
    assert m["peak_mib"] > 200 and m["wall_s"] >= m["cpu_s"] * 0.5 > 0


def test_profile_of_a_tiny_run_names_its_phases(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile_run", "--", "--synthetic", "64",
         "--method", "arms", "--n", "4", "--epochs", "1", "--max-batches", "1",
         "--batch-size", "16", "--val-size", "16", "--quiet", "--out", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for phase in ("import torch", "build task and method", "make the mask optimizer",
                  "loop set-up with the first evaluation", "evaluation", "checkpoint",
                  "masks.pt and pruned.pt", "Numba compile or cache load"):
        assert phase in out, phase
    assert "torch._dynamo imported: False" in out and "exit 0" in out
