"""OAR (Grid'5000) for Snakemake's cluster-generic executor: submit, status
and cancel commands (profiles/grid5000/ calls them).

    python -m ddlcompare.run.oar submit JOBSCRIPT   prints only the OAR job id
    python -m ddlcompare.run.oar status JOBID       prints running, success or failed
    python -m ddlcompare.run.oar cancel JOBID...    oardel

Submit reads what a job needs from the properties line Snakemake writes at
the top of every job script (its resources and outputs), so the profile
passes nothing but the script. It keeps, per job id, where the job's done
marker will appear; status trusts that marker over OAR's word, so a job
killed by its walltime or a lost node is `failed`, even once OAR has
forgotten the job. OAR ends a job by SIGKILL to all its processes, so the
run cannot record that itself: status records it in the run's run.json, in
OAR's words (its state and events). A running job on a node OAR holds
Suspected, Absent or Dead is lost: OAR would keep it until its walltime.
Standard library only (and runfiles/): it runs with any python3.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from runfiles.atomic import write_json
from runfiles.names import DONE, OWNER, RUN_RECORD
from runfiles import files

DONE_MARKER = DONE  # what a finished run leaves (runfiles/names.py)
JOBS_DIR = Path(".snakemake") / "oar_jobs"  # under snakemake's working directory
LOGS_DIR = Path(".snakemake") / "oar_logs"
# Passed into the job: OAR starts jobs with the user's login environment,
# not the submitting shell's (Slurm's --export=ALL has no OAR equivalent).
PASSED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
PASSED_PREFIX = "DDLC_"
ENDED = ("Terminated", "Error")
# Node states in which OAR no longer reaches a node (finaud's check failed,
# or an administrator took it out): its jobs cannot go on.
LOST = ("Suspected", "Absent", "Dead")
# Events that say how OAR carried out a job's end, not why it ended.
MECHANICS = ("SEND_KILL_JOB", "SWITCH_INTO_ERROR_STATE", "SWITCH_INTO_TERMINATE_STATE")


class OarError(Exception):
    """A problem the user can fix; printed without a traceback."""


# ---- submit ----------------------------------------------------------------


def job_properties(jobscript: Path) -> dict:
    """The JSON Snakemake writes on the script's ``# properties =`` line."""
    for line in jobscript.read_text().splitlines()[:5]:
        if line.startswith("# properties = "):
            return json.loads(line[len("# properties = ") :])
    raise OarError(f"{jobscript}: no '# properties =' line (not a Snakemake job script?)")


def walltime(resources: dict) -> str:
    """H:MM:SS from ``oar_walltime`` when set, else ``runtime`` (minutes)."""
    if resources.get("oar_walltime"):
        text = str(resources["oar_walltime"])
        if not re.fullmatch(r"\d+(:\d{1,2}){0,2}", text):
            raise OarError(f"resource oar_walltime: {text!r} is not H:M:S")
        return text
    minutes = int(resources.get("runtime") or 60)
    return f"{minutes // 60}:{minutes % 60:02d}:00"


def resource_request(resources: dict) -> str:
    """``-l``: whole hosts, then GPUs per host (GPU runs) or cores per host.

    ``oar_resources`` replaces the per-host part (e.g. ``host`` alone for
    whole nodes on a CPU cluster: ``oar_resources=""``)."""
    nodes = int(resources.get("nodes") or 1)
    if "oar_resources" in resources:
        per_host = str(resources["oar_resources"])
    elif int(resources.get("gpus_per_node") or 0) > 0:
        per_host = f"gpu={int(resources['gpus_per_node'])}"
    else:
        cores = int(resources.get("tasks_per_node") or 1) * int(resources.get("cpus_per_task") or 1)
        per_host = f"core={cores}"
    hosts = f"host={nodes}" + (f"/{per_host}" if per_host else "")
    return f"{hosts},walltime={walltime(resources)}"


def submit_argv(props: dict, jobscript: Path, logs: Path, env: dict) -> list[str]:
    resources = props.get("resources", {})
    name = f"ddlc.{props.get('rule', 'job')}.{props.get('jobid', '')}".rstrip(".")
    argv = [
        "oarsub",
        "-n",
        name,
        "-l",
        resource_request(resources),
        "-O",
        str(logs / "%jobid%.out"),
        "-E",
        str(logs / "%jobid%.err"),
    ]
    if resources.get("oar_properties"):
        argv += ["-p", str(resources["oar_properties"])]
    if resources.get("oar_queue"):
        argv += ["-q", str(resources["oar_queue"])]
    if resources.get("oar_project"):
        argv += ["--project", str(resources["oar_project"])]
    if resources.get("oar_types"):  # e.g. "exotic" or "night", comma-separated
        for job_type in str(resources["oar_types"]).split(","):
            argv += ["-t", job_type.strip()]
    passed = {k: v for k, v in env.items() if k in PASSED_ENV or k.startswith(PASSED_PREFIX)}
    command = [
        "env",
        *(f"{k}={v}" for k, v in sorted(passed.items())),
        "/bin/sh",
        str(jobscript.resolve()),
    ]
    return argv + [shlex.join(command)]


def parse_job_id(oarsub_output: str) -> str:
    """oarsub prints admission-rule lines first, then ``OAR_JOB_ID=<id>``."""
    found = re.findall(r"^OAR_JOB_ID=(\d+)\s*$", oarsub_output, re.MULTILINE)
    if not found:
        raise OarError("oarsub printed no OAR_JOB_ID line:\n" + oarsub_output.strip())
    return found[-1]


def done_marker(props: dict) -> str | None:
    outputs = props.get("output") or []
    found = [o for o in outputs if Path(o).name == DONE_MARKER]
    return str(Path(found[0]).resolve()) if found else None


def submit(jobscript: Path) -> str:
    props = job_properties(jobscript)
    logs = LOGS_DIR.resolve()
    logs.mkdir(parents=True, exist_ok=True)  # oarsub puts a job in Error without it
    argv = submit_argv(props, jobscript, logs, dict(os.environ))
    # oarsub takes the job's directory from $PWD, which only a shell sets.
    out = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "PWD": os.getcwd()}
    )
    if out.returncode != 0:
        raise OarError(
            f"oarsub failed (exit {out.returncode}): "
            f"{(out.stdout + out.stderr).strip()}\n  {shlex.join(argv)}"
        )
    job_id = parse_job_id(out.stdout)
    JOBS_DIR.mkdir(parents=True, exist_ok=True)
    (JOBS_DIR / f"{job_id}.json").write_text(
        json.dumps(
            {"done": done_marker(props), "submitted": time.time(), "jobscript": str(jobscript)}
        )
    )
    return job_id


# ---- status ----------------------------------------------------------------


def oar_job(job_id: str) -> dict | None:
    """The job's record from ``oarstat -f -J -j``; None when OAR no longer
    knows it. Raises OarError when OAR cannot be asked (then try later)."""
    out = subprocess.run(["oarstat", "-f", "-J", "-j", job_id], capture_output=True, text=True)
    if out.returncode != 0:
        raise OarError(f"oarstat -j {job_id} failed: {(out.stdout + out.stderr).strip()}")
    text = out.stdout.strip()
    if not text:
        return None
    try:
        return json.loads(text).get(job_id)
    except ValueError:
        raise OarError(f"oarstat -j {job_id}: not JSON: {text[:200]}") from None


def lost_nodes(job: dict) -> dict[str, str]:
    """The job's nodes OAR holds lost, each with its state; {} when OAR
    cannot be asked (then the job is judged again at the next poll)."""
    hosts = job.get("assigned_network_address") or []
    if not hosts:
        return {}
    out = subprocess.run(["oarnodes", "-J", "-s", *hosts], capture_output=True, text=True)
    try:
        nodes = json.loads(out.stdout) if out.returncode == 0 else {}
    except ValueError:
        return {}
    lost = {}
    for host, resources in nodes.items():  # {host: {resource id: state}}
        if states := set(resources.values()) & set(LOST):
            lost[host] = "/".join(sorted(states))
    return lost


def decide(job: dict | None, marker: str | None, lost: dict | None = None) -> str:
    """running / success / failed from OAR's record and our done marker.

    Success needs the job to have ended well AND, for a run, its done marker
    (ok or failed: either way the run is recorded and the report shows it).
    A job OAR has forgotten is judged by the marker alone. A running job
    with a lost node has failed, unless it is a run whose marker is there
    (it finished; OAR is ending it): OAR would keep it until its walltime,
    and the workflow would wait as long (a probe on the lost node did)."""
    run_done = marker is not None and Path(marker).exists()
    if job is None:
        return "success" if run_done else "failed"
    if job.get("state") not in ENDED:
        return "failed" if lost and not run_done else "running"
    ended_well = job["state"] == "Terminated" and job.get("exit_code") == 0
    return "success" if ended_well and (marker is None or run_done) else "failed"


def why(job_id: str, job: dict | None, lost: dict | None = None) -> str:
    """OAR's words for a job's end: its state, exit code, lost nodes, and
    the events that say why (WALLTIME, FRAG_JOB_REQUEST, EXTERMINATE_JOB...)."""
    if job is None:
        return f"OAR job {job_id}: no longer known to OAR"
    said = [str(job.get("state"))]
    if job.get("exit_code") is not None:
        said.append(f"exit code {job['exit_code']}")
    said += [f"node {host} {state}" for host, state in (lost or {}).items()]
    said += causes(job)
    return f"OAR job {job_id}: " + ", ".join(said)


def causes(job: dict) -> list[str]:
    """The job's events that say why it ended or what went wrong around it."""
    return [
        f"{e.get('type')} ({e.get('description')})"
        for e in job.get("events") or []
        if e.get("type") not in MECHANICS
    ]


def record_stop(marker: str, reason: str) -> None:
    """The run's record says it was stopped, and why, where its runner was
    killed before it could (status still running); its folder is released,
    so that the next attempt, on any node, may claim it at once."""
    run_dir = Path(marker).parent
    try:
        record = files.read_json(run_dir / RUN_RECORD)
    except (OSError, ValueError):
        return  # the run never started: nothing to correct
    if record.get("status") != "running":
        return
    record.update(
        status="interrupted",
        end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        reason=f"stopped by OAR ({reason}); the next workflow run starts it again",
    )
    try:
        write_json(run_dir / RUN_RECORD, record)
        (run_dir / OWNER).unlink(missing_ok=True)
    except OSError as exc:  # the job's status matters more to Snakemake than the record
        print(f"oar status: cannot record the stop in {run_dir}: {exc}", file=sys.stderr)


def note_failure(marker: str, reason: str) -> None:
    """A run that failed inside a job OAR has more to say of (a node lost
    under it: the run saw only its ranks die) gets OAR's words beside its
    own, in its done marker and its record."""
    for path in (Path(marker), Path(marker).with_name(RUN_RECORD)):
        try:
            doc = files.read_json(path)
            if doc.get("status") == "failed" and "OAR job " not in str(doc.get("reason")):
                write_json(path, {**doc, "reason": f"{doc.get('reason')}; {reason}"})
        except (OSError, ValueError) as exc:
            print(f"oar status: cannot note OAR's words in {path}: {exc}", file=sys.stderr)


def status(job_id: str) -> str:
    record = JOBS_DIR / f"{job_id}.json"
    marker = files.read_json(record)["done"] if record.exists() else None
    try:
        job = oar_job(job_id)
    except OarError as exc:
        print(f"oar status: {exc}; asking again later", file=sys.stderr)
        return "running"
    running = job is not None and job.get("state") not in ENDED
    lost = lost_nodes(job) if job is not None and running else {}
    said = decide(job, marker, lost)
    if said == "failed" and running:  # its node is lost: free the others now
        subprocess.run(["oardel", job_id], capture_output=True)
    if said == "failed" and marker and not Path(marker).exists():
        record_stop(marker, why(job_id, job, lost))
    # A job is Finishing while OAR ends it (cleaning its nodes, which adds
    # CPUSET_CLEAN_ERROR), and Terminated only then: its events are all there.
    if said == "success" and marker and job and causes(job):
        note_failure(marker, why(job_id, job))
    return said


# ---- cancel ----------------------------------------------------------------


def cancel(job_ids: list[str]) -> int:
    return subprocess.run(["oardel", *job_ids]).returncode


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ddlcompare.run.oar",
        description="Snakemake's cluster-generic commands for OAR",
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("submit", help="submit a job script; prints the job id").add_argument(
        "jobscript", type=Path
    )
    sub.add_parser("status", help="running, success or failed").add_argument("job_id")
    sub.add_parser("cancel", help="delete jobs").add_argument("job_ids", nargs="+")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # a usage error: argparse said why, on stderr
        return int(exc.code or 0)
    try:
        if args.command == "submit":
            print(submit(args.jobscript))
        elif args.command == "status":
            print(status(args.job_id))
        else:
            return cancel(args.job_ids)
    except (OarError, OSError) as exc:
        print(f"oar {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
