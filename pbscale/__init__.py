"""pbscale: the estimators of pbexact on masked torch networks (CPU or GPU)."""
