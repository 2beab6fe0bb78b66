"""Exact analysis behind the commands that verify the paper: the numerical checks of every
analytical claim (``python -m analysis.theorems``: the row each returns, :mod:`.check_result`;
the checks of the multilinear polynomial, :mod:`.polynomial_checks`, of the score-function
estimators, :mod:`.estimator_checks`, of unwanted generalization,
:mod:`.bad_generalization_checks`, and of the estimators that differentiate J,
:mod:`.bias_checks`), the exact bias and MSE of the biased estimators (:mod:`.bias`,
``python -m analysis.bias``) and the exact estimator variances along the true-gradient
trajectory (:mod:`.variance`, ``python -m analysis.variance``, ``analysis.variance_compare``,
``analysis.variance_table``)."""
