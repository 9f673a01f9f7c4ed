"""Launchers: how a host list becomes training processes.

Each launcher is a function registered by name that returns the argv and
the extra environment for one run. They build argument lists, never shell
strings: no design value passes through a shell.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable

from ddlcompare import envs, netem
from ddlcompare.hosts import Host

LAUNCHERS: dict[str, Callable] = {}
TORCHRUN_PORT = 29500
REPO = Path(__file__).resolve().parent.parent
SCOREP_FILTER = REPO / "traces" / "scorep_filter"
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
        return scorep_worker_argv(config, run_dir)
    return [python(config), "-m", "frameworks.worker", str(run_dir)]


def scorep_worker_argv(config: dict, run_dir: Path) -> list[str]:
    """The worker under Score-P's Python bindings. They run a script (not a
    module), so the worker goes by path and PYTHONPATH finds the packages
    (tracing_env). --noinstrumenter: no Python function is traced, only our
    phases (user regions) and what Score-P's MPI adapter sees."""
    return [python(config), "-m", "scorep", "--mpp=mpi", "--noinstrumenter",
            str(REPO / "frameworks" / "worker.py"), str(run_dir)]


def tracing_env(config: dict, run_dir: Path) -> dict[str, str]:
    """Where Score-P and Horovod's Timeline write, when they are asked for."""
    env = {}
    if config.get("tracer") == "scorep":
        env.update({
            "SCOREP_ENABLE_TRACING": "true",
            "SCOREP_ENABLE_PROFILING": "false",
            "SCOREP_EXPERIMENT_DIRECTORY": str(run_dir / "scorep"),
            "SCOREP_OVERWRITE_EXPERIMENT_DIRECTORY": "true",
            "SCOREP_FILTERING_FILE": str(SCOREP_FILTER),
            "PYTHONPATH": str(REPO),
        })
    if config.get("horovod_timeline"):
        env["HOROVOD_TIMELINE"] = str(run_dir / "horovod_timeline.json")
    return env


def require_mpi_for_scorep(config: dict, launcher_name: str) -> None:
    """Score-P's --mpp=mpi learns ranks from MPI_Init: only MPI-started workers."""
    if config.get("tracer") != "scorep":
        return
    if launcher_name != "horovodrun" or config.get("horovod_controller") != "mpi":
        raise RuntimeError(
            f"tracer: scorep needs MPI-started workers (horovodrun with horovod_controller: "
            f"mpi); this run uses {launcher_name} with framework {config['framework']}. "
            "Use tracer: otf2 for it, or set horovod_controller: mpi for Horovod runs")


def base_env(config: dict) -> dict[str, str]:
    threads = str(config["torch_threads"])
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
def torchrun(hosts: list[Host], config: dict, run_dir: Path, scheduler: str):
    """One torchrun per node; one rendezvous at the first host."""
    require_mpi_for_scorep(config, "torchrun")
    per_node = hosts[0].slots
    run = [python(config), "-m", "torch.distributed.run"]
    env = {**base_env(config), **tracing_env(config, run_dir)}
    if len(hosts) == 1:
        return run + ["--standalone", "--nnodes=1", f"--nproc_per_node={per_node}",
                      "-m", "frameworks.worker", str(run_dir)], env
    rendezvous = [f"--nnodes={len(hosts)}", f"--nproc_per_node={per_node}",
                  "--rdzv_backend=c10d", f"--rdzv_endpoint={hosts[0].name}:{TORCHRUN_PORT}",
                  f"--rdzv_id={config['run_id']}", "-m", "frameworks.worker", str(run_dir)]
    return per_node_starter(hosts, scheduler) + run + rendezvous, env


def per_node_starter(hosts: list[Host], scheduler: str) -> list[str]:
    """Start one process on each host of a multi-node allocation."""
    names = ",".join(h.name for h in hosts)
    if scheduler == "slurm":
        # --overlap: the run may itself be inside a one-task step holding the
        # CPUs (see workflow_support.job_resources); explicit counts override
        # the SLURM_NTASKS and the like that such a step leaves behind.
        return ["srun", "--overlap", f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}",
                "--ntasks-per-node=1", f"--nodelist={names}"]
    # OAR (and anything else with ssh-like access): mpirun as a process
    # starter, reaching the nodes with oarsh on OAR, with netns_as_ssh on
    # the emulated network.
    agent = ["--mca", "plm_rsh_agent", RSH_AGENTS[scheduler]] if scheduler in RSH_AGENTS else []
    return ["mpirun", "--host", names, "--npernode", "1", *agent]


@launcher("horovodrun")
def horovodrun(hosts: list[Host], config: dict, run_dir: Path, scheduler: str):
    require_mpi_for_scorep(config, "horovodrun")
    world = sum(h.slots for h in hosts)
    host_arg = ",".join(f"{h.name}:{h.slots}" for h in hosts)
    argv = [str(Path(python(config)).parent / "horovodrun"), "-np", str(world), "-H", host_arg,
            f"--{config['horovod_controller']}"]
    env = base_env(config)
    if scheduler in RSH_AGENTS and config["horovod_controller"] == "mpi":
        argv += [f"--mpi-args=--mca plm_rsh_agent {RSH_AGENTS[scheduler]}"]
    elif scheduler in RSH_AGENTS:
        env["PATH"] = ssh_path(scheduler)  # Gloo starts remote workers with "ssh"
    if scheduler == "netns":
        argv += ["--network-interface", netem.IFACE]  # else Horovod probes every node's NICs
    return argv + worker_argv(config, run_dir), {**env, **tracing_env(config, run_dir)}


OARSH_AS_SSH = Path(__file__).resolve().parent / "oarsh_as_ssh"
# Schedulers whose nodes are reached with another remote shell than ssh.
RSH_AGENTS = {"oar": "oarsh", "netns": str(netem.NETNS_SSH)}
SSH_DIRS = {"oar": OARSH_AS_SSH, "netns": netem.NETNS_SSH.parent}


def ssh_path(scheduler: str) -> str:
    """PATH with the scheduler's remote shell as ``ssh`` first, for launchers
    that cannot be told which remote shell to use."""
    return f"{SSH_DIRS[scheduler]}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


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
def tf_workers(hosts: list[Host], config: dict, run_dir: Path, scheduler: str):
    """One process per rank, each with its own TF_CONFIG: a spawner per node
    (ddlcompare.spawn) started by the per-node starter on several nodes.
    Locally the ports are whichever are free, so that runs never collide."""
    per_node = hosts[0].slots
    workers = ([f"localhost:{port}" for port in free_ports(per_node)]
               if scheduler == "local" else tf_worker_addresses(hosts))
    spawn = [python(config), "-m", "ddlcompare.spawn", "--per-node", str(per_node),
             "--workers", ",".join(workers), "--"] + worker_argv(config, run_dir)
    starter = per_node_starter(hosts, scheduler) if len(hosts) > 1 else []
    return starter + spawn, base_env(config)


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
def tarantella(hosts: list[Host], config: dict, run_dir: Path, scheduler: str):
    """Tarantella's own launcher: ``-n N`` on one node, a hostfile of the
    scheduler's nodes and ``--n-per-node K`` on several. It starts the ranks
    with gaspi_run over plain ssh (on OAR: a job with -t allow_classic_ssh)."""
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
    if scheduler in SSH_DIRS:  # gaspi_run starts every rank with "ssh"
        path.insert(0, str(SSH_DIRS[scheduler]))
    if len(hosts) == 1 and scheduler == "local":
        path.insert(0, str(LOCAL_SSH))  # gaspi_run's ssh to this host, run here
        # GPI-2 listens on fixed ports: a second job on the node at the same
        # time fails ("Gaspi error: Device operation error"). One at a time.
        argv = ["flock", str(GPI2_LOCK), *argv]
    env["PATH"] = ":".join(path)
    return argv, env


@launcher("lbann-driver")
def lbann_driver(hosts: list[Host], config: dict, run_dir: Path, scheduler: str):
    """One driver process here; LBANN's own launcher (lbann.run: srun, or
    mpiexec with the OAR node file) starts the ranks on the hosts."""
    return worker_argv(config, run_dir), base_env(config)


def command(name: str, hosts: list[Host], config: dict, run_dir: Path, scheduler: str):
    return LAUNCHERS[name](hosts, config, run_dir, scheduler)
