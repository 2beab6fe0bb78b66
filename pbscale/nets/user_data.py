"""The user's own data for a pruning run: a ``.npz`` file (``--data``) or, in the Python API,
arrays, tensors, a torch ``Dataset`` or a ``DataLoader``, checked and turned into a
:class:`pbscale.nets.data.Data` (:func:`pbscale.nets.data.from_arrays`).

The file holds ``x_train y_train x_test y_test`` and optionally ``x_val y_val``, read with
``allow_pickle=False`` (a file never runs code); their headers are read and checked first
(shapes, dtypes, the sizes the archive records, the memory they take), so a file that declares
more than fits, or a zip bomb of the wrong layout, is refused before anything is decompressed.

Inputs by dtype: uint8 arrays are images, standardized with the training split's mean and
standard deviation as MNIST and CIFAR-10 are (per channel for (N, C, H, W)); float arrays are
fed as they are (float32); other integer arrays are ids (int64, e.g. for an embedding).
Targets: integer labels (N,) are classes (cross-entropy, accuracy), float targets (N, ...) are
regressed (mean squared error). Without ``x_val``, validation examples are held out of the
training split (:func:`held_out`).
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pbexact.errors import PBInputError, format_bytes
from pbscale.nets import data as datamod
from pbscale.runs.memory import cpu_available

#: The arrays a data file must hold, and those it may hold.
REQUIRED = ("x_train", "y_train", "x_test", "y_test")
OPTIONAL = ("x_val", "y_val")
#: The name of user data in a run's config ("dataset") and data.json.
ARRAYS = "arrays"
#: How a user's data file is written (the fix of a bad one).
HOW = ("write it with numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=...) "
       "(docs/own_network.md)")


@dataclass(frozen=True)
class Declared:
    """What a ``.npy`` member of a data file declares in its header, before any of its data is
    read: ``shape`` and ``dtype`` (``ndim`` and ``len`` as an array's), ``header`` (the bytes
    before the data) and ``stored`` (the uncompressed size the archive records for it)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    header: int
    stored: int

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def declared(path: Path) -> dict[str, Declared]:
    """The header of each array of the data file that a run reads (:data:`REQUIRED`,
    :data:`OPTIONAL`), read from the zip archive without decompressing any array's data; a
    header numpy cannot read, or one that declares objects (pickles), is a one-line
    :class:`PBInputError`."""
    out = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                if name not in REQUIRED + OPTIONAL or not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    read = {(1, 0): np.lib.format.read_array_header_1_0,
                            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if read is None:
                        raise ValueError(f"{info.filename}: .npy format {version} is not read")
                    shape, _, dtype = read(fh)
                    header = fh.tell()
                out[name] = Declared(tuple(int(n) for n in shape), dtype, header, info.file_size)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, KeyError,
            NotImplementedError, RuntimeError) as e:
        raise PBInputError(f"--data {path} is not a readable .npz file ({type(e).__name__}: "
                           f"{str(e)[:160]}); {HOW}") from None
    for name, d in out.items():
        if any(n < 0 for n in d.shape):
            raise PBInputError(f"--data {path}: {name} declares the shape {list(d.shape)}, with "
                               f"a negative size (a damaged or edited file); {HOW}")
        if d.dtype.hasobject:
            raise PBInputError(f"--data {path} holds Python objects (pickles) in {name}, which "
                               f"are never loaded; store plain numeric arrays: {HOW}")
    return out


def check_declared(path: Path, arrays: dict[str, Declared]) -> None:
    """Before any array is read: the layout :func:`check_layout` checks, that each member
    holds what its header declares (the archive's size of it: a zip bomb or an edited header
    declares another), and that the arrays and the run's copies of them (float inputs as
    float32, ids and labels as int64) fit in the memory the process may take
    (:func:`pbscale.runs.memory.cpu_available`), naming the most training examples that fit."""
    check_layout(arrays, f"--data {path}")
    kinds = {"f": 4, "i": 8, "u": 8}
    need = {k: d.nbytes + (math.prod(d.shape) * kinds.get(d.dtype.kind, 1)
                           if not (k.startswith("x_") and d.dtype == np.uint8) else 0)
            for k, d in arrays.items()}
    total, free = sum(need.values()), cpu_available()
    if total > free:
        train = need["x_train"] + need["y_train"]
        n = len(arrays["x_train"])
        fits = max((free - (total - train)) * n // max(train, 1), 0)
        shown = ", ".join(f"{k} {list(d.shape)} {d.dtype}" for k, d in arrays.items())
        raise PBInputError(f"--data {path} declares arrays ({shown}) that take "
                           f"{format_bytes(total)} once loaded with the run's copies, more than "
                           f"the {format_bytes(free)} this process may take; store at most "
                           f"{fits:,} training examples, or free memory")
    for k, d in arrays.items():
        if d.stored != d.header + d.nbytes:
            raise PBInputError(f"--data {path}: {k} declares {list(d.shape)} {d.dtype} "
                               f"({d.nbytes:,} bytes), but the archive holds {d.stored:,} "
                               f"bytes for it (a damaged or edited file); {HOW}")


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` data file, checked: first from the arrays' headers alone
    (:func:`declared`, :func:`check_declared`: shapes, dtypes, sizes and memory, before any
    array is decompressed), then their values (:func:`check_arrays`). A file that is missing,
    a folder, not an npz, holding objects (pickles are never loaded) or lacking an array is a
    one-line :class:`PBInputError`."""
    path = Path(path)
    if path.is_dir():
        raise PBInputError(f"--data {path} is a folder; give the .npz file of your arrays "
                           f"({HOW})")
    if path.exists() and not path.is_file():
        raise PBInputError(f"--data {path} is not a regular file (a FIFO, socket or device); "
                           f"give the .npz file of your arrays ({HOW})")
    if not path.is_file():
        raise PBInputError(f"--data {path}: no such file; give the .npz file of your arrays "
                           f"({HOW})")
    if not zipfile.is_zipfile(path):
        raise PBInputError(f"--data {path} is not a readable .npz file (not a zip archive); "
                           f"{HOW}")
    heads = declared(path)
    missing = [k for k in REQUIRED if k not in heads]
    if missing:
        raise PBInputError(f"--data {path} has no {', '.join(missing)} (it has "
                           f"{', '.join(heads) or 'no arrays'}); {HOW}")
    if ("x_val" in heads) != ("y_val" in heads):
        raise PBInputError(f"--data {path} has only one of x_val and y_val; give both or "
                           "neither")
    check_declared(path, heads)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in heads}
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise PBInputError(f"--data {path} holds Python objects (pickles), which are never "
                               f"loaded; store plain numeric arrays: {HOW}") from None
        raise PBInputError(f"--data {path} is not a readable .npz file ({e}); {HOW}") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise PBInputError(f"--data {path} is not a readable .npz file ({type(e).__name__}: "
                           f"{e}); {HOW}") from None
    check_arrays(arrays, f"--data {path}")
    return arrays


def check_layout(arrays: dict[str, Any], where: str = "data") -> None:
    """One-line :class:`PBInputError` for arrays (or their :class:`Declared` headers) whose
    layout a run cannot use: an empty split, inputs and targets of different lengths, splits
    whose inputs differ in shape or kind, boolean, complex or non-numeric values, integer
    labels that are not one class per example."""
    splits = [s for s in ("train", "val", "test") if f"x_{s}" in arrays]
    x0 = arrays["x_train"]
    for s in splits:
        x, y = arrays[f"x_{s}"], arrays[f"y_{s}"]
        for name, a in ((f"x_{s}", x), (f"y_{s}", y)):
            if a.dtype == np.bool_ or a.dtype.kind not in "uif":
                raise PBInputError(f"{where}: {name} has dtype {a.dtype}; store numbers (uint8 "
                                   "images, float inputs or targets, integer labels or ids)")
            if a.ndim == 0:
                raise PBInputError(f"{where}: {name} is a single number; store one row per "
                                   "example")
        if len(x) == 0:
            raise PBInputError(f"{where}: x_{s} is empty; every split needs examples")
        if len(x) != len(y):
            raise PBInputError(f"{where}: x_{s} has {len(x):,} examples but y_{s} has "
                               f"{len(y):,}; give one target per example")
        if x.shape[1:] != x0.shape[1:] or datamod.input_kind(x.dtype) != datamod.input_kind(
                x0.dtype):
            raise PBInputError(f"{where}: x_{s} is {x.dtype} {list(x.shape[1:])} per example, "
                               f"x_train {x0.dtype} {list(x0.shape[1:])}; store every split "
                               "alike")
        classes = y.dtype.kind in "ui"
        if classes != (arrays["y_train"].dtype.kind in "ui"):
            raise PBInputError(f"{where}: y_{s} and y_train differ (integer labels in one, "
                               "float targets in the other); store them alike")
        if classes and y.ndim != 1:
            raise PBInputError(f"{where}: y_{s} has shape {list(y.shape)}; integer labels are "
                               "one class per example (N,), float targets may have any shape")


def check_arrays(arrays: dict[str, np.ndarray], where: str = "data") -> None:
    """One-line :class:`PBInputError` for arrays a run cannot use: their layout
    (:func:`check_layout`), NaN or infinite values, negative labels, and integers past what
    int64 holds (uint64 labels or ids from 2**63 on, which the run's int64 copy would wrap to
    negative numbers)."""
    check_layout(arrays, where)
    top = np.iinfo(np.int64).max
    for s in (s for s in ("train", "val", "test") if f"x_{s}" in arrays):
        x, y = arrays[f"x_{s}"], arrays[f"y_{s}"]
        for name, a in ((f"x_{s}", x), (f"y_{s}", y)):
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise PBInputError(f"{where}: {name} holds NaN or infinite values; clean them "
                                   "before training")
            if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size and a.max() > top:
                raise PBInputError(f"{where}: {name} holds {a.max()}, past the largest int64 "
                                   f"({top:,}) the run stores integers as; store "
                                   f"{'classes 0, 1, ..., C - 1' if name[0] == 'y' else 'ids'}"
                                   " below it (e.g. as int64)")
        if y.dtype.kind in "ui" and y.min() < 0:
            raise PBInputError(f"{where}: y_{s} holds the label {y.min()}; classes are 0, 1, "
                               "..., C - 1")


def held_out(n_train: int, val_size: int, default: int = datamod.VAL_SIZE) -> int:
    """How many training examples validate when the data has no x_val: ``val_size``, except
    that the default (5,000, the paper's) becomes a tenth of a training set of under 50,000."""
    if val_size == default and n_train < 10 * default:
        return max(n_train // 10, 1)
    return val_size


def arrays_data(arrays: dict[str, np.ndarray], device: torch.device | str = "cpu",
                val_size: int = datamod.VAL_SIZE, split_seed: int = 0) -> datamod.Data:
    """A :class:`pbscale.nets.data.Data` named :data:`ARRAYS` from checked arrays: ``x_val``/
    ``y_val`` as the validation split, else :func:`held_out` training examples held out with
    ``split_seed``."""
    val = (arrays["x_val"], arrays["y_val"]) if "x_val" in arrays else None
    n = len(arrays["y_train"])
    hold = 0 if val is not None else held_out(n, val_size)
    if val is None and not 0 < hold < n:
        raise PBInputError(f"--val-size {hold} leaves no training or no validation example of "
                           f"{n:,}; give --val-size from 1 to {n - 1:,}, or x_val/y_val")
    return datamod.from_arrays(ARRAYS, arrays["x_train"], arrays["y_train"], arrays["x_test"],
                               arrays["y_test"], device=device, val_size=hold,
                               split_seed=split_seed, val=val)


def data_id(arrays: dict[str, np.ndarray]) -> str:
    """The identity a run of ``arrays`` records (config.json's "task" ``data_id``): the
    fingerprint of the training, test and (when given) validation arrays, in the order
    :func:`arrays_data` gives them to :func:`pbscale.nets.data.from_arrays`."""
    names = (*REQUIRED, *(OPTIONAL if "x_val" in arrays else ()))
    return datamod.fingerprint(*(arrays[k] for k in names))


# ------------------------------------------------------------------ Python objects


def _numpy(a: Any, what: str) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    try:
        return np.asarray(a)
    except (TypeError, ValueError) as e:
        raise PBInputError(f"{what}: cannot read it as an array ({e}); give arrays or "
                           "tensors") from None


def _stack(items: Iterable, what: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise PBInputError(f"{what}: each item must be an (input, target) pair, got a "
                               f"{type(item).__name__}")
        xs.append(_numpy(item[0], what))
        ys.append(_numpy(item[1], what))
    if not xs:
        raise PBInputError(f"{what} is empty; every split needs examples")
    return xs, ys


def split_arrays(obj: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of one split given as an ``(x, y)`` pair of arrays or tensors, a torch
    ``Dataset`` of (input, target) items (read once, in order), or a ``DataLoader`` (its
    ``dataset``, read in order: the run draws its own batches)."""
    from torch.utils.data import DataLoader, Dataset

    if isinstance(obj, DataLoader):
        obj = obj.dataset
    if isinstance(obj, (tuple, list)) and len(obj) == 2 and not isinstance(obj, Dataset):
        return _numpy(obj[0], f"{what} inputs"), _numpy(obj[1], f"{what} targets")
    if isinstance(obj, Dataset):
        if not hasattr(obj, "__len__"):
            raise PBInputError(f"{what}: an iterable Dataset has no length; give a map-style "
                               "Dataset or (x, y) arrays")
        xs, ys = _stack((obj[i] for i in range(len(obj))), what)
        return np.stack(xs), np.stack(ys)
    raise PBInputError(f"{what} must be (x, y) arrays or tensors, a torch Dataset or a "
                       f"DataLoader; got a {type(obj).__name__}")


def object_arrays(train: Any, test: Any, val: Any = None) -> dict[str, np.ndarray]:
    """The arrays (:data:`REQUIRED`, :data:`OPTIONAL`) of the Python API's splits, checked."""
    arrays: dict[str, np.ndarray] = {}
    for split, obj in (("train", train), ("test", test), ("val", val)):
        if obj is None and split == "val":
            continue
        x, y = split_arrays(obj, split)
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, y
    check_arrays(arrays, "data")
    return arrays


__all__ = ["ARRAYS", "OPTIONAL", "REQUIRED", "Declared", "arrays_data", "check_arrays",
           "check_declared", "check_layout", "data_id", "declared", "held_out", "object_arrays",
           "read_npz", "split_arrays"]
