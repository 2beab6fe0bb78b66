"""The standardization constants of uint8 images (one mean and one standard deviation over every
pixel of the training split), as float32, equal bit for bit to what torch's float64 computation
``xf = x.double() / 255; xf.mean(), xf.std()`` gives after its cast to float32, without the
float64 copy of the images (8 bytes a pixel: 330 MiB for MNIST's 55,000 training images).

:func:`image_constants` counts the 256 pixel values and computes the mean and the variance as
exact fractions. The float64 computation errs by at most (N + 2) u relatively in the mean and
about as much in the variance (u = 2^-53, N pixels, whatever order torch sums in: every term
is non-negative; the bounds are in :func:`exact_float32`). Where every value within those
bounds rounds to one float32, that float32 is the float64 computation's: it is returned. Where
the exact value lies within the bounds of a float32 rounding boundary (for MNIST-sized data
about one split in four), the float64 computation runs as before.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

#: The unit roundoff of float64.
U = Fraction(1, 2 ** 53)


def _gamma(k: int) -> Fraction:
    """The bound k u / (1 - k u) of k float64 roundings."""
    return k * U / (1 - k * U)


def _only_float32(lo: Fraction, hi: Fraction, guess: float, squared: bool = False
                  ) -> float | None:
    """The float32 (as a float) every value in [lo, hi] rounds to (``squared``: [lo, hi] bounds
    the square of the value, which is non-negative), or None when a rounding boundary of the
    float32 nearest ``guess`` lies inside."""
    f = np.float32(guess)
    down = float(np.nextafter(f, np.float32(-np.inf)))
    up = float(np.nextafter(f, np.float32(np.inf)))
    low = (Fraction(down) + Fraction(float(f))) / 2  # the rounding boundaries around f
    high = (Fraction(float(f)) + Fraction(up)) / 2
    if squared:
        low = low * low if low > 0 else Fraction(-1)
        high = high * high
    return float(f) if low < lo and hi < high else None


def exact_float32(counts: list[int]) -> tuple[float, float] | None:
    """(mean, standard deviation) of the pixels x / 255 whose values 0..255 occur ``counts``
    times, as the float32 casts of torch's float64 ``mean()`` and ``std()`` (N - 1 in the
    divisor), or None where those casts cannot be told from the exact values.

    The float64 computation: v_i = fl(x_i / 255); the mean m~ = fl(sum v_i / N); the variance
    fl(sum fl(fl(v_i - m~)^2) / (N - 1)); its square root. With t_i = x_i / 255 exactly, m its
    exact mean, a_i = t_i - m (their sum is 0) and Q = sum a_i^2: |m~ - m| <= gamma(N + 2) m;
    fl(v_i - m~) = (a_i + e_i)(1 + d) with |e_i| <= u t_i + |m~ - m|, so sum (v_i - m~)^2 lies
    within 2 u sum |a_i| t_i below Q and 2 u sum |a_i| t_i + sum (u t_i + |m~ - m|)^2 above it;
    each term's subtraction and square add two roundings, the sum of N non-negative terms
    gamma(N), the division one and the square root one (two on the square)."""
    n = sum(counts)
    if n < 2:
        return None
    s1 = sum(c * k for k, c in enumerate(counts))
    s2 = sum(c * k * k for k, c in enumerate(counts))
    mean = Fraction(s1, 255 * n)
    err_m = _gamma(n + 2)
    mean32 = _only_float32(mean * (1 - err_m), mean * (1 + err_m), float(mean))
    if mean32 is None:
        return None
    q = (Fraction(s2) - Fraction(s1 * s1, n)) / (255 * 255)
    spread = sum(c * abs(Fraction(k, 255) - mean) * Fraction(k, 255)
                 for k, c in enumerate(counts) if c)
    dm = mean * err_m
    above = U * U * Fraction(s2, 255 * 255) + 2 * U * dm * Fraction(s1, 255) + n * dm * dm
    g = _gamma(n)
    lo = (q - 2 * U * spread) * (1 - U) ** 6 * (1 - g) / (n - 1)
    hi = (q + 2 * U * spread + above) * (1 + U) ** 6 * (1 + g) / (n - 1)
    std32 = _only_float32(lo, hi, float(q / (n - 1)) ** 0.5, squared=True)
    return None if std32 is None else (mean32, std32)


def image_constants(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std), each float32 of shape (1, 1), of the uint8 images ``x`` (any shape, on the
    CPU) scaled to [0, 1]: :func:`exact_float32` where it decides, else torch's float64
    computation."""
    counts = torch.bincount(x.reshape(-1), minlength=256).tolist()
    exact = exact_float32(counts)
    if exact is not None:
        mean, std = exact
        return (torch.tensor([[mean]], dtype=torch.float32),
                torch.tensor([[std]], dtype=torch.float32))
    xf = x.double().div_(255.0)  # in place: one float64 copy, the values of x.double() / 255
    return xf.mean().view(1, 1).float(), xf.std().view(1, 1).float()


__all__ = ["exact_float32", "image_constants"]
