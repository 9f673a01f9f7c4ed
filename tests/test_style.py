"""The code's habits, checked like behaviour: ruff's lint and format, mypy
on every package (pyproject.toml says which), and
snakefmt for the workflow (snakemake --lint is in tests/test_workflow.py)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "argv",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["snakefmt", "--check", "Snakefile", "workflows"],
        ["mypy"],
    ],
    ids=["ruff-lint", "ruff-format", "snakefmt", "mypy"],
)
def test_style(argv):
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"


def test_mypy_checks_every_package():
    """No package is left out of the type check: mypy's files are the
    packages the project installs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    installed = {
        p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert set(project["tool"]["mypy"]["files"]) == installed
