"""tf-workers: one process per rank, each with its own TF_CONFIG (tf-mwms)."""

from __future__ import annotations

from pathlib import Path

from ddlcompare.run.launch import base_env, free_ports, python, tracing_env, worker_argv, launcher
from ddlcompare.run.schedulers import Host, Scheduler
from runfiles.run_config import RunConfig

TF_WORKER_PORT = 23456


def tf_worker_addresses(hosts: list[Host], port: int = TF_WORKER_PORT) -> list[str]:
    """The hook for the TensorFlow family's launcher: TF_CONFIG's
    ``cluster.worker`` list, one ``host:port`` per process (a host's slots
    get consecutive ports), in rank order. Worker i's TF_CONFIG is
    ``{"cluster": {"worker": these}, "task": {"type": "worker", "index": i}}``;
    its process starts on ``these[i]``'s host (srun or oarsh, as
    ``per_node_starter``)."""
    return [f"{h.name}:{port + slot}" for h in hosts for slot in range(h.slots)]


@launcher("tf-workers")
def tf_workers(hosts: list[Host], config: RunConfig, run_dir: Path, scheduler: Scheduler):
    """One process per rank, each with its own TF_CONFIG: a spawner per node
    (ddlcompare.run.spawn) started by the per-node starter on several nodes.
    Locally the ports are whichever are free, so that runs never collide."""
    per_node = hosts[0].slots
    workers = (
        [f"localhost:{port}" for port in free_ports(per_node)]
        if scheduler.this_host
        else tf_worker_addresses(hosts)
    )
    spawn = [
        python(config),
        "-m",
        "ddlcompare.run.spawn",
        "--per-node",
        str(per_node),
        "--workers",
        ",".join(workers),
        "--",
    ] + worker_argv(config, run_dir)
    starter = scheduler.per_node_starter(hosts) if len(hosts) > 1 else []
    return starter + spawn, {**base_env(config), **tracing_env(config, run_dir)}
