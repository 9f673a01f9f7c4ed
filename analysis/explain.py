"""Why a step took as long as it did: the report's explaining sections
(critical path and causes of waiting, the calibrated what-if, the trace
diff), read from the tables folder once."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import critical_path, trace_diff, whatif
from analysis.section import SectionContent


def sections(runs: pd.DataFrame, tables: Path, found=None) -> list[SectionContent]:
    """The sections, each from the runs' converted traces where they have
    step phases, else their phase recorder's intervals; ``found``: their
    critical path where the caller has it already."""
    tables = Path(tables)
    phases = critical_path.phase_table(tables)
    if phases.empty:
        return [
            SectionContent(
                "Critical path and causes of waiting",
                ["No phase table in these tables: nothing to explain."],
            )
        ]
    return [
        critical_path.section(runs, phases, tables / "figures", found),
        whatif.section(runs, phases, tables),
        trace_diff.section(runs, phases),
    ]
