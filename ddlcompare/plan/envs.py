"""Which interpreter runs which framework.

Each adapter names its environment (``AdapterInfo.env``); each environment is
a virtual environment that envs/setup.sh builds from ``envs/<env>.txt``.
TensorFlow's needs numpy < 2 while the analysis needs numpy 2, so the two
families live apart and a run starts its workers with its own env's Python.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from runfiles import variables

REPO = Path(__file__).resolve().parents[2]

# Environment name -> folder, relative to the repository (override with
# DDLC_VENV for torch, DDLC_VENV_<NAME> for the others). envs/setup.sh builds
# those with an envs/<name>.txt; the others are built on clusters as
# envs/<name>.md says (Tarantella, LBANN).
ENV_DIRS = {
    "torch": ".venv",
    "tensorflow": ".venv-tf",
    "tarantella": ".venv-tarantella",
    "tarantella-patched": ".venv-tarantella-patched",
    "lbann": ".venv-lbann",
}


# Where envs/build-<name>.sh puts an environment it builds: used when the
# repository has none of its own and no variable names one.
BUILT_DIRS = {
    "tarantella": variables.cache("tarantella-v0.8.0"),
    "tarantella-patched": variables.cache("tarantella-v0.8.0-patched"),
    "lbann": variables.cache("lbann", "venv"),
}


# Built by envs/setup.sh through their own build script, in minutes (Tarantella:
# envs/tarantella.md); LBANN's build takes hours and stays a step of its own.
BUILT_BY_SETUP = {"tarantella"}


def env_dir(env: str) -> Path:
    override = variables.get("DDLC_VENV" if env == "torch" else variable(env))
    if override:
        return Path(override)
    local = REPO / ENV_DIRS[env]
    built = BUILT_DIRS.get(env)
    if not local.exists() and built is not None and (built / "bin" / "python").exists():
        return built
    return local


def variable(env: str) -> str:
    """The variable that names an environment's folder: DDLC_VENV_<NAME>."""
    return f"DDLC_VENV_{env.upper().replace('-', '_')}"


def python_for(env: str) -> Path:
    return env_dir(env) / "bin" / "python"


def has_module(env: str, module: str) -> bool:
    """Whether ``module`` can be found in the env, without importing it."""
    python = python_for(env)
    if not python.exists():
        return False
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return (
            subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def set_up_by_setup_sh(env: str) -> bool:
    """envs/setup.sh builds the environments that have an envs/<env>.txt,
    and those of BUILT_BY_SETUP with their build script; LBANN has a build
    script of its own."""
    return (REPO / "envs" / f"{env}.txt").exists() or env in BUILT_BY_SETUP


def for_setup(needed: set[str]) -> list[str]:
    """What envs/setup.sh sets up for a design whose frameworks run in
    ``needed``: torch always (it holds Snakemake and the harness), then each
    other one it builds. A missing LBANN is named at plan time."""
    return ["torch", *sorted(e for e in needed - {"torch"} if set_up_by_setup_sh(e))]


def how_to_build(env: str) -> str:
    """The fix to name when an environment is missing."""
    if env in BUILT_BY_SETUP:
        return f"run 'bash envs/setup.sh {env}' (envs/build-{env}.sh, minutes)"
    if set_up_by_setup_sh(env):
        return f"run 'bash envs/setup.sh {env}' (envs/{env}.txt)"
    if (REPO / "envs" / f"build-{env}.sh").exists():
        return (
            f"build it with 'bash envs/build-{env}.sh' (or as envs/{env}.md says) and set "
            f"{variable(env)} to its folder (the one holding bin/python)"
        )
    base, _, variant = env.partition("-")  # a variant of a build: its script's argument
    if variant and (REPO / "envs" / f"build-{base}.sh").exists():
        return (
            f"build it with 'bash envs/build-{base}.sh {variant}' (docs/improvements.md); "
            f"{variable(env)} names another folder"
        )
    return (
        f"build it as envs/{env}.md says and set {variable(env)} "
        "to its folder (the one holding bin/python)"
    )
