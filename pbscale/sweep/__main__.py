"""``python -m pbscale.sweep run|status|results SWEEP.toml`` (:mod:`pbscale.sweep`)."""

import sys

from .cli import main

sys.exit(main())
