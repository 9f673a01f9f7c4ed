"""What the converted traces hold, in the report: our runs' (collectives and
their bytes), the traces that could not be read, and any imported ones
(phase totals per trace)."""

from __future__ import annotations

import pandas as pd

from analysis import cells
from analysis.section import Section
from ddlcompare.run.validate import read_table
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
        totals = (
            table[~table["phase"].isin(MARKERS)].pivot_table(
                index=["run_id", "source"], columns="phase", values="dur_ns", aggfunc="sum"
            )
            / 1e9
        )
        counts = table.groupby(["run_id", "source"]).agg(
            ranks=("rank", "nunique"), intervals=("phase", "count")
        )
        out.heading("Imported traces").para(
            "Seconds in each phase (all ranks) after mapping regions with traces/rules.yaml."
        )
        out.table(counts.join(totals).reset_index())
    if not out.blocks:
        out.para("No traces (tracer: none, and none imported).")
    return out
