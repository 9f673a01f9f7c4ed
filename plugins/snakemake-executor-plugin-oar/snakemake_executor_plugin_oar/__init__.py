"""Snakemake executor plugin for OAR (Grid'5000 and other OAR 2.5 clusters).

One OAR job per Snakemake job (``oarsub``), its resources from the job's;
the status of all active jobs from one ``oarstat`` per check; ``oardel`` on
cancel; a log per job under ``.snakemake/oar_logs``. The mapping itself lives
in ``oar.py`` (pure functions)."""

import asyncio
import os
import shlex
import subprocess
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from . import oar

__version__ = "0.1.0"

# The job resources the executor reads (README.md says what each does).
RESOURCES = (
    "nodes",
    "tasks_per_node",
    "cpus_per_task",
    "gpus_per_node",
    "gpu",
    "runtime",
    "oar_walltime",
    "oar_resources",
    "oar_properties",
    "oar_queue",
    "oar_project",
    "oar_types",
)


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    logdir: Optional[Path] = field(
        default=None,
        metadata={
            "help": "Where each job's log goes (default: .snakemake/oar_logs in the "
            "working directory); a relative path is taken from the working directory.",
            "env_var": False,
            "required": False,
        },
    )
    pass_env: str = field(
        default="PATH,LD_LIBRARY_PATH,PYTHONPATH,VIRTUAL_ENV",
        metadata={
            "help": "Environment variables passed into each job, comma-separated "
            "(NAME* for every variable that starts with NAME): OAR starts a job with "
            "the user's login environment, not the submitting shell's.",
            "env_var": False,
            "required": False,
        },
    )
    default_walltime: int = field(
        default=60,
        metadata={
            "help": "Walltime in minutes of a job that has neither an oar_walltime "
            "nor a runtime resource.",
            "env_var": False,
            "required": False,
        },
    )
    status_grace: int = field(
        default=600,
        metadata={
            "help": "Seconds for which oarstat may fail (the server unreachable) "
            "before the active jobs are reported failed; until then they count "
            "as running.",
            "env_var": False,
            "required": False,
        },
    )
    keep_jobs_on_lost_nodes: bool = field(
        default=False,
        metadata={
            "help": "Leave to OAR a running job one of whose nodes OAR holds Suspected, "
            "Absent or Dead (OAR keeps it until its walltime). By default such a job "
            "is deleted and reported failed.",
            "env_var": False,
            "required": False,
        },
    )
    job_end_command: Optional[str] = field(
        default=None,
        metadata={
            "help": "A command run on the submitting host when a job failed or OAR "
            "recorded events for it (a walltime, an oardel, a lost node), with the "
            "arguments: OAR job id, success or failed, OAR's words, then the job's "
            "output files; e.g. to record in the job's outputs what its killed "
            "processes could not.",
            "env_var": False,
            "required": False,
        },
    )


common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    pass_envvar_declarations_to_cmd=True,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=1,
)


class Executor(RemoteExecutor):
    def __post_init__(self):
        settings = self.workflow.executor_settings
        logdir = Path(settings.logdir or ".snakemake/oar_logs")
        if not logdir.is_absolute():
            logdir = Path(self.workflow.workdir_init) / logdir
        self.logdir = logdir.resolve()
        try:
            oar.check_log_dir(str(self.logdir))
        except oar.OarError as exc:
            raise WorkflowError(str(exc)) from None
        self.last_answer = time.monotonic()  # of oarstat: the grace counts from it
        # The OAR jobs submitted and not yet judged ended. Snakemake's own list
        # (active_jobs) is empty while a status check runs, and a Ctrl-C then
        # would cancel nothing: the jobs would run on, orphaned, to their walltime.
        self.under_way: dict[str, None] = {}  # ordered: oardel in submission order
        self.under_way_lock = threading.Lock()

    # ---- submit ------------------------------------------------------------

    def run_job(self, job: JobExecutorInterface):
        settings = self.workflow.executor_settings
        jobscript = self.get_jobscript(job)
        self.write_jobscript(job, jobscript)
        wildcards = dict(job.wildcards) if not job.is_group() else {}
        folder = self.logdir / oar.log_name(job.name, wildcards)
        folder.mkdir(parents=True, exist_ok=True)  # OAR puts the job in Error without it
        resources = {name: job.resources.get(name) for name in RESOURCES}
        try:
            argv = oar.submit_argv(
                name=f"snakemake.{job.name}.{job.jobid}",
                resources=resources,
                jobscript=jobscript,
                log=str(folder / "%jobid%"),
                env=oar.passed_env(os.environ, settings.pass_env),
                threads=job.threads,
                default_minutes=settings.default_walltime,
            )
        except oar.OarError as exc:  # the job's resources: its error, not the workflow's
            self.report_job_error(SubmittedJobInfo(job), msg=f"OAR job of {job.name}: {exc}")
            return
        self.logger.debug(f"oarsub: {shlex.join(argv)}")
        # oarsub takes the job's directory from $PWD, which only a shell sets.
        out = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, "PWD": os.getcwd()}
        )
        try:
            if out.returncode != 0:
                raise oar.OarError(
                    f"oarsub failed (exit {out.returncode}): {(out.stdout + out.stderr).strip()}"
                )
            job_id = oar.parse_job_id(out.stdout)
        except oar.OarError as exc:
            self.report_job_error(SubmittedJobInfo(job), msg=f"{exc}\n  {shlex.join(argv)}")
            return
        log = folder / f"{job_id}.out"
        self.logger.info(f"Job {job.jobid} is OAR job {job_id}; its log: {log}")
        with self.under_way_lock:
            self.under_way[job_id] = None
        self.report_job_submission(SubmittedJobInfo(job, external_jobid=job_id, aux={"log": log}))

    # ---- status ------------------------------------------------------------

    async def check_active_jobs(
        self, active_jobs: list[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        if not active_jobs:
            return
        async with self.status_rate_limiter:
            answer = await run(oar.status_argv(j.external_jobid for j in active_jobs))
        try:
            if answer.returncode != 0:
                raise oar.OarError(f"oarstat failed: {(answer.stdout + answer.stderr).strip()}")
            jobs = oar.parse_jobs(answer.stdout)
        except oar.OarError as exc:
            silent = time.monotonic() - self.last_answer
            grace = self.workflow.executor_settings.status_grace
            if silent < grace:
                self.logger.warning(f"{exc}; asking again (for {grace - silent:.0f} s more)")
                for job_info in active_jobs:
                    yield job_info
                return
            for job_info in active_jobs:
                self.report_job_error(
                    job_info, msg=f"OAR unreachable for {silent:.0f} s: {exc}", **logs(job_info)
                )
            return
        self.last_answer = time.monotonic()
        for job_info in active_jobs:
            job = jobs.get(job_info.external_jobid)
            if await self.judge(job_info, job) == "running":
                yield job_info

    async def judge(self, job_info: SubmittedJobInfo, job: dict | None) -> str:
        settings = self.workflow.executor_settings
        job_id = job_info.external_jobid
        under_way = job is not None and job.get("state") not in oar.ENDED
        lost = (
            await self.lost_nodes(job) if under_way and not settings.keep_jobs_on_lost_nodes else {}
        )
        outputs = [os.path.abspath(f) for f in job_info.job.output]
        said = oar.verdict(job, all(os.path.exists(f) for f in outputs), lost)
        if said == "running":
            return said
        with self.under_way_lock:
            self.under_way.pop(job_id, None)
        if under_way:  # a node is lost: free the others now
            await run(["oardel", job_id])
        words = oar.words(job_id, job, lost)
        if settings.job_end_command and oar.worth_telling(said, job, lost):
            await self.job_ended(job_id, said, words, outputs)
        if said == "success":
            self.report_job_success(job_info)
        else:
            self.report_job_error(job_info, msg=words, **logs(job_info))
        return said

    async def lost_nodes(self, job: dict) -> dict[str, str]:
        hosts = job.get("assigned_network_address") or []
        if not hosts:
            return {}
        answer = await run(["oarnodes", "-J", "-s", *hosts])
        return oar.lost_nodes(answer.stdout) if answer.returncode == 0 else {}

    async def job_ended(self, job_id: str, said: str, words: str, outputs: list[str]) -> None:
        given = self.workflow.executor_settings.job_end_command
        # A profile gives a file of its folder as its full path: one word.
        command = [given] if os.path.isfile(given) else shlex.split(given)
        answer = await run([*command, job_id, said, words, *outputs])
        if answer.returncode != 0:
            self.logger.warning(
                f"job end command for OAR job {job_id} failed (exit {answer.returncode}): "
                f"{(answer.stdout + answer.stderr).strip()}"
            )

    # ---- cancel ------------------------------------------------------------

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]):
        with self.under_way_lock:  # Snakemake's list, and those a status check holds
            job_ids = list(
                dict.fromkeys([*(j.external_jobid for j in active_jobs), *self.under_way])
            )
        for start in range(0, len(job_ids), 100):
            out = subprocess.run(["oardel", *job_ids[start : start + 100]], capture_output=True)
            if out.returncode != 0:
                self.logger.warning(f"oardel failed: {out.stderr.decode(errors='replace')}")


def logs(job_info: SubmittedJobInfo) -> dict:
    """The job's OAR log files for Snakemake's error report."""
    log = (job_info.aux or {}).get("log")
    if not log:
        return {}
    return {"aux_logs": [str(log), str(Path(log).with_suffix(".err"))]}


async def run(argv: list[str]) -> subprocess.CompletedProcess:
    """A command's outcome without blocking the status loop; a missing
    command is an exit code 127, as a shell says it."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))
    stdout, stderr = await proc.communicate()
    return subprocess.CompletedProcess(
        argv, proc.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace")
    )
