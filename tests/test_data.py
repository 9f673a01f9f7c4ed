"""Loaders on the real Fashion-MNIST and on CIFAR-10 files made in the
official python-pickle format; checksums; sharding."""

import gzip
import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from conftest import REPO, make_cifar
from frameworks import data
from frameworks.data import DataError


def test_real_fashion_mnist():
    d = data.load("fashion-mnist")
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert d.train_x.dtype == np.uint8
    assert list(d.train_y[:10]) == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]  # the published order
    assert np.bincount(d.train_y).tolist() == [6000] * 10


def copy_fashion(tmp_path):
    for f in data.FASHION_MNIST.files:
        shutil.copy(f"{data.FASHION_MNIST.default_dir}/{f}", tmp_path / f)
    return tmp_path


def test_recompressed_copy_still_verifies(tmp_path):
    folder = copy_fashion(tmp_path)
    labels = folder / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes()), compresslevel=1))
    assert len(data.load("fashion-mnist", str(folder)).test_y) == 10000


def test_damaged_file_fails_checksum(tmp_path):
    folder = copy_fashion(tmp_path)
    labels = folder / "t10k-labels-idx1-ubyte.gz"
    payload = bytearray(gzip.decompress(labels.read_bytes()))
    payload[100] ^= 1
    labels.write_bytes(gzip.compress(bytes(payload)))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz fails its checksum"):
        data.load("fashion-mnist", str(folder))


def test_truncated_file_is_named(tmp_path):
    folder = copy_fashion(tmp_path)
    images = folder / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:1000])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.gz cannot be read"):
        data.load("fashion-mnist", str(folder))


def test_missing_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        data.load("fashion-mnist", str(tmp_path))
    assert data.missing_files("cifar10", str(tmp_path))[0].endswith("data_batch_1")


def test_cifar_official_format(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    sums = make_cifar(folder)
    d = data.load("cifar10", str(folder), checksums=sums)
    assert d.train_x.shape == (100, 3, 32, 32) and d.test_x.shape == (20, 3, 32, 32)
    raw = pickle.loads((folder / "data_batch_1").read_bytes(), encoding="bytes")
    assert (d.train_x[0, 1].ravel() == raw[b"data"][0, 1024:2048]).all()  # green plane
    assert d.train_y[:20].tolist() == raw[b"labels"]


def test_cifar_official_checksums_reject_other_files(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    make_cifar(folder)
    with pytest.raises(DataError, match="data_batch_1 fails its checksum"):
        data.load("cifar10", str(folder))


def tarball(tmp_path):
    make_cifar(tmp_path / "src" / "cifar-10-batches-py")
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    return archive


def test_fetch_checks_md5_and_unpacks(tmp_path):
    archive = tarball(tmp_path)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    target = tmp_path / "data" / "cifar-10-batches-py"
    folder = data.fetch_cifar10(str(target), url=archive.as_uri(), md5=md5)
    assert (folder / "test_batch").is_file() and folder == target


def test_fetch_rejects_bad_md5(tmp_path):
    archive = tarball(tmp_path)
    with pytest.raises(DataError, match="expected 0000"):
        data.fetch_cifar10(str(tmp_path / "d" / "c"), url=archive.as_uri(), md5="0000")
    assert not (tmp_path / "d" / "c").exists()


def test_fetch_without_network_says_what_it_tried_and_where_files_go(tmp_path):
    target = tmp_path / "d" / "cifar-10-batches-py"
    url = (tmp_path / "unreachable.tar.gz").as_uri()
    done = subprocess.run(
        [sys.executable, "-m", "front.cli", "fetch-data", "cifar10", "--data-dir", str(target)],
        cwd=REPO,
        # a proxy nobody answers: no network, wherever the test runs
        env={**os.environ, "PYTHONPATH": str(REPO), "https_proxy": "http://127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: cifar10: cannot download {data.CIFAR10_URL} (")
    assert line.endswith(
        f"unpack it so that {target} holds data_batch_1, data_batch_2, data_batch_3, "
        "data_batch_4, data_batch_5, test_batch (or set fixed.data_dir to such a folder)"
    )
    with pytest.raises(DataError, match=f"cannot download {url}"):
        data.fetch_cifar10(str(target), url=url)
    assert not target.exists()


def test_shards_partition_an_epoch_and_change_with_epoch():
    n, world, count = 1000, 4, 250
    shards = [data.shard(n, r, world, seed=1, epoch=1, count=count) for r in range(world)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(n))
    again = data.shard(n, 0, world, seed=1, epoch=1, count=count)
    assert (again == shards[0]).all()
    assert not (data.shard(n, 0, world, seed=1, epoch=2, count=count) == shards[0]).all()


def test_steps_per_epoch_drops_last_and_caps():
    assert data.steps_per_epoch(60000, 2, 64, None) == 468
    assert data.steps_per_epoch(60000, 2, 64, 10) == 10


def test_generated_files_verify_against_their_manifest_only(tmp_path):
    from conftest import generated_cifar

    folder = generated_cifar(tmp_path / "cifar", per_batch=20)
    assert data.load("cifar10", str(folder)).train_x.shape == (100, 3, 32, 32)
    (folder / "test_batch").write_bytes((folder / "data_batch_1").read_bytes())
    with pytest.raises(DataError, match="test_batch fails its checksum"):
        data.load("cifar10", str(folder))
    (folder / data.GENERATED_MANIFEST).write_text("{}")
    with pytest.raises(DataError, match="not a manifest of generated files"):
        data.load("cifar10", str(folder))


def test_numpy1_environments_read_files_pickled_under_numpy2(tmp_path):
    """Generated here (numpy 2: arrays name numpy._core), read by the
    TensorFlow environment's numpy 1, as a TensorFlow or Tarantella run does."""
    import subprocess
    from conftest import REPO, generated_cifar
    from ddlcompare.plan import envs

    python = envs.python_for("tensorflow")
    if not python.exists():
        pytest.skip(f"the TensorFlow environment is not built ({python}); envs/setup.sh")
    folder = generated_cifar(tmp_path / "cifar", per_batch=20)
    probe = (
        "import numpy; from frameworks import data; "
        f"d = data.load('cifar10', {str(folder)!r}); "
        "print(numpy.__version__, d.train_x.shape, int(d.train_x.sum()))"
    )
    done = subprocess.run(
        [str(python), "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    version, shape = done.stdout.split()[0], done.stdout.split(" ", 1)[1]
    assert version.startswith("1.")
    expected = data.load("cifar10", str(folder)).train_x
    assert shape.strip() == f"(100, 3, 32, 32) {int(expected.sum())}"


def test_the_planners_check_takes_a_generated_sets_manifest(tmp_path):
    """What a run accepts (load), the planner's check accepts too; a changed
    generated file is refused by both."""
    from conftest import generated_cifar

    folder = generated_cifar(tmp_path / "cifar", per_batch=20)
    data.verify("cifar10", str(folder))
    (folder / "test_batch").write_bytes((folder / "test_batch").read_bytes()[:-1] + b"x")
    with pytest.raises(data.DataError, match="test_batch fails its checksum"):
        data.verify("cifar10", str(folder))
