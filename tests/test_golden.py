"""Golden results: short CPU runs of every training path, compared bit for bit (==) with the
numbers recorded in ``tests/golden/results.json``.

Covered: ``pbscale.regress`` with every method of the registry and, for the MC estimators, every
parametrization; ``pbscale.prune`` with CP, ARMS, DisARM (supermask), GMP (joint), a joint ARMS
run (dense warm-up, frozen masks) and dense on synthetic data; one batched-seeds group; microworld
runs of the exact core and of the torch methods. Each entry holds the final metrics (float repr
exact), the run folder's name (the configuration hash: existing runs must resume) and a SHA-256
of the final mask logits or mask bits.

The file is written by ``python tests/test_golden.py --regenerate`` (only when a change is meant
to alter numbers; say so in the commit).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

GOLDEN = Path(__file__).parent / "golden" / "results.json"


def _digest(t: torch.Tensor | np.ndarray) -> str:
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def _clean(row: dict) -> dict:
    """Numbers of a history/summary row, timings and paths left out; floats as repr."""
    out = {}
    for k, v in row.items():
        if k.endswith("seconds") or k.endswith("seconds_per_epoch") or k in ("device", "folder"):
            continue
        out[k] = repr(float(v)) if isinstance(v, float) else v
    return out


def _tiny_problem():
    from pbscale.regression import make_problem
    return make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))


def _regress_cases() -> list[tuple[str, str, int]]:
    from pbexact.estimators import MC_ESTIMATORS
    from pbexact.parametrizations import PARAMETRIZATIONS
    cases = [(m, p, 4) for m in MC_ESTIMATORS for p in PARAMETRIZATIONS]
    return cases + [(m, "sigmoid", 4) for m in ("cp", "st", "rebar", "relax")]


def regress_results(tmp: Path) -> dict:
    from pbscale import io, regress
    from pbscale.loop import read_state
    from pbscale.methods import MethodConfig
    problem = _tiny_problem()
    out = {}
    for method, param, n in _regress_cases():
        cfg = MethodConfig(method=method, n=n, param=param, lr=0.05, seed=1, chunk=3)
        folder = regress.train(cfg, epochs=2, out=tmp / "regress", device="cpu",
                               progress=False, problem=problem)
        rows = io.read_csv(folder / "history.csv")
        state = read_state(folder / "checkpoint.pt")
        out[f"{method}-{param}"] = {"folder": folder.name, "history": [_clean(r) for r in rows],
                                    "r": _digest(state["method"]["r"])}
    return out


PRUNE_CASES = {
    "cp": dict(method="cp"),
    "arms": dict(method="arms"),
    "disarm": dict(method="disarm", param="sigmoid"),
    "gmp": dict(method="gmp", mode="joint", target=0.3),
    "dense": dict(method="dense"),
    "arms-joint": dict(method="arms", mode="joint", epochs=3),
}


def prune_results(tmp: Path) -> dict:
    from pbscale import prune
    out = {}
    for name, kw in PRUNE_CASES.items():
        base = dict(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8, n=2,
                    val_size=16, gmp_every=1, seed=2)
        base.update(kw)
        summary = prune.run(prune.PruneConfig(**base), tmp / "prune", quiet=True)
        folder = Path(summary["folder"])
        blob = torch.load(folder / "masks.pt", weights_only=True)
        masks = {k: _digest(v) for k, v in sorted(blob.items()) if not k.startswith("weight.")}
        out[name] = {"folder": folder.name, "summary": _clean(summary), "masks": masks}
    return out


def batched_results(tmp: Path) -> dict:
    from pbscale.batched_seeds import train_batched
    from pbscale.methods import MethodConfig
    configs = [MethodConfig("loorf", 4, "sigmoid", lr, seed=s) for lr in (0.1, 0.03)
               for s in (0, 1)]
    hist = train_batched(configs, 2, _tiny_problem(), out=tmp / "batched")
    return {"histories": [[_clean(r) for r in h] for h in hist],
            "folders": sorted(p.name for p in (tmp / "batched").iterdir()
                              if not p.name.startswith("."))}


def microworld_results() -> dict:
    from analysis.microworld_hybrid import run_torch
    from analysis.microworld_runs import run_exact
    from pbexact.vertices import vertices
    c = np.array([0.2, 0.7, 0.4, 0.9])
    J = ((vertices(4) - c) ** 2).sum(-1)

    def f(z: torch.Tensor) -> torch.Tensor:
        return ((z - torch.as_tensor(c)) ** 2).sum(-1)

    out = {}
    for method, n, param in (("arms", 4, "escort"), ("disarm", 4, "sigmoid"),
                             ("reinforce", 1, "direct"), ("true", 0, "cosine")):
        t = run_exact(J, method, n, param, 0.1, 30, 5, seed=3, log_every=10)
        out[f"exact-{method}"] = {"mean": [repr(float(v)) for v in t.mean],
                                  "theta": _digest(t.final_theta)}
    for method in ("cp", "st", "rebar", "relax"):
        t = run_torch(f, J, method, 2, 0.1, 30, 4, seed=3, log_every=10)
        out[f"torch-{method}"] = {"mean": [repr(float(v)) for v in t.mean],
                                  "theta": _digest(t.final_theta)}
    return out


SECTIONS = {
    "regress": regress_results,
    "prune": prune_results,
    "batched": batched_results,
    "microworld": lambda tmp: microworld_results(),
}


def compute(section: str) -> dict:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(json.dumps(SECTIONS[section](Path(tmp))))


@pytest.mark.parametrize("section", list(SECTIONS))
def test_golden_results_are_bit_identical(section):
    golden = json.loads(GOLDEN.read_text())
    got = compute(section)
    want = golden[section]
    assert set(want) <= set(got)  # a method added later has no golden entry yet
    for key in want:
        assert got[key] == want[key], f"{section}/{key} differs from tests/golden/results.json"


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit("usage: python tests/test_golden.py --regenerate")
    data = {s: compute(s) for s in SECTIONS}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
