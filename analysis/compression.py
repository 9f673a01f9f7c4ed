"""Gradient compression from the runs table: what each codec saves on the
wire and what it costs in step time and accuracy, per framework.

``comm_bytes_per_step`` is measured by the adapters (the buffers each rank
handed to collectives in a step, mean over the measured steps and the
ranks); ``bytes_vs_none`` divides it by the same framework's uncompressed
runs at the same processes and setting (batch_size and every other
factor the design varies, as analysis/cells.py groups them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import cells
from analysis.section import Code, Section
from frameworks import compression, registry

SAME_EXCEPT_COMPRESSION = ["framework", "world_size", "setting"]


def summary(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per framework x processes x setting x compression, means
    over replications; empty when no ok run has a measured byte count."""
    ok = runs[(runs["status"] == "ok")]
    if (
        "compression" not in ok
        or "comm_bytes_per_step" not in ok
        or ok["comm_bytes_per_step"].dropna().empty
    ):
        return pd.DataFrame()
    ok = cells.with_setting(ok, leave_out=("compression",))
    table = ok.groupby(SAME_EXCEPT_COMPRESSION + ["compression"], as_index=False).agg(
        runs=("run_id", "count"),
        comm_bytes_per_step=("comm_bytes_per_step", "mean"),
        step_mean_s=("step_mean_s_slowest_rank", "mean"),
        images_per_s=("images_per_s", "mean"),
        final_test_accuracy=("final_test_accuracy", "mean"),
    )
    table = table.sort_values(
        SAME_EXCEPT_COMPRESSION + ["compression"],
        kind="stable",
        key=lambda col: col.map(compression.NAMES.index) if col.name == "compression" else col,
    ).reset_index(drop=True)
    base = table[table["compression"] == "none"].set_index(SAME_EXCEPT_COMPRESSION)
    keys = pd.MultiIndex.from_frame(table[SAME_EXCEPT_COMPRESSION])
    sent = table["comm_bytes_per_step"].to_numpy(dtype=float)
    uncompressed = base["comm_bytes_per_step"].reindex(keys).to_numpy(dtype=float)
    # No ratio where nothing was sent uncompressed (one process: no exchange).
    ratio = np.divide(sent, uncompressed, out=np.full_like(sent, np.nan), where=uncompressed > 0)
    table.insert(6, "bytes_vs_none", ratio)
    return table


def varies(runs: pd.DataFrame) -> bool:
    ok = runs[runs["status"] == "ok"]
    return "compression" in ok and ok["compression"].nunique() > 1


def support() -> pd.DataFrame:
    """Which framework can run which compression (from each adapter's
    AdapterInfo.compressions): 'yes' or 'cannot'."""
    return pd.DataFrame(
        [
            {
                "framework": name,
                **{
                    codec: "yes" if codec in info.compressions else "cannot"
                    for codec in compression.NAMES
                },
            }
            for name, info in sorted(registry.FRAMEWORKS.items())
        ]
    )


def codecs() -> pd.DataFrame:
    return pd.DataFrame(compression.table())


def section(ctx) -> Section:
    """Gradient compression: measured bytes per step against time per step
    and final accuracy, which framework can run which codec, the codecs'
    error bounds."""
    out = Section("compression", "Gradient compression")
    table = summary(ctx.runs)
    if varies(ctx.runs) and len(table):
        out.figure(ctx.figures / "compression.png", "compression")
        out.para(
            "comm_bytes_per_step: the bytes of the buffers each rank handed to "
            "collectives in a measured step (counted where they are handed over; the "
            "lossless codec's real compressed lengths), mean over steps and ranks. "
            "bytes_vs_none divides it by the same framework's uncompressed runs. These "
            "are input buffers: a ring all-reduce puts 2(p-1)/p of its buffer on the "
            "wire per rank, an all-gather (p-1) times it, so at p ranks int8's gather "
            "sends p/8 of fp32's all-reduce bytes and stops saving at 8 ranks."
        )
        out.table(table)
    else:
        out.para(
            "One compression in these runs (set ",
            Code("compression"),
            " as a factor to compare them).",
        )
    return (
        out.heading("Which framework can run which compression")
        .table(support())
        .heading("Codecs and their error bounds")
        .table(codecs())
    )
