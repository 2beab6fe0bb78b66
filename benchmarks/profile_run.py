"""Where one run's time and memory go, phase by phase, in a fresh process:

    python -m benchmarks.profile_run -- --model lenet --mode supermask --method arms \\
        --n 10 --param sigmoid --mask-lr 0.1 --lam 0.005 --epochs 1 --max-batches 1 \\
        --threads 1 --data-dir ../shared/data/mnist --out /tmp/profile --quiet
    python -m benchmarks.profile_run --command regress -- --method arms --n 10 \\
        --param escort --epochs 30 --threads 1 --out /tmp/profile
    python -m benchmarks.profile_run --code /tmp/pbnn-before -- ...   # another checkout

The command (``pbscale.prune`` or ``pbscale.regress``, its arguments after ``--``) runs in a
child process that imports the code of ``--code`` (default this checkout), with one OpenMP
thread. The child times its imports (torch, Numba, then the command's module), wraps the
run's phases that exist in that code (reading and splitting the data, building the task and
method, the loop's first evaluation, each epoch and inside it the evaluation, the checkpoint
and the exported files) and every Numba dispatch that compiles or loads from the cache, and
prints one row per phase: calls, wall and CPU seconds, the resident set after it and the
process's peak so far (MiB; a nested phase is indented under the one that contains it), then
the whole process's wall and CPU seconds and peak (``ru_maxrss``), and whether
``torch._dynamo`` was imported.
"""

from __future__ import annotations

import functools
import importlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

#: (label, depth, module, attribute path) of the phases wrapped where the code has them.
PHASES = (
    ("read MNIST (gunzip, sha256, parse)", 1, "pbscale.nets.data", "read_mnist"),
    ("split, standardization constants, fingerprint", 1, "pbscale.nets.data", "from_arrays"),
    ("load the data", 0, "pbscale.pruning.setup", "load_data"),
    ("make the regression problem", 0, "pbscale.regression.run", "make_problem"),
    ("build task and method", 0, "pbscale.pruning.run", "build"),
    ("make the mask optimizer", 1, "torch.optim", "RMSprop.__init__"),
    ("make the mask optimizer", 1, "pbscale.methods.optimizers", "RMSprop.__init__"),
    ("loop set-up with the first evaluation", 0, "pbscale.runs.loop", "Training.__init__"),
    ("epoch (steps, evaluation, checkpoint)", 0, "pbscale.runs.loop", "Training.epoch"),
    ("evaluation", 1, "pbscale.pruning.task", "PruneTask.evaluate"),
    ("evaluation", 1, "pbscale.regression.problem", "RegressionTask.evaluate"),
    ("checkpoint", 1, "pbscale.runs.loop", "Training.save"),
    ("masks.pt and pruned.pt", 1, "pbscale.pruning.outputs", "export"),
)


def _status() -> tuple[float, float]:
    """(resident set, peak resident set) in MiB."""
    got = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                got[key] = int(value.split()[0]) / 1024
    return got.get("VmRSS", float("nan")), got.get("VmHWM", float("nan"))


class Book:
    """The phases' rows in the order they first ended."""

    def __init__(self) -> None:
        self.rows: dict[str, list] = {}

    def add(self, label: str, depth: int, wall: float, cpu: float) -> None:
        rss, peak = _status()
        row = self.rows.setdefault(label, [depth, 0, 0.0, 0.0, rss, peak])
        row[1] += 1
        row[2] += wall
        row[3] += cpu
        row[4], row[5] = rss, peak

    def wrap(self, label: str, depth: int, fn):
        @functools.wraps(fn, assigned=("__name__", "__qualname__", "__doc__"))
        def timed(*args, **kwargs):
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(label, depth, time.perf_counter() - t, time.process_time() - c)
        return timed


def _patch(book: Book, label: str, depth: int, module: str, path: str) -> None:
    """Wrap ``module.path`` (``Class.method`` or a function) where the code has it."""
    try:
        owner = importlib.import_module(module)
    except ImportError:
        return
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part, None)
        if owner is None:
            return
    fn = getattr(owner, name, None)
    if fn is not None and getattr(fn, "__module__", "") != __name__:  # not wrapped twice
        setattr(owner, name, book.wrap(label, depth, fn))


def child(command: str, argv: list[str]) -> None:
    """The profiled run, in this process (see the module docstring)."""
    t0, c0 = time.perf_counter(), time.process_time()
    book = Book()
    for label, module in (("import torch", "torch"), ("import numba", "numba"),
                          (f"import pbscale.{command}", f"pbscale.{command}")):
        t, c = time.perf_counter(), time.process_time()
        importlib.import_module(module)
        book.add(label, 0, time.perf_counter() - t, time.process_time() - c)
    for label, depth, module, path in PHASES:
        _patch(book, label, depth, module, path)
    import numba.core.dispatcher as dispatcher

    compile_for_args = dispatcher.Dispatcher._compile_for_args

    def timed_compile(self, *args, **kwargs):
        t, c = time.perf_counter(), time.process_time()
        try:
            return compile_for_args(self, *args, **kwargs)
        finally:
            book.add("Numba compile or cache load (first is its start-up)", 0,
                     time.perf_counter() - t, time.process_time() - c)

    dispatcher.Dispatcher._compile_for_args = timed_compile
    code = importlib.import_module(f"pbscale.{command}").main(argv)
    print(f"{'phase':56s} {'calls':>5s} {'wall s':>7s} {'CPU s':>6s} {'RSS':>5s} {'peak':>5s}")
    for label, (depth, calls, wall, cpu, rss, peak) in book.rows.items():
        print(f"{'  ' * depth + label:56s} {calls:5d} {wall:7.2f} {cpu:6.2f} {rss:5.0f} "
              f"{peak:5.0f}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"whole process after start-up: {time.perf_counter() - t0:.2f} s wall, "
          f"{time.process_time() - c0:.2f} s CPU; peak {usage.ru_maxrss / 1024:.0f} MiB; "
          f"torch._dynamo imported: {'torch._dynamo' in sys.modules}; exit {code}")


def main(argv: list[str] | None = None) -> int:
    from pbexact.cli import ArgumentParser, run_main
    from pbexact.errors import PBInputError

    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = ArgumentParser(prog="python -m benchmarks.profile_run",
                       description=__doc__.splitlines()[0])
    p.add_argument("--command", choices=("prune", "regress"), default="prune",
                   help="the command profiled (default prune); its arguments after --")
    p.add_argument("--code", default=str(Path(__file__).resolve().parent.parent),
                   help="the checkout whose code runs (default this one)")
    args = p.parse_args_or_code(own)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args

    def body() -> int:
        root = Path(args.code).expanduser().resolve()
        if not (root / "pbscale" / f"{args.command}.py").is_file():
            raise PBInputError(f"--code {args.code} holds no pbnn checkout (no "
                               f"pbscale/{args.command}.py); name a checkout's root folder")
        if not rest:
            raise PBInputError(f"no arguments for pbscale.{args.command}; give them after --, "
                               "e.g. -- --synthetic 256 --epochs 1 --out /tmp/profile")
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                               args.command, *rest], cwd=root, env=env).returncode

    return run_main(body)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.path.insert(0, os.getcwd())
        child(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main())
