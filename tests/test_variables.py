"""Configuration declared once: every DDLC_* environment variable in
runfiles/variables.py, and one cache root that DDLC_CACHE moves."""

import json
import re
import subprocess
import sys

from conftest import REPO
from runfiles import names, variables

NAME = re.compile(r"DDLC_[A-Z0-9_]*")


def tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [f for f in listed if not f.startswith("tests/data/")]


def test_every_ddlc_name_in_the_tree_is_declared():
    undeclared = {}
    for name in tracked_files():
        path = REPO / name
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for found in set(NAME.findall(text)):
            prefix = found.endswith("_")  # DDLC_VENV_{NAME}, the DDLC_* passed on
            if prefix and any(v.startswith(found) for v in variables.VARIABLES):
                continue
            if found not in variables.VARIABLES:
                undeclared.setdefault(found, []).append(name)
    assert undeclared == {}, "declare these in runfiles/variables.py"


def test_every_declared_variable_is_read_somewhere():
    others = [f for f in tracked_files() if f != "runfiles/variables.py"]
    text = "".join((REPO / f).read_text(errors="replace") for f in others if (REPO / f).is_file())
    assert [n for n in variables.VARIABLES if n not in text] == []


def test_the_settings_doc_lists_every_variable():
    doc = (REPO / "docs" / "settings.md").read_text()
    assert all(f"`{name}`" in doc for name in variables.VARIABLES)


def test_an_undeclared_name_is_refused():
    try:
        variables.get("DDLC_" + "NOT_DECLARED")
    except KeyError:
        return
    raise AssertionError("an undeclared variable was read")


def test_declared_defaults_are_given_when_unset():
    assert variables.get("DDLC_SRUN_MPI", {}) == "pmix"
    assert variables.get("DDLC_SRUN_MPI", {"DDLC_SRUN_MPI": ""}) == ""
    assert variables.get("DDLC_CACHE", {}) is None


def test_ddlc_cache_moves_every_cache(tmp_path):
    """Each cache the harness keeps, worked out in a fresh process with
    DDLC_CACHE set, lies under it."""
    probe = """
import json
from ddlcompare.plan import envs
from ddlcompare.run import model_gate, plan_checks, tracers
from frameworks import data, lbann_source
from traces import fastotf2
print(json.dumps([
    str(model_gate.CACHE), str(plan_checks.VERIFIED), data.CIFAR10.default_dir,
    str(lbann_source.CACHE), str(lbann_source.BUILD_SCRIPT_TREE), str(fastotf2.cache_dir()),
    *map(str, envs.BUILT_DIRS.values()),
]))
"""
    root = tmp_path / "cache"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DDLC_CACHE": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    places = json.loads(out.stdout)
    assert places and all(p.startswith(str(root) + "/") for p in places), places


def test_no_code_works_out_a_cache_folder_of_its_own():
    """Python reaches the cache only through runfiles/variables.py; each
    shell script with the same default."""
    own = []
    for name in tracked_files():
        text = (REPO / name).read_text(errors="replace") if (REPO / name).is_file() else ""
        if name.endswith(".py") and name != "runfiles/variables.py":
            code = re.sub(r'"""[\s\S]*?"""', "", text)  # docstrings may say where it is
            if re.search(r"""["'](~/)?\.cache\b""", code):
                own.append(name)
        elif name.endswith(".sh") and "ddl-compare}" in text:
            if "${DDLC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddl-compare}" not in text:
                own.append(name)
    assert own == []


def test_run_folder_file_names_are_spelled_once():
    """A run folder's file names live in runfiles/names.py; code uses them
    from there (words such as 'scorep' or 'lbann' also name other things,
    so only names with a dot are looked for)."""
    spelled = {
        value
        for value in vars(names).values()
        if isinstance(value, str) and "." in value and not value.startswith("_")
    }
    elsewhere = {}
    for name in tracked_files():
        if name.endswith(".py") and not name.startswith(("tests/", "bench/")):
            if name == "runfiles/names.py":
                continue
            code = re.sub(r'"""[\s\S]*?"""', "", (REPO / name).read_text())
            found = [v for v in spelled if f'"{v}"' in code or f"'{v}'" in code]
            if found:
                elsewhere[name] = found
    assert elsewhere == {}, "use runfiles/names.py"


def test_no_development_machines_paths():
    """Code, tests, scripts and configuration name no folder of one machine:
    shared data is found beside the checkout or through DDLC_SHARED."""
    machine = re.compile(r"(?<![\w.~$])/(work|root)/")
    found = [
        name
        for name in tracked_files()
        if not name.endswith(".md")
        and (REPO / name).is_file()
        and machine.search((REPO / name).read_text(errors="replace"))
    ]
    assert found == []
