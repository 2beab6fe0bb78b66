"""The CPU's random stream of MC samples: counter-based, so any chunk of any step's samples can
be drawn again from (key, position) alone.

The stream is SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014): its word at position t (t = 0, 1, ...) is mix(key + (t + 1) gamma),
gamma = 0x9E3779B97F4A7C15, mix Stafford's "Mix13" finalizer (two 64-bit multiplies and three
xor-shifts), i.e. the (t + 1)-th output of SplitMix64 started from state ``key``. A run's key is
the first SplitMix64 output of its seed (:func:`seed_key`); its state is that key and one
integer, the position (:class:`CounterStream`; checkpointed, so a resumed run draws what it would
have drawn).

Uniforms: a row of d values (one sample of d mask bits) takes W = ceil(d / 2) consecutive words;
value j < W is the top 24 bits of word j's low 32 bits, value W + j the top 24 bits of its high
32 bits (the last word's high half is unused for odd d). A value m is uniform on
{0, ..., 2^24 - 1}, the grid of torch.rand in float32 (u = m / 2^24). Row r of a draw that starts
at position p takes the words p + r W, ..., p + r W + W - 1, whichever chunk it is drawn in.

On the GPU the samples keep torch's Philox generator: the CPU and a GPU draw different samples
from one seed (``docs/pbscale.md``).
"""

from __future__ import annotations

import numba
import numpy as np
import torch

#: SplitMix64's increment (the odd integer nearest 2^64 / golden ratio).
GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_LOW = np.uint64(0xFFFFFFFF)
_S8, _S40 = np.uint64(8), np.uint64(40)
#: Bits of each uniform value.
BITS = 24


@numba.njit(inline="always")
def mix(z: np.uint64) -> np.uint64:
    """Stafford's Mix13, SplitMix64's output function."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@numba.njit(inline="always")
def low24(x: np.uint64) -> np.int64:
    """The top 24 bits of the low 32 bits of word x: the value of column j < W."""
    return np.int64((x & _LOW) >> _S8)


@numba.njit(inline="always")
def high24(x: np.uint64) -> np.int64:
    """The top 24 bits of the high 32 bits of word x: the value of column W + j."""
    return np.int64(x >> _S40)


@numba.njit(inline="always")
def row_base(key: np.uint64, start: np.int64, W: np.int64, row: np.int64) -> np.uint64:
    """key + (t + 1) gamma for the first word t = start + row W of a row; word j of the row is
    mix(row_base + j gamma)."""
    return key + np.uint64(start + row * W + 1) * GAMMA


def seed_key(seed: int) -> np.uint64:
    """A run's key: SplitMix64's first output from state ``seed`` (mod 2^64)."""
    with np.errstate(over="ignore"):
        return np.uint64(_mix_py(np.uint64(int(seed) % 2**64) + GAMMA))


def _mix_py(z: np.uint64) -> np.uint64:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
        return z ^ (z >> _S31)


def words_per_row(d: int) -> int:
    """W = ceil(d / 2): the words one row of d values takes."""
    return (int(d) + 1) // 2


@numba.njit(cache=True)
def _fill_rows(key, start, W, row0, out):
    """out[r, :] = the values of rows row0, row0 + 1, ... (out (rows, d), any real dtype)."""
    rows, d = out.shape
    pairs = d - W  # columns j < pairs have a high-half partner W + j
    for r in range(rows):
        base = row_base(key, start, W, row0 + r)
        for j in range(pairs):
            x = mix(base + np.uint64(j) * GAMMA)
            out[r, j] = low24(x)
            out[r, W + j] = high24(x)
        for j in range(pairs, W):
            out[r, j] = low24(mix(base + np.uint64(j) * GAMMA))


def stream_values(key: np.uint64, start: int, d: int, rows: int, row0: int = 0,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values m (rows, d) of rows row0, ..., row0 + rows - 1 of a draw starting at word
    ``start`` (as ``dtype``: float32 holds them exactly)."""
    out = torch.empty((rows, d), dtype=dtype)
    _fill_rows(np.uint64(key), np.int64(start), np.int64(words_per_row(d)), np.int64(row0),
               out.numpy())
    return out


class CounterStream:
    """A run's stream: its ``key`` (from the seed) and ``position``, the words drawn so far.
    :meth:`take` reserves the words of a draw and returns where it starts; the rows of a draw are
    then read, in any order and any chunks, by position (:func:`stream_values`, the fused
    kernels of :mod:`pbscale.methods.fused`). A sampler given a stream instead of a
    ``torch.Generator`` draws its rows with :meth:`bits24` (the unfused reference path)."""

    device = torch.device("cpu")

    def __init__(self, seed: int) -> None:
        self.key = seed_key(seed)
        self.position = 0

    def take(self, rows: int, d: int) -> int:
        """Reserve ``rows`` rows of d values; returns the first word's position."""
        start = self.position
        self.position += int(rows) * words_per_row(d)
        return start

    def bits24(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The next rows of values m as float32, shape ``shape`` (rows = all but the last
        dimension, d = the last), in the stream's order (:func:`pbscale.methods.samplers.
        uniform_bits24`'s contract for a torch generator)."""
        d = shape[-1] if shape else 1
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        start = self.take(rows, d)
        return stream_values(self.key, start, d, rows).reshape(shape)

    def state_dict(self) -> dict:
        return {"key": int(self.key), "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.key = np.uint64(int(state["key"]))
        self.position = int(state["position"])
