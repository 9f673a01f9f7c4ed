"""Real faults, injected: a rank killed mid-epoch, Snakemake killed mid-run.
Expected: runs lost 0, hangs 0, tracebacks 0."""
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, tiny_design, write_design
from ddlcompare import design
from test_workflow import done_markers, snakemake

LONG = {"epochs": 30, "max_steps": None, "train_images": 20000, "timeout_s": 300}


def rank_pids(folder: Path) -> list[int]:
    """The training ranks themselves (not torchrun, horovodrun or shell wrappers)."""
    python, rest = re.escape(sys.executable), re.escape(f"-m frameworks.worker {folder}")
    return pids_of(f"^{python} (-u )?{rest}")


def pids_of(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_for(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch-ddp", "horovod-torch"])
def test_rank_killed_mid_epoch_is_a_failed_run(tmp_path, framework):
    doc = tiny_design([framework], **LONG)
    path = write_design(tmp_path, doc)
    row = design.parse(doc, str(path)).runs()[0]
    folder = tmp_path / "res" / row.path
    proc = subprocess.Popen([sys.executable, "-m", "ddlcompare.cli", "run-one", "--design",
                             str(path), "--results", str(tmp_path / "res"), "--path", row.path],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(rank_pids(folder)) == 2, 60)
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
    assert not (folder / "metrics.json").exists()
    assert json.loads((folder / "run.json").read_text())["status"] == "failed"
    assert wait_for(lambda: not pids_of(f"frameworks.worker {folder}"), 30)  # no orphans


@pytest.mark.slow
def test_snakemake_killed_mid_run_then_rerun_loses_nothing(tmp_path):
    doc = tiny_design(procs=(1, 2), **{**LONG, "epochs": 3, "train_images": 6000})
    write_design(tmp_path, doc)
    cmd = ["timeout", "-k", "10", "600", str(Path(sys.executable).parent / "snakemake"),
           "-s", str(REPO / "Snakefile"), "--profile", str(REPO / "profiles" / "local"),
           "-d", str(tmp_path), "--config", f"design={tmp_path / 'design.yaml'}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    # Let the first run finish and the second start, then interrupt.
    wait_for(lambda: len(done_markers(tmp_path)) >= 1, 180)
    wait_for(lambda: pids_of(f"frameworks.worker {tmp_path}") != [], 60)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    first = done_markers(tmp_path)
    assert len(first) == 1
    assert wait_for(lambda: not pids_of(f"frameworks.worker {tmp_path}"), 30)  # no orphans
    again = snakemake(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    final = done_markers(tmp_path)
    assert len(final) == 2
    assert all(final[p] == t for p, t in first.items())  # the finished run was kept
    statuses = [json.loads(Path(p).read_text())["status"] for p in final]
    assert statuses == ["ok", "ok"]


@pytest.mark.slow
def test_a_run_writes_only_inside_its_directory(tmp_path):
    from ddlcompare import runner
    before = set(subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO,
                                capture_output=True, text=True).stdout.splitlines())
    row = design.parse(tiny_design(), "tiny.yaml").runs()[0]
    runner.execute(row, tmp_path)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and all(str(p).startswith(str(tmp_path / row.path)) for p in written)
    after = set(subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO,
                               capture_output=True, text=True).stdout.splitlines())
    assert {line for line in after - before if "__pycache__" not in line} == set()
