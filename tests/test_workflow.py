"""The workflow end to end through snakemake on a tiny design: results
tables and report; only new runs execute; failed runs run again; lint."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, assert_alone_while_measuring, snakemake_cmd, tiny_design, write_design

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def snakemake(workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_cmd(workdir, *extra), capture_output=True, text=True)


def done_markers(workdir: Path) -> dict[str, float]:
    return {
        str(p): p.stat().st_mtime_ns
        for p in (workdir / "results").rglob("done.json")
        if "attempts" not in p.parts
    }


@pytest.mark.slow
@pytest.mark.usefixtures("measuring_alone")  # it checks that no job ran inside a measurement
def test_end_to_end_then_add_a_level_then_rerun_failures(tmp_path):
    doc = tiny_design(frameworks=("torch-ddp", "horovod-torch"))
    write_design(tmp_path, doc)
    first = snakemake(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert_alone_while_measuring(tmp_path, first.stdout + first.stderr)  # runs, probe, analysis
    report = next((tmp_path / "results").rglob("report.html"))
    assert f"report: {report.resolve()}" in first.stdout + first.stderr
    tables = report.parent / "tables"
    runs = pd.read_parquet(tables / "runs.parquet")
    assert list(runs["status"]) == ["ok", "ok"]
    assert (runs["images_per_s"] > 0).all() and (runs["global_batch"] == 64).all()
    assert len(pd.read_parquet(tables / "epochs.parquet")) == 4
    assert len(pd.read_parquet(tables / "step_stats.parquet")) == 4
    page = report.read_text()
    # throughput, step times, phases, timeline, accuracy, critical path; one
    # scale: speedup and its waterfall say so in a line
    assert page.count("data:image/png;base64,") == 6 and "2 of 2 runs ok" in page
    assert "scaling: every framework ran at one scale only" in page
    before = done_markers(tmp_path)

    # A new level that cannot train (no step fits): it fails, the others are
    # untouched, and the report lists the failure.
    doc["factors"]["batch_size"] = [32, 4000]
    write_design(tmp_path, doc)
    plan = snakemake(tmp_path, "-n")
    assert "run                     2" in plan.stdout or "\nrun " in plan.stdout
    second = snakemake(tmp_path)
    assert second.returncode == 1, second.stderr[-3000:]  # a run failed: said, and exit 1
    assert f"2 ok, 2 failed: see {report}" in second.stderr
    after = done_markers(tmp_path)
    assert all(after[p] == t for p, t in before.items())  # finished runs not redone
    assert len(after) == 4
    runs = pd.read_parquet(tables / "runs.parquet")
    assert sorted(runs["status"]) == ["failed", "failed", "ok", "ok"]
    assert "no step fits in an epoch" in report.read_text()

    # Rerun: only the two failed runs run again; their first attempt is kept.
    third = snakemake(tmp_path, "allow_failures=1")
    assert third.returncode == 0
    assert "2 failed run(s) queued again" in third.stderr
    assert "2 ok, 2 failed" in third.stderr
    kept = list((tmp_path / "results").rglob("attempts/1/done.json"))
    assert len(kept) == 2 and len(done_markers(tmp_path)) == 4  # and they ran again
    assert json.loads(kept[0].read_text())["status"] == "failed"
    assert all(done_markers(tmp_path)[p] == t for p, t in before.items())


def test_bad_design_stops_snakemake_with_the_message(tmp_path):
    write_design(tmp_path, {"factors": {"framework": ["nope"]}})
    out = snakemake(tmp_path, "-n")
    assert out.returncode != 0
    assert "factors.framework: unknown value 'nope'" in out.stderr
    assert "Traceback" not in out.stderr


def test_snakemake_lint_is_clean(tmp_path):
    write_design(tmp_path, tiny_design())
    out = subprocess.run(
        [
            SNAKEMAKE,
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(tmp_path),
            "--config",
            f"design={tmp_path / 'design.yaml'}",
            "--lint",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_snakefile_asks_for_no_newer_snakemake_than_the_pinned_one():
    """``min_version`` in the Snakefile refuses an older Snakemake with one
    line; the pin in envs/torch.txt must satisfy it."""
    from packaging.version import Version

    stated = re.search(r'^min_version\("([^"]+)"\)', (REPO / "Snakefile").read_text(), re.M)
    pinned = re.search(r"^snakemake==(\S+)", (REPO / "envs" / "torch.txt").read_text(), re.M)
    assert stated and pinned
    assert Version(stated[1]) <= Version(pinned[1])


@pytest.mark.slow
def test_runs_execute_in_the_designs_shuffled_order(tmp_path):
    """Under the local profile, of the runs ready the one first in the
    design's randomized order starts first (the run rule's priority), not
    the workflow's own order: asked for in path order, the four real runs
    start (run.json's start) in the shuffle's order."""
    from ddlcompare.plan import design as design_mod

    doc = tiny_design(procs=(1,), epochs=1, max_steps=3, train_images=400, tracer="none")
    doc["factors"]["batch_size"] = [16, 32]
    doc.update(replications=2, randomize=True, seed=7)
    write_design(tmp_path, doc)
    rows = design_mod.load(str(tmp_path / "design.yaml")).runs()
    by_path = sorted(rows, key=lambda r: r.path)
    assert [r.path for r in rows] != [r.path for r in by_path]  # the shuffle differs
    targets = [f"results/{r.path}/done.json" for r in by_path]
    argv = snakemake_cmd(tmp_path, limit=1800)  # runs wait for the machine's lock
    at = argv.index("--config")  # targets before it: --config takes every word after it
    out = subprocess.run(argv[:at] + targets + argv[at:], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    starts = [
        json.loads((tmp_path / "results" / r.path / "run.json").read_text())["start"] for r in rows
    ]
    assert starts == sorted(starts), list(zip([r.order for r in rows], starts))
