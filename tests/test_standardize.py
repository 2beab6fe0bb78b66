"""The standardization constants of uint8 images without their float64 copy
(:mod:`pbscale.nets.standardize`) equal torch's float64 computation bit for bit, whichever way
they are found."""

import numpy as np
import pytest
import torch
from _mnist import MNIST_DIR

from pbscale.nets import data
from pbscale.nets.standardize import exact_float32, image_constants


def float64_constants(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The computation image_constants replaces, as from_arrays wrote it before."""
    xf = x.double() / 255.0
    return xf.mean().view(1, 1).float(), xf.std().view(1, 1).float()


def pixels(kind: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == 0:
        return rng.integers(0, 256, n)
    if kind == 1:  # few distinct values
        return rng.integers(0, 3, n) * int(rng.integers(1, 120))
    if kind == 2:  # black and white
        return (rng.random(n) < rng.random()) * 255
    if kind == 3:  # one value: no spread
        return np.full(n, int(rng.integers(0, 256)))
    return np.clip(rng.normal(30, 60, n), 0, 255)  # MNIST-like: mostly dark


@pytest.mark.parametrize("threads", [1, 2])
def test_constants_equal_the_float64_computation(threads):
    """400 arrays of 2 to 200,000 pixels of five kinds: the same float32 bits as the float64
    computation, decided exactly on most of them (the rest computed in float64)."""
    rng = np.random.default_rng(0)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    decided = 0
    try:
        for trial in range(400):
            n = int(rng.integers(2, 200_000)) if trial % 7 else int(rng.integers(2, 50))
            x = torch.from_numpy(pixels(trial % 5, n, rng).astype(np.uint8)).reshape(-1, 1)
            mean, std = image_constants(x)
            ref_mean, ref_std = float64_constants(x)
            assert mean.dtype == std.dtype == torch.float32 and mean.shape == (1, 1)
            assert torch.equal(mean, ref_mean), (trial, mean, ref_mean)
            assert torch.equal(std, ref_std), (trial, std, ref_std)
            decided += exact_float32(torch.bincount(x.reshape(-1), minlength=256).tolist()) \
                is not None
    finally:
        torch.set_num_threads(old)
    assert 300 <= decided < 400  # both ways are taken


def test_exact_constants_refuse_what_they_cannot_tell():
    """One pixel, or no spread (float64 leaves a round-off spread there): left to float64."""
    assert exact_float32([0] * 7 + [1] + [0] * 248) is None
    assert exact_float32([0] * 9 + [1000] + [0] * 246) is None
    counts = [0] * 256
    counts[0], counts[255] = 3, 1
    mean, std = exact_float32(counts)
    assert mean == np.float32(0.25) and std == np.float32(0.5)  # exact: 1/4 and sqrt(1/4)


def test_mnist_constants_unchanged():
    """Real MNIST at the default split and two others: the constants of the float64
    computation."""
    if not MNIST_DIR.exists():
        pytest.skip("shared MNIST not present")
    xtr, ytr, xte, yte = data.read_mnist(MNIST_DIR)
    for val_size, seed in ((5000, 0), (5000, 1), (1000, 3)):
        d = data.from_arrays("mnist", xtr, ytr, xte, yte, val_size=val_size, split_seed=seed)
        mean, std = float64_constants(d.train.x)
        assert torch.equal(d.mean, mean) and torch.equal(d.std, std)
