"""Exact analysis behind the commands that verify the paper: the numerical checks of every
analytical claim (:mod:`.theorem_checks`, ``python -m analysis.theorems``), the exact bias and
MSE of the biased estimators (:mod:`.bias`, ``python -m analysis.bias``) and the exact estimator
variances along the true-gradient trajectory (:mod:`.variance`, ``python -m analysis.variance``,
``analysis.variance_compare``, ``analysis.variance_table``)."""
