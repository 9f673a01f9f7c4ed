"""Energy of a run, from whatever meters a node offers.

Three sources, each either measuring or saying in one line why it cannot:
- ``rapl``: the CPU packages and their DRAM, from the kernel's powercap
  interface (/sys/class/powercap/intel-rapl:<i>[:<j>]). AMD Zen processors
  appear under the same intel-rapl zones (package only). Read on every node
  during training by a :class:`Sampler`.
- ``nvml``: every NVIDIA GPU of the node, through nvidia-ml-py: the energy
  counter (Volta and later) or, failing that, power samples integrated over
  time. Also read by the Sampler.
- ``kwollect``: the whole node's wall power on Grid'5000 (wattmeters, or the
  node's BMC), asked from the metrics API after the run for the run's nodes
  and time window.

Every source ends as the same thing: series of (unix_s, joules) per host and
domain, joules cumulative since the series' start. Samplers write them to
``energy_samples.rank<r>.tsv`` (and their sources' status to
``energy_sources.rank<r>.json``); Kwollect's go to the ``.kwollect`` pair.
:func:`write_run_energy` turns them into the run's ``energy.json``.

What is counted: Kwollect's node power when it measured every node (it
includes CPUs, GPUs and the rest); otherwise RAPL plus NVML, each only when
it measured every node (a figure missing a node would be wrong, not partial).

This module is imported by the training processes of every framework
environment: standard library only (nvidia-ml-py where installed).
"""

from __future__ import annotations

import bisect
import csv
import json
import os
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from collections.abc import Mapping
from typing import Any, TextIO

from runfiles import names, variables
from runfiles.names import ENERGY, EPOCHS, METRICS
from runfiles.atomic import write_json
from runfiles.run_config import RunConfig

SAMPLE_COLUMNS = ("host", "source", "domain", "unix_s", "joules")
SAMPLES_GLOB = names.ENERGY_SAMPLES_GLOB
SOURCES_GLOB = names.ENERGY_SOURCES_GLOB
POWERCAP = Path(variables.value("DDLC_POWERCAP_DIR"))
# Whole-node power metrics, best first: the wattmeters measure at the plug;
# the BMC's figure comes from the power supplies.
KWOLLECT_METRICS = ("wattmetre_power_watt", "bmc_node_power_watt")
# How far outside a series a window end may fall and still read the series'
# end value (a clock read a moment after the sampler's last sample).
EDGE_TOLERANCE_S = 2.0


class Unavailable(Exception):
    """A source that cannot measure here; the message says why, in one line."""


# ---------------------------------------------------------------- meters


class PowerIntegral:
    """Joules from power samples: the trapezoid rule, one sample at a time."""

    def __init__(self):
        self.joules = 0.0
        self.last: tuple[float, float] | None = None

    def add(self, unix_s: float, watts: float) -> float:
        if self.last is not None:
            t0, w0 = self.last
            self.joules += (w0 + watts) / 2 * (unix_s - t0)
        self.last = (unix_s, watts)
        return self.joules


@dataclass
class RaplZone:
    domain: str  # package-<i> or dram-<i>
    energy_file: Path
    max_uj: int
    last_uj: int = 0
    joules: float = 0.0

    def read_uj(self) -> int:
        try:
            return int(self.energy_file.read_text())
        except PermissionError:
            raise Unavailable(
                f"{self.energy_file} is readable by root only (Linux made RAPL counters "
                "root-only in 2020, CVE-2020-8694): run as root, or have it made readable "
                "(chmod o+r, or a udev rule)"
            ) from None

    def advance(self) -> float:
        now = self.read_uj()
        delta = now - self.last_uj
        if delta < 0:  # the counter wrapped at max_energy_range_uj
            delta += self.max_uj
        self.last_uj = now
        self.joules += delta / 1e6
        return self.joules


class RaplMeter:
    """CPU package and DRAM energy from powercap. Core and uncore (subzones
    inside the package) and psys (the whole SoC) are not counted: they would
    count the same joules twice."""

    name = "rapl"

    def __init__(self, powercap: Path = POWERCAP):
        self.powercap = Path(powercap)
        self.zones: list[RaplZone] = []

    def open(self) -> None:
        if not self.powercap.is_dir():
            raise Unavailable(
                f"no {self.powercap}: this kernel exposes no power capping "
                "interface (a virtual machine, or a container without it)"
            )
        for path in sorted(self.powercap.glob("intel-rapl:*"), key=_zone_order):
            parts = path.name.split(":")[1:]
            kind = (path / "name").read_text().strip()
            if len(parts) == 1 and kind.startswith("package-"):
                domain = kind
            elif len(parts) == 2 and kind == "dram":
                domain = f"dram-{parts[0]}"
            else:
                continue
            max_uj = int((path / "max_energy_range_uj").read_text())
            self.zones.append(RaplZone(domain, path / "energy_uj", max_uj))
        if not self.zones:
            raise Unavailable(
                f"no RAPL package zone under {self.powercap} (the CPU has no "
                "RAPL, or the intel_rapl_msr module is not loaded)"
            )
        for zone in self.zones:
            zone.last_uj = zone.read_uj()

    def read(self) -> dict[str, float]:
        return {zone.domain: zone.advance() for zone in self.zones}

    def close(self) -> None:
        pass


def _zone_order(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in path.name.split(":")[1:] if p.isdigit())


class NvmlMeter:
    """Every GPU of the node through NVML: its energy counter (mJ since the
    driver loaded; Volta and later) or its power (mW) integrated."""

    name = "nvml"

    def __init__(self):
        self.nvml = None
        self.gpus: list = []  # (domain, handle, start_mj or PowerIntegral)

    def open(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise Unavailable("nvidia-ml-py is not installed in this environment") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise Unavailable(f"NVML cannot start: {exc} (no NVIDIA driver on this node)") from None
        self.nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise Unavailable("NVML sees no GPU on this node")
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                start = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            except pynvml.NVMLError_NotSupported:
                start = PowerIntegral()  # before Volta: power only
            self.gpus.append((f"gpu{i}", handle, start))
        self.read()

    def read(self) -> dict[str, float]:
        out = {}
        now = time.time()
        for domain, handle, start in self.gpus:
            if isinstance(start, PowerIntegral):
                watts = self.nvml.nvmlDeviceGetPowerUsage(handle) / 1e3
                out[domain] = start.add(now, watts)
            else:
                out[domain] = (self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle) - start) / 1e3
        return out

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.nvmlShutdown()


def node_meters() -> list:
    return [RaplMeter(), NvmlMeter()]


# ---------------------------------------------------------------- sampler


class Sampler:
    """Reads every meter of this node each ``interval_s`` seconds in a
    background thread, appending cumulative joules to the node's samples
    file as it goes (a killed run keeps what it measured)."""

    def __init__(self, run_dir: Path, rank: int, interval_s: float, meters=None):
        self.run_dir, self.rank, self.interval_s = Path(run_dir), rank, interval_s
        self.host = socket.gethostname()
        self.meters = node_meters() if meters is None else meters
        self.status: dict[str, dict] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="energy-sampler", daemon=True)
        self.file: TextIO | None = None
        self.start_unix: float | None = None
        self.end_unix: float | None = None

    def start(self) -> Sampler:
        live = []
        for meter in self.meters:
            try:
                meter.open()
                live.append(meter)
                self.status[meter.name] = {"available": True}
            except (Unavailable, OSError) as exc:
                self.status[meter.name] = {"available": False, "reason": str(exc)}
        self.meters = live
        self.file = open(self.run_dir / names.energy_samples(f"rank{self.rank}"), "w")
        self.file.write("\t".join(SAMPLE_COLUMNS) + "\n")
        self.start_unix = time.time()
        self._sample()
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        out = self.file
        assert out is not None, "start() opens the samples file"
        for meter in list(self.meters):
            now = time.time()
            try:
                readings = meter.read()
            except (Unavailable, OSError, ValueError) as exc:  # a counter gone bad mid-run
                self.status[meter.name] = {"available": False, "reason": str(exc)}
                self.meters.remove(meter)
                continue
            for domain, joules in readings.items():
                out.write(f"{self.host}\t{meter.name}\t{domain}\t{now:.3f}\t{joules:.6f}\n")
        out.flush()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self._sample()
        self.end_unix = time.time()
        if self.file is not None:
            self.file.close()
        for meter in self.meters:
            meter.close()
        write_json(
            self.run_dir / names.energy_sources(f"rank{self.rank}"),
            {
                "host": self.host,
                "rank": self.rank,
                "interval_s": self.interval_s,
                "start_unix": self.start_unix,
                "end_unix": self.end_unix,
                "sources": self.status,
            },
        )


# One sampler per node: the training loops start it in the process with
# local rank 0, right after the framework's init, and stop it at the end.
_running: Sampler | None = None


def start_sampling(config: RunConfig, run_dir: Path, dist) -> None:
    global _running
    if dist.local_rank == 0:
        _running = Sampler(run_dir, dist.rank, config["energy_interval_s"]).start()


def stop_sampling() -> None:
    global _running
    if _running is not None:
        _running.stop()
        _running = None


# ---------------------------------------------------------------- Kwollect


def grid5000_site(host_names: list[str], env: Mapping[str, str]) -> str | None:
    """The Grid'5000 site of an OAR job's nodes (their names are
    <node>.<site>.grid5000.fr), or None when this is not such a job."""
    if not (env.get("OAR_JOB_ID") or env.get("OAR_NODEFILE")):
        return None
    sites = {
        m.group(1) for n in host_names if (m := re.fullmatch(r"[^.]+\.([^.]+)\.grid5000\.fr", n))
    }
    return sites.pop() if len(sites) == 1 and host_names else None


def kwollect_url(api: str, site: str, nodes: list[str], start: float, end: float) -> str:
    query = urllib.parse.urlencode(
        {
            "nodes": ",".join(nodes),
            "metrics": ",".join(KWOLLECT_METRICS),
            "start_time": int(start),
            "end_time": int(end) + 1,
        }
    )
    return f"{api.rstrip('/')}/sites/{site}/metrics?{query}"


def kwollect_series(records: list[dict]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """The API's records ({"timestamp", "device_id", "metric_id", "value",
    "labels"}) as cumulative joules per (node, domain). A node fed by
    several wattmeter ports has one domain per port (labels._device_orig),
    summed later."""
    power: dict[tuple[str, str], dict[float, float]] = {}
    for rec in records:
        if rec.get("value") is None:
            continue
        origin = (rec.get("labels") or {}).get("_device_orig") or []
        domain = rec["metric_id"] + (f"@{origin[0]}" if origin else "")
        unix_s = datetime.fromisoformat(rec["timestamp"]).timestamp()
        power.setdefault((rec["device_id"], domain), {})[unix_s] = float(rec["value"])
    series = {}
    for key, points in power.items():
        integral = PowerIntegral()
        series[key] = [(t, integral.add(t, points[t])) for t in sorted(points)]
    return series


def query_kwollect(
    run_dir: Path,
    host_names: list[str],
    start: float,
    end: float,
    env: Mapping[str, str] | None = None,
    patience_s: float = 30.0,
) -> None:
    """Ask Grid'5000's metrics API for the nodes' power over [start, end] and
    write it as the run's kwollect samples and status. Off Grid'5000 only
    the status is written, with the reason."""
    env = os.environ if env is None else env
    run_dir = Path(run_dir)
    nodes = [n.split(".")[0] for n in host_names]
    site = grid5000_site(host_names, env)
    status: dict[str, dict] = {}
    series: dict = {}
    if site is None:
        reason = "not a Grid'5000 job (no OAR job on <node>.<site>.grid5000.fr hosts)"
        status = {n: {"available": False, "reason": reason} for n in nodes}
    else:
        url = kwollect_url(
            variables.value("DDLC_KWOLLECT_API", env), site, nodes, start - 5, end + 5
        )
        series, problem = _fetch_covering(url, nodes, end, patience_s)
        for node in nodes:
            if problem:
                status[node] = {"available": False, "reason": problem}
            elif not any(host == node for host, _ in series):
                status[node] = {
                    "available": False,
                    "reason": f"Kwollect has no power metric for {node} "
                    f"({', '.join(KWOLLECT_METRICS)}) in the run's window",
                }
            else:
                status[node] = {"available": True}
    with open(run_dir / names.energy_samples("kwollect"), "w") as out:
        out.write("\t".join(SAMPLE_COLUMNS) + "\n")
        for (node, domain), points in sorted(series.items()):
            for t, joules in points:
                out.write(f"{node}\tkwollect\t{domain}\t{t:.3f}\t{joules:.6f}\n")
    write_json(
        run_dir / names.energy_sources("kwollect"),
        {"source": "kwollect", "start_unix": start, "end_unix": end, "hosts": status},
    )


def _fetch_covering(url: str, nodes: list[str], end: float, patience_s: float):
    """The API's series once every node's reach the window's end (its data
    arrive a few seconds late), or whatever there is after ``patience_s``."""
    deadline = time.time() + patience_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                series = kwollect_series(json.load(response))
        except (OSError, ValueError, KeyError) as exc:
            return {}, f"Kwollect query failed: {exc} ({url})"
        last = {host: pts[-1][0] for (host, _), pts in series.items()}
        if all(last.get(n, 0) >= end for n in nodes) or time.time() >= deadline:
            return series, None
        time.sleep(min(5.0, max(0.0, deadline - time.time())))


# ---------------------------------------------------------------- run figures


@dataclass
class Series:
    host: str
    source: str
    domain: str
    times: list[float] = field(default_factory=list)
    joules: list[float] = field(default_factory=list)

    def at(self, unix_s: float) -> float | None:
        """Cumulative joules at ``unix_s``, linear between samples."""
        if not self.times or not (
            self.times[0] - EDGE_TOLERANCE_S <= unix_s <= self.times[-1] + EDGE_TOLERANCE_S
        ):
            return None
        i = bisect.bisect_left(self.times, unix_s)
        if i == 0:
            return self.joules[0]
        if i == len(self.times):
            return self.joules[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        j0, j1 = self.joules[i - 1], self.joules[i]
        return j0 + (j1 - j0) * (unix_s - t0) / (t1 - t0) if t1 > t0 else j1


def read_samples(run_dir: Path) -> list[Series]:
    """Every series of the run, one sampler per host (the lowest rank where
    two samplers shared a host: counting both would count it twice)."""
    found: dict[tuple[str, str, str], Series] = {}
    owner: dict[tuple[str, str], str] = {}
    for path in sorted(Path(run_dir).glob(SAMPLES_GLOB), key=_sampler_order):
        with open(path, newline="") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                host_source = (row["host"], row["source"])
                if owner.setdefault(host_source, path.name) != path.name:
                    continue
                try:
                    unix_s, joules = float(row["unix_s"]), float(row["joules"])
                except (TypeError, ValueError):
                    continue  # the last line of a sampler killed while writing
                key = (row["host"], row["source"], row["domain"])
                series = found.setdefault(key, Series(*key))
                series.times.append(unix_s)
                series.joules.append(joules)
    return list(found.values())


def _sampler_order(path: Path):
    tag = path.name.split(".")[1]
    return (0, int(tag[4:])) if tag.startswith("rank") else (1, tag)


def read_status(run_dir: Path) -> dict[str, dict[str, dict]]:
    """source -> host -> {"available", "reason" (when not), "start_unix",
    "end_unix" (the window it was read over)}, from every sampler and from
    Kwollect."""
    status: dict[str, dict[str, dict]] = {}
    for path in sorted(Path(run_dir).glob(SOURCES_GLOB), key=_sampler_order):
        doc = _read_json(path)
        if doc is None:
            continue
        window = {"start_unix": doc["start_unix"], "end_unix": doc["end_unix"]}
        if "hosts" in doc:  # Kwollect: one file for all nodes
            for host, state in doc["hosts"].items():
                status.setdefault(doc["source"], {})[host] = {**state, **window}
            continue
        for source, state in doc["sources"].items():
            status.setdefault(source, {}).setdefault(doc["host"], {**state, **window})
    return status


def counted_sources(status: dict[str, dict[str, dict]]) -> list[str]:
    """Which sources make the run's figure (see the module's docstring)."""
    complete = [
        s for s, hosts in status.items() if hosts and all(h["available"] for h in hosts.values())
    ]
    if "kwollect" in complete:
        return ["kwollect"]
    return [s for s in ("rapl", "nvml") if s in complete]


def counted_series(series: list[Series], sources: list[str]) -> list[Series]:
    """The series that make the figure: for Kwollect, the best metric each
    node has (all its ports), not every metric (they measure the same watts)."""
    chosen = [s for s in series if s.source in sources]
    if sources != ["kwollect"]:
        return chosen
    best: dict[str, int] = {}
    for s in chosen:
        rank = _kwollect_rank(s.domain)
        best[s.host] = min(best.get(s.host, rank), rank)
    return [s for s in chosen if _kwollect_rank(s.domain) == best[s.host]]


def _kwollect_rank(domain: str) -> int:
    metric = domain.split("@")[0]
    return KWOLLECT_METRICS.index(metric) if metric in KWOLLECT_METRICS else len(KWOLLECT_METRICS)


def energy_until(series: list[Series], unix_t: float) -> float | None:
    """Joules of the given series from their start to ``unix_t``; None when
    a series does not reach that time. Energy to an accuracy reached at time
    t (run clock) is energy_until(s, t) - energy_until(s, clock start)."""
    values = [v for v in (s.at(unix_t) for s in series) if v is not None]
    if not values or len(values) < len(series):
        return None
    return sum(v - s.joules[0] for v, s in zip(values, series))


def energy_between(series: list[Series], t0: float, t1: float) -> float | None:
    start, end = energy_until(series, t0), energy_until(series, t1)
    return None if start is None or end is None else end - start


def status_text(status: dict[str, dict[str, dict]], sources: list[str]) -> str:
    if sources:
        return "measured: " + "+".join(sources)
    reasons = []
    for source, hosts in sorted(status.items()):
        seen = sorted({f"{h['reason']}" for h in hosts.values() if not h["available"]})
        reasons += [f"{source}: {r}" for r in seen]
    return "not available: " + ("; ".join(reasons) or "no energy source ran")


def run_window(run_dir: Path, states: list[dict]) -> tuple[float, float] | None:
    """The run clock's window (start to the last epoch's end) where the run
    wrote one; otherwise the window that every given source read."""
    metrics = _read_json(Path(run_dir) / METRICS) or {}
    epochs = epoch_ends(run_dir)
    if metrics.get("clock_start_unix") and epochs:
        return metrics["clock_start_unix"], metrics["clock_start_unix"] + epochs[-1][1]
    if not states:
        return None
    return max(s["start_unix"] for s in states), min(s["end_unix"] for s in states)


def epoch_ends(run_dir: Path) -> list[tuple[int, float]]:
    """(epoch, elapsed_s) from epochs.tsv, where it has the run clock."""
    path = Path(run_dir) / EPOCHS
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [(int(r["epoch"]), float(r["elapsed_s"])) for r in rows if r.get("elapsed_s")]


def epoch_energies(run_dir: Path, series: list[Series]) -> list[dict]:
    """Joules in each epoch's window on the run clock, and since the clock's
    start through that epoch (for energy to accuracy)."""
    metrics = _read_json(Path(run_dir) / METRICS) or {}
    clock = metrics.get("clock_start_unix")
    if not clock or not series:
        return []
    rows, previous = [], 0.0
    for epoch, elapsed in epoch_ends(run_dir):
        rows.append(
            {
                "epoch": epoch,
                "energy_j": energy_between(series, clock + previous, clock + elapsed),
                "energy_to_epoch_j": energy_between(series, clock, clock + elapsed),
            }
        )
        previous = elapsed
    return rows


def summarize(run_dir: Path) -> dict:
    """energy.json's content: each source's state and joules per host and
    domain over the run's window, the counted total and its status."""
    series, status = read_samples(run_dir), read_status(run_dir)
    sources = counted_sources(status)
    chosen = counted_series(series, sources)
    window = run_window(
        run_dir, [state for source in (sources or status) for state in status[source].values()]
    )
    doc: dict[str, Any] = {
        "sources": {},
        "counted": sources,
        "status": status_text(status, sources),
        "start_unix": window[0] if window else None,
        "end_unix": window[1] if window else None,
    }
    for source, hosts in status.items():
        doc["sources"][source] = {}
        for host, state in hosts.items():
            entry = dict(state)
            if state["available"] and window:
                entry["joules"] = {
                    s.domain: energy_between([s], *window)
                    for s in series
                    if s.source == source and s.host == host
                }
            doc["sources"][source][host] = entry
    doc["joules"] = energy_between(chosen, *window) if chosen and window else None
    if doc["joules"] is None and sources:
        doc["status"] = "not available: the samples do not cover the run's window"
    doc["epochs"] = epoch_energies(run_dir, chosen) if doc["joules"] is not None else []
    return doc


def write_run_energy(
    run_dir: Path, host_names: list[str], start: float, end: float, env: dict | None = None
) -> dict:
    """After a run: Kwollect for its nodes and window, then energy.json."""
    query_kwollect(run_dir, host_names, start, end, env)
    doc = summarize(run_dir)
    write_json(Path(run_dir) / ENERGY, doc)
    return doc


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
