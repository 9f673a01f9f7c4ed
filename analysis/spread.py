"""The spread behind the means: per design cell, the distribution of the
measured steps' times (all ranks and replications: median, p95, the
slowest, and a box plot), the run-to-run variation of throughput, and links
to the cell's run folders, their traces and the merged Perfetto timeline.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import bottlenecks, cells, stats
from analysis.section import Link, Section
from runfiles import names

# The merged Chrome/Perfetto trace the workflow writes (workflows/analysis.smk's
# timeline rule): each framework's largest run, its first replication.
TIMELINE = "tables/timeline.json"


def step_times(runs: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """One row per measured step (warm-up left out) of every rank of every ok
    run: its cell and its wall time in seconds."""
    ok = cells.with_setting(runs[runs["status"] == "ok"])
    mine = phases[phases["run_id"].isin(ok["run_id"])] if len(phases) else phases
    if ok.empty or mine.empty:
        return pd.DataFrame(columns=["run_id", *cells.CELL, "step_s"])
    steps = bottlenecks.per_step(mine, ok)[["run_id", "step_s"]]
    return steps.join(ok.set_index("run_id")[cells.CELL], on="run_id")


def table(runs: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Per cell: runs, measured steps, step time median, p95 and slowest,
    p95 over the median (the tail), the run-to-run coefficient of variation
    of throughput (stats.replicate_table's, as the summary's), and the mean
    initialisation time of its runs (``init_s``: start-up, the framework's
    and the model's, before the first step)."""
    steps = step_times(runs, phases)
    columns = [*cells.CELL, "runs", "steps", "step_median_s", "step_p95_s", "step_slowest_s"]
    columns += ["p95_over_median", "throughput_cv_share", "init_s"]
    if steps.empty:
        return pd.DataFrame(columns=columns)
    grouped = steps.groupby(cells.CELL)["step_s"]
    found = pd.DataFrame(
        {
            "runs": steps.groupby(cells.CELL)["run_id"].nunique(),
            "steps": grouped.size(),
            "step_median_s": grouped.median(),
            "step_p95_s": grouped.quantile(0.95),
            "step_slowest_s": grouped.max(),
        }
    )
    found["p95_over_median"] = found["step_p95_s"] / found["step_median_s"]
    variation = stats.replicate_table(cells.with_setting(runs), cells.CELL, "images_per_s")
    if len(variation):
        cv = variation.set_index(cells.CELL)["cv_share"].rename("throughput_cv_share")
        found = found.join(cv)
    else:
        found["throughput_cv_share"] = math.nan
    ok = cells.with_setting(runs[runs["status"] == "ok"])
    if "init_s" in ok:
        found = found.join(ok.groupby(cells.CELL)["init_s"].mean())
    else:
        found["init_s"] = math.nan
    return cells.in_order(found.reset_index()[columns], cells.CELL)


def section(ctx) -> Section:
    """Step-time distributions, run-to-run variation, and where each cell's
    runs, traces and the merged timeline are."""
    out = Section("spread", "Spread: step times and run-to-run variation")
    found = table(ctx.runs, ctx.step_phases)
    if found.empty:
        out.para("No measured step in the phase tables: no step-time distribution.")
    else:
        out.figure(ctx.figures / "step_times.png", "step time per cell")
        out.para(
            "Time of each measured step (warm-up left out), over all ranks and "
            "replications of a cell; p95_over_median is the tail's length. "
            "throughput_cv is the run-to-run variation: the standard deviation of "
            "images_per_s over replications divided by its mean. init is the start-up "
            "before the first step (the framework's, the data's and the model's), mean "
            "over the cell's runs."
        )
        out.table(found)
    out.heading("Runs, traces and the merged timeline").para(
        "Each cell's run folders "
        "(status, converted phase table, trace where one was written); the merged "
        "Perfetto timeline (open it in ui.perfetto.dev) holds each framework's largest "
        "run."
    )
    return out.items(links(ctx.runs, ctx.design.root, ctx.tables.parent), css="links")


def links(runs: pd.DataFrame, root: str, base) -> list[list]:
    """Per cell, its runs' folders and traces, relative to the report (in
    results/<root>/, the folder ``base`` here), and which run the merged
    timeline holds: one sentence of text and links per cell."""
    if runs.empty or "path" not in runs:
        return []
    shown = cells.in_order(cells.with_setting(runs), [*cells.CELL, "rep"])
    in_timeline = set(
        shown[shown["status"] == "ok"]
        .sort_values(["world_size", "rep"], ascending=[False, True])
        .groupby("framework")
        .head(1)["run_id"]
    )
    items = []
    for key, group in shown.groupby(cells.CELL, sort=False):
        framework, world, setting = key
        line: list = [f"{framework}, {int(world)} process{'es' if world != 1 else ''}, {setting}: "]
        for i, row in enumerate(group.itertuples()):
            relative = row.path.removeprefix(root + "/")
            folder = relative + "/"
            # a run that left no folder gets no link (it would lead nowhere)
            rep = Link(f"rep {row.rep}", folder) if (base / relative).is_dir() else f"rep {row.rep}"
            line += [", "] * bool(i) + [rep, f" ({row.status}"]
            for name, what in ((names.OTF2_DIR, "trace"), (names.PHASE_TABLE, "phase table")):
                if (base / relative / name).exists():
                    line += [", ", Link(what, f"{folder}{name}")]
            if row.run_id in in_timeline and (base / TIMELINE).exists():
                line += [", in the ", Link("merged timeline", TIMELINE)]
            line.append(")")
        items.append(line)
    return items
