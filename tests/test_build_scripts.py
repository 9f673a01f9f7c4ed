"""The framework build scripts stop at once, with one line naming the fix,
when what they take from the system is missing: before hours of work."""

import os
import subprocess

from conftest import REPO


def test_lbann_build_names_a_missing_hdf5_and_does_nothing(tmp_path):
    prefix = tmp_path / "lbann"
    env = {**os.environ, "HDF5_DIR": str(tmp_path / "no-hdf5"), "DDLC_LBANN_PREFIX": str(prefix)}
    done = subprocess.run(
        ["bash", str(REPO / "envs" / "build-lbann.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"build-lbann: HDF5_DIR={tmp_path / 'no-hdf5'} does not exist; "
        "set HDF5_DIR to the HDF5 Conduit should use"
    )
    assert not list((prefix / "src").iterdir())  # nothing checked out
    assert not (prefix / "build-times.tsv").exists()


def test_missing_debian_packages_are_listed():
    found = subprocess.run(
        [
            "bash",
            "-c",
            f". {REPO / 'envs' / 'build-lib.sh'}; missing_debian_packages bash no-such-package-ddlc",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.stdout.split() == ["no-such-package-ddlc"]
