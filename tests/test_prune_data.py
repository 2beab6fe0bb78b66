"""Data readers on files the tests make: MNIST IDX (gzip or not, checksums), the CIFAR-10 binary
version, the download path through a file:// URL, the seeded validation split and the batch
augmentation."""

import gzip
import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from _mnist import MNIST_DIR  # noqa: E402

from pbexact.errors import PBInputError
from pbscale.nets import data


def idx_bytes(arr: np.ndarray) -> bytes:
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    return head + arr.astype(np.uint8).tobytes()


def make_mnist(folder: Path, n_train=40, n_test=10, compress=True, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test),
    }
    folder.mkdir(parents=True, exist_ok=True)
    sha = {}
    for name, arr in arrays.items():
        raw = idx_bytes(arr)
        sha[name] = hashlib.sha256(raw).hexdigest()
        if compress:
            (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            (folder / name).write_bytes(raw)
    return arrays, sha


def cifar_records(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 256, (n, 3, 32, 32)).astype(np.uint8)
    raw = b"".join(bytes([labels[i]]) + images[i].tobytes() for i in range(n))
    return raw, images, labels


def make_cifar(folder: Path, n=6):
    root = folder / data.CIFAR10_DIR
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, name in enumerate((*data.CIFAR10_TRAIN, data.CIFAR10_TEST)):
        raw, images, labels = cifar_records(n, i)
        (root / name).write_bytes(raw)
        out[name] = (images, labels)
    return out


def test_real_mnist_checksums_and_split():
    if not MNIST_DIR.exists():
        pytest.skip("shared MNIST not present")
    d = data.load("mnist", MNIST_DIR)
    assert (len(d.train), len(d.val), len(d.test)) == (55_000, 5_000, 10_000)
    assert d.train.x.dtype == torch.uint8 and d.train.x.shape[1] == 784
    # same split seed, same validation images; another seed, another split
    d2 = data.load("mnist", MNIST_DIR)
    assert torch.equal(d.val.y, d2.val.y)
    d3 = data.load("mnist", MNIST_DIR, split_seed=1)
    assert not torch.equal(d.val.y, d3.val.y)
    # the training mean of all pixels by numpy directly on the IDX file
    xtr, *_ = data.read_mnist(MNIST_DIR)
    full = xtr.astype(np.float64).mean() / 255
    assert abs(float(d.mean) - full) < 2e-3


@pytest.mark.parametrize("compress", [True, False])
def test_mnist_idx_gzip_or_not(tmp_path, compress):
    arrays, sha = make_mnist(tmp_path, compress=compress)
    xtr, ytr, xte, yte = data.read_mnist(tmp_path, sha256=sha)
    assert np.array_equal(xtr, arrays["train-images-idx3-ubyte"].reshape(40, 784))
    assert np.array_equal(yte, arrays["t10k-labels-idx1-ubyte"])


def test_mnist_missing_and_corrupt_one_line_errors(tmp_path):
    with pytest.raises(PBInputError, match="not found in .*--download") as e:
        data.read_mnist(tmp_path)
    assert "\n" not in str(e.value)
    make_mnist(tmp_path)  # our random files do not match the real MNIST checksums
    with pytest.raises(PBInputError, match="corrupt or not the original.*--download"):
        data.read_mnist(tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(PBInputError, match="corrupt"):
        data.read_mnist(tmp_path)


def test_gunzip_one_buffer_and_fallbacks():
    """A gzip member decompresses into one bytearray of its size (MNIST's parse then views it
    without a copy); two members, a trailer that lies, a cut file or no gzip at all go
    through gzip.decompress, with its errors."""
    raw = bytes(np.random.default_rng(1).integers(0, 3, 3_000_000).astype(np.uint8))
    out = data.gunzip(gzip.compress(raw))
    assert isinstance(out, bytearray) and out == raw
    assert data.gunzip(gzip.compress(b"")) == b""
    two = gzip.compress(raw[:1000]) + gzip.compress(raw[1000:2000])
    assert data.gunzip(two) == raw[:2000]
    for size in (100, 2 ** 32 - 1):  # too small; more than deflate makes of the file
        lying = bytearray(gzip.compress(raw[:5000]))
        lying[-4:] = size.to_bytes(4, "little")
        with pytest.raises(OSError):
            data.gunzip(bytes(lying))
    with pytest.raises(EOFError):
        data.gunzip(gzip.compress(os.urandom(1000))[:-20])
    with pytest.raises(OSError):
        data.gunzip(b"not a gzip file at all")
    head = bytes([0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3])
    view = data.parse_idx(bytearray(head + bytes(range(6))))
    assert view.shape == (2, 3) and view.flags.writeable and view.base is not None
    assert view[1, 2] == 5


def test_cifar_binary_reader(tmp_path):
    made = make_cifar(tmp_path)
    xtr, ytr, xte, yte = data.read_cifar10(tmp_path, records=6)
    assert xtr.shape == (30, 3, 32, 32) and xte.shape == (6, 3, 32, 32)
    assert np.array_equal(xtr[:6], made["data_batch_1.bin"][0])
    assert np.array_equal(ytr[6:12], made["data_batch_2.bin"][1])
    assert np.array_equal(yte, made["test_batch.bin"][1])
    # the red plane is the first 1024 pixel bytes of a record (official layout)
    raw = (tmp_path / data.CIFAR10_DIR / "test_batch.bin").read_bytes()
    assert np.array_equal(np.frombuffer(raw[1:1025], np.uint8).reshape(32, 32), xte[0, 0])
    d = data.from_arrays("cifar10", xtr, ytr, xte, yte, val_size=5)
    assert (len(d.train), len(d.val), len(d.test)) == (25, 5, 6)
    assert d.mean.shape == (1, 3, 1, 1)


def test_cifar_missing_and_corrupt(tmp_path):
    with pytest.raises(PBInputError, match="binary version.*--download"):
        data.read_cifar10(tmp_path, records=6)
    make_cifar(tmp_path)
    (tmp_path / data.CIFAR10_DIR / "data_batch_3.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(PBInputError, match="corrupt"):
        data.read_cifar10(tmp_path, records=6)


def test_download_cifar_from_file_url(tmp_path):
    src = tmp_path / "src"
    make_cifar(src)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src / data.CIFAR10_DIR, arcname=data.CIFAR10_DIR)
    archive = tmp_path / "cifar-10-binary.tar.gz"
    archive.write_bytes(buf.getvalue())
    md5 = hashlib.md5(buf.getvalue()).hexdigest()
    dest = tmp_path / "dest"
    with pytest.raises(PBInputError, match="fails its checksum"):
        data.download("cifar10", dest, url=archive.as_uri())  # the official md5 differs
    data.download("cifar10", dest, url=archive.as_uri(), checksums=md5)
    a = data.read_cifar10(dest, records=6)
    b = data.read_cifar10(src, records=6)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_download_mnist_from_file_url(tmp_path):
    src = tmp_path / "mirror"
    arrays, sha = make_mnist(src)
    dest = tmp_path / "dest"
    data.download("mnist", dest, url=src.as_uri(), checksums=sha)
    xtr, *_ = data.read_mnist(dest, sha256=sha)
    assert np.array_equal(xtr, arrays["train-images-idx3-ubyte"].reshape(40, 784))
    with pytest.raises(PBInputError, match="fails its checksum"):
        data.download("mnist", tmp_path / "other", url=src.as_uri())
    shutil.rmtree(src)
    with pytest.raises(PBInputError, match="could not download"):
        data.download("mnist", tmp_path / "third", url=src.as_uri(), checksums=sha)


def test_augmentation_is_crop_of_padded_and_flip():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = data.augment_batch(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.uint8
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    # every output image equals one of the 81 crops of its padded image, maybe flipped
    off = torch.randint(0, 9, (2, 64), generator=g)
    flip = torch.rand(64, generator=g) < 0.5
    n_flip = 0
    for i in range(64):
        oy, ox = int(off[0, i]), int(off[1, i])
        crop = padded[i, :, oy:oy + 32, ox:ox + 32]
        if flip[i]:
            crop = crop.flip(-1)
            n_flip += 1
        assert torch.equal(out[i], crop)
    assert 0 < n_flip < 64
    # same generator seed, same batch
    assert torch.equal(out, data.augment_batch(x, torch.Generator().manual_seed(0)))


def test_batches_cover_split_once_and_standardize():
    d = data.synthetic("mnist", n_train=100, n_test=10, val_size=20)
    seen = torch.cat([y for _, y in d.batches("train", 32, torch.Generator().manual_seed(1))])
    assert len(seen) == 100
    assert torch.equal(seen.sort().values, d.train.y.sort().values)
    x, _ = next(d.batches("train", 100))
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-2
