"""The spread behind the means: per design cell, the distribution of the
measured steps' times (all ranks and replications: median, p95, the
slowest, and a box plot), the run-to-run variation of throughput, and links
to the cell's run folders, their traces and the merged Perfetto timeline.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from analysis import bottlenecks, cells, stats
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
    p95 over the median (the tail), and the run-to-run coefficient of
    variation of throughput (stats.replicate_table's, as the summary's)."""
    steps = step_times(runs, phases)
    columns = [*cells.CELL, "runs", "steps", "step_median_s", "step_p95_s", "step_slowest_s"]
    columns += ["p95_over_median", "throughput_cv_share"]
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
    return cells.in_order(found.reset_index()[columns], cells.CELL)


def figure(runs: pd.DataFrame, phases: pd.DataFrame):
    """Box plot of the measured steps' times, one box per cell."""
    from plotnine import aes, coord_flip, geom_boxplot, ggplot, labs, theme, theme_bw

    from analysis import figures

    steps = step_times(runs, phases)
    if steps.empty:
        return figures.nothing_to_show("Step time per cell", "no measured step in the phase tables")
    label = (
        steps["framework"]
        + ", "
        + steps["world_size"].astype(int).astype(str)
        + " proc., "
        + steps["setting"]
    )
    steps = steps.assign(cell=cells.natural(label), step_ms=steps["step_s"] * 1e3)
    return (
        ggplot(steps, aes("cell", "step_ms", fill="framework"))
        + geom_boxplot(outlier_size=0.6, outlier_alpha=0.4)
        + coord_flip()
        + labs(
            title="Time of each measured step (all ranks and replications; box: quartiles, "
            "whiskers: 1.5 IQR)",
            x="",
            y="step time (ms)",
        )
        + theme_bw()
        + theme(figure_size=(9, 1.5 + 0.4 * steps["cell"].nunique()))
    )


def links(runs: pd.DataFrame, root: str, base) -> str:
    """Per cell, its runs' folders and traces, relative to the report (in
    results/<root>/, the folder ``base`` here), and which run the merged
    timeline holds."""
    if runs.empty or "path" not in runs:
        return ""
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
        parts = []
        for row in group.itertuples():
            relative = row.path.removeprefix(root + "/")
            folder = html.escape(relative + "/")
            text = f'<a href="{folder}">rep {row.rep}</a> ({html.escape(row.status)}'
            for name, what in ((names.OTF2_DIR, "trace"), (names.PHASE_TABLE, "phase table")):
                if (base / relative / name).exists():
                    text += f', <a href="{folder}{name}">{what}</a>'
            if row.run_id in in_timeline and (base / TIMELINE).exists():
                text += f', in the <a href="{TIMELINE}">merged timeline</a>'
            parts.append(text + ")")
        items.append(
            f"<li>{html.escape(framework)}, {int(world)} process{'es' if world != 1 else ''}, "
            f"{html.escape(setting)}: {', '.join(parts)}</li>"
        )
    return f"<ul class='links'>{''.join(items)}</ul>"
