"""Design cells as the analysis groups them: framework x processes x setting.

The setting is batch_size (per process) plus every other factor the runs
vary (dataset, model, device, compression...), so that scaling curves,
breakdowns and findings never average over a factor the design varies.
Processes (nodes x procs_per_node, as world_size) are the x axis instead.
"""
from __future__ import annotations

import pandas as pd

from ddlcompare.params import PARAMS

SCALE = ("framework", "nodes", "procs_per_node")
CELL = ["framework", "world_size", "setting"]


def varied(runs: pd.DataFrame) -> list[str]:
    """batch_size, then every other setting whose value differs between runs."""
    names = [name for name, param in PARAMS.items()
             if name in runs.columns and name not in SCALE and name != "batch_size"
             and not (param.analysis_only or param.path_like)
             and runs[name].astype(str).nunique() > 1]
    return ["batch_size", *names]


def with_setting(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with a ``setting`` label ("batch_size 64, compression fp16")."""
    if "setting" in runs.columns or runs.empty:
        return runs
    names = varied(runs)
    labels = runs[names].astype(str).apply(
        lambda row: ", ".join(f"{name} {value}" for name, value in row.items()), axis=1)
    return runs.assign(setting=labels)
