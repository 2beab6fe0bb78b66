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
history) under ``OUT/.rank<i>/``, so that a test can check that all ranks hold identical masks
at every checkpoint. ``pbscale.prune`` runs resume every rank from rank 0's checkpoint
(:func:`sync_resume_files`), so a relaunch with missing or stale copies (a rank killed before
its last checkpoint, another K) resumes consistently; ``pbscale.regress`` resumes each rank
from its own copy. A SIGTERM seen by
any rank stops every rank before the same step (:func:`pbscale.runs.loop.run` all-reduces the flag
once per step on the host, :func:`any_rank`), so the ranks' checkpoints always describe the same
step.

Data parallelism (``torchrun -m pbscale.prune`` with CP, MP, GMP or dense, supermask or joint):
every rank draws the same minibatch (the loop's shared generator; CIFAR augmentation of the
whole batch from the task's shared generator), evaluates the network on its own contiguous rows
of it (:class:`DataParallelLoss`) and the gradients are averaged over the ranks before any
optimizer steps (:class:`GradAverage`), so the ranks stay identical. Rank i's loss is the mean
over its rows weighted by K times its share of the batch (n_i K / B), so the average of the K
gradients is the gradient of the full-batch mean also for uneven splits; the loss VALUE each
rank sees is the full-batch mean (the K weighted means summed by an all-reduce of the k values
in the forward), so training losses, CP's hard-mask loss and histories are the single-process
ones to round-off. Joint MC runs keep the sample split (:class:`SampleParallel`): the estimator
sums are all-reduced inside the estimate as in supermask runs, each rank's samples are evaluated
on the whole minibatch and the weight gradient of its share of (1/n) sum_s J_s is averaged with
the others' after scaling by K (their sum: the single-process weight gradient); that is a
second all-reduce per step, after the backward pass (the sums are needed before it). In the
dense warm-up and frozen epochs of joint MC runs (one fixed mask) the batch is split as above.

Why not ``DistributedDataParallel``: DDP averages gradients from hooks that its own
``forward`` arms; the masked forward (:class:`pbscale.forward.masks.MaskedModule`:
``functional_call`` under ``vmap``, or the batched-matmul fast path of LeNet) calls the wrapped
module's functions directly, so DDP's hooks never fire and gradients silently stay per rank
(checked: a DDP-wrapped LeNet evaluated through ``MaskedModule.loss_fn`` ends the backward pass with
unaveraged gradients; the same net through ``DDP.forward`` averages them). CP's mask logits are no
module parameter either. So :class:`GradAverage` does what DDP does, as one flat all-reduce of every
gradient (weights, and CP's logits) per step, run as a step pre-hook of the run's optimizers
(``torch.optim.Optimizer.register_step_pre_hook``), armed once per step by the task's
``batch_loss``: the first optimizer to step after the backward pass averages everything, the
others find it done. No bucketing or overlap with the backward
pass (DDP's speed-ups): at LeNet's 266,610 weights one flat buffer is 1 MB.

BatchNorm: each rank normalizes with the statistics of its own rows (as DDP without
SyncBatchNorm: ``torch.nn.SyncBatchNorm`` refuses CPU tensors (checked), so gloo could not test
it, and it is untried under the masked forward's ``vmap``), so a BN network is not the
single-process run: equality holds for BN-free nets (LeNet, Conv6). The running
statistics are averaged over the ranks (weighted by their shares) in the same all-reduce, so
every rank holds identical buffers; mask methods recompute them for the evaluation mask anyway.
In MC runs (sample split) the running statistics that training updates differ by rank between
evaluations (each rank saw other masks); training never reads them and the evaluation recomputes
them identically on every rank. Dropout draws per rank: nets with dropout are equal in law only.

Evaluation is split too: validation, test and training-accuracy batches (and the batches on
which MC runs score their candidate evaluation masks) are dealt round-robin to the ranks and the
sums (loss, correct, count; the candidates' losses) all-reduced, so every rank ends with the
same metrics and state at about 1/K of the work.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pbexact.io import atomic_write_bytes
from pbscale.runs.contracts import RunHooks


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


#: A gloo group beside an nccl default group, for host-side flags (:func:`any_rank`).
_HOST_GROUP = None


def any_rank(value: bool) -> bool:
    """Whether ``value`` is True on any rank (every rank calls it at the same point): one
    all-reduce of a CPU tensor, over the default group under gloo and over a gloo group made at
    the first call under nccl, so that reading the answer never waits for a GPU stream (an nccl
    all-reduce read back by ``.item()`` would synchronize the host with the GPU every step)."""
    global _HOST_GROUP
    group = None
    if dist.get_backend() != "gloo":
        if _HOST_GROUP is None:
            _HOST_GROUP = dist.new_group(backend="gloo")  # collective: every rank is here
        group = _HOST_GROUP
    t = torch.tensor([float(value)])
    dist.all_reduce(t, group=group)
    return bool(t[0] > 0)


def rank_out(out: str | Path, shard: Shard | None) -> Path:
    """Where this rank writes its run folder: ``out`` (rank 0, or no shard), else
    ``out/.rank<i>``."""
    if shard is None or shard.rank == 0:
        return Path(out)
    return Path(out) / f".rank{shard.rank}"


class _RankShare(torch.autograd.Function):
    """x -> its sum over the ranks (``reduce``) or x itself; the backward pass multiplies the
    gradient by K = world, so that the AVERAGE over the ranks of the gradients that reach the
    parameters is the gradient of the summed loss (what :class:`GradAverage` forms)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, world: int, reduce: bool) -> torch.Tensor:
        ctx.world = world
        out = x.detach().clone()
        if reduce:
            dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g * ctx.world, None, None


class DataParallelLoss:
    """A batched loss f(z (k, d)) -> (k,) of one minibatch of B rows under torch.distributed,
    from ``make(rows)``: the loss of rows ``rows`` (a slice of 0..B) of the batch, the mean over
    those rows (e.g. ``MaskedModule.loss_fn`` of the rows' inputs; called lazily, so a rank
    gathers and converts only the rows it uses).

    ``f(z)`` (data parallelism): this rank evaluates its rows :meth:`Shard.rows` (B) only; value:
    the full-batch mean (sum over ranks of share_i * mean_i, share_i = n_i / B, one all-reduce of
    k values), gradient: K share_i d mean_i (see :class:`_RankShare`). A rank without rows
    (a tail batch with B < K) contributes zero (the whole batch times 0, to stay in the graph).
    ``f.whole(z)`` (sample parallelism, MC): the whole batch on this rank's masks, value exact,
    gradient times K. ``on_split`` is called with share_i whenever the split form runs
    (:class:`GradAverage` then averages BatchNorm buffers)."""

    def __init__(self, make: Callable[[slice], Callable], B: int, shard: Shard,
                 on_split: Callable[[float], None] | None = None) -> None:
        self.rows = shard.rows(B)
        self.share = (self.rows.stop - self.rows.start) / max(B, 1)
        self.world = shard.world
        self.on_split = on_split
        self.make, self.B = make, B
        self._local: Callable | None = None
        self._full: Callable | None = None

    def full(self, z: torch.Tensor) -> torch.Tensor:
        if self._full is None:
            self._full = self.make(slice(0, self.B))
        return self._full(z)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.on_split is not None:
            self.on_split(self.share)
        if self.rows.stop == self.rows.start:  # no rows here: zero, but in the autograd graph
            part = self.full(z) * 0.0
        else:
            if self._local is None:
                self._local = self.make(self.rows)
            part = self._local(z) * self.share
        return _RankShare.apply(part, self.world, True)

    def whole(self, z: torch.Tensor) -> torch.Tensor:
        return _RankShare.apply(self.full(z), self.world, False)


class RankSync(RunHooks):
    """The run-loop strategy of every torchrun run (:class:`pbscale.runs.loop.RunHooks`): a SIGTERM
    seen by any rank stops every rank before the same step (:func:`any_rank`, one host-side
    all-reduce of the flag per step)."""

    def stop_requested(self, flag: bool) -> bool:
        return any_rank(flag)


class SampleParallel(RankSync):
    """The strategy of a method whose samples are split over the ranks (an MC
    :class:`pbscale.methods.MaskTrainer`, :func:`rank_strategy`): each rank's samples are
    evaluated on the whole minibatch (:meth:`DataParallelLoss.whole`) while masks train; the
    fixed mask of warm-up and frozen epochs, which the loop evaluates itself, takes the
    data-parallel split."""

    def training_loss(self, f: Callable) -> Callable:
        return f.whole if isinstance(f, DataParallelLoss) else f


def rank_strategy(method: Any, shard: Shard) -> tuple[list[RunHooks], list[torch.Tensor]]:
    """How a run's method executes under torchrun, chosen here from its family's capabilities
    (the method itself knows no ranks): a method whose samples split over the ranks
    (``caps.split_samples``, the MC estimators) is given the shard, so that each step evaluates
    this rank's rows (:class:`SampleParallel`); any other runs data-parallel
    (:class:`RankSync`), the gradients of the parameters its optimizers step (a logits method's
    r) averaged with the weights'. Returns (the run loop's hooks, the parameters whose gradients
    data parallelism averages)."""
    if method.family.caps.split_samples:
        method.shard = shard
        return [SampleParallel()], []
    params = [p for opt in method.optimizers for g in opt.param_groups for p in g["params"]]
    return [RankSync()], params


class GradAverage:
    """The gradients of ``params`` averaged over the ranks in ONE flat all-reduce per step
    (float32 or the parameters' dtype; a parameter whose gradient is None on every rank keeps
    None, one missing on some ranks counts as zero there), together with the floating
    ``buffers`` (BatchNorm running statistics) after a data-parallel step, each rank's weighted
    by K share_i so that the average is their share-weighted mean.

    :meth:`track` adds parameters and registers :meth:`sync` as a step pre-hook on the
    optimizers that step them; :meth:`new_step` (called once per step on every rank, by the
    task before its forward) arms it, and the first optimizer to step runs it, so every rank
    all-reduces at the same point. With no parameters it does nothing."""

    def __init__(self, shard: Shard, params: Sequence[torch.Tensor] = (),
                 buffers: Sequence[torch.Tensor] = ()) -> None:
        self.shard = shard
        self.params = list(params)
        self.buffers = [b for b in buffers if b.is_floating_point()]
        self.pending = False
        self.share: float | None = None

    def attach(self, optimizers: Iterable[torch.optim.Optimizer]) -> GradAverage:
        for opt in optimizers:
            opt.register_step_pre_hook(lambda *_: self.sync())
        return self

    def track(self, params: Sequence[torch.Tensor],
              optimizers: Iterable[torch.optim.Optimizer]) -> GradAverage:
        """Average the gradients of ``params`` too, before the first of ``optimizers`` steps
        (nothing when there are no parameters at all)."""
        self.params += list(params)
        if self.params:
            self.attach(optimizers)
        return self

    def new_step(self) -> None:
        self.pending, self.share = True, None

    def split(self, share: float) -> None:
        self.share = share

    @torch.no_grad()
    def sync(self) -> None:
        if not self.pending or not self.params:
            return
        self.pending = False
        K = self.shard.world
        ref = self.params[0]
        grads = [p.grad.reshape(-1) if p.grad is not None
                 else torch.zeros(p.numel(), dtype=ref.dtype, device=ref.device)
                 for p in self.params]
        has = torch.tensor([float(p.grad is not None) for p in self.params], dtype=ref.dtype,
                           device=ref.device)
        bufs = ([(b.reshape(-1) * (K * self.share)).to(ref.dtype) for b in self.buffers]
                if self.share is not None else [])
        flat = torch.cat([*grads, has, *bufs])
        dist.all_reduce(flat)
        n = sum(p.numel() for p in self.params)
        flat[:n].div_(K)
        counts = flat[n:n + len(self.params)].tolist()
        pos = 0
        for p, c in zip(self.params, counts):
            g = flat[pos:pos + p.numel()].view_as(p)
            pos += p.numel()
            if p.grad is not None:
                p.grad.copy_(g)
            elif c > 0:
                p.grad = g.clone()
        if bufs:
            pos = n + len(self.params)
            for b in self.buffers:
                b.copy_(flat[pos:pos + b.numel()].view_as(b).div_(K))
                pos += b.numel()


#: The files of a run folder that decide where a run resumes (:func:`pbscale.runs.loop.run`).
RESUME_FILES = ("checkpoint.pt", "summary.json")


def sync_resume_files(folder: str | Path, shard: Shard, device: torch.device | str = "cpu"
                      ) -> None:
    """Before a distributed run starts or resumes, every rank takes rank 0's ``checkpoint.pt``
    and ``summary.json`` (as raw bytes, broadcast as uint8 tensors; a file rank 0 lacks is
    removed on the others). All ranks hold identical state at every checkpoint, so rank 0's is
    every rank's; this keeps a relaunch consistent when the ranks' own files disagree: a rank
    killed before writing its last checkpoint, a new node without them, or another K. ``folder``
    is this rank's run folder (:func:`rank_out`)."""
    dev = torch.device(device)
    for name in RESUME_FILES:
        path = Path(folder) / name
        data = path.read_bytes() if shard.rank == 0 and path.is_file() else None
        size = torch.tensor([-1 if data is None else len(data)], dtype=torch.int64, device=dev)
        dist.broadcast(size, 0)
        n = int(size.item())
        if shard.rank > 0 and n < 0:
            if path.is_file():
                path.unlink()
            continue
        if n < 0:
            continue
        buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev) if shard.rank == 0
               else torch.empty(n, dtype=torch.uint8, device=dev))
        if n:
            dist.broadcast(buf, 0)
        if shard.rank > 0:
            atomic_write_bytes(path, buf.cpu().numpy().tobytes())


def all_sum(values: Sequence[float] | torch.Tensor, shard: Shard | None) -> torch.Tensor:
    """The sums over the ranks of a few numbers (float64, on the CPU for gloo), or the numbers
    themselves without a shard."""
    t = torch.as_tensor(values, dtype=torch.float64).clone()
    if shard is not None:
        dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = t.to(dev)
        dist.all_reduce(t)
    return t.cpu()


def shutdown() -> None:
    global _HOST_GROUP
    _HOST_GROUP = None
    if dist.is_initialized():
        dist.destroy_process_group()
