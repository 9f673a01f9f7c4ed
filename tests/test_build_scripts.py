"""The framework build scripts stop at once, with one line naming the fix,
when what they take from the system is missing: before hours of work."""

import os
import subprocess

import pytest

from conftest import REPO, tiny_design, write_design


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


VENV = os.environ.get("DDLC_VENV", str(REPO / ".venv"))


def front_door(*args, tmp_path, **env):
    """The real envs/setup.sh or ./ddlc in this checkout (idempotent: about a
    second once .venv is built), the TensorFlow env pointed at a folder that
    must stay absent."""
    return subprocess.run(
        list(args),
        cwd=REPO,
        env={**os.environ, "DDLC_VENV_TENSORFLOW": str(tmp_path / "venv-tf"), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_setup_of_torch_alone_leaves_the_tensorflow_environment_alone(tmp_path):
    done = front_door("bash", "envs/setup.sh", "torch", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"setup: ready: {VENV}"
    assert not (tmp_path / "venv-tf").exists()


def test_setup_refuses_an_environment_it_does_not_build_naming_its_script(tmp_path):
    done = front_door("bash", "envs/setup.sh", "torch", "lbann", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "setup: envs/setup.sh sets up torch, tensorflow and tarantella, not 'lbann': "
        "'bash envs/build-lbann.sh' builds it"
    )


def test_setup_builds_tarantella_when_asked(tmp_path):
    """envs/setup.sh tarantella runs envs/build-tarantella.sh (seconds where
    it is built: each part is stamped) into the prefix the harness finds."""
    from ddlcompare import envs

    if not envs.python_for("tarantella").exists():
        pytest.skip("Tarantella is not built here: bash envs/setup.sh tarantella (about 7 minutes)")
    done = front_door("bash", "envs/setup.sh", "torch", "tarantella", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"setup: ready: {VENV} {envs.env_dir('tarantella')}"
    )


def test_ddlc_run_sets_up_only_what_its_design_needs(tmp_path):
    """A design of PyTorch frameworks: ./ddlc run (a dry run) sets up .venv
    and plans it, and never builds the TensorFlow environment."""
    path = write_design(tmp_path, tiny_design(["torch-ddp", "horovod-torch"]))
    done = front_door(
        "./ddlc", "run", "-n", "-d", str(tmp_path), "--config", f"design={path}", tmp_path=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"setup: ready: {VENV}\n" in done.stderr
    assert "This was a dry-run" in done.stdout
    assert not (tmp_path / "venv-tf").exists()


def test_ddlc_run_with_a_missing_design_says_so_in_one_line(tmp_path):
    missing = tmp_path / "none.yaml"
    done = front_door("./ddlc", "run", "-n", "--config", f"design={missing}", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {missing}: file not found; copy design.yaml from the repository or "
        "pass --config design=PATH"
    )
    assert "Traceback" not in done.stderr and not done.stdout
