"""Host synchronizations inside the steps of the MC estimators (ARMS, LOORF, DisARM, REINFORCE)
and CP on a GPU: runs each piece of a step a few times on the MaskedNNRegression problem
(d = 8,050, batch 100) and reports, per piece, "no sync", the known read-back of the step's
loss (one per step, by design: ``mc_gradient`` and CP's hard-mask loss in ``MaskTrainer``), or
the first other synchronizing call (file:line). Pieces: the copula (ARMS), Bernoulli (LOORF,
REINFORCE) and antithetic (DisARM) samplers over a step's chunks, the batched loss, a whole
optimizer step (``MaskTrainer.surrogate`` + backward + ``apply``) for each MC estimator with
the sigmoid and escort parametrizations, a batched ``MaskTrainerGroup`` step, a CP step, and
an ARMS step of joint training (masks and the backbone's weights, ``pbscale.runs.loop``'s step).

    python -m benchmarks.check_gpu_sync [--n 100] [--chunk 25] [--steps 3] [--emulate]

On a CUDA GPU it runs under ``torch.cuda.set_sync_debug_mode("warn")`` and reads the warnings
(file:line of each synchronizing call). Without one (or with ``--emulate``) it emulates the
GPU: every tensor of the step lives on torch's ``meta`` device (shapes and dtypes, no data),
so the code takes its non-CPU branches (those a CUDA device takes) and a
``TorchDispatchMode`` stops at every operation that would synchronize a CUDA stream with the
host: a value read back (``.item()``, ``float(t)``, ``bool(t)``, ``aten.equal``), an output
whose shape depends on the data (``nonzero``, boolean-mask indexing, ``masked_select``,
``unique``, ``bincount``, ``repeat_interleave`` without ``output_size``), a copy to the host,
and a blocking copy from the host. A known read-back is let through with a stand-in value
(0), at most once per step; anything else stops the piece and is reported with its line.
What the emulation cannot see: syncs inside CUDA kernels' host code that have no such
signature (e.g. cuBLAS or allocator behaviour), and code under ``device.type == "cuda"``
tests takes its other branch (in the pieces' step code there is none: such tests sit in set-up
(``auto_chunk``), per epoch (``pbscale.runs.loop``) and the conv-net backend choice of
``MaskedModule``, which the MLP here does not reach); the GPU mode covers those. An operation
that needs the data in another way (e.g. ``.numpy()``) fails on meta and is reported too. The
optimizers are switched to the multi-tensor (foreach) path torch takes on CUDA by default.

Exit code 0 when every piece is free of synchronizations other than the known read-backs, 1
otherwise.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import linecache
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pbexact.cli import ArgumentParser, positive_int

if TYPE_CHECKING:
    from pbscale.regression.problem import RegressionProblem

#: The device the emulated check puts a step's tensors on: shapes without data, not "cpu", so
#: the code takes the branches a CUDA device takes.
EMULATED = torch.device("meta")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
aten = torch.ops.aten

#: The read-backs made by design, at most once per step: (file under the repository, function)
#: -> what is read back.
LOSS_READBACK = ("pbscale/methods/mc.py", "mc_gradient")
#: CP's step reports its hard-mask loss through the shared reader of a step's loss
#: (:func:`pbscale.methods.sample_mean`, one value per run of a group).
CP_READBACK = ("pbscale/methods/estimate.py", "sample_mean")
READBACKS = {
    LOSS_READBACK: "the step's mean sampled loss",
    CP_READBACK: "CP's hard-mask loss (sample_mean)",
}


@dataclass
class Sync:
    """One synchronizing call: what it is, where (file:line (code)) and in which function."""

    what: str
    file: str
    line: int
    function: str
    code: str = ""

    @property
    def site(self) -> tuple[str, str]:
        return (self.file, self.function)

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function} ({self.code}): {self.what}"


class HostSyncError(RuntimeError):
    """An operation that would synchronize with the host, outside the allowed read-backs."""

    def __init__(self, sync: Sync) -> None:
        super().__init__(f"host synchronization at {sync}")
        self.sync = sync


@dataclass
class Verdict:
    """The outcome of one piece: its syncs in order and whether they are all allowed."""

    syncs: list[Sync] = field(default_factory=list)
    problem: str | None = None  # None: no sync other than the allowed read-backs

    @property
    def clean(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        if self.problem is not None:
            return self.problem
        if not self.syncs:
            return "no sync"
        s = self.syncs[0]
        return (f"no sync but the known read-back ({len(self.syncs)}x: {s.file}:{s.line} in "
                f"{s.function}, {READBACKS.get(s.site, 'allowed')})")


def _relative(filename: str) -> str:
    path = os.path.abspath(filename)
    return os.path.relpath(path, _ROOT) if path.startswith(_ROOT + os.sep) else filename


def _user_frame() -> traceback.FrameSummary | None:
    """The innermost frame of the caller's code (outside torch and this module's machinery)."""
    here = os.path.abspath(__file__)
    for fr in reversed(traceback.extract_stack()):
        path = os.path.abspath(fr.filename)
        if path.startswith(_TORCH_DIR) or (path == here and fr.name in _MACHINERY):
            continue
        return fr
    return None


@functools.cache
def _functions(filename: str) -> list[tuple[int, int, str]]:
    try:
        with open(filename) as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError):
        return []
    return [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _function_at(filename: str, lineno: int) -> str:
    """The innermost function of ``filename`` whose body holds line ``lineno`` ("?" if none)."""
    inside = [(end - start, name) for start, end, name in _functions(filename)
              if start <= lineno <= end]
    return min(inside)[1] if inside else "?"


def _verdict(syncs: list[Sync], allowed: dict[tuple[str, str], int], steps: int) -> Verdict:
    """All syncs must be at allowed sites, each at most its count per step times ``steps``."""
    v = Verdict(list(syncs))
    for s in syncs:
        if s.site not in allowed:
            v.problem = f"SYNC at {s}"
            return v
    for site, per_step in allowed.items():
        count = sum(s.site == site for s in syncs)
        if count > per_step * steps:
            first = next(s for s in syncs if s.site == site)
            v.problem = (f"SYNC: {count} read-backs in {steps} steps at {first.file}:{first.line} "
                         f"in {first.function}, at most {per_step} per step expected")
            return v
    return v


# ---------------------------------------------------------------------------------------------
# Emulation on the meta device


def _is_emulated(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == EMULATED.type


def _sync_reason(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str | None:
    """Why ``func`` on these arguments would synchronize a CUDA stream with the host, or None."""
    packet = func.overloadpacket
    if packet in (aten._local_scalar_dense, aten.is_nonzero, aten.equal):
        if any(_is_emulated(a) for a in args):
            return f"{packet.__name__}: a value read back to the host"
        return None
    if packet in _DATA_SHAPED:
        if any(_is_emulated(a) for a in args):
            return f"{packet.__name__}: an output shape that depends on the data"
        return None
    if packet is aten.repeat_interleave and kwargs.get("output_size") is None:
        if any(_is_emulated(a) for a in args):
            return "repeat_interleave without output_size: a data-dependent shape"
        return None
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        if _is_emulated(args[0]) and any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                for i in (args[1] or ())):
            return f"{packet.__name__} with a boolean mask: a nonzero on the device"
        return None
    if packet is aten._to_copy:
        src, dst = args[0], kwargs.get("device")
        dst = args[0].device if dst is None else torch.device(dst)
        if _is_emulated(src) and dst.type == "cpu":
            return "a copy to the host"
        if src.device.type == "cpu" and dst.type == EMULATED.type \
                and not kwargs.get("non_blocking", False):
            return "a blocking copy from the host"
        return None
    if packet is aten.copy_:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        if _is_emulated(src) and dst.device.type == "cpu":
            return "a copy to the host"
        if _is_emulated(dst) and isinstance(src, torch.Tensor) and src.device.type == "cpu" \
                and src.dim() > 0 and not non_blocking:
            return "a blocking copy from the host"
    return None


_DATA_SHAPED = {getattr(aten, name) for name in (
    "nonzero", "nonzero_numpy", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "bincount", "histc",
) if hasattr(aten, name)}


def _stand_in(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    """A value for an allowed read-back: 0 (its dtype), or a CPU tensor of zeros."""
    packet = func.overloadpacket
    if packet is aten._local_scalar_dense:
        t = args[0]
        return False if t.dtype == torch.bool else (0.0 if t.is_floating_point() else 0)
    if packet is aten.is_nonzero:
        return False
    if packet is aten._to_copy:
        src = args[0]
        return torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype, device="cpu")
    if packet is aten.copy_:
        return args[0].zero_()
    raise HostSyncError(Sync(f"{packet.__name__}: no stand-in value", "?", 0, "?"))


class SyncEmulator(TorchDispatchMode):
    """Records every operation that would synchronize with the host on a CUDA device (for
    tensors on :data:`EMULATED`); those at ``allowed`` sites ((file, function) of
    :data:`READBACKS`) get a stand-in value, any other raises :class:`HostSyncError`."""

    def __init__(self, allowed: set[tuple[str, str]] = frozenset()) -> None:
        super().__init__()
        self.allowed = set(allowed)
        self.syncs: list[Sync] = []

    def record(self, why: str) -> None:
        """Note a sync made by the caller's code; raise :class:`HostSyncError` unless allowed."""
        fr = _user_frame()
        sync = (Sync(why, _relative(fr.filename), fr.lineno or 0, fr.name, (fr.line or "").strip())
                if fr is not None else Sync(why, "?", 0, "?"))
        self.syncs.append(sync)
        if sync.site not in self.allowed:
            raise HostSyncError(sync)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _sync_reason(func, args, kwargs)
        if why is None:
            return func(*args, **kwargs)
        self.record(why)
        return _stand_in(func, args, kwargs)


@contextlib.contextmanager
def _watch_constructors(mode: SyncEmulator) -> Iterator[None]:
    """``torch.tensor(data, device=...)`` and ``torch.as_tensor`` copy host data to the device
    below the dispatcher (a dispatch mode does not see the copy): while open, those calls that
    put host data on :data:`EMULATED` are recorded as blocking copies from the host."""
    originals = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}

    def watched(name: str) -> Callable[..., torch.Tensor]:
        original = originals[name]

        @functools.wraps(original)
        def constructor(data: object, *args: object, **kwargs: object) -> torch.Tensor:
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == EMULATED.type \
                    and not _is_emulated(data):
                mode.record(f"torch.{name}(..., device={EMULATED.type}): a blocking copy from "
                            "the host")
            return original(data, *args, **kwargs)
        return constructor

    for name in originals:
        setattr(torch, name, watched(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch, name, original)


_MACHINERY = {"__torch_dispatch__", "_user_frame", "record", "constructor"}


@contextlib.contextmanager
def host_generators() -> Iterator[None]:
    """While open, ``torch.Generator(device=meta)`` makes a CPU generator (a meta tensor's
    random ops accept one; a meta generator does not exist), so code that builds its
    generator on its device (``MaskTrainer``) can be set up on :data:`EMULATED`."""
    original = torch.Generator

    class _Generator(original):
        def __new__(cls, device: torch.device | str | None = None) -> torch.Generator:
            if device is not None and torch.device(device).type == EMULATED.type:
                device = "cpu"
            return original(device) if device is not None else original()

    torch.Generator = _Generator
    try:
        yield
    finally:
        torch.Generator = original


def emulated_check(fn: Callable[[], object], allowed: dict[tuple[str, str], int] | None = None,
                   steps: int = 1) -> Verdict:
    """Run ``fn`` (on :data:`EMULATED` tensors) under :class:`SyncEmulator`; its verdict, with
    at most ``allowed[site]`` read-backs per step at each allowed site over ``steps`` steps."""
    allowed = allowed or {}
    mode = SyncEmulator(set(allowed))
    try:
        with mode, _watch_constructors(mode):
            fn()
    except HostSyncError as e:
        return Verdict(mode.syncs, f"SYNC at {e.sync}")
    except (RuntimeError, NotImplementedError, TypeError) as e:
        if "meta" not in str(e):
            raise
        # an operation that needs the data and has no sync signature above (e.g. .numpy())
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if not os.path.abspath(f.filename).startswith(_TORCH_DIR)]
        where = (f"{_relative(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name} "
                 f"({(frames[-1].line or '').strip()})" if frames else "?")
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return Verdict(mode.syncs, f"SYNC? needs the data at {where}: {first}")
    return _verdict(mode.syncs, allowed, steps)


# ---------------------------------------------------------------------------------------------
# On a CUDA GPU


#: torch's warning for a synchronizing call under sync debug mode "warn" (c10's
#: ``warn_or_error_on_sync``). Not a sync: the notice torch gives once per process on the first
#: ``set_sync_debug_mode`` call ("Synchronization debug mode is a prototype feature and does not
#: yet detect all synchronizing operations"), located in ``set_sync_debug_mode`` itself, which
#: an earlier looser match ("synchroniz") charged to the first piece checked.
SYNC_WARNING = "called a synchronizing CUDA operation"


def gpu_check(fn: Callable[[], object], allowed: dict[tuple[str, str], int] | None = None,
              steps: int = 1) -> Verdict:
    """Run ``fn`` under ``torch.cuda.set_sync_debug_mode("warn")``; each warning with torch's
    sync text (:data:`SYNC_WARNING`) is one sync, located at the Python line that made it."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
    syncs = []
    for w in caught:
        if SYNC_WARNING not in str(w.message):  # e.g. the mode's one-time prototype notice
            continue
        code = linecache.getline(w.filename, w.lineno).strip()
        syncs.append(Sync("synchronizing CUDA call", _relative(w.filename), w.lineno,
                          _function_at(w.filename, w.lineno), code))
    return _verdict(syncs, allowed or {}, steps)


# ---------------------------------------------------------------------------------------------
# The pieces of a step


@dataclass
class Piece:
    name: str
    run: Callable[[], object]
    allowed: dict[tuple[str, str], int] = field(default_factory=dict)


def make_pieces(dev: torch.device, n: int, chunk: int, steps: int,
                estimators: tuple[str, ...] = ("arms", "loorf", "disarm", "reinforce"),
                params: tuple[str, ...] = ("sigmoid", "escort"), group: int = 2,
                problem: RegressionProblem | None = None) -> list[Piece]:
    """The samplers, the batched loss and whole steps on the MaskedNNRegression problem on
    ``dev`` (built outside any check; ``problem``: one made on ``dev`` with smaller data, default
    the paper's); each run does ``steps`` steps."""
    from pbscale.execution.group import MemberLosses
    from pbscale.forward.masks import MaskedModule, mean_absolute_error
    from pbscale.methods import (
        AntitheticSampler,
        BernoulliSampler,
        CopulaSampler,
        MaskTrainer,
        MethodConfig,
    )
    from pbscale.regression.group import MaskTrainerGroup
    from pbscale.regression.problem import BATCH, make_problem
    from pbscale.runs.loop import train_step as loop_step

    emulated = dev.type == EMULATED.type
    gen_dev = "cpu" if emulated else dev
    prob = make_problem(0, dev) if problem is None else problem
    idx = torch.arange(BATCH, device=dev)
    f = prob.batch_loss(idx)
    chunk = min(chunk, n)
    gen = torch.Generator(device=gen_dev).manual_seed(0)
    theta = torch.full((prob.d,), 0.3, device=dev)

    def sample(make: Callable[[], object], pair: bool = False) -> Callable[[], None]:
        k = max(2, chunk - chunk % 2) if pair else chunk  # pairs: even chunks of n - n % 2
        total = n - n % 2 if pair else n

        def run() -> None:
            for _ in range(steps):
                s = make()
                for done in range(0, total, k):
                    s.next(min(k, total - done))
        return run

    pieces = [
        Piece("copula sampler (ARMS)", sample(lambda: CopulaSampler(theta, n, gen))),
        Piece("Bernoulli sampler (LOORF)", sample(lambda: BernoulliSampler(theta, gen))),
        Piece("antithetic sampler (DisARM)", sample(lambda: AntitheticSampler(theta, gen), True)),
        Piece("batched loss f(z)", lambda: [f(torch.ones(chunk, prob.d, device=dev))
                                            for _ in range(steps)]),
    ]
    ctx = host_generators() if emulated else contextlib.nullcontext()

    def like_cuda(opts: list[torch.optim.Optimizer]) -> None:
        # torch takes the multi-tensor (foreach) optimizer path on CUDA by default, not on meta
        for opt in opts if emulated else ():
            for g in opt.param_groups:
                if g.get("foreach", False) is None:
                    g["foreach"] = True

    def stepper(tr: object, loss: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(steps):
                tr.zero_grad()
                value, _ = tr.surrogate(loss)
                if value.requires_grad:  # a group differentiated each member's itself
                    value.backward()
                tr.apply()
        return run

    with ctx:
        for est in estimators:
            for param in params:
                cfg = MethodConfig(method=est, n=n, chunk=chunk, param=param)
                tr = MaskTrainer(cfg, prob.d, 1000, dev)
                like_cuda(tr.optimizers)
                pieces.append(Piece(f"{est.upper()} step ({param})", stepper(tr, f),
                                    {LOSS_READBACK: 1}))
        grp = MaskTrainerGroup.flat([MethodConfig(method="arms", n=n, chunk=chunk, seed=s)
                                     for s in range(group)], prob.d, 1000, dev)
        like_cuda(grp.optimizers)
        pieces.append(Piece(f"MaskTrainerGroup ARMS step ({group} runs)",
                            stepper(grp, MemberLosses([f] * group)), {LOSS_READBACK: group}))
        cp = MaskTrainer(MethodConfig(method="cp", n=n), prob.d, 1000, dev)
        like_cuda(cp.optimizers)
        pieces.append(Piece("CP step", stepper(cp, f), {CP_READBACK: 1}))
        # joint training (masks and weights, `pbscale.runs.loop`'s step) on a copy of the backbone
        net = copy.deepcopy(prob.backbone).requires_grad_(True)
        joint_f = MaskedModule(net, train_weights=True).loss_fn(
            prob.x_train[idx], prob.y_train[idx], mean_absolute_error)
        jt = MaskTrainer(MethodConfig(method="arms", n=n, chunk=chunk), prob.d, 1000, dev)
        wopt = torch.optim.SGD(net.parameters(), lr=0.01)
        like_cuda([*jt.optimizers, wopt])

        def joint() -> None:
            for _ in range(steps):
                loop_step(joint_f, jt, wopt, [*jt.optimizers, wopt], None, True)
        pieces.append(Piece("ARMS step, joint weights (loop)", joint, {LOSS_READBACK: 1}))
    return pieces


def check_pieces(dev: torch.device, n: int, chunk: int, steps: int, **options: Any
                 ) -> Iterator[tuple[Piece, Verdict]]:
    """Each piece of :func:`make_pieces` on ``dev`` (``options``: its keyword arguments) with
    its verdict, one after another: emulated on :data:`EMULATED`, else on the CUDA device after
    one warm-up run of the piece outside the check (first-call allocations, cuBLAS handles)."""
    for p in make_pieces(dev, n, chunk, steps, **options):
        if dev.type == EMULATED.type:
            yield p, emulated_check(p.run, p.allowed, steps)
        else:
            p.run()
            yield p, gpu_check(p.run, p.allowed, steps)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=positive_int, default=100, help="samples per step (default 100)")
    ap.add_argument("--chunk", type=positive_int, default=25,
                    help="samples per chunk (default 25)")
    ap.add_argument("--steps", type=positive_int, default=3, help="steps per piece (default 3)")
    ap.add_argument("--emulate", action="store_true",
                    help="emulate the GPU on the meta device even when a CUDA GPU is visible")
    args = ap.parse_args(argv)
    if args.n < 2 or args.chunk < 1 or args.steps < 1:
        print("check_gpu_sync: needs --n >= 2, --chunk >= 1 and --steps >= 1", file=sys.stderr)
        return 2
    emulate = args.emulate or not torch.cuda.is_available()
    if emulate and not args.emulate:
        print("check_gpu_sync: no CUDA GPU is visible; emulating one on the meta device")
    dev = EMULATED if emulate else torch.device("cuda")
    clean = True
    for p, verdict in check_pieces(dev, args.n, args.chunk, args.steps):
        clean &= verdict.clean
        print(f"{p.name:37s} {verdict.describe()}")
    where = ("emulated on the meta device (CUDA branches, no data)" if emulate
             else f"device {torch.cuda.get_device_name(dev)}")
    print(f"{where}, torch {torch.__version__}, n={args.n}, chunk={min(args.chunk, args.n)}, "
          f"steps={args.steps}: " + ("no unexpected sync" if clean else "UNEXPECTED SYNC"))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
