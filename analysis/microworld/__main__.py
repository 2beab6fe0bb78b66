"""``python -m analysis.microworld``: the command of :mod:`analysis.microworld.cli`."""

from analysis.cli import run
from analysis.microworld.cli import main

raise SystemExit(run(main))
