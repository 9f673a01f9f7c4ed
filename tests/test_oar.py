"""The OAR executor plugin (plugins/snakemake-executor-plugin-oar) and the
Grid'5000 profile against a real OAR 2.5 (PostgreSQL, oar-server, the OAR
node's sshd) that envs/schedulers/oar.sh starts on localhost, submitting as
an unprivileged user as on Grid'5000: a tiny design trains exactly as a
local run; a walltime kill is recorded; the plugin's own workflow: a job that
ends well, one that fails, one without its output, oarstat unreachable for a
while, cancel on interrupt; launch commands from a real $OAR_NODEFILE."""

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import (
    REPO,
    SCHEDULED,
    WORKFLOW_OVERHEAD_S,
    final_losses,
    mpirun_per_node,
    scheduler_up,
    tiny_design,
    workflow_limit,
    write_design,
)
from ddlcompare.run import launch, schedulers
from ddlcompare.run.schedulers import Host
from ddlcompare.run.launchers.tf_workers import tf_worker_addresses
from ddlcompare.run.schedulers.oar import Oar

SCRIPT = REPO / "envs" / "schedulers" / "oar.sh"
PROFILE = REPO / "profiles" / "grid5000"
VENV = Path(sys.executable).parents[1]
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
# One framework: every framework goes through OAR in tests/test_cluster.py.
DESIGN = {**SCHEDULED, "factors": {**SCHEDULED["factors"], "procs_per_node": [2]}}
pytestmark = [pytest.mark.slow, pytest.mark.schedulers]


class OarUser:
    """The unprivileged user that submits, and how to run things as it."""

    def __init__(self, name: str):
        self.name = name
        self.home = Path(os.path.expanduser(f"~{name}"))
        self.env = {
            "HOME": str(self.home),
            "USER": name,
            "LANG": "C.UTF-8",
            "PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": str(REPO),
            "DDLC_VENV": str(VENV),
        }

    def workdir(self, label: str) -> Path:
        path = self.home / "ddlc-tests" / f"{label}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        shutil.chown(path.parent, self.name)
        shutil.chown(path, self.name)
        return path

    def run(self, argv: list[str], cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.as_user(argv),
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, argv: list[str], cwd: Path, log) -> subprocess.Popen:
        """argv in the background, its output into ``log``."""
        return subprocess.Popen(
            self.as_user(argv), cwd=cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )

    def as_user(self, argv: list[str]) -> list[str]:
        return [RUNUSER, "-u", self.name, "--", *argv]


@pytest.fixture(scope="module")
def oar_user(schedulers_alone):
    with scheduler_up(SCRIPT, "OAR"):
        name = subprocess.run([str(SCRIPT), "user"], capture_output=True, text=True).stdout
        # The user runs snakemake and the jobs: it must reach the environment
        # (its Python may live under /root) and this checkout.
        granted = subprocess.run(
            [str(SCRIPT), "grant", str(VENV / "bin" / "python"), str(PROFILE / "job-end")],
            capture_output=True,
            text=True,
        )
        assert granted.returncode == 0, granted.stderr
        user = OarUser(name.strip())
        yield user
        shutil.rmtree(user.home / "ddlc-tests", ignore_errors=True)


def snakemake(
    user: OarUser,
    workdir: Path,
    profile: Path,
    *extra: str,
    limit: int | None = None,
    env: dict[str, str] | None = None,
):
    """The workflow as ``user``, with ``env`` added to its environment (the
    profile passes DDLC_* on to the jobs)."""
    limit = limit or workflow_limit(workdir / "design.yaml")
    argv = [
        "env",
        *(f"{name}={value}" for name, value in (env or {}).items()),
        "timeout",
        "-k",
        "30",
        str(limit),
        str(VENV / "bin" / "python"),
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "--profile",
        str(profile),
        "-d",
        str(workdir),
        "--config",
        f"design={workdir / 'design.yaml'}",
    ]
    if profile == PROFILE:  # test settings layered on the profile: poll often
        argv += [
            "--seconds-between-status-checks",
            "1",
            "--max-status-checks-per-second",
            "10",
            "--latency-wait",
            "5",
        ]
    return user.run(argv + list(extra), workdir, timeout=limit + 60)


def job_ids(workdir: Path, pattern: str = "**") -> list[str]:
    """The OAR jobs of a workflow, from the plugin's log per job (<id>.out)."""
    logs = (workdir / ".snakemake" / "oar_logs").glob(f"{pattern}/*.out")
    return sorted({p.stem for p in logs}, key=int)


def oarstat(user: OarUser, job_id: str, cwd: Path) -> dict:
    out = user.run(["oarstat", "-f", "-J", "-j", job_id], cwd)
    return json.loads(out.stdout)[job_id]


def test_tiny_design_through_the_grid5000_profile_matches_a_local_run(oar_user, trained_locally):
    on_oar = oar_user.workdir("oar")
    write_design(on_oar, DESIGN)
    started = time.monotonic()
    out = snakemake(oar_user, on_oar, PROFILE)
    print(f"oar workflow: {time.monotonic() - started:.1f} s")
    assert out.returncode == 0, out.stderr[-4000:]
    records = [json.loads(p.read_text()) for p in (on_oar / "results").rglob("run.json")]
    assert [r["config"]["framework"] for r in records] == ["torch-ddp"]
    for record in records:
        assert record["status"] == "ok", record.get("reason")
        assert record["scheduler"] == "oar"
        assert record["hosts"] == [{"name": "localhost", "slots": 2}]
    ids = job_ids(on_oar)
    assert len(ids) == 2  # one OAR job per run and the probe; collect and report ran here
    jobs = [oarstat(oar_user, i, on_oar) for i in ids]
    assert sorted(j["name"].split(".")[1] for j in jobs) == ["probe", "run"]
    job = next(j for j in jobs if j["name"].startswith("snakemake.run."))
    assert job["state"] == "Terminated" and job["exit_code"] == 0
    assert job["owner"] == oar_user.name
    assert "-l host=1/core=2,walltime=0:" in job["initial_request"]

    # same seed, same training as the same run trained here
    on_oar_losses = final_losses(on_oar / "results")
    assert len(on_oar_losses) == 1
    assert on_oar_losses == {path: trained_locally[path] for path in on_oar_losses}


def test_walltime_kill_is_failed_and_the_workflow_ends(oar_user):
    """OAR kills a run's job at its walltime: the job end command records it.
    The run measures on a machine lock and registry of its own (as the Slurm
    time-limit test's, test_cluster): on the host's, its 90 s of measuring
    until the kill held the other worker's trainings back, and its wait for
    them before measuring was not added to its walltime."""
    workdir = oar_user.workdir("walltime")
    alone = {
        "DDLC_MEASURE_LOCK": str(workdir / "measure.lock"),
        "DDLC_ATTEMPTS": str(workdir / "a"),
    }
    write_design(workdir, tiny_design(procs=(1,), epochs=1000, max_steps=None, timeout_s=3600))
    started = time.monotonic()
    walltime_s, walltime = 90, "0:01:30"  # OAR ends the run there, long before its timeout
    out = snakemake(
        oar_user,
        workdir,
        PROFILE,
        "--set-resources",
        f"run:oar_walltime='{walltime}'",
        limit=walltime_s + WORKFLOW_OVERHEAD_S,
        env=alone,
    )
    print(f"walltime workflow: {time.monotonic() - started:.1f} s")
    assert out.returncode != 0
    [job_id] = job_ids(workdir)
    assert f"OAR job {job_id}: Error" in out.stderr, out.stderr[-3000:]
    job = oarstat(oar_user, job_id, workdir)
    assert job["state"] == "Error" and f"walltime={walltime}" in job["initial_request"]
    assert not list((workdir / "results").rglob("done.json"))  # the next invocation reruns it
    # OAR killed the runner outright (SIGKILL): the job end command recorded why.
    [record] = [json.loads(p.read_text()) for p in (workdir / "results").rglob("run.json")]
    assert record["status"] == "interrupted", record
    assert f"stopped by OAR (OAR job {job_id}: Error" in record["reason"], record["reason"]
    assert "WALLTIME (" in record["reason"], record["reason"]
    # As complete under OAR's SIGKILL as under Slurm's SIGTERM (test_cluster's faults).
    assert record["scheduler"] == "oar" and record["hosts"] and record["command"], record
    # The job took its own lock and registered there (the profile passed them on).
    assert Path(alone["DDLC_MEASURE_LOCK"]).is_file() and Path(alone["DDLC_ATTEMPTS"]).is_dir()


def wait_for(what: str, check, limit: float = 300):
    deadline = time.monotonic() + limit
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not after {limit} s"
        time.sleep(1)
    return found


def plugin_workflow(user: OarUser, workdir: Path, rules: str, *extra: str, limit: int = 180):
    """A Snakefile of its own through the plugin, as a user of it would run it."""
    (workdir / "Snakefile").write_text(rules)
    shutil.chown(workdir / "Snakefile", user.name)
    return user.run(plugin_argv(workdir, *extra, limit=limit), workdir, timeout=limit + 60)


def plugin_argv(workdir: Path, *extra: str, limit: int = 180) -> list[str]:
    return [
        "timeout", "-k", "30", str(limit), str(VENV / "bin" / "python"), "-m", "snakemake",
        "--executor", "oar", "--jobs", "4", "-d", str(workdir), "--keep-going",
        "--seconds-between-status-checks", "1", "--max-status-checks-per-second", "10",
        "--latency-wait", "3", *extra,
    ]  # fmt: skip


ENDS = """\
rule all:
    input: "ok.txt", "exit3.txt", "nothing.txt"

rule ok:
    output: "ok.txt"
    resources: runtime=2
    shell: "hostname > {output}; echo to the log"

rule exit3:
    output: "exit3.txt"
    shell: "exit 3"

rule nothing:
    output: "nothing.txt"
    shell: "true"
"""


def test_the_plugin_maps_each_jobs_end_and_keeps_a_log_per_job(oar_user):
    workdir = oar_user.workdir("plugin")
    out = plugin_workflow(oar_user, workdir, ENDS)
    assert out.returncode != 0  # two of the three failed
    assert (workdir / "ok.txt").read_text().strip()  # the node's host name
    ids = {rule: job_ids(workdir, f"rule_{rule}") for rule in ("ok", "exit3", "nothing")}
    assert all(len(found) == 1 for found in ids.values()), ids
    [ok], [exit3], [nothing] = ids.values()
    job = oarstat(oar_user, ok, workdir)
    assert job["state"] == "Terminated" and job["exit_code"] == 0 and job["owner"] == oar_user.name
    assert job["name"].startswith("snakemake.ok.")
    assert "-l host=1/core=1,walltime=0:02:00" in job["initial_request"]
    log = workdir / ".snakemake" / "oar_logs" / "rule_ok" / f"{ok}.out"
    assert "to the log" in log.read_text()
    for failed in (exit3, nothing):  # a failing command; a command without its output
        assert f"OAR job {failed}: Terminated, exit code " in out.stderr, out.stderr[-3000:]
        assert oarstat(oar_user, failed, workdir)["exit_code"] != 0


# oarstat fails for its first few calls, as when OAR's database is unreachable.
FLAKY_OARSTAT = """#!/bin/sh
n=$(cat "$0.calls" 2>/dev/null || echo 0); echo $((n + 1)) > "$0.calls"
[ "$n" -ge {failures} ] && exec {oarstat} "$@"
echo "DBI connect('dbname=oar;host=127.0.0.1','oar_ro',...) failed: Connection refused" >&2
exit 1
"""


def flaky_oarstat(user: OarUser, workdir: Path, failures: int) -> dict:
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    script = bin_dir / "oarstat"
    script.write_text(FLAKY_OARSTAT.format(failures=failures, oarstat=shutil.which("oarstat")))
    script.chmod(0o755)
    for path in (bin_dir, script):
        shutil.chown(path, user.name)
    return {**user.env, "PATH": f"{bin_dir}:{user.env['PATH']}"}


def test_status_checks_survive_oarstat_unreachable_for_a_while(oar_user):
    workdir = oar_user.workdir("unreachable")
    rules = 'rule slow:\n    output: "slow.txt"\n    shell: "sleep 5; touch {output}"\n'
    oar_user.env, saved = flaky_oarstat(oar_user, workdir, failures=3), oar_user.env
    try:
        out = plugin_workflow(oar_user, workdir, rules)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "oarstat failed: DBI connect" in out.stderr and "asking again" in out.stderr
        # Past its grace, the job is failed with OAR's silence as the reason.
        (workdir / "slow.txt").unlink()
        (workdir / "bin" / "oarstat.calls").write_text("-1000")
        out = plugin_workflow(oar_user, workdir, rules, "--oar-status-grace", "2")
        assert out.returncode != 0 and "OAR unreachable for " in out.stderr, out.stderr[-3000:]
    finally:
        oar_user.env = saved


SLOW_STATUS_S = 4


def slow_command(real: str, folder: Path) -> Path:
    """``real`` as a busy scheduler answers: after SLOW_STATUS_S, then for
    real (a wrapper of its name in ``folder``, first on a PATH). A status
    check then lasts long enough for a Ctrl-C to land inside it when a test
    chooses; a quick one is a window of milliseconds, hit by chance."""
    wrapper = folder / Path(real).name
    wrapper.write_text(f'#!/bin/sh\nsleep {SLOW_STATUS_S}\nexec {shlex.quote(real)} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def runs_below(proc: subprocess.Popen, program: Path) -> bool:
    """``program`` runs in a process below ``proc``."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if str(program) in child.cmdline():
                return True
    return False


def test_an_interrupted_workflow_deletes_its_oar_jobs(oar_user):
    """Ctrl-C while the plugin checks its jobs' status (a slow oarstat holds
    the check open): Snakemake's list of active jobs is empty for that while,
    so the plugin deletes the jobs from its own list (7f8c260); without it
    the job ran on to its walltime."""
    workdir = oar_user.workdir("cancel")
    (workdir / "Snakefile").write_text(f'rule long:\n    output: "x"\n    shell: "{LONG_SLEEP}"\n')
    (workdir / "bin").mkdir()
    oarstat_program = slow_command(shutil.which("oarstat"), workdir / "bin")
    for path in (workdir / "bin", oarstat_program):
        shutil.chown(path, oar_user.name)
    env = {**oar_user.env, "PATH": f"{workdir / 'bin'}:{oar_user.env['PATH']}"}
    log = open(workdir / "snakemake.log", "w")
    proc = subprocess.Popen(
        oar_user.as_user(plugin_argv(workdir)), cwd=workdir, env=env, stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        # Interrupted only once the job's own command runs: before, the job
        # may still be starting its Snakemake, which then ends by itself
        # (the workflow's Ctrl-C removes what it reads), and no oardel is
        # seen; the test would not say whether the plugin deletes a job.
        def running() -> JobCommand | None:
            assert proc.poll() is None, (workdir / "snakemake.log").read_text()
            return job_command(workdir, LONG_SLEEP)

        command = wait_for(f"the job's {LONG_SLEEP}", running, 120)
        wait_for("a status check", lambda: runs_below(proc, oarstat_program), 60)
        # Ctrl-C, to Snakemake itself (timeout gives it a process group of its own).
        [snakemake] = [
            c for c in psutil.Process(proc.pid).children(recursive=True)
            if c.cmdline()[1:3] == ["-m", "snakemake"]
        ]  # fmt: skip
        snakemake.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        seen: dict = {}

        def job_ended() -> dict | None:
            seen.update(oarstat(oar_user, command.job, workdir))
            return seen if seen["state"] in ("Error", "Terminated") else None

        try:
            job = wait_for(f"OAR ending job {command.job}", job_ended, 120)
        except AssertionError as error:  # what OAR and the workflow said
            log_text = (workdir / "snakemake.log").read_text()[-3000:]
            raise AssertionError(
                f"{error}; {seen.get('state')}, {seen.get('events')}; {log_text}"
            ) from None
        events = {e["type"] for e in job["events"]}
        assert "FRAG_JOB_REQUEST" in events, events  # deleted, not ended by itself
        wait_for(f"job {command.job}'s {LONG_SLEEP} killed", lambda: ended(command.process), 30)
    finally:  # whatever failed, nothing of it outlives the test
        with contextlib.suppress(psutil.Error):
            for process in [*psutil.Process(proc.pid).children(recursive=True), proc]:
                process.kill()
        oar_user.run(["oardel", *job_ids(workdir)], workdir)
        log.close()


LONG_SLEEP = "sleep 293"  # a command no other test runs, found by its command line


@dataclasses.dataclass
class JobCommand:
    job: str
    process: psutil.Process


def ended(process: psutil.Process) -> bool:
    """Killed: gone, or a zombie its parent has not waited for yet."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def job_command(workdir: Path, command: str) -> JobCommand | None:
    """The workflow's first OAR job, once its shell runs ``command``."""
    if not (ids := job_ids(workdir)):
        return None
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if process.info["cmdline"] == command.split():
                if process.environ().get("OAR_JOB_ID") == ids[0]:
                    return JobCommand(ids[0], process)
    return None


def test_launch_commands_from_a_real_oar_nodefile(oar_user):
    # The $OAR_NODEFILE OAR really writes: one line per core, host repeated.
    workdir = oar_user.workdir("nodefile")
    copy = workdir / "nodefile"
    out = plugin_workflow(
        oar_user,
        workdir,
        f'rule nodefile:\n    output: "{copy}"\n    threads: 2\n'
        '    shell: "cp $OAR_NODEFILE {output}"\n',
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = copy.read_text()
    assert text.split() == ["localhost", "localhost"]
    scheduler, found = schedulers.detect(1, 2, env={"OAR_NODEFILE": str(copy)})
    assert (scheduler.name, found) == ("oar", [Host("localhost", 2)])
    # Two hosts as OAR lists them: the same lines, once per host.
    two_hosts = text.replace("localhost", "node-1.site") + text.replace("localhost", "node-2.site")
    scheduler, found = schedulers.detect(
        2, 2, env={"OAR_NODEFILE": _write(workdir / "nf2", two_hosts)}
    )
    assert scheduler.name == "oar" and [h.name for h in found] == ["node-1.site", "node-2.site"]
    config = {"threads": 1, "run_id": "r1", "horovod_controller": "gloo", "framework": "torch-ddp"}
    argv, _ = launch.command("torchrun", found, config, Path("/r"), "oar")
    assert argv[:8] == mpirun_per_node("node-1.site,node-2.site", "oarsh")
    assert f"--rdzv_endpoint=node-1.site:{launch.run_port(29500, config)}" in argv
    argv, env = launch.command("horovodrun", found, config, Path("/r"), "oar")
    assert argv[1:6] == ["-np", "4", "-H", "node-1.site:2,node-2.site:2", "--gloo"]
    assert env["PATH"].startswith(str(Oar.ssh_dir))
    argv, _ = launch.command(
        "horovodrun", found, {**config, "horovod_controller": "mpi"}, Path("/r"), "oar"
    )
    assert "--mpi-args=--mca plm_rsh_agent oarsh" in argv
    assert tf_worker_addresses(found) == [
        "node-1.site:23456",
        "node-1.site:23457",
        "node-2.site:23456",
        "node-2.site:23457",
    ]


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)
