"""A measurement has the machine to itself: workflow jobs hold the
host-wide lock shared and wait while a measurement holds it; the overlap
check knows training processes by their attempt, not by their command
line; a run measured beside a CPU hog is marked loaded."""

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, journal_lines, tiny_design, write_design
from ddlcompare.plan import design
from ddlcompare.run import machine_load, machine_lock
from runfiles import records
from front import workflow_support

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
# The measurements here hold the machine alone, as real runs do; the suite's
# own runs hold it shared (tests/conftest.py), tested at the end.
pytestmark = pytest.mark.usefixtures("measuring_alone")


def job(journal: Path, command: str, lock: Path, stderr=None) -> subprocess.Popen:
    """A workflow job as another invocation's Snakemake starts it: bash with
    the Snakefile's prefix (not part of this process's measurement)."""
    prefix = workflow_support.job_prefix(journal).replace("{{", "{").replace("}}", "}")
    env = {k: v for k, v in os.environ.items() if k != machine_lock.HELD_ENV}
    return subprocess.Popen(
        ["bash", "-c", prefix + command],
        env={**env, machine_lock.LOCK_ENV: str(lock)},
        cwd=REPO,
        stderr=stderr,
        text=True,
    )


def test_a_job_waits_while_a_measurement_holds_the_machine(tmp_path, monkeypatch):
    lock, journal = tmp_path / "lock", tmp_path / "jobs.log"
    monkeypatch.setenv(machine_lock.LOCK_ENV, str(lock))
    measure = (
        f"{sys.executable} -c 'from ddlcompare.run import machine_lock as m\n"
        f"with m.measuring(\"run\", print) as waited: print(waited)' > {tmp_path / 'out'}"
    )
    with machine_lock.measuring("test", lambda text: None):
        waiting = job(journal, measure, lock)
        # Held 3 s for a wait of at least 1.5 s: the job's shell starts its
        # wait once bash has started, which took over 0.2 s beside two test
        # suites (load 10), and failed the test with the hold at 1.5 s.
        time.sleep(3.0)
        assert waiting.poll() is None  # still waiting for the machine
        assert [mode for _, mode in machine_lock.holders(lock)] == ["exclusive"]
        released = time.time()
    assert waiting.wait(timeout=30) == 0
    [(start, end, command)] = journal_lines(journal)
    assert start >= released
    assert float((tmp_path / "out").read_text()) >= 1.5  # its shell's wait counts


def test_a_measuring_job_turns_its_own_hold_exclusive(tmp_path):
    """The job's shell holds the machine shared; the measurement in it takes
    that same hold exclusive (it does not wait for itself), other jobs wait
    for it, and the job holds it shared again afterwards."""
    lock, journal = tmp_path / "lock", tmp_path / "jobs.log"
    measure = (
        f"{sys.executable} -c 'import time; from ddlcompare.run import machine_lock as m\n"
        f"with m.measuring(\"probe\", print): print(\"held\", time.time(), flush=True); "
        f"time.sleep(2); print(\"releasing\", time.time(), flush=True)\ntime.sleep(1)'"
        f" > {tmp_path / 'out'}"
    )
    measuring = job(journal, measure, lock)
    out = tmp_path / "out"
    deadline = time.time() + 30
    while not (out.exists() and "held" in out.read_text()):
        assert time.time() < deadline and measuring.poll() is None
        time.sleep(0.1)
    other = job(journal, "true", lock)
    assert measuring.wait(timeout=30) == 0 and other.wait(timeout=30) == 0
    said = dict(line.split() for line in out.read_text().splitlines())
    [(other_start, _)] = [(a, b) for a, b, command in journal_lines(journal) if command == "true"]
    [(_, measuring_end)] = [(a, b) for a, b, command in journal_lines(journal) if command != "true"]
    # Stamped inside the hold: the other job cannot start before it (a stamp
    # taken after the release may come after the other job's start).
    assert other_start >= float(said["releasing"])  # waited for the measurement alone
    assert other_start < measuring_end  # not for the rest of the measuring job


def test_every_rule_must_run_through_the_shell_prefix(tmp_path):
    """A rule that runs Python in Snakemake (run:) would skip the shared
    hold: the workflow refuses it, naming the rule."""
    copy = tmp_path / "wf"
    shutil.copytree(REPO / "workflows", copy / "workflows")
    shutil.copy(REPO / "Snakefile", copy / "Snakefile")
    with open(copy / "workflows" / "analysis.smk", "a") as f:
        f.write('\n\nrule sneaky:\n    output:\n        "x"\n    run:\n        print("hi")\n')
    write_design(tmp_path, tiny_design())
    out = subprocess.run(
        [SNAKEMAKE, "-s", str(copy / "Snakefile"), "-d", str(tmp_path), "-n"]
        + ["--config", f"design={tmp_path / 'design.yaml'}"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode != 0
    assert "rule(s) sneaky: every job must be a shell: command" in out.stderr
    assert "Traceback" not in out.stderr


def busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` busy loops, each in a session of its own: the kernel shares CPU
    between sessions first (autogroup), so each loop gets a whole session's
    share and no other user's process, one of several in its session, takes
    more CPU than a loop does."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(n)
    ]


@pytest.mark.slow
def test_a_run_beside_a_cpu_hog_is_loaded_and_a_name_is_not_training(tmp_path):
    """While a run trains: processes that only name the worker module (a
    tail on its file, a sleeper with its module name in its arguments,
    started in the checkout) are not training; the run's own training is.
    The run, measured beside busy loops on every core, is ok but loaded,
    with the loops among the busiest foreign processes."""
    doc = tiny_design(procs=(1,), epochs=1, max_steps=100, train_images=12000, warmup_steps=2)
    write_design(tmp_path, doc)
    decoys = [
        subprocess.Popen(["tail", "-f", "frameworks/worker.py"], cwd=REPO),
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", "-m", "frameworks.worker"]
            + [str(tmp_path / "results")],
            cwd=REPO,
        ),
    ]
    seen: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.extend(machine_lock.other_training(tmp_path / "elsewhere", REPO))
            time.sleep(0.5)

    row = design.parse(doc, "tiny.yaml").runs()[0]
    run = subprocess.Popen(
        [sys.executable, "-m", "front.cli", "run-one", "--design"]
        + [str(tmp_path / "design.yaml"), "--results", str(tmp_path), "--path", row.path],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The hogs start once the run holds the machine: other measurements
    # on this host are not to be disturbed while it waits.
    while (run.pid, "exclusive") not in machine_lock.holders() and run.poll() is None:
        time.sleep(0.2)
    hogs = busy_loops(os.cpu_count() or 1)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        _, err = run.communicate(timeout=600)
    finally:
        stop.set()
        watcher.join()
        for p in hogs + decoys:
            p.kill()
            p.wait()
    assert run.returncode == 0, err[-3000:]
    record = json.loads((tmp_path / row.path / "run.json").read_text())
    assert record["status"] == "ok", record.get("reason")  # the decoys are not training
    # Of what names this test's folder or the checkout (where the decoys
    # are), only this run's training; another worker's runs may be seen too.
    mine = [s for s in seen if str(tmp_path.resolve()) in s or str(REPO) in s]
    assert mine and all(s.endswith(f"training {(tmp_path / row.path).resolve()}") for s in mine)
    load = record["machine_load"]
    assert load["window"] == "measured steps" and load["loaded"]
    assert load["foreign_cpu_share"] >= records.LOADED_SHARE
    busiest = {p["pid"] for p in load["busiest_foreign"]}
    assert busiest & {p.pid for p in hogs}, load


def test_what_a_measurement_starts_is_part_of_it(tmp_path):
    """A bench run under `machine_lock measure` holds the machine alone; the
    runs and workflow jobs it starts do not wait for their own ancestor."""
    lock, journal = tmp_path / "lock", tmp_path / "jobs.log"
    prefix = workflow_support.job_prefix(journal).replace("{{", "{").replace("}}", "}")
    inner = (
        f"{sys.executable} -c 'from ddlcompare.run import machine_lock as m\n"
        "with m.measuring(\"run\", print) as waited: print(waited)'"
    )
    bench = f"bash -c {shlex.quote(prefix + inner)}"
    out = subprocess.run(
        [sys.executable, "-m", "ddlcompare.run.machine_lock", "measure", "--", "bash", "-c", bench],
        env={**os.environ, machine_lock.LOCK_ENV: str(lock)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.0"]  # no wait for the bench's own hold
    assert len(journal_lines(journal)) == 1


def test_a_waiting_measurement_goes_before_jobs_that_come_later(tmp_path, monkeypatch):
    """Jobs under way finish first; a job that comes while a measurement
    waits starts after it: a stream of jobs cannot starve a measurement."""
    lock, journal = tmp_path / "lock", tmp_path / "jobs.log"
    monkeypatch.setenv(machine_lock.LOCK_ENV, str(lock))
    first = job(journal, "sleep 3", lock)
    while not machine_lock.holders(lock):  # the job holds the machine shared
        time.sleep(0.05)
    held = []

    def measure():
        with machine_lock.measuring("test", lambda text: None):
            held.append(time.time())
            time.sleep(1)
            held.append(time.time())

    measurer = threading.Thread(target=measure)
    measurer.start()
    time.sleep(1)
    later = job(journal, "true", lock)
    measurer.join(timeout=60)
    assert first.wait(timeout=30) == 0 and later.wait(timeout=30) == 0
    rows = {command: (start, end) for start, end, command in journal_lines(journal)}
    assert rows["sleep 3"][1] <= held[0]  # the job under way finished first
    assert rows["true"][0] >= held[1]  # the later one waited behind the measurement


# One thread each beside a sleeping main thread, so that neither waits for
# Python's lock: a thread polling in a loop, and one that sleeps between polls.
POLLING = """
import threading, time
def spin():
    while True:
        pass
def nap():
    while True:
        time.sleep(0.005)
threading.Thread(target={}, daemon=True).start()
time.sleep(60)
"""


def test_a_thread_that_never_blocks_is_found_spinning():
    """The meter's per-thread counters: a thread polling in a loop (never
    blocking, always runnable) is spinning; a thread that sleeps between
    polls is not, nor is a main thread, whatever it does."""
    procs = [
        subprocess.Popen([sys.executable, "-c", POLLING.format(target)], start_new_session=True)
        for target in ("spin", "nap")
    ]
    try:
        # Held alone, as the runs it meters are: beside the suite's other
        # trainings (load 8 on 2 cores) it once missed the spinning thread.
        with machine_lock.measuring("the spinning meter's test", lambda text: None):
            meter = machine_load.Meter(os.getpid(), procs[0].pid)
            time.sleep(0.5)  # their threads started
            meter.sample()
            start = time.perf_counter_ns()
            time.sleep(3)
            meter.sample()
            summary = meter.summary((start, time.perf_counter_ns()), "test")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    spinner, napper = (
        next(t for t in summary["threads"] if t["pid"] == p.pid and t["tid"] != p.pid)
        for p in procs
    )
    assert [(t["pid"], t["tid"]) for t in summary["spinning"]] == [
        (spinner["pid"], spinner["tid"])
    ], summary["threads"]
    assert spinner["cpu_share"] + spinner["wait_share"] >= machine_load.SPINNING_RUNNABLE
    assert spinner["blocks_per_s"] < machine_load.SPINNING_BLOCKS_PER_S
    assert napper["blocks_per_s"] > 50 and not napper["spinning"]
    others = summary["not_spinning"]
    assert 0 <= others["largest_wait_share"] <= others["wait_cores"]
    assert others["cpu_cores"] >= napper["cpu_share"]
    assert 0 <= others["wait_behind_spinning_cores"] <= others["wait_cores"]


def test_wait_is_blamed_on_what_was_runnable_beside_it():
    """Each thread's wait for a CPU is shared among its rivals by how long
    each was runnable: two threads runnable 0.6 of the window (half of it
    waiting) beside a spinning thread runnable all along and 0.4 cores of
    other processes: each waits 0.3 of which 1.0 / (1.0 + 0.6 + 0.4)."""
    rows = [
        {"cpu_share": 0.8, "wait_share": 0.2, "spinning": True},
        {"cpu_share": 0.3, "wait_share": 0.3, "spinning": False},
        {"cpu_share": 0.3, "wait_share": 0.3, "spinning": False},
    ]
    blamed = machine_load._wait_behind_spinning(rows, foreign_cores=0.4)
    assert blamed == pytest.approx(2 * 0.3 * 1.0 / 2.0)
    assert machine_load._wait_behind_spinning(rows[1:], foreign_cores=0.4) == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_foreign_load_is_counted_on_the_runs_own_cores():
    """A run confined to some cores (cores_per_node) is loaded by what runs on
    them, not by a process busy on another core: a loop pinned to one core
    takes that core's whole time, and only a share of the machine's."""
    busy, other = sorted(os.sched_getaffinity(0))[:2]
    # Not a child of this process, which the meters take for the run's runner.
    started = subprocess.run(
        ["sh", "-c", 'taskset --cpu-list "$0" "$1" -c "while True: pass" >/dev/null 2>&1 & echo $!',
         str(busy), sys.executable],
        capture_output=True, text=True, check=True, start_new_session=True,
    )  # fmt: skip
    loop = psutil.Process(int(started.stdout))
    try:
        meters = [
            machine_load.Meter(os.getpid(), os.getpid(), cpus) for cpus in ((busy,), (other,))
        ]
        time.sleep(0.5)
        for meter in meters:
            meter.sample()
        start = time.perf_counter_ns()
        time.sleep(3)
        for meter in meters:
            meter.sample()
        on_busy, on_other = (m.summary((start, time.perf_counter_ns()), "test") for m in meters)
    finally:
        loop.kill()
        loop.wait(timeout=10)
    assert (on_busy["cores"], on_busy["cpus"]) == (1, [busy])
    assert on_busy["foreign_cpu_share"] >= 0.9, on_busy  # the loop's core, all taken
    # The other core holds only what else this machine runs (all of it, on a busy one).
    assert on_other["foreign_cpu_share"] <= on_busy["foreign_cpu_share"] + 0.05


def test_a_scheduler_refusing_the_wait_is_said_even_from_the_turnstile(tmp_path, monkeypatch):
    """A job waiting at the turnstile (behind a measurement that waits for
    the machine) asks its scheduler to add the wait to its limit; where the
    scheduler refuses, the job's stderr says so with the scheduler's words
    (the turnstile's wait silences flock's errors, and it silenced this too).
    A stand-in oarwalltime: the test is of the job's shell, not of OAR."""
    lock, journal = tmp_path / "lock", tmp_path / "jobs.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    refusing = bin_dir / "oarwalltime"
    refusing.write_text("#!/bin/sh\necho 'walltime change refused for job 7' >&2\nexit 1\n")
    refusing.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("OAR_JOB_ID", "7")
    turnstile = open(machine_lock.turnstile(lock), "a")
    fcntl.flock(turnstile, fcntl.LOCK_EX)  # a measurement waits: later jobs queue
    waiting = job(journal, "true", lock, stderr=subprocess.PIPE)
    time.sleep(3)
    assert waiting.poll() is None
    turnstile.close()
    _, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    said = "warning: the scheduler did not add this job's wait for the machine to its time limit"
    assert said in err and "walltime change refused for job 7" in err, err


# A run that holds the machine as its environment says (shared or alone)
# until told to let go: it marks NAME.held once it holds it, and ends once
# NAME.go exists.
HOLDER = """
import sys, time
from pathlib import Path
from ddlcompare.run import machine_lock as m
name, folder = sys.argv[1], Path(sys.argv[2])
with m.measuring(name, lambda text: None):
    (folder / f"{name}.held").touch()
    while not (folder / f"{name}.go").exists():
        time.sleep(0.05)
"""


def test_runs_that_only_check_share_the_machine_but_never_a_measurement(tmp_path):
    """The suite's runs (DDLC_MACHINE_SHARED=1) hold the machine shared:
    two at once. A measurement waits for them; a shared run that comes
    while it waits goes after it (a stream of them cannot starve it), and
    waits while it measures. Real processes on a lock of their own."""
    lock = tmp_path / "lock"
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in (machine_lock.HELD_ENV, machine_lock.SHARED_ENV)
    }
    base[machine_lock.LOCK_ENV] = str(lock)
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, shared: bool) -> None:
        env = {**base, machine_lock.SHARED_ENV: "1"} if shared else base
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", HOLDER, name, str(tmp_path)], env=env, cwd=REPO
        )

    def held(name: str) -> bool:
        return (tmp_path / f"{name}.held").exists()

    def until(what: str, check, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds  # python's start under load: seconds
        while not check():
            assert time.monotonic() < deadline, f"not after {seconds} s: {what}"
            assert all(p.poll() is None for p in procs.values()), "a holder ended early"
            time.sleep(0.1)

    def let_go(name: str) -> None:
        (tmp_path / f"{name}.go").touch()
        assert procs.pop(name).wait(timeout=60) == 0

    try:
        start("first", shared=True)
        start("second", shared=True)
        until("two shared holders at once", lambda: held("first") and held("second"))
        assert sorted(mode for _, mode in machine_lock.holders(lock)) == ["shared", "shared"]
        start("measure", shared=False)
        turnstile = machine_lock.turnstile(lock)
        until(
            "the measurement waiting at the turnstile",
            lambda: "exclusive" in {m for _, m in machine_lock.holders(turnstile)},
        )
        start("later", shared=True)  # comes while the measurement waits
        time.sleep(3)
        assert not held("measure") and not held("later")
        let_go("first")
        time.sleep(2)
        assert not held("measure") and not held("later")  # "second" still holds it
        let_go("second")
        until("the measurement holding the machine", lambda: held("measure"))
        assert [mode for _, mode in machine_lock.holders(lock)] == ["exclusive"]
        time.sleep(3)
        assert not held("later")  # a shared run waits while a measurement holds it
        let_go("measure")
        until("the later shared run holding the machine", lambda: held("later"))
        let_go("later")
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
