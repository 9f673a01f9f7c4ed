"""The dependencies declared in pyproject.toml (an extra per environment)
are exactly the pinned files that envs/setup.sh installs."""

import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENVIRONMENTS = {"torch": "envs/torch.txt", "tensorflow": "envs/tensorflow.txt"}


def requirements(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return sorted(line for line in lines if line)


@pytest.mark.parametrize("extra", ENVIRONMENTS)
def test_pinned_file_matches_the_extra(extra):
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert sorted(declared["optional-dependencies"][extra]) == requirements(
        REPO / ENVIRONMENTS[extra]
    ), f"pyproject.toml's [{extra}] extra and {ENVIRONMENTS[extra]} differ: change both"
