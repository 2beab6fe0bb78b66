"""``python -m pbscale.sweep run|status|results SWEEP.toml``: many runs of one command from a
TOML sweep file, on a local process pool or on Ray.

A sweep file (read with the standard library's ``tomllib``)::

    [sweep]
    command = "regress"        # pbscale.regress or pbscale.prune (pbscale.sweep.jobs.COMMANDS)
    out = "runs/regression/epochs300"   # parent folder of the run folders, relative to this
                                        # file's folder (--out overrides, relative to the cwd)
    threads = 1                # torch CPU threads per run (passed as --threads)
    cpus = 1                   # CPUs a run occupies: local pool size, Ray num_cpus
    gpus = 0.0                 # GPU fraction a run occupies (Ray num_gpus; local: runs per GPU)

    [base]                     # options shared by every run (the command's flags, _ for -)
    epochs = 300

    [[grid]]                   # every combination of the list values; scalars are fixed
    method = ["loorf", "arms"]
    n = [2, 10, 100, 1000]
    seed = [0, 1, 2]

The sweep is the union of its ``[[grid]]`` blocks (each merged over ``[base]``). Every value is
checked with the command's own parser before anything starts (:mod:`pbscale.sweep.file`): a
switch takes ``true``/``false``, any other flag a value of its type. A run listed twice, in any
spelling or with a default spelled out, is one run. Every run is the command's own CLI (``python
-m pbscale.regress ... --out OUT``) in a child process, so it lands in its own hash-named run
folder (:mod:`pbscale.runs.loop`): a finished run is never redone and an interrupted one resumes
from its last checkpoint. The sweep keeps one record and one log per run in ``OUT/sweep-<file
stem>/`` (``<id>.json``, ``<id>.log``; the id is a hash of the command and its options; the run
folder's name is the command's own hash, shown by ``status -v`` and ``results``): state (running,
finished, failed, interrupted), process id and start time, return code, times. A failed run keeps
its log and does not stop the others; a run whose folder holds ``diverged.json``
(:mod:`pbscale.runs.records`) is "diverged" in ``status`` and ``results`` and is not launched
again (its rerun would repeat the refusal; the user lowers the rate or deletes the record).
One ``sweep run`` at a time holds a sweep folder (a lock in ``OUT/sweep-<stem>/.lock``; a second
one is refused with the first one's process id; ``status`` works meanwhile). SIGTERM or Ctrl-C
to ``sweep run`` passes SIGTERM to the running children (they checkpoint and exit 143), prints
how to resume and exits 143; running the same command again goes on where it stopped.
Children die with the sweep, also when it is killed with SIGKILL (:mod:`pbscale.sweep.records`).
A finished run whose data file or network module changed since it trained (the files compared,
never imported: :mod:`pbscale.sweep.identity`) is named by ``status`` and ``results`` in one
warning line, and stops ``sweep run`` in one line with the choice: ``--rerun-changed`` (new run
folders beside the old ones) or ``--keep-changed``.

Engines (:mod:`pbscale.sweep.engines`): ``--engine local`` (default) runs ``--jobs`` children at
once (default: CPU cores // ``cpus``, and with ``gpus > 0`` at most ``floor(1 / gpus)`` runs per
visible GPU, each child pinned to one GPU with ``CUDA_VISIBLE_DEVICES``). ``--engine ray``
(``pip install -e ".[ray]"``) submits each run as a Ray task declaring ``num_cpus=cpus,
num_gpus=gpus``, so small runs share a GPU; ``--address`` joins an existing cluster
(``ray.init(address=...)``; the run folders must then be on a file system all nodes share),
otherwise a local Ray is started with ``--jobs`` CPUs. Both engines run the same child command,
so their results are identical (docs/sweeps.md says what a cluster needs).

Groups (``group = true`` under ``[sweep]``, or ``sweep run --group``; G runs in one process):
the ``regress`` runs (of every method of a regression group, ``pbscale.methods.names(
"regress-group")``) that differ only in ``seed`` and ``lr`` form groups
(:func:`pbscale.sweep.file.plan`), each one
child ``python -m pbscale.regress --lr ... --seeds ...`` that trains its members in one
process (each member's step its separate run's) and writes each member's run folder where
``pbscale.regress`` would, with the same numbers. A group's seeds x learning rates is a full product
(else it is split per learning rate); a group of one and a run with its own ``chunk`` launch as
single runs. ``prune`` runs that differ only in ``seed``, ``lam`` and ``mask_lr`` form pruning
groups the same way (a full product of the three, else split along the last axes:
:func:`pbscale.sweep.file.product_parts`; one ``python -m pbscale.prune --seeds ... --lam ...
--mask-lr ...`` child each, :mod:`pbscale.pruning.group`). Records stay per run (the members'
records name the group and share its log ``group-<id>.log``), so status, results and
skipping finished runs are as without groups; a group interrupted and launched again
resumes from its checkpoint under ``OUT/.groups``. A group occupies the resources of one run
(``cpus``, ``gpus``).

The package: :mod:`~pbscale.sweep.cli` (the command line), :mod:`~pbscale.sweep.file` (file
format, values, run ids, the plan of groups), :mod:`~pbscale.sweep.records` (records, lock,
launching a child, run folders), :mod:`~pbscale.sweep.identity` (changed data and networks)
and :mod:`~pbscale.sweep.engines` (local pool, Ray), over the job interface
:mod:`pbscale.sweep.jobs` (what a command is, how its runs group).
"""

from __future__ import annotations

from .cli import ENGINES, build_parser, main, print_status, write_results
from .engines import MAX_JOBS, Interrupted, Progress, default_jobs, run_local, run_ray
from .file import (
    COMMANDS,
    RESERVED,
    Group,
    Run,
    Sweep,
    command_actions,
    expand,
    groupable,
    label,
    load,
    members,
    plan,
    run_id,
)
from .records import (
    STATES,
    SweepLock,
    folder_index,
    launch,
    read_record,
    results,
    state_of,
    status,
    todo,
)

__all__ = ["COMMANDS", "ENGINES", "MAX_JOBS", "RESERVED", "STATES", "Group", "Interrupted",
           "Progress", "Run", "Sweep", "SweepLock", "groupable", "build_parser",
           "command_actions", "default_jobs", "expand", "folder_index", "label", "launch", "load",
           "main", "members", "plan", "print_status", "read_record", "results", "run_id",
           "run_local", "run_ray", "state_of", "status", "todo", "write_results"]
