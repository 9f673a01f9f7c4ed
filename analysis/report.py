"""The HTML report: one self-contained file, figures embedded, nothing fetched.

Every section is one shape, analysis/section.py's Section, built beside
what it presents by a function of the Context (analysis/page.py) and
rendered by the one template analysis/templates/section.html.j2; the page
around them is analysis/templates/report.html.j2. SECTIONS below is their
order: the answer first (analysis/summary.py), then what to change, the
stages, design and provenance, run status, throughput and scaling, spread,
phases, devices, frameworks, the model gate, bottlenecks, the explaining
sections, the network, design statistics, accuracy, energy, compression,
traces. Everything is computed from the tables. A new section is one line
in SECTIONS. Next to report.html: summary.md and the summary's tables as CSV.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import jinja2

from analysis import (
    accuracy,
    bottlenecks,
    compression,
    devices,
    energy,
    explain,
    followup,
    humanize,
    improve,
    levels,
    network_limit,
    provenance,
    spread,
    stats,
    summary,
    trace_tables,
    transfer,
)
from analysis.page import Context
from analysis.section import TEMPLATES, Em, Section, environment
from ddlcompare.plan.design import Design
from runfiles.tables import check_table, read_runs, read_table
from runfiles.atomic import write_text

# The report's sections in order, each a builder of the Context that returns
# a Section. A new section is one line here.
SECTIONS: list[Callable[[Context], Section]] = [
    summary.section,
    improve.section,
    levels.section,
    followup.section,
    provenance.design_section,
    provenance.status_section,
    stats.throughput_section,
    spread.section,
    bottlenecks.phases_section,
    devices.section,
    provenance.frameworks_section,
    provenance.gate_section,
    bottlenecks.section,
    explain.critical_path_section,
    explain.what_if_section,
    explain.trace_diff_section,
    network_limit.section,
    stats.section,
    accuracy.section,
    energy.section,
    compression.section,
    trace_tables.section,
]


def render(
    ctx: Context, sections: list[Callable[[Context], Section]] = SECTIONS
) -> tuple[str, list[Section]]:
    """The page and its sections, built in order."""
    built = []
    for build_section in sections:
        section = build_section(ctx)
        if not section.blocks:
            section.para(Em("Nothing to show for these runs."), css="empty")
        built.append(section)
    html_page = (
        environment()
        .get_template("report.html.j2")
        .render(name=ctx.design.name, design=ctx.design, sections=built)
    )
    return html_page, built


def write_summary(ctx: Context, out: Path) -> None:
    """summary.md and the summary's tables as CSV, next to the report."""
    result = ctx.extra.get("summary")
    if result is None:
        return
    tables = {name: t for name, t in result.tables().items() if len(t)}
    for name, t in tables.items():
        write_text(out.parent / f"{name}.csv", t.to_csv(index=False))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False, keep_trailing_newline=True
    )
    text = env.get_template("summary.md.j2").render(
        name=ctx.design.name,
        summary=result,
        tables={n: humanize.frame(t).to_markdown(index=False) for n, t in tables.items()},
        levels_heading=levels.HEADING,
        levels_how=levels.HOW[0].upper() + levels.HOW[1:],
        holds_heading=transfer.HEADING,
        holds_how=transfer.HOW[0].upper() + transfer.HOW[1:],
    )
    write_text(out.parent / "summary.md", text)


def build(design: Design, tables: Path, out: Path) -> Path:
    for path in sorted(Path(tables).glob("*.parquet")):  # any a section may read
        check_table(path)
    ctx = Context(
        design=design,
        runs=read_runs(tables / "runs.parquet", design.factors),
        step_phases=read_table(tables / "step_phases.parquet"),
        tables=tables,
    )
    text, _ = render(ctx)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, text)
    write_summary(ctx, out)
    return out
