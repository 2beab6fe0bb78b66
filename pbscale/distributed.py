"""Sample parallelism inside one run with ``torch.distributed``: the n samples of each MC step
are split over K ranks (``torchrun --nproc_per_node K -m pbscale.regress ... --n 100``).

Every rank holds the same logits r, the same loop generator (seeded with the run's seed) and
therefore the same minibatch and the same sample stream: each chunk of samples is drawn in full
on every rank (Bernoulli bits, or ARMS's copula, whose stick-breaking is sequential over the n
samples, from the generator all ranks share) and each rank evaluates the loss only on its own
rows of the chunk, :meth:`Shard.rows` (the network forward, the expensive part, is split K
ways; drawing is repeated, it is cheap). The estimator sums of :class:`pbexact.estimators.
SampleSums` (k, sum J, U, B) are then combined with ONE all-reduce per step
(:meth:`Shard.reduce`) and every rank finishes the same estimate, so r, the optimizer state and
the generator stay identical on all ranks, and the result equals the single-process run up to
float round-off (the order of the sums differs). Pair estimators (DisARM) split whole pairs.

Rank 0 writes the run folder under ``--out``; rank i > 0 keeps its own copy (checkpoints,
history) under ``OUT/.rank<i>/``, from which it resumes, so that resuming needs no broadcast
and a test can check that all ranks hold identical masks at every checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from pbexact.errors import PBInputError


@dataclass
class Shard:
    """This process's share of the samples: rank in 0..world-1."""

    rank: int
    world: int

    def rows(self, k: int, pairs: bool = False) -> slice:
        """This rank's rows of a chunk of k samples: a contiguous block, sizes differing by at
        most one (by at most one pair with ``pairs``)."""
        unit = 2 if pairs else 1
        units = k // unit
        lo = self.rank * units // self.world
        hi = (self.rank + 1) * units // self.world
        return slice(lo * unit, hi * unit)

    def reduce(self, count: int, sum_j: torch.Tensor, U: torch.Tensor, B: torch.Tensor
               ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sum (count, sum J, U (P,), B (P,)) over the ranks with one all-reduce (float64)."""
        P = U.numel()
        flat = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=U.device),
                          sum_j.reshape(1).to(torch.float64), U.reshape(-1).to(torch.float64),
                          B.reshape(-1).to(torch.float64)])
        dist.all_reduce(flat)
        dt = U.dtype
        return (int(round(float(flat[0]))), flat[1].to(dt), flat[2:2 + P].to(dt).view_as(U),
                flat[2 + P:].to(dt).view_as(B))


def from_env(device: torch.device | str = "cpu") -> Shard | None:
    """The process group of a ``torchrun`` launch (WORLD_SIZE > 1 in the environment): gloo on
    the CPU, nccl on CUDA (each rank on GPU LOCAL_RANK); None when not launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    dev = torch.device(device)
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return Shard(dist.get_rank(), dist.get_world_size())


def rank_out(out: str | Path, shard: Shard | None) -> Path:
    """Where this rank writes its run folder: ``out`` (rank 0, or no shard), else
    ``out/.rank<i>``."""
    if shard is None or shard.rank == 0:
        return Path(out)
    return Path(out) / f".rank{shard.rank}"


def check_method(method: str, shard: Shard | None) -> None:
    """Sample parallelism splits MC samples; other methods have none to split."""
    from .methods import MC_METHODS
    if shard is not None and method not in MC_METHODS:
        raise PBInputError(f"{method} draws no MC samples to split over ranks; run it without "
                           f"torchrun (sample parallelism is for {', '.join(MC_METHODS)})")


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
