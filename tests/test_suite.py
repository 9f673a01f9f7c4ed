"""The suite's own machinery (tests/conftest.py): the order xdist hands the
groups out in, and the test schedulers kept to one checkout's suite at a
time (two checkouts may run `./ddlc test` at once)."""

import os
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, SCHEDULERS

# A conftest that takes the suite's hooks from tests/conftest.py (loaded
# under a name of its own: the folder's conftest is this file's).
HOOKS = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("ddlc_conftest", {str(REPO / "tests" / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_configure = suite.pytest_configure
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
pytest_addoption = suite.pytest_addoption
pytest_runtest_protocol = suite.pytest_runtest_protocol
"""


def pytest_with_hooks(folder: Path, *options: str) -> subprocess.CompletedProcess:
    """A real pytest of ``folder``'s tests, with the suite's hooks."""
    (folder / "conftest.py").write_text(HOOKS)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(folder),
         *options, str(folder)],
        cwd=folder, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return out


def test_the_longest_groups_go_out_first_whatever_their_count_of_tests(tmp_path):
    """One worker runs the groups in the order xdist hands them out: a long
    group of 1 test (test_workflow's) before a group of 10 short ones, which
    xdist's own order (most tests first) would send first."""
    (tmp_path / "test_many.py").write_text(
        "import pytest\n@pytest.mark.parametrize('n', range(10))\ndef test_short(n): pass\n"
    )
    (tmp_path / "test_workflow.py").write_text("def test_long(): pass\n")
    out = pytest_with_hooks(tmp_path, "-n", "1", "--dist", "loadgroup", "-v")
    ran = [line.split()[-1] for line in out.stdout.splitlines() if line.startswith("[gw0]")]
    assert len(ran) == 11 and ran[0].startswith("test_workflow.py::test_long"), out.stdout


def test_test_times_tell_a_waiting_test_from_a_computing_one(tmp_path):
    """--test-times: a line per test from each of two workers, with its wall
    time and the CPU time of its worker and the processes it waited for."""
    (tmp_path / "test_wait.py").write_text("import time\ndef test_waits(): time.sleep(1.5)\n")
    burn = "import subprocess, sys\ndef test_computes():\n"
    burn += "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
    burn += "while time.process_time() - t < 1.5: pass'], check=True)\n"
    (tmp_path / "test_compute.py").write_text(burn)
    times = tmp_path / "times.tsv"
    pytest_with_hooks(tmp_path, "-n", "2", "--dist", "loadgroup", "--test-times", str(times))
    rows = {r[0]: r for r in (line.split("\t") for line in times.read_text().splitlines())}
    waits, computes = rows["test_wait.py::test_waits"], rows["test_compute.py::test_computes"]
    assert len(rows) == 2 and {waits[1], computes[1]} == {"test_wait", "test_compute"}, rows
    assert {waits[2], computes[2]} <= {"gw0", "gw1"}, rows
    assert float(waits[4]) >= 1.5 and float(waits[5]) < 0.5, waits
    assert float(computes[5]) >= 1.5 and float(computes[4]) >= 1.5, computes  # a child's CPU


def test_ddlc_test_takes_a_test_times_file_that_exists_for_the_options_value(tmp_path):
    """./ddlc test --test-times FILE, FILE already there and no path to test:
    FILE is the option's value, the suite runs from its own project's
    settings (testpaths) and FILE gains a line. Before, pytest took FILE for
    a path to test and stopped ("unrecognized arguments: --test-times").
    The real ddlc, in a project of one test; its set-up is not what is
    checked here, so that project's envs/setup.sh does nothing."""
    project = tmp_path / "project"
    (project / "envs").mkdir(parents=True)
    (project / "tests").mkdir()
    shutil.copy2(REPO / "ddlc", project / "ddlc")
    (project / "envs" / "setup.sh").write_text("exit 0\n")
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    (project / "tests" / "conftest.py").write_text(HOOKS)
    (project / "tests" / "test_one.py").write_text("def test_one(): pass\n")
    times = tmp_path / "times.tsv"
    times.write_text("an earlier line\n")
    out = subprocess.run(
        [str(project / "ddlc"), "test", "-n", "0", "-p", "no:cacheprovider",
         "--test-times", str(times)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "DDLC_VENV": str(Path(sys.executable).parent.parent),
             "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    lines = times.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == "an earlier line", lines
    assert lines[1].startswith("tests/test_one.py::test_one\t"), lines


# A process that holds the lock as a scheduler module's fixture does, until
# told (a line on its input).
HOLDER = """
import sys
from pathlib import Path
from conftest import held_alone
say = lambda text: print(text, file=sys.stderr, flush=True)
with held_alone(Path(sys.argv[1]), sys.argv[2], say):
    print("held", flush=True)
    sys.stdin.readline()
"""


def holder(lock: Path) -> subprocess.Popen:
    script = lock.with_name("holder.py")
    script.write_text(HOLDER)
    return subprocess.Popen(
        [sys.executable, str(script), str(lock), SCHEDULERS],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])},
    )  # fmt: skip


def line_within(stream, seconds: float) -> str | None:
    """The stream's next line, or None if none comes within ``seconds``."""
    ready, _, _ = select.select([stream], [], [], seconds)
    return stream.readline() if ready else None


def test_a_second_suite_waits_for_the_test_schedulers_and_says_for_whom(tmp_path):
    """Two checkouts' suites at once: the second's scheduler tests wait
    until the first's let the schedulers go, and say whose they wait for;
    then they have them."""
    lock = tmp_path / "schedulers.lock"
    first = holder(lock)
    second = None
    try:
        assert line_within(first.stdout, 60) == "held\n", first.stderr.read()
        second = holder(lock)
        said = line_within(second.stderr, 60)
        assert said and said.startswith(f"waiting for {SCHEDULERS}: {lock} is held by "), said
        assert f"pid {first.pid} exclusive" in said, said  # the kernel's word
        # its own words: its checkout, and its xdist worker where it runs in one
        assert re.search(rf"pid {first.pid}: the tests of {re.escape(str(REPO))}"
                         r"( \(worker gw\d+\))?, since ", said), said  # fmt: skip
        assert line_within(second.stdout, 3) is None  # still waiting
        first.communicate("\n", timeout=30)
        assert line_within(second.stdout, 30) == "held\n"
        assert "ours after " in second.stderr.readline()
        second.communicate("\n", timeout=30)
        assert second.returncode == 0 and first.returncode == 0
    finally:
        for proc in (first, second):
            if proc and proc.poll() is None:
                proc.kill()
    # What the last holder left says whose it was, for the next to wait.
    assert lock.read_text().startswith(f"pid {second.pid}: the tests of {REPO}")
