"""MNIST (IDX files) and CIFAR-10 (official binary version) resident on the run's device, with a
seeded 5,000-image validation split and CIFAR augmentation on whole batches on the device
(`sec:app_pruning_setup`: validation = 5,000 random training images, test = the official split).

Images stay on the device as uint8 (MNIST (N, 784), CIFAR (N, 3, 32, 32)); a batch is cast and
standardized with the mean and standard deviation of the training split (computed, per channel
for CIFAR) when it is drawn. ``--download`` fetches the official archives and verifies them: the
MNIST files by the sha256 of their decompressed bytes (the table of the data README, the same
bytes as on yann.lecun.com), CIFAR-10 by the md5 published on its home page.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pbexact.errors import PBInputError
from pbexact.io import atomic_write_bytes, check_out_dir
from pbscale.nets.standardize import image_constants

#: sha256 of the decompressed MNIST IDX files (shared/data/README.md; the original bytes).
MNIST_SHA256 = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
#: Where the MNIST .gz files are fetched from (the original site; a mirror can be passed).
MNIST_URL = "https://yann.lecun.com/exdb/mnist/"
#: The official CIFAR-10 binary archive and the md5 its home page publishes.
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR10_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
CIFAR10_DIR = "cifar-10-batches-bin"
CIFAR10_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR10_TEST = "test_batch.bin"
CIFAR10_RECORD = 1 + 3 * 32 * 32
#: Records (images) in each official CIFAR-10 batch file, training and test alike.
CIFAR10_FILE_RECORDS = 10_000
DATASETS = ("mnist", "cifar10")
VAL_SIZE = 5000


@dataclass
class Split:
    """Images x (N, ...) uint8 and labels y (N,) int64, both on the run's device."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


#: How a data set's inputs reach the network (:attr:`Data.inputs`), by the dtype of its arrays:
#: uint8 "image" (standardized: (x / 255 - mean) / std), floating "float" (as they are, in
#: float32) and other integers "index" (as they are, in int64: token or category ids).
INPUT_KINDS = ("image", "float", "index")


def input_kind(dtype: np.dtype) -> str:
    """The :data:`INPUT_KINDS` entry of arrays of ``dtype``."""
    if dtype == np.uint8:
        return "image"
    return "float" if np.issubdtype(dtype, np.floating) else "index"


@dataclass
class Data:
    """A data set on one device: train / val / test splits, standardization constants of the
    training split (images: mean, std of shape (1, C, 1, ...) per channel for (N, C, H, W)
    images, (1, 1) otherwise; 0 and 1 for other inputs), whether training batches are augmented
    (CIFAR: 4-pixel-pad random crop, horizontal flip), the data's fingerprint
    (:func:`fingerprint` of the arrays it was made from) and how its inputs reach the network
    (:data:`INPUT_KINDS`)."""

    name: str
    train: Split
    val: Split
    test: Split
    mean: torch.Tensor
    std: torch.Tensor
    augment: bool
    fingerprint: str = ""
    inputs: str = "image"

    @property
    def classes(self) -> bool:
        """Whether the labels are integer classes (else float targets)."""
        return not self.train.y.is_floating_point()

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """A batch as the network takes it: uint8 images -> standardized float32 of the same
        shape; other inputs as they are."""
        if self.inputs != "image":
            return x
        return (x.float() / 255.0 - self.mean) / self.std

    def transform(self) -> dict:
        """What a user of an exported network needs to feed it (``data.json`` of a pruning
        run): the input shape and dtype, the standardization constants of :meth:`prepare` as
        lists (one per channel for (N, C, H, W) images, one otherwise) and the test-time
        transform (no augmentation)."""
        shape = list(self.train.x.shape[1:])
        dtype = {"image": "uint8", "float": "float32", "index": "int64"}[self.inputs]
        if self.inputs != "image":
            text = f"{dtype} inputs of shape {shape}, fed as they are"
        else:
            pixels = {"mnist": "784 pixels, row-major",
                      "cifar10": "3 x 32 x 32, RGB planes"}.get(self.name, f"shape {shape}")
            text = (f"uint8 image ({pixels}) x -> (x / 255 - mean) / std in float32"
                    f"{', per channel' if len(self.mean.flatten()) > 1 else ''}; "
                    "no augmentation")
        return {"dataset": self.name, "input_shape": shape, "input_dtype": dtype,
                "mean": self.mean.flatten().tolist(), "std": self.std.flatten().tolist(),
                "test_transform": text}

    def batches(self, split: str, batch_size: int, generator: torch.Generator | None = None,
                augment: bool | None = None, limit: int | None = None,
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(x, y) batches of ``split``: shuffled by ``generator`` when one is given (else in
        order), the last partial batch kept; at most ``limit`` batches. Augmentation (training
        split of CIFAR by default) draws from ``generator`` too."""
        s: Split = getattr(self, split)
        n = len(s)
        if generator is not None:
            order = torch.randperm(n, generator=generator).to(s.y.device)
        else:
            order = None
        aug = self.augment and split == "train" if augment is None else augment
        for count, start in enumerate(range(0, n, batch_size)):
            if limit is not None and count >= limit:
                return
            idx = slice(start, start + batch_size) if order is None else order[start:start +
                                                                                   batch_size]
            x, y = s.x[idx], s.y[idx]
            if aug:
                x = augment_batch(x, generator)
            yield self.prepare(x), y


def augment_batch(x: torch.Tensor, generator: torch.Generator | None = None,
                  pad: int = 4) -> torch.Tensor:
    """Random crop after zero padding by ``pad`` pixels and a random horizontal flip, for a whole
    batch x (B, C, H, W) at once on its device; draws come from ``generator`` (on the CPU, so the
    same seed gives the same crops on every device)."""
    B, C, H, W = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    off = torch.randint(0, 2 * pad + 1, (2, B), generator=generator).to(x.device)
    flip = (torch.rand(B, generator=generator) < 0.5).to(x.device)
    rows = off[0][:, None] + torch.arange(H, device=x.device)  # (B, H)
    cols = off[1][:, None] + torch.arange(W, device=x.device)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    b = torch.arange(B, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


# ----------------------------------------------------------------------------- MNIST


#: The fix of an MNIST file that is not the original: never a download over the user's files.
NOT_MNIST_FIX = ("to train on your own arrays use --data FILE.npz (docs/own_network.md); for "
                 "MNIST, fetch the originals into a new folder with --data-dir NEW --download")


def _mnist_missing(data_dir: Path, name: str) -> PBInputError:
    return PBInputError(
        f"MNIST file {name}[.gz] not found in {data_dir}; put the four original IDX files "
        f"(gzip or not) there, or rerun with --download"
    )


#: The most bytes deflate makes of one byte (its longest match per code: 258 / 2 bits).
MAX_INFLATION = 1032


def gunzip(blob: bytes) -> bytes | bytearray:
    """The decompressed bytes of a gzip file's contents ``blob``: written piece by piece into
    one buffer of the size its trailer states (``gzip.decompress`` grows its output, leaving a
    free block of about that size on the heap, which the training commands keep:
    :mod:`pbscale.runs.allocator`), or by ``gzip.decompress`` where the stream is not one gzip
    member of that size (its errors are gzip's)."""
    size = int.from_bytes(blob[-4:], "little") if len(blob) >= 18 else 0
    if size > MAX_INFLATION * len(blob):  # a trailer no deflate stream can have
        return gzip.decompress(blob)
    out, pos = bytearray(size), 0
    inflate = zlib.decompressobj(wbits=31)  # one gzip member, header and trailer checked
    view, piece = memoryview(blob), 1 << 20
    try:
        for start in range(0, len(blob), piece):
            data = view[start:start + piece]
            while data:
                chunk = inflate.decompress(data, piece)
                if pos + len(chunk) > size:
                    return gzip.decompress(blob)
                out[pos:pos + len(chunk)] = chunk
                pos += len(chunk)
                data = inflate.unconsumed_tail
        rest = inflate.flush()  # what the last input left pending (part of a match)
    except zlib.error:
        return gzip.decompress(blob)
    if rest and pos + len(rest) <= size:
        out[pos:pos + len(rest)] = rest
        pos += len(rest)
    if not (inflate.eof and not inflate.unused_data and pos == size):
        return gzip.decompress(blob)
    return out


def _read_mnist_file(data_dir: Path, name: str, sha256: dict[str, str]) -> bytes | bytearray:
    plain, gz = data_dir / name, data_dir / f"{name}.gz"
    if plain.exists():
        raw = plain.read_bytes()
        where = plain
    elif gz.exists():
        where = gz
        try:
            raw = gunzip(gz.read_bytes())
        except (OSError, EOFError) as e:
            raise PBInputError(f"{gz} is corrupt ({e}); {NOT_MNIST_FIX}") from None
    else:
        raise _mnist_missing(data_dir, name)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256[name]:
        raise PBInputError(
            f"{where} is corrupt or not the original MNIST file (sha256 {digest[:12]}..., "
            f"expected {sha256[name][:12]}...); {NOT_MNIST_FIX}"
        )
    return raw


def parse_idx(raw: bytes | bytearray) -> np.ndarray:
    """An IDX file (big-endian header: magic 0x0000 type ndim, then the dimensions) of unsigned
    bytes -> uint8 array of its shape (a writable view of a ``bytearray``, else a copy)."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise PBInputError("not an IDX file of unsigned bytes; use the original MNIST files")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    start = 4 + 4 * ndim
    if len(raw) != start + int(np.prod(dims)):
        raise PBInputError(f"IDX file of {len(raw)} bytes does not match its header {dims}; "
                           f"the file is truncated: get it again")
    out = np.frombuffer(raw, dtype=np.uint8, offset=start).reshape(dims)
    return out if isinstance(raw, bytearray) else out.copy()


def read_mnist(data_dir: str | Path, sha256: dict[str, str] = MNIST_SHA256,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images (60000, 784), train labels, test images (10000, 784), test labels), uint8."""
    d = Path(data_dir)
    arrays = [parse_idx(_read_mnist_file(d, name, sha256)) for name in (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte")]
    xtr, ytr, xte, yte = arrays
    return xtr.reshape(len(xtr), -1), ytr, xte.reshape(len(xte), -1), yte


# ----------------------------------------------------------------------------- CIFAR-10


def _cifar_root(data_dir: Path) -> Path:
    return data_dir / CIFAR10_DIR if (data_dir / CIFAR10_DIR).is_dir() else data_dir


def read_cifar_file(path: Path, records: int | None = CIFAR10_FILE_RECORDS,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """One binary batch file: ``records`` records (None: any whole number) of 1 label byte and
    3072 pixel bytes (red, green, blue planes, row-major) -> images (N, 3, 32, 32) uint8 and
    labels (N,) uint8."""
    raw = path.read_bytes()
    if len(raw) == 0 or len(raw) % CIFAR10_RECORD:
        raise PBInputError(f"{path} is corrupt ({len(raw)} bytes, not a whole number of "
                           f"{CIFAR10_RECORD}-byte records); delete it and rerun with --download")
    if records is not None and len(raw) != records * CIFAR10_RECORD:
        raise PBInputError(f"{path} is corrupt or cut short ({len(raw) // CIFAR10_RECORD:,} "
                           f"records, an official batch file has {records:,}); delete it and "
                           f"rerun with --download")
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR10_RECORD)
    labels = rec[:, 0].copy()
    if labels.max() > 9:
        raise PBInputError(f"{path} is corrupt (label {labels.max()} > 9); delete it and rerun "
                           f"with --download")
    return rec[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


def _require_cifar_files(root: Path) -> None:
    """A one-line error naming the first CIFAR-10 binary file missing from ``root``."""
    for name in (*CIFAR10_TRAIN, CIFAR10_TEST):
        if not (root / name).exists():
            raise PBInputError(
                f"CIFAR-10 file {name} not found in {root}; extract the binary version "
                f"(cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html) "
                f"there, or rerun with --download")


def read_cifar10(data_dir: str | Path, records: int | None = CIFAR10_FILE_RECORDS,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images (N, 3, 32, 32), train labels, test images, test labels) from the binary
    version in ``data_dir`` or ``data_dir/cifar-10-batches-bin`` (never the pickles); each
    batch file must hold ``records`` records (the official 10,000; None: any number)."""
    root = _cifar_root(Path(data_dir))
    _require_cifar_files(root)
    parts = [read_cifar_file(root / name, records) for name in CIFAR10_TRAIN]
    xte, yte = read_cifar_file(root / CIFAR10_TEST, records)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            xte, yte)


# ----------------------------------------------------------------------------- download


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.read()
    except (OSError, ValueError) as e:
        raise PBInputError(f"could not download {url} ({e}); fetch it by hand into --data-dir"
                           ) from None


def download(name: str, data_dir: str | Path, url: str | None = None,
             checksums: dict[str, str] | str | None = None) -> Path:
    """Fetch the official files of ``name`` into ``data_dir`` (created) and verify them; the
    files already there and verified are kept. ``url`` (a base URL for MNIST, the archive URL for
    CIFAR-10; file:// works) and ``checksums`` (MNIST: {file: sha256 of its decompressed bytes};
    CIFAR-10: the archive's md5) default to the official ones. Returns ``data_dir``."""
    d = check_out_dir(Path(data_dir), "--data-dir")
    if name == "mnist":
        sha = MNIST_SHA256 if checksums is None else checksums
        assert isinstance(sha, dict)
        base = (url or MNIST_URL).rstrip("/") + "/"
        for f in sha:
            try:
                _read_mnist_file(d, f, sha)
                continue
            except PBInputError:
                pass
            raw = gzip.decompress(_fetch(base + f + ".gz"))
            digest = hashlib.sha256(raw).hexdigest()
            if digest != sha[f]:
                raise PBInputError(f"downloaded {f} fails its checksum (sha256 {digest[:12]}..."
                                   f"); the mirror is wrong: try another --download-url")
            atomic_write_bytes(d / f, raw)
        return d
    if name == "cifar10":
        md5 = CIFAR10_MD5 if checksums is None else checksums
        blob = _fetch(url or CIFAR10_URL)
        digest = hashlib.md5(blob).hexdigest()
        if digest != md5:
            raise PBInputError(f"downloaded CIFAR-10 archive fails its checksum (md5 {digest}, "
                               f"published {md5}); try again or fetch it by hand")
        wanted = {f"{CIFAR10_DIR}/{f}" for f in (*CIFAR10_TRAIN, CIFAR10_TEST)}
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            for member in tar.getmembers():
                # only the six known regular files, written by name (no paths from the archive)
                if member.isfile() and member.name in wanted:
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    atomic_write_bytes(d / member.name, data)
        missing = [w for w in wanted if not (d / w).exists()]
        if missing:
            raise PBInputError(f"the CIFAR-10 archive lacks {missing[0]}; it is not the binary "
                               f"version: use cifar-10-binary.tar.gz")
        return d
    raise PBInputError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


# ----------------------------------------------------------------------------- loading


def check_data(name: str, data_dir: str | Path) -> None:
    """Raise PBInputError (one line: where the data is expected, how to get it) unless the files
    of ``name`` are present; cheap (existence only), for checks before training."""
    d = Path(data_dir)
    if name == "mnist":
        for f in MNIST_SHA256:
            if not ((d / f).exists() or (d / f"{f}.gz").exists()):
                raise _mnist_missing(d, f)
    elif name == "cifar10":
        _require_cifar_files(_cifar_root(d))
    else:
        raise PBInputError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def fingerprint(*arrays: np.ndarray) -> str:
    """First 16 hex digits of the SHA-256 over the shapes and bytes of ``arrays``: what a run
    folder records of its data (:func:`pbscale.runs.loop.run` refuses a rerun on other data)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()[:16]


def from_arrays(name: str, xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray,
                device: torch.device | str = "cpu", val_size: int = VAL_SIZE,
                split_seed: int = 0, val: tuple[np.ndarray, np.ndarray] | None = None) -> Data:
    """A :class:`Data` from arrays: ``val`` as the validation split, or ``val_size`` training
    examples held out by a permutation drawn with ``split_seed``; image standardization
    constants from the remaining training images (per channel for (N, C, H, W) images). Inputs
    by dtype (:func:`input_kind`), integer labels as int64 and float targets as float32."""
    n = len(ytr)
    kind = input_kind(xtr.dtype)
    xtr_t = torch.from_numpy(np.ascontiguousarray(_input_array(xtr, kind)))
    ytr_t = torch.from_numpy(_label_array(ytr))
    if val is None:
        if not 0 <= val_size < n:
            raise PBInputError(f"validation size {val_size} must be in [0, {n}); lower "
                               "--val-size")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(split_seed))
        tr_idx, va_idx = perm[val_size:], perm[:val_size]
        x_train, y_train = xtr_t[tr_idx], ytr_t[tr_idx]
        x_val, y_val = xtr_t[va_idx], ytr_t[va_idx]
    else:
        x_train, y_train = xtr_t, ytr_t
        x_val = torch.from_numpy(np.ascontiguousarray(_input_array(val[0], kind)))
        y_val = torch.from_numpy(_label_array(val[1]))
    if kind == "image" and x_train.dim() == 4:  # per channel, in float64
        xf = x_train.double().div_(255.0)  # in place: one float64 copy, x.double() / 255
        mean = xf.mean(dim=(0, 2, 3)).view(1, -1, 1, 1)
        std = xf.std(dim=(0, 2, 3)).view(1, -1, 1, 1)
        del xf
    elif kind == "image":
        mean, std = image_constants(x_train)  # those of float64, without its copy
    else:
        mean, std = torch.zeros(1, 1), torch.ones(1, 1)
    dev = torch.device(device)
    arrays = (xtr, ytr, xte, yte, *(val if val is not None else ()))
    return Data(
        name=name,
        train=Split(x_train.to(dev), y_train.to(dev)),
        val=Split(x_val.to(dev), y_val.to(dev)),
        test=Split(torch.from_numpy(np.ascontiguousarray(_input_array(xte, kind))).to(dev),
                   torch.from_numpy(_label_array(yte)).to(dev)),
        mean=mean.float().to(dev), std=std.float().to(dev), augment=name == "cifar10",
        fingerprint=fingerprint(*arrays), inputs=kind,
    )


def _input_array(x: np.ndarray, kind: str) -> np.ndarray:
    """Inputs as the device holds them: uint8 images as they are, floats as float32, indices
    as int64."""
    if kind == "image":
        return x
    return x.astype(np.float32 if kind == "float" else np.int64, copy=False)


def _label_array(y: np.ndarray) -> np.ndarray:
    """Integer labels as int64, float targets as float32."""
    return y.astype(np.float32 if np.issubdtype(y.dtype, np.floating) else np.int64)


def load(name: str, data_dir: str | Path, device: torch.device | str = "cpu",
         val_size: int = VAL_SIZE, split_seed: int = 0) -> Data:
    """MNIST or CIFAR-10 from ``data_dir`` on ``device`` (see :func:`from_arrays`)."""
    if name == "mnist":
        arrays = read_mnist(data_dir)
    elif name == "cifar10":
        arrays = read_cifar10(data_dir)
    else:
        raise PBInputError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return from_arrays(name, *arrays, device=device, val_size=val_size, split_seed=split_seed)


def synthetic(name: str, n_train: int = 256, n_test: int = 64, seed: int = 0,
              device: torch.device | str = "cpu", val_size: int = 64) -> Data:
    """Random uint8 images and labels of ``name``'s shapes (tests and benchmarks only)."""
    g = torch.Generator().manual_seed(seed)
    shape = (784,) if name == "mnist" else (3, 32, 32)
    def draw(n):
        return (torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8).numpy(),
                torch.randint(0, 10, (n,), generator=g, dtype=torch.uint8).numpy())
    xtr, ytr = draw(n_train + val_size)
    xte, yte = draw(n_test)
    return from_arrays(name, xtr, ytr, xte, yte, device=device, val_size=val_size)
