"""Schedulers, seen from inside a job: where the host list comes from, and
how a process reaches each node.

One class per scheduler, one file each, registered by name (the shape of
ReFrame's reframe/core/schedulers/). Launchers ask the scheduler object;
nothing compares scheduler names. A new scheduler is one file in this
folder (runfiles/backends.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from pathlib import Path

from runfiles.backends import Registry

# Detection order: the first whose ``detected`` holds is the one this job
# runs under (the emulated network first: it may run inside a Slurm or OAR
# job); others after these, and the fallbacks (local, which holds always) last.
REGISTRY: Registry[type[Scheduler]] = Registry(
    "ddlcompare.run.schedulers", "scheduler", order=("netns", "oar", "slurm")
)
register = REGISTRY.register


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


class SchedulerError(RuntimeError):
    """The allocation does not fit the design, or cannot be read."""


class Scheduler:
    """What the launchers need to know of where a job runs."""

    name = ""
    rsh_agent: str | None = None  # the remote shell mpirun should use (plm_rsh_agent)
    ssh_dir: Path | None = None  # a folder whose ``ssh`` reaches the nodes, for launchers
    #                                that cannot be told which remote shell to use
    one_machine = False  # every node is this machine (no real network between them)
    this_host = False  # every host is this machine itself: launchers pick free
    #                                ports and reach it without a remote shell
    fallback = False  # detected when no other is (local)
    job_variable: str | None = None  # the job's id in its processes' environment

    @staticmethod
    def detected(env: Mapping[str, str]) -> bool:
        raise NotImplementedError

    def host_names(self, env: Mapping[str, str]) -> list[str]:
        raise NotImplementedError

    def hosts(self, nodes: int, procs_per_node: int, env: Mapping[str, str]) -> list[Host]:
        """The first ``nodes`` hosts, each with ``procs_per_node`` slots: the
        design says how many processes a node runs, whatever the scheduler
        counts (cores, GPUs)."""
        names = self.host_names(env)
        if len(names) < nodes:
            raise SchedulerError(
                f"the {self.name} allocation has {len(names)} host(s) "
                f"({', '.join(names)}), the design asks for nodes={nodes}"
            )
        return [Host(n, procs_per_node) for n in names[:nodes]]

    def per_node_starter(self, hosts: list[Host]) -> list[str]:
        """The argv prefix that starts one process on each host: mpirun as a
        plain process starter, through this scheduler's remote shell. Bound
        to nothing: Open MPI binds 2 processes to a core each by default, and
        every process the starter starts would share that one core."""
        agent = ["--mca", "plm_rsh_agent", self.rsh_agent] if self.rsh_agent else []
        hosts_arg = ["--host", ",".join(h.name for h in hosts)]
        return ["mpirun", *hosts_arg, "--npernode", "1", *agent, "--bind-to", "none"]

    def mpirun_args(self) -> list[str]:
        """What mpirun needs to start ranks on hosts given with --host."""
        return ["--mca", "plm_rsh_agent", self.rsh_agent] if self.rsh_agent else []

    def horovodrun_args(self) -> list[str]:
        """Extra horovodrun arguments this scheduler needs."""
        return []

    def job_id(self, env: Mapping[str, str]) -> str | None:
        """The scheduler's id of the job this process runs in."""
        return env.get(self.job_variable) if self.job_variable else None

    def stop_reason(self, env: Mapping[str, str], hosts: Sequence[str] = ()) -> str | None:
        """Why the scheduler is stopping this job on ``hosts`` (its time
        limit, a lost node, a cancel), in its own words, for the run's
        record; None when it says nothing."""
        return None

    def lbann_run_args(self, env: Mapping[str, str], hosts: Sequence[Host] = ()) -> dict:
        """The keyword arguments of LBANN's ``lbann.run`` that say where it
        launches (on ``hosts``): its own scheduler name and the mpiexec arguments."""
        return {"scheduler": "openmpi", "launcher_args": ["--bind-to", "none"]}


def get(name: str | Scheduler) -> Scheduler:
    """The scheduler of this name (an object passes through)."""
    if isinstance(name, Scheduler):
        return name
    return REGISTRY[name]()


def current(env: Mapping[str, str] | None = None) -> Scheduler:
    """The scheduler this process runs under."""
    import os

    env = os.environ if env is None else env
    return next(REGISTRY[n]() for n in _detection_order() if REGISTRY[n].detected(env))


def _detection_order() -> list[str]:
    return sorted(REGISTRY, key=lambda name: REGISTRY[name].fallback)  # stable


def detect(
    nodes: int, procs_per_node: int, env: Mapping[str, str] | None = None
) -> tuple[Scheduler, list[Host]]:
    """The scheduler this job runs under and the hosts it was given."""
    import os

    env = os.environ if env is None else env
    for name in _detection_order():
        if REGISTRY[name].detected(env):
            scheduler = REGISTRY[name]()
            return scheduler, scheduler.hosts(nodes, procs_per_node, env)
    raise SchedulerError("no scheduler matched")  # unreachable: local always matches
