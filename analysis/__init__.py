"""analysis: command-line entry points that verify the paper numerically and draw its figures."""
