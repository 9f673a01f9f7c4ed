"""Shared caches that checkouts on one machine use at once (envs/build-lib.sh):
an entry is built in a private folder and published by one rename under a
lock on it; a second set-up waits, saying for whom, then uses it; a damaged
entry is built again. Builds find out at once when their sources cannot be
had (DDLC_SOURCES, ./ddlc sources), and shell and Python agree on the cache
root. Real processes throughout, with a build step of a second or two."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from runfiles import variables

LIB = REPO / "envs" / "build-lib.sh"

# A stand-in build: slow enough that a second set-up comes while it runs;
# it counts its runs in a file beside the cache.
BUILD = f"""
set -euo pipefail
. {LIB}
build() {{ echo "$$" >> "$DDLC_CACHE/builds"; sleep 2; echo whole > "$1/payload"; }}
cache_entry "$DDLC_CACHE/entry" entry_stamped build
cat "$DDLC_CACHE/entry/payload"
"""


def set_up(cache: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "-c", BUILD],
        env={**os.environ, "DDLC_CACHE": str(cache)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def test_two_set_ups_of_one_entry_build_it_once_and_both_use_it(tmp_path):
    first = set_up(tmp_path)
    while not (tmp_path / "builds").exists():  # the first holds the lock and builds
        time.sleep(0.05)
    second = set_up(tmp_path)
    (rc1, out1, err1), (rc2, out2, err2) = finished(first), finished(second)
    assert (rc1, out1, rc2, out2) == (0, "whole\n", 0, "whole\n"), (err1, err2)
    assert len((tmp_path / "builds").read_text().split()) == 1  # built once
    entry = tmp_path / "entry"
    assert f"waiting for {entry}, which another set-up is building (pid {first.pid} on " in err2
    assert f"checkout {Path.cwd()}" in err2
    assert sorted(p.name for p in entry.iterdir()) == [".ddlc-complete", "payload"]
    assert not list(tmp_path.glob("entry.tmp.*"))  # the private folder was renamed
    [log] = (tmp_path / "entry.logs").iterdir()  # one attempt, one log
    assert log.name.endswith(f"-{first.pid}.log")


@pytest.mark.parametrize("damage", ["a file where the folder belongs", "a build cut off"])
def test_a_damaged_entry_is_built_again(tmp_path, damage):
    entry = tmp_path / "entry"
    if damage.startswith("a file"):
        entry.write_text("not a folder")
    else:
        entry.mkdir()  # no completion stamp: the build stopped half-way
        (entry / "half").write_text("")
        (tmp_path / "entry.tmp.Ab12Cd").mkdir()  # an earlier private folder, left behind
    rc, out, err = finished(set_up(tmp_path))
    assert (rc, out) == (0, "whole\n"), err
    assert f"{entry} is damaged" in err
    assert sorted(p.name for p in entry.iterdir()) == [".ddlc-complete", "payload"]
    assert not list(tmp_path.glob("entry.tmp.*"))
    rc, out, err = finished(set_up(tmp_path))  # whole now: used as it is
    assert (rc, out, err) == (0, "whole\n", "")
    assert len((tmp_path / "builds").read_text().split()) == 1


def test_a_failed_build_publishes_nothing_and_keeps_its_log(tmp_path):
    # as a condition, where bash turns set -e off for the functions it calls
    failing = BUILD.replace('echo whole > "$1/payload"', "false; echo never").replace(
        "cache_entry \"$DDLC_CACHE/entry\" entry_stamped build",
        "cache_entry \"$DDLC_CACHE/entry\" entry_stamped build || exit 7",
    )
    done = subprocess.run(
        ["bash", "-c", failing],
        env={**os.environ, "DDLC_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 7
    assert not (tmp_path / "entry").exists() and not list(tmp_path.glob("entry.tmp.*"))
    [log] = (tmp_path / "entry.logs").iterdir()
    assert f"building {tmp_path / 'entry'} failed; log: {log}" in done.stderr
    assert "never" not in log.read_text()  # set -e held inside the build


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"XDG_CACHE_HOME": "/x/xdg"},
        {"DDLC_CACHE": "/x/ddlc"},
        {"DDLC_CACHE": "/x/ddlc", "XDG_CACHE_HOME": "/x/xdg"},
        {"DDLC_CACHE": "", "XDG_CACHE_HOME": ""},
    ],
)
def test_shell_and_python_agree_on_the_cache_root(env):
    full = {k: v for k, v in os.environ.items() if k not in ("DDLC_CACHE", "XDG_CACHE_HOME")}
    full.update(env)
    shell = subprocess.run(
        ["bash", "-c", f". {LIB}; ddlc_cache_root"],
        env=full,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert shell == str(variables.cache_root(full))


def test_every_script_takes_the_cache_root_from_build_lib():
    """One computation of the root: no script spells it out again."""
    spelled = [
        str(path.relative_to(REPO))
        for path in [*REPO.glob("envs/*.sh"), *REPO.glob("bench/*"), REPO / "ddlc"]
        if path.is_file() and path != LIB and "XDG_CACHE_HOME" in path.read_text()
    ]
    assert spelled == []


def pinned_ref(repo: str) -> str:
    """REPO's ref as envs/sources.txt pins it."""
    for line in (REPO / "envs" / "sources.txt").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and not line.startswith("#") and fields[2] == repo:
            return fields[3]
    raise AssertionError(f"envs/sources.txt pins no {repo}")


def stand_in(repo: str, into: Path) -> None:
    """A small local git repository holding REPO's pinned ref: where this
    machine has no copy of REPO (CI reaches no GitHub), it stands in for it.
    The source checks and ./ddlc sources look for the ref, not the code."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(into)], check=True)
    subprocess.run([*git, "-C", str(into), "commit", "-q", "--allow-empty", "-m", repo], check=True)
    subprocess.run([*git, "-C", str(into), "tag", pinned_ref(repo)], check=True)


def sources_folder(tmp_path: Path, *repos: str) -> Path:
    """A DDLC_SOURCES folder holding a copy of each of these repositories:
    the one this machine has under the folder DDLC_SOURCES names, else a
    stand-in (so these tests run on CI, without the mirrors)."""
    mirror = Path(os.environ.get("DDLC_SOURCES") or "/nonexistent")
    folder = tmp_path / "sources"
    folder.mkdir()
    for repo in repos:
        name = repo.replace("/", "+")
        if (mirror / name).is_dir():
            (folder / name).symlink_to(mirror / name)
        else:
            stand_in(repo, folder / name / "repo")
    return folder


def test_a_build_whose_sources_folder_lacks_a_repository_stops_at_once(tmp_path):
    """The set-up path ./ddlc run takes for a design naming Tarantella."""
    # CPython's stand-in, for a machine without Python 3.9 (its source is checked first)
    sources = sources_folder(
        tmp_path, "cc-hpc-itwm/GPI-2", "cc-hpc-itwm/tarantella", "python/cpython"
    )
    env = {**os.environ, "DDLC_CACHE": str(tmp_path / "cache"), "DDLC_SOURCES": str(sources)}
    for name in ("DDLC_VENV_TARANTELLA", "DDLC_TARANTELLA_PREFIX"):
        env.pop(name, None)
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "envs/setup.sh", "tarantella"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 30
    assert done.stderr.strip().splitlines()[-1] == (
        f"tarantella: cannot build: DDLC_SOURCES={sources} has no copy of "
        f"cc-hpc-itwm/GaspiCxx (expected {sources}/cc-hpc-itwm+GaspiCxx/repo). Gather every "
        "source with './ddlc sources DIR' on a machine that reaches them, then set "
        "DDLC_SOURCES=DIR here; or drop tarantella from the design's framework levels."
    )
    prefix = tmp_path / "cache" / "tarantella-v0.8.0"
    assert not prefix.exists()  # nothing was built


def test_ddlc_sources_gathers_the_pinned_repositories(tmp_path):
    """./ddlc sources (git alone, no environment) copies what envs/sources.txt
    pins into the layout DDLC_SOURCES reads; a folder missing one is refused
    naming it. CPython's is always a stand-in (stand_in)."""
    sources = sources_folder(
        tmp_path,
        *("cc-hpc-itwm/GPI-2", "cc-hpc-itwm/GaspiCxx", "cc-hpc-itwm/tarantella"),
        "python/cpython",
    )
    gathered = tmp_path / "gathered"
    env = {**os.environ, "DDLC_SOURCES": str(sources), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(REPO / "ddlc"), "sources", str(gathered), "tarantella"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == f"sources: ready: DDLC_SOURCES={gathered}"
    for repo, ref in [("cc-hpc-itwm+GaspiCxx", "v1.1.0"), ("python+cpython", "v3.9.18")]:
        subprocess.run(
            ["git", "--git-dir", str(gathered / repo / "repo"), "rev-parse", "--verify", ref],
            check=True,
            capture_output=True,
        )
    # the gathered folder passes the builds' own check of their sources
    check = subprocess.run(
        ["bash", "-c", f". {LIB}; check_sources tarantella cc-hpc-itwm/GaspiCxx=v1.1.0"],
        env={**os.environ, "DDLC_SOURCES": str(gathered)},
        capture_output=True,
        text=True,
    )
    assert (check.returncode, check.stderr) == (0, "")
    gaspicxx = sources / "cc-hpc-itwm+GaspiCxx"
    gaspicxx.unlink() if gaspicxx.is_symlink() else shutil.rmtree(gaspicxx)
    refused = subprocess.run(
        [str(REPO / "ddlc"), "sources", str(tmp_path / "again"), "tarantella"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        f"sources: DDLC_SOURCES={sources} has no copy of cc-hpc-itwm/GaspiCxx "
        f"(expected {sources}/cc-hpc-itwm+GaspiCxx/repo)"
    )


@pytest.mark.usefixtures("measuring_alone")
def test_a_run_waiting_for_the_machine_says_which_run_holds_it(tmp_path, monkeypatch):
    from ddlcompare.run import machine_lock

    lock = tmp_path / "lock"
    monkeypatch.setenv(machine_lock.LOCK_ENV, str(lock))
    monkeypatch.delenv(machine_lock.HELD_ENV, raising=False)
    waiter = (
        "from ddlcompare.run import machine_lock as m\n"
        "with m.measuring('results/d/second', lambda t: print(t, flush=True)): pass"
    )
    with machine_lock.measuring("results/d/first", lambda text: None):
        waiting = subprocess.Popen(
            [sys.executable, "-c", waiter],
            # another run, not part of this measurement
            env={**os.environ, "PYTHONPATH": str(REPO), machine_lock.HELD_ENV: ""},
            stdout=subprocess.PIPE,
            text=True,
        )
        told = waiting.stdout.readline()
    assert waiting.wait(timeout=60) == 0
    assert told.startswith(f"waiting for the machine: {lock} is held by pid {os.getpid()} ")
    assert told.endswith(f"; measuring: pid {os.getpid()}: results/d/first\n")


def test_a_damaged_compiled_reader_is_built_again(tmp_path):
    """The C readers' cache (traces/fastotf2): a folder where the library
    belongs is replaced by the library, built under the entry's lock."""
    from traces import fastotf2

    if not fastotf2.HEADER.is_file():
        pytest.skip(f"{fastotf2.HEADER} missing: apt-get install libopen-trace-format2-dev")
    env = {**os.environ, "DDLC_CACHE": str(tmp_path), "PYTHONPATH": str(REPO)}
    probe = "from traces import fastotf2; print(fastotf2.{}())"
    where = Path(
        subprocess.run(
            [sys.executable, "-c", probe.format("library_path")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (where / "leftover").mkdir(parents=True)
    built = subprocess.run(
        [sys.executable, "-c", probe.format("build")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == str(where) and where.is_file()
    assert where.read_bytes()[:4] == b"\x7fELF"


def test_python_builders_of_one_entry_take_turns_and_say_whom_they_wait_for(tmp_path):
    """runfiles.atomic.entry_lock, which the C readers, CIFAR-10 and LBANN's
    front end build under: the second process waits for the first."""
    entry = tmp_path / "entry"
    builder = (
        "import sys, time\n"
        "from runfiles.atomic import entry_lock\n"
        "with entry_lock(sys.argv[1]):\n"
        "    print('in', flush=True)\n"
        "    time.sleep(2)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = [sys.executable, "-c", builder, str(entry)]
    first = subprocess.Popen(start, env=env, stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline() == "in\n"
    second = subprocess.run(start, env=env, capture_output=True, text=True, timeout=60)
    assert first.wait(timeout=60) == 0 and second.returncode == 0
    assert second.stderr.startswith(f"waiting for {entry}, which pid {first.pid} on ")


# A design's framework levels in the forms YAML allows, as the early reader
# (envs/design_frameworks.py) must find them; an exclusion naming Tarantella
# is not a level.
FRAMEWORK_FORMS = {
    "flow": "factors:\n  framework: [torch-ddp, tarantella]  # two\n  nodes: [1]\n",
    "flow over lines": "factors:\n  framework: [torch-ddp,\n    'tarantella-patched']\n",
    "block": "name: x\nfactors:\n  framework:\n  - torch-ddp\n  # none\n  - tarantella\n  nodes: [1]\n",
    "indented block": "factors:\n  nodes: [1]\n  framework:\n    - \"tarantella\"  # one\n",
    "one name": "factors:\n  framework: tarantella-patched\n",
    "flow mapping": "factors: {nodes: [1], framework: [horovod-torch, tarantella]}\n",
    "excluded only": "exclude:\n- framework: tarantella\nfactors:\n  framework: [torch-ddp]\n",
}


@pytest.mark.parametrize("pyyaml", [True, False], ids=["PyYAML", "no PyYAML"])
@pytest.mark.parametrize("form", FRAMEWORK_FORMS)
def test_the_early_reader_finds_the_framework_levels(tmp_path, form, pyyaml):
    """With the system's python3, PyYAML or not (a fresh Debian may lack
    it): the levels YAML itself reads."""
    import yaml

    text = FRAMEWORK_FORMS[form]
    design = tmp_path / "design.yaml"
    design.write_text(text)
    block = "" if pyyaml else "sys.modules['yaml'] = None; "
    reader = (
        f"import runpy, sys; {block}sys.argv[1:] = [{str(design)!r}]; "
        f"runpy.run_path({str(REPO / 'envs' / 'design_frameworks.py')!r}, run_name='__main__')"
    )
    python3 = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
    out = subprocess.run([python3, "-c", reader], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    levels = yaml.safe_load(text)["factors"]["framework"]
    assert out.stdout.split() == (levels if isinstance(levels, list) else [levels])


@pytest.mark.parametrize("form", ["the default design", "block"])
def test_a_fresh_clones_run_of_a_tarantella_design_stops_before_set_up(tmp_path, form):
    """No environment yet (reading the design needs one, minutes to build):
    ./ddlc run checks Tarantella's sources first when the design's framework
    levels name it, in whatever form, and stops within seconds, building nothing."""
    sources = sources_folder(
        tmp_path, "cc-hpc-itwm/GPI-2", "cc-hpc-itwm/tarantella", "python/cpython"
    )
    design = tmp_path / "design.yaml"
    design.write_text(
        (REPO / "design.yaml").read_text()
        if form == "the default design"
        else FRAMEWORK_FORMS[form]
    )
    env = {
        **os.environ,
        "DDLC_VENV": str(tmp_path / "venv"),
        "DDLC_CACHE": str(tmp_path / "cache"),
        "DDLC_SOURCES": str(sources),
    }
    started = time.monotonic()
    done = subprocess.run(
        [str(REPO / "ddlc"), "run", "--config", f"design={design}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and time.monotonic() - started < 30
    assert done.stderr.startswith(
        f"tarantella: cannot build: DDLC_SOURCES={sources} has no copy of cc-hpc-itwm/GaspiCxx"
    )
    assert len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "venv").exists() and not (tmp_path / "cache").exists()
