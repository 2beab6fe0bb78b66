"""Reference values shared by the tests (exact-core issue): d=1, J(z) = (z - 0.49)^2, the variance
of the estimated derivative with respect to the sigmoid logit, by theta and (estimator, n)."""

D1_TABLE = ((0 - 0.49) ** 2, (1 - 0.49) ** 2)

D1_VARIANCES = {
    0.5: {("reinforce", 1): 1.56375e-2, ("loorf", 2): 2.5e-5, ("loorf", 4): 4.1667e-6,
          ("loorf", 10): 5.5556e-7, ("arms", 2): 0.0, ("arms", 4): 6.0780e-7,
          ("arms", 10): 1.2868e-7},
    0.3: {("reinforce", 1): 1.355903e-2, ("loorf", 2): 2.436e-5, ("loorf", 4): 6.3e-6,
          ("loorf", 10): 1.736e-6, ("arms", 2): 1.176e-5, ("arms", 4): 9.2906e-7,
          ("arms", 10): 5.2314e-7},
}
