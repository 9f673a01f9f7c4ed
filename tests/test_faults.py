"""Real faults, injected: a rank killed mid-epoch, Snakemake killed mid-run.
Expected: runs lost 0, hangs 0, tracebacks 0."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import (
    REPO,
    RUNS_ONLY,
    needs_environment,
    snakemake_cmd,
    tiny_design,
    write_design,
)
from ddlcompare.plan import design
from test_workflow import done_markers, snakemake

# How long a run may take to start training: it waits for the host-wide
# measuring lock while another campaign (another checkout's tests too)
# trains on this machine.
START_S = 600
# Runs long enough to be stopped mid-way: 30 epochs of 20,000 images (313
# steps an epoch on 2 ranks). Evaluated on 1,000 test images, as the tiny
# designs are: the whole test set took seconds an epoch, which the runs that
# finish (the reruns) and the hang watch (10 times the slowest epoch) waited for.
LONG = {
    "epochs": 30,
    "max_steps": None,
    "train_images": 20000,
    "test_images": 1000,
    "timeout_s": 300,
}


def rank_pids(folder: Path) -> list[int]:
    """The training ranks themselves (not torchrun, horovodrun or shell
    wrappers), in any of the frameworks' Pythons (Tarantella's starts
    "python -m ..." through its generated script)."""
    return pids_of(f"^[^ ]*python[0-9.]* (-u )?{re.escape(f'-m frameworks.worker {folder}')}")


def pids_of(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def run_one(design_file: Path, results, row) -> list[str]:
    """The command of one run, as a workflow job starts it."""
    return [
        sys.executable,
        "-m",
        "front.cli",
        "run-one",
        "--design",
        str(design_file),
        "--results",
        str(results),
        "--path",
        row.path,
    ]


def wait_for(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


@pytest.mark.slow
@pytest.mark.parametrize(
    "framework",
    [
        "torch-ddp",
        "horovod-torch",
        pytest.param(
            "tarantella",
            marks=needs_environment("tarantella", "tarantella"),
        ),
    ],
)
def test_rank_killed_mid_epoch_is_a_failed_run(tmp_path, framework):
    doc = tiny_design([framework], **LONG)
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    folder = tmp_path / "res" / row.path
    proc = subprocess.Popen(
        run_one(path, str(tmp_path / "res"), row), cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: len(rank_pids(folder)) == 2, START_S)
        time.sleep(3)  # well into the first epoch
        victim = max(rank_pids(folder))  # one of the two ranks
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.terminate()  # the runner stops its launcher's process group
            proc.wait(timeout=30)
    assert "Traceback" not in proc.stderr.read()
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "failed" and done["exit_status"] != 0, done
    assert re.fullmatch(
        r"exit status \d+: rank [01] killed by SIGKILL \(signal 9\)", done["reason"]
    ), done
    assert not (folder / "metrics.json").exists()
    assert json.loads((folder / "run.json").read_text())["status"] == "failed"
    assert wait_for(lambda: not pids_of(f"frameworks.worker {folder}"), 30)  # no orphans


@pytest.mark.slow
def test_snakemake_killed_mid_run_then_rerun_loses_nothing(tmp_path):
    # Short runs: the first need only finish, and the second is interrupted
    # as soon as its worker starts (torch's import alone takes seconds); the
    # rerun trains it whole (3 epochs of 6,000 images were 4.5 times the steps).
    doc = tiny_design(procs=(1, 2), **{**LONG, "epochs": 2, "train_images": 2000})
    write_design(tmp_path, doc)
    cmd = snakemake_cmd(tmp_path, *RUNS_ONLY)  # the runs are what it checks
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    # Let the first run finish and the second start, then interrupt.
    wait_for(lambda: len(done_markers(tmp_path)) >= 1, START_S)
    wait_for(lambda: pids_of(f"frameworks.worker {tmp_path}") != [], START_S)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    first = done_markers(tmp_path)
    assert len(first) == 1
    assert wait_for(lambda: not pids_of(f"frameworks.worker {tmp_path}"), 30)  # no orphans
    again = snakemake(tmp_path, *RUNS_ONLY)
    assert again.returncode == 0, again.stderr[-3000:]
    final = done_markers(tmp_path)
    assert len(final) == 2
    assert all(final[p] == t for p, t in first.items())  # the finished run was kept
    statuses = [json.loads(Path(p).read_text())["status"] for p in final]
    assert statuses == ["ok", "ok"]


def attempt_processes(workdir: Path) -> list[int]:
    """Everything a run of this test's design may leave running."""
    return pids_of(f"frameworks.worker {workdir}") + pids_of(f"run-one --design {workdir}")


@pytest.mark.slow
def test_snakemake_sigkilled_then_unlocked_and_rerun_trains_once(tmp_path):
    """SIGKILL reaches Snakemake alone: its job's runner sees the workflow
    gone, stops the training and records the attempt interrupted. After
    --unlock (what Snakemake suggests) the rerun trains alone; the
    interrupted attempt is kept under attempts/. Two epochs of 94 steps:
    the run must outlive the 2 s before the kill by far; the rerun trains
    it whole."""
    doc = tiny_design(**{**LONG, "epochs": 2, "train_images": 6000})
    path = write_design(tmp_path, doc)
    folder = tmp_path / "results" / design.parse(doc, str(path)).runs()[0].path
    proc = subprocess.Popen(
        snakemake_cmd(tmp_path, *RUNS_ONLY),  # the run is what it checks
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for(lambda: len(rank_pids(folder)) == 2, START_S)
    time.sleep(2)
    snakemake_itself = psutil.Process(proc.pid).children()[0]  # under timeout(1)
    snakemake_itself.kill()
    proc.wait(timeout=30)
    assert wait_for(lambda: not attempt_processes(tmp_path), 30)  # no orphan
    interrupted = json.loads((folder / "run.json").read_text())
    assert interrupted["status"] == "interrupted" and "Snakemake" in interrupted["reason"]
    assert not (folder / "done.json").exists() and not (folder / "metrics.json").exists()
    assert subprocess.run(snakemake_cmd(tmp_path, "--unlock"), capture_output=True).returncode == 0
    again = subprocess.run(snakemake_cmd(tmp_path, *RUNS_ONLY), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "ok" and not record.get("overlap")
    kept = folder / "attempts" / "1"
    assert json.loads((kept / "run.json").read_text())["status"] == "interrupted"
    assert not (kept / "metrics.json").exists() and not (kept / "done.json").exists()
    assert [p.name for p in folder.glob("**/metrics.json")] == ["metrics.json"]
    assert not attempt_processes(tmp_path)


@pytest.mark.slow
def test_killed_runner_takes_its_workers_along_and_a_rerun_claims_the_folder(tmp_path):
    doc = tiny_design(**LONG)
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    folder = tmp_path / "res" / row.path
    runner_proc = subprocess.Popen(
        run_one(path, tmp_path / "res", row), cwd=REPO, stderr=subprocess.DEVNULL
    )
    wait_for(lambda: len(rank_pids(folder)) == 2, START_S)
    runner_proc.kill()  # the runner dies without a word
    runner_proc.wait()
    assert wait_for(lambda: not pids_of(f"frameworks.worker {folder}"), 20)
    assert not (folder / "metrics.json").exists() and not (folder / "done.json").exists()
    # Its owner.json names a pid that is gone: a new attempt may take the folder.
    from runfiles import ownership

    ownership.release(folder, ownership.claim(folder))


@pytest.mark.slow
def test_live_orphan_is_refused_then_killed_on_request(tmp_path):
    # A short run: the orphan is stopped as soon as its ranks start, and the
    # run after it trains whole (3 epochs of 6,000 images were 4.5 times the steps).
    doc = tiny_design(**{**LONG, "epochs": 2, "train_images": 2000})
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    folder = tmp_path / "results" / row.path
    orphan = subprocess.Popen(
        run_one(path, tmp_path / "results", row), cwd=REPO, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: len(rank_pids(folder)) == 2, START_S)
        # Hung, as orphans often are: it cannot finish while the test goes on.
        for pid in rank_pids(folder):
            os.kill(pid, signal.SIGSTOP)
        refused = subprocess.run(snakemake_cmd(tmp_path), capture_output=True, text=True)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert "an earlier attempt is still running" in refused.stderr
        assert f"kill {orphan.pid}" in refused.stderr or "kill_orphans=1" in refused.stderr
        assert orphan.poll() is None  # left alone
        direct = subprocess.run(
            run_one(path, tmp_path / "results", row), cwd=REPO, capture_output=True, text=True
        )
        assert direct.returncode == 2 and "an earlier attempt is still running" in direct.stderr
        done = subprocess.run(
            snakemake_cmd(tmp_path, "kill_orphans=1", *RUNS_ONLY), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert orphan.wait(timeout=30) != 0
    finally:
        if orphan.poll() is None:
            orphan.kill()
    assert json.loads((folder / "done.json").read_text())["status"] == "ok"
    assert list((folder / "attempts").iterdir())  # the orphan's attempt kept


@contextlib.contextmanager
def small_filesystem(folder: Path, size: str):
    """A real filesystem of ``size`` (tmpfs; needs root)."""
    folder.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True,
        ).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder: Path, leave: int = 0) -> None:
    """Fill the filesystem of ``folder`` until ``leave`` bytes are free."""
    with open(folder / "filler", "ab") as f:
        block = b"\0" * (64 << 10)
        while shutil.disk_usage(folder).free > leave + len(block):
            try:
                f.write(block)
                f.flush()
            except OSError:
                break


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*tmp*") if p.is_file()]


@pytest.mark.slow
def test_a_full_disk_is_named_before_the_run(tmp_path):
    doc = tiny_design()
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    with small_filesystem(tmp_path / "fs", "4m") as fs:
        fill(fs, leave=1 << 20)
        out = subprocess.run(
            run_one(path, str(fs / "res"), row),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        folder = fs / "res" / row.path
        assert "Traceback" not in out.stderr
        assert f"No space left on {fs} for {folder} (needs about" in out.stderr
        done = json.loads((folder / "done.json").read_text())
        assert done["status"] == "failed" and "No space left" in done["reason"]
        assert not (folder / "train.log").exists()  # nothing started
        assert temporaries(fs) == []


@pytest.mark.parametrize("leave", [0, 1 << 20], ids=["full", "1 MB left"])
def test_a_full_temporary_folder_is_named_before_any_job(tmp_path, leave):
    """Snakemake's scheduler writes its problem to TMPDIR: a full one is named,
    with the room it needs, before the workflow starts (no traceback, no run)."""
    write_design(tmp_path, tiny_design())
    with small_filesystem(tmp_path / "tmp", "4m") as tmp:
        fill(tmp, leave)
        out = subprocess.run(
            snakemake_cmd(tmp_path),
            env={**os.environ, "TMPDIR": str(tmp)},
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"for temporary files in {tmp} (" in out.stderr and "point TMPDIR at" in out.stderr
    assert not (tmp_path / "results").exists() or not list(
        (tmp_path / "results").rglob("train.log")
    )


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_ends_the_run_recorded(tmp_path):
    doc = tiny_design(**{**LONG, "epochs": 3, "train_images": 6000})  # fits the estimate
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    with small_filesystem(tmp_path / "fs", "12m") as fs:
        folder = fs / "res" / row.path
        proc = subprocess.Popen(
            run_one(path, str(fs / "res"), row), cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        try:
            wait_for(lambda: len(rank_pids(folder)) == 2, START_S)
            time.sleep(2)
            fill(fs)
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr
        record = json.loads((folder / "run.json").read_text())
        assert record["status"] == "failed", record
        assert "No space left" in record["reason"], record["reason"]
        assert temporaries(fs) == []
        assert wait_for(lambda: not pids_of(f"frameworks.worker {folder}"), 30)


STEPS_HEADER = "epoch\tstep\tstart_ns\tend_ns\n"
WHOLE_STEPS = STEPS_HEADER + "".join(
    f"1\t{s}\t{1000 * s + 100}\t{1000 * s + 900}\n" for s in range(5)
)


@pytest.mark.parametrize(
    "damage",
    [
        "\n".join(WHOLE_STEPS.splitlines()[:4]) + "\n1\t3\t31",  # cut mid-row by a full disk
        WHOLE_STEPS.replace("\t3900", "\t"),  # an empty field
        WHOLE_STEPS.replace("3100", "3x00"),  # not a number
        "epoch\tstep\n1\t0\n",  # columns missing
        "",  # nothing written
        "\x00\x00\x00" * 40,  # zeros: a file allocated but never written
    ],
)
def test_a_damaged_steps_file_leaves_no_measured_window(tmp_path, damage):
    """The machine-load summary reads the steps files a run left: damaged
    ones (a disk that filled mid-run cut a row short, whose missing fields
    read as None) give no window, never a traceback."""
    from ddlcompare.run import machine_load
    from runfiles.names import steps

    held = (0, 10**9)
    (tmp_path / steps(0)).write_text(WHOLE_STEPS)
    assert machine_load.measured_window(tmp_path, 1, 1, held) == (1100, 4900)
    (tmp_path / steps(0)).write_text(damage)
    assert machine_load.measured_window(tmp_path, 1, 1, held) is None


@pytest.mark.slow
def test_a_run_writes_only_inside_its_directory(tmp_path):
    from ddlcompare.run import runner

    before = set(
        subprocess.run(
            ["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True
        ).stdout.splitlines()
    )
    row = design.parse(tiny_design(), "tiny.yaml").runs()[0]
    runner.execute(row, tmp_path)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and all(str(p).startswith(str(tmp_path / row.path)) for p in written)
    after = set(
        subprocess.run(
            ["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True, text=True
        ).stdout.splitlines()
    )
    assert {line for line in after - before if "__pycache__" not in line} == set()


def one_rank_stopped(path: Path, row, results: Path, ready, env=None, limit: float = 180):
    """Run ``row``; once ``ready(run folder)``, stop its lowest rank
    (SIGSTOP) and wait for the runner to end the run within ``limit`` s:
    (run folder, its ranks, the stopped one)."""
    folder = results / row.path
    proc = subprocess.Popen(run_one(path, str(results), row), cwd=REPO, env=env)
    try:
        wait_for(lambda: ready(folder), START_S)
        time.sleep(2)  # into a step
        pids = rank_pids(folder)
        stopped, at = min(pids), time.monotonic()
        subprocess.run(["kill", "-STOP", str(stopped)], check=True)
        assert proc.wait(timeout=limit) == 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    assert time.monotonic() - at < limit
    return folder, pids, stopped


@pytest.mark.slow
# Alone on the machine: its 25-s timeout must find both ranks past start-up,
# which other runs' training beside it could stretch past that.
@pytest.mark.usefixtures("measuring_alone")
def test_rank_stuck_in_a_collective_is_killed_by_the_timeout(tmp_path):
    """One rank stopped (SIGSTOP): its peer waits in the all-reduce forever.
    The run's timeout ends both and records the run as failed by timeout,
    with where each rank waited (ddlcompare/run/stacks.py)."""
    doc = tiny_design(["torch-ddp"], **{**LONG, "timeout_s": 25})
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    folder, pids, stopped = one_rank_stopped(
        path, row, tmp_path / "res", lambda f: len(rank_pids(f)) == 2, limit=120
    )
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "failed" and done["reason"].startswith("timeout"), done
    assert done["reason"].endswith("(where each rank waited: stacks.txt)"), done
    assert wait_for(lambda: not rank_pids(folder), 30)
    # Where each rank was (wherever the stop caught it: start-up or a
    # step): the running peer, waiting for the lost one inside torch's C++
    # (Gloo's rendezvous or DDP's reducer), in native frames; the stopped
    # one, which py-spy cannot pause, in Python frames.
    parts = (folder / "stacks.txt").read_text().split("==== pid ")[1:]
    stacks = {int(part.split(":")[0]): part for part in parts}
    assert sorted(stacks) == sorted(pids), stacks
    peer = stacks[max(pids)]
    assert "(libtorch_cpu.so)" in peer and "main (frameworks/worker.py" in peer, peer
    assert "Python frames only, py-spy --nonblocking" in stacks[stopped]
    assert "main (frameworks/worker.py" in stacks[stopped]


def stopped_by_the_hang_watch(tmp_path, train_images: int, ready) -> tuple[Path, dict]:
    """A 30-epoch run, its timeout an hour away, whose lowest rank is stopped
    once ``ready(run folder)``; the hang watch's floor lowered to 5 s
    (DDLC_STALL_FLOOR_S). The run ends failed, with the ranks' stacks, and
    leaves no rank behind: (run folder, done marker)."""
    doc = tiny_design(["torch-ddp"], **{**LONG, "train_images": train_images, "timeout_s": None})
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    env = {**os.environ, "DDLC_STALL_FLOOR_S": "5"}
    folder, _, _ = one_rank_stopped(path, row, tmp_path / "res", ready, env=env)
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "failed", done
    assert done["reason"].endswith("; killed (where each rank waited: stacks.txt)"), done
    assert wait_for(lambda: not rank_pids(folder), 30)
    return folder, done


@pytest.mark.slow
def test_a_run_that_stops_between_epochs_is_stopped_long_before_its_timeout(tmp_path):
    """A rank stopped after the first epoch (as two Tarantella ranks waiting
    for each other's set-up stop): no epoch ends any more. The hang watch
    ends the run once the silence passes 10 times its slowest epoch, at
    least the floor."""
    _, done = stopped_by_the_hang_watch(
        tmp_path,
        2000,
        lambda f: (f / "epochs.tsv").exists(),  # the first epoch has ended
    )
    assert re.match(r"stalled: no epoch ended in \d+ s after epoch \d+ of 30 ", done["reason"]), (
        done
    )


@pytest.mark.slow
def test_a_run_that_stops_inside_its_first_epoch_is_stopped_long_before_its_timeout(tmp_path):
    """A rank stopped inside the first epoch, before epochs.tsv has a row
    (where both documented Tarantella hangs came): the ranks' heartbeats
    fall silent, and the hang watch ends the run once the silence passes
    the floor."""
    folder, done = stopped_by_the_hang_watch(
        tmp_path,
        20000,
        lambda f: any(f.glob("progress.rank*")) and not (f / "epochs.tsv").exists(),
    )
    assert not (folder / "epochs.tsv").exists()  # stopped inside the first epoch
    assert re.match(r"stalled: no step ended in \d+ s inside epoch 1 of 30 ", done["reason"]), done


SENTINEL_VALUES = [
    "$(touch {s})",
    "`touch {s}`",
    "x; touch {s}",
    "x' && touch '{s}",
    "x\ntouch {s}",
]


@pytest.mark.parametrize("template", SENTINEL_VALUES)
def test_hostile_values_execute_nothing(tmp_path, template):
    sentinel = tmp_path / "pwned"
    value = template.format(s=sentinel)
    for doc in (
        {"factors": {"framework": ["torch-ddp"], "dataset": [value]}},
        {"factors": {"framework": ["torch-ddp"]}, "fixed": {"data_dir": value}},
        {"name": value, "factors": {"framework": ["torch-ddp"]}},
    ):
        path = write_design(tmp_path, doc)
        out = subprocess.run(
            [sys.executable, "-m", "front.cli", "plan", "--design", str(path)],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 2 and "Traceback" not in out.stderr
        sm = snakemake(tmp_path, "-n")
        assert sm.returncode != 0 and "Traceback" not in sm.stderr
    assert not sentinel.exists()


@pytest.mark.slow
def test_hostile_data_dir_reaches_no_shell_at_run_time(tmp_path):
    from ddlcompare.run import runner

    sentinel = tmp_path / "pwned"
    row = design.parse(
        tiny_design(data_dir=f"$(touch {sentinel}); `touch {sentinel}`"), "t.yaml"
    ).runs()[0]
    runner.execute(row, tmp_path)
    done = json.loads((tmp_path / row.path / "done.json").read_text())
    assert done["status"] == "failed" and "DataError" in done["reason"]
    assert not sentinel.exists()


def test_unbuilt_environment_is_named(tmp_path):
    path = write_design(tmp_path, {"factors": {"framework": ["horovod-torch"]}})
    out = subprocess.run(
        [sys.executable, "-m", "front.cli", "plan", "--design", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "DDLC_VENV": str(tmp_path / "none")},
    )
    assert out.returncode == 2
    assert "framework horovod-torch: its environment 'torch' is not built here" in out.stderr
    assert "bash envs/setup.sh" in out.stderr and "Traceback" not in out.stderr


def test_missing_profile_is_a_clear_error(tmp_path):
    write_design(tmp_path, tiny_design())
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "snakemake"),
            "-s",
            str(REPO / "Snakefile"),
            "--profile",
            str(tmp_path / "no-profile"),
            "-d",
            str(tmp_path),
            "-n",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "no-profile" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "config,message",
    [
        ("design=", "design= is empty"),
        ("results=", "results= is empty"),
        ("results=design.yaml", "is a file, not a folder"),
        ("import_traces=nowhere.otf2", "import_traces: nowhere.otf2 not found"),
        (
            "desing=other.yaml",
            "--config desing: not a setting of the workflow; did you mean design=?",
        ),
        (
            "result=elsewhere",
            "--config result: not a setting of the workflow; did you mean results=?",
        ),
        ("allow_failures=maybe", "--config allow_failures=maybe: must be 1 or 0"),
        ("rerun_damaged=2", "--config rerun_damaged=2: must be 1 or 0"),
        ("des\u0456gn=d.yaml", "--config 'des\\u0456gn' (odd: U+0456 CYRILLIC SMALL LETTER"),
    ],
)
def test_bad_workflow_config_is_one_line(tmp_path, config, message):
    write_design(tmp_path, tiny_design())
    out = subprocess.run(
        snakemake_cmd(tmp_path, config, "-n"), capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("error:")] == [
        next(line for line in out.stderr.splitlines() if message in line)
    ]


@pytest.mark.parametrize("target", ["nowhere", "itself"])
def test_results_that_is_a_dangling_or_looping_link_is_one_line(tmp_path, target):
    """exists() is False on a link to nowhere or to itself: results= passed
    the dry run, and the first job failed to make the folder."""
    write_design(tmp_path, tiny_design())
    (tmp_path / "res").symlink_to("gone" if target == "nowhere" else "res")
    out = subprocess.run(
        snakemake_cmd(tmp_path, "results=res", "-n"), capture_output=True, text=True, cwd=tmp_path
    )
    said = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert said == [
        "error: results=res is a link to nowhere or to itself, not a folder; pass "
        "--config results=FOLDER (it is created if missing)"
    ]
    assert not (tmp_path / "gone").exists()


def guarded_rank(run_dir: Path, **env) -> subprocess.Popen:
    """ddlcompare/run/rank_guard.py over a real worker, as gaspi_run starts it."""
    return subprocess.Popen(
        [sys.executable, "-m", "ddlcompare.run.rank_guard", str(run_dir)],
        cwd=REPO,
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_guarded_rank_that_fails_is_recorded_for_the_runner(tmp_path):
    """A rank whose worker raises (here: its run folder has no config.json)
    leaves failed_rank.<rank>.json with its status, and says so on stderr
    in the form the runner reads."""
    guard = guarded_rank(tmp_path, GASPI_RANK="3")
    assert guard.wait(timeout=120) == 1
    record = json.loads((tmp_path / "failed_rank.3.json").read_text())
    assert record["rank"] == "3" and record["exit_status"] == 1 and record["signal"] is None
    assert f"rank guard: rank 3 (pid {record['pid']}) exited with status 1" in guard.stderr.read()


def test_a_guarded_rank_killed_by_a_signal_is_named_and_its_guard_asked_to_stop_is_not(tmp_path):
    killed, stopped = tmp_path / "killed", tmp_path / "stopped"
    for folder in (killed, stopped):
        folder.mkdir()
        os.mkfifo(folder / "config.json")  # the worker blocks reading it until killed
    guard = guarded_rank(killed, GASPI_RANK="1")
    child = wait_for(lambda: psutil.Process(guard.pid).children(), 30)[0]
    child.kill()
    assert guard.wait(timeout=60) == 128 + signal.SIGKILL
    record = json.loads((killed / "failed_rank.1.json").read_text())
    assert record["signal"] == signal.SIGKILL and record["exit_status"] == 137
    assert f"rank guard: rank 1 (pid {child.pid}) killed by signal 9" in guard.stderr.read()
    # The runner stopping a job (timeout, Ctrl-C) signals the guards too:
    # their ranks' ends are not failures of their own.
    guard = guarded_rank(stopped, GASPI_RANK="1")
    wait_for(lambda: psutil.Process(guard.pid).children(), 30)
    guard.terminate()
    guard.wait(timeout=60)
    assert not list(stopped.glob("failed_rank.*"))


@pytest.mark.slow
def test_rank_leaving_with_status_0_is_named_as_the_cause(tmp_path):
    """A rank that calls sys.exit(0) mid-training (injected: SIGUSR1 raises
    it, through a sitecustomize on PYTHONPATH) fails the run, and the reason
    names it, not its peer's "Connection reset by peer"."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import signal, sys\nsignal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))\n"
    )
    doc = tiny_design(**LONG)
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    folder = tmp_path / "res" / row.path
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(run_one(path, str(tmp_path / "res"), row), cwd=REPO, env=env)
    try:
        wait_for(lambda: len(rank_pids(folder)) == 2, START_S)
        time.sleep(4)
        os.kill(max(rank_pids(folder)), signal.SIGUSR1)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "failed"
    assert "EarlyExit: rank 1 exited with status 0 before its training finished" in done["reason"]


@pytest.mark.slow
def test_design_edited_mid_campaign_is_named(tmp_path):
    """The design is edited while the first run trains: that run finishes,
    and the next job names the edit (front/cli.py checks it at each job's
    start). The run need only outlive the edit, made as soon as its worker
    starts: 1 epoch of 2,000 images (2 of 6,000 were 25 s of measuring
    that the other tests' runs waited for)."""
    doc = tiny_design(procs=(1, 2), **{**LONG, "epochs": 1, "train_images": 2000})
    path = write_design(tmp_path, doc)
    proc = subprocess.Popen(
        snakemake_cmd(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: pids_of(f"frameworks.worker {tmp_path}") != [], START_S)
    write_design(tmp_path, {**doc, "fixed": {**doc["fixed"], "epochs": 2}})  # another design
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode != 0 and "Traceback" not in stderr
    assert "the design changed since this campaign started" in stderr
    assert "1 ok" in stderr  # the run under way finished
    assert path.exists()


@pytest.mark.slow
def test_every_run_failing_ends_with_a_summary_and_exit_1(tmp_path):
    doc = tiny_design(procs=(1, 2), train_images=100)
    doc["factors"]["batch_size"] = [4000]  # no step fits: each run fails at once
    write_design(tmp_path, doc)
    out = subprocess.run(snakemake_cmd(tmp_path), capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    report = next((tmp_path / "results").rglob("report.html")).resolve()
    assert f"2 failed: see {report}" in out.stderr
    # allow_failures=1 (exit 0 with failed runs): test_workflow's end-to-end test


@pytest.mark.slow
@pytest.mark.usefixtures("measuring_alone")
def test_two_campaigns_at_once_measure_one_after_the_other(tmp_path):
    """Two workflows, different results=, same machine: the host-wide
    measuring lock makes their training windows disjoint."""
    doc = tiny_design(procs=(2,), **{**LONG, "epochs": 1, "train_images": 6000})
    write_design(tmp_path, doc)
    procs = [
        subprocess.Popen(
            snakemake_cmd(tmp_path, f"results=r{i}", *RUNS_ONLY),  # their runs' windows
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (1, 2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    records = [json.loads(next((tmp_path / f"r{i}").rglob("run.json")).read_text()) for i in (1, 2)]
    assert [r["status"] for r in records] == ["ok", "ok"]
    (a0, a1), (b0, b1) = sorted(r["machine_held"] for r in records)
    assert a1 <= b0  # one after the other
    assert max(r["waited_for_machine_s"] for r in records) > 0


def test_a_harness_defect_at_launch_is_a_failed_run_not_a_lost_one(tmp_path, monkeypatch, capsys):
    """A defect of ours where the launch command is built (as a 2-node LBANN
    run once met: a TypeError) fails the run with its name, keeps the
    traceback in the log, and leaves the done marker; it does not escape."""
    from ddlcompare.run import launch, runner

    def defect(*args, **kwargs):
        raise TypeError("super(type, obj): obj must be an instance or subtype of type")

    monkeypatch.setattr(launch, "command", defect)
    row = design.parse(tiny_design(), "tiny.yaml").runs()[0]
    assert runner.execute(row, tmp_path) == 0
    done = json.loads((tmp_path / row.path / "done.json").read_text())
    assert done["status"] == "failed"
    assert "a defect of the harness (TypeError: super(type, obj)" in done["reason"]
    assert "Traceback" in capsys.readouterr().err  # kept for runner.log
