"""Design cells as the analysis groups them: framework x processes x setting.

The setting is batch_size (per process) plus every other factor the runs
vary (dataset, model, device, compression...), so that scaling curves,
breakdowns and findings never average over a factor the design varies.
Processes (nodes x procs_per_node, as world_size) are the x axis instead.
"""

from __future__ import annotations

import math

import pandas as pd

from ddlcompare.params import PARAMS

SCALE = ("framework", "nodes", "procs_per_node")
CELL = ["framework", "world_size", "setting"]


def varied(runs: pd.DataFrame, leave_out: tuple[str, ...] = ()) -> list[str]:
    """batch_size, then every other setting whose value differs between runs
    (but those in ``leave_out``, which the caller shows another way)."""
    names = [
        name
        for name, param in PARAMS.items()
        if name in runs.columns
        and name not in (*SCALE, *leave_out, "batch_size")
        and not (param.analysis_only or param.path_like)
        and runs[name].map(_text).nunique() > 1
    ]
    return ["batch_size", *names]


def with_setting(runs: pd.DataFrame, leave_out: tuple[str, ...] = ()) -> pd.DataFrame:
    """The runs with a ``setting`` label ("batch_size 64, compression fp16");
    an unset value reads "null", as in design.yaml."""
    if runs.empty or ("setting" in runs.columns and not leave_out):
        return runs
    names = varied(runs, leave_out)
    labels = runs[names].apply(
        lambda row: ", ".join(f"{name} {_text(value)}" for name, value in row.items()), axis=1
    )
    return runs.assign(setting=labels)


def _text(value) -> str:
    """A level as design.yaml spells it (an integer column with a null level
    is read back as floats: 100.0 is 100)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
