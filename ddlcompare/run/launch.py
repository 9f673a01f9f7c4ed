"""Launchers: how a host list becomes training processes.

Each launcher is one file in ddlcompare/run/launchers/: a function registered by
name with ``@launcher`` that returns the argv and the extra environment of
one run. Every module of that folder is loaded on first use, so a new
launcher is one new file. This module holds what they share. They build
argument lists, never shell strings: no design value passes through a shell.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from typing import Callable

from ddlcompare.plan import traceable
from ddlcompare.plan import envs
from ddlcompare.run import tracers
from runfiles import names
from runfiles.backends import Registry
from ddlcompare.run.schedulers import Host, Scheduler, get as scheduler_named
from runfiles.run_config import RunConfig

LAUNCHERS: Registry[Callable] = Registry("ddlcompare.run.launchers", "launcher")
REPO = Path(__file__).resolve().parents[2]
LOCAL_SSH = REPO / "envs" / "local-ssh"  # an `ssh` that runs commands for this host here


def launcher(name: str):
    """``@launcher("<name>")``: a launcher function, registered by name."""
    return LAUNCHERS.register(name=name)


def python(config: RunConfig) -> str:
    """The interpreter of the run's framework environment; a run whose
    environment is not built fails at once, naming what builds it."""
    from frameworks import registry

    env = registry.FRAMEWORKS[config["framework"]].env
    found = envs.python_for(env)
    if not found.exists():
        raise RuntimeError(
            f"framework {config['framework']}: its environment '{env}' is not "
            f"built here ({found} not found); {envs.how_to_build(env)}"
        )
    return str(found)


def worker_argv(config: RunConfig, run_dir: Path) -> list[str]:
    if config.get("tracer") == "scorep":
        return tracers.worker_argv(python(config), config, run_dir)
    return [python(config), "-m", "frameworks.worker", str(run_dir)]


def worker_module(config: RunConfig) -> str:
    """What launchers that start ``python -m MODULE RUN_DIR`` (torchrun) run."""
    return "ddlcompare.run.tracers" if config.get("tracer") == "scorep" else "frameworks.worker"


def tracing_env(config: RunConfig, run_dir: Path) -> dict[str, str]:
    """Where Score-P and Horovod's Timeline write, when they are asked for."""
    env = tracers.environment(config, run_dir)
    if config.get("horovod_timeline"):
        env["HOROVOD_TIMELINE"] = str(run_dir / names.HOROVOD_TIMELINE)
    return env


def refuse_untraceable(config: RunConfig) -> None:
    """The plan refuses these already (design.py); a run started by hand too."""
    reason = traceable.refusal(config)
    if reason:
        raise RuntimeError(reason)


def base_env(config: RunConfig) -> dict[str, str]:
    threads = str(config["threads"])
    return {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
        # Open MPI refuses root and more ranks than cores unless told; both
        # are normal in containers and on small test machines.
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
    }


def ssh_path(scheduler: Scheduler) -> str:
    """PATH with the scheduler's remote shell as ``ssh`` first, for launchers
    that cannot be told which remote shell to use."""
    return f"{scheduler.ssh_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


def run_port(base: int, config: RunConfig, span: int = 1000) -> int:
    """A port for the run's own rendezvous on its first node, offset from
    ``base`` by its run id: two jobs that share a node (a cluster that does
    not give whole nodes) never meet on the same port."""
    return base + int(hashlib.sha256(config["run_id"].encode()).hexdigest(), 16) % span


def free_ports(count: int) -> list[int]:
    """Ports free on this machine now: local runs must not collide with
    another run (or test) on fixed ports."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def command(
    name: str, hosts: list[Host], config: RunConfig, run_dir: Path, scheduler: Scheduler | str
):
    """The argv and extra environment of launcher ``name`` (the scheduler by
    object, or by its registered name)."""
    return LAUNCHERS[name](hosts, config, run_dir, scheduler_named(scheduler))
