"""Where the figures hold: the conditions of the runs, as columns of the
runs table and as the summary's first lines.

Each run's run.json keeps its ``conditions`` (ddlcompare/run/conditions.py:
what the ranks read back of their cores, threads and CPU, the ranks per
node, what other processes took of the machine while it measured, the
network). The runs table gets them as columns (``columns``); the summary
opens on them (``lines``): the conditions of the runs it summarises, and,
where some were measured beside heavy foreign load or on different CPUs,
that before any figure.
"""

from __future__ import annotations

import pandas as pd

from analysis import humanize
from runfiles import cpu as cpus

COLUMNS = (
    "cores_per_rank",
    "own_cores",
    "compute_threads",
    "ranks_per_node",
    "runnable_per_core",
    "machine_shared",
    "network",
    "cpu",
)
# Between one host's CPU and the next in a run whose hosts' CPUs differ
# (the CPU's own words hold commas).
HOST_SEPARATOR = " / "
UNRECORDED = "not recorded"
# Clean runs a cell needs before the summary ranks on them alone.
CLEAN_MIN = 3


def columns(record: dict) -> dict:
    """The runs table's conditions columns from one run.json (None where
    the run recorded none: an older run, or one that never started)."""
    found = record.get("conditions") or {}
    cores = found.get("cores_per_rank")
    threads = [t for t in found.get("compute_threads") or [] if t is not None]
    per_node = found.get("ranks_per_node")
    return {
        "cores_per_rank": cores[0] if cores else None,
        "own_cores": found.get("own_cores"),
        "compute_threads": max(threads) if threads else None,
        "ranks_per_node": max(per_node) if per_node else None,
        "runnable_per_core": found.get("runnable_per_core"),
        "machine_shared": found.get("machine_shared"),
        "network": network_words(found.get("network")),
        "cpu": cpu_words(found.get("cpu"), record.get("ranks") or []),
    }


def cpu_words(cpu: dict | None, ranks: list) -> str | None:
    """The run's CPU in words, each host's where they differ; an older
    run.json without it: its first rank's model name, if it said one."""
    if cpu is None:
        return cpus.words(ranks[0].get("cpu")) if ranks else None
    if "per_host" not in cpu:
        return cpus.words(cpu)
    return HOST_SEPARATOR.join(
        f"{host}: {cpus.words(one) or UNRECORDED}" for host, one in cpu["per_host"].items()
    )


def network_words(network: dict | None) -> str | None:
    if not network:
        return None
    if network.get("emulated"):
        delay = f", {network['delay_ms']:g} ms delay" if network.get("delay_ms") else ""
        return f"emulated {network['rate_mbit']} Mbit/s{delay}"
    nics = network.get("interfaces") or {}
    named = ", ".join(f"{n} {s} Mbit/s" if s else n for n, s in nics.items())
    return f"this machine's own ({named or 'loopback only'})"


def lines(runs: pd.DataFrame) -> list[str]:
    """The summary's first lines: the conditions of the ok runs, and where
    runs were measured beside heavy foreign load, that, before any figure."""
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    if ok.empty:
        return []
    said = [f"Conditions of the {len(ok)} successful runs: {_machine(ok)}; {_ranks(ok)}."]
    if mixed := _mixed_cpus(ok):
        said.append(
            f"The runs were measured on {mixed}: figures compared across them mix machines, "
            "and a ranking may hold on one CPU and not on another."
        )
    if loaded := _loaded(ok):
        said.append(loaded)
    return said


def brief(runs: pd.DataFrame, compared: pd.DataFrame | None = None) -> str:
    """The conditions of a few runs compared with each other, in one
    phrase: cores a rank could use and whether compute threads took every
    core, ranks per node, the network, the device and the CPU; first, where
    the runs ``compared`` with them (by default these) ran on different
    CPUs, that."""
    mixed = _mixed_cpus(runs if compared is None else compared)
    said = [f"measured on {mixed}: figures compared across them mix machines"] if mixed else []
    said.append(_ranks(runs))
    if "runnable_per_core" in runs and runs["runnable_per_core"].notna().any():
        taken = int((runs["runnable_per_core"] >= 1).sum())
        said.append(
            "every core taken by compute threads"
            if taken == len(runs)
            else "a core free beside the compute threads"
            if taken == 0
            else f"every core taken by compute threads in {taken} of {len(runs)} runs"
        )
    if networks := _values(runs, "network"):
        said.append(f"network: {'; '.join(networks)}")
    if devices := _values(runs, "device"):
        said.append(f"device {', '.join(devices)}")
    if not mixed and (cpu := _distinct_cpus(runs)):
        said.append(f"CPU {cpu[0]}")
    return "; ".join(said)


def _values(ok: pd.DataFrame, column: str) -> list:
    if column not in ok:
        return []
    return sorted({v for v in ok[column].dropna().tolist()}, key=str)


def _span(values: list, one: str, many: str, after: str = "") -> str:
    """ "1 core", "2 cores", "1 to 2 cores", then ``after``."""
    low, high = min(values), max(values)
    if low == high:
        return f"{low:g} {one if low == 1 else many}{after}"
    return f"{low:g} to {high:g} {many}{after}"


def _distinct_cpus(runs: pd.DataFrame) -> list[str]:
    """The CPUs the runs recorded, each once: a run whose hosts differ
    counts each host's it knows."""
    found = set()
    for cell in _values(runs, "cpu"):
        if HOST_SEPARATOR not in cell:
            found.add(cell)
            continue
        for host in cell.split(HOST_SEPARATOR):
            found.add(host.split(": ", 1)[-1])
    return sorted(found - {UNRECORDED})


def _mixed_cpus(runs: pd.DataFrame) -> str | None:
    """ "2 different CPUs (A; B)" where the runs' CPUs differ, else None."""
    found = _distinct_cpus(runs)
    if len(found) < 2:
        return None
    return f"{len(found)} different CPUs ({'; '.join(found)})"


def _machine(ok: pd.DataFrame) -> str:
    cpu = _distinct_cpus(ok)
    cores = _values(ok, "machine_cores")
    devices = _values(ok, "device")
    networks = _values(ok, "network")
    # several: the next line names them, before any figure
    where = f"CPU {cpu[0]}" if len(cpu) == 1 else f"{len(cpu)} different CPUs" if cpu else ""
    where = where or "a machine not recorded"
    if cores:
        where += f" ({_span(cores, 'core', 'cores')})"
    if devices:
        where += f", device {', '.join(devices)}"
    if networks:
        where += f", network: {'; '.join(networks)}"
    return where


def _ranks(ok: pd.DataFrame) -> str:
    parts = []
    if per_node := _values(ok, "ranks_per_node"):
        parts.append(_span(per_node, "rank", "ranks", " per node"))
    if cores := _values(ok, "cores_per_rank"):
        own = "own_cores" in ok and ok["own_cores"].fillna(False).astype(bool).all()
        after = " a rank could use" + (" (nodes with cores of their own)" if own else "")
        parts.append(_span(cores, "core", "cores", after))
    if threads := _values(ok, "compute_threads"):
        parts.append(_span(threads, "compute thread", "compute threads", " per rank"))
    if (runnable := _values(ok, "runnable_per_core")) and max(runnable) > 1:
        crowded = int((ok["runnable_per_core"] > 1).sum())
        parts.append(
            f"in {crowded} of {len(ok)} runs more compute threads than cores "
            f"(up to {max(runnable):g} a core): there the ranks slow each other down on "
            "this test bed, whatever the framework does"
        )
    return "; ".join(parts) if parts else "cores and threads of the ranks not recorded"


def _loaded(ok: pd.DataFrame) -> str | None:
    if "loaded" not in ok:
        return None
    loaded = ok[ok["loaded"].fillna(False).astype(bool)]
    if loaded.empty:
        return None
    share = loaded["foreign_cpu_share"].dropna()
    why = []
    if len(share):
        low, high = (humanize.percent(v, 2) for v in (share.min(), share.max()))
        why.append(
            f"other processes took {low if low == high else f'{low} to {high}'} of the CPU while they measured"
        )
    if "machine_shared" in loaded and (shared := int(loaded["machine_shared"].eq(True).sum())):
        why.append(
            f"{shared} of them held the machine shared with other runs of ours that only "
            "checked correctness (DDLC_MACHINE_SHARED): no measurement"
        )
    took = f" ({'; '.join(why)})" if why else ""
    return (
        f"{len(loaded)} of {len(ok)} runs were measured beside heavy foreign load{took}: "
        "their figures hold for a busy machine, not for a quiet one or a cluster node, and "
        f"every figure below includes them. Rankings of the clean runs alone follow where "
        f"each framework of a cell has at least {CLEAN_MIN} of them."
    )
