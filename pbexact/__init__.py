"""pbexact: exact analysis of pseudo-Boolean optimization by enumeration.

Modules: ``vertices`` (zeta_h, multisets), ``polynomial`` (P_J, exact gradient, beta*),
``parametrizations`` (`tab:alternative_param`), ``estimators`` (REINFORCE, LOORF, ARMS, beta*;
shared with pbscale), ``copula`` (the ARMS Dirichlet copula), ``sampling``, ``variance``
(exact estimator variances), ``benchmarks`` (ExponentialTabularLoss, NNLoss).
"""

from .errors import PBInputError

__all__ = ["PBInputError"]
