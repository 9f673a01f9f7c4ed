"""Each framework's gradient exchange against the network's own limit.

Achieved: the bytes a rank hands to collectives per step (comm_bytes_per_step)
over the exposed grad_comm time per step, for runs whose framework exposes
its gradient exchange as a phase. Limit: the MPI all-reduce probe
(ddlcompare/run/probe.py) at the same message size and process count, on the
same hosts. Both are algorithm bandwidths (bytes / time), so their ratio is
the share of what the network and MPI can do that the framework gets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis import cells, humanize
from analysis.section import Section
from frameworks import registry
from runfiles.tables import read_record, read_table

PROBES = "probe"  # folder under the tables


def probes(tables: Path) -> dict[tuple, pd.DataFrame]:
    """Probe results by (nodes, processes, emulated rate or None)."""
    found = {}
    for path in sorted((tables / PROBES).glob("probe-*.json")):
        doc = read_record(path, "processes", "sizes", "hosts")
        key = (doc.get("nodes", 1), doc["processes"], doc.get("net_rate_mbit"))
        found[key] = pd.DataFrame(doc["sizes"]).assign(
            hosts=", ".join(doc["hosts"]), link_bytes_per_s=doc.get("link_bytes_per_s")
        )
    return found


def _key(nodes, world, rate) -> tuple:
    return (int(nodes), int(world), None if rate is None or pd.isna(rate) else int(rate))


def at_size(probe: pd.DataFrame, size: float) -> float:
    """The probe's bandwidth at ``size`` bytes, interpolated on log size."""
    probe = probe.sort_values("bytes")
    return float(np.interp(np.log(size), np.log(probe["bytes"]), probe["algbw_bytes_per_s"]))


def achieved(runs: pd.DataFrame, step_stats: pd.DataFrame) -> pd.DataFrame:
    ok = cells.with_setting(runs[(runs["status"] == "ok") & (runs["world_size"] >= 2)])
    if ok.empty or step_stats.empty:
        return pd.DataFrame()
    per_run = step_stats.groupby("run_id")[["comm_bytes_mean", "grad_comm_mean_s"]].mean()
    ok = ok.assign(
        nodes=ok["nodes"] if "nodes" in ok else 1,
        net_rate_mbit=ok["net_rate_mbit"] if "net_rate_mbit" in ok else None,
    )
    table = ok.set_index("run_id")[[*cells.CELL, "nodes", "net_rate_mbit"]].join(
        per_run, how="inner"
    )
    table = (
        table.groupby(cells.CELL)
        .agg(
            nodes=("nodes", "first"),
            net_rate_mbit=("net_rate_mbit", "first"),
            comm_bytes_mean=("comm_bytes_mean", "mean"),
            grad_comm_mean_s=("grad_comm_mean_s", "mean"),
        )
        .reset_index()
        .pipe(cells.in_order, cells.CELL)
    )
    # only where the framework times its gradient exchange as a phase of its own
    shows = table["framework"].map(lambda f: "grad_comm" in registry.FRAMEWORKS[f].exposes)
    exposed = shows & (table["grad_comm_mean_s"] > 0) & (table["comm_bytes_mean"] > 0)
    table["achieved_mb_s"] = np.where(
        exposed, table["comm_bytes_mean"] / table["grad_comm_mean_s"] / 1e6, np.nan
    )
    return table.rename(
        columns={
            "comm_bytes_mean": "comm_bytes_per_step",
            "grad_comm_mean_s": "exposed_grad_comm_s",
        }
    )


def compare(runs: pd.DataFrame, step_stats: pd.DataFrame, found: dict) -> pd.DataFrame:
    table = achieved(runs, step_stats)
    if table.empty:
        return table
    keys = [
        _key(n, w, r)
        for n, w, r in zip(table["nodes"], table["world_size"], table["net_rate_mbit"])
    ]
    limit = [
        at_size(found[k], b) / 1e6 if k in found and b > 0 else np.nan
        for k, b in zip(keys, table["comm_bytes_per_step"].fillna(0))
    ]
    table["probe_mb_s"] = limit
    table["share_of_probe"] = table["achieved_mb_s"] / table["probe_mb_s"]
    return table


def section(ctx) -> Section:
    """The report's section: each all-reduce probe, and each framework's
    achieved bandwidth against it."""
    out = Section("network", "Network bandwidth limit")
    found = probes(ctx.tables)
    if not found:
        return out.para(
            "No all-reduce probe in these tables (the workflow runs one for each "
            "scale of two processes or more)."
        )
    out.para(
        "The probe times MPI_Allreduce at the model's gradient sizes (each layer's and "
        "the whole model's), median of 20 after 3 warm-up calls; algbw = bytes / time, "
        "busbw = algbw x 2(P-1)/P, what each link carries each way. Open MPI is given "
        "several TCP connections per pair of processes (the probe file's tcp_links): with "
        "its default of one, a pair sending both ways at once gets about half the link's "
        "rate each way (docs/network.md). Each framework's achieved bandwidth is its bytes per "
        "step over its exposed grad_comm time per step; where the framework hides its "
        "exchange inside backward (DDP), there is no exposed time to divide by and the "
        "cell says not set."
    )
    for (nodes, processes, rate), probe in sorted(found.items(), key=str):
        hosts = probe["hosts"].iloc[0]
        link = probe["link_bytes_per_s"].iloc[0] / 1e6 if "link_bytes_per_s" in probe else None
        network = f"emulated {rate} Mbit/s" if rate else "their own network"
        out.table(
            probe.drop(columns=["hosts", "link_bytes_per_s"])
            .rename(columns={"algbw_bytes_per_s": "algbw_mb_s", "busbw_bytes_per_s": "busbw_mb_s"})
            .assign(
                algbw_mb_s=lambda t: t["algbw_mb_s"] / 1e6,
                busbw_mb_s=lambda t: t["busbw_mb_s"] / 1e6,
            ),
            caption=f"MPI all-reduce probe, {processes} processes on {humanize.count(nodes, 'node')} "
            f"({hosts}), {network}; each link carries "
            f"{humanize.number(link, 'MB/s')} (Sendrecv ring)",
        )
    steps = read_table(ctx.tables / "step_stats.parquet")
    table = compare(ctx.runs, steps, found)
    return out.table(table, caption="achieved against the probe")
