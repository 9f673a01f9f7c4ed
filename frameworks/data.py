"""Data sets as plain numpy arrays, and each rank's shard of each epoch.

Fashion-MNIST comes from its IDX files (Debian's ``dataset-fashion-mnist``
or a ``data_dir``), CIFAR-10 from its official python-pickle batches. Every
file is checked against a digest of its decompressed content, so that a
re-compressed copy (Debian re-gzipped Fashion-MNIST) still verifies while a
damaged one does not: Fashion-MNIST's are SHA-256s of the IDX payloads of
Debian's files, CIFAR-10's the MD5s published with it. The arrays are
framework-neutral: every adapter, in PyTorch or TensorFlow, trains on exactly
the same bytes in the same order.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from runfiles import variables
from runfiles.atomic import entry_lock


class DataError(Exception):
    """A data set that is missing or damaged; the message says how to fix it."""


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    shape: tuple[int, int, int]  # channels, height, width
    classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    default_dir: str
    files: dict[str, str]  # file name -> "algorithm:hex digest" of its decompressed bytes
    how_to_get: str


FASHION_MNIST = DatasetInfo(
    name="fashion-mnist",
    shape=(1, 28, 28),
    classes=10,
    mean=(0.2860,),
    std=(0.3530,),
    default_dir="/usr/share/datasets/fashion-mnist",
    files={
        "train-images-idx3-ubyte.gz": "sha256:c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte.gz": "sha256:bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte.gz": "sha256:5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte.gz": "sha256:0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
    how_to_get="install Debian's package (apt-get install dataset-fashion-mnist), or set "
    "fixed.data_dir to a folder holding the four Fashion-MNIST IDX .gz files",
)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_TAR_MD5 = "c58f30108f718f92721af3b95e74349a"  # published with the archive
CIFAR10 = DatasetInfo(
    name="cifar10",
    shape=(3, 32, 32),
    classes=10,
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2470, 0.2435, 0.2616),
    default_dir=str(variables.cache("data", "cifar-10-batches-py")),
    files={  # MD5 of each official batch, as published with torchvision
        "data_batch_1": "md5:c99cafc152244af753f735de768cd75f",
        "data_batch_2": "md5:d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "md5:54ebc095f3ab1f0389bbae665268c751",
        "data_batch_4": "md5:634d18415352ddfa80567beed471001a",
        "data_batch_5": "md5:482c414d41f54cd18b22e5b47cb7c3cb",
        "test_batch": "md5:40351d587109b95175f43aff81a1287e",
    },
    how_to_get="run 'ddlc fetch-data cifar10' on a machine with internet access (it "
    "downloads the official archive and checks its MD5), or set fixed.data_dir "
    "to a 'cifar-10-batches-py' folder",
)

DATASETS = {d.name: d for d in (FASHION_MNIST, CIFAR10)}


@dataclass
class Dataset:
    info: DatasetInfo
    train_x: np.ndarray  # uint8, (N, C, H, W)
    train_y: np.ndarray  # int64, (N,)
    test_x: np.ndarray
    test_y: np.ndarray


def data_dir(info: DatasetInfo, configured: str | None) -> Path:
    return Path(configured or info.default_dir).expanduser()


def missing_files(name: str, configured_dir: str | None) -> list[str]:
    """Files of a data set that are absent (a cheap check for the planner)."""
    info = DATASETS[name]
    folder = data_dir(info, configured_dir)
    return [str(folder / f) for f in info.files if not (folder / f).is_file()]


def load(
    name: str, configured_dir: str | None = None, checksums: dict[str, str] | None = None
) -> Dataset:
    """Load and verify a data set. ``checksums`` replaces the official table
    (tests use it for the small files they generate)."""
    info = DATASETS[name]
    folder = data_dir(info, configured_dir)
    expected = checksums if checksums is not None else generated_checksums(folder) or info.files
    payloads = {f: _read_verified(folder / f, expected[f], info) for f in info.files}
    reader = _read_idx_set if info is FASHION_MNIST else _read_cifar_set
    return reader(info, payloads)


def verify(name: str, configured_dir: str | None = None) -> None:
    """Check every file of a data set against its digest (DataError if not):
    the planner's check, once, before any run reads them."""
    info = DATASETS[name]
    folder = data_dir(info, configured_dir)
    for f, checksum in (generated_checksums(folder) or info.files).items():
        _read_verified(folder / f, checksum, info)


TRAIN_IMAGES = {"fashion-mnist": 60000, "cifar10": 50000}  # in the official sets


# A folder of generated files in a data set's official format (small test
# data) says so in this manifest, with each file's digest: {"generated_by":
# ..., "files": {name: "md5:..."}}. It is verified against those instead of
# the official digests; run.json's config.data_dir points at it.
GENERATED_MANIFEST = "ddlc-generated.json"


def generated_checksums(folder: Path) -> dict[str, str] | None:
    import json

    manifest = folder / GENERATED_MANIFEST
    if not manifest.is_file():
        return None
    try:
        return dict(json.loads(manifest.read_text())["files"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"{manifest}: not a manifest of generated files ({exc}); "
            f"remove it to use the official files"
        ) from None


def _read_verified(path: Path, checksum: str, info: DatasetInfo) -> bytes:
    try:
        raw = path.read_bytes()
        payload = gzip.decompress(raw) if path.suffix == ".gz" else raw
    except FileNotFoundError:
        raise DataError(f"{info.name}: {path} not found; {info.how_to_get}") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(
            f"{info.name}: {path} cannot be read ({exc}); replace it: {info.how_to_get}"
        ) from None
    algorithm, expected = checksum.split(":", 1)
    digest = hashlib.new(algorithm, payload).hexdigest()
    if digest != expected:
        raise DataError(
            f"{info.name}: {path} fails its checksum ({algorithm} {digest[:16]}..., "
            f"expected {expected[:16]}...); the file is damaged or not the "
            f"official one: {info.how_to_get}"
        )
    return payload


def _parse_idx(payload: bytes, what: str) -> np.ndarray:
    if len(payload) < 8 or payload[:2] != b"\x00\x00" or payload[2] != 0x08:
        raise DataError(f"{what}: not an unsigned-byte IDX file")
    ndim = payload[3]
    dims = np.frombuffer(payload, dtype=">u4", count=ndim, offset=4).astype(int)
    return np.frombuffer(payload, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _read_idx_set(info: DatasetInfo, payloads: dict[str, bytes]) -> Dataset:
    def images(f):
        return _parse_idx(payloads[f], f)[:, None, :, :]

    def labels(f):
        return _parse_idx(payloads[f], f).astype(np.int64)

    return Dataset(
        info,
        images("train-images-idx3-ubyte.gz"),
        labels("train-labels-idx1-ubyte.gz"),
        images("t10k-images-idx3-ubyte.gz"),
        labels("t10k-labels-idx1-ubyte.gz"),
    )


class _NumpyUnpickler(pickle.Unpickler):
    """Arrays pickled under numpy 2 name numpy._core, which numpy 1 (the
    TensorFlow environments) calls numpy.core: map one to the other."""

    def find_class(self, module, name):
        if module.startswith("numpy._core") and not hasattr(np, "_core"):
            module = "numpy.core" + module[len("numpy._core") :]
        return super().find_class(module, name)


def _read_cifar_set(info: DatasetInfo, payloads: dict[str, bytes]) -> Dataset:
    def batch(f):
        # The official batches are pickles of plain dicts of bytes and lists;
        # their checksum was verified above, which is what makes loading safe.
        d = _NumpyUnpickler(io.BytesIO(payloads[f]), encoding="bytes").load()
        x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        return x, np.asarray(d[b"labels"], dtype=np.int64)

    train = [batch(f"data_batch_{i}") for i in range(1, 6)]
    test_x, test_y = batch("test_batch")
    return Dataset(
        info,
        np.concatenate([x for x, _ in train]),
        np.concatenate([y for _, y in train]),
        test_x,
        test_y,
    )


def fetch_cifar10(
    target: str | None = None, url: str = CIFAR10_URL, md5: str = CIFAR10_TAR_MD5
) -> Path:
    """Download the official CIFAR-10 archive, check its MD5, unpack it in a
    private folder and put that in place with one rename. Checkouts share the
    folder (it is in the cache): a lock on it keeps two fetches from
    replacing it under each other."""
    folder = data_dir(CIFAR10, target)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with entry_lock(folder), tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        archive = Path(tmp) / "cifar-10-python.tar.gz"
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as out:
                shutil.copyfileobj(response, out)
        except (OSError, ValueError) as exc:  # URLError is an OSError; ValueError: a bad URL
            raise DataError(
                f"cifar10: cannot download {url} ({getattr(exc, 'reason', exc)}); on a machine "
                f"that reaches it, download it and unpack it so that {folder} holds "
                f"{', '.join(CIFAR10.files)} (or set fixed.data_dir to such a folder)"
            ) from None
        digest = hashlib.md5(archive.read_bytes()).hexdigest()
        if digest != md5:
            raise DataError(
                f"cifar10: the download from {url} has MD5 {digest}, expected {md5}; try again"
            )
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        if folder.exists():  # set aside in one step: the new one takes its name at once
            folder.rename(Path(tmp, "replaced"))
        Path(tmp, "cifar-10-batches-py").rename(folder)
    return folder


def epoch_images(config: Mapping[str, Any]) -> int:
    """The training images a run's configuration draws each epoch from
    (train_images, at most the whole set)."""
    whole = TRAIN_IMAGES[config["dataset"]]
    return min(config["train_images"] or whole, whole)


def epoch_steps(config: Mapping[str, Any]) -> int:
    """Optimizer steps per epoch of a run's configuration, as the training
    loops count them."""
    world = config["nodes"] * config["procs_per_node"]
    return steps_per_epoch(epoch_images(config), world, config["batch_size"], config["max_steps"])


def steps_per_epoch(n_train: int, world: int, batch: int, max_steps: int | None) -> int:
    """Steps every rank takes in one epoch: the same on all ranks (drop last)."""
    steps = (n_train // world) // batch
    return min(steps, max_steps) if max_steps else steps


def shard(n: int, rank: int, world: int, seed: int, epoch: int, count: int) -> np.ndarray:
    """This rank's ``count`` indices of an epoch: one permutation per (seed,
    epoch), shared by all ranks, dealt out round-robin."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[rank::world][:count]
