"""Pinned requirements live in one place, envs/<env>.txt (what envs/setup.sh
installs): pyproject.toml's extras are read from those files, and the
environments the build scripts make pin what those files pin, or say why
not."""

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

REPO = Path(__file__).resolve().parent.parent
ENVIRONMENTS = {"torch": "envs/torch.txt", "tensorflow": "envs/tensorflow.txt"}
# Pins of the build scripts' own environments that differ on purpose.
DIFFERENT = {
    ("envs/build-tarantella.sh", "numpy"): "TensorFlow 2.7's numpy, on Python 3.9",
    ("envs/build-tarantella.sh", "protobuf"): "TensorFlow 2.7 breaks with protobuf >= 3.20",
    (
        "envs/build-tarantella.sh",
        "pyyaml",
    ): "Tarantella's environment was pinned and tested as one set",
    (
        "envs/build-lbann.sh",
        "numpy",
    ): "numpy 2, as envs/torch.txt: the 1.23 pin is TensorFlow 2.12's",
}


def requirements(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def pins(text: str) -> dict[str, str]:
    return {
        m["name"].lower(): m["version"]
        for m in re.finditer(r"(?P<name>[A-Za-z0-9_.-]+)==(?P<version>[0-9][\w.]*)", text)
    }


@pytest.mark.parametrize("extra", ENVIRONMENTS)
def test_the_extra_is_read_from_the_pinned_file(extra):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "optional-dependencies" in project["project"]["dynamic"]
    dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert len(dist.extras_require[extra]) == len(requirements(REPO / ENVIRONMENTS[extra]))
    assert pins("\n".join(dist.extras_require[extra])) == pins(
        (REPO / ENVIRONMENTS[extra]).read_text()
    )


@pytest.mark.parametrize("script", ["envs/build-tarantella.sh", "envs/build-lbann.sh"])
def test_build_scripts_pin_what_the_pinned_files_pin(script):
    ours = {}
    for path in ENVIRONMENTS.values():
        ours |= pins((REPO / path).read_text())
    theirs = pins((REPO / script).read_text())
    differ = {
        name: (version, ours[name])
        for name, version in theirs.items()
        if name in ours and version != ours[name] and (script, name) not in DIFFERENT
    }
    assert differ == {}, f"{script} pins these otherwise than envs/*.txt: align them or say why"


def test_the_environment_is_byte_compiled():
    """envs/setup.sh byte-compiles what it installs. Where
    PYTHONDONTWRITEBYTECODE is set, Python never writes the bytecode it
    compiles, and every process that imports torch compiled its modules again
    (7 s an import against 3 s here; CI's suite took 47 minutes, not 30)."""
    import torch.nn.modules.conv as conv

    if not (Path(sys.prefix) / ".ddlc-requirements").exists():
        pytest.skip(f"{sys.prefix} was not made by envs/setup.sh")
    for module in (torch, conv):
        assert Path(importlib.util.cache_from_source(module.__file__)).exists(), (
            f"{module.__file__} has no bytecode: envs/setup.sh's compileall did not run"
        )
