"""Hand-written pruning run folders (``config.json``, ``summary.json``, ``metrics.csv``) as
``python -m pbscale.prune`` writes them, for the analysis tests (scale_report, pareto)."""

import json
from pathlib import Path

#: LeNet-300-100's masked layers with the head: dense weights per layer.
LENET = {"fc1": 235200, "fc2": 30000, "fc3": 1000}


def write_prune(root: Path, mode: str, method: str, seed: int, remaining: float, acc: float,
                layers: dict[str, float], method_info: dict | None = None, **task) -> Path:
    """A hand-written pruning run folder (config.json, summary.json, metrics.csv); returns it."""
    t = {"model": "lenet", "dataset": "mnist", "mode": mode, "method": method, "param": "escort",
         "n": 10, "lam": 1e-4, "mask_opt": "rmsprop", "mask_lr": 0.01, "target": 0.1,
         "epochs": 4, "seed": seed, "mask_head": True, "mask_shortcuts": False, **task}
    name = f"{mode}-{method}-" + "-".join(f"{k}{v}" for k, v in sorted(task.items())) + f"-s{seed}"
    folder = root / name
    folder.mkdir(parents=True)
    cfg = {"task": t, **({"method_info": method_info} if method_info else {})}
    (folder / "config.json").write_text(json.dumps(cfg))
    summ = {"final_remaining": remaining, "final_test_acc": acc, "final_remaining_all": remaining}
    summ.update({f"final_remaining_{k}": v for k, v in layers.items()})
    (folder / "summary.json").write_text(json.dumps(summ))
    rows = ["epoch,test_acc,remaining," + ",".join(f"remaining_{k}" for k in layers)]
    for e in range(5):
        w = e / 4
        rows.append(f"{e},{acc * w:.4f},{1 - w + w * remaining}," + ",".join(
            f"{1 - w + w * v}" for v in layers.values()))
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    return folder


def layers_for(remaining: float, big_share: float) -> dict[str, float]:
    """Per-layer fractions with fc1 holding ``big_share`` of the weights left and fc2, fc3 the
    rest in proportion to their sizes."""
    total = remaining * sum(LENET.values())
    small = LENET["fc2"] + LENET["fc3"]
    return {"fc1": big_share * total / LENET["fc1"],
            "fc2": (1 - big_share) * total / small, "fc3": (1 - big_share) * total / small}


def write_diverged(root: Path, mode: str, method: str, seed: int, epoch: int = 3,
                   step: int | None = 1301, **task) -> Path:
    """A run folder as a diverged run leaves it: config.json and the record ``diverged.json``
    (epoch, step, where, reason, last_metrics), no summary.json."""
    from analysis.scale.run_files import DIVERGED

    folder = write_prune(root, mode, method, seed, 0.5, 0.5, {"fc1": 0.5, "fc2": 0.5,
                                                              "fc3": 0.5}, **task)
    (folder / "summary.json").unlink()
    (folder / DIVERGED).write_text(json.dumps(
        {"epoch": epoch, "step": step, "where": "mask logits", "reason": "NaN mask logits",
         "last_metrics": {"test_acc": 0.9}}))
    return folder
