"""snakemake-executor-plugin-oar as it would be published: its wheel builds
from its own folder, holds its licence, and installs into a clean virtual
environment beside Snakemake alone (from the package registry), where
Snakemake finds the executor and plans a workflow with it."""

import shutil
import subprocess
import sys
import venv
import zipfile
from importlib import metadata

import pytest

from conftest import REPO

PACKAGE = REPO / "plugins" / "snakemake-executor-plugin-oar"
pytestmark = pytest.mark.slow


def test_the_wheel_installs_beside_snakemake_alone_and_snakemake_finds_the_executor(tmp_path):
    source = shutil.copytree(PACKAGE, tmp_path / "source")  # builds leave build/ behind
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)]
    built = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = wheels.glob("snakemake_executor_plugin_oar-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "snakemake_executor_plugin_oar/oar.py" in names

    venv.create(tmp_path / "venv", with_pip=True)  # no system site packages
    python = tmp_path / "venv" / "bin" / "python"
    snakemake = f"snakemake=={metadata.version('snakemake')}"
    install = [str(python), "-m", "pip", "install", "-q", str(wheel), snakemake]
    installed = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    assert "snakemake-executor-plugin-oar==" in listed and "ddl-compare" not in listed

    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(
        'rule a:\n    output: "a.txt"\n    resources: nodes=2, gpus_per_node=1\n'
        '    shell: "touch {output}"\n'
    )
    argv = [str(python), "-m", "snakemake", "--executor", "oar", "--jobs", "1", "-n"]
    out = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rule a:" in out.stdout + out.stderr
    help_text = subprocess.run(
        [str(python), "-m", "snakemake", "--help"], capture_output=True, text=True
    ).stdout
    assert "--oar-pass-env" in help_text and "--oar-job-end-command" in help_text
