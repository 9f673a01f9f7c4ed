"""The layers run one way: no module imports from a layer above its own.

From the bottom: what a run leaves and how it is written, the phase
vocabulary included (runfiles), the training side with its phase recorder
and tracers (frameworks), the readers of traces (traces), the harness
(ddlcompare), the analysis, and the front on top (front: the command line
and the workflow's helpers). Imports inside functions count too.

The harness is two layers of its own, each a sub-package: what a design is
and how it is planned (ddlcompare.plan: the settings, the design file, its
runs, what the design alone says about them), then how a run is executed
(ddlcompare.run: runner, launchers, schedulers, the machine's checks, locks
and network, validation of what a run left). The run package builds on the
plan package, never the other way round; every module of the harness lives
in one of them.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A layer is a tuple so that a package's sub-packages can be ordered inside
# its place: (3, 0) is below (3, 1), and both are below (4,).
LAYERS = {
    "runfiles": (0,),
    "frameworks": (1,),
    "traces": (2,),
    "ddlcompare.plan": (3, 0),
    "ddlcompare.run": (3, 1),
    "analysis": (4,),
    "front": (5,),
}
PACKAGES = sorted({name.split(".")[0] for name in LAYERS})


def layer(module: str) -> tuple[int, ...] | None:
    matches = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return LAYERS[max(matches, key=len)] if matches else None


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def edges_upward() -> list[str]:
    wrong = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            source = module_name(path)
            for target in imports(path):
                if (
                    (mine := layer(source)) is not None
                    and (theirs := layer(target)) is not None
                    and theirs > mine
                ):
                    wrong.append(f"{source} (layer {mine}) imports {target} (layer {theirs})")
    return wrong


def test_no_import_runs_up_a_layer():
    assert edges_upward() == []


# What the analysis may take from the harness: what a design is (its
# settings, runs and cells). What a run left it reads through runfiles/,
# which writes it; how a run is executed (ddlcompare.run) is none of its
# business.
ANALYSIS_MAY_IMPORT = ("ddlcompare.plan",)


def harness_imports_beyond_the_design(folder: Path = REPO / "analysis") -> list[str]:
    wrong = []
    for path in sorted(folder.rglob("*.py")):
        for target in sorted(imports(path)):
            harness = target == "ddlcompare" or target.startswith("ddlcompare.")
            if harness and not any(target.startswith(p + ".") for p in ANALYSIS_MAY_IMPORT):
                wrong.append(f"{path.relative_to(folder.parent)} imports {target}")
    return wrong


def test_the_analysis_takes_only_the_design_from_the_harness():
    """analysis/ reads run files through runfiles/ and imports nothing of
    ddlcompare/ but ddlcompare.plan, inside functions included."""
    assert harness_imports_beyond_the_design() == []


def test_the_harness_check_sees_a_run_import(tmp_path):
    """The check can fail: a module importing the runner, even inside a
    function, is named; the design's modules pass."""
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "late.py").write_text(
        "from ddlcompare.plan.design import Design\n"
        "def f():\n    from ddlcompare.run import runner\n"
    )
    found = harness_imports_beyond_the_design(tmp_path / "analysis")
    assert found == ["analysis/late.py imports ddlcompare.run.runner"]


def test_every_package_has_a_layer():
    for package in PACKAGES:
        assert (REPO / package / "__init__.py").exists(), package


def test_every_harness_module_is_in_a_layered_sub_package():
    """ddlcompare holds no module of its own (its __init__ is empty), and
    each of its sub-packages has its place in LAYERS."""
    harness = REPO / "ddlcompare"
    assert (harness / "__init__.py").read_text().strip() == ""
    unplaced = [
        str(path.relative_to(REPO))
        for path in sorted(harness.rglob("*.py"))
        if path != harness / "__init__.py" and layer(module_name(path)) is None
    ]
    assert unplaced == []
    sub_packages = {f"ddlcompare.{p.parent.name}" for p in harness.glob("*/__init__.py")}
    assert sub_packages == {name for name in LAYERS if name.startswith("ddlcompare.")}


def modules() -> dict[str, Path]:
    """Every module of the six packages by its dotted name."""
    return {
        module_name(path): path for package in PACKAGES for path in (REPO / package).rglob("*.py")
    }


def import_graph() -> dict[str, set[str]]:
    """Which of our modules each of our modules imports (inside functions
    too). ``from a.b import c`` reaches ``a.b.c`` when that is a module,
    else ``a.b`` (c is a name defined there)."""
    known = modules()

    def resolve(target: str) -> str | None:
        parts = target.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        return ".".join(parts) or None

    graph = {}
    for name, path in known.items():
        graph[name] = {found for t in imports(path) if (found := resolve(t))} - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each circle found by a depth-first walk, written a -> b -> a."""
    found, state = [], {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                found.append(" -> ".join(stack[stack.index(target) :] + [target]))
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    return found


def test_no_import_cycle_anywhere():
    """No module of any package reaches itself through imports, inside
    functions included: a circle is held together by import order, and
    breaks when a module is imported first from elsewhere. (A figure lives
    in analysis/figures.py, not in the module it illustrates.)"""
    assert cycles(import_graph()) == []


def test_the_cycle_finder_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == ["a -> b -> c -> a"]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_count(tmp_path):
    """The graph is only as good as what it reads: an import made inside a
    function is in it, and a name imported from a module leads to that
    module."""
    source = tmp_path / "late.py"
    source.write_text("def f():\n    from traces.table import Table\n    import runfiles.phases\n")
    assert imports(source) == {"traces.table.Table", "runfiles.phases"}
    graph = import_graph()
    assert all(target in graph for targets in graph.values() for target in targets)
    assert "runfiles.backends" in graph["traces.readers"]
