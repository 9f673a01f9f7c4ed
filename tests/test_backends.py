"""A new backend is one new file: a launcher dropped into
ddlcompare/run/launchers/ and a framework adapter dropped into
frameworks/adapters/ are found with no other change. (Schedulers:
tests/test_hosts_launch.py; trace readers: tests/test_traces_readers.py.)
A name is one backend's: a second file registering it is refused, naming
both; and a file of a kind's folder is one backend."""

import importlib
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddlcompare.run import launch, launchers, schedulers
from ddlcompare.run.schedulers import Host
from frameworks.registry import FAMILIES, FRAMEWORKS, AdapterInfo
from runfiles.backends import DuplicateBackend

REPO = Path(__file__).resolve().parent.parent


def test_a_new_launcher_is_one_file():
    module = Path(launchers.__file__).parent / "dummy_for_test.py"
    module.write_text(
        textwrap.dedent('''
        from ddlcompare.run.launch import base_env, launcher

        @launcher("dummy-launcher")
        def dummy(hosts, config, run_dir, scheduler):
            return ["echo", scheduler.name, str(len(hosts))], base_env(config)
        ''')
    )
    try:
        argv, env = launch.command(
            "dummy-launcher", [Host("localhost", 2)], {"threads": 3}, Path("/r"), "local"
        )
        assert argv == ["echo", "local", "1"] and env["OMP_NUM_THREADS"] == "3"
    finally:
        module.unlink()
        launch.LAUNCHERS.forget("dummy-launcher")


def test_a_new_framework_is_one_file():
    module = REPO / "frameworks" / "adapters" / "dummy_for_test.py"
    module.write_text(
        textwrap.dedent('''
        from frameworks.registry import AdapterInfo, register

        ADAPTER = register(AdapterInfo(name="dummy-framework", family="torch", launcher="torchrun"))
        ''')
    )
    try:
        # A fresh interpreter: the registry is built once per process.
        found = subprocess.run(
            [
                sys.executable,
                "-c",
                "from ddlcompare.plan.params import PARAMS; "
                "print(PARAMS['framework'].check('dummy-framework'))",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert found.stdout.strip() == "None", found.stderr
    finally:
        module.unlink()


def kind_package(folder: Path, monkeypatch, **modules: str) -> str:
    """A package of one backend kind under ``folder``, importable for this
    test: its registry in __init__, and ``modules`` (name: source)."""
    package = f"kind_{folder.name}"
    (folder / package).mkdir()
    (folder / package / "__init__.py").write_text(
        f"from runfiles.backends import Registry\nREGISTRY = Registry({package!r}, 'dummy')\n"
    )
    for name, source in modules.items():
        (folder / package / f"{name}.py").write_text(
            f"from {package} import REGISTRY\n" + textwrap.dedent(source)
        )
    monkeypatch.syspath_prepend(str(folder))
    for module in [m for m in sys.modules if m.split(".")[0] == package]:
        monkeypatch.delitem(sys.modules, module)
    return package


TWICE = """
@REGISTRY.register(name="twice")
def backend():
    pass
"""


def test_a_framework_of_no_known_family_is_refused_naming_the_families():
    with pytest.raises(ValueError, match=r"'dummy'.*no family 'jax' \(known: torch, tensorflow"):
        AdapterInfo(name="dummy", family="jax", launcher="torchrun")


def test_a_framework_states_only_what_differs_from_its_family():
    """torch-ddp names its probe and keeps its family's environment; tarantella
    names its environment and adds a phase to its family's."""
    ddp, tarantella = FRAMEWORKS["torch-ddp"], FRAMEWORKS["tarantella"]
    assert (ddp.env, ddp.probe, ddp.gate_builder) == ("torch", "torch.distributed", "pytorch")
    assert "h2d" in ddp.exposes and "grad_comm" not in ddp.exposes
    assert (tarantella.env, tarantella.gate_builder) == ("tarantella", "tarantella")
    assert set(tarantella.exposes) == {*FAMILIES["tensorflow"].exposes, "other"}


def test_a_second_file_registering_a_name_is_refused_naming_both(tmp_path, monkeypatch):
    package = kind_package(tmp_path, monkeypatch, first=TWICE, second=TWICE)
    registry = importlib.import_module(package).REGISTRY
    with pytest.raises(DuplicateBackend) as refused:
        list(registry)
    message = str(refused.value)
    assert "dummy 'twice' is registered twice" in message
    assert str(tmp_path / package / "first.py") in message
    assert str(tmp_path / package / "second.py") in message
    # The first registration stands.
    assert registry["twice"].__module__ == f"{package}.first"


def test_the_same_file_registering_again_replaces_its_own(tmp_path, monkeypatch):
    """A reload (or pytest collecting a module again) is the same
    registration, not a second one."""
    package = kind_package(tmp_path, monkeypatch, only=TWICE)
    module = importlib.import_module(f"{package}.only")
    first = module.REGISTRY["twice"]
    reloaded = importlib.reload(module)
    assert reloaded.REGISTRY["twice"] is reloaded.backend is not first
    assert list(reloaded.REGISTRY) == ["twice"]


def test_a_forgotten_name_may_be_registered_by_another_file(tmp_path, monkeypatch):
    package = kind_package(tmp_path, monkeypatch, first=TWICE)
    registry = importlib.import_module(package).REGISTRY
    assert "twice" in registry
    registry.forget("twice")
    registry.register(name="twice")(print)  # from this file: no longer a second file
    assert registry["twice"] is print


def test_the_real_registries_hold_no_name_twice():
    """Listing every kind imports every backend file: none is refused."""
    from frameworks.registry import FRAMEWORKS
    from traces.readers import REGISTRY as READERS

    for registry in (launch.LAUNCHERS, schedulers.REGISTRY, FRAMEWORKS, READERS):
        assert len(list(registry)) > 1, registry.kind


def test_each_backend_is_one_file_of_its_kinds_folder():
    """Every module of a kind's folder registers exactly one backend, and
    every backend of the kind is registered by a module of that folder."""
    from frameworks.registry import FRAMEWORKS
    from traces.readers import REGISTRY as READERS

    for registry in (launch.LAUNCHERS, schedulers.REGISTRY, FRAMEWORKS, READERS):
        folder = Path(importlib.import_module(registry.package).__file__).parent
        files = sorted(
            str((folder / f"{m.name}.py").resolve()) for m in pkgutil.iter_modules([str(folder)])
        )
        registered = sorted(registry.origin(name) for name in registry)
        assert registered == files, registry.kind


def test_every_framework_has_its_row_in_the_status_table():
    """CONTRIBUTING's last step of a framework: its row in docs/frameworks.md's
    status table (the first table there), where its status is stated once."""
    from frameworks.registry import FRAMEWORKS

    text = (REPO / "docs" / "frameworks.md").read_text()
    table = text.split("| framework | launcher | environment | status |", 1)[1].split("\n\n")[0]
    rows = re.findall(r"^\| `([^`]+)` \|", table, re.M)
    assert sorted(rows) == sorted(FRAMEWORKS)
