"""The framework build scripts stop at once, with one line naming the fix,
when what they take from the system is missing: before hours of work."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, tiny_design, write_design
from ddlcompare.plan import envs


def bash(script: Path, *args: str, env: dict, timeout: int = 60) -> subprocess.CompletedProcess:
    """A script of envs/ run with ``args`` in ``env``, its output kept."""
    return subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_lbann_build_names_a_missing_hdf5_and_does_nothing(tmp_path):
    prefix = tmp_path / "lbann"
    env = {**os.environ, "HDF5_DIR": str(tmp_path / "no-hdf5"), "DDLC_LBANN_PREFIX": str(prefix)}
    done = bash(REPO / "envs" / "build-lbann.sh", env=env)
    assert done.returncode == 2
    # Where LBANN's Debian packages are missing too (a fresh machine), they are named first.
    missing = bash(REPO / "envs" / "build-lbann.sh", "--missing-packages", env=env).stdout.split()
    expected = [
        f"build-lbann: missing Debian packages; run: apt-get install -y {' '.join(missing)} "
    ]
    assert done.stderr.splitlines() == expected[: bool(missing)] + [
        f"build-lbann: HDF5_DIR={tmp_path / 'no-hdf5'} does not exist; "
        "set HDF5_DIR to the HDF5 Conduit should use"
    ]
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
        "setup: envs/setup.sh sets up torch, tensorflow, tarantella and tarantella-patched, "
        "not 'lbann': "
        "'bash envs/build-lbann.sh' builds it"
    )


def test_setup_builds_tarantella_when_asked(tmp_path):
    """envs/setup.sh tarantella runs envs/build-tarantella.sh (seconds where
    it is built: each part is stamped) into the prefix the harness finds."""
    from ddlcompare.plan import envs

    if not envs.python_for("tarantella").exists():
        pytest.skip(
            "Tarantella is not built here: bash envs/setup.sh tarantella (envs/tarantella.md)"
        )
    done = front_door("bash", "envs/setup.sh", "torch", "tarantella", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"setup: ready: {VENV} {envs.env_dir('tarantella')}"
    )


def test_ddlc_run_dry_without_the_environment_sets_nothing_up(tmp_path):
    """A dry run changes nothing: where the environment is missing (a fresh
    clone) it says so in one line, rather than set up .venv and build what
    the design names."""
    absent = tmp_path / "venv"
    done = front_door("./ddlc", "run", "-n", tmp_path=tmp_path, DDLC_VENV=str(absent))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"error: DDLC_VENV={absent}: no Python environment there ({absent}/bin/python "
        "missing); unset DDLC_VENV, or set it up there with ./ddlc setup"
    )
    assert not absent.exists()


def test_ddlc_run_dry_plans_without_set_up_and_says_how_long(tmp_path):
    """A design of PyTorch frameworks: ./ddlc run -n runs no set-up where the
    environment is there (a dry run changes nothing), plans the runs and says
    how many are done and how long the rest takes; set-up would build only
    .venv for it (envs), never the TensorFlow environment."""
    path = write_design(tmp_path, tiny_design(["torch-ddp", "horovod-torch"]))
    done = front_door(
        "./ddlc", "run", "-n", "-d", str(tmp_path), "--config", f"design={path}", tmp_path=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "setup:" not in done.stderr
    assert done.stderr.startswith("ddlc: 0 of 2 runs done, 2 to do: about ")
    assert "This was a dry-run" in done.stdout
    assert not (tmp_path / "venv-tf").exists()
    needed = front_door("./ddlc", "envs", "--design", str(path), tmp_path=tmp_path)
    assert needed.stdout == "torch\n"


def test_ddlc_run_takes_design_and_results_as_the_harness_commands_do(tmp_path):
    """`./ddlc run -n --design F --results DIR` plans F into DIR, as
    `--config design=F results=DIR` does, beside a --config of the user's
    own (Snakemake keeps only the last --config); nothing is created."""
    path = write_design(tmp_path, tiny_design(["torch-ddp"], procs=(1,)))
    results = tmp_path / "elsewhere"
    done = front_door(
        *("./ddlc", "run", "-n", "--design", str(path), f"--results={results}"),
        *("--config", "kill_orphans=0"),
        tmp_path=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.startswith("ddlc: 0 of 1 runs done, 1 to do: about ")
    assert f"{results}/tiny/" in done.stdout  # the run's outputs, under DIR
    assert not results.exists()
    missing = front_door("./ddlc", "run", "-n", "--design", tmp_path=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip() == (
        "error: --design needs a value, e.g. ./ddlc run --design my.yaml"
    )


@pytest.mark.skipif(
    not envs.has_module("tarantella-patched", "tarantella"),
    reason="no patched Tarantella build ('bash envs/setup.sh tarantella-patched')",
)
def test_setup_sets_up_the_patched_build_that_a_design_names(tmp_path):
    """A design naming tarantella-patched: ./ddlc run sets it up as it does
    the plain build (here it is built, so set-up finds it in seconds)."""
    path = write_design(tmp_path, tiny_design(["tarantella-patched"]))
    needed = front_door("./ddlc", "envs", "--design", str(path), tmp_path=tmp_path)
    assert needed.stdout == "torch tarantella-patched\n"
    done = front_door("bash", "envs/setup.sh", "tarantella-patched", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    prefix = envs.env_dir("tarantella-patched")
    assert done.stderr.strip().splitlines()[-1] == f"setup: ready: {prefix}"


def test_ddlc_run_with_a_missing_design_says_so_in_one_line(tmp_path):
    missing = tmp_path / "none.yaml"
    done = front_door("./ddlc", "run", "-n", "--config", f"design={missing}", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {missing}: file not found; copy design.yaml from the repository or "
        "pass --config design=PATH"
    )
    assert "Traceback" not in done.stderr and not done.stdout


@pytest.mark.parametrize("how", ["a symlinked .venv", "DDLC_VENV"])
def test_a_second_checkout_sharing_the_environment_is_refused(tmp_path, how):
    """Set-up in another checkout would re-point this one's environment (its
    editable install) there: it refuses, naming both, and changes nothing."""
    venv = Path(sys.prefix)
    owner = Path(_editable_checkout(venv))
    other = tmp_path / "other"
    (other / "envs").mkdir(parents=True)
    for name in (
        "envs/setup.sh",
        "envs/build-lib.sh",
        "envs/environments.tsv",
        "envs/torch.txt",
    ):
        shutil.copy(REPO / name, other / name)
    env = {**os.environ}
    env.pop("DDLC_TAKE_OVER_ENV", None)
    if how == "DDLC_VENV":
        env["DDLC_VENV"] = str(venv)
    else:
        env.pop("DDLC_VENV", None)
        (other / ".venv").symlink_to(venv)
    done = bash(other / "envs" / "setup.sh", "torch", env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"is the environment of the checkout {owner}" in done.stderr
    assert "DDLC_TAKE_OVER_ENV=1" in done.stderr
    assert _editable_checkout(venv) == str(owner)


def test_a_fresh_checkout_goes_on_to_build_its_environment(tmp_path):
    """No environment yet (a fresh clone, as CI has): set-up goes on to build
    one. It once ended there at once, exit 1 and not a word, under pipefail."""
    fresh = tmp_path / "fresh-venv"
    env = {**os.environ, "DDLC_VENV": str(fresh)}
    setup = subprocess.Popen(
        ["bash", str(REPO / "envs" / "setup.sh"), "torch"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        first = setup.stderr.readline()  # the build itself is CI's to run
    finally:
        os.killpg(setup.pid, signal.SIGKILL)
        setup.wait()
    # "(a minute or two)", or "(about a minute, from the wheels in ...)" where the cache has them
    assert first.startswith(f"setup: building the Python environment in {fresh} (")


def _editable_checkout(venv: Path) -> str:
    [record] = venv.glob("lib/python3*/site-packages/ddl_compare-*.dist-info/direct_url.json")
    return json.loads(record.read_text())["url"].removeprefix("file://")


def test_ddlc_with_ddlc_venv_naming_nothing_says_so(tmp_path):
    env = {**os.environ, "DDLC_VENV": str(tmp_path / "nowhere")}
    done = subprocess.run(
        [str(REPO / "ddlc"), "plan"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: DDLC_VENV={tmp_path / 'nowhere'}: no Python environment")


def test_a_dry_run_in_a_fresh_clone_asks_for_the_harness_environment_only(tmp_path):
    """`./ddlc run -n` builds nothing: where .venv is not there yet it names
    the one set-up step it needs (README), not the whole set-up."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "DDLC_VENV"}
    done = subprocess.run(
        [str(clone / "ddlc"), "run", "-n"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "./ddlc setup torch makes it" in done.stderr
    assert not (clone / ".venv").exists()


def test_a_patch_leaves_the_other_links_of_the_files_it_changes_alone(tmp_path):
    """uv links an environment's files from its cache (envs/setup.sh), so a
    patch written into such a file (the Slurm plugin's) would change the
    cache and every environment made from it: apply.py writes new files."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "plugin.py").write_text("def cancel():\n    return 1\n")
    (source / "extra.py").write_text("OLD = 1\n")
    (tmp_path / "extra.py").write_text("NEW = 1\n")
    cached = {name: tmp_path / f"cached-{name}" for name in ("plugin.py", "extra.py")}
    for name, link in cached.items():
        os.link(source / name, link)
    spec = tmp_path / "spec.json"
    hook = {"file": "plugin.py", "anchor": "    return 1\n", "before": "    print('hooked')\n"}
    spec.write_text(json.dumps({"files": {"extra.py": "extra.py"}, "hooks": [hook]}))
    done = subprocess.run(
        [sys.executable, str(REPO / "envs" / "patches" / "apply.py"), str(spec), str(source)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "hooked" in (source / "plugin.py").read_text()
    assert (source / "extra.py").read_text() == "NEW = 1\n"
    assert cached["plugin.py"].read_text() == "def cancel():\n    return 1\n"
    assert cached["extra.py"].read_text() == "OLD = 1\n"
