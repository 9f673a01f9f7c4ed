"""Failed runs are results: recorded with their reason and a done marker;
hung runs are killed; earlier attempts are kept."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, tiny_design, write_design
from ddlcompare.plan import design
from ddlcompare.run import runner


def row_of(doc):
    return design.parse(doc, "tiny.yaml").runs()[0]


@pytest.mark.slow
def test_failing_run_records_reason_and_done_marker(tmp_path):
    # 3000 images per process do not fill one step of batch_size 4000.
    doc = tiny_design(train_images=100)
    doc["factors"]["batch_size"] = [4000]
    row = row_of(doc)
    assert runner.execute(row, tmp_path) == 0
    done = json.loads((tmp_path / row.path / "done.json").read_text())
    assert done["status"] == "failed" and done["exit_status"] != 0
    assert "no step fits in an epoch" in done["reason"]
    assert not (tmp_path / row.path / "metrics.json").exists()


@pytest.mark.slow
def test_hung_run_is_killed_at_its_timeout(tmp_path):
    row = row_of(tiny_design(timeout_s=3, epochs=50, max_steps=None, train_images=None))
    start = time.monotonic()
    runner.execute(row, tmp_path)
    record = json.loads((tmp_path / row.path / "run.json").read_text())
    # the time waited for the machine (another campaign measuring) aside
    assert time.monotonic() - start - record["waited_for_machine_s"] < 30
    done = json.loads((tmp_path / row.path / "done.json").read_text())
    assert done["status"] == "failed" and done["reason"].startswith("timeout")
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / row.path)], capture_output=True)
    assert leftover.stdout == b""


@pytest.mark.slow
def test_interrupted_run_leaves_no_done_marker(tmp_path):
    doc = tiny_design(epochs=50, max_steps=None, train_images=None, timeout_s=300)
    path = write_design(tmp_path, doc)
    row = row_of(doc)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "front.cli",
            "run-one",
            "--design",
            str(path),
            "--results",
            str(tmp_path / "res"),
            "--path",
            row.path,
        ],
        cwd=REPO,
    )
    record = tmp_path / "res" / row.path / "train.log"
    for _ in range(100):
        if record.exists() and record.stat().st_size > 0:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    folder = tmp_path / "res" / row.path
    assert not (folder / "done.json").exists()
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
    leftover = subprocess.run(["pgrep", "-f", str(folder)], capture_output=True)
    assert leftover.stdout == b""


def test_archive_keeps_every_attempt(tmp_path):
    for attempt in (1, 2):
        (tmp_path / "done.json").write_text(json.dumps({"status": "failed", "n": attempt}))
        (tmp_path / "steps.rank0.tsv").write_text("x")
        runner.archive_attempt(tmp_path)
    assert sorted(os.listdir(tmp_path / "attempts")) == ["1", "2"]
    assert json.loads((tmp_path / "attempts" / "2" / "done.json").read_text())["n"] == 2
    assert not (tmp_path / "done.json").exists()


def test_failed_markers_are_queued_again_damaged_ones_named(tmp_path):
    rows = design.parse(tiny_design(procs=(1, 2, 4)), "tiny.yaml").runs()
    failed = '{"status": "failed", "exit_status": 1, "reason": "x", "run_id": "r"}'
    for row, text in zip(rows, [failed, "{trunc", '["a", "list"]']):
        (tmp_path / row.path).mkdir(parents=True)
        (tmp_path / row.path / "done.json").write_text(text)
    assert runner.failed_runs(rows, tmp_path) == rows[:1]
    damaged = dict((r.path, problem) for r, problem in runner.damaged_markers(rows, tmp_path))
    assert "done.json: not valid JSON" in damaged[rows[1].path]
    assert "done.json: the file: ['a', 'list'] is not of type 'object'" in damaged[rows[2].path]


def test_derived_timeout_grows_with_work():
    small = row_of(tiny_design(timeout_s=None)).config
    big = {**small, "epochs": 20, "train_images": None, "max_steps": None}
    assert 180 < runner.derived_timeout(small) < runner.derived_timeout(big)


def test_processes_left_behind_by_the_launcher_are_stopped(tmp_path):
    """gaspi_run-style: a rank started in the background outlives its launcher."""
    import os
    import psutil
    from runfiles import ownership

    marker = tmp_path / "pid"
    argv = ["sh", "-c", f"sleep 300 & echo $! > {marker}; exit 3"]
    token = ownership.claim(tmp_path)
    try:
        outcome = runner.Watch(tmp_path, token, timeout=60).run(argv, dict(os.environ))
    finally:
        ownership.release(tmp_path, token)
    assert outcome["exit_status"] == 3
    assert (
        not psutil.pid_exists(int(marker.read_text()))
        or psutil.Process(int(marker.read_text())).status() == psutil.STATUS_ZOMBIE
    )


LOST_NODE = "echo 'srun: error: Node failure on vm-n1' >&2; exit 1"
FINISHED = "echo '{\"final_loss\": 0.5}' > metrics.json; exit 0"


@pytest.mark.parametrize("launcher, status", [(LOST_NODE, "interrupted"), (FINISHED, "ok")])
def test_a_stop_signal_once_the_launcher_ended_waits_for_its_record(tmp_path, launcher, status):
    """A lost node: Slurm tells srun, which fails, and signals the runner a
    moment later. A stop signal that comes once the launcher has ended is
    kept until the outcome is recorded (its default action killed the runner
    between two records): a failure it came with is recorded as the stop (no
    done marker: the run is queued again), a run that finished stays ok."""
    from runfiles import ownership
    from runfiles.atomic import write_json

    row = row_of(tiny_design(tracer="none"))
    record = {"run_id": row.run_id, "config": row.config, "status": "running"}
    stops = runner.StopSignals()
    token = ownership.claim(tmp_path)
    try:
        with stops.caught():
            watch = runner.Watch(tmp_path, token, timeout=60, stops=stops)
            outcome = watch.run(["sh", "-c", f"cd {tmp_path}; {launcher}"], dict(os.environ))
            os.kill(os.getpid(), signal.SIGTERM)  # handled here: kept, nothing raised

            def save(name, doc):
                write_json(tmp_path / name, doc)

            code = runner.record_outcome(row, tmp_path, record, save, stops, outcome)
    finally:
        ownership.release(tmp_path, token)
    said = json.loads((tmp_path / "run.json").read_text())
    assert said["status"] == status, said.get("reason")
    if status == "interrupted":
        assert code == 128 + signal.SIGTERM and not (tmp_path / "done.json").exists()
        assert said["reason"] == (
            "stopped by SIGTERM as the launcher ended (exit status 1: srun: error: Node failure "
            "on vm-n1); the next workflow run starts it again"
        )
    else:
        assert code == 0 and json.loads((tmp_path / "done.json").read_text())["status"] == "ok"


# A runner as an attempt has it from its start to its launcher's end, in a
# process of its own for the test to kill: RUNNER FOLDER LAUNCHER_SHELL_LINE.
RUNNER = """
import os, sys
from pathlib import Path
from ddlcompare.run import runner
from runfiles import ownership
from runfiles.atomic import write_json
folder = Path(sys.argv[1])
token = ownership.claim(folder)
record = {"status": "running"}
def save(name, doc):
    write_json(folder / name, doc)
save("run.json", record)
stops = runner.stop_signals(record, save)
with stops.caught():
    watch = runner.Watch(folder, token, timeout=60, stops=stops)
    watch.run(["sh", "-c", f"cd {folder}; {sys.argv[2]}"], dict(os.environ))
"""
# A launcher that outlives SIGTERM for kill_tree's whole grace: srun waiting
# for its tasks on a lost node, ranks slow to end on a loaded machine.
STUBBORN = "trap '' TERM; echo $$ > launcher.pid; exec sleep 60"


def test_a_stop_is_recorded_before_the_launcher_is_stopped(tmp_path):
    """Slurm kills the runner outright KillWait after its SIGTERM (5 s on
    ./ddlc cluster), no longer than kill_tree's grace for the launcher: the
    stop is recorded as it comes. Here the runner is killed 2 s after its
    signal, still stopping a launcher that outlives SIGTERM: its record
    says interrupted, not running."""
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), STUBBORN], cwd=REPO)
    launcher = tmp_path / "launcher.pid"
    try:
        deadline = time.monotonic() + 60
        while not (launcher.exists() and launcher.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "no launcher started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert proc.poll() is None  # still within kill_tree's grace
    finally:
        proc.kill()
        proc.wait()
        if launcher.exists() and launcher.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(launcher.read_text()), signal.SIGKILL)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "interrupted", record
    assert record["reason"] == "stopped by SIGTERM; the next workflow run starts it again"


@pytest.mark.parametrize(
    "present", [["2"], ["1", "3"], ["notes", "7"], ["1", "2"]], ids=lambda p: "+".join(p)
)
def test_the_next_attempt_is_above_every_attempt_kept(tmp_path, present):
    for name in present:
        (tmp_path / "attempts" / name).mkdir(parents=True)
        (tmp_path / "attempts" / name / "kept").write_text(name)
    (tmp_path / "done.json").write_text("{}")
    runner.archive_attempt(tmp_path)
    numbers = [int(n) for n in present if n.isdigit()]
    assert (tmp_path / "attempts" / str(max(numbers) + 1) / "done.json").exists()
    assert all((tmp_path / "attempts" / n / "kept").read_text() == n for n in present)


def test_a_rank_killed_by_a_signal_is_named_with_it(tmp_path):
    """Our spawner (tf-workers), for real: its rank 1 is SIGKILLed; the
    reason names the rank and the signal, not the exception it led to."""
    from test_tf_launch import run_spawner

    worker = (
        "import json, os, signal, sys, time;"
        "rank = json.loads(os.environ['TF_CONFIG'])['task']['index'];"
        "rank == 1 and os.kill(os.getpid(), signal.SIGKILL);"
        "time.sleep(30)"
    )
    done = run_spawner(sys.executable, "-c", worker)
    log = tmp_path / "train.log"  # what the other ranks say after it
    log.write_text(done.stdout + done.stderr + "RuntimeError: the peer is gone\n")
    code = done.returncode
    assert code == 128 + signal.SIGKILL
    assert runner._last_error(log) == "rank 1 killed by SIGKILL (signal 9)"


LAUNCHER_SUMMARIES = {
    "torchrun": (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "Failures:\n  <NO_OTHER_FAILURES>\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-24_19:50:00\n"
        "  host      : node1\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 4242)\n"
        "  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 4242\n",
        "rank 1 killed by SIGKILL (signal 9)",
    ),
    "horovodrun": (
        "[0]<stderr>:RuntimeError: Gloo: connection closed by peer\n"
        "Process 1 exit with status code 137.\n"
        "Terminating remaining workers after failure of Process 1.\n"
        "Process 0 exit with status code 1.\n",
        "rank 1 killed by SIGKILL (signal 9)",
    ),
    "mpirun": (
        "[1,0]<stderr>:RuntimeError: connection reset\n"
        "mpirun noticed that process rank 1 with PID 4242 on node node2 exited on signal 15 "
        "(Terminated).\n",
        "rank 1 on node2 killed by SIGTERM (signal 15)",
    ),
}


@pytest.mark.parametrize("launcher", LAUNCHER_SUMMARIES)
def test_each_launchers_word_for_a_killed_rank_is_read(tmp_path, launcher):
    """Each launcher's summary as it prints it (the real torchrun and Horovod
    runs are in test_faults: test_rank_killed_mid_epoch_is_a_failed_run)."""
    text, reason = LAUNCHER_SUMMARIES[launcher]
    (tmp_path / "train.log").write_text(text)
    assert runner._last_error(tmp_path / "train.log") == reason


def test_a_rank_a_tool_aborted_is_named_with_the_tools_words(tmp_path):
    """Score-P out of memory aborts the rank (SIGABRT): the reason gives the
    signal and Score-P's own line, which says what to change."""
    said = (
        "[Score-P] src/measurement/SCOREP_Memory.c:187: Error: No free memory page "
        "available: Out of memory. Please increase SCOREP_TOTAL_MEMORY=196608 and try again."
    )
    text, _ = LAUNCHER_SUMMARIES["torchrun"]
    (tmp_path / "train.log").write_text(said + "\n" + text.replace("-9", "-6"))
    assert (
        runner._last_error(tmp_path / "train.log")
        == (f"rank 1 killed by SIGABRT (signal 6) after {said}")[:400]
    )


def test_a_damaged_failed_rank_record_still_says_a_rank_failed(tmp_path):
    """A rank guard's record read back by the runner: damaged ones (cut
    short, not an object, a FIFO) are passed over for a sound one, and with
    none sound a rank still failed, its exit status unknown."""
    (tmp_path / "failed_rank.0.json").write_text('{"exit_status": ')
    (tmp_path / "failed_rank.1.json").write_text("[1]")
    os.mkfifo(tmp_path / "failed_rank.2.json")
    assert runner._first_rank_record(tmp_path) == {"exit_status": None}
    time.sleep(0.01)
    (tmp_path / "failed_rank.3.json").write_text('{"exit_status": -9, "rank": 3}')
    assert runner._first_rank_record(tmp_path) == {"exit_status": -9, "rank": 3}
