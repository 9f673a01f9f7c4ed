"""horovodrun: Horovod's launcher, with Gloo or MPI as its controller."""

from __future__ import annotations

from pathlib import Path

from ddlcompare.run.launch import base_env, python, ssh_path, tracing_env, worker_argv, launcher
from ddlcompare.run.schedulers import Host, Scheduler
from frameworks import knobs
from runfiles.run_config import RunConfig


@launcher("horovodrun")
def horovodrun(hosts: list[Host], config: RunConfig, run_dir: Path, scheduler: Scheduler):
    world = sum(h.slots for h in hosts)
    host_arg = ",".join(f"{h.name}:{h.slots}" for h in hosts)
    argv = [
        str(Path(python(config)).parent / "horovodrun"),
        "-np",
        str(world),
        "-H",
        host_arg,
        f"--{config['horovod_controller']}",
    ]
    env = {**base_env(config), **knobs.horovod_env(config, run_dir)}
    if scheduler.rsh_agent and config["horovod_controller"] == "mpi":
        argv += [f"--mpi-args=--mca plm_rsh_agent {scheduler.rsh_agent}"]
    elif scheduler.ssh_dir:
        env["PATH"] = ssh_path(scheduler)  # Gloo starts remote workers with "ssh"
    argv += scheduler.horovodrun_args()
    return argv + worker_argv(config, run_dir), {**env, **tracing_env(config, run_dir)}
