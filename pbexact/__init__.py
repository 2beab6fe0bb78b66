"""pbexact: exact analysis of pseudo-Boolean optimization by enumeration.

Modules: ``vertices`` (zeta_h, multisets), ``polynomial`` (P_J, exact gradient, beta*),
``parametrizations`` (`tab:alternative_param`), ``estimators`` (the registry: REINFORCE, LOORF,
ARMS, beta*, DisARM; shared with pbscale), ``copula`` (the ARMS Dirichlet copula, antithetic
pairs), ``sampling``, ``variance`` and ``closed_form`` (exact estimator variances),
``bad_generalization`` (`thm:mc_bad_gen_2`, `cor:mc_bad_gen_2`), ``instances`` (the microworld's
problem instances: ExponentialTabularLoss, NNLoss, a random table), ``relaxations`` (concrete
and hard-concrete samples at temperature beta, their quadrature) and ``bias`` (the exact bias and
MSE of biased estimators); plumbing: ``cli``, ``errors``, ``io``, ``processes``
and ``provenance``.
"""

from .errors import PBInputError

__all__ = ["PBInputError"]
