"""Slurm: the job's node list; srun starts one process per node."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from ddlcompare.run.schedulers import Scheduler, SchedulerError, register
from runfiles import variables

# What a one-task step sets of its own size, which a nested srun would take
# for the allocation's.
STEP_VARIABLES = ("SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_NODELIST", "SLURM_JOB_NODELIST")


@register
class Slurm(Scheduler):
    name = "slurm"
    # An ``ssh`` that starts the command with srun on a node of the job:
    # mpirun, horovodrun (Gloo) and gaspi_run reach the nodes without sshd.
    ssh_dir = Path(__file__).resolve().parent.parent / "srun_as_ssh"
    rsh_agent = str(ssh_dir / "ssh")

    @staticmethod
    def detected(env) -> bool:
        return bool(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_JOB_ID"))

    def host_names(self, env) -> list[str]:
        if env.get("SLURM_JOB_NODELIST") and not (
            env.get("SLURM_STEP_ID") and env.get("SLURM_JOB_ID")
        ):
            return expand(env["SLURM_JOB_NODELIST"])
        # Snakemake's Slurm job step keeps only the job id in the environment
        # of a job that runs outside an srun step; inside its one-task step
        # (srun --jobid), SLURM_JOB_NODELIST names the step's one node, not
        # the allocation's: ask Slurm for the job's nodes.
        return expand(job_nodelist(env["SLURM_JOB_ID"]))

    def per_node_starter(self, hosts) -> list[str]:
        # --overlap: the run may itself be inside a one-task step holding the
        # CPUs (see workflow_support.job_resources). Such a step's node count
        # and node list (one node) would cap srun's ("Only allocated 1 nodes
        # asked for 2"): they are dropped, so srun reads the job's.
        return [
            "env",
            *(f"-u{name}" for name in STEP_VARIABLES),
            "srun",
            "--overlap",
            f"--nodes={len(hosts)}",
            f"--ntasks={len(hosts)}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(h.name for h in hosts)}",
        ]

    def mpirun_args(self) -> list[str]:
        # The hosts are given with --host. Open MPI's Slurm support would read
        # the allocation from SLURM_NODELIST, which a Snakemake job step that
        # keeps only the job id lacks ("unable to find SLURM_NODELIST").
        return ["--mca", "ras", "^slurm", "--mca", "plm", "^slurm", *super().mpirun_args()]

    def stop_reason(self, env, hosts=()) -> str | None:
        # Slurm sets the job's state (TIMEOUT, CANCELLED) before it signals
        # the job's processes; on a node failure the job's nodes say which
        # one is down.
        job = env.get("SLURM_JOB_ID")
        out = _ask(["scontrol", "show", "job", "--oneliner", job]) if job else ""
        if not (state := ending_state(out)):
            return None
        if state == "COMPLETING":  # scancel's state may not show yet: accounting has it
            state = accounted_state(job) or state
        said = f"Slurm job {job}: {state}"
        found = re.search(r"(?:^|\s)NodeList=(\S+)", out)
        # A job requeued after a node failure has lost its node list: the run's hosts.
        nodes = found.group(1) if found and found.group(1) != "(null)" else ",".join(hosts)
        # Slurm may signal the job a moment before it marks the node down.
        for _ in range(3 if nodes and state.startswith(("COMPLETING", "NODE_FAIL")) else 0):
            if down := _down_nodes(nodes):
                return f"{said}; node down: {down}"
            time.sleep(1)
        return said

    def lbann_run_args(self, env, hosts=()) -> dict:
        # LBANN's own srun line, inside this job: --overlap as for
        # per_node_starter; and an MPI plugin, since under slurm.conf's usual
        # MpiDefault (none) Open MPI refuses to start, and other MPIs may
        # start each rank as a world of its own (frameworks/lbann.check_world).
        # pmix fits an Open MPI build (Debian's, envs/build-lbann.sh);
        # DDLC_SRUN_MPI names another (pmi2, cray_shasta), or '' for slurm.conf's.
        mpi = variables.value("DDLC_SRUN_MPI", env)
        args = ["--overlap", *([f"--mpi={mpi}"] if mpi else [])]
        if hosts:
            args.append(f"--nodelist={','.join(h.name for h in hosts)}")
        # LBANN's srun runs from the driver's environment: without the one-task
        # step's size, as for per_node_starter.
        return {"scheduler": "slurm", "launcher_args": args, "unset_env": list(STEP_VARIABLES)}


# Slurm's reason for ending a job (job_state_reason), as the state it ends in.
ENDED_BY = {"TimeLimit": "TIMEOUT", "NodeDown": "NODE_FAIL", "OutOfMemory": "OUT_OF_MEMORY"}


def ending_state(job: str) -> str | None:
    """The state and reason in a job's `scontrol show job --oneliner`.

    A job Slurm ends stays COMPLETING until its processes are gone (and ours
    are still handling the signal): then the reason says how it ends."""
    state = re.search(r"(?:^|\s)JobState=(\S+)", job)
    reason = re.search(r"(?:^|\s)Reason=(\S+)", job)
    if not state:
        return None
    name, why = state.group(1), reason.group(1) if reason else "None"
    if name == "COMPLETING":
        name = ENDED_BY.get(why, name)
    return name if why == "None" else f"{name}, {why}"


def accounted_state(job: str) -> str | None:
    """The state Slurm's accounting holds for a job ("CANCELLED by 0" is
    CANCELLED), where scontrol still says only COMPLETING: under load the
    runner may ask between scancel's signal and the state scontrol shows.
    None where accounting does not answer or knows no more."""
    words = _ask(["sacct", "-j", job, "-X", "-n", "-P", "-o", "State"]).split()
    return words[0] if words and words[0] not in ("RUNNING", "COMPLETING", "PENDING") else None


def _ask(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _down_nodes(nodelist: str) -> str:
    """Those of the nodes Slurm holds down or not responding, with its reason."""
    out = _ask(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N|%t|%E"])
    down = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
    return ", ".join(
        f"{name} ({why})" for name, state, why in down if "down" in state or state.endswith("*")
    )


def expand(nodelist: str) -> list[str]:
    """A Slurm node list (``node[01-03,07],gpu5``) as host names, in order."""
    try:
        return list(NodeSet(nodelist, resolver=None).striter()) if nodelist else []
    except NodeSetParseError as exc:
        raise SchedulerError(f"Slurm node list {nodelist!r}: {exc}") from None


def job_nodelist(job_id: str) -> str:
    """The compressed node list of a running job (``NodeList=n[1-2]``)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", job_id],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise SchedulerError(f"Slurm job {job_id}: cannot read its node list ({exc})") from None
    found = re.search(r"(?:^|\s)NodeList=(\S+)", out)
    if not found or found.group(1) == "(null)":
        raise SchedulerError(f"Slurm job {job_id}: no NodeList in 'scontrol show job'")
    return found.group(1)
