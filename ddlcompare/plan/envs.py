"""Which interpreter runs which framework.

Each adapter names its environment (``AdapterInfo.env``); each environment is
a virtual environment, declared once in envs/environments.tsv (its folder,
where its build puts it, how it is built, what the build needs), which
envs/setup.sh reads too.
TensorFlow's needs numpy < 2 while the analysis needs numpy 2, so the two
families live apart and a run starts its workers with its own env's Python.
"""

from __future__ import annotations

import csv
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runfiles import variables

REPO = Path(__file__).resolve().parents[2]

# The table of environments, read by envs/setup.sh too (envs/build-lib.sh's
# ddlc_environments).
TABLE = REPO / "envs" / "environments.tsv"


@dataclass(frozen=True)
class Environment:
    """One row of envs/environments.tsv (its header says what each field is)."""

    name: str
    folder: str
    built_in: str
    setup: str
    build: str
    needs: str


def read_table(path: Path = TABLE) -> dict[str, Environment]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return {row["name"]: Environment(**row) for row in csv.DictReader(lines, delimiter="\t")}


ENVIRONMENTS = read_table()
# Environment name -> folder, relative to the repository.
ENV_DIRS = {name: env.folder for name, env in ENVIRONMENTS.items()}
# Where a build script puts an environment: used when the repository has
# none of its own and no variable names one.
BUILT_DIRS = {
    name: variables.cache(*env.built_in.split("/"))
    for name, env in ENVIRONMENTS.items()
    if env.built_in != "-"
}


def env_dir(env: str) -> Path:
    override = variables.get(variable(env))
    if override:
        return Path(override)
    local = REPO / ENV_DIRS[env]
    built = BUILT_DIRS.get(env)
    if not local.exists() and built is not None and (built / "bin" / "python").exists():
        return built
    return local


def variable(env: str) -> str:
    """The variable that names an environment's folder: DDLC_VENV for torch,
    DDLC_VENV_<NAME> for the others (envs/build-lib.sh's ddlc_env_variable)."""
    return "DDLC_VENV" if env == "torch" else f"DDLC_VENV_{env.upper().replace('-', '_')}"


def python_for(env: str) -> Path:
    return env_dir(env) / "bin" / "python"


# Finds the module named by its argument: find_spec of "a.b" imports the
# package "a" first (torch: about 2 s of CPU at every plan and report), so
# each part is first looked for in its parent's folders, importing nothing.
# Only a module not found there (one its package defines as it loads, such
# as tensorflow.keras) is looked for by importing its parents.
_FIND_MODULE = """
import importlib.machinery, importlib.util, sys
parts = sys.argv[1].split(".")
spec = importlib.util.find_spec(parts[0])
for at in range(1, len(parts)):
    folders = spec.submodule_search_locations if spec else None
    name = ".".join(parts[: at + 1])
    spec = importlib.machinery.PathFinder.find_spec(name, folders) if folders else None
if spec is None and len(parts) > 1:
    spec = importlib.util.find_spec(sys.argv[1])
sys.exit(spec is None)
"""


def has_module(env: str, module: str) -> bool:
    """Whether ``module`` can be found in the env, without importing it (nor
    its parent packages)."""
    python = python_for(env)
    if not python.exists():
        return False
    probe = [str(python), "-c", _FIND_MODULE, module]
    try:
        return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def set_up_by_setup_sh(env: str) -> bool:
    """Whether envs/setup.sh builds it (from requirements, or by its build
    script); the others are built by a step of their own (LBANN: hours)."""
    return ENVIRONMENTS[env].setup != "no"


def for_setup(needed: set[str]) -> list[str]:
    """What envs/setup.sh sets up for a design whose frameworks run in
    ``needed``: torch always (it holds Snakemake and the harness), then each
    other one it builds. A missing LBANN is named at plan time."""
    return ["torch", *sorted(e for e in needed - {"torch"} if set_up_by_setup_sh(e))]


def how_to_build(env: str) -> str:
    """The fix to name when an environment is missing."""
    row = ENVIRONMENTS[env]
    if set_up_by_setup_sh(env):
        minutes = ", minutes" if row.setup == "script" else ""  # a build, not a pip install
        return f"run 'bash envs/setup.sh {env}' ({row.build}{minutes})"
    return (
        f"build it with 'bash {row.build}' (or as envs/{env.partition('-')[0]}.md says) and set "
        f"{variable(env)} to its folder (the one holding bin/python)"
    )
