"""How far a design is and how long the rest takes: `ddlc plan` on a results
folder where some runs have finished (real run records, as the runner
writes them)."""

import json
import os
import subprocess
import sys

from conftest import REPO, ddlc, tiny_design, write_design
from ddlcompare.plan import design
from ddlcompare.run import progress


def finish(results, row, start, end, waited=0.0):
    folder = results / row.path
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(
        json.dumps(
            {
                "run_id": row.run_id,
                "status": "ok",
                "start": f"2026-11-27T10:{start // 60:02d}:{start % 60:02d}+0000",
                "end": f"2026-11-27T10:{end // 60:02d}:{end % 60:02d}+0000",
                "waited_for_machine_s": waited,
            }
        )
    )
    marker = {"status": "ok", "exit_status": 0, "reason": None, "run_id": row.run_id}
    (folder / "done.json").write_text(json.dumps(marker))


def test_plan_counts_the_runs_done_and_estimates_the_rest(tmp_path):
    doc = {**tiny_design(["torch-ddp", "tarantella"], procs=(1, 2)), "replications": 3}
    path = write_design(tmp_path, doc)
    rows = design.load(str(path)).runs()
    cell = [r for r in rows if r.factors["framework"] == "torch-ddp"][0].path.rsplit("/rep~", 1)[0]
    rep1, rep2 = sorted((r for r in rows if r.path.startswith(cell + "/")), key=lambda r: r.rep)[:2]
    results = tmp_path / "results"
    finish(results, rep1, 0, 30)  # 30 s
    finish(results, rep2, 60, 120, waited=10)  # 50 s once its wait for the machine is left out
    out = ddlc("plan", "--no-check", "--design", str(path), "--results", str(results))
    assert out.returncode == 0, out.stderr
    # the cell's last run: its cell's median, 40 s; the other PyTorch cell's
    # three: their framework's, 40 s each; Tarantella's six: the first guess,
    # 10 s of start-up and 1.4 s per 1,000 images (768 and 1,536 images a
    # run); 1 s of Snakemake's per run, and the report's 40 s
    left = 40 + 3 * 40 + 3 * (20 + 1.4 * (0.768 + 1.536)) + 10 * 1 + 40
    assert round(left / 60) == 5
    assert out.stdout.splitlines()[-1] == (
        "2 of 12 runs done, 10 to do: about 5 min left, the report included (1 from earlier "
        "runs of their cells, 3 from their framework's timed runs, 6 from a first guess per "
        "framework)"
    )
    summary = ddlc(
        "plan", "--no-check", "--summary", "--design", str(path), "--results", str(results)
    )
    assert summary.stdout == out.stdout.splitlines()[-1] + "\n"
    empty = ddlc(
        "plan",
        "--no-check",
        "--summary",
        "--design",
        str(path),
        "--results",
        str(tmp_path / "none"),
    )
    assert empty.stdout.startswith("0 of 12 runs done, 12 to do: about ")


def test_a_run_record_that_is_no_record_is_not_timed(tmp_path):
    """A run.json that is a FIFO (it would hang the reader), a JSON list or
    not JSON: the run counts as not timed, and `ddlc plan` still answers."""
    path = write_design(tmp_path, tiny_design(["torch-ddp"], procs=(1,)))
    [row] = design.load(str(path)).runs()
    cell = tmp_path / "results" / row.path.rsplit("/rep~", 1)[0]
    for rep, make in enumerate(
        [lambda p: os.mkfifo(p), lambda p: p.write_text("[1, 2]"), lambda p: p.write_text("{")],
        start=1,
    ):
        (cell / f"rep~{rep}").mkdir(parents=True)
        make(cell / f"rep~{rep}" / "run.json")
    out = subprocess.run(
        [sys.executable, "-m", "front.cli", "plan", "--no-check", "--summary"]
        + ["--design", str(path), "--results", str(tmp_path / "results")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith("0 of 1 runs done, 1 to do: about "), out.stdout
    assert "from a first guess per framework" in out.stdout


def test_plan_counts_a_damaged_done_marker_as_done_and_says_so(tmp_path):
    """A done.json that is empty, not JSON, or a folder: the workflow will
    not run it again (its output is there), so plan counts it done, and
    says how many such markers there are and what remedies them."""
    doc = {**tiny_design(["torch-ddp"], procs=(1,)), "replications": 4}
    path = write_design(tmp_path, doc)
    rows = sorted(design.load(str(path)).runs(), key=lambda r: r.rep)
    results = tmp_path / "results"
    for row in rows:
        finish(results, row, 0, 30)
    (results / rows[0].path / "done.json").write_text("")
    (results / rows[1].path / "done.json").write_text("{")
    (results / rows[2].path / "done.json").unlink()
    (results / rows[2].path / "done.json").mkdir()
    out = ddlc("plan", "--no-check", "--summary", "--design", str(path), "--results", str(results))
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "4 of 4 runs done; none to do; 3 of the runs done have a damaged done.json "
        "(ddlc check says which; ddlc check --rerun runs them again)\n"
    )
    check = ddlc("check", "--design", str(path), "--results", str(results))
    said = check.stdout + check.stderr
    assert said.count(": done.json: ") == 3 and "Traceback" not in said, said
    assert "done.json: a folder, not a regular file" in said, said  # named by its path


def test_plan_prices_a_run_from_a_real_run_of_its_cell(tiny_trained, tmp_path):
    """The session's real run (its record as the runner wrote it): the plan of
    two replications counts it done and prices the second from it, with
    Snakemake's second and the report's time."""
    results, plan = tiny_trained
    [row] = plan.runs()
    timed = progress.timed_seconds(results / row.path)
    assert timed and timed > 0
    path = write_design(tmp_path, {**tiny_design(), "replications": 2})
    out = ddlc("plan", "--no-check", "--summary", "--design", str(path), "--results", str(results))
    assert out.returncode == 0, out.stderr
    left = progress.duration(timed + progress.BETWEEN_RUNS_S + progress.REPORT_S)
    assert out.stdout == (
        f"1 of 2 runs done, 1 to do: about {left} left, the report included "
        "(1 from earlier runs of their cells)\n"
    )


def test_a_wait_before_the_run_started_is_not_taken_off_its_time(tmp_path):
    """The recorded wait also counts what the job's shell waited before the
    runner started (workflows/share_machine.sh): a run of 18 s that held the
    machine 12 s after its start, having waited 33 s in all, took 18 - 12 s
    of its own, not none (as a run waiting behind three test workers did)."""
    record = {
        "start": "2026-11-27T10:00:00+0000",
        "end": "2026-11-27T10:00:18+0000",
        "waited_for_machine_s": 33.0,
    }
    start = 1795773600.0  # 2026-11-27T10:00:00Z
    (tmp_path / "run.json").write_text(
        json.dumps({**record, "machine_held": [start + 12, start + 17]})
    )
    assert progress.timed_seconds(tmp_path) == 6.0
    # a wait all inside the run is taken off whole; without a hold, as recorded
    (tmp_path / "run.json").write_text(
        json.dumps(
            {**record, "waited_for_machine_s": 4.0, "machine_held": [start + 12, start + 17]}
        )
    )
    assert progress.timed_seconds(tmp_path) == 14.0
    (tmp_path / "run.json").write_text(json.dumps({**record, "waited_for_machine_s": 4.0}))
    assert progress.timed_seconds(tmp_path) == 14.0
