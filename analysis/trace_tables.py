"""What the converted traces hold, in the report: our runs' (collectives and
their bytes), the traces that could not be read, and any imported ones
(phase totals per trace)."""

from __future__ import annotations

import pandas as pd

from analysis import cells
from analysis.section import Section
from runfiles.tables import read_table
from runfiles.names import PHASE_TABLE
from runfiles.phases import MARKERS


def section(ctx) -> Section:
    runs, tables = ctx.runs, ctx.tables
    out = Section("traces", "Traces")
    ours = read_table(tables / PHASE_TABLE) if (tables / PHASE_TABLE).exists() else pd.DataFrame()
    if len(ours):
        info = runs.set_index("run_id")[[*cells.CELL, "tracer"]]
        coll = (
            ours[ours["collective"].notna()]
            .groupby("run_id")
            .agg(
                collectives=("collective", "count"),
                bytes=("bytes", "sum"),
                steps=("step", "nunique"),
                ranks=("rank", "nunique"),
            )
        )
        coll["MB_per_step_per_rank"] = coll["bytes"] / coll["steps"] / coll["ranks"] / 1e6
        held = ours.groupby("run_id").agg(
            intervals=("phase", "count"), sources=("source", lambda s: ", ".join(sorted(set(s))))
        )
        out.heading("Traces of these runs").para(
            "Intervals converted per run and the "
            "gradient collectives the trace records, with bytes where the framework "
            "exposes them."
        )
        out.table(info.join(held, how="inner").join(coll, how="left").reset_index())
    errors = (
        runs[runs.get("trace_errors", pd.Series(dtype=str)).notna()]
        if "trace_errors" in runs
        else pd.DataFrame()
    )
    if len(errors):
        out.heading("Unreadable traces").table(errors[["run_id", "trace_errors"]])
    imported = tables / "imported.parquet"
    if imported.exists():
        table = read_table(imported)
        totals = covered_seconds(table)
        counts = table.groupby(["run_id", "source"]).agg(
            ranks=("rank", "nunique"), intervals=("phase", "count")
        )
        out.heading("Imported traces").para(
            "Seconds in each phase after mapping regions with traces/rules.yaml: the time "
            "its intervals cover on each rank (nested ones once), summed over the ranks."
        )
        out.table(counts.join(totals).reset_index())
    if not out.blocks:
        out.para("No traces (tracer: none, and none imported).")
    return out


def covered_seconds(table: pd.DataFrame) -> pd.DataFrame:
    """Seconds of each phase (columns) per (run_id, source): on each rank,
    the union of the phase's intervals (a region nested in another of the
    same phase counts once, as do a rank's threads at the same time), then
    summed over the ranks. Not the sum of the intervals: nested records
    of one forward pass would count it several times over."""
    rows = table.loc[~table["phase"].isin(MARKERS), ["run_id", "source", "rank", "phase"]]
    group = ["run_id", "source", "rank", "phase"]
    frame = rows.assign(start=table["start_ns"], end=table["end_ns"]).astype({"phase": str})
    frame = frame.sort_values([*group, "start"], kind="stable")
    keys = frame[group]
    first = (keys != keys.shift()).any(axis=1).to_numpy()
    # the furthest end of the group's intervals before each one: a gap
    # before it starts a new stretch of covered time (shifted with a fill,
    # not NaN, so it stays int64: a double holds only 256 ns steps there)
    reach = frame.groupby(group, sort=False, observed=True)["end"].cummax()
    before = reach.shift(fill_value=0).to_numpy()
    new = first | (frame["start"].to_numpy() > before)
    frame["stretch"] = new.cumsum()
    stretches = frame.groupby([*group, "stretch"], sort=False, observed=True).agg(
        start=("start", "min"), end=("end", "max")
    )
    covered = (
        (stretches["end"] - stretches["start"])
        .groupby(["run_id", "source", "phase"], observed=True)
        .sum()
    )
    return covered.unstack("phase") / 1e9
