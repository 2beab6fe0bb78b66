"""Each GPU route (`pbscale.forward.routes`) against the reference path it replaces, in one process:
time and largest relative difference.

    python -m benchmarks.bench_routes [--device cuda|cpu] [--batch 128] [--n 100]
        [--repeats 10] [--steps 5] [--out figures]

Jobs, in order (:func:`jobs`):

* ``forward``: ResNet-20's forward of n masks (folded, training-mode BatchNorm, no autograd),
  fp32 and bf16 autocast, with each folded route alone (``channels_last``,
  ``shortcut_einsum``, ``fused_bn``, ``cudnn_benchmark``), all four, and the ones
  :meth:`pbscale.forward.backends.BackendChoice.effective_routes` takes for the setting; the first
  call's time apart (``first_call_s``: compilation of the fused tail, cuDNN autotuning).
* ``graphed_forward``: LeNet-300-100's forward of n masks through the CUDA-graph route
  (:class:`pbscale.forward.backends.Graphed`) against the MLP path it replays.
* ``mc_step``: the ARMS step (`alg:iter_arms`, n samples) eager and through
  :class:`pbscale.execution.captured.CapturedStep`, beside a dense training step of the same
  network and batch (``per_dense_train`` = step / dense step, the goals' measure), for LeNet
  (fp32) and ResNet-20 (fp32 and bf16 autocast) with the routes BackendChoice takes; and the
  largest difference of the mask logits after ``--steps`` steps of the two.

On a CPU the forward rows apply each route as asked (the fused tail eager, no cuDNN), the
graph and step rows run the static-buffer data flow without a capture, and the steps take the
routes BackendChoice takes there (none): the same code paths at CPU speed and tiny sizes, not
GPU measurements. Writes ``OUT/bench_routes_<device>.csv``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from analysis.cli import run
from pbexact.cli import ArgumentParser, positive_int
from pbexact.errors import PBInputError
from pbexact.io import check_out_dir
from pbscale.forward.routes import ALL, NONE, Routes
from pbscale.runs import io

#: The folded routes timed alone and together.
FOLDED = {"off": NONE, "channels_last": Routes(channels_last=True),
          "shortcut_einsum": Routes(shortcut_einsum=True), "fused_bn": Routes(fused_bn=True),
          "cudnn_benchmark": Routes(cudnn_benchmark=True),
          "folded routes": Routes(channels_last=True, shortcut_einsum=True, fused_bn=True,
                                  cudnn_benchmark=True)}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn: Callable[[], object], repeats: int, dev: torch.device) -> tuple[float, float]:
    """(first call in s, median of ``repeats`` later calls in ms), synchronized on CUDA."""
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    first = time.perf_counter() - t0
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        ms.append(1e3 * (time.perf_counter() - t0))
    return first, statistics.median(ms)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return float((a.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _resnet(dev: torch.device, amp: torch.dtype | None, asked: Routes | str | None = NONE):
    from pbscale.forward.masks import MaskedModule
    from pbscale.nets.models import build_model

    net = build_model("resnet20", seed=0).to(dev).train()
    return net, MaskedModule(net, net.masked_names(mask_shortcuts=True), amp=amp, routes=asked)


def forward_rows(dev: torch.device, amp_name: str, batch: int, n: int, repeats: int
                 ) -> list[dict]:
    """ResNet-20's forward of n masks with each folded route (module docstring)."""
    from pbscale.forward.backends import Folded

    amp = torch.bfloat16 if amp_name == "bf16" else None
    net, layout = _resnet(dev, amp)
    gen = torch.Generator(device=dev).manual_seed(0)
    z = (torch.rand((n, layout.d), generator=gen, device=dev) < 0.5).float()
    x = torch.randn((batch, 3, 32, 32), generator=gen, device=dev)
    start = {k: b.clone() for k, b in net.named_buffers()}
    variants = dict(FOLDED)
    variants["as BackendChoice takes them"] = _resnet(dev, amp, ALL)[1].choice.effective_routes(
        "cuda")
    rows, ref, ref_ms = [], None, None
    for label, r in variants.items():
        backend = Folded(layout, routes=r)
        with torch.no_grad():
            for k, b in net.named_buffers():  # every variant from the same statistics
                b.copy_(start[k])
            out = backend(z, x)
            first, ms = timed(lambda b=backend: b(z, x), repeats, dev)
        if ref is None:
            ref, ref_ms = out, ms
        rows.append({"model": "resnet20", "amp": amp_name, "what": "forward", "route": label,
                     "routes": str(r), "n": n, "batch": batch, "ms": ms, "ms_reference": ref_ms,
                     "ratio": ms / ref_ms, "max_rel_diff": _rel(out, ref),
                     "first_call_s": first, "per_dense_train": float("nan")})
    return rows


def graphed_forward_rows(dev: torch.device, batch: int, n: int, repeats: int) -> list[dict]:
    """LeNet's forward of n masks: the MLP path, and replayed from a CUDA graph."""
    from pbscale.forward.masks import MaskedModule
    from pbscale.nets.models import build_model

    net = build_model("lenet", seed=0).to(dev).train()
    layout = MaskedModule(net, net.masked_names())
    gen = torch.Generator(device=dev).manual_seed(0)
    z = (torch.rand((n, layout.d), generator=gen, device=dev) < 0.5).float()
    x = torch.randn((batch, 784), generator=gen, device=dev)
    with torch.no_grad():
        plain = layout.choice.choose(z, x)
        graphed = layout.choice.graphed_for(plain, capture=dev.type == "cuda")
        ref = plain(z, x)
        out = graphed(z, x)
        _, ref_ms = timed(lambda: plain(z, x), repeats, dev)
        first, ms = timed(lambda: graphed(z, x), repeats, dev)
    base = {"model": "lenet", "amp": "none", "what": "graphed_forward", "n": n, "batch": batch,
            "ms_reference": ref_ms, "per_dense_train": float("nan")}
    return [{**base, "route": "off", "routes": "off", "ms": ref_ms, "ratio": 1.0,
             "max_rel_diff": 0.0, "first_call_s": float("nan")},
            {**base, "route": "cuda_graph", "routes": "cuda_graph", "ms": ms,
             "ratio": ms / ref_ms, "max_rel_diff": _rel(out, ref), "first_call_s": first}]


def step_rows(dev: torch.device, model: str, amp_name: str, batch: int, n: int, repeats: int,
              steps: int) -> list[dict]:
    """The ARMS step, eager and captured, with the routes BackendChoice takes, beside a dense
    training step (module docstring)."""
    from pbscale.execution.captured import CapturedStep
    from pbscale.forward.folded import cross_entropy_per_mask
    from pbscale.forward.masks import MaskedModule
    from pbscale.methods import MaskTrainer, MethodConfig
    from pbscale.nets.models import INPUT_SHAPES, build_model

    amp = torch.bfloat16 if amp_name == "bf16" else None
    net = build_model(model, seed=0).to(dev).train()
    names = net.masked_names(mask_shortcuts=True)
    # the GPU's backend for the network (ResNet-20: folded, also on a CPU here)
    backend = "auto" if model == "lenet" else "folded"
    layout = MaskedModule(net, names, amp=amp, backend=backend, routes=ALL)
    taken = layout.choice.effective_routes(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    shape = INPUT_SHAPES[net.dataset]
    x = torch.randn((batch, *shape), generator=gen, device=dev)
    y = torch.randint(0, 10, (batch,), generator=gen, device=dev)

    def trainer() -> Any:
        return MaskTrainer(MethodConfig(method="arms", n=n, chunk=n, seed=0), layout.d, 100,
                           dev)

    dense = copy.deepcopy(net)
    opt = torch.optim.SGD(dense.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                          weight_decay=1e-4)

    def dense_step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            loss = F.cross_entropy(dense(x).float(), y)
        loss.backward()
        opt.step()

    f = layout.loss_fn(x, y, cross_entropy_per_mask)
    eager_tr, captured_tr = trainer(), trainer()
    captured = CapturedStep(captured_tr, layout, x, y, capture=dev.type == "cuda")
    _, dense_ms = timed(dense_step, repeats, dev)
    first_e, eager_ms = timed(lambda: eager_tr.step(f), repeats, dev)
    first_c, captured_ms = timed(lambda: captured(x, y), repeats, dev)
    # the same steps from the same start: eager and captured logits side by side
    a, b = trainer(), trainer()
    cb = CapturedStep(b, layout, x, y, capture=dev.type == "cuda")
    for _ in range(steps):
        a.step(f)
        cb(x, y)
    diff = float((a.r - b.r).detach().abs().max())
    base = {"model": model, "amp": amp_name, "what": "mc_step", "routes": str(taken), "n": n,
            "batch": batch, "ms_reference": eager_ms}
    return [{**base, "route": "dense_train", "routes": "", "n": 1, "ms": dense_ms,
             "ratio": dense_ms / eager_ms, "max_rel_diff": float("nan"),
             "first_call_s": float("nan"), "per_dense_train": 1.0},
            {**base, "route": "eager", "ms": eager_ms, "ratio": 1.0, "max_rel_diff": 0.0,
             "first_call_s": first_e, "per_dense_train": eager_ms / dense_ms},
            {**base, "route": "captured" + ("" if captured.graph is not None else
                                            f" (eager: {captured.failed or 'no CUDA'})"),
             "ms": captured_ms, "ratio": captured_ms / eager_ms,
             "max_rel_diff": diff, "first_call_s": first_c,
             "per_dense_train": captured_ms / dense_ms}]


def jobs(dev: torch.device, batch: int, n: int, repeats: int, steps: int
         ) -> list[tuple[str, Callable[[], list[dict]]]]:
    """(name, job) in order; each job returns its rows."""
    return [
        ("lenet captured step", lambda: step_rows(dev, "lenet", "none", batch, n, repeats,
                                                  steps)),
        ("resnet20 forward bf16", lambda: forward_rows(dev, "bf16", batch, n, repeats)),
        ("resnet20 captured step bf16", lambda: step_rows(dev, "resnet20", "bf16", batch, n,
                                                          repeats, steps)),
        ("resnet20 forward fp32", lambda: forward_rows(dev, "none", batch, n, repeats)),
        ("resnet20 captured step fp32", lambda: step_rows(dev, "resnet20", "none", batch, n,
                                                          repeats, steps)),
        ("lenet graphed forward", lambda: graphed_forward_rows(dev, batch, n, repeats)),
    ]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.bench_routes",
                       description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   choices=("cuda", "cpu"), help="default cuda where visible, else cpu")
    p.add_argument("--batch", type=positive_int, default=128, help="batch size (default 128)")
    p.add_argument("--n", type=positive_int, default=100,
                   help="masks per forward, ARMS samples per step (default 100)")
    p.add_argument("--repeats", type=positive_int, default=10,
                   help="timed calls after the first (default 10)")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="steps of the eager and captured trainers compared (default 5)")
    p.add_argument("--out", default="figures", help="folder of the CSV (default figures)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise PBInputError("--device cuda: no CUDA GPU is visible; use --device cpu")
    if args.n < 2 or args.batch < 2:
        raise PBInputError("--n and --batch must be at least 2 (ARMS; BatchNorm statistics)")
    out = check_out_dir(args.out)
    dev = torch.device(args.device)
    rows: list[dict] = []
    for name, job in jobs(dev, args.batch, args.n, args.repeats, args.steps):
        got = job()
        rows += got
        for r in got:
            print(f"{name:28s} {r['route']:28s} {r['ms']:9.3f} ms  x{r['ratio']:.2f}  "
                  f"per dense train {r['per_dense_train']:.2f}  diff {r['max_rel_diff']:.1e}",
                  flush=True)
    path = Path(out) / f"bench_routes_{args.device}.csv"
    io.write_csv(path, rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
