"""Emulated nodes with cores of their own (the design's ``cores_per_node``).

On one machine the nodes of a design share its cores: two "nodes" of one
rank each on 2 busy cores are not two one-core machines. With
``cores_per_node`` set, node i gets cores ``[i * c, (i + 1) * c)`` of those
the runner may use, and everything started in it (the launcher in node 0,
the ranks the ssh shim starts in the others) runs confined to them.

How: the processes' CPU affinity, set by ``taskset`` as each node is
entered and inherited by every child. A cgroup v2 cpuset would also hold a
process that resets its own affinity, but it needs a writable cgroup tree,
which containers rarely grant; the affinity is what every Linux allows. So
the run checks it: each rank reads its affinity back into its record
(frameworks/common.py's ``cpus``), and a rank that could use a core outside
its node's fails the run (``check``). run.json records the cores of each
node and the mechanism (``cores``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

MECHANISM = "affinity (taskset, inherited by the node's processes)"


class CoresError(RuntimeError):
    """The cores asked for cannot be given; the message says why and what to do."""


def node_cpus(
    config: Mapping[str, Any], available: set[int] | None = None
) -> list[list[int]] | None:
    """The cores of each node, or None where ``cores_per_node`` is not set."""
    per_node = config.get("cores_per_node")
    if per_node is None:
        return None
    cpus = sorted(os.sched_getaffinity(0) if available is None else available)
    nodes = config["nodes"]
    if nodes * per_node > len(cpus):
        raise CoresError(
            f"cores_per_node: {nodes} node(s) x {per_node} core(s) need {nodes * per_node} "
            f"cores, and this runner may use {len(cpus)} ({span(cpus)}); lower "
            "cores_per_node or nodes, or set cores_per_node: null"
        )
    return [cpus[i * per_node : (i + 1) * per_node] for i in range(nodes)]


def confine(cpus: list[int] | None, argv: list[str]) -> list[str]:
    """argv confined to ``cpus`` (unchanged where None)."""
    return argv if cpus is None else ["taskset", "--cpu-list", span(cpus), *argv]


def record(cpus: list[list[int]] | None, hostnames: list[str]) -> dict | None:
    """What run.json keeps of the confinement: each node's host name and
    cores, and how they were given."""
    if cpus is None:
        return None
    return {"per_node": len(cpus[0]), "nodes": cpus, "hostnames": hostnames, "mechanism": MECHANISM}


def check(asked: dict | None, ranks: list[dict]) -> str | None:
    """Why the ranks were not confined as asked (None when they were, or
    when nothing was asked): each rank's affinity, read back, must lie in
    its node's cores (a rank's node found by its host name; one node: all)."""
    if not asked:
        return None
    cpus, hostnames = asked["nodes"], asked["hostnames"]
    for rank in ranks:
        seen = rank.get("cpus")
        if seen is None:
            return f"cores_per_node: rank {rank.get('rank')} did not read its cores back"
        node = hostnames.index(rank["hostname"]) if rank.get("hostname") in hostnames else 0
        if not set(seen) <= set(cpus[node]):
            return (
                f"cores_per_node: rank {rank.get('rank')} could run on cores {span(seen)}, "
                f"outside its node's {span(cpus[node])}: something reset its affinity "
                "(a launcher's binding); the run is not confined as designed"
            )
    return None


def span(cpus: list[int]) -> str:
    """A CPU list as taskset and the kernel write it: 0-3,6."""
    parts, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            parts.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(parts)


def cpu_list(text: str) -> list[int]:
    """A CPU list as taskset and the kernel write it (0-3,6), as numbers."""
    found: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        found += range(int(low), int(high or low) + 1)
    return found
