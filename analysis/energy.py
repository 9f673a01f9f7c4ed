"""Energy in the report: per run and per image by framework and processes,
or why it was not measured (the joules themselves are read by
analysis/collect.py from each run's record)."""

from __future__ import annotations


from analysis import cells, humanize
from analysis.section import Section


def section(ctx) -> Section:
    """Energy per run and per image by framework and processes, or why it
    was not measured."""
    out = Section("energy", "Energy")
    runs = ctx.runs
    ok = cells.with_setting(runs[runs["status"] == "ok"])
    if "energy_status" not in ok:
        return out.para("No energy figures in these tables.")
    measured = ok[ok["energy_j"].notna()]
    unmeasured = ok[ok["energy_j"].isna()]
    if len(measured):
        table = (
            measured.groupby(cells.CELL + ["energy_status"])
            .agg(
                runs=("run_id", "count"),
                energy_j=("energy_j", "mean"),
                energy_per_epoch_j=("energy_per_epoch_j", "mean"),
                energy_per_image_j=("energy_per_image_j", "mean"),
            )
            .reset_index()
            .pipe(cells.in_order, cells.CELL)
        )
        out.figure(ctx.figures / "energy.png", "energy per image")
        out.para(
            "Joules over the run clock's window (first data touched to the last "
            "evaluation), all nodes: Kwollect's node power where it measured every "
            "node, else RAPL (CPU packages and DRAM) plus NVML (GPUs); means over "
            "replications."
        )
        out.table(table)
    if len(unmeasured):
        reasons = unmeasured.groupby("energy_status").size().rename("runs").reset_index()
        lead = (
            "Energy was not measured"
            if measured.empty
            else f"Energy was not measured for {humanize.count(len(unmeasured), 'run')}"
        )
        out.para(f"{lead}; the reasons, as each run reported them:").table(reasons)
    return out
