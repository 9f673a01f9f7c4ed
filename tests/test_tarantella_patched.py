"""Our patch to GaspiCxx (envs/patches/tarantella) applies to the commit
that envs/build-tarantella.sh pins, and only to it (so does our fix to
GPI-2's clean-up scripts); the patched build
(framework tarantella-patched) trains the shared CNN with 2 real
processes. Skipped where no GaspiCxx source or no patched build is here:
'bash envs/build-tarantella.sh patched' makes both."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, assert_learned, tiny_design, trained
from ddlcompare.plan import design, envs
from frameworks import knobs
from runfiles import variables
from test_tarantella import assert_phases_and_all_reduces

SPEC = REPO / "envs" / "patches" / "tarantella" / "GaspiCxx.json"
CLEANUP_SPEC = REPO / "envs" / "patches" / "tarantella" / "gaspi-cleanup.json"


def pinned(repo: str) -> str:
    """The tag envs/sources.txt pins for cc-hpc-itwm/``repo``, as
    build-lib.sh's `pin` reads it."""
    sources = (REPO / "envs" / "sources.txt").read_text()
    return re.search(rf"^\S+\s+git\s+cc-hpc-itwm/{repo}\s+(\S+)", sources, re.M)[1]


def copies(repo: str) -> list[Path]:
    """Git copies of ``repo`` that the build script checked out or reads
    from (DDLC_SOURCES, as the build script takes it)."""
    built = [envs.BUILT_DIRS[env] / "src" / repo for env in ("tarantella", "tarantella-patched")]
    given = variables.get("DDLC_SOURCES")
    return built + ([Path(given) / f"cc-hpc-itwm+{repo}" / "repo"] if given else [])


BUILT = envs.has_module("tarantella-patched", "tarantella")


def pinned_source(dest: Path, repo: str = "GaspiCxx") -> Path:
    """A fresh tree of ``repo`` at the pinned tag, from a local git copy."""
    for copy in copies(repo):
        if (copy / ".git").exists() or (copy / "HEAD").exists():
            subprocess.run(
                ["git", "clone", "-q", "--no-checkout", str(copy), str(dest)], check=True
            )
            subprocess.run(["git", "-C", str(dest), "checkout", "-q", pinned(repo)], check=True)
            return dest
    pytest.skip(
        f"no git copy of {repo} here ({', '.join(map(str, copies(repo)))}); "
        "'bash envs/build-tarantella.sh' checks one out"
    )


def apply(source: Path, spec: Path = SPEC) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "envs" / "patches" / "apply.py"), str(spec), str(source)],
        capture_output=True,
        text=True,
    )


def test_gaspi_cleanup_patch_applies_to_the_pinned_gpi2_once_scripts_kept_executable(tmp_path):
    """build-tarantella.sh applies it to the installed gaspi_run and
    gaspi_cleanup, copies of GPI-2's bin/ (the test that it works:
    tests/test_tarantella.py)."""
    source = pinned_source(tmp_path / "GPI-2", "GPI-2")
    first = apply(source, CLEANUP_SPEC)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("hooked at") == 2
    run, cleanup = (source / "bin" / name for name in ("gaspi_run", "gaspi_cleanup"))
    assert "GASPI_CLEANUP_PRG=$PRG $(dirname $0)/gaspi_cleanup -m" in run.read_text()
    assert "PRG=${GASPI_CLEANUP_PRG:-}" in cleanup.read_text()
    assert all(os.access(script, os.X_OK) for script in (run, cleanup))
    again = apply(source, CLEANUP_SPEC)
    assert again.returncode == 0 and again.stdout.count("already hooked") == 2


def test_patch_applies_to_the_pinned_commit_once(tmp_path):
    source = pinned_source(tmp_path / "GaspiCxx")
    first = apply(source)
    assert first.returncode == 0, first.stderr
    hooks = json.loads(SPEC.read_text())["hooks"]
    assert first.stdout.count("hooked at") == len(hooks)
    diff = subprocess.run(
        ["git", "-C", str(source), "diff", "--numstat"], capture_output=True, text=True
    ).stdout
    added = sum(int(line.split()[0]) for line in diff.splitlines())
    assert added == len(hooks)  # one line per hook: the smallest edits
    again = apply(source)  # a build that resumes applies it again: no change
    assert again.returncode == 0 and again.stdout.count("already hooked") == len(hooks)


def test_patch_refuses_a_source_it_was_not_written_for(tmp_path):
    source = pinned_source(tmp_path / "GaspiCxx")
    engine = source / "src" / "progress_engine" / "RoundRobinDedicatedThread.cpp"
    engine.write_text(engine.read_text().replace("if (!terminate_man_thread)", "if (!stop)"))
    found = apply(source)
    assert found.returncode == 1
    assert "RoundRobinDedicatedThread.cpp" in found.stderr and "found 0 times" in found.stderr
    assert "Traceback" not in found.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    not BUILT,
    reason=f"the patched Tarantella is not built ({envs.env_dir('tarantella-patched')}); "
    "'bash envs/build-tarantella.sh patched' builds it",
)
def test_patched_build_trains_two_processes():
    with tempfile.TemporaryDirectory() as tmp:
        doc = tiny_design(["tarantella-patched"], timeout_s=600, fit_step_phases=True)
        folder = trained(doc, Path(tmp))
        assert_learned(folder)
        ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert ranks[0]["params_digest"] == ranks[1]["params_digest"]
        assert {r["world"] for r in ranks} == {2}
        # the run's record names the patch the build applied
        assert ranks[0]["tarantella_build_patch"].startswith(
            "envs/patches/tarantella/GaspiCxx.json"
        )
        assert_phases_and_all_reduces(folder)  # its steps in phases, as the plain build's


def test_the_pause_is_a_knob_of_the_patched_build_only():
    doc = tiny_design(["tarantella"], gaspi_sweep_pause_us=10)
    with pytest.raises(design.DesignError) as caught:
        design.parse(doc, "tiny.yaml")
    (problem,) = caught.value.problems
    assert problem.startswith("gaspi_sweep_pause_us: 10 is set for framework tarantella,")
    assert "tarantella-patched" in problem
    design.parse(tiny_design(["tarantella-patched"], gaspi_sweep_pause_us=10), "tiny.yaml")


def test_the_pause_default_is_one_figure_in_the_patch_and_the_harness():
    """The pause's default is compiled into our IdleWait.cpp (C++ cannot read
    runfiles/variables.py) and declared for DDLC_GASPI_SWEEP_PAUSE_US there;
    IdleWait.hpp says it, and the upstream form proposes the same."""
    patch = SPEC.parent
    code = (patch / "GaspiCxx" / "IdleWait.cpp").read_text()
    (default,) = re.findall(r"constexpr long DEFAULT_PAUSE_US = (\d+);", code)
    (name,) = re.findall(r'PAUSE_VARIABLE = "(\w+)";', code)
    assert name == knobs.GASPI_PAUSE_VARIABLE
    assert variables.VARIABLES[name].default == default
    header = (patch / "GaspiCxx" / "IdleWait.hpp").read_text()
    assert re.findall(r"\((\d+) unless set\)", header) == [default]
    upstream = (patch / "upstream" / "GaspiCxx-sweep-pause.diff").read_text()
    assert re.findall(r"default_sweep_pause\{(\d+)\}", upstream) == [default]


@pytest.mark.skipif(
    not BUILT, reason="no patched Tarantella build ('bash envs/build-tarantella.sh patched')"
)
def test_patched_build_trains_with_the_pause_it_was_given():
    """The design's pause reaches every rank's GaspiCxx and is read back;
    0 (upstream's spinning in the patched build) trains too."""
    with tempfile.TemporaryDirectory() as tmp:
        doc = tiny_design(["tarantella-patched"], timeout_s=600, gaspi_sweep_pause_us=0)
        folder = trained(doc, Path(tmp))
        assert_learned(folder)
        record = json.loads((folder / "run.json").read_text())
        assert [r["knobs"]["gaspi_sweep_pause_us"] for r in record["ranks"]] == [0, 0]


def test_the_upstream_form_applies_to_the_pinned_commit(tmp_path):
    """The form to send upstream (the state in the progress engine) is a
    plain diff against the tag we build; envs/check-gaspicxx-tests.sh
    builds and runs GaspiCxx's own suite with it."""
    source = pinned_source(tmp_path / "GaspiCxx")
    diff = REPO / "envs" / "patches" / "tarantella" / "upstream" / "GaspiCxx-sweep-pause.diff"
    done = subprocess.run(
        ["git", "-C", str(source), "apply", "--check", str(diff)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_the_suite_check_refuses_a_bad_variant_in_one_line(tmp_path):
    done = subprocess.run(
        ["bash", str(REPO / "envs" / "check-gaspicxx-tests.sh"), "mine", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"usage: {REPO / 'envs' / 'check-gaspicxx-tests.sh'} ours|upstream|none DIR"
    ]
