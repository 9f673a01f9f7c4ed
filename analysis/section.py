"""What a report section holds, whatever renders it (the HTML report today,
a template tomorrow): a title, sentences, tables and figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class SectionContent:
    title: str
    sentences: list[str] = field(default_factory=list)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # caption -> table
    figures: list[Path] = field(default_factory=list)
