"""A framework that reports only whole steps (Tarantella with
fit_step_phases: false, or any that owns its step) keeps every step's time
in every table the analysis builds: step tables, spread, phase breakdown,
critical path and merged timeline. Its tables are constructed in the phase
recorder's columns; the real Tarantella run's are in test_tarantella.py."""

import json

import pandas as pd
import pytest

from analysis import bottlenecks, collect, spread, timeline
from analysis import critical_path as cp
from runfiles import names
from runfiles.phases import PHASES

MS = 1_000_000
STEPS, WARMUP = 12, 2
# rank 1 is 10 ms slower every step; the ranks' steps end together (the
# all-reduce inside the step waits for the slower rank)
STEP_MS = {0: 40, 1: 50}


def whole_steps_run(folder, run_id="tnt1"):
    """Two ranks' step and interval tables as a whole-steps-only adapter
    leaves them (the phase recorder's columns): each step's time under
    ``other``, init and eval outside."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / names.CONFIG).write_text(json.dumps({"run_id": run_id}))
    origin = 1_700_000_000_000_000_000
    for rank in (0, 1):
        clock, steps = origin + 100 * MS, []
        for step in range(STEPS):
            start, end = clock + (STEP_MS[1] - STEP_MS[rank]) * MS, clock + STEP_MS[1] * MS
            durations = {f"{p}_ns": 0 for p in PHASES} | {"other_ns": end - start}
            steps.append({"epoch": 1, "step": step, "start_ns": start, "end_ns": end, **durations})
            clock = end
        pd.DataFrame(steps).assign(comm_bytes="").to_csv(
            folder / names.steps(rank), sep="\t", index=False
        )
        spans = [("init", 1, origin, origin + 100 * MS), ("eval", 1, clock, clock + 30 * MS)]
        pd.DataFrame(spans, columns=["phase", "epoch", "start_ns", "end_ns"]).to_csv(
            folder / names.intervals(rank), sep="\t", index=False
        )
    return folder


def runs_table(run_id="tnt1"):
    return pd.DataFrame(
        [
            {
                "run_id": run_id,
                "status": "ok",
                "framework": "tarantella",
                "world_size": 2,
                "batch_size": 32,
                "rep": 1,
                "warmup_steps": WARMUP,
                "images_per_s": 1000.0,
            }
        ]
    )


@pytest.fixture
def whole(tmp_path):
    folder = whole_steps_run(tmp_path / "run")
    return folder, collect.phase_intervals(folder, "tnt1"), runs_table()


def test_every_step_keeps_its_time_in_the_step_table(whole):
    folder, table, _ = whole
    steps = table[table["step"] >= 0]
    assert set(steps["phase"]) == {"other"}  # no empty phases pretending to be there
    assert len(steps) == 2 * STEPS
    recorded = sum(
        (t["end_ns"] - t["start_ns"]).sum()
        for t in (pd.read_csv(folder / names.steps(r), sep="\t") for r in (0, 1))
    )
    assert steps["dur_ns"].sum() == recorded
    assert set(table.loc[table["step"] < 0, "phase"]) == {"init", "eval"}


def test_spread_and_breakdown_show_whole_steps_never_zero(whole):
    _, table, runs = whole
    row = spread.table(runs, table).iloc[0]
    assert row["steps"] == 2 * (STEPS - WARMUP)
    assert row["step_median_s"] == pytest.approx(0.045)  # 40 and 50 ms
    assert row["step_slowest_s"] == pytest.approx(0.050)
    parts = bottlenecks.breakdown(table, runs, ["framework"]).set_index("phase")["mean"]
    assert parts["other"] == pytest.approx(0.045)
    assert parts.drop("other").sum() == 0


def test_the_critical_path_joins_at_the_whole_step(whole):
    _, table, runs = whole
    found = cp.analyse(table, runs)
    assert found.method == {"tnt1": "other"} and found.problems == {}
    row = cp.cell_table(found, runs).iloc[0]
    # each step rank 0 begins 10 ms after rank 1 (a gap outside its steps),
    # so rank 1 waits 10 ms at the join: 5 ms mean over the ranks
    assert row["waiting_ms_per_step"] == pytest.approx(5.0)
    assert row["main_cause"] == cp.UNTIMED and row["main_cause_rank"] == 0
    # the path covers the whole time: 50 ms a step (the tail is cut after the last)
    assert row["path_ms_per_step"] == pytest.approx(50.0, rel=0.03)
    assert pd.isna(row["communication_ms_per_step"])
    assert "not seen apart from the step" in row["finding"]
    assert "the whole step" in row["finding"]


def test_the_merged_timeline_holds_the_whole_steps(whole, tmp_path):
    folder, _, _ = whole
    info = timeline.export([folder], tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    slices = [e for e in events if e.get("ph") == "X" and e.get("name") == "other"]
    assert len(slices) == 2 * STEPS
    assert info["runs"]["tnt1"]["join"] == "other"


def test_a_run_without_step_phases_is_named_by_its_label(tmp_path):
    """The one line a section says instead: framework, processes, setting
    and replication, not the run's hash."""
    folder = whole_steps_run(tmp_path / "run")
    for rank in (0, 1):  # a run whose steps hold nothing at all
        steps = pd.read_csv(folder / names.steps(rank), sep="\t")
        steps["other_ns"] = 0
        steps.to_csv(folder / names.steps(rank), sep="\t", index=False)
    table = collect.phase_intervals(folder, "tnt1")
    text = cp.section(runs_table(), table).html()
    assert "tarantella, 2 processes, batch_size 32, rep 1: no critical path" in text
    assert "Run tnt1" not in text
