"""The framework environments are declared once, in envs/environments.tsv:
set-up (envs/setup.sh, through envs/build-lib.sh), the harness
(ddlcompare/plan/envs.py) and docs/settings.md read that one table."""

import subprocess

from conftest import REPO
from ddlcompare.plan import envs
from ddlcompare.plan.schema import environments_doc
from frameworks import registry

LIB = REPO / "envs" / "build-lib.sh"


def shell(script: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f". {LIB}; {script}"], capture_output=True, text=True, env=env, cwd=REPO
    )


def test_setup_and_the_harness_read_the_same_table():
    rows = shell("ddlc_environments").stdout.splitlines()
    from_shell = {line.split("\t")[0]: tuple(line.split("\t")) for line in rows}
    assert from_shell == {
        name: (e.name, e.folder, e.built_in, e.setup, e.build, e.needs)
        for name, e in envs.ENVIRONMENTS.items()
    }
    for name in envs.ENVIRONMENTS:
        said = shell(f"ddlc_env_variable {name}").stdout.strip()
        assert said == envs.variable(name)


def test_setup_sets_up_what_the_table_says(tmp_path):
    """What set-up accepts is the table's: an environment it does not build
    is refused in one line listing those it does, before anything is built."""
    done = subprocess.run(
        ["bash", "envs/setup.sh", "lbann"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DDLC_CACHE": str(tmp_path)},
    )
    built = [name for name in envs.ENVIRONMENTS if envs.set_up_by_setup_sh(name)]
    assert done.returncode == 2
    assert done.stderr == (
        f"setup: envs/setup.sh sets up {', '.join(built[:-1])} and {built[-1]}, not 'lbann': "
        "'bash envs/build-lbann.sh' builds it\n"
    )
    assert list(tmp_path.iterdir()) == [tmp_path / "wheels"]


def test_no_environment_is_declared_outside_the_table():
    """Set-up and the harness name no environment's folder themselves."""
    for path in (REPO / "envs" / "setup.sh", REPO / "ddlcompare" / "plan" / "envs.py"):
        text = path.read_text()
        for env in envs.ENVIRONMENTS.values():
            for folder in {env.folder, env.built_in} - {"-"}:
                assert f"{folder}\n" not in text and f"{folder}'" not in text, (path, folder)
                assert f'{folder}"' not in text and f"{folder}}}" not in text, (path, folder)


def test_every_adapters_environment_is_in_the_table_and_the_docs():
    assert {info.env for info in registry.FRAMEWORKS.values()} <= set(envs.ENVIRONMENTS)
    doc = "\n".join(environments_doc())
    assert all(f"| {name} |" in doc for name in envs.ENVIRONMENTS)


def test_a_module_is_found_without_importing_its_package(tmp_path, monkeypatch):
    """has_module (every plan's check of each framework's environment, and
    the report's) finds a module of a package without importing the package:
    torch.distributed took torch's import, 2 s of CPU, each time. A module
    found only once the package has loaded (in a folder it adds to its
    path as it loads, as tensorflow does for tensorflow.keras) is still
    found, and a missing one is not."""
    package, more = tmp_path / "pkg", tmp_path / "more"
    package.mkdir()
    more.mkdir()
    imported = tmp_path / "imported"
    (package / "__init__.py").write_text(
        f"import pathlib\npathlib.Path({str(imported)!r}).touch()\n__path__.append({str(more)!r})\n"
    )
    (package / "sub.py").write_text("")
    (more / "added.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert envs.has_module("torch", "pkg.sub") and not imported.exists()
    assert envs.has_module("torch", "pkg.added")
    assert not envs.has_module("torch", "pkg.missing")
    assert not envs.has_module("torch", "nothing.here")
