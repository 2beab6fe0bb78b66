"""What every test process shares: one OpenMP/MKL thread.

The suite runs in two processes (``-n 2``, pytest-xdist, set in pyproject.toml), and the runs it
starts (sweeps, torchrun ranks, report units) are more processes again. With torch's default of
one thread per core in each, a 2-core machine runs several times more threads than cores, and
OpenMP's spin-waits stall each other (a tiny LeNet run measured 4.7 s instead of 0.24 s). Set
here, before any test module imports torch, and inherited by every child; a value the caller
set is kept. Tests that check thread handling pass ``--threads`` explicitly."""

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
