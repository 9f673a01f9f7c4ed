"""Where a run's figures hold: the conditions it was measured under.

run.json's ``conditions``, written by the runner once the ranks have
finished, from what the ranks read back of themselves (their records'
``cpus``, ``compute_threads``, ``hostname``), what the runner measured
beside them (``machine_load``) and the network it gave them:

- ``ranks_per_node``: the ranks found on each host, read back;
- ``cores_per_rank``: the fewest and most cores a rank could run on (its
  affinity), and ``own_cores`` when the nodes had cores of their own
  (cores_per_node);
- ``compute_threads``: the threads each rank's framework can run kernels
  on at once (frameworks/common.py: TensorFlow's inter-op pool counts), and
  ``runnable_per_core``: the compute threads of a node's ranks per core
  those ranks could use, the busiest node's: above 1, ranks slow each other
  down on this test bed whatever the framework does;
- ``foreign_cpu_share`` and ``loaded``: what other processes took of the
  run's cores (the machine's, or those it was confined to) while the run
  measured (ddlcompare/run/machine_load.py);
- ``machine_shared``: the run held the machine shared with other runs of
  ours that only check correctness (machine_lock.shared_mode: the test
  suite's), not alone: its figures are no measurement;
- ``network``: the emulated link's rate and delay, or the machine's own
  interfaces with their speed; ``device``: the design's device and the
  machine's cores;
- ``cpu``: the CPU the ranks ran on, as they read it (runfiles/cpu.py:
  model, vendor, family/model/stepping, widest vector extension, whether
  under a hypervisor); ``{"per_host": {host: cpu}}`` where the ranks' hosts
  have different CPUs; None where no rank said (an older run).
"""

from __future__ import annotations

import json

from runfiles import files
from collections import defaultdict
from pathlib import Path

import psutil


def of_run(record: dict, network_json: Path) -> dict:
    """The conditions of the run whose run.json is ``record``."""
    ranks = record.get("ranks") or []
    config = record.get("config") or {}
    load = record.get("machine_load") or {}
    per_host = defaultdict(list)
    for rank in ranks:
        per_host[rank.get("hostname")].append(rank)
    sizes = [len(r["cpus"]) for r in ranks if r.get("cpus") is not None]
    return {
        "ranks_per_node": sorted(len(v) for v in per_host.values()) or None,
        "cores_per_rank": [min(sizes), max(sizes)] if sizes else None,
        "own_cores": bool(record.get("cores")),
        "compute_threads": [r.get("compute_threads") for r in ranks] or None,
        "runnable_per_core": runnable_per_core(per_host.values()),
        "foreign_cpu_share": load.get("foreign_cpu_share"),
        "loaded": load.get("loaded"),
        "machine_shared": bool(record.get("machine_shared")),
        "network": network(network_json),
        "device": config.get("device"),
        "machine_cores": psutil.cpu_count(),
        "cpu": cpu_of(per_host),
    }


def cpu_of(per_host: dict) -> dict | None:
    """The ranks' CPU, or each host's where they differ or some host's is
    unknown (None); a host's first rank speaks for it (one machine's
    processors agree)."""
    said = {
        str(host): cpu if isinstance(cpu := ranks[0].get("cpu"), dict) else None
        for host, ranks in per_host.items()
    }
    distinct = {json.dumps(cpu, sort_keys=True) for cpu in said.values()}
    if not any(said.values()):
        return None
    if len(distinct) == 1:
        return next(iter(said.values()))
    return {"per_host": dict(sorted(said.items()))}


def runnable_per_core(nodes) -> float | None:
    """The compute threads of a node's ranks per core they could use, on
    the busiest node; None where a rank did not say."""
    worst = None
    for ranks in nodes:
        if any(r.get("cpus") is None or not r.get("compute_threads") for r in ranks):
            return None
        cpus = set().union(*(set(r["cpus"]) for r in ranks))
        ratio = sum(r["compute_threads"] for r in ranks) / len(cpus)
        worst = ratio if worst is None else max(worst, ratio)
    return None if worst is None else round(worst, 3)


def network(network_json: Path) -> dict:
    """The emulated link (network.json) or the machine's own interfaces."""
    try:
        emulated = files.read_json(network_json)
    except (OSError, ValueError):
        emulated = None
    if emulated:
        return {
            "emulated": True,
            "rate_mbit": emulated.get("rate_mbit"),
            "delay_ms": emulated.get("delay_ms"),
        }
    return {
        "emulated": False,
        "interfaces": {
            name: stats.speed or None
            for name, stats in sorted(psutil.net_if_stats().items())
            if stats.isup and name != "lo"
        },
    }
