"""The code's habits, checked like behaviour: ruff's lint and format, mypy
on the layers below the command line (pyproject.toml says which), and
snakefmt for the workflow (snakemake --lint is in tests/test_workflow.py)."""

import subprocess
import sys
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
