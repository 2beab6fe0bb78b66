"""Run by tests/test_distributed_prune.py under ``torch.distributed.run`` (gloo, K ranks) or
alone (K = 1): tiny ``pbscale.prune`` runs (LeNet on synthetic images, CP supermask and joint,
dense, MP, GMP, ARMS joint; a BatchNorm ResNet-20) through :func:`pbscale.prune.run`, the way
``torchrun -m pbscale.prune`` runs them. Before the first step of every epoch (and after the
run) it records the SHA-256 of every tensor of the run's latest checkpoint (weights, masks,
logits, optimizer state, BatchNorm buffers) in ``ckpt<rank>.json``, so that the test can check
that the ranks hold identical state at every checkpoint.

argv: OUT CASES [CASE:RANK:EPOCH:STEP ...] (CASES comma-separated; each trailing item sends
SIGTERM to that rank only, before that step of that case: every rank must stop there)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path

import torch

from pbexact.errors import RunInterrupted
from pbscale.execution import distributed
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun

#: Epochs whose checkpoints are kept whole (ckpt<epoch>.pt beside checkpoint.pt): the MC run's
#: trajectories are equal in law only once a round-off difference in theta flips a sampled bit,
#: so its single-process comparison looks at the first MC steps.
KEEP = {"arms-joint": (1, 2, 3)}
#: LeNet runs: batch 75 splits 37 / 38 over 2 ranks (uneven shares); 5 epochs of 2 steps (the
#: joint CP run's last epoch frozen); ARMS joint: 10 epochs of 1 step, so that it has a dense
#: warm-up epoch (0), MC epochs 1-7 and frozen epochs 8-9.
BASE = dict(model="lenet", synthetic=256, batch_size=75, epochs=5, max_batches=2, n=4,
            eval_masks=3, eval_batches=3, gmp_every=2)
CASES = {
    "cp-supermask": dict(method="cp", mode="supermask", lam=1e-4),
    "cp-joint": dict(method="cp", mode="joint", lam=1e-4),
    "dense": dict(method="dense", mode="joint"),
    "mp": dict(method="mp", mode="joint"),
    "gmp": dict(method="gmp", mode="joint"),
    "arms-joint": dict(method="arms", mode="joint", chunk=3, epochs=10, max_batches=1),
    # the methods beyond the paper: one mask (gates, top scores) per step, batches split
    "st-theta-joint": dict(method="st-theta", mode="joint", lam=1e-4, param="sigmoid"),
    "hardconcrete-joint": dict(method="hardconcrete", mode="joint", lam=1e-4),
    "edgepopup": dict(method="edgepopup", mode="supermask", target=0.3),
    # batches of 85, 85, 85 and 1 row: in the last step rank 1 has no rows
    "dense-tail": dict(method="dense", mode="joint", batch_size=85, max_batches=0, epochs=1),
    # BatchNorm: ranks must stay identical (not equal to one process: per-rank statistics)
    "resnet-dense": dict(model="resnet20", synthetic=24, batch_size=8, epochs=2, mode="joint",
                         method="dense"),
    "resnet-cp": dict(model="resnet20", synthetic=24, batch_size=8, epochs=2, mode="joint",
                      method="cp"),
}


def digest(obj, prefix: str = "") -> dict[str, str]:
    """{path: sha256 of the tensor's bytes} over a nested checkpoint."""
    out: dict[str, str] = {}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        out[prefix] = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(digest(v, f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(digest(v, f"{prefix}/{i}"))
    return out


def checkpoint_digest(folder: Path) -> dict[str, str]:
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    keep = {k: state[k] for k in ("method", "task", "weights", "weight_opt", "fixed")}
    return digest(keep)


def main() -> None:
    out, cases = Path(sys.argv[1]), sys.argv[2].split(",")
    stops = [s.split(":") for s in sys.argv[3:]]
    torch.set_num_threads(1)
    shard = distributed.from_env("cpu")
    rank = 0 if shard is None else shard.rank
    record_path = out / f"ckpt{rank}.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    for case in cases:
        cfg = pconfig.PruneConfig(**{**BASE, **CASES[case]})
        root = distributed.rank_out(out / case, shard)
        seen = record.setdefault(case, {})

        def hook(epoch: int, i: int, case=case, root=root, seen=seen, cfg=cfg) -> None:
            for c, r, e, s in stops:
                if (c, int(r), int(e), int(s)) == (case, rank, epoch, i):
                    os.kill(os.getpid(), signal.SIGTERM)
            if i == 0 and epoch > 0:
                (folder,) = root.glob(f"{cfg.model}-*")
                seen[str(epoch)] = checkpoint_digest(folder)
                if epoch in KEEP.get(case, ()):
                    (folder / f"ckpt{epoch}.pt").write_bytes((folder / "checkpoint.pt")
                                                            .read_bytes())

        try:
            summary = prun.run(cfg, out / case, quiet=True, step_hook=hook, shard=shard)
            seen[str(cfg.epochs)] = checkpoint_digest(Path(summary["folder"]))
        except RunInterrupted as e:  # SIGTERM: checkpointed; the next launch resumes
            seen["stopped"] = int(e.code)
        record_path.write_text(json.dumps(record))
    distributed.shutdown()


if __name__ == "__main__":
    main()
