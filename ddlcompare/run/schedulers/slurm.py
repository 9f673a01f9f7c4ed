"""Slurm: the job's node list; srun starts one process per node."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from ddlcompare.run.schedulers import Scheduler, SchedulerError, register
from runfiles import files, variables

# What a one-task step sets of its own size, which a nested srun would take
# for the allocation's.
STEP_VARIABLES = ("SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_NODELIST", "SLURM_JOB_NODELIST")


@register
class Slurm(Scheduler):
    name = "slurm"
    job_variable = "SLURM_JOB_ID"
    # An ``ssh`` that starts the command with srun on a node of the job:
    # mpirun, horovodrun (Gloo) and gaspi_run reach the nodes without sshd.
    ssh_dir = Path(__file__).resolve().parent / "srun_as_ssh"
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
        # the job's processes, but while one of them lives (this runner is
        # one) scontrol shows COMPLETING, whatever the state: then the
        # reason, Slurm's own line in the job's output or accounting says it.
        job = env.get("SLURM_JOB_ID")
        out = _ask(["scontrol", "show", "job", "--oneliner", job]) if job else ""
        if not (state := ending_state(out)):
            return None
        # A failed node leaves the job's node list (a requeued job has none):
        # the run's hosts are asked about too.
        nodes = ",".join(dict.fromkeys([*hosts, *_job_nodes(out)]))
        if state in (*STILL_RUNNING, "COMPLETING"):
            # A node of the job down: the job ends of it, whatever its state
            # says for now. Slurm marks a lost node down and tells srun (which
            # fails) before it ends or requeues the job, which runs on for
            # that moment (2 s in a CI-like run, 2026-11-29), then shows
            # COMPLETING while its processes live. Asked first: sinfo answers
            # at once, where the job's output and accounting are waited for,
            # and Slurm kills the runner KillWait (5 s on the test clusters)
            # after its signal (a CI-like run lost Slurm's words so).
            if down := _down_nodes(nodes) if nodes else "":
                return f"Slurm job {job}: NODE_FAIL; node down: {down}"
            if state in STILL_RUNNING:
                return None  # not a stop of Slurm's: the job goes on
            state = _told_in_output(job, out) or accounted_state(job) or state
        said = f"Slurm job {job}: {state}"
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
        # start each rank as a world of its own (frameworks/lbann_family.check_world).
        # pmix fits an Open MPI build (Debian's, envs/build-lbann.sh);
        # DDLC_SRUN_MPI names another (pmi2, cray_shasta), or '' for slurm.conf's.
        mpi = variables.value("DDLC_SRUN_MPI", env)
        args = ["--overlap", *([f"--mpi={mpi}"] if mpi else [])]
        if hosts:
            args.append(f"--nodelist={','.join(h.name for h in hosts)}")
        # LBANN's srun runs from the driver's environment: without the one-task
        # step's size, as for per_node_starter.
        return {"scheduler": "slurm", "launcher_args": args, "unset_env": list(STEP_VARIABLES)}


# The states of a job Slurm is not ending (its runner asks as its launcher fails).
STILL_RUNNING = ("RUNNING", "CONFIGURING")

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
    CANCELLED), set when Slurm ends the job, before its processes are
    signalled. None where accounting does not answer or knows no more."""
    words = _ask(["sacct", "-j", job, "-X", "-n", "-P", "-o", "State"]).split()
    return words[0] if words and words[0] not in ("RUNNING", "COMPLETING", "PENDING") else None


# What slurmstepd writes into the job's output as it signals the job:
# "*** JOB 7 ON n1 CANCELLED AT 2026-11-27T16:40:18 ***", with " DUE TO TIME
# LIMIT", "PREEMPTION", "NODE FAILURE, SEE SLURMCTLD LOG..." or "JOB REQUEUE"
# where Slurm, not a user, ended it.
DUE_TO = {
    None: "CANCELLED",
    "TIME LIMIT": "TIMEOUT",
    "PREEMPTION": "PREEMPTED",
    "NODE FAILURE": "NODE_FAIL",
    "JOB REQUEUE": "REQUEUED",
}
# The output's end is enough: the line comes when the job is signalled.
OUTPUT_TAIL_BYTES = 1 << 20


def told_in_output(job: str, text: str) -> str | None:
    """The state Slurm's line about the end of ``job`` in its output names."""
    line = rf"\*\*\* JOB {re.escape(job)}(?: ON \S+)? CANCELLED AT \S+(?: DUE TO ([A-Z ]+))?"
    found = re.findall(line + r"[^*]*\*\*\*", text)
    if not found:
        return None
    why = found[-1].strip() or None
    return DUE_TO.get(why, f"CANCELLED, due to {why}")


def _told_in_output(job: str, scontrol: str) -> str | None:
    """Slurm's line in the job's standard error (``StdErr=`` of scontrol),
    waited for a moment: the batch step writes it as it signals the job."""
    if not (path := _field(scontrol, "StdErr")):
        return None
    for _ in range(4):
        with contextlib.suppress(OSError):
            if state := told_in_output(job, files.read_tail(Path(path), OUTPUT_TAIL_BYTES)):
                return state
        time.sleep(0.5)
    return None


def _job_nodes(scontrol: str) -> list[str]:
    listed = _field(scontrol, "NodeList")
    with contextlib.suppress(SchedulerError):
        return expand(listed) if listed != "(null)" else []
    return []


def _field(scontrol: str, name: str) -> str:
    found = re.search(rf"(?:^|\s){name}=(\S+)", scontrol)
    return found.group(1) if found else ""


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
