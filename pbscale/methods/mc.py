"""The MC estimators (`ch:monte_carlo`) over mask logits, chunked: every estimator of the
pbexact registry that needs no J table (REINFORCE, LOORF, ARMS, DisARM).

The n samples of one step are drawn by the estimator's law (:mod:`pbscale.methods.samplers`) and
evaluated in chunks of k, summed by pbexact's one accumulator (`SampleSums`: k, sum J,
U = sum J S, B = sum S) and finished by the estimator's linear form (`alg:iter_reinforce`,
`alg:iter_loorf`, `alg:iter_arms`; ARMS with the iterative Dirichlet copula of `alg:iter_dir`), so
memory is O(k d) whatever n is and the gradient equals the one-shot batch form on the same
samples. Scores come from the pbexact parametrizations' affine reading (`tab:alternative_param`,
`Parametrization.affine_score`), never as a (k, P) matrix. :func:`mc_surrogate` gives the same
estimate as a surrogate loss for autograd; :func:`dense_regularizer` the closed-form L0 term.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pbexact.errors import PBInputError
from pbexact.estimators import MC_ESTIMATORS, EstimatorSpec, SampleSums, get_estimator
from pbexact.estimators import REGISTRY as ESTIMATOR_REGISTRY
from pbexact.estimators import register as add_estimator
from pbexact.parametrizations import Parametrization
from pbscale.runs.contracts import BatchedLoss

from .counter_stream import CounterStream
from .estimate import Estimate, surrogate_loss
from .fused import fused_estimate, fused_gradient
from .registry import MC_GAMMA, MC_MILESTONES, MC_START, Capabilities, Pruning, register
from .samplers import SAMPLERS, PerRunSampler
from .trainer import Gradient, LogitsFamily, StepArgs


def mc_gradient(f: BatchedLoss, r: torch.Tensor, param: Parametrization, estimator: str, n: int,
                generator: torch.Generator | CounterStream | Sequence[torch.Generator] | None
                = None, chunk: int | None = None, sampler: Any = None, shard: Any = None,
                fused: bool = True, keep_masks: bool = True) -> Estimate:
    """The estimate of grad_r E[J(z)] by a registered MC estimator (REINFORCE, LOORF, ARMS,
    DisARM) from n samples evaluated k = chunk at a time (`alg:iter_loorf`, `alg:iter_arms`);
    r of shape (P,), f: (k, d) -> (k,). Pair estimators (DisARM) take chunks of whole pairs
    (an odd chunk is rounded down, at least 2).

    Leading dimensions batch independent runs: r of shape (..., P) (e.g. (G, P) for G runs),
    f: (k, ..., d) -> (k, ...), and each run's estimate (grad (..., P), loss (...)) is its own,
    equal to a separate call on the same samples (to round-off). ``generator`` is then one
    generator for all runs, or a sequence of one generator per run (leading index flattened,
    :class:`PerRunSampler`), so that run g's samples are those a separate call with its
    generator draws. The samples' stream does not depend on the chunking when k d is even.

    ``generator`` may be a :class:`CounterStream` (the CPU's counter-based stream of MC samples,
    r (P,) on the CPU): the samples are then drawn and summed by the fused kernels of
    :mod:`pbscale.methods.fused` (``fused=False``: the same samples through the torch samplers
    and :class:`SampleSums`, the unfused reference; equal masks, equal estimates to round-off).
    ``keep_masks``: f may keep the masks it is given past its call (autograd: joint training),
    so the fused path gives each chunk fresh memory; False lets it reuse two buffers.

    ``sampler`` (an object with ``next(k) -> (k, ..., d)``) replaces the default sampler of the
    estimator's law, e.g. to replay given samples. ``shard`` (a
    :class:`pbscale.execution.distributed.Shard`): every chunk is drawn in full but f is evaluated
    on this rank's rows only, and the sums are combined over the ranks by one all-reduce.
    """
    spec = get_estimator(estimator)
    if spec.needs_table:
        raise PBInputError(
            f"{spec.text} needs the whole J table; pbscale runs {', '.join(MC_ESTIMATORS)}"
        )
    spec.check_n(n)
    chunk = n if chunk is None else max(1, min(int(chunk), n))
    if spec.law == "antithetic":  # chunks and rank shares hold whole pairs
        chunk = max(2, chunk - chunk % 2)
    lead = tuple(r.shape[:-1])
    with torch.no_grad():
        use_fused = (fused and sampler is None and isinstance(generator, CounterStream)
                     and not lead and r.device.type == "cpu")
        if use_fused:
            sums, extra, total = fused_gradient(f, r.detach(), param, spec, n, generator, chunk,
                                                shard, keep_masks)
        else:
            sums, extra, total = _sampled_sums(f, r.detach(), param, spec, n, generator, chunk,
                                               sampler, shard)
        if shard is not None:
            _reduce_sums(sums, shard, r)
            total = sums.sum_j
        loss = float(total) / n if not lead else total.cpu() / n  # the step's one read-back
        if use_fused:  # extra: the per-bit constant; the linear form in one kernel pass
            return Estimate(fused_estimate(sums, spec, extra, param), loss)
        return Estimate(sums.estimate(spec, extra), loss)


def _sampled_sums(f: BatchedLoss, r: torch.Tensor, param: Parametrization, spec: EstimatorSpec,
                  n: int, generator: Any, chunk: int, sampler: Any, shard: Any
                  ) -> tuple[SampleSums, Any, Any]:
    """The step's sums by the torch samplers (the unfused path): (sums, extra, total J on the
    device, float64 (...)); chunks of k (whole pairs for the antithetic law)."""
    whole = spec.law == "antithetic"  # chunks and rank shares hold whole pairs
    theta = param.theta(r)
    extra = spec.constant_of(theta, n, param)
    if sampler is None:
        if isinstance(generator, (list, tuple)):
            sampler = PerRunSampler(spec.law, theta, n, generator)
        else:
            sampler = SAMPLERS[spec.law](theta, n, generator)
    a, b = param.affine_score(r, theta)  # S = a + z b, never built in full
    sums = SampleSums(pairs=spec.center == "pair")  # pairs: the sums centre each pair
    total, done = 0.0, 0
    while done < n:
        k = min(chunk, n - done)
        z = sampler.next(k).to(r.dtype)  # (k, ..., d)
        done += k
        if shard is not None:
            z = z[shard.rows(k, whole)]
            if z.shape[0] == 0:
                continue
        J = f(z).to(r.dtype)  # (k, ...)
        # SampleSums takes the samples last: J (..., k), z (..., k, d) (no-ops without runs)
        sums.update_affine(J.movedim(0, -1), z.movedim(0, -2), a, b, param)
        total = total + J.sum(0).double()  # on the device: one read-back per step
    return sums, extra, total


def _reduce_sums(sums: SampleSums, shard: Any, r: torch.Tensor) -> None:
    """Replace this rank's (k, sum J, U, B) by their sums over the ranks (one all-reduce)."""
    if sums.count == 0:  # no rows here: zeros of the right shapes
        zero = torch.zeros_like(r)
        sums.sum_j = torch.zeros(r.shape[:-1], dtype=r.dtype, device=r.device)
        sums.U, sums.B = zero, zero
    sums.count, sums.sum_j, sums.U, sums.B = shard.reduce(sums.count, sums.sum_j, sums.U, sums.B)


def mc_surrogate(f: BatchedLoss, r: torch.Tensor, param: Parametrization, estimator: str, n: int,
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,
                 chunk: int | None = None,
                 sampler: Any = None) -> tuple[torch.Tensor, Estimate]:
    """:func:`mc_gradient` as a surrogate loss: (L, estimate) with L a 0-dim tensor whose value is
    the mean sampled loss and whose autograd gradient in r equals ``estimate.grad`` exactly
    (:func:`surrogate_loss`). r may require grad (then L.backward() writes the estimate into
    r.grad, plus the gradient of anything added to L); the samples are drawn as by
    :func:`mc_gradient`, so the same generator state gives the same estimate. With leading
    dimensions (r (..., P), one generator per run or one for all) L's value is the sum over the
    runs of their mean sampled losses and its gradient in each run's row of r is that run's
    estimate."""
    est = mc_gradient(f, r, param, estimator, n, generator, chunk, sampler)
    loss = est.loss if isinstance(est.loss, float) else float(est.loss.sum())
    # the value as a Python scalar: a tensor made from it on r's device would be a second,
    # blocking host-to-device copy per step on a GPU (`benchmarks/check_gpu_sync.py`)
    return surrogate_loss(est.grad, r, loss), est


class MCFamily(LogitsFamily):
    """An MC estimator of `pbexact.estimators.REGISTRY` as a method (one instance per estimator
    that needs no J table, registered below): the estimator's name, label, fewest samples and
    law; every parametrization; its n samples per step split over torchrun ranks and its
    supermask step capturable as a CUDA graph; evaluated by the best of sampled masks, with
    dynamic weight rescaling in pruning; the network weights train on the mean of J over the
    samples."""

    def __init__(self, spec: EstimatorSpec) -> None:
        self.spec = spec
        self.name, self.label, self.text, self.color = spec.name, spec.label, spec.text, spec.color
        self.caps = Capabilities(
            commands=("regress", "regress-group", "prune-supermask", "prune-joint"),
            uses=("n", "param", "lr", "optimizer", "chunk", "lam"), samples=True,
            min_samples=spec.min_samples, split_samples=True, captures_step=True,
            pruning=Pruning(eval_sampled=True, rescale=True,
                            mask_schedule=(MC_MILESTONES, MC_GAMMA), joint_warmup=MC_START,
                            channels=True))

    def check(self, config: Any) -> None:
        self.spec.check_n(config.n)

    def gradient(self, f: BatchedLoss, r: torch.Tensor, at: StepArgs) -> Gradient:
        """The step's estimate from n samples drawn from the run's stream (on the CPU its
        counter-based stream, through the fused kernels; on a GPU its generator), evaluated in
        chunks (this rank's rows under sample parallelism); for the weights, the mean of J
        over the n samples."""
        record: list[torch.Tensor] = []
        fn = f
        if at.weights:
            def fn(z: torch.Tensor) -> torch.Tensor:
                with torch.enable_grad():
                    J = f(z)
                record.append(J)
                return J.detach()
        source = at.stream if at.stream is not None else at.generator
        est = mc_gradient(fn, r, at.param, self.name, at.n, source, at.chunk, shard=at.shard,
                          keep_masks=at.weights)
        weight_loss = sum(J.sum() for J in record) / at.n if record else None
        return Gradient(est, at.param.theta, weight_loss)


for _spec in ESTIMATOR_REGISTRY.values():
    if not _spec.needs_table:
        register(MCFamily(_spec))


def register_estimator(spec: EstimatorSpec) -> MCFamily:
    """An estimator of pbexact's laws (:class:`pbexact.estimators.EstimatorSpec`) defined
    outside ``pbexact/estimators.py`` as a method of every MC command: added to pbexact's
    registry (exact variances, the microworld) and registered here; returns its family. (An
    estimator in that module's table needs no call: its family is made above.)"""
    if spec.needs_table:
        raise PBInputError(f"{spec.text} needs the whole J table; pbscale cannot run it")
    add_estimator(spec)
    family = MCFamily(spec)
    try:
        register(family)
    except ValueError:
        del ESTIMATOR_REGISTRY[spec.name]
        raise
    return family
