"""The phase table: one row per matched interval (an Enter with its Leave, a
begin with its end, a complete event), whatever the trace format.

Columns (schema version in the Parquet metadata, key ``ddlcompare.schema_version``):

- ``run_id``, ``rank``, ``node`` (host name), ``location`` (thread, stream,
  tensor: where the interval happened), ``source`` (the reader);
- ``step``, ``epoch``: the training step and epoch it belongs to (null when
  outside steps or unknown);
- ``phase``: one of traces.phases.PHASES, or ``step`` for the interval that
  encloses a whole step; ``region``: the name in the trace;
- ``start_ns``, ``end_ns``, ``dur_ns``: on the trace's own clock (Unix epoch
  where the trace gives it), in nanoseconds;
- ``depth`` (0 at top level), ``parent`` (the enclosing region's name);
- ``collective`` (allreduce, bcast, ... or null), ``bytes`` (message or
  buffer size of a collective or message, null when unknown).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa

from traces.phases import STEP, STEP_PHASES
from traces.rules import PhaseRules

SCHEMA_VERSION = 1
SCHEMA = pa.schema([
    ("run_id", pa.string()), ("rank", pa.int32()), ("node", pa.string()),
    ("location", pa.string()), ("step", pa.int64()), ("epoch", pa.int64()),
    ("phase", pa.string()), ("region", pa.string()), ("start_ns", pa.int64()),
    ("end_ns", pa.int64()), ("dur_ns", pa.int64()), ("depth", pa.int32()),
    ("parent", pa.string()), ("collective", pa.string()), ("bytes", pa.int64()),
    ("source", pa.string()),
])
COLUMNS = tuple(SCHEMA.names)
META_VERSION = b"ddlcompare.schema_version"


class Rows:
    """Column lists a reader fills, one entry per interval.

    ``row_id`` identifies the interval (given when it opens) and ``parent_id``
    the interval it runs in (None at top level), so that unmatched regions can
    take their parent's phase and step."""

    FIELDS = ("rank", "node", "location", "step", "epoch", "region", "start_ns", "end_ns",
              "depth", "collective", "bytes", "row_id", "parent_id")

    def __init__(self):
        for name in self.FIELDS:
            setattr(self, name, [])

    def add(self, rank, node, location, region, start_ns, end_ns, depth, row_id, parent_id,
            step=None, epoch=None, collective=None, nbytes=None) -> None:
        self.rank.append(rank)
        self.node.append(node)
        self.location.append(location)
        self.region.append(region)
        self.start_ns.append(start_ns)
        self.end_ns.append(end_ns)
        self.depth.append(depth)
        self.row_id.append(row_id)
        self.parent_id.append(parent_id)
        self.step.append(step)
        self.epoch.append(epoch)
        self.collective.append(collective)
        self.bytes.append(nbytes)

    def __len__(self) -> int:
        return len(self.region)


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()


def finish(rows: Rows, rules: PhaseRules, source: str, run_id: str = "") -> pa.Table:
    """Phases from the rules, then step and epoch: from the trace, from the
    enclosing interval, or from the step interval the row starts in."""
    n = len(rows)
    if n == 0:
        return empty_table()
    df = pd.DataFrame({name: getattr(rows, name) for name in Rows.FIELDS})
    df["rank"] = df["rank"].astype("int64")
    parent_row = _parent_rows(df)
    depth = df["depth"].to_numpy(dtype=np.int64)

    matched = {region: rules.match(region, source) for region in df["region"].unique()}
    phase = df["region"].map(lambda r: matched[r][0]).to_numpy(dtype=object, copy=True)
    rule_collective = df["region"].map(lambda r: matched[r][1])
    df["collective"] = df["collective"].where(df["collective"].notna(), rule_collective)
    is_step = phase == STEP
    phase[is_step] = "other"  # what a step's unmatched children take
    phase = _inherit(phase, parent_row, depth)
    phase[pd.isna(phase)] = "other"
    phase[is_step] = STEP
    df["phase"] = phase

    step = df["step"].to_numpy(dtype=object, copy=True)
    epoch = df["epoch"].to_numpy(dtype=object, copy=True)
    _number_steps(df, step)
    step = _inherit(step, parent_row, depth)
    epoch = _inherit(epoch, parent_row, depth)
    _steps_by_time(df, step, epoch)
    df["step"], df["epoch"] = step, epoch

    df["parent"] = np.where(parent_row >= 0, df["region"].to_numpy()[np.maximum(parent_row, 0)],
                            None)
    df["dur_ns"] = df["end_ns"] - df["start_ns"]
    df["run_id"] = run_id
    df["source"] = source
    table = pa.Table.from_pandas(df[list(COLUMNS)], schema=SCHEMA, preserve_index=False)
    return table.replace_schema_metadata({META_VERSION: str(SCHEMA_VERSION).encode(),
                                          b"ddlcompare.rules_version": str(rules.version).encode()})


def _parent_rows(df: pd.DataFrame) -> np.ndarray:
    """Row index of each row's parent interval, -1 at top level."""
    index = pd.Series(np.arange(len(df)), index=df["row_id"].to_numpy())
    parents = df["parent_id"]
    has = parents.notna().to_numpy()
    out = np.full(len(df), -1, dtype=np.int64)
    if has.any():
        found = index.reindex(parents[has].to_numpy()).to_numpy()
        out[has] = np.where(np.isnan(found), -1, found).astype(np.int64)
    return out


def _inherit(values: np.ndarray, parent_row: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Fill missing values from the parent, top level first."""
    values = values.copy()
    order = np.argsort(depth, kind="stable")
    for d in np.unique(depth):
        rows = order[depth[order] == d]
        need = rows[pd.isna(values[rows]) & (parent_row[rows] >= 0)]
        values[need] = values[parent_row[need]]
    return values


_STEP_NUMBER = re.compile(r"#(\d+)$")


def _number_steps(df: pd.DataFrame, step: np.ndarray) -> None:
    """Step intervals without a step number take it from their name
    (``ProfilerStep#12``) or from their order on their location."""
    is_step = (df["phase"] == STEP).to_numpy() & pd.isna(step)
    if not is_step.any():
        return
    rows = df[is_step]
    from_name = rows["region"].str.extract(_STEP_NUMBER, expand=False)
    order = rows.sort_values("start_ns").groupby(["rank", "location"]).cumcount()
    step[is_step] = np.where(from_name.notna(), from_name.astype("float").fillna(-1),
                             order.reindex(rows.index)).astype(np.int64)


def _step_windows(df: pd.DataFrame, step: np.ndarray, epoch: np.ndarray) -> pd.DataFrame:
    """(rank, start, end, step, epoch) of every step: the step intervals, or
    where a rank has none (Score-P user regions), each run of step phases
    from one data_load to the next."""
    is_step = (df["phase"] == STEP).to_numpy()
    windows = pd.DataFrame({"rank": df["rank"][is_step], "start": df["start_ns"][is_step],
                            "end": df["end_ns"][is_step], "step": step[is_step],
                            "epoch": epoch[is_step]})
    ranks_without = set(df["rank"].unique()) - set(windows["rank"])
    inferred = []
    for rank in sorted(ranks_without):
        mine = df[(df["rank"] == rank) & df["phase"].isin(STEP_PHASES)]
        loads = mine[mine["phase"] == "data_load"]
        if loads.empty:
            continue
        # The training loop's own phase regions (e.g. user:forward), not the
        # regions that run inside them or beside them on another thread.
        name = loads["region"].iloc[0]
        top = mine[mine["location"] == loads["location"].iloc[0]]
        if name.endswith("data_load"):
            top = top[top["region"] == name[:-len("data_load")] + top["phase"]]
        top = top.sort_values("start_ns")
        number = (top["phase"] == "data_load").cumsum() - 1
        top = top[number >= 0]
        grouped = top.groupby(number[number >= 0])
        inferred.append(pd.DataFrame({"rank": rank, "start": grouped["start_ns"].min(),
                                      "end": grouped["end_ns"].max(),
                                      "step": grouped["start_ns"].min().index, "epoch": None}))
    return pd.concat([windows, *inferred], ignore_index=True) if inferred else windows


def _steps_by_time(df: pd.DataFrame, step: np.ndarray, epoch: np.ndarray) -> None:
    """Rows still without a step take the step window they start in, on their rank."""
    windows = _step_windows(df, step, epoch)
    need_all = pd.isna(step)
    if windows.empty or not need_all.any():
        return
    for rank, mine in windows.groupby("rank"):
        mine = mine.sort_values("start")
        need = np.flatnonzero(need_all & (df["rank"] == rank).to_numpy())
        if need.size == 0:
            continue
        starts = df["start_ns"].to_numpy()[need]
        at = np.searchsorted(mine["start"].to_numpy(), starts, side="right") - 1
        inside = (at >= 0) & (starts < mine["end"].to_numpy()[np.maximum(at, 0)])
        step[need[inside]] = mine["step"].to_numpy()[at[inside]]
        epoch[need[inside]] = mine["epoch"].to_numpy()[at[inside]]
