"""Parametrizations theta(r) of `tab:alternative_param`, shared by pbexact (numpy) and pbscale
(torch): every formula uses only operations that mean the same in both.

Logits are a flat vector r of shape (..., P): P = d for sigmoid, cosine and direct, and P = 2d for
escort, whose r[..., :d] and r[..., d:] are the two logits (r_i)_1 and (r_i)_2 of each bit. The
score grad_r log p(z; theta(r)) has the shape of r and is zero where theta_i is 0 or 1 (the
table's footnote).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import arrays
from .errors import PBInputError

Array = Any  # numpy.ndarray or torch.Tensor


def _concat(parts: list[Array]) -> Array:
    xp = arrays.namespace(parts[0])
    return xp.concatenate(parts, axis=-1)


def _interior(theta: Array) -> Array:
    return (theta > 0) & (theta < 1)


def _safe(x: Array, mask: Array) -> Array:
    """x where mask holds, 1 elsewhere: a denominator that cannot divide by zero."""
    return arrays.namespace(x).where(mask, x, 1.0)


class Parametrization:
    """theta(r), its inverse, d theta / d r and the score; subclasses give the table's rows."""

    name: str = ""
    logits_per_bit: int = 1

    def num_params(self, d: int) -> int:
        return self.logits_per_bit * d

    def num_bits(self, r: Array) -> int:
        return r.shape[-1] // self.logits_per_bit

    def theta(self, r: Array) -> Array:
        """theta(r), shape (..., d)."""
        raise NotImplementedError

    def logits(self, theta: Array) -> Array:
        """The inverse map r(theta) of the table (theta not in {0, 1}), shape (..., P)."""
        raise NotImplementedError

    def dtheta_dr(self, r: Array) -> Array:
        """d theta_{bit(p)} / d r_p, shape (..., P)."""
        raise NotImplementedError

    def score(self, z: Array, r: Array) -> Array:
        """grad_r log p(z; theta(r)) for z of shape (..., d), shape (..., P)."""
        raise NotImplementedError

    def affine_score(self, r: Array, theta: Array | None = None) -> tuple[Array, Array]:
        """(a, b), each of the shape of r, with score(z, r)_p = a_p + b_p z_bit(p): every score of
        the table is affine in its own bit, so it is read off at z = 0 and z = 1. ``theta``:
        theta(r) when the caller has it already (not recomputed)."""
        zero = arrays.zeros_like(self.theta(r) if theta is None else theta)
        a = self.score(zero, r)
        return a, self.score(zero + 1, r) - a

    def check_exact(self, r: Array) -> None:
        """Refuse logits the exact core cannot treat consistently (see :class:`Direct`); the
        other rows accept every r."""

    def expand(self, v: Array) -> Array:
        """A per-bit quantity (rho, beta*) repeated for each logit of the bit, shape (..., P)."""
        return v if self.logits_per_bit == 1 else _concat([v] * self.logits_per_bit)

    def chain(self, grad_theta: Array, r: Array) -> Array:
        """grad_r from grad_theta by the chain rule, shape (..., P)."""
        return self.expand(grad_theta) * self.dtheta_dr(r)

    def project(self, r: Array) -> Array:
        """Logits after an optimizer step (only direct clamps them)."""
        return r

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Sigmoid(Parametrization):
    """theta = 1 / (1 + e^-r); score z - theta."""

    name = "sigmoid"

    def theta(self, r: Array) -> Array:
        return arrays.sigmoid(r)

    def logits(self, theta: Array) -> Array:
        xp = arrays.namespace(theta)
        return xp.log(theta) - xp.log1p(-theta)

    def dtheta_dr(self, r: Array) -> Array:
        t = self.theta(r)
        return t * (1 - t)

    def score(self, z: Array, r: Array) -> Array:
        t = self.theta(r)
        inside = _interior(t)
        # the usual case, all inside: the where below would change nothing; the test reads a
        # value back to the host, so it is made only for arrays in host memory (numpy, CPU torch)
        on_host = getattr(getattr(t, "device", None), "type", "cpu") == "cpu"
        if on_host and bool(inside.all()):
            return z - t
        return arrays.namespace(t).where(inside, z - t, 0.0)


class Cosine(Parametrization):
    """theta = (1 - cos r) / 2; score (cos r + 2z - 1) / sin r."""

    name = "cosine"

    def theta(self, r: Array) -> Array:
        return 0.5 * (1 - arrays.namespace(r).cos(r))

    def logits(self, theta: Array) -> Array:
        xp = arrays.namespace(theta)
        return math.pi - xp.arccos(2 * theta - 1)

    def dtheta_dr(self, r: Array) -> Array:
        return 0.5 * arrays.namespace(r).sin(r)

    def score(self, z: Array, r: Array) -> Array:
        xp = arrays.namespace(r)
        inside = _interior(self.theta(r))
        s = (xp.cos(r) + (2 * z - 1)) / _safe(xp.sin(r), inside)
        return xp.where(inside, s, 0.0)


#: theta (1 - theta) below this makes the direct score 1/(theta (1 - theta)) overflow float64.
DIRECT_MIN_SPREAD = 1.0 / np.finfo(np.float64).max


class Direct(Parametrization):
    """theta = r, clamped to [eps, 1 - eps] after each update (`sec:alternative_parametr`).

    eps = 1e-3 is our choice (the paper only says "some small eps"): it keeps the score,
    (z - theta) / (theta (1 - theta)), below about 1,000 in magnitude.
    """

    name = "direct"

    def __init__(self, eps: float = 1e-3) -> None:
        if not 0 <= eps < 0.5:
            raise PBInputError(f"direct parametrization needs 0 <= eps < 0.5, got eps={eps}; "
                               "give e.g. eps=1e-6")
        self.eps = eps

    def theta(self, r: Array) -> Array:
        return arrays.clip(r, 0.0, 1.0)

    def logits(self, theta: Array) -> Array:
        return theta * 1.0

    def dtheta_dr(self, r: Array) -> Array:
        return arrays.namespace(r).ones_like(r)

    def score(self, z: Array, r: Array) -> Array:
        t = self.theta(r)
        inside = _interior(t)
        s = (z - t) / _safe(t * (1 - t), inside)
        return arrays.namespace(t).where(inside, s, 0.0)

    def project(self, r: Array) -> Array:
        return arrays.clip(r, self.eps, 1.0 - self.eps)

    def check_exact(self, r: Array) -> None:
        """Below its clamp the score (z - theta) / (theta (1 - theta)) grows like 1/theta; the
        exact core (enumeration and closed form alike, which agree down to theta = 1e-305) refuses
        a theta so close to 0 or 1 that 1 / (theta (1 - theta)) overflows float64 (theta below
        about 5.6e-309, a subnormal), instead of returning NaN. theta = 0 or 1 exactly (score 0)
        is accepted."""
        t = np.asarray(self.theta(r), dtype=np.float64)
        spread = t * (1 - t)
        bad = (spread > 0) & (spread < DIRECT_MIN_SPREAD)
        if np.any(bad):
            raise PBInputError(
                f"direct parametrization: theta={float(t[bad].ravel()[0])!r} is so close to 0 or "
                "1 that its score 1/(theta (1 - theta)) overflows float64; clamp theta into "
                "[eps, 1 - eps] (Direct.project, as every update does)"
            )

    def __repr__(self) -> str:
        return f"Direct(eps={self.eps})"


class Escort(Parametrization):
    """theta = |a|^P / (|a|^P + |b|^P) with two logits (a, b) per bit (Mei et al., 2020);
    score [P (z - theta) / a, -P (z - theta) / b]; inverse a = (theta / (1 - theta))^(1/P), b = 1.
    """

    name = "escort"
    logits_per_bit = 2

    def __init__(self, power: float = 4.0) -> None:
        if power <= 0:
            raise PBInputError(f"escort needs a positive power P, got P={power}; give e.g. "
                               "P=2")
        self.power = power

    def _split(self, r: Array) -> tuple[Array, Array]:
        d = r.shape[-1] // 2
        return r[..., :d], r[..., d:]

    def _pow(self, x: Array) -> Array:
        """|x|^P; for torch tensors and P = 4 by two squarings (torch's CPU pow kernel costs
        7 times as much at a network's d), numpy by pow as before (the exact core's numbers)."""
        xp = arrays.namespace(x)
        if self.power == 4.0 and xp is not np:
            sq = x * x
            return sq * sq
        return xp.abs(x) ** self.power

    def theta(self, r: Array) -> Array:
        a, b = self._split(r)
        pa, pb = self._pow(a), self._pow(b)
        return pa / (pa + pb)

    def affine_score(self, r: Array, theta: Array | None = None) -> tuple[Array, Array]:
        """(a, b) of the score S = a + b z, read off the score's formula with theta computed
        once (``theta``: theta(r) given by the caller): b = [P / x0, -P / x1], a = -theta b (0
        where theta is 0 or 1), shape of r."""
        xp = arrays.namespace(r)
        x0, x1 = self._split(r)
        t = self.theta(r) if theta is None else theta
        inside = _interior(t)
        # P / x inside, P / inf = 0 outside (also where x = 0 there)
        p0 = self.power / xp.where(inside, x0, xp.inf)
        p1 = self.power / xp.where(inside, x1, xp.inf)
        return _concat([-t * p0, t * p1]), _concat([p0, -p1])

    def logits(self, theta: Array) -> Array:
        a = (theta / (1 - theta)) ** (1.0 / self.power)
        return _concat([a, arrays.namespace(a).ones_like(a)])

    def dtheta_dr(self, r: Array) -> Array:
        xp = arrays.namespace(r)
        a, b = self._split(r)
        t = self.theta(r)
        inside = _interior(t)
        c = self.power * t * (1 - t)
        grad = _concat([c / _safe(a, inside), -c / _safe(b, inside)])
        return xp.where(self.expand(inside), grad, 0.0)

    def score(self, z: Array, r: Array) -> Array:
        xp = arrays.namespace(r)
        a, b = self._split(r)
        t = self.theta(r)
        inside = _interior(t)
        c = self.power * (z - t)
        s = _concat([c / _safe(a, inside), -c / _safe(b, inside)])
        return xp.where(self.expand(inside), s, 0.0)

    def __repr__(self) -> str:
        return f"Escort(power={self.power})"


PARAMETRIZATIONS: dict[str, type[Parametrization]] = {
    "sigmoid": Sigmoid,
    "cosine": Cosine,
    "direct": Direct,
    "escort": Escort,
}


def get_parametrization(name: str | Parametrization) -> Parametrization:
    """A parametrization by name (sigmoid, cosine, direct, escort) with the paper's defaults."""
    if isinstance(name, Parametrization):
        return name
    try:
        return PARAMETRIZATIONS[name]()
    except KeyError:
        raise PBInputError(
            f"unknown parametrization {name!r}; choose one of {', '.join(PARAMETRIZATIONS)}"
        ) from None
