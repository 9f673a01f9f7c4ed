"""Design cells as the analysis groups them: framework x processes x setting.

The setting is batch_size (per process) plus every other factor the runs
vary (dataset, model, device, compression...), so that scaling curves,
breakdowns and findings never average over a factor the design varies.
Processes (nodes x procs_per_node, as world_size) are the x axis instead.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from ddlcompare.plan.devices import ONLY_WHERE
from ddlcompare.plan.params import PARAMS
from frameworks import registry

SCALE = ("framework", "nodes", "procs_per_node")
CELL = ["framework", "world_size", "setting"]


def varied(runs: pd.DataFrame, leave_out: tuple[str, ...] = ()) -> list[str]:
    """batch_size, then every other setting whose value differs between runs
    (but those in ``leave_out``, which the caller shows another way). A
    setting that acts on some runs only (devices.ONLY_WHERE: fit_step_phases
    for Tarantella's) is compared among those: the others hold its default
    because it does not act on them, which no reader should take for a level."""
    names = [
        name
        for name, param in PARAMS.items()
        if name in runs.columns
        and name not in (*SCALE, *leave_out, "batch_size")
        and not (param.analysis_only or param.path_like)
        and _acting(runs, name)[name].map(level_text).nunique() > 1
    ]
    return ["batch_size", *names]


def _acting(runs: pd.DataFrame, name: str) -> pd.DataFrame:
    """The runs a setting acts on (all of them, but for ONLY_WHERE's)."""
    if name not in ONLY_WHERE or not {"framework", "device"} <= set(runs.columns):
        return runs
    applies, _ = ONLY_WHERE[name]
    frameworks = registry.FRAMEWORKS
    acts = [
        row["framework"] in frameworks and applies(row, frameworks[row["framework"]])
        for row in runs.to_dict("records")
    ]
    return runs.loc[acts]


def with_setting(runs: pd.DataFrame, leave_out: tuple[str, ...] = ()) -> pd.DataFrame:
    """The runs with a ``setting`` label ("batch_size 64, compression fp16");
    an unset value reads "null", as in design.yaml."""
    if runs.empty or ("setting" in runs.columns and not leave_out):
        return runs
    names = varied(runs, leave_out)
    labels = runs[names].apply(
        lambda row: ", ".join(f"{name} {level_text(value)}" for name, value in row.items()), axis=1
    )
    return runs.assign(setting=labels)


def with_scale(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs with their setting and both scale columns (a design that fixes
    nodes has no column for it)."""
    runs = with_setting(runs)
    if "nodes" not in runs:
        runs = runs.assign(nodes=1)
    if "procs_per_node" not in runs:
        runs = runs.assign(procs_per_node=runs["world_size"] // runs["nodes"])
    return runs


def by_rep(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """A table of runs (keyed by ``run_id``) as a reader reads it: its cell,
    then the run's replication in place of its id (a hash, which names
    nothing a reader knows; the run's folder holds it)."""
    if "run_id" not in table or "rep" not in runs:
        return table
    reps = runs.drop_duplicates("run_id").set_index("run_id")["rep"]
    shown = table.assign(run_id=table["run_id"].map(reps)).rename(columns={"run_id": "rep"})
    first = [c for c in CELL if c in shown]
    return shown[[*first, *[c for c in shown.columns if c not in first]]]


def level_text(value) -> str:
    """A level as design.yaml spells it (an integer column with a null level
    is read back as floats: 100.0 is 100)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)")


def natural_key(text) -> tuple:
    """A label's sort key with its numbers read as numbers, so that
    "batch_size 64" comes before "batch_size 256"."""
    return tuple(
        (0, float(part), "") if NUMBER.fullmatch(part) else (1, 0.0, part)
        for part in NUMBER.split(str(text))
        if part
    )


def natural(series: pd.Series) -> pd.Categorical:
    """Labels as an ordered categorical in natural order (plots facet and
    stack in the categories' order)."""
    return pd.Categorical(
        series, categories=sorted(series.dropna().unique(), key=natural_key), ordered=True
    )


def in_order(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Rows sorted by ``by``: numbers as numbers, labels in natural order."""
    by = [c for c in by if c in table.columns]
    if table.empty or not by:
        return table

    def key(column: pd.Series) -> pd.Series:
        if pd.api.types.is_numeric_dtype(column):
            return column
        ranks = {v: i for i, v in enumerate(sorted(column.dropna().unique(), key=natural_key))}
        return column.map(ranks)

    return table.sort_values(by, key=key, kind="stable").reset_index(drop=True)
