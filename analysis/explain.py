"""Why a step took as long as it did: the report's explaining sections
(critical path and causes of waiting, the calibrated what-if, the trace
diff). Each is built beside what it presents (analysis/critical_path.py,
analysis/whatif.py, analysis/trace_diff.py); here they are read from the
report's Context, whose phase table and critical path are computed once."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import critical_path, trace_diff, whatif
from analysis.section import Em, Section

NOTHING = "No phase table in these tables: nothing to explain."


def critical_path_section(ctx) -> Section:
    if ctx.phases.empty:
        return Section(critical_path.SECTION_ID, critical_path.SECTION_TITLE).items([NOTHING])
    return _critical_path(ctx.runs, ctx.phases, ctx.figures, ctx.critical_path)


def _critical_path(runs: pd.DataFrame, phases: pd.DataFrame, folder: Path, found) -> Section:
    """The critical path's section with its figure (drawn into ``folder``)."""
    if found is None:
        ok = runs[runs["status"] == "ok"] if "status" in runs else runs
        found = critical_path.analyse(phases[phases["run_id"].isin(ok["run_id"])], ok)
    figure = None
    if len(found.path):
        # Here, not above: plotnine and matplotlib (half a second of CPU) load
        # only where there is a path to draw.
        from analysis import figures

        figure = figures.critical_path(found, folder, runs)
    return critical_path.section(runs, phases, figure, found)


def what_if_section(ctx) -> Section:
    if ctx.phases.empty:
        return Section(whatif.SECTION_ID, whatif.SECTION_TITLE).para(Em(NOTHING))
    return whatif.section(ctx.runs, ctx.phases, ctx.tables, ctx.critical_path)


def trace_diff_section(ctx) -> Section:
    if ctx.phases.empty:
        return Section(
            trace_diff.SECTION_ID, "Trace diff: framework against framework, phase by phase"
        ).para(Em(NOTHING))
    return trace_diff.section(ctx.runs, ctx.phases, found=ctx.critical_path)


def sections(runs: pd.DataFrame, tables: Path, found=None) -> list[Section]:
    """The sections, each from the runs' converted traces where they have
    step phases, else their phase recorder's intervals; ``found``: their
    critical path where the caller has it already."""
    tables = Path(tables)
    phases = critical_path.phase_table(tables)
    if phases.empty:
        return [Section(critical_path.SECTION_ID, critical_path.SECTION_TITLE).items([NOTHING])]
    return [
        _critical_path(runs, phases, tables / "figures", found),
        whatif.section(runs, phases, tables, found),
        trace_diff.section(runs, phases, found=found),
    ]
