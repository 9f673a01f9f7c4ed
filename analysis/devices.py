"""Device kinds of calibrated runs (batch_split: calibrated, device: hybrid):
what share of the global batch each kind took and how long it sat idle.

``collect`` reads each run's balance.json once (``rows``) into the
``balance`` table, one row per run and rank; the report reads that table.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.section import Section
from runfiles.tables import read_table
from frameworks.balance import BALANCE
from runfiles.names import BALANCE_KEYS
from runfiles import files

COLUMNS = ["run_id", *BALANCE_KEYS]


def rows(folder: Path, run_id: str) -> list[dict]:
    """The ranks of one run's balance.json (none for an even split)."""
    path = folder / BALANCE
    if not path.exists():
        return []
    return [
        {"run_id": run_id, **{c: rank[c] for c in COLUMNS[1:]}}
        for rank in files.read_json(path)["ranks"]
    ]


def by_device(balance: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run and device kind: its ranks, share of the global
    batch, calibrated speed (summed over the kind's ranks), idle seconds and
    the idle fraction of its ranks' measured training time."""
    if balance.empty:
        return pd.DataFrame()
    kinds = balance.groupby(["run_id", "device"], as_index=False).agg(
        ranks=("rank", "count"),
        images_per_step=("images_per_step", "sum"),
        share=("share", "sum"),
        calibrated_images_per_s=("calibrated_images_per_s", "sum"),
        idle_s=("idle_s", "sum"),
        measured_s=("measured_s", "sum"),
    )
    kinds["idle_fraction"] = kinds["idle_s"] / kinds["measured_s"]
    named = runs[["run_id", "framework", "device", "world_size"]].rename(
        columns={"device": "run_device"}
    )
    return named.merge(kinds.drop(columns="measured_s"), on="run_id")


def section(ctx) -> Section:
    """Calibrated runs: each device kind's share of the global batch and its
    idle time (does the CPU help or hold back?)."""
    out = Section("devices", "Devices: shares and idle time")
    path = ctx.tables / "balance.parquet"
    table = by_device(read_table(path), ctx.runs) if path.exists() else pd.DataFrame()
    if table.empty:
        return out.para(
            "No calibrated run (batch_split: calibrated, or device: hybrid): "
            "every rank took an even share of the batch.",
            css="empty",
        )
    return out.para(
        "Calibrated runs (batch_split: "
        "calibrated, device: hybrid): each device kind's share of the global batch, from "
        "its ranks' speed timed at start, and its idle time: the measured step time less "
        "the time its share takes at its calibrated speed."
    ).table(table)
