"""Operations per step, counted by torch.profiler: one MC step (ARMS, `alg:iter_arms`), one CP
step, the forward of n masks and the copula sampler, for LeNet-300-100 and ResNet-20, with the
GPU routes off and on (`pbscale.forward.routes`), side by side in one process. Launches, not time,
are what a host-bound GPU step pays for (LeNet on an H100: 130 launches, 3.7 ms of wall time for
1.4 ms of kernels), and the count needs no GPU.

    python -m benchmarks.op_count [--device meta|cpu|cuda] [--models lenet,resnet20]
        [--n 100] [--batch 8] [--steps mc,cp,forward,sampler] [--out figures]

``--device meta`` (default): the CUDA code paths on the meta device (shapes, no data; the
samplers' and the routes' GPU branches, as `benchmarks.check_gpu_sync` emulates a GPU; the
step's one loss read-back gets a stand-in); ``cpu``: the CPU paths with data (the routes do not
apply there, so only their "off" rows); ``cuda``: also the device's kernels and the host's
launch calls. The network's backend is the one a GPU takes (ResNet-20: folded; LeNet: the MLP
path); masked tensors as `benchmarks.bench_prune` (ResNet-20 with its 1x1 shortcuts); the MC
step's chunk is n, as on a GPU; supermask (the weights fixed).

Steps: ``mc`` (``MaskTrainer.step``, ARMS), ``loorf`` (the same with LOORF), ``captured`` (the
ARMS step through :class:`pbscale.execution.captured.CapturedStep`: replayed from a CUDA graph on
cuda, its eager data flow elsewhere), ``cp``, ``forward`` (n masks, no autograd) and
``sampler`` (n copula draws). Models: LeNet-300-100, ResNet-20 and ``regression``
(MaskedNNRegression, d = 8,050, batch 100: the ARMS/LOORF goal's problem).

Counted (each row): ``ops``, the ATen operations the step dispatches from Python or autograd
(an operation inside another is not counted again; views and allocations, which launch no
kernel, are left out, and a conversion such as ``to`` or ``contiguous`` counts by the copy it
makes, if any); of them ``graph_ops`` ran inside a CUDA-graph route's function (where a
GPU replays them as one graph, ``graph_replays``) and ``fused_ops`` inside the fused BatchNorm
tail (eager here; compiled on a GPU: :data:`FUSED_KERNELS` kernels per call, ``fused_calls``);
``launch_est`` = ops outside both + one per replay + :data:`FUSED_KERNELS` per fused call (its
backward, where autograd runs it, one more call): the launches a GPU would make. On cuda:
``kernels`` (device kernel, copy and set events) and ``launches`` (the host's launch calls,
graph launches included). Writes
``OUT/op_count_<device>.csv`` and ``.json`` (the rows and the settings).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from analysis.cli import run
from pbexact.cli import ArgumentParser
from pbexact.errors import PBInputError
from pbexact.io import check_out_dir, write_json
from pbscale.forward import route_ops, routes
from pbscale.forward.graphs import SCOPE as GRAPH_SCOPE
from pbscale.runs import io

MODELS = ("lenet", "resnet20", "regression")
STEPS = ("mc", "loorf", "captured", "cp", "forward", "sampler")
#: The steps that time one trainer's step, and the method each trains.
TRAINED = {"mc": "arms", "loorf": "loorf", "cp": "cp"}
#: Kernels of the compiled fused BatchNorm tail per call, in the estimate: one reduction (the
#: batch statistics) and one elementwise kernel (normalize, affine, add, ReLU).
FUSED_KERNELS = 2
#: ATen operations that launch no kernel: views, metadata and allocations.
NO_KERNEL = frozenset(f"aten::{n}" for n in (
    "view", "as_strided", "t", "transpose", "expand", "slice", "select", "unsqueeze", "squeeze",
    "permute", "_unsafe_view", "alias", "detach", "detach_", "_reshape_alias", "unbind",
    "split", "split_with_sizes", "chunk", "narrow", "unflatten", "movedim", "numpy_T",
    "resolve_conj", "resolve_neg", "empty", "empty_strided", "empty_like", "lift_fresh",
    "result_type", "set_", "size", "dim", "is_nonzero", "item", "_local_scalar_dense",
    "_has_compatible_shallow_copy_type", "record_stream"))
#: Operations that launch a kernel only through the operation they call when a copy is needed
#: (a dtype or layout change): not counted themselves, their copy is.
TRANSPARENT = frozenset(f"aten::{n}" for n in (
    "to", "type_as", "contiguous", "reshape", "flatten", "expand_as", "view_as"))
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
                "cudaMemsetAsync")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.op_count", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="meta", choices=("meta", "cpu", "cuda"),
                   help="meta: the CUDA code paths, shapes only (default); cpu; cuda")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, from {', '.join(MODELS)} (default all)")
    p.add_argument("--n", type=int, default=100,
                   help="ARMS samples per MC step, masks of the forward (default 100)")
    p.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma-separated, from {', '.join(STEPS)} (default all)")
    p.add_argument("--out", default="figures", help="folder of the CSV and JSON (default figures)")
    return p


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Validate every argument (one-line :class:`PBInputError`) before any work."""
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.model_list if m not in MODELS]
    if bad or not args.model_list:
        raise PBInputError(f"unknown model {bad[0] if bad else ''!r} in --models; choose from "
                           f"{', '.join(MODELS)}")
    args.step_list = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in args.step_list if s not in STEPS]
    if bad or not args.step_list:
        raise PBInputError(f"unknown step {bad[0] if bad else ''!r} in --steps; choose from "
                           f"{', '.join(STEPS)}")
    if args.n < 2:
        raise PBInputError(f"--n must be at least 2 (ARMS), got {args.n}")
    if args.batch < 2:
        raise PBInputError(f"--batch must be at least 2 (BatchNorm batch statistics), got "
                           f"{args.batch}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise PBInputError("--device cuda: no CUDA GPU is visible; use --device meta (the CUDA "
                           "code paths, shapes only) or cpu")
    args.out = check_out_dir(args.out)
    return args


def _ancestors(event: Any) -> list[Any]:
    """The enclosing events, innermost first."""
    out, p = [], event.cpu_parent
    while p is not None:
        out.append(p)
        p = p.cpu_parent
    return out


def _key(event: Any) -> int:
    return id(event) if event.id is None else event.id


def count(prof: profile) -> dict[str, Any]:
    """The counts of one profiled step (module docstring). A graph scope inside another counts
    as part of the outer one (one replay); the backward of the fused tail (autograd functions
    whose forward ran in its scope, matched by sequence number) counts as the compiled
    backward's kernels, one more fused call."""
    ops: collections.Counter = collections.Counter()
    kernels = launches = 0
    top = []  # (event, its ancestors)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
            continue
        if e.name.startswith(LAUNCH_CALLS):
            launches += 1
        if not e.name.startswith("aten::") or e.name in NO_KERNEL or e.name in TRANSPARENT:
            continue
        anc = _ancestors(e)
        if any(a.name.startswith(("aten::", "prims::")) and a.name not in TRANSPARENT
               for a in anc):
            continue  # inside another operation
        ops[e.name] += 1
        top.append((e, anc))
    fused_seq: dict[int, int] = {}  # forward sequence number -> its fused scope
    for e, anc in top:
        f = next((a for a in anc if a.name == route_ops.FUSED_SCOPE), None)
        if f is not None and e.sequence_nr >= 0:
            fused_seq[e.sequence_nr] = _key(f)
    graphs: set[int] = set()
    fused: set[tuple[int, str]] = set()
    graph_ops = fused_ops = 0
    for _, anc in top:
        g = [a for a in anc if a.name == GRAPH_SCOPE]
        if g:
            graph_ops += 1
            graphs.add(_key(g[-1]))  # the outermost
            continue
        f = next((a for a in anc if a.name == route_ops.FUSED_SCOPE), None)
        if f is not None:
            fused_ops += 1
            fused.add((_key(f), "forward"))
            continue
        b = next((a for a in anc if a.name.startswith("autograd::engine::evaluate_function")),
                 None)
        if b is not None and b.sequence_nr in fused_seq:
            fused_ops += 1
            fused.add((fused_seq[b.sequence_nr], "backward"))
    total = sum(ops.values())
    return {"ops": total, "ops_outside": total - graph_ops - fused_ops,
            "graph_replays": len(graphs), "graph_ops": graph_ops, "fused_calls": len(fused),
            "fused_ops": fused_ops,
            "launch_est": total - graph_ops - fused_ops + len(graphs) + FUSED_KERNELS * len(fused),
            "kernels": kernels, "launches": launches,
            "top_ops": " ".join(f"{k[6:]}:{v}" for k, v in ops.most_common(6))}


class Setup:
    """One model on the device with a synthetic batch and a supermask layout with the routes
    asked for; the steps to count."""

    def __init__(self, model: str, args: argparse.Namespace, asked: routes.Routes) -> None:
        from pbscale.forward.folded import cross_entropy_per_mask
        from pbscale.forward.masks import MaskedModule
        from pbscale.nets.models import INPUT_SHAPES, build_model

        self.dev = torch.device(args.device)
        self.args = args
        gen = torch.Generator().manual_seed(0)
        if model == "regression":  # the paper's MaskedNNRegression (`sec:app_maskednnregression`)
            from pbscale.forward.masks import mean_absolute_error
            from pbscale.regression.problem import BATCH, make_problem

            prob = make_problem(0, self.dev)
            self.layout = MaskedModule(prob.backbone, routes=asked)
            self.x, self.y = prob.x_train[:BATCH], prob.y_train[:BATCH]
            self.loss = mean_absolute_error
        else:
            net = build_model(model, seed=0).to(self.dev).train()
            self.names = net.masked_names(mask_shortcuts=True)
            # the backend a GPU takes (ResNet-20: folded; LeNet: the MLP path under "auto")
            backend = "auto" if model == "lenet" else "folded"
            self.layout = MaskedModule(net, self.names, backend=backend, routes=asked)
            shape = INPUT_SHAPES[net.dataset]
            self.x = torch.randn((args.batch, *shape), generator=gen).to(self.dev)
            self.y = torch.randint(0, 10, (args.batch,), generator=gen).to(self.dev)
            self.loss = cross_entropy_per_mask
        self.f = self.layout.loss_fn(self.x, self.y, self.loss)
        self.taken = self.layout.choice.effective_routes(self.dev)

    def trainer(self, method: str) -> Any:
        from benchmarks.check_gpu_sync import host_generators
        from pbscale.methods import MaskTrainer, MethodConfig, get_family
        from pbscale.pruning.config import pruning_n

        n = pruning_n(get_family(method), self.args.n)
        ctx = host_generators() if self.dev.type == "meta" else contextlib.nullcontext()
        with ctx:
            return MaskTrainer(MethodConfig(method=method, n=n, chunk=n), self.layout.d, 100,
                               self.dev)

    def step(self, what: str) -> Callable[[], object]:
        from pbscale.methods import CopulaSampler

        if what in TRAINED:
            tr = self.trainer(TRAINED[what])
            return lambda: tr.step(self.f)
        if what == "captured":
            from pbscale.execution.captured import CapturedStep

            step = CapturedStep(self.trainer("arms"), self.layout, self.x, self.y, self.loss,
                                capture=self.dev.type == "cuda")
            return lambda: step(self.x, self.y)
        n, d = self.args.n, self.layout.d
        if what == "forward":
            gen = torch.Generator().manual_seed(1)
            z = (torch.rand((n, d), generator=gen) < 0.5).float().to(self.dev)

            def forward() -> None:
                with torch.no_grad():
                    self.layout.forward(z, self.x)
            return forward
        theta = torch.full((d,), 0.3, device=self.dev)
        gen = torch.Generator(device="cpu" if self.dev.type == "meta" else self.dev)
        return lambda: CopulaSampler(theta, n, gen.manual_seed(2)).next(n)


def profiled(fn: Callable[[], object], dev: torch.device) -> dict[str, Any]:
    """Counts of one call of ``fn`` after two warm-up calls (compilation, graph capture, cuDNN
    autotuning; on meta under the emulated sync check, which gives the loss read-back a
    stand-in)."""
    from benchmarks import check_gpu_sync as cgs

    if dev.type == "meta":
        # the step's loss read-back, also where a captured step records it
        allowed = {cgs.LOSS_READBACK: 1, cgs.CP_READBACK: 1,
                   ("pbscale/execution/captured.py", "__torch_dispatch__"): 1}

        def call() -> None:
            verdict = cgs.emulated_check(fn, allowed, 1)
            if not verdict.clean:
                raise RuntimeError(f"the step synchronizes: {verdict.describe()}")
    else:
        call = fn
    for _ in range(2):
        call()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    with profile(activities=acts) as prof:
        call()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return count(prof)


def main(argv: list[str] | None = None) -> int:
    args = check_args(build_parser().parse_args(argv))
    dev = torch.device(args.device)
    settings = [("off", routes.NONE)] + ([("all", routes.ALL)] if dev.type != "cpu" else [])
    rows: list[dict] = []
    for model in args.model_list:
        for what in args.step_list:
            pair = []
            for label, asked in settings:
                setup = Setup(model, args, asked)
                c = profiled(setup.step(what), dev)
                rows.append({"model": model, "step": what, "n": args.n, "batch": args.batch,
                             "device": args.device, "routes_asked": label,
                             "routes_taken": str(setup.taken), **c})
                pair.append(c)
            line = "  ".join(f"{lab}: {c['ops']} ops, launch_est {c['launch_est']}"
                             for (lab, _), c in zip(settings, pair))
            print(f"{model:9s} {what:8s} {line}", flush=True)
    stem = Path(args.out) / f"op_count_{args.device}"
    io.write_csv(stem.with_suffix(".csv"), rows)
    write_json(stem.with_suffix(".json"), {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "device": args.device, "n": args.n, "batch": args.batch,
        "fused_kernels_per_call": FUSED_KERNELS, "command": " ".join(["python -m "
                                                                     "benchmarks.op_count",
                                                                     *(argv or sys.argv[1:])]),
        "rows": rows})
    print(f"wrote {stem.with_suffix('.csv')} and {stem.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
