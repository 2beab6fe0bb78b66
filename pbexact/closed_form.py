"""Exact estimator variances in closed form, for d up to 20 (`sec:app_true_var`).

Multiset enumeration (`pbexact.variance.exact_moments`) costs C(2^d + n - 1, n) terms; here every
variance comes from a few O(d 2^d) passes over the J table instead, with the same result to
round-off. Two facts make this possible:

* For every parametrization of `tab:alternative_param`, the score of logit p depends on one bit
  only and is affine in it: s_p(z) = A_p + B_p z_{bit(p)}. So every moment needed factors into a
  per-bit table of the J table (marginalised over the other bits) times a 2-point or 2x2 weight
  in bit(p).
* The n samples are iid for REINFORCE, LOORF and beta*; for ARMS (`alg:orig_arms`) they are
  exchangeable, with dimensions independent, so the joint law of any m <= 4 of them in one
  dimension follows from the Dirichlet copula by inclusion-exclusion over at most 4 terms; for
  DisARM, n/2 iid antithetic pairs, each pair's law a product over dimensions.

Estimators, per parameter p (the variance is per parameter; `EstimatorMoments.total_variance` sums
them):

* REINFORCE and beta*: Var = (1/n) Var[single-sample term].
* LOORF (`eq:loorf`) is the U-statistic of order 2 with kernel h(a, b) = (J_a - J_b)(s_a - s_b)/2,
  so Var = (2 (n-2) zeta_1 + zeta_2) / C(n, 2) (Hoeffding), zeta_1 = Var E[h | a], zeta_2 = Var h.
* DisARM is the mean of n/2 iid pair terms h(x, y) / (1 - rho), so Var = Var h / (n/2) /
  (1 - rho)^2, E[h^2] as ARMS's same-pair class with the antithetic pair law.
* ARMS is the same U-statistic on copula samples divided by 1 - rho. Its square is a sum over
  pairs of sample pairs in three overlap classes (same pair: C(n,2) of them; one shared sample:
  n(n-1)(n-2); disjoint: n(n-1)(n-2)(n-3)/4), each class needing the copula law of 2, 3 or 4
  samples and the bilinear forms K_i(a, b) = sum_{x_i=a, y_i=b} J(x) J(y) prod_{j != i} P2_j(x_j,
  y_j), P2_j the law of two samples' bits j. A Kronecker-factored transform gives all d of them in
  O(d log d 2^d) time and O(log d 2^d) memory, without the 4^d matrix.

All of it is float64; LOORF, ARMS and beta* are invariant to adding a constant to J, so they work
with J minus its mean, which keeps the differences E[g^2] - E[g]^2 from cancelling needlessly.
The two passes over the 2^d table (`bit_marginals`, `pair_kernels`) are Numba loops: in numpy,
their O(d log d) small calls cost more than the arithmetic at d = 10.
"""

from __future__ import annotations

import math
from functools import cache

import numba
import numpy as np

from . import estimators as est
from .copula import (
    antithetic_correlation,
    antithetic_pair_law,
    arms_correlation,
    upper_tails,
)
from .errors import PBInputError, check_n, check_table, check_theta
from .parametrizations import Parametrization, get_parametrization
from .polynomial import expected_loss
from .variance import EstimatorMoments

#: Largest d accepted (API, CLIs and README agree): a call at d = 20 takes about 0.25 s and a few
#: 2^d float64 tables; the benchmark measures up to here.
MAX_CLOSED_FORM_D = 20
#: Largest n of the closed-form ARMS variance. Its absolute error is about float64 eps times
#: E[g]^2 for any n (the disjoint-pair class cancels to O(1/n)), so for a variance of order 1/n
#: the relative error grows like eps n: measured against 50-digit mpmath on random d = 2 tables,
#: <= 4e-10 at n = 10^6, 2e-7 at 10^8, 1e-6 at 10^9 (tests/test_hardening.py).
MAX_ARMS_CLOSED_FORM_N = 10**6


def score_coefficients(
    param: Parametrization, r: np.ndarray, d: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, bit) with s_p(z) = A_p + B_p z_{bit_p} for every logit p, shapes (P,).

    Read off the parametrization's own score at z = 0 and z = 1, so every row of
    `tab:alternative_param` (and any future one whose score is affine in its bit) plugs in.
    """
    a, b = param.affine_score(r)
    return a, b, param.expand(np.arange(d))


@numba.njit(cache=True)
def _bit_marginals_kernel(tables: np.ndarray, weights: np.ndarray) -> np.ndarray:
    nt, size = tables.shape
    d = weights.shape[0]
    out = np.zeros((nt, d, 2))
    pre = np.empty(d + 1)
    suf = np.empty(d + 1)
    for x in range(size):
        # prod_{j != i} = prefix (j < i) times suffix (j > i): no division by a zero theta
        pre[0] = 1.0
        for j in range(d):
            pre[j + 1] = pre[j] * weights[j, (x >> j) & 1]
        suf[d] = 1.0
        for j in range(d - 1, -1, -1):
            suf[j] = suf[j + 1] * weights[j, (x >> j) & 1]
        for i in range(d):
            w = pre[i] * suf[i + 1]
            for k in range(nt):
                out[k, i, (x >> i) & 1] += tables[k, x] * w
    return out


def bit_marginals(tables: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """G[..., i, a] = sum_{x: x_i = a} T(x) prod_{j != i} p_j(x_j) for tables T of shape
    (..., 2^d), shape (..., d, 2); p_j = Bern(theta_j). Then E[T(z) f(z_i)] = sum_a p_i(a) G[i, a]
    f(a) for any f. One O(d 2^d) pass (Numba).
    """
    d = theta.shape[-1]
    weights = np.ascontiguousarray(np.stack([1 - theta, theta], axis=-1))  # (d, 2)
    flat = np.ascontiguousarray(tables.reshape(-1, 2**d), dtype=np.float64)
    return _bit_marginals_kernel(flat, weights).reshape(tables.shape[:-1] + (d, 2))


@numba.njit(cache=True)
def _apply_bit(src: np.ndarray, dst: np.ndarray, mat: np.ndarray, j: int) -> None:
    """dst = (I x ... x mat (on bit j) x ... x I) src for a 2x2 mat; src may be dst."""
    step = 1 << j
    for base in range(0, src.size, 2 * step):
        for k in range(base, base + step):
            a, b = src[k], src[k + step]
            dst[k] = mat[0, 0] * a + mat[0, 1] * b
            dst[k + step] = mat[1, 0] * a + mat[1, 1] * b


@numba.njit(cache=True)
def _pair_kernels_kernel(table: np.ndarray, pair: np.ndarray) -> np.ndarray:
    d = pair.shape[0]
    out = np.zeros((d, 2, 2))
    levels = 2
    while (1 << (levels - 2)) < d:
        levels += 1
    buf = np.empty((levels, table.size))
    buf[0] = table
    # depth-first over the halving tree, explicit stack of tasks (level, keep lo/hi, other lo/hi):
    # buf[level] = buf[level - 1] transformed on the bits [other lo, other hi). A task's subtree
    # only writes deeper levels, so its sibling still finds buf[level - 1] intact.
    stack = np.empty((2 * levels + 2, 5), dtype=np.int64)
    top = 0
    stack[0] = (0, 0, d, 0, 0)
    top = 1
    while top > 0:
        top -= 1
        lvl, klo, khi, olo, ohi = stack[top]
        if lvl > 0:
            buf[lvl] = buf[lvl - 1]
            for j in range(olo, ohi):
                _apply_bit(buf[lvl], buf[lvl], pair[j], j)
        if khi - klo == 1:
            i = klo
            t = buf[lvl]
            for x in range(table.size):
                a = (x >> i) & 1
                x0 = x & ~(1 << i)
                out[i, a, 0] += table[x] * t[x0]
                out[i, a, 1] += table[x] * t[x0 | (1 << i)]
            continue
        mid = (klo + khi) // 2
        stack[top] = (lvl + 1, mid, khi, klo, mid)  # right half, after the left's subtree
        stack[top + 1] = (lvl + 1, klo, mid, mid, khi)
        top += 2
    return out


def pair_kernels(table: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """K[i, a, b] = sum_{x_i=a, y_i=b} T(x) T(y) prod_{j != i} pair[j, x_j, y_j], shape (d, 2, 2).

    ``pair`` has shape (d, 2, 2). Every K_i needs the transform on all bits but i; splitting the
    bits in halves and transforming the other half before recursing shares the work, so all d
    kernels cost O(d log d 2^d) time and O(log d 2^d) memory instead of O(d^2 2^d) (Numba).
    """
    return _pair_kernels_kernel(
        np.ascontiguousarray(table, dtype=np.float64), np.ascontiguousarray(pair, dtype=np.float64)
    )


def subset_patterns(theta: np.ndarray, n: int, m: int) -> np.ndarray:
    """Copula law of m <= n given ARMS samples in each dimension: q[i, w] = P(bit i of sample k is
    bit k of w, k < m), shape (d, 2^m).

    z~ = 1 iff the Dirichlet coordinate d < c (theta > 0.5) or d > c (theta <= 0.5), and a given
    set of t samples all have d > c with probability (1 - t c)_+^(n-1) (`pbexact.copula`); a
    pattern with `below` samples under c is the inclusion-exclusion over those samples only, at
    most m = 4 terms, so it stays accurate for n in the thousands (unlike the all-n-samples
    pattern table, whose binomials grow with n).
    """
    upper, tails = upper_tails(theta, n, m)  # (d, m+1): t given samples > c, no cancellation
    by_below = tails @ _inclusion_exclusion(m).T  # (d, m+1): patterns by # samples below c
    ones = _pattern_bits(m).sum(-1)
    out = np.where(upper[..., None], by_below[..., ones], by_below[..., m - ones])
    return np.clip(out, 0.0, None)  # only round-off can make a pattern negative


@cache
def _inclusion_exclusion(m: int) -> np.ndarray:
    """A[k, j]: P(k given samples below c, the other m - k above) = sum_j A[k, j] P(j given
    samples above c) = sum_t (-1)^t C(k, t) P(m - k + t above), shape (m+1, m+1)."""
    a = np.zeros((m + 1, m + 1))
    for k in range(m + 1):
        for t in range(k + 1):
            a[k, m - k + t] = (-1) ** t * math.comb(k, t)
    a.setflags(write=False)  # shared by every caller through the cache
    return a


@cache
def _pattern_bits(m: int) -> np.ndarray:
    """bits[w, k] = bit k of w, shape (2^m, m)."""
    bits = (np.arange(2**m)[:, None] >> np.arange(m)) & 1
    bits.setflags(write=False)  # shared by every caller through the cache
    return bits


class _ArmsMoments:
    """E[h(P)] and E[h(P) h(Q)] for ARMS sample pairs P, Q, per parameter, h(x, y) =
    (J_x - J_y)(s_x - s_y) / 2 (`eq:loorf`).

    With m <= 4 samples involved, the expectation is a sum over their bit patterns w in dimension
    bit(p) (law q, from the copula): the score factors are numbers per w, and each J_u J_v factor
    becomes G2 (u = v, one sample, the other bits iid) or the pair kernel K (u != v, the other bits
    from the two-sample copula law) at the bits w_u, w_v.
    """

    def __init__(
        self,
        g1: np.ndarray,
        g2: np.ndarray,
        kern: np.ndarray,
        laws: dict[int, np.ndarray],
        a: np.ndarray,
        b: np.ndarray,
        bit: np.ndarray,
    ) -> None:
        """g1, g2 (P, 2) and kern (P, 2, 2), already taken at each logit's bit; laws[m] the
        copula law of m samples per bit, (d, 2^m), for m = 2..min(n, 4)."""
        self.g1, self.g2, self.kern = g1, g2, kern
        self.law: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for m, q_bits in laws.items():
            bits = _pattern_bits(m)
            q = q_bits[bit]  # (P, 2^m)
            s = a[:, None, None] + b[:, None, None] * bits[None]  # (P, 2^m, m)
            onehot = (bits[:, :, None] == np.arange(2)) * 1.0  # (2^m, m, 2): w_k == a
            self.law[m] = (q, s, onehot)

    def mean(self) -> np.ndarray:
        """E[h(0, 1)], shape (P,)."""
        q, s, onehot = self.law[2]
        weight = q * (s[..., 0] - s[..., 1])
        return ((weight @ (onehot[:, 0] - onehot[:, 1])) * self.g1).sum(-1) / 2

    def product(self, first: tuple[int, int], second: tuple[int, int]) -> np.ndarray:
        """E[h(first) h(second)] for pairs of sample indices among 0..m-1, shape (P,)."""
        (x1, y1), (x2, y2) = first, second
        m = max(*first, *second) + 1
        q, s, _ = self.law[m]
        weight = q * (s[..., x1] - s[..., y1]) * (s[..., x2] - s[..., y2])  # (P, 2^m)
        same, cross = _j_indicators(first, second, m)
        out = ((weight @ same) * self.g2).sum(-1)
        out += (np.einsum("pw,wab->pab", weight, cross) * self.kern).sum((-1, -2))
        return out / 4


@cache
def _j_indicators(
    first: tuple[int, int], second: tuple[int, int], m: int
) -> tuple[np.ndarray, np.ndarray]:
    """The J factors of h(first) h(second) by pattern w of m samples: (J_x1 - J_y1)(J_x2 - J_y2)
    = sum of +-J_u J_v; ``same[w, a]`` sums the signs of the u = v terms with w_u = a, ``cross[w,
    a, b]`` those of u != v with w_u = a, w_v = b. Shapes (2^m, 2) and (2^m, 2, 2)."""
    (x1, y1), (x2, y2) = first, second
    onehot = (_pattern_bits(m)[:, :, None] == np.arange(2)) * 1.0  # (2^m, m, 2)
    same = np.zeros((2**m, 2))
    cross = np.zeros((2**m, 2, 2))
    for sign, u, v in ((1, x1, x2), (-1, x1, y2), (-1, y1, x2), (1, y1, y2)):
        if u == v:
            same += sign * onehot[:, u]
        else:
            cross += sign * onehot[:, u, :, None] * onehot[:, v, None, :]
    same.setflags(write=False)  # shared by every caller through the cache
    cross.setflags(write=False)
    return same, cross


def check_closed_form_size(d: int, n: int, estimators: tuple[str, ...] = est.ESTIMATORS) -> None:
    """The sizes the closed form accepts: d <= MAX_CLOSED_FORM_D, and n <= MAX_ARMS_CLOSED_FORM_N
    when an estimator on the ARMS copula is asked for (its accurate range); the API and the CLIs
    call this one check."""
    if d > MAX_CLOSED_FORM_D:
        raise PBInputError(f"closed-form variances go up to d={MAX_CLOSED_FORM_D}, got d={d}; "
                           "use a smaller table")
    n = check_n(n)
    copula = any(est.get_estimator(name).law == "copula" for name in estimators)
    if copula and n > MAX_ARMS_CLOSED_FORM_N:
        raise PBInputError(
            f"the closed-form ARMS variance is accurate up to n={MAX_ARMS_CLOSED_FORM_N:,} "
            f"(float64 cancellation between sample pairs beyond), got n={n:,}; use a smaller n "
            "or leave ARMS out of the estimators"
        )


def closed_form_moments(
    J: np.ndarray,
    r: np.ndarray,
    n: int,
    parametrization: str | Parametrization = "sigmoid",
    estimators: tuple[str, ...] | None = None,
) -> dict[str, EstimatorMoments]:
    """Exact mean and variance of each estimator at logits r (shape (P,)), shapes (P,) each, equal
    to `pbexact.variance.exact_moments` to round-off, without enumeration (`sec:app_true_var`).

    Cost per call: O(d 2^d) for REINFORCE, LOORF and beta*, O(d log d 2^d) for ARMS and DisARM,
    independent of n. J is the table of 2^d losses (index h, z_i = bit i-1 of h). The formula
    follows the estimator's spec (`pbexact.estimators.REGISTRY`: law, centering, constant), not
    its name; a combination without a closed form here is a PBInputError. ``estimators``:
    default every one defined for this n.
    """
    param = get_parametrization(parametrization)
    r = np.asarray(r, dtype=np.float64)
    if r.ndim != 1:
        raise PBInputError(f"closed-form moments take one logit vector, shape (P,), not {r.shape}; "
                           "call once per vector")
    theta = check_theta(param.theta(r))
    param.check_exact(r)
    d = theta.shape[-1]
    n = check_n(n)
    if estimators is None:
        estimators = est.estimators_for(n)
    check_closed_form_size(d, n, estimators)
    J = check_table(J, d)
    specs = [est.get_estimator(name) for name in estimators]
    for spec in specs:
        spec.check_n(n)
        closed_form_kind(spec)

    a, b, bit = score_coefficients(param, r, d)
    mu = float(expected_loss(J, theta))
    Jc = J - mu  # LOORF, ARMS, DisARM and beta* do not see a constant shift of J
    p = np.stack([1 - theta, theta], axis=-1)[bit]  # (P, 2): P(z_bit = 0), P(z_bit = 1)
    # (P, 2): score at z_bit = 0, 1, each evaluated directly: a + b loses every digit of s(1)
    # when |a| is huge (direct parametrization at theta = 1 - 1e-16)
    zero = np.zeros_like(theta)
    s = np.stack([param.score(zero, r), param.score(zero + 1, r)], axis=-1)
    g1, g2 = bit_marginals(np.stack([Jc, Jc * Jc]), theta)[:, bit]  # (P, 2) each
    g = np.stack([np.ones_like(g1), g1, g2])  # G of the constant 1 is exactly 1
    # E[T s^k] for T = 1, Jc, Jc^2 and k = 0, 1, 2, shape (3, 3, P)
    # p s^k as (p s) s: at theta = 1e-300 (direct) s = 1/theta and s * s alone would overflow
    ps = p * s
    mom = np.einsum("tpa,kpa->tkp", g, np.stack([p, ps, ps * s]))
    es, es2 = mom[0, 1], mom[0, 2]
    ejs, ejs2 = mom[1, 1], mom[1, 2]
    ej2, ej2s, ej2s2 = mom[2, 0], mom[2, 1], mom[2, 2]

    out: dict[str, EstimatorMoments] = {}
    for spec in specs:
        kind = closed_form_kind(spec)
        if kind == "single":
            if spec.constant is None:
                # J = Jc + mu: E[J s] = E[Jc s] + mu E[s], E[J^2 s^2] by the same expansion
                mean = ejs + mu * es
                second = ej2s2 + 2 * mu * ejs2 + mu**2 * es2
            else:
                # beta*_i - E[J] = E[Jc with theta_i flipped] (`thm:bStarTwo`,
                # `pbexact.polynomial.flipped_expectation`), read off the per-bit marginals of Jc
                beta = (p[:, ::-1] * g1).sum(-1)
                mean = ejs - beta * es
                second = ej2s2 - 2 * beta * ejs2 + beta**2 * es2
            var = (second - mean**2) / n
        elif kind == "loo_iid":
            mean, var = _loorf_moments(n, es, es2, ejs, ej2, ej2s, ej2s2)
        elif kind == "loo_copula":
            mean, var = _arms_moments(Jc, theta, n, a, b, bit, g1, g2, param)
        else:
            mean, var = _pair_moments(Jc, theta, n, a, b, bit, g1, g2, param)
        out[spec.name] = EstimatorMoments(mean=mean, variance=np.maximum(var, 0.0))
    return out


def closed_form_kind(spec: est.EstimatorSpec) -> str:
    """Which closed form an estimator's spec takes: single-sample terms (iid, no centering,
    baseline 0 or beta*), the LOORF U-statistic on iid or copula samples, or antithetic pairs."""
    key = (spec.law, spec.center, spec.constant)
    kinds = {
        ("iid", "none", None): "single",
        ("iid", "none", "beta"): "single",
        ("iid", "mean", None): "loo_iid",
        ("copula", "mean", "rho"): "loo_copula",
        ("antithetic", "pair", "rho"): "pairs",
    }
    if key not in kinds:
        raise PBInputError(
            f"no closed form for {spec.name} (law {spec.law}, center {spec.center}, constant "
            f"{spec.constant}); use pbexact.variance.exact_moments"
        )
    return kinds[key]


def has_closed_form(spec: est.EstimatorSpec) -> bool:
    """Whether this module has a formula for the spec's law, centering and constant
    (:func:`closed_form_kind` accepts it)."""
    try:
        closed_form_kind(spec)
    except PBInputError:
        return False
    return True


def _loorf_moments(
    n: int,
    es: np.ndarray,
    es2: np.ndarray,
    ejs: np.ndarray,
    ej2: np.ndarray,
    ej2s: np.ndarray,
    ej2s2: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Hoeffding's decomposition of the LOORF U-statistic (`eq:loorf`) from single-sample
    moments E[s], E[s^2], E[J s], E[J^2], E[J^2 s], E[J^2 s^2], shapes (P,); E[J] = 0 here.

    h1(x) = E[h(x, Y)] = (J_x s_x - E[s] J_x + E[J s]) / 2, so zeta_1 = Var(J s - E[s] J) / 4;
    E[h^2] = (2 E[J^2 s^2] + 2 E[J^2] E[s^2] - 4 E[s] E[J^2 s] + 4 E[J s]^2) / 4.
    """
    mean = ejs  # E[h] = E[J s] - E[J] E[s]
    zeta1 = (ej2s2 - 2 * es * ej2s + es**2 * ej2 - ejs**2) / 4
    zeta2 = (2 * ej2s2 + 2 * ej2 * es2 - 4 * es * ej2s + 4 * ejs**2) / 4 - mean**2
    return mean, (2 * (n - 2) * zeta1 + zeta2) / (n * (n - 1) / 2)


def _arms_moments(
    Jc: np.ndarray,
    theta: np.ndarray,
    n: int,
    a: np.ndarray,
    b: np.ndarray,
    bit: np.ndarray,
    g1: np.ndarray,
    g2: np.ndarray,
    param: Parametrization,
) -> tuple[np.ndarray, np.ndarray]:
    """ARMS (`alg:orig_arms`) by the overlap classes of pairs of sample pairs; E[J] = 0 here.
    Jc (2^d,), theta (d,), score coefficients a, b and bit (P,), marginals g1, g2 (P, 2)."""
    d = theta.shape[-1]
    most = min(n, 4)
    joint = subset_patterns(theta, n, most)
    # fewer samples: sum out the last ones (the high bits of the pattern index)
    laws = {m: joint.reshape(d, 2 ** (most - m), 2**m).sum(1) for m in range(2, most + 1)}
    # laws[2].reshape gives [i, bit of sample 1, bit of sample 0]: symmetric, exchangeability
    kern = pair_kernels(Jc, laws[2].reshape(d, 2, 2))
    moments = _ArmsMoments(g1, g2, kern[bit], laws, a, b, bit)
    mh = moments.mean()
    pairs = n * (n - 1) / 2
    var_u = pairs * (moments.product((0, 1), (0, 1)) - mh**2)
    if n >= 3:
        var_u += n * (n - 1) * (n - 2) * (moments.product((0, 1), (0, 2)) - mh**2)
    if n >= 4:
        var_u += pairs * (n - 2) * (n - 3) / 2 * (moments.product((0, 1), (2, 3)) - mh**2)
    scale = 1 - param.expand(arms_correlation(theta, n))
    return mh / scale, var_u / pairs**2 / scale**2


def _pair_moments(
    Jc: np.ndarray,
    theta: np.ndarray,
    n: int,
    a: np.ndarray,
    b: np.ndarray,
    bit: np.ndarray,
    g1: np.ndarray,
    g2: np.ndarray,
    param: Parametrization,
) -> tuple[np.ndarray, np.ndarray]:
    """DisARM: the mean of n/2 iid antithetic pairs' terms h = (J_x - J_y)(s_x - s_y) / 2 divided
    by 1 - rho, so Var = Var[h] / (n/2) / (1 - rho)^2; E[h] and E[h^2] are the ARMS pair moments
    with the antithetic pair law (`pbexact.copula.antithetic_pair_law`, exchangeable) in place of
    the copula's two-sample law. E[J] = 0 here."""
    law = antithetic_pair_law(theta)  # (d, 4), w = bit of sample 0 + 2 bits of sample 1
    kern = pair_kernels(Jc, law.reshape(-1, 2, 2))
    moments = _ArmsMoments(g1, g2, kern[bit], {2: law}, a, b, bit)
    mh = moments.mean()
    var_h = moments.product((0, 1), (0, 1)) - mh**2
    scale = 1 - param.expand(antithetic_correlation(theta))
    return mh / scale, var_h / (n // 2) / scale**2
