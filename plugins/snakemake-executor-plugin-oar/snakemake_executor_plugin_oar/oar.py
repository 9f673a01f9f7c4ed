"""What the executor says to OAR and how it reads OAR's answers: pure
functions, no process started (the executor runs the commands)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping

# OAR's final job states; every other state (Waiting, Launching, Running,
# Finishing, Hold, toLaunch, ...) is a job still under way.
ENDED = ("Terminated", "Error")
# Node states in which OAR no longer reaches a node (its check failed, or an
# administrator took it out): the jobs on it cannot go on.
LOST = ("Suspected", "Absent", "Dead")
# Events that say how OAR carried out a job's end, not why it ended.
MECHANICS = ("SEND_KILL_JOB", "SWITCH_INTO_ERROR_STATE", "SWITCH_INTO_TERMINATE_STATE")
WALLTIME = re.compile(r"\d+(:\d{1,2}){0,2}")
MAX_NAME = 200  # of a log folder: file systems allow 255 bytes
# What oarsub accepts in the paths of a job's output files (OAR::IO).
LOG_PATH = re.compile(r"[a-zA-Z0-9_./\-%\\ ]+")
NOT_IN_LOG_NAME = re.compile(r"[^a-zA-Z0-9_.\-]")


class OarError(Exception):
    """A problem the user can fix; one line, no traceback."""


def walltime(resources: Mapping, default_minutes: int) -> str:
    """H:MM:SS from ``oar_walltime`` when set, else ``runtime`` (minutes,
    Snakemake's standard resource), else ``default_minutes``."""
    if resources.get("oar_walltime"):
        text = str(resources["oar_walltime"])
        if not WALLTIME.fullmatch(text):
            raise OarError(f"resource oar_walltime: {text!r} is not H:M:S (e.g. '2:00:00')")
        return text
    minutes = _count(resources, "runtime", default_minutes)
    if minutes < 1:
        raise OarError(f"resource runtime: {minutes} minutes; give at least 1")
    return f"{minutes // 60}:{minutes % 60:02d}:00"


def resource_request(resources: Mapping, threads: int = 1, default_minutes: int = 60) -> str:
    """oarsub's ``-l``: hosts, then GPUs per host or cores per host, then
    the walltime.

    ``oar_resources`` replaces the per-host part (``""``: whole hosts, e.g.
    for a run that cannot share a node); else ``gpus_per_node`` (or ``gpu``)
    asks for GPUs, else ``tasks_per_node`` x ``cpus_per_task`` cores (the
    job's threads when neither is given)."""
    nodes = _count(resources, "nodes", 1)
    if resources.get("oar_resources") is not None:
        per_host = str(resources["oar_resources"])
    elif gpus := _count(resources, "gpus_per_node", 0) or _count(resources, "gpu", 0):
        per_host = f"gpu={gpus}"
    elif resources.get("tasks_per_node") or resources.get("cpus_per_task"):
        cores = _count(resources, "tasks_per_node", 1) * _count(resources, "cpus_per_task", 1)
        per_host = f"core={cores}"
    else:
        per_host = f"core={max(int(threads), 1)}"
    hosts = f"host={nodes}" + (f"/{per_host}" if per_host else "")
    return f"{hosts},walltime={walltime(resources, default_minutes)}"


def _count(resources: Mapping, name: str, default: int) -> int:
    value = resources.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise OarError(f"resource {name}: {value!r} is not a whole number") from None


def passed_env(environ: Mapping[str, str], names: str) -> dict[str, str]:
    """The variables ``names`` selects (comma-separated; ``PREFIX*`` for a
    prefix): OAR starts a job with the user's login environment, not the
    submitting shell's."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    exact = {n for n in wanted if not n.endswith("*")}
    prefixes = tuple(n[:-1] for n in wanted if n.endswith("*"))
    return {k: v for k, v in environ.items() if k in exact or (prefixes and k.startswith(prefixes))}


def submit_argv(
    name: str,
    resources: Mapping,
    jobscript: str,
    log: str,
    env: Mapping[str, str],
    threads: int = 1,
    default_minutes: int = 60,
) -> list[str]:
    """The oarsub command of one job: its name, resources, log files
    (``log`` + ``.out`` and ``.err``, ``%jobid%`` filled in by OAR),
    properties, queue, project and types, then the job script run by
    ``/bin/sh`` with ``env`` set."""
    argv = ["oarsub", "-n", name, "-l", resource_request(resources, threads, default_minutes)]
    argv += ["-O", f"{log}.out", "-E", f"{log}.err"]
    if resources.get("oar_properties"):
        argv += ["-p", str(resources["oar_properties"])]
    if resources.get("oar_queue"):
        argv += ["-q", str(resources["oar_queue"])]
    if resources.get("oar_project"):
        argv += ["--project", str(resources["oar_project"])]
    for job_type in str(resources.get("oar_types") or "").split(","):
        if job_type.strip():  # e.g. "exotic", "night", "deploy"
            argv += ["-t", job_type.strip()]
    command = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), "/bin/sh", jobscript]
    return argv + [shlex.join(command)]


def parse_job_id(oarsub_output: str) -> str:
    """oarsub prints admission-rule lines first, then ``OAR_JOB_ID=<id>``."""
    found = re.findall(r"^OAR_JOB_ID=(\d+)\s*$", oarsub_output, re.MULTILINE)
    if not found:
        raise OarError("oarsub printed no OAR_JOB_ID line: " + oarsub_output.strip())
    return found[-1]


def status_argv(job_ids: Iterable[str]) -> list[str]:
    """One oarstat for a batch of jobs: ``-j`` repeated (OAR 2.5)."""
    argv = ["oarstat", "-f", "-J"]
    for job_id in job_ids:
        argv += ["-j", str(job_id)]
    return argv


def parse_jobs(oarstat_output: str) -> dict[str, dict]:
    """oarstat -f -J: {job id: its record}; a job OAR does not know is absent."""
    text = oarstat_output.strip()
    if not text:
        return {}
    try:
        jobs = json.loads(text)
    except ValueError:
        raise OarError(f"oarstat's answer is not JSON: {text[:200]}") from None
    if not isinstance(jobs, dict):
        raise OarError(f"oarstat's answer is not a table of jobs: {text[:200]}")
    return {str(k): v for k, v in jobs.items()}


def lost_nodes(oarnodes_output: str) -> dict[str, str]:
    """oarnodes -J -s HOST...: {host: its lost state(s)} for the hosts OAR
    no longer reaches; {} when the answer cannot be read."""
    try:
        nodes = json.loads(oarnodes_output or "{}")
    except ValueError:
        return {}
    lost = {}
    for host, resources in nodes.items():  # {host: {resource id: state}}
        if states := set(resources.values()) & set(LOST):
            lost[host] = "/".join(sorted(states))
    return lost


def verdict(job: dict | None, outputs_exist: bool, lost: Mapping | None = None) -> str:
    """running, success or failed.

    A job that ended Terminated with exit code 0 succeeded (Snakemake then
    checks its outputs); Error or another exit code failed (a walltime, an
    oardel, a node lost). A job OAR does not know (any more) is judged by its
    outputs, and so is a job still under way on a lost node: OAR keeps such a
    job until its walltime, also when its run had finished and only the job's
    own end was left when the node was lost."""
    if job is None or (lost and job.get("state") not in ENDED):
        return "success" if outputs_exist else "failed"
    if job.get("state") not in ENDED:
        return "running"
    ended_well = job["state"] == "Terminated" and job.get("exit_code") == 0
    return "success" if ended_well else "failed"


def causes(job: dict) -> list[str]:
    """The job's events that say why it ended or what went wrong around it
    (WALLTIME, FRAG_JOB_REQUEST, EXTERMINATE_JOB, ...)."""
    return [
        f"{e.get('type')} ({e.get('description')})"
        for e in job.get("events") or []
        if e.get("type") not in MECHANICS
    ]


def worth_telling(said: str, job: dict | None, lost: Mapping | None = None) -> bool:
    """Whether OAR has words the job end command should pass on: the job
    failed, a node under it was lost, or an event says why it ended. A job
    still finishing when its node is lost is judged by its outputs (a run
    that failed there has written them), so its verdict alone says nothing
    of the lost node."""
    return said == "failed" or bool(lost) or bool(job and causes(job))


def words(job_id: str, job: dict | None, lost: Mapping | None = None) -> str:
    """OAR's words for a job's end: its state, exit code, lost nodes, causes."""
    if job is None:
        return f"OAR job {job_id}: no longer known to OAR"
    said = [str(job.get("state"))]
    if job.get("exit_code") is not None:
        said.append(f"exit code {job['exit_code']}")
    said += [f"node {host} {state}" for host, state in (lost or {}).items()]
    said += causes(job)
    return f"OAR job {job_id}: " + ", ".join(said)


def log_name(rule: str, wildcards: Mapping[str, str]) -> str:
    """A job's log folder under the log directory: rule_<name>/<wildcards>,
    each wildcard as name-value, '/' made '_' (one folder level) and every
    other character oarsub refuses in a log path made '-'; a name too long
    for a file system is cut and made unique by its hash."""
    parts = ".".join(f"{k}-{v}".replace("/", "_") for k, v in sorted(wildcards.items()))
    parts = NOT_IN_LOG_NAME.sub("-", parts)
    if len(parts) > MAX_NAME:
        parts = parts[: MAX_NAME - 17] + "." + hashlib.sha256(parts.encode()).hexdigest()[:16]
    return f"rule_{NOT_IN_LOG_NAME.sub('-', rule)}" + (f"/{parts}" if parts else "")


def check_log_dir(path: str) -> None:
    """oarsub refuses a log path with other characters than LOG_PATH's."""
    if not LOG_PATH.fullmatch(path):
        raise OarError(
            f"log folder {path}: OAR accepts only letters, digits, spaces and _ . - % / "
            "in a job's log path; give another with --oar-logdir"
        )
