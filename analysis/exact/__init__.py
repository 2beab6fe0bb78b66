"""Exact analysis behind the commands that verify the paper: the numerical checks of every
analytical claim (:mod:`.theorem_checks`, ``python -m analysis.theorems``) and the exact bias and
MSE of the biased estimators (:mod:`.bias`, ``python -m analysis.bias``)."""
