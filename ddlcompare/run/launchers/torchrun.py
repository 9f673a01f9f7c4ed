"""torchrun: one per node, one rendezvous at the first host (torch-ddp)."""

from __future__ import annotations

from pathlib import Path

from ddlcompare.run.launch import base_env, python, run_port, tracing_env, worker_module, launcher
from ddlcompare.run.schedulers import Host, Scheduler
from runfiles.run_config import RunConfig

TORCHRUN_PORT = 29500


@launcher("torchrun")
def torchrun(hosts: list[Host], config: RunConfig, run_dir: Path, scheduler: Scheduler):
    """One torchrun per node; one rendezvous at the first host."""
    per_node = hosts[0].slots
    worker = ["-m", worker_module(config), str(run_dir)]
    run = [python(config), "-m", "torch.distributed.run"]
    env = {**base_env(config), **tracing_env(config, run_dir)}
    if len(hosts) == 1:
        return run + ["--standalone", "--nnodes=1", f"--nproc_per_node={per_node}", *worker], env
    rendezvous = [
        f"--nnodes={len(hosts)}",
        f"--nproc_per_node={per_node}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={hosts[0].name}:{run_port(TORCHRUN_PORT, config)}",
        f"--rdzv_id={config['run_id']}",
        *worker,
    ]
    return scheduler.per_node_starter(hosts) + run + rendezvous, env
