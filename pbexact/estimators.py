"""Score-function gradient estimators: one registry of estimator specs, written once for numpy
(pbexact) and torch (pbscale).

Every estimator takes the n losses ``J`` of shape (..., n) and the n scores
``S = grad_r log p(z^(s); theta(r))`` of shape (..., n, P) and returns a gradient estimate of
shape (..., P); leading dimensions batch independent estimates. Each is one
:class:`EstimatorSpec` in :data:`REGISTRY` (label, fewest samples, sampling law, per-parameter
constant, centering) whose linear form :class:`LinearEstimate` gives

* the batch form (:meth:`LinearEstimate.evaluate`, the formula as the paper writes it),
* the chunked form: one accumulator :class:`SampleSums` of k, sum J, U = sum J S and B = sum S,
  finished by the same linear form (:meth:`LinearEstimate.finish`; `alg:iter_reinforce`,
  `alg:iter_loorf`, `alg:iter_arms` in one), equal to the batch form to round-off,
* the exact moments (`pbexact.variance` by enumeration, `pbexact.closed_form` in closed form),
  which dispatch on the spec's law and centering, never on its name.

Adding an estimator is one :class:`EstimatorSpec` in :data:`REGISTRY`; with a law and a
centering that already exist, the samplers, the exact and closed-form moments, pbscale and every
command line and legend pick it up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import arrays
from .copula import antithetic_correlation, arms_correlation
from .errors import PBInputError, check_n
from .polynomial import flipped_expectation

Array = Any

#: Sampling laws of the n samples of one estimate: iid Bernoulli (`eq:reinforce_p`), the ARMS
#: Dirichlet copula (`alg:orig_arms`), or n/2 independent antithetic pairs (DisARM).
LAWS = ("iid", "copula", "antithetic")
#: How the losses are centered: not at all, on the mean of all n (`eq:loorf`), or on the mean of
#: each antithetic pair (samples 2j and 2j + 1).
CENTERS = ("none", "mean", "pair")
#: Per-parameter constants: rho (the law's correlation, divisor 1 - rho) or a baseline beta.
CONSTANTS = (None, "rho", "beta")


@dataclass(frozen=True)
class EstimatorSpec:
    """One estimator: its name, legend ``label`` (matplotlib text), plain ``text`` name for
    messages, the fewest samples it takes (``min_samples``;
    ``even``: n must be even), the sampling ``law`` of its n samples, the ``center`` of its
    losses and its per-parameter ``constant``. ``needs_table``: the constant needs the whole
    J table (beta*), so pbscale, which only evaluates J, cannot run it. ``color``: the
    matplotlib colour of its curves."""

    name: str
    label: str
    text: str
    min_samples: int
    law: str
    center: str
    constant: str | None = None
    even: bool = False
    needs_table: bool = False
    reference: str = ""
    color: str = ""

    def accepts(self, n: int) -> bool:
        """Whether the estimator is defined for n samples."""
        return n >= self.min_samples and (not self.even or n % 2 == 0)

    def check_n(self, n: int) -> int:
        """n, or a one-line PBInputError saying which n the estimator takes."""
        n = check_n(n, self.text, self.min_samples)
        if self.even and n % 2:
            raise PBInputError(
                f"{self.text} takes n/2 antithetic pairs: n must be even, got n={n}; use "
                f"n={n + 1} or another estimator"
            )
        return n

    def norm(self, n: int) -> int:
        """The number the centered sum is divided by: n, n - 1 (leave-one-out) or n/2 pairs."""
        if self.center == "mean":
            return n - 1
        return n // 2 if self.center == "pair" else n

    def constant_of(self, theta: Array, n: int, param: Any, J: Array | None = None,
                    gradient: Array | None = None) -> Array | None:
        """The per-parameter constant, shape (..., P) for theta (..., d), numpy or torch: rho
        of the law (copula: `alg:orig_arms`; antithetic: -min(theta, 1-theta) /
        max(theta, 1-theta)), beta* (`thm:bStarTwo`, needs the J table; ``gradient`` the true
        gradient over theta where the caller has it), or None."""
        if self.constant is None:
            return None
        if self.constant == "beta":
            if J is None:
                raise PBInputError(f"{self.name} needs the J table for its baseline beta*; pass "
                                 "J")
            return param.expand(flipped_expectation(J, theta, gradient))
        return param.expand(self.correlation(theta, n))

    def correlation(self, theta: Array, n: int) -> Array:
        """rho per bit, shape of theta (..., d), numpy or torch: the correlation of two of the
        law's samples in one coordinate (copula: `alg:orig_arms`; antithetic: -min(theta,
        1-theta) / max(theta, 1-theta)); the per-parameter constant of a "rho" estimator is its
        expansion to the logits (:meth:`constant_of`)."""
        if self.law == "copula":
            return arms_correlation(theta, n)
        if self.law == "antithetic":
            return antithetic_correlation(theta)
        raise PBInputError(f"{self.name}: no correlation rho for the {self.law} law; give "
                           "the estimator an iid or copula law")

    def form(self, J: Array, extra: Array | None = None) -> LinearEstimate:
        """The linear form on losses J (..., n); ``extra`` is the constant of
        :meth:`constant_of`."""
        return self.linear(J.shape[-1], J.sum(-1) if self.center == "mean" else None, extra, J)

    def linear(self, n: int, sum_j: Array | None, extra: Array | None,
               losses: Array | None = None, check: bool = True) -> LinearEstimate:
        """The linear form from n, sum J (only the "mean" center reads it) and the constant;
        ``check=False`` skips validating n (callers in a loop that validated it once)."""
        if check:
            self.check_n(n)
        if self.constant is not None and extra is None:
            what = "rho" if self.constant == "rho" else "beta"
            raise PBInputError(
                f"{self.name} needs its per-parameter constant {what}; "
                "EstimatorSpec.constant_of (pbexact.variance.estimator_extra) computes it"
            )
        center = sum_j / n if self.center == "mean" else 0.0
        return LinearEstimate(
            losses, self.norm(n), center,
            baseline=extra if self.constant == "beta" else 0.0,
            divisor=1 - extra if self.constant == "rho" else 1.0,
            pairs=self.center == "pair",
        )


#: Every estimator, by name; loops over estimators (CLIs, legends, tests) loop over this.
REGISTRY: dict[str, EstimatorSpec] = {
    spec.name: spec
    for spec in (
        EstimatorSpec("reinforce", "REINFORCE", "REINFORCE", 1, "iid", "none",
                      reference="eq:reinforce", color="C0"),
        EstimatorSpec("loorf", "LOORF", "LOORF", 2, "iid", "mean", reference="eq:loorf",
                      color="C1"),
        EstimatorSpec("arms", "ARMS", "ARMS", 2, "copula", "mean", "rho",
                      reference="alg:orig_arms", color="C2"),
        EstimatorSpec("betastar", r"$\beta^*$", "beta*", 1, "iid", "none", "beta", needs_table=True,
                      reference="eq:bstar_thm_estimator", color="C3"),
        EstimatorSpec("disarm", "DisARM", "DisARM", 2, "antithetic", "pair", "rho", even=True,
                      reference="Dong, Mnih and Tucker (2020)", color="C9"),
    )
}
ESTIMATORS = tuple(REGISTRY)
#: Fewest samples each estimator is defined for.
MIN_SAMPLES = {name: spec.min_samples for name, spec in REGISTRY.items()}
#: The estimators pbscale can run (their constant does not need the J table).
MC_ESTIMATORS = tuple(name for name, spec in REGISTRY.items() if not spec.needs_table)


def register(spec: EstimatorSpec) -> EstimatorSpec:
    """Add an estimator to :data:`REGISTRY` (for one defined outside this module; one here is a
    line of the table above): its law, centre and constant must be known ones and its name
    new, else a one-line :class:`PBInputError`. Returns ``spec``."""
    if spec.name in REGISTRY:
        raise PBInputError(f"estimator {spec.name!r} is registered already; choose another name")
    for value, allowed, what in ((spec.law, LAWS, "law"), (spec.center, CENTERS, "center"),
                                 (spec.constant, CONSTANTS, "constant")):
        if value not in allowed:
            raise PBInputError(f"{spec.name}: unknown {what} {value!r}; choose one of "
                               f"{', '.join(map(str, allowed))}")
    REGISTRY[spec.name] = spec
    return spec


def get_estimator(name: str) -> EstimatorSpec:
    """The spec of estimator ``name``; an unknown name is a one-line PBInputError."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise PBInputError(
            f"unknown estimator {name!r}; choose one of {', '.join(ESTIMATORS)}"
        ) from None


def check_estimator(name: str, n: int | None = None) -> str:
    """Validate an estimator name and, if given, its number of samples."""
    spec = get_estimator(name)
    if n is not None:
        spec.check_n(n)
    return name


def estimators_for(n: int, names: tuple[str, ...] = ESTIMATORS) -> tuple[str, ...]:
    """The estimators among ``names`` defined for n samples (DisARM needs an even n)."""
    return tuple(name for name in names if get_estimator(name).accepts(n))


def sample_sum(w: Array, S: Array) -> Array:
    """sum_s w^(s) S^(s) for weights w (..., n) and scores S (..., n, P): shape (..., P)."""
    return (w[..., None, :] @ S)[..., 0, :]


def pair_centered(J: Array) -> Array:
    """J^(s) minus the mean of its antithetic pair (samples 2j and 2j + 1): (J_2j - J_2j+1) / 2
    and its negative, shape of J (..., n), n even."""
    n = J.shape[-1]
    if n % 2:
        raise PBInputError(f"antithetic pairs need an even number of samples, got {n}; give "
                           "an even n")
    pairs = J.reshape(J.shape[:-1] + (n // 2, 2))
    half = (pairs[..., 0] - pairs[..., 1]) / 2
    return arrays.namespace(J).stack([half, -half], -1).reshape(J.shape)


@dataclass(frozen=True)
class LinearEstimate:
    """An estimate from n samples in the form every estimator here takes:

        g_p = (sum_s (J^(s) - center) S^(s)_p - baseline_p sum_s S^(s)_p) / (norm divisor_p),

    with the losses J^(s) (``losses``, (..., n)), a ``center`` (scalar or (...,)) shared by the
    n samples of one estimate, a per-parameter ``baseline`` and ``divisor`` (scalars or
    (..., P)) and a number ``norm``. With ``pairs``, each loss is first centered on its
    antithetic pair instead, J^(s) - (J^(2j) + J^(2j+1)) / 2 (DisARM). In terms of the sums
    U = sum_s J^(s) S^(s) (pair-centered J with ``pairs``) and B = sum_s S^(s) it is
    (U - (center + baseline) B) / (norm divisor), which lets the exact variance
    (`pbexact.variance`) share U and B between estimators and the chunked path
    (:class:`SampleSums`) finish from them. :meth:`evaluate` follows the formula as written
    (losses centered before the sum over samples, the division last).
    """

    losses: Array
    norm: int
    center: Array | float = 0.0
    baseline: Array | float = 0.0
    divisor: Array | float = 1.0
    pairs: bool = False

    def evaluate(self, S: Array) -> Array:
        """The estimate from scores S (..., n, P): shape (..., P)."""
        centered = pair_centered(self.losses) if self.pairs else self.losses
        if hasattr(self.center, "shape"):
            centered = self.losses - self.center[..., None]
        elif self.center != 0.0:
            centered = self.losses - self.center
        g = sample_sum(centered, S)
        if not _is_scalar(self.baseline, 0.0):
            ones = arrays.namespace(self.losses).ones_like(self.losses)
            g = g - self.baseline * sample_sum(ones, S)
        return self._scale(g)

    def finish(self, sums: SampleSums) -> Array:
        """The estimate from the accumulated sums U and B of the same n samples, shape (..., P):
        (U - (center + baseline) B) / (norm divisor)."""
        if sums.count == 0:
            raise PBInputError("no samples were accumulated; call update() at least once")
        g = sums.centered(self.center)
        if not _is_scalar(self.baseline, 0.0):
            g = g - self.baseline * sums.B
        return self._scale(g)

    def _scale(self, g: Array) -> Array:
        g = g / self.norm
        if not _is_scalar(self.divisor, 1.0):
            g = g / self.divisor
        return g


def _is_scalar(x: Array | float, value: float) -> bool:
    return isinstance(x, float) and x == value


class SampleSums:
    """The one accumulator of every estimator: the count k, sum J, U = sum_s J^(s) S^(s) and
    B = sum_s S^(s) over the samples seen so far, in chunks of any size (memory O(P)); with
    ``pairs`` (DisARM) U takes the pair-centered losses and every chunk must hold whole pairs.
    :meth:`LinearEstimate.finish` turns them into the estimate, equal to the batch form on the
    same samples to round-off; one chunk per sample is the per-sample recursion of
    `alg:iter_reinforce`, `alg:iter_loorf` and `alg:iter_arms`.

    Scores come either in full, (..., k, P) (:meth:`update`), or through the parametrization's
    affine reading S_p = a_p + b_p z_bit(p) (`Parametrization.affine_score`, :meth:`update_affine`),
    which never builds the (k, P) score matrix, two-logit parametrizations included.
    """

    def __init__(self, pairs: bool = False) -> None:
        self.pairs = pairs
        self.count = 0
        self.sum_j: Array = None
        self._U: Array = None
        self._B: Array = None
        # affine updates not yet expanded to (..., P): [a, b, param, sum_s w_s z_s (..., d),
        # sum_s z_s (..., d), sum_s w_s (...), k], so a chunk costs O(k d), not O(P) passes
        self._affine: list | None = None

    @property
    def U(self) -> Array:
        """sum_s w_s S^(s), shape (..., P) (w: the losses, pair-centered for DisARM)."""
        self._flush()
        return self._U

    @U.setter
    def U(self, value: Array) -> None:
        self._flush()
        self._U = value

    @property
    def B(self) -> Array:
        """sum_s S^(s), shape (..., P)."""
        self._flush()
        return self._B

    @B.setter
    def B(self, value: Array) -> None:
        self._flush()
        self._B = value

    def weights(self, J: Array) -> Array:
        """The sample weights w_s of U = sum_s w_s S^(s) for losses J (..., k): J, or with
        ``pairs`` J centered on its antithetic pair (:func:`pair_centered`)."""
        return pair_centered(J) if self.pairs else J

    def update(self, J: Array, S: Array) -> None:
        """Add k samples: losses J (..., k) and scores S (..., k, P)."""
        ones = arrays.namespace(J).ones_like(J)
        self._add(J, sample_sum(self.weights(J), S), sample_sum(ones, S))

    def update_affine(self, J: Array, z: Array, a: Array, b: Array, param: Any) -> None:
        """Add k samples z (..., k, d) with losses J (..., k), the scores given by
        ``param.affine_score(r) = (a, b)`` (shape (..., P)): sum_s w_s S_s =
        expand(sum_s w_s z_s) b + (sum_s w_s) a, sum_s S_s = expand(sum_s z_s) b + k a. The
        per-bit sums over z are kept until U or B is read (the same (a, b) chunk after chunk),
        so each chunk costs O(k d)."""
        w = self.weights(J)
        self.add_bit_sums(J, (w[..., None, :] @ z)[..., 0, :], z.sum(-2), w.sum(-1), a, b, param)

    def add_bit_sums(self, J: Array, wz: Array, zs: Array, sw: Array, a: Array, b: Array,
                     param: Any) -> None:
        """Add k samples given by their per-bit sums (what :meth:`update_affine` forms from the
        samples z (..., k, d), or a fused sampler accumulates without keeping them): the losses J
        (..., k), wz = sum_s w_s z_s and zs = sum_s z_s, shape (..., d), sw = sum_s w_s (...),
        with w = :meth:`weights` of J, and the affine scores (a, b) of
        ``param.affine_score(r)``."""
        k = J.shape[-1]
        p = self._affine
        if p is not None and not (p[0] is a and p[1] is b and p[2] is param):
            self._flush()
            p = None
        if p is None:
            self._affine = [a, b, param, wz, zs, sw, k]
        else:
            p[3], p[4], p[5], p[6] = p[3] + wz, p[4] + zs, p[5] + sw, p[6] + k
        self._add_losses(J)

    def bit_sums(self) -> tuple | None:
        """The affine updates not yet expanded to (..., P): (a, b, param, sum_s w_s z_s (..., d),
        sum_s z_s (..., d), sum_s w_s (...), k), or None where U and B are formed already (a chunk
        given with its full scores, or U or B read or set): what a fused finish of the linear
        form reads (:func:`pbscale.methods.fused.fused_estimate`)."""
        if self._affine is None or self._U is not None:
            return None
        return tuple(self._affine)

    def centered(self, center: Array | float = 0.0) -> Array:
        """U - center B, shape (..., P), center a scalar or (...,) (one per estimate). From
        affine updates alone it is formed per bit and expanded once:
        expand(sum w z - center sum z) b + (sum w - center k) a."""
        if self._affine is not None and self._U is None:
            a, b, param, wz, zs, sw, k = self._affine
            if hasattr(center, "shape"):
                wz, sw = wz - center[..., None] * zs, sw - center * k
            elif center != 0.0:
                wz, sw = wz - center * zs, sw - center * k
            # centred in the sums' dtype (float64 from a fused sampler), expanded in the scores'
            wz, sw = arrays.cast_like(wz, b), arrays.cast_like(sw, a)
            return param.expand(wz) * b + sw[..., None] * a
        if hasattr(center, "shape"):
            return self.U - center[..., None] * self.B
        return self.U - center * self.B if center != 0.0 else self.U

    def _flush(self) -> None:
        if self._affine is None:
            return
        a, b, param, wz, zs, sw, k = self._affine
        self._affine = None
        wz, zs, sw = arrays.cast_like(wz, b), arrays.cast_like(zs, b), arrays.cast_like(sw, a)
        U = param.expand(wz) * b + sw[..., None] * a
        B = param.expand(zs) * b + k * a
        if self._U is None:
            self._U, self._B = U, B
        else:
            self._U, self._B = self._U + U, self._B + B

    def _add_losses(self, J: Array) -> None:
        sum_j = J.sum(-1)
        self.sum_j = sum_j if self.count == 0 else self.sum_j + sum_j
        self.count += J.shape[-1]

    def _add(self, J: Array, U: Array, B: Array) -> None:
        self._flush()
        if self._U is None:
            self._U, self._B = U, B
        else:
            self._U, self._B = self._U + U, self._B + B
        self._add_losses(J)

    def estimate(self, spec: EstimatorSpec | str, extra: Array | None = None) -> Array:
        """The estimator's value on the samples seen, shape (..., P)."""
        spec = get_estimator(spec) if isinstance(spec, str) else spec
        if self.count == 0:
            raise PBInputError("no samples were accumulated; call update() at least once")
        return spec.linear(self.count, self.sum_j, extra).finish(self)


def linear_estimate(name: str, J: Array, extra: Array | None = None) -> LinearEstimate:
    """The estimator ``name`` on losses J (..., n); ``extra`` is its per-parameter constant
    (rho for ARMS and DisARM, beta for beta*)."""
    return get_estimator(name).form(J, extra)


def reinforce_form(J: Array) -> LinearEstimate:
    """REINFORCE, (1/n) sum_s J(z^(s)) S^(s)  (`eq:reinforce`), from losses J (..., n)."""
    return REGISTRY["reinforce"].form(J)


def baseline_form(J: Array, beta: Array) -> LinearEstimate:
    """(1/n) sum_s (J(z^(s)) - beta) S^(s) with a constant baseline per parameter, beta of shape
    (..., P) (`eq:bstar_thm_estimator`; beta = beta* of `thm:bStarTwo` gives the beta* estimator).
    """
    return REGISTRY["betastar"].form(J, beta)


def loorf_form(J: Array) -> LinearEstimate:
    """LOORF, (1/(n-1)) sum_s (J(z^(s)) - mean_s' J(z^(s'))) S^(s)  (`eq:loorf`), n >= 2."""
    return REGISTRY["loorf"].form(J)


def arms_form(J: Array, rho: Array) -> LinearEstimate:
    """ARMS: LOORF on Dirichlet-copula samples divided by 1 - rho (`alg:orig_arms`), rho of
    shape (..., P) (per bit, expanded to the bit's logits), n >= 2."""
    return REGISTRY["arms"].form(J, rho)


def disarm_form(J: Array, rho: Array) -> LinearEstimate:
    """DisARM (Dong, Mnih and Tucker, 2020): for n/2 antithetic pairs (z, z~), samples 2j and
    2j + 1 with z = 1[u < theta], z~ = 1[1 - u < theta], the mean over pairs of
    (J(z) - J(z~)) / 2 (S(z) - S(z~)) / (1 - rho), rho = -min(theta, 1-theta) /
    max(theta, 1-theta) the pair's correlation. For sigmoid logits S(z) - S(z~) =
    (-1)^{z~_i} 1[z_i != z~_i] and 1 / (1 - rho) = sigma(|r_i|): the paper's form."""
    return REGISTRY["disarm"].form(J, rho)


def reinforce(J: Array, S: Array) -> Array:
    """REINFORCE from losses J (..., n) and scores S (..., n, P), shape (..., P); see
    :func:`reinforce_form`."""
    return reinforce_form(J).evaluate(S)


def baseline(J: Array, S: Array, beta: Array) -> Array:
    """The constant-baseline estimator, shape (..., P); see :func:`baseline_form`."""
    return baseline_form(J, beta).evaluate(S)


def loorf(J: Array, S: Array) -> Array:
    """LOORF, shape (..., P); see :func:`loorf_form`."""
    return loorf_form(J).evaluate(S)


def arms(J: Array, S: Array, rho: Array) -> Array:
    """ARMS on copula samples, shape (..., P); see :func:`arms_form`."""
    return arms_form(J, rho).evaluate(S)


def disarm(J: Array, S: Array, rho: Array) -> Array:
    """DisARM on interleaved antithetic pairs, shape (..., P); see :func:`disarm_form`."""
    return disarm_form(J, rho).evaluate(S)
