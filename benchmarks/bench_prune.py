"""Cost of one MC pruning step (ARMS, escort; `alg:iter_arms`) at n = 1, 10, 100 against a dense
training step and a dense forward pass of the same network, measured in the same run, for
LeNet-300-100 (MNIST-shaped batches) and ResNet-20 (CIFAR-shaped batches), synthetic data; plus
the k-mask forward alone by :func:`pbscale.forward.folded.forward_masked` (grouped convolutions)
against ``torch.func.vmap`` over ``functional_call`` and the same code one mask at a time (the loop
backend), and the peak memory of
each step.

    python -m benchmarks.bench_prune [--device cpu|cuda] [--amp none,bf16] [--ns 1,10,100]
        [--models lenet,resnet20] [--batch 128] [--chunk K] [--repeats R]
        [--layouts nchw,channels_last] [--per-call 1,10] [--compare loorf] [--out figures]

Goals: on a CPU an MC step at n costs at most 1.2 n dense forward passes and its
peak memory is flat in n (n samples evaluated k = chunk at a time); on a GPU an n = 100 step of
ResNet-20 at batch 128 costs at most 3 dense training steps. n = 1 uses REINFORCE (ARMS needs
n >= 2). The MC step is :meth:`pbscale.methods.MaskTrainer.step` (sampling, the chunked forward
passes, the iterative accumulator and the RMSprop update of the mask logits) on the loss pruning
evaluates, :meth:`pbscale.forward.masks.MaskedModule.loss_fn` with the backend MaskedModule picks
for the device (printed; the ``backend`` column: ResNet-20 "loop" on a CPU, "folded" on a GPU; LeNet
"folded"). Beside each MC step its floor: the forward of its masks (the loss it evaluates, chunk
by chunk), drawing its n d uniforms with the generator it uses (on a CPU the counter stream of
:mod:`pbscale.methods.counter_stream`, on a GPU torch's Philox) and one pass over n d; the step
over the floor and over the forward of its masks (the CPU goals of issue 44: ARMS n = 10 at most
2.5 and n = 100 at most 1.6 forwards of its masks). Masked tensors: the
models' rule (:meth:`pbscale.nets.models.PrunableNet.masked_names`), for ResNet-20 with the 1x1
shortcuts (270,256 weights). Writes ``OUT/bench_prune_<device>.csv``
(one row per measurement; the ``amp`` column tells float32 from bf16). The process runs with the
allocator setting of the training commands (:func:`pbscale.runs.allocator.keep_freed_memory`;
``PBNN_KEEP_FREED_MEMORY=0``: glibc's defaults), printed and in the ``keep_freed_memory`` column,
so the steps timed are those ``pbscale.prune`` runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.func import replace_all_batch_norm_modules_
from torch.nn import functional as F

from analysis.cli import run
from pbexact.cli import ArgumentParser, int_at_least, positive_int
from pbexact.errors import PBInputError
from pbexact.io import check_out_dir
from pbscale.forward.folded import cross_entropy_per_mask, forward_masked
from pbscale.forward.masks import MaskedModule
from pbscale.methods import MaskTrainer, MethodConfig
from pbscale.methods.counter_stream import CounterStream, stream_values
from pbscale.nets.models import INPUT_SHAPES, MODELS, build_model
from pbscale.runs import io
from pbscale.runs.allocator import keep_freed_memory
from pbscale.runs.memory import peak_memory

BENCH_MODELS = ("lenet", "resnet20")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.bench_prune",
                                description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--amp", default="none",
                   help="none, bf16 (torch.autocast) or none,bf16 for both; default none")
    p.add_argument("--ns", default="1,10,100", help="samples per MC step, comma-separated")
    p.add_argument("--models", default=",".join(BENCH_MODELS),
                   help=f"comma-separated, from {', '.join(BENCH_MODELS)}")
    p.add_argument("--batch", type=int_at_least(2), default=128,
                   help="batch size, >= 2 for BatchNorm's batch statistics (default 128)")
    p.add_argument("--chunk", type=positive_int, default=None,
                   help="masks per chunk of an MC step (default: on cpu 10, on cuda the "
                   "largest n)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="timed repetitions after one warm-up (default 3 on cpu, 10 on cuda)")
    p.add_argument("--layouts", default="nchw",
                   help="memory layouts of the convolutional model's activations: nchw, "
                   "channels_last or both (nchw,channels_last); default nchw")
    p.add_argument("--per-call", "--groups", dest="per_call", default="",
                   help="also time the k-mask forward with forward_masked(per_call=g) for these g "
                   "(masks per folded call; 1 = a loop), comma-separated (--groups: its name in "
                   "the dated commands of docs/measurements.md); default none")
    p.add_argument("--estimator", default="arms", help="MC estimator for n >= 2 (default arms)")
    p.add_argument("--compare", default=None,
                   help="another MC estimator whose step is timed interleaved beside each step "
                   "at n >= 2, e.g. loorf (prints the step ratio); default none")
    p.add_argument("--param", default="escort", help="parametrization (default escort)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    p.add_argument("--out", default="figures", help="folder of the CSV (default figures)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p


def _positive_ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PBInputError(f"{what} must be comma-separated integers, got {text!r}; give e.g. "
                           f"{what} 1,10,100") from None
    if not vals or min(vals) < 1:
        raise PBInputError(f"{what} must be positive integers, got {text!r}; give e.g. "
                           f"{what} 1,10,100")
    return vals


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Validate every argument (PBInputError naming the problem) before any work."""
    if args.device not in ("cpu", "cuda"):
        raise PBInputError(f"--device {args.device!r} is neither cpu nor cuda; use --device cpu "
                           "or --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise PBInputError("--device cuda: no CUDA device is visible; use --device cpu")
    args.amps = [a.strip() for a in args.amp.split(",") if a.strip()]
    if not args.amps or any(a not in ("none", "bf16") for a in args.amps):
        raise PBInputError(f"--amp {args.amp!r} is not none, bf16 or both; give --amp none, "
                           "bf16 or none,bf16")
    args.amp = args.amps[0]
    args.layout_list = [v.strip() for v in args.layouts.split(",") if v.strip()]
    if not args.layout_list or any(v not in ("nchw", "channels_last") for v in args.layout_list):
        raise PBInputError(f"--layouts {args.layouts!r} is not nchw, channels_last or both; "
                           "give --layouts nchw, channels_last or nchw,channels_last")
    args.channels_last = args.layout_list[0] == "channels_last"
    args.ns = _positive_ints(args.ns, "--ns")
    args.per_call_list = (_positive_ints(args.per_call, "--per-call") if args.per_call.strip()
                       else [])
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in BENCH_MODELS]
    if bad or not args.models:
        raise PBInputError(f"unknown model {bad[0] if bad else ''!r} in --models; choose from "
                           f"{', '.join(BENCH_MODELS)}")
    for n in args.ns:  # the method's own checks (estimator, parametrization, n)
        method_config(args, n).validate()
        if args.compare and n >= 2:
            method_config(args, n, args.compare).validate()
    args.chunk_given = args.chunk
    if args.repeats is None:
        args.repeats = 3 if args.device == "cpu" else 10
    return args


def default_chunk(args: argparse.Namespace, model: str) -> int:
    """Masks per chunk: on a CPU 10 for both models (LeNet's batched products gain up to there;
    ResNet-20 runs its masks one at a time on a CPU, MaskedModule's "loop" backend, so the chunk
    only amortizes the sampler's per-chunk work: 1.25, 1.12 and 1.24 n dense forwards per MC
    step at chunks 2, 10 and 50, CPU time, one loaded run); on a GPU, all n at once."""
    if args.device == "cpu":
        return 10
    return max(args.ns)


def method_config(args: argparse.Namespace, n: int, estimator: str | None = None
                  ) -> MethodConfig:
    estimator = (estimator or args.estimator) if n >= 2 else "reinforce"
    chunk = None if args.chunk is None else min(args.chunk, n)
    return MethodConfig(method=estimator, n=n, param=args.param, chunk=chunk, seed=0)


class Setup:
    """One model on the device with a synthetic batch, its masked layout, the batched loss and
    a dense optimizer (SGD, Nesterov, as the joint-pruning weights)."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        dev = torch.device(args.device)
        self.dev = dev
        self.amp = torch.bfloat16 if args.amp == "bf16" else None
        self.channels_last = args.channels_last and name != "lenet"
        net = build_model(name, seed=0).to(dev)
        if self.channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.net = net.train()
        self.names = net.masked_names(mask_shortcuts=True)
        self.layout = MaskedModule(net, self.names, amp=self.amp,
                                   channels_last=self.channels_last)
        self.backend = self.layout.path_for(dev)
        gen = torch.Generator(device=dev).manual_seed(0)
        shape = INPUT_SHAPES[MODELS[name].dataset]
        self.x = torch.randn((args.batch, *shape), generator=gen, device=dev)
        if self.channels_last:
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        self.y = torch.randint(0, 10, (args.batch,), generator=gen, device=dev)
        # the loss pruning evaluates (pbscale.prune.PruneTask.batch_loss): MaskedModule's
        # backend for this device, running statistics updated as in training
        self.f = self.layout.loss_fn(self.x, self.y, cross_entropy_per_mask)
        self.opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                                   weight_decay=1e-4)

    def autocast(self):
        return torch.autocast(self.dev.type, dtype=self.amp, enabled=self.amp is not None)

    def dense_forward(self) -> None:
        with torch.no_grad(), self.autocast():
            self.net(self.x)

    def dense_train(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        with self.autocast():
            loss = F.cross_entropy(self.net(self.x).float(), self.y)
        loss.backward()
        self.opt.step()

    def trainer(self, args: argparse.Namespace, n: int) -> MaskTrainer:
        return MaskTrainer(method_config(args, n), self.layout.d, 100, self.dev)


def _time(fns: dict[str, Callable[[], object]], repeats: int, dev: torch.device
          ) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) milliseconds of each call, interleaved (all see the same machine load), after
    one warm-up. The CPU time of this process is what a single-threaded run costs whatever else
    shares the machine; on cuda it is not the GPU's time (NaN is recorded)."""
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
    for rep in range(repeats + 1):
        for key, fn in fns.items():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t, c = time.perf_counter(), time.process_time()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            if rep:
                out[key].append((1e3 * wall, 1e3 * cpu if dev.type == "cpu" else float("nan")))
    return out


def _stats(ts: list[tuple[float, float]]) -> dict:
    """Median, min and max wall time and the median CPU time, in ms."""
    wall = [w for w, _ in ts]
    return {"ms_median": statistics.median(wall), "ms_min": min(wall), "ms_max": max(wall),
            "cpu_ms_median": statistics.median(c for _, c in ts)}


def _peak(args: argparse.Namespace, model: str, what: str, n: int, setup: Setup,
          chunk: int | None = None) -> float:
    """Peak memory (MiB) of one call (``chunk`` overrides --chunk): on cuda in this process
    (allocator counters), on cpu in a fresh process (its resident-set growth; no earlier call's
    pools)."""
    if args.no_memory:
        return float("nan")
    chunk = args.chunk if chunk is None else chunk
    if args.device == "cuda":
        saved, args.chunk = args.chunk, chunk
        try:
            fn = _step_fn(setup, args, what, n)
            fn()  # allocator warm: the peak of a steady-state call
            return (peak_memory(fn, setup.dev) or 0) / 2**20
        finally:
            args.chunk = saved
    cmd = [sys.executable, "-m", "benchmarks.bench_prune", "--child", f"{model},{what},{n}",
           "--device", args.device, "--amp", args.amp, "--batch", str(args.batch),
           "--chunk", str(chunk), "--estimator", args.estimator, "--param", args.param,
           "--ns", ",".join(map(str, args.ns)),
           "--layouts", "channels_last" if args.channels_last else "nchw"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    got = json.loads(res.stdout.strip().splitlines()[-1])["peak"]
    return float("nan") if got is None else got / 2**20


def _step_fn(setup: Setup, args: argparse.Namespace, what: str, n: int) -> Callable[[], object]:
    if what == "mc_step":
        tr = setup.trainer(args, n)
        return lambda: tr.step(setup.f)
    return setup.dense_train if what == "dense_train" else setup.dense_forward


def forward_rows(setup: Setup, args: argparse.Namespace, model: str, base: dict,
                 dense: dict) -> list[dict]:
    """The k-mask forward alone (no grad), k = the chunk: forward_masked (all k folded: grouped
    convolutions), vmap over functional_call (BatchNorm on batch statistics: running-stat
    tracking off in a copy, the same function in training mode), the loop backend
    (forward_masked one mask at a time, running statistics left alone), MaskedModule.forward
    with its backend for the device (``fwd_module``: what pruning runs); and each one's largest
    difference from the loop."""
    k = args.chunk
    gen = torch.Generator(device=setup.dev).manual_seed(1)
    z = (torch.rand((k, setup.layout.d), generator=gen, device=setup.dev) < 0.5).float()
    masks = setup.layout.split(z)
    # vmap cannot run BatchNorm on channels-last tensors (torch: "NYI: querying is_contiguous
    # inside of vmap"), so its copy of the network and its input stay in the default layout
    vnet = copy.deepcopy(setup.net).to(memory_format=torch.contiguous_format)
    replace_all_batch_norm_modules_(vnet)
    vlayout = MaskedModule(vnet, setup.names)
    x = setup.x
    x_default = x.contiguous()
    fns: dict[str, Callable[[], object]] = {
        "fwd_fast": lambda: forward_masked(setup.net, masks, x, amp=setup.amp,
                                           channels_last=setup.channels_last),
        "fwd_vmap": lambda: vlayout.forward_vmap(z, x_default),
        "fwd_loop": lambda: forward_masked(setup.net, masks, x, per_call=1),
    }
    if setup.amp is not None:
        def autocast(fn):
            def g():
                with setup.autocast():
                    return fn()
            return g
        fns["fwd_vmap"] = autocast(fns["fwd_vmap"])
        fns["fwd_loop"] = autocast(fns["fwd_loop"])
    fns["fwd_module"] = lambda: setup.layout.forward(z, x)  # what pruning runs (its backend)
    for g in args.per_call_list:
        fns[f"fwd_group{g}"] = lambda g=g: forward_masked(
            setup.net, masks, x, amp=setup.amp, channels_last=setup.channels_last, per_call=g)
    if type(setup.net) is nn.Sequential or isinstance(setup.net, nn.Sequential):
        fns["fwd_mlp_fast"] = lambda: setup.layout.forward(z, x)  # MaskedModule's own fast path
    with torch.no_grad():
        ref = fns["fwd_loop"]().float()
        scale = ref.abs().max().clamp_min(1e-30)
        diffs = {w: float((fn().float() - ref).abs().max() / scale) for w, fn in fns.items()}
        times = _time(fns, args.repeats, setup.dev)
    rows = []
    for what, ts in times.items():
        st = _stats(ts)
        rows.append({**base, "what": what, "n": k, "chunk": k, "estimator": "", **st,
                     "peak_mib": float("nan"), "peak_one_shot_mib": float("nan"),
                     **_ratios(st, k, dense), "max_rel_diff": diffs[what]})
    return rows


def floor_fns(setup: Setup, tr: MaskTrainer, n: int) -> dict[str, Callable[[], object]]:
    """The parts of an MC step's floor at n samples in chunks of k = the trainer's chunk:
    ``floor_forward`` the loss the step evaluates (the forward of its masks) on ceil(n/k)
    chunks, ``floor_draw`` n d uniforms drawn with the generator the step uses (on the CPU the
    counter stream's 24-bit values, :func:`pbscale.methods.counter_stream.stream_values`; on a
    GPU torch.rand with the run's generator), ``floor_pass`` one pass over n d (a comparison of
    each chunk's uniforms with a per-weight threshold, written as masks)."""
    d, k, dev = setup.layout.d, tr.chunk, setup.dev
    sizes = [min(k, n - s) for s in range(0, n, k)]
    gen = torch.Generator(device=dev).manual_seed(2)
    z = (torch.rand((k, d), generator=gen, device=dev) < 0.5).float()
    u = torch.rand((k, d), generator=gen, device=dev)
    t = torch.full((d,), 0.5, device=dev)
    stream = CounterStream(0)

    def forward() -> None:
        with torch.no_grad():
            for m in sizes:
                setup.f(z[:m])

    def draw() -> None:
        for m in sizes:
            if dev.type == "cpu":
                stream_values(stream.key, stream.take(m, d), d, m)
            else:
                torch.rand((m, d), generator=gen, device=dev)

    def one_pass() -> None:
        for m in sizes:
            torch.lt(u[:m], t, out=z[:m])

    return {"floor_forward": forward, "floor_draw": draw, "floor_pass": one_pass}


def _ratios(st: dict, n: int, dense: dict) -> dict:
    """Cost over n dense forwards and over one dense training step, by wall and CPU time."""
    fwd, train = dense["dense_forward"], dense["dense_train"]
    return {"per_dense_forward": st["ms_median"] / (n * fwd["ms_median"]),
            "per_dense_train": st["ms_median"] / train["ms_median"],
            "per_dense_forward_cpu": st["cpu_ms_median"] / (n * fwd["cpu_ms_median"]),
            "per_dense_train_cpu": st["cpu_ms_median"] / train["cpu_ms_median"]}


def bench_model(model: str, args: argparse.Namespace) -> list[dict]:
    setup = Setup(model, args)
    base = {"model": model, "device": args.device,
            "device_name": (torch.cuda.get_device_name(setup.dev) if args.device == "cuda"
                            else "cpu"),
            "threads": torch.get_num_threads(), "amp": args.amp,
            "channels_last": setup.channels_last, "batch": args.batch, "d": setup.layout.d,
            "backend": setup.backend, "keep_freed_memory": args.kept}
    dense_t = _time({"dense_forward": setup.dense_forward, "dense_train": setup.dense_train},
                    max(args.repeats, 5), setup.dev)
    dense = {what: _stats(ts) for what, ts in dense_t.items()}
    fwd, train = dense["dense_forward"], dense["dense_train"]
    # the dense forward each row's ratios use (MC steps: the one timed beside them)
    base.update(dense_forward_ms=fwd["ms_median"], dense_forward_cpu_ms=fwd["cpu_ms_median"])
    print(f"{model}: d={setup.layout.d:,} masked weights, batch {args.batch}, {args.device} "
          f"({base['device_name']}, {base['threads']} threads), amp {args.amp}, "
          f"{'channels_last' if setup.channels_last else 'nchw'}, MaskedModule backend "
          f"{setup.backend}; dense forward "
          f"{fwd['ms_median']:.2f} ms (CPU time {fwd['cpu_ms_median']:.2f}), dense training step "
          f"{train['ms_median']:.2f} ms (CPU time {train['cpu_ms_median']:.2f}); glibc keeps "
          f"freed memory: {'yes' if args.kept else 'no'}", flush=True)
    rows = []
    for what in ("dense_forward", "dense_train"):
        rows.append({**base, "what": what, "n": 1, "chunk": 1, "estimator": "", **dense[what],
                     "peak_mib": _peak(args, model, what, 1, setup),
                     "peak_one_shot_mib": float("nan"), **_ratios(dense[what], 1, dense),
                     "max_rel_diff": float("nan")})
    for n in args.ns:
        tr = setup.trainer(args, n)
        # dense forwards interleaved with the steps (before and after each): the ratios of a
        # step use the dense forward timed beside it, not one from minutes earlier
        fns = {"dense_a": setup.dense_forward, "mc": lambda tr=tr: tr.step(setup.f),
               "dense_b": setup.dense_forward, **floor_fns(setup, tr, n)}
        if args.compare and n >= 2:
            other = MaskTrainer(method_config(args, n, args.compare), setup.layout.d, 100,
                                setup.dev)
            fns["compare"] = lambda other=other: other.step(setup.f)
        ts = _time(fns, args.repeats, setup.dev)
        st = _stats(ts["mc"])
        floor = {w: _stats(ts[w])["ms_median"] for w in ("floor_forward", "floor_draw",
                                                        "floor_pass")}
        floor_ms = sum(floor.values())
        near = {**dense, "dense_forward": _stats(ts["dense_a"] + ts["dense_b"])}
        one_shot = (_peak(args, model, "mc_step", n, setup, chunk=n) if tr.chunk < n
                    else float("nan"))
        row = {**base, "what": "mc_step", "n": n, "chunk": tr.chunk, "estimator": tr.method,
               **st, "peak_mib": _peak(args, model, "mc_step", n, setup),
               "peak_one_shot_mib": one_shot, **_ratios(st, n, near),
               "max_rel_diff": float("nan"),
               "dense_forward_ms": near["dense_forward"]["ms_median"],
               "dense_forward_cpu_ms": near["dense_forward"]["cpu_ms_median"],
               **{f"{w}_ms": v for w, v in floor.items()}, "floor_ms": floor_ms,
               "per_floor": st["ms_median"] / floor_ms,
               "per_mask_forward": st["ms_median"] / floor["floor_forward"]}
        if "compare" in ts:
            cmp_ms = _stats(ts["compare"])["ms_median"]
            row.update(compare_estimator=args.compare, compare_ms=cmp_ms,
                       per_compare=st["ms_median"] / cmp_ms)
        rows.append(row)
        print(f"  MC step n={n:4d} ({tr.method}, chunk {tr.chunk:3d}): {st['ms_median']:10.2f} ms "
              f"[{st['ms_min']:.2f}-{st['ms_max']:.2f}] = {row['per_dense_forward']:6.2f} x n "
              f"dense forwards (CPU time: {row['per_dense_forward_cpu']:6.2f}) = "
              f"{row['per_dense_train']:7.2f} dense training steps; peak "
              f"{row['peak_mib']:8.1f} MiB (one-shot, chunk n: {one_shot:8.1f}); dense forward "
              f"beside it {row['dense_forward_ms']:.2f} ms (CPU time "
              f"{row['dense_forward_cpu_ms']:.2f})", flush=True)
        print(f"    floor {floor_ms:.2f} ms = forward of its masks {floor['floor_forward']:.2f} "
              f"+ drawing n d uniforms {floor['floor_draw']:.2f} + one pass over n d "
              f"{floor['floor_pass']:.2f}; step = {row['per_floor']:.2f} x floor = "
              f"{row['per_mask_forward']:.2f} x the forward of its masks", flush=True)
        if "compare" in ts:
            print(f"    {args.compare} step beside it {row['compare_ms']:.2f} ms; {tr.method} / "
                  f"{args.compare} = {row['per_compare']:.2f}", flush=True)
    peaks = [r["peak_mib"] for r in rows]
    print(f"  peak MiB: dense forward {peaks[0]:.1f}, dense training step {peaks[1]:.1f}",
          flush=True)
    frows = forward_rows(setup, args, model, base, dense)
    rows += frows
    by = {r["what"]: r for r in frows}
    line = ", ".join(f"{w[4:]} {r['ms_median']:.2f} ms ({r['per_dense_forward']:.2f} x k dense "
                     f"forwards; CPU time {r['per_dense_forward_cpu']:.2f})"
                     for w, r in by.items())
    print(f"  forward of k={args.chunk} masks: {line}; fast/vmap speedup "
          f"{by['fwd_vmap']['ms_median'] / by['fwd_fast']['ms_median']:.2f}x, fast/loop "
          f"{by['fwd_loop']['ms_median'] / by['fwd_fast']['ms_median']:.2f}x; max relative "
          f"difference from the loop: fast {by['fwd_fast']['max_rel_diff']:.2e}, module "
          f"({setup.backend}) {by['fwd_module']['max_rel_diff']:.2e}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = check_args(build_parser().parse_args(argv))
    # the allocator setting of the training commands (pbscale.prune, pbscale.regress), so the
    # steps timed are those users run
    args.kept = keep_freed_memory()
    torch.manual_seed(0)
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
    if args.child:  # one peak-memory measurement in a fresh process
        model, what, n = args.child.split(",")
        args.chunk = args.chunk_given or default_chunk(args, model)
        setup = Setup(model, args)
        fn = _step_fn(setup, args, what, int(n))
        print(json.dumps({"peak": peak_memory(fn, setup.dev)}))
        return 0
    out = check_out_dir(args.out)  # after every check: a refused run creates nothing
    rows = []
    for amp in args.amps:
        args.amp = amp
        for model in args.models:
            args.chunk = args.chunk_given or default_chunk(args, model)
            layouts = args.layout_list if model != "lenet" else ["nchw"]  # no conv in LeNet
            for layout in dict.fromkeys(layouts):
                args.channels_last = layout == "channels_last"
                rows += bench_model(model, args)
    path = out / f"bench_prune_{args.device}.csv"
    keys = dict.fromkeys(k for r in rows for k in r)  # the MC rows' floor columns: NaN elsewhere
    io.write_csv(path, [{k: r.get(k, float("nan")) for k in keys} for r in rows])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
