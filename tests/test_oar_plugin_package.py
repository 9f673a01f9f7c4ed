"""snakemake-executor-plugin-oar as it would be published: its wheel builds
from its own folder, holds its licence, and installs into a clean virtual
environment beside Snakemake alone, where Snakemake finds the executor and
plans a workflow with it.

Offline once run: Snakemake's wheels (and its dependencies') are fetched
from the package index the first time into the cache (DDLC_CACHE), then
installed from there with no index at all. The test is skipped, with pip's
words, only when the index cannot be reached and nothing is cached yet."""

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from conftest import REPO
from runfiles import variables

PACKAGE = REPO / "plugins" / "snakemake-executor-plugin-oar"
pytestmark = pytest.mark.slow
# pip's words when it cannot reach an index (a resolver failure alone is not one).
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|ConnectTimeout|ProxyError"
    r"|Could not fetch URL|Max retries exceeded"
)


def build_wheel(tmp_path: Path) -> Path:
    """The plugin's wheel, built from a copy of its folder (a build leaves
    build/ behind) with this environment's setuptools: no index needed."""
    source = shutil.copytree(PACKAGE, tmp_path / "source")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip, "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = wheels.glob("snakemake_executor_plugin_oar-*.whl")
    return wheel


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        [name] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(name).decode()
    return sorted(
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    )


def snakemake_wheels(wheel: Path) -> Path:
    """A folder of wheels for Snakemake (this environment's version) and
    everything it and the plugin need: the cache's, else built now by pip
    (its own download cache reused) in a private folder and published
    whole by one rename."""
    version = metadata.version("snakemake")
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    # Named for all it must hold: the plugin's own requirements too.
    needs = hashlib.sha256("\n".join(requirements(wheel)).encode()).hexdigest()[:8]
    house = variables.cache("wheels", f"snakemake-{version}-{python}-{needs}")
    if (house / "complete").exists():
        return house
    house.parent.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(dir=house.parent, prefix=f".{house.name}-"))
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--timeout", "15", "--retries", "1"]
    got = subprocess.run(
        [*pip, "-w", str(private), str(wheel), f"snakemake=={version}"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if got.returncode != 0:
        shutil.rmtree(private)
        if cut := [line for line in got.stderr.splitlines() if UNREACHABLE.search(line)]:
            pytest.skip(f"the package index cannot be reached and {house} is not cached: {cut[0]}")
        pytest.fail(f"pip could not gather Snakemake {version}'s wheels: {got.stderr[-3000:]}")
    (private / wheel.name).unlink(missing_ok=True)  # the plugin's own is the one under test
    (private / "complete").touch()
    try:
        private.rename(house)
    except OSError:  # another run published it first
        shutil.rmtree(private)
    return house


def test_the_wheel_installs_beside_snakemake_alone_and_snakemake_finds_the_executor(tmp_path):
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "snakemake_executor_plugin_oar/oar.py" in names
    house = snakemake_wheels(wheel)

    venv.create(tmp_path / "venv", with_pip=True)  # no system site packages
    python = tmp_path / "venv" / "bin" / "python"
    snakemake = f"snakemake=={metadata.version('snakemake')}"
    install = [str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(house)]
    installed = subprocess.run(
        [*install, str(wheel), snakemake], capture_output=True, text=True, timeout=600
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    assert "snakemake-executor-plugin-oar==" in listed and "ddl-compare" not in listed
    imported = subprocess.run(
        [str(python), "-c", "import snakemake_executor_plugin_oar as p; print(p.__version__)"],
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0 and imported.stdout.strip(), imported.stderr

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
