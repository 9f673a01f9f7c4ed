"""Launchers: how a host list becomes training processes.

Each launcher is a function registered by name that returns the argv and
the extra environment for one run. They build argument lists, never shell
strings: no design value passes through a shell.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Callable

from ddlcompare import envs, tracers
from ddlcompare.schedulers import Host, Scheduler, get as scheduler_named

LAUNCHERS: dict[str, Callable] = {}
TORCHRUN_PORT = 29500
REPO = Path(__file__).resolve().parent.parent
LOCAL_SSH = REPO / "envs" / "local-ssh"  # an `ssh` that runs commands for this host here
GPI2_LOCK = Path("/tmp/ddlc-gpi2.lock")  # one GPI-2 (Tarantella) job per machine at a time


def launcher(name: str):
    def register(fn):
        LAUNCHERS[name] = fn
        return fn
    return register


def python(config: dict) -> str:
    """The interpreter of the run's framework environment; a run whose
    environment is not built fails at once, naming what builds it."""
    from frameworks import registry
    env = registry.FRAMEWORKS[config["framework"]].env
    found = envs.python_for(env)
    if not found.exists():
        raise RuntimeError(f"framework {config['framework']}: its environment '{env}' is not "
                           f"built here ({found} not found); {envs.how_to_build(env)}")
    return str(found)


def worker_argv(config: dict, run_dir: Path) -> list[str]:
    if config.get("tracer") == "scorep":
        return tracers.worker_argv(python(config), config, run_dir)
    return [python(config), "-m", "frameworks.worker", str(run_dir)]


def worker_module(config: dict) -> str:
    """What launchers that start ``python -m MODULE RUN_DIR`` (torchrun) run."""
    return "ddlcompare.tracers" if config.get("tracer") == "scorep" else "frameworks.worker"


def tracing_env(config: dict, run_dir: Path) -> dict[str, str]:
    """Where Score-P and Horovod's Timeline write, when they are asked for."""
    env = tracers.environment(config, run_dir)
    if config.get("horovod_timeline"):
        env["HOROVOD_TIMELINE"] = str(run_dir / "horovod_timeline.json")
    return env


def refuse_untraceable(config: dict) -> None:
    """The plan refuses these already (design.py); a run started by hand too."""
    reason = tracers.refusal(config)
    if reason:
        raise RuntimeError(reason)


def base_env(config: dict) -> dict[str, str]:
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


@launcher("torchrun")
def torchrun(hosts: list[Host], config: dict, run_dir: Path, scheduler: Scheduler):
    """One torchrun per node; one rendezvous at the first host."""
    per_node = hosts[0].slots
    worker = ["-m", worker_module(config), str(run_dir)]
    run = [python(config), "-m", "torch.distributed.run"]
    env = {**base_env(config), **tracing_env(config, run_dir)}
    if len(hosts) == 1:
        return run + ["--standalone", "--nnodes=1", f"--nproc_per_node={per_node}",
                      *worker], env
    rendezvous = [f"--nnodes={len(hosts)}", f"--nproc_per_node={per_node}",
                  "--rdzv_backend=c10d", f"--rdzv_endpoint={hosts[0].name}:{TORCHRUN_PORT}",
                  f"--rdzv_id={config['run_id']}", *worker]
    return scheduler.per_node_starter(hosts) + run + rendezvous, env


@launcher("horovodrun")
def horovodrun(hosts: list[Host], config: dict, run_dir: Path, scheduler: Scheduler):
    world = sum(h.slots for h in hosts)
    host_arg = ",".join(f"{h.name}:{h.slots}" for h in hosts)
    argv = [str(Path(python(config)).parent / "horovodrun"), "-np", str(world), "-H", host_arg,
            f"--{config['horovod_controller']}"]
    env = base_env(config)
    if scheduler.rsh_agent and config["horovod_controller"] == "mpi":
        argv += [f"--mpi-args=--mca plm_rsh_agent {scheduler.rsh_agent}"]
    elif scheduler.ssh_dir:
        env["PATH"] = ssh_path(scheduler)  # Gloo starts remote workers with "ssh"
    argv += scheduler.horovodrun_args()
    return argv + worker_argv(config, run_dir), {**env, **tracing_env(config, run_dir)}


def ssh_path(scheduler: Scheduler) -> str:
    """PATH with the scheduler's remote shell as ``ssh`` first, for launchers
    that cannot be told which remote shell to use."""
    return f"{scheduler.ssh_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


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
def tf_workers(hosts: list[Host], config: dict, run_dir: Path, scheduler: Scheduler):
    """One process per rank, each with its own TF_CONFIG: a spawner per node
    (ddlcompare.spawn) started by the per-node starter on several nodes.
    Locally the ports are whichever are free, so that runs never collide."""
    per_node = hosts[0].slots
    workers = ([f"localhost:{port}" for port in free_ports(per_node)]
               if scheduler.this_host else tf_worker_addresses(hosts))
    spawn = [python(config), "-m", "ddlcompare.spawn", "--per-node", str(per_node),
             "--workers", ",".join(workers), "--"] + worker_argv(config, run_dir)
    starter = scheduler.per_node_starter(hosts) if len(hosts) > 1 else []
    return starter + spawn, {**base_env(config), **tracing_env(config, run_dir)}


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


@launcher("tarantella")
def tarantella(hosts: list[Host], config: dict, run_dir: Path, scheduler: Scheduler):
    """Tarantella's own launcher: ``-n N`` on one node, a hostfile of the
    scheduler's nodes and ``--n-per-node K`` on several. It starts the ranks
    with gaspi_run over plain ssh (on OAR: a job with -t allow_classic_ssh)."""
    refuse_untraceable(config)
    executable = Path(python(config)).parent / "tarantella"
    if not executable.exists():
        raise RuntimeError(f"{executable} not found: build the 'tarantella' environment "
                           "with 'bash envs/build-tarantella.sh' (notes: envs/tarantella.md) "
                           "or set DDLC_VENV_TARANTELLA")
    env = base_env(config)
    argv = [str(executable)]
    if len(hosts) == 1:
        argv += ["-n", str(hosts[0].slots)]
    else:
        hostfile = run_dir / "hostfile"
        hostfile.write_text("".join(f"{h.name}\n" for h in hosts))
        argv += ["--hostfile", str(hostfile), "--n-per-node", str(hosts[0].slots)]
    if config["device"] == "cpu":
        argv.append("--no-gpu")
    # gaspi_run's ranks see only PATH, PYTHONPATH, LD_LIBRARY_PATH, TF_* and
    # TNT_* from here: the rest of the run's environment goes through -x.
    argv += ["-x", *(f"{k}={v}" for k, v in env.items())]
    path = [str(executable.parent), os.environ.get("PATH", "")]
    argv += ["--", "-m", "frameworks.worker", str(run_dir)]
    if len(hosts) == 1 and scheduler.this_host:
        path.insert(0, str(LOCAL_SSH))  # gaspi_run's ssh to this host, run here
        # GPI-2 listens on fixed ports: a second job on the node at the same
        # time fails ("Gaspi error: Device operation error"). One at a time.
        argv = ["flock", str(GPI2_LOCK), *argv]
    env["PATH"] = ":".join(path)
    return argv, env


@launcher("one-process")
def one_process(hosts: list[Host], config: dict, run_dir: Path, scheduler: str):
    """One process on the first host, driving its local devices itself
    (DataParallel, MirroredStrategy)."""
    return worker_argv(config, run_dir), base_env(config)


@launcher("lbann-driver")
def lbann_driver(hosts: list[Host], config: dict, run_dir: Path, scheduler: Scheduler):
    """One driver process here; LBANN's own launcher (lbann.run: srun, or
    mpiexec with the OAR node file) starts the ranks on the hosts, as the
    scheduler's ``lbann_run_args`` (handed over as JSON) say."""
    refuse_untraceable(config)
    env = {**base_env(config),
           LBANN_RUN_ARGS: json.dumps(scheduler.lbann_run_args(os.environ))}
    return worker_argv(config, run_dir), env


# The variable that hands the scheduler's lbann.run arguments to the driver.
LBANN_RUN_ARGS = "DDLC_LBANN_RUN_ARGS"


def command(name: str, hosts: list[Host], config: dict, run_dir: Path,
            scheduler: Scheduler | str):
    """The argv and extra environment of launcher ``name`` (the scheduler by
    object, or by its registered name)."""
    return LAUNCHERS[name](hosts, config, run_dir, scheduler_named(scheduler))
