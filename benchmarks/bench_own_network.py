"""A user's own network through pbnn's generic path against the specialised MLP path and against
plain ``torch.func.vmap`` over ``functional_call``, on one MC pruning step (ARMS, escort;
`alg:iter_arms`) of LeNet-300-100 at batch 128, measured side by side in one process.

Three ways to hold the same network and the same weights:

* ``mlp``: the built-in ``pbscale.nets.models.LeNet300100``, an ``nn.Sequential`` the MLP path runs
  (:class:`pbscale.forward.backends.MlpInplace`: batched products in place);
* ``generic``: the same layers in a user's own ``nn.Module`` with its own ``forward``
  (:class:`UserLeNet`), as ``--model package.module:factory`` would bring it: pbnn sees no
  ``nn.Sequential`` and takes its generic backend (:meth:`pbscale.forward.backends.BackendChoice.
  choose`: vmap here);
* ``plain_vmap``: the baseline a user would write without pbnn's backends: the same MC step
  (:class:`pbscale.methods.MaskTrainer`) whose batched loss is ``torch.func.vmap`` over
  ``torch.func.functional_call`` of the user's module with w * z, written out here.

Each step: n masks sampled, evaluated in one chunk, the ARMS estimate and the RMSprop update of
the logits. Goals (issue 40): generic / mlp <= 1.5 and generic / plain_vmap <= 1.0 (within
the noise of the medians). Writes ``OUT/bench_own_network_<device>.csv``.

    python -m benchmarks.bench_own_network [--ns 10] [--batch 128] [--repeats 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from pbexact.cli import ArgumentParser, positive_int, positive_int_list, run_main
from pbexact.io import check_out_dir
from pbscale.forward.folded import cross_entropy_per_mask
from pbscale.forward.masks import MaskedModule
from pbscale.methods import MaskTrainer, MethodConfig
from pbscale.nets.models import build_model
from pbscale.nets.network import masked_names
from pbscale.runs import io


class UserLeNet(nn.Module):
    """LeNet-300-100 as a user writes it: three Linear layers and a forward of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 300), nn.Linear(300, 100), nn.Linear(100, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def plain_vmap_loss(net: nn.Module, names: list[str], x: torch.Tensor, y: torch.Tensor
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The batched loss f(z (k, d)) -> (k,) written with torch.func alone: each mask's weights
    w * z, one ``functional_call`` per mask under ``vmap``, cross-entropy per mask."""
    params = {k: p.detach() for k, p in net.named_parameters()}
    shapes = [params[k].shape for k in names]
    sizes = [params[k].numel() for k in names]

    def one(weights: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(net, {**params, **weights}, (x,))

    def f(z: torch.Tensor) -> torch.Tensor:
        parts = torch.split(z, sizes, dim=-1)
        weights = {k: params[k] * p.reshape(-1, *s) for k, p, s in zip(names, parts, shapes)}
        return cross_entropy_per_mask(vmap(one)(weights), y)

    return f


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.bench_own_network",
                       description=__doc__.splitlines()[0])
    p.add_argument("--ns", type=positive_int_list, default=[10], help="MC samples per step")
    p.add_argument("--batch", type=positive_int, default=128,
                   help="examples per timed step (default 128)")
    p.add_argument("--repeats", type=positive_int, default=20,
                   help="timed steps per way (interleaved, after one warm-up)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch CPU threads (default 1)")
    p.add_argument("--out", default="results", help="folder of the CSV")
    return p


def measure(n: int, batch: int, repeats: int) -> list[dict]:
    """Median wall milliseconds of one MC step each way at n samples, interleaved."""
    builtin = build_model("lenet", seed=0).train()
    user = UserLeNet()
    user.load_state_dict(builtin.state_dict())  # the same weights
    names = masked_names(builtin)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 784, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    mlp, generic = MaskedModule(builtin, names), MaskedModule(user, names)
    losses = {"mlp": mlp.loss_fn(x, y, cross_entropy_per_mask),
              "generic": generic.loss_fn(x, y, cross_entropy_per_mask),
              "plain_vmap": plain_vmap_loss(user, names, x, y)}
    paths = {"mlp": mlp.path_for("cpu"), "generic": generic.path_for("cpu"),
             "plain_vmap": "vmap (written out)"}
    cfg = MethodConfig(method="arms", n=n, param="escort", chunk=n, seed=0)
    trainers = {k: MaskTrainer(cfg, mlp.d, 1000, torch.device("cpu")) for k in losses}
    times: dict[str, list[float]] = {k: [] for k in losses}
    for rep in range(repeats + 1):
        for k, f in losses.items():
            t = time.perf_counter()
            trainers[k].step(f)
            if rep:
                times[k].append(1e3 * (time.perf_counter() - t))
    med = {k: statistics.median(v) for k, v in times.items()}
    return [{"n": n, "way": k, "path": paths[k], "ms_median": med[k], "ms_min": min(times[k]),
             "ms_max": max(times[k]), "over_mlp": med[k] / med["mlp"],
             "over_plain_vmap": med[k] / med["plain_vmap"]} for k in losses]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args_or_code(argv)
    if isinstance(args, int):
        return args

    def body() -> None:
        out = check_out_dir(args.out)
        torch.set_num_threads(args.threads)
        rows = [r for n in args.ns for r in measure(n, args.batch, args.repeats)]
        print(f"LeNet-300-100 ARMS MC step, batch {args.batch}, {args.threads} thread(s), "
              f"median of {args.repeats}")
        for r in rows:
            print(f"  n={r['n']:<4} {r['way']:<11} {r['path']:<18} {r['ms_median']:8.2f} ms "
                  f"(min {r['ms_min']:.2f})  x{r['over_mlp']:.2f} of mlp, "
                  f"x{r['over_plain_vmap']:.2f} of plain vmap")
        io.write_csv(out / "bench_own_network_cpu.csv", rows)
        print(f"wrote {out / 'bench_own_network_cpu.csv'}")

    return run_main(body)


if __name__ == "__main__":
    sys.exit(main())
