"""What every report section may read: the :class:`Context` a section's
builder is given (analysis/section.py holds the shape it returns).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import bottlenecks, critical_path, section


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
        return section.figures_folder(self.tables)

    @functools.cached_property
    def phases(self) -> pd.DataFrame:
        """The runs' phase intervals (analysis/critical_path.py's phase_table),
        read once for every section that needs them."""
        return critical_path.phase_table(self.tables)

    @functools.cached_property
    def critical_path(self):
        """The critical path of the ok runs, computed once for every section
        that quotes it (analysis/critical_path.py)."""
        ok = self.runs[self.runs["status"] == "ok"]
        phases = self.phases[self.phases["run_id"].isin(ok["run_id"])]
        return critical_path.analyse(phases, ok) if len(phases) else None

    @functools.cached_property
    def findings(self) -> pd.DataFrame:
        ok = self.runs[self.runs["status"] == "ok"]
        found = self.critical_path
        cells = critical_path.cell_table(found, ok) if found is not None else pd.DataFrame()
        return bottlenecks.findings(self.step_phases, self.runs, cells)
