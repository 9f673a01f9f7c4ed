"""What a report section is and how its pieces become HTML.

A section is an id (the anchor), a title (the table of contents) and a
builder: a function of the :class:`Context` that returns the section's body
as HTML. The page around it (style, table of contents, the frame of each
section) is the Jinja2 template analysis/templates/report.html.j2; a file
analysis/templates/sections/<id>.html.j2 replaces one section's frame.

A module that adds a section writes its builder with :func:`table`,
:func:`figure` and :func:`sentences` and registers it with one line in
analysis/report.py's SECTIONS.
"""

from __future__ import annotations

import base64
import functools
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from analysis import humanize

LONG_TABLE = 12  # rows; longer tables start folded (one click opens them)


@dataclass
class Context:
    """Everything a section may read: the design and the tables."""

    design: Any
    runs: pd.DataFrame
    step_phases: pd.DataFrame
    tables: Path
    extra: dict = field(default_factory=dict)  # results one section computes for another

    @property
    def figures(self) -> Path:
        return self.tables / "figures"

    @functools.cached_property
    def critical_path(self):
        """The critical path of the ok runs, computed once for every section
        that quotes it (analysis/critical_path.py)."""
        from analysis import critical_path

        ok = self.runs[self.runs["status"] == "ok"]
        phases = critical_path.phase_table(self.tables)
        phases = phases[phases["run_id"].isin(ok["run_id"])]
        return critical_path.analyse(phases, ok) if len(phases) else None

    @functools.cached_property
    def findings(self) -> pd.DataFrame:
        from analysis import bottlenecks, critical_path

        ok = self.runs[self.runs["status"] == "ok"]
        found = self.critical_path
        cells = critical_path.cell_table(found, ok) if found is not None else pd.DataFrame()
        return bottlenecks.findings(self.step_phases, self.runs, cells)


@dataclass
class Section:
    id: str
    title: str
    build: Callable[[Context], str]
    body: str = ""
    data: dict = field(default_factory=dict)  # for a section's own template


def table(df: pd.DataFrame, caption: str = "", fold: bool | None = None) -> str:
    """A DataFrame as an HTML table with human numbers; long ones folded."""
    if df is None or df.empty:
        return "<p><em>No rows.</em></p>"
    shown = humanize.frame(df.reset_index(drop=True))
    body = shown.to_html(index=False, escape=True, border=0, na_rep=humanize.NOT_SET)
    for name in shown.columns:  # long names may wrap after an underscore
        label = html.escape(str(name))
        body = body.replace(f"<th>{label}</th>", f"<th>{label.replace('_', '_<wbr>')}</th>", 1)
    if "status" in shown:  # colour the run status cells
        for value in shown["status"].unique():
            body = body.replace(
                f"<td>{html.escape(value)}</td>",
                f'<td class="{html.escape(value)}">{html.escape(value)}</td>',
            )
    fold = len(df) > LONG_TABLE if fold is None else fold
    if fold:
        label = html.escape(caption or "table")
        return f"<details><summary>{label} ({len(df)} rows)</summary>{body}</details>"
    return (f"<p class='caption'>{html.escape(caption)}</p>" if caption else "") + body


def figure(path: Path, alt: str) -> str:
    """A figure embedded, or one line saying why there is none (analysis/
    figures.py records why a figure has nothing to show)."""
    if not path.exists():
        return f"<p class='empty'><em>{html.escape(alt)}: no figure (no successful run).</em></p>"
    if why := empty_figures(path.parent).get(path.stem):
        return f"<p class='empty'><em>{html.escape(alt)}: {html.escape(why)}.</em></p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


EMPTY_FIGURES = "empty.json"  # figure name -> why it has nothing to show


def empty_figures(folder: Path) -> dict:
    try:
        return json.loads((folder / EMPTY_FIGURES).read_text())
    except (OSError, ValueError):
        return {}


def sentences(lines: list[str], ordered: bool = False) -> str:
    tag = "ol" if ordered else "ul"
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<{tag}>{items}</{tag}>" if lines else ""


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
