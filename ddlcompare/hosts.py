"""Schedulers, seen from inside a job: where the host list comes from.

Each source turns its scheduler's description of the allocation into the
same thing, a list of (host, slots). The launchers only ever see that list.
"""
from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def detect(nodes: int, procs_per_node: int, env: dict | None = None) -> tuple[str, list[Host]]:
    """The scheduler this job runs under and the hosts it was given.

    Each host gets ``procs_per_node`` slots: the design says how many
    processes a node runs, whatever the scheduler counts (cores, GPUs).
    """
    env = os.environ if env is None else env
    if env.get("DDLC_NETNS_MAP"):
        # The emulated network of ddlcompare/netem.py: its nodes are network
        # namespaces of this machine, named by their addresses.
        names = [pair.split("=")[0] for pair in env["DDLC_NETNS_MAP"].split()]
        source = "netns"
    elif env.get("OAR_NODEFILE"):
        names = oar_hosts(open(env["OAR_NODEFILE"]).read())
        source = "oar"
    elif env.get("SLURM_JOB_NODELIST"):
        names = slurm_hosts(env["SLURM_JOB_NODELIST"])
        source = "slurm"
    elif env.get("SLURM_JOB_ID"):
        # Snakemake's Slurm job step keeps only the job id in the environment
        # of a job that runs outside an srun step: ask Slurm for the nodes.
        names = slurm_hosts(slurm_job_nodelist(env["SLURM_JOB_ID"]))
        source = "slurm"
    else:
        # Without a scheduler every "node" is this machine: one host whose
        # slots are all the processes, so launchers start them all here.
        return "local", [Host("localhost", procs_per_node * nodes)]
    if len(names) < nodes:
        raise RuntimeError(f"the {source} allocation has {len(names)} host(s) "
                           f"({', '.join(names)}), the design asks for nodes={nodes}")
    return source, [Host(n, procs_per_node) for n in names[:nodes]]


def oar_hosts(nodefile_text: str) -> list[str]:
    """$OAR_NODEFILE lists one line per core: distinct hosts, in order."""
    counts = Counter()
    order = []
    for line in nodefile_text.split():
        if line not in counts:
            order.append(line)
        counts[line] += 1
    return order


def slurm_hosts(nodelist: str) -> list[str]:
    """Expand a Slurm node list (``node[01-03,07],gpu5``) in order."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                             capture_output=True, text=True, check=True).stdout
        return out.split()
    except (OSError, subprocess.CalledProcessError):
        return _expand_slurm(nodelist)


def slurm_job_nodelist(job_id: str) -> str:
    """The compressed node list of a running job (``NodeList=n[1-2]``)."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"Slurm job {job_id}: cannot read its node list ({exc})") from None
    found = re.search(r"(?:^|\s)NodeList=(\S+)", out)
    if not found or found.group(1) == "(null)":
        raise RuntimeError(f"Slurm job {job_id}: no NodeList in 'scontrol show job'")
    return found.group(1)


def _expand_slurm(nodelist: str) -> list[str]:
    hosts = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{i:0{len(lo)}d}")
    return hosts
