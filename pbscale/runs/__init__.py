"""The one run loop and what a run writes: :mod:`.loop` (:func:`~pbscale.runs.loop.run`:
epochs, schedules, phases, checkpoints, resume, divergence), :mod:`.contracts` (what a task and a
method provide, the loop's settings and hooks), :mod:`.divergence` (the checks that stop a
diverged run, naming its cause), :mod:`.records` (run folders by configuration
hash, their records, locks and divergence records), :mod:`.io` (atomic reads and writes of a
run's files), :mod:`.runtime` (device and threads) and :mod:`.memory` (peak memory of a
call)."""
