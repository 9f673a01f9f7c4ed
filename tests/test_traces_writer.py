"""Our OTF2 tracer: the archive otf2-print reads, what the converter gets
back from it, and real traced training runs of 2 processes."""

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import tiny_design
from ddlcompare.plan import design
from ddlcompare.run import runner
from frameworks import data, models
from traces import convert, readers
from frameworks.otf2_writer import PARTS_DIR, Otf2Sink, archive_anchor
from runfiles.phases import MARKERS, STEP_PHASES
from frameworks.recorder import PhaseRecorder
from traces.rules import PhaseRules

needs_otf2_print = pytest.mark.skipif(
    shutil.which("otf2-print") is None, reason="otf2-print (Debian otf2-tools) not installed"
)
LOOP = ("data_load", "forward", "backward", "grad_comm", "optimizer")


def otf2_print(anchor: Path) -> str:
    done = subprocess.run(["otf2-print", str(anchor)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def record_rank(run_dir: Path, rank: int, world: int, steps: int = 3) -> PhaseRecorder:
    phases = PhaseRecorder()
    with phases("init"):
        time.sleep(0.001)
    phases.attach([Otf2Sink(run_dir, rank, world, "run1")])
    for step in range(steps):
        phases.begin_step(1, step)
        for name in LOOP:
            with phases(name):
                if name == "backward":
                    now = time.perf_counter_ns()
                    phases.collective("allreduce", 4096, now, now + 10**6)  # overlaps
                    phases.collective("allreduce", 1024, now + 10, now + 2 * 10**6)
        phases.end_step()
    with phases("eval"):
        pass
    return phases


@needs_otf2_print
def test_archive_is_written_by_the_last_rank_and_read_back(tmp_path):
    recorders = [record_rank(tmp_path, rank, 2) for rank in (0, 1)]
    recorders[1].write(tmp_path, 1)
    assert not archive_anchor(tmp_path).exists()  # rank 0 has not finished
    recorders[0].write(tmp_path, 0)
    anchor = archive_anchor(tmp_path)
    assert anchor.exists() and not (tmp_path / PARTS_DIR).exists()
    listing = otf2_print(anchor)
    enters = len(re.findall(r"^ENTER ", listing, re.M))
    # per rank: init + eval + 3 steps of (step + 5 phases) + 6 collectives
    assert enters == 2 * (2 + 3 * 6 + 6)
    assert len(re.findall(r"^MPI_COLLECTIVE_END .*Sent: 4096", listing, re.M)) == 6
    table, problems = readers.read(anchor, PhaseRules(), "run1")
    df = table.to_pandas()
    assert problems == [] and len(df) == enters
    assert sorted(df["rank"].unique()) == [0, 1]
    steps = pd.read_csv(tmp_path / "steps.rank0.tsv", sep="\t")
    mine = df[(df["rank"] == 0) & (df["phase"] == "step")].sort_values("step")
    # durations survive exactly (the archive's clock is in nanoseconds)
    assert list(mine["dur_ns"]) == list(steps["end_ns"] - steps["start_ns"])
    comm = df[df["collective"] == "allreduce"]
    assert len(comm) == 12 and set(comm["phase"]) == {"grad_comm"}
    assert comm["step"].notna().all() and set(comm["epoch"]) == {1}
    outside = df[df["phase"].isin(["init", "eval"])]
    assert outside["step"].isna().all()


def test_tracing_off_attaches_nothing(tmp_path):
    from frameworks import tracing

    phases = PhaseRecorder()
    tracing.attach(phases, {"tracer": "none"}, tmp_path, 0, 1)
    assert phases.sinks == [] and phases.live == []


def test_scorep_phases_are_user_regions_the_rules_map_back():
    rules = PhaseRules()
    for phase in (*STEP_PHASES, "init", "eval"):
        assert rules.match(f"user:{phase}", "otf2")[0] == phase
    for marker in MARKERS:  # the regions around a step and an epoch
        assert rules.match(f"user:{marker}", "otf2")[0] == marker


def traced_run(tmp_path, framework, **fixed):
    row = design.parse(tiny_design([framework], tracer="otf2", **fixed), "tiny.yaml").runs()[0]
    assert runner.execute(row, tmp_path) == 0
    folder = tmp_path / row.path
    done = json.loads((folder / "done.json").read_text())
    assert done["status"] == "ok", (folder / "train.log").read_text()[-3000:]
    return folder, row


def check_steps(df: pd.DataFrame, folder: Path, ranks=(0, 1)) -> None:
    """Every rank, every step: the loop's phases in order, inside the step."""
    ours = df[df["location"].str.endswith("Master thread")]
    for rank in ranks:
        mine = ours[ours["rank"] == rank]
        steps = mine[mine["phase"] == "step"].set_index("step")
        expected = pd.read_csv(folder / f"steps.rank{rank}.tsv", sep="\t")
        assert sorted(steps.index) == list(expected["step"])
        for number, rows in mine[mine["phase"] != "step"].groupby("step"):
            rows = rows.sort_values("start_ns")
            assert tuple(rows["phase"]) == LOOP
            wall = steps.loc[number]
            assert (rows["start_ns"] >= wall["start_ns"]).all()
            assert (rows["end_ns"] <= wall["end_ns"]).all()
            assert rows["dur_ns"].sum() <= wall["dur_ns"]


@needs_otf2_print
@pytest.mark.slow
def test_traced_ddp_run(tmp_path, tiny_trained):
    results, plan = tiny_trained  # tiny_design()'s run is traced with otf2, the default
    row = plan.runs()[0]
    shutil.copytree(results, tmp_path / "r")
    folder = tmp_path / "r" / row.path
    anchor = folder / "trace" / "traces.otf2"
    listing = otf2_print(anchor)
    out = folder / "phases.parquet"
    assert convert.main([str(folder), "-o", str(out)]) == 0
    df = pd.read_parquet(out)
    assert set(df["run_id"]) == {row.run_id}
    assert len(df) == len(re.findall(r"^LEAVE ", listing, re.M))
    check_steps(df, folder)
    # each gradient bucket's all-reduce, from DDP's communication hook: per
    # rank and step, the buckets add up to the model's gradient bytes
    info = data.DATASETS["fashion-mnist"]
    params = sum(
        r["params"] for r in models.layer_shapes(models.MODELS["cnn"], info.shape, info.classes)
    )
    comm = df[df["collective"] == "allreduce"]
    per_step = comm.groupby(["rank", "step"])["bytes"].sum()
    assert len(per_step) == 2 * 24 and (per_step == params * 4).all()
    assert set(comm["phase"]) == {"grad_comm"}


@needs_otf2_print
@pytest.mark.slow
def test_traced_horovod_run_with_timeline_and_profiler(tmp_path):
    folder, row = traced_run(tmp_path, "horovod-torch", horovod_timeline=True, torch_profiler=True)
    otf2_print(folder / "trace" / "traces.otf2")
    out = folder / "phases.parquet"
    assert convert.main([str(folder), "-o", str(out)]) == 0
    df = pd.read_parquet(out)
    check_steps(df[df["source"] == "otf2"], folder)
    timeline = df[df["source"] == "horovod_timeline"]
    allreduce = timeline[timeline["region"] == "ALLREDUCE"]
    assert len(allreduce) and allreduce["bytes"].gt(0).all()
    kineto = df[df["source"] == "kineto"]
    assert sorted(kineto["rank"].unique()) == [0, 1]
    for rank in (0, 1):
        mine = kineto[kineto["rank"] == rank]
        # our steps and phases as profiler annotations; operators inside take their phase
        assert sorted(mine.loc[mine["phase"] == "step", "step"]) == list(range(24))
        assert set(LOOP) <= set(mine.loc[mine["region"].isin(LOOP), "phase"])
        convs = mine[mine["region"] == "aten::conv2d"]
        assert set(convs["phase"]) <= {"forward", "eval"}
