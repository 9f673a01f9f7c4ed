"""Whether the runs of a framework whose own fit runs the step (Tarantella)
recorded that step's phases (the setting ``fit_step_phases``), and what the
recording costs: one line, said beside those phases (the phase breakdown)
and by every section that lacks them because the recording was off. The
measured cost is stated in one place, docs/tracing.md; the line links there.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.section import Code, Link
from frameworks import registry

SETTING = "fit_step_phases"
COST_DOC = Path(__file__).resolve().parents[1] / "docs" / "tracing.md"
COST_ANCHOR = "tarantellas-phases-from-its-own-graph"  # its section there
COST = "recording them lengthens its step, most likely by more than 1 %"


def counts(runs: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """Per framework that owns its step: (its successful runs that recorded
    their phases, its successful runs)."""
    if runs.empty or SETTING not in runs or "framework" not in runs:
        return {}
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    owners = [f for f in ok["framework"].unique() if _owns_step(f)]
    return {
        f: (
            int(ok.loc[ok["framework"] == f, SETTING].fillna(False).astype(bool).sum()),
            int((ok["framework"] == f).sum()),
        )
        for f in sorted(owners)
    }


def _owns_step(framework: str) -> bool:
    info = registry.FRAMEWORKS.get(str(framework))
    return info is not None and info.owns_step


def lines(runs: pd.DataFrame, lacking: str | None = None) -> list[list]:
    """One line per framework that owns its step: whether its runs recorded
    their phases and what that costs. With ``lacking`` (what the section
    does instead, e.g. "its ranks join at the whole step"), only frameworks
    some of whose runs did not record them, each saying so."""
    found = []
    for framework, (recorded, total) in counts(runs).items():
        if lacking is None or recorded < total:
            found.append(line(framework, recorded, total, lacking))
    return found


def line(framework: str, recorded: int, total: int, lacking: str | None = None) -> list:
    """The line for one framework: ``recorded`` of its ``total`` runs
    recorded their phases."""
    cost = [f"; {COST} (measured: ", _link(), ")"]
    if recorded == total:
        return [
            f"{framework}: its phases come from timestamps in its own step graph, recorded "
            f"in {_all(total)} because the design asks for them (",
            Code(f"{SETTING}: true"),
            ")",
            *cost,
            ".",
        ]
    which = "its runs" if recorded == 0 else f"{total - recorded} of its {total} runs"
    instead = f", so {lacking}" if lacking else ""
    return [
        f"{framework}: {which} recorded whole steps only, no phases (",
        Code(f"{SETTING}: false"),
        f", the default){instead}",
        *cost,
        "; a design asks for them with ",
        Code(f"{SETTING}: true"),
        ".",
    ]


def why_none(framework: str) -> str:
    """Plain words (the summary's) on why a framework's runs have no phases:
    for one that owns its step, that they did not record them; else ""."""
    if not _owns_step(framework):
        return ""
    return f" (its runs did not record them, {SETTING}: false; {COST}: docs/tracing.md)"


def _all(total: int) -> str:
    return "its one run" if total == 1 else f"all {total} of its runs"


def _link() -> Link:
    return Link("docs/tracing.md", f"{COST_DOC.as_uri()}#{COST_ANCHOR}")
