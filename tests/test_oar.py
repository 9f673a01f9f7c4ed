"""The Grid'5000 profile against a real OAR 2.5 (PostgreSQL, oar-server, the
OAR node's sshd) that envs/schedulers/oar.sh starts on localhost, submitting
as an unprivileged user as on Grid'5000: a tiny design trains exactly as a
local run; a walltime kill, a failing job and a job without its done marker
come back `failed`; cancel works; launch commands from a real $OAR_NODEFILE."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO, final_losses, tiny_design, trained_here, write_design
from ddlcompare.run import launch, oar, schedulers
from ddlcompare.run.schedulers import Host
from ddlcompare.run.launchers.tf_workers import tf_worker_addresses
from ddlcompare.run.schedulers.oar import Oar

SCRIPT = REPO / "envs" / "schedulers" / "oar.sh"
PROFILE = REPO / "profiles" / "grid5000"
VENV = Path(sys.executable).parents[1]
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
# One framework: every framework goes through OAR in tests/test_cluster.py.
DESIGN = tiny_design(procs=(2,), epochs=1, max_steps=6)
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


@pytest.fixture(scope="session")
def oar_user():
    if os.geteuid() != 0 or not Path("/usr/bin/apt-get").exists():
        pytest.skip("the test OAR needs root on Debian (envs/schedulers/oar.sh)")
    started = time.monotonic()
    up = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    name = subprocess.run([str(SCRIPT), "user"], capture_output=True, text=True).stdout.strip()
    # The user runs snakemake and the jobs: it must reach the environment
    # (its Python may live under /root) and this checkout.
    granted = subprocess.run(
        [
            str(SCRIPT),
            "grant",
            str(VENV / "bin" / "python"),
            str(REPO / "ddlcompare" / "run" / "oar.py"),
        ],
        capture_output=True,
        text=True,
    )
    assert granted.returncode == 0, granted.stderr
    print(f"oar up in {time.monotonic() - started:.1f} s")
    user = OarUser(name)
    yield user
    shutil.rmtree(user.home / "ddlc-tests", ignore_errors=True)
    subprocess.run([str(SCRIPT), "stop"], timeout=120)


def snakemake(user: OarUser, workdir: Path, profile: Path, *extra: str, limit: int = 300):
    argv = [
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


def job_ids(workdir: Path) -> list[str]:
    return sorted(p.stem for p in (workdir / ".snakemake" / "oar_jobs").glob("*.json"))


def oarstat(user: OarUser, job_id: str, cwd: Path) -> dict:
    out = user.run(["oarstat", "-f", "-J", "-j", job_id], cwd)
    return json.loads(out.stdout)[job_id]


def test_tiny_design_through_the_grid5000_profile_matches_a_local_run(oar_user, tmp_path):
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
    job = next(j for j in jobs if j["name"].startswith("ddlc.run."))
    assert job["state"] == "Terminated" and job["exit_code"] == 0
    assert job["owner"] == oar_user.name
    assert "-l host=1/core=2,walltime=0:" in job["initial_request"]

    local = trained_here(DESIGN, tmp_path)
    assert final_losses(on_oar / "results") == local  # same seed, same training


def test_walltime_kill_is_failed_and_the_workflow_ends(oar_user):
    workdir = oar_user.workdir("walltime")
    write_design(workdir, tiny_design(procs=(1,), epochs=1000, max_steps=None, timeout_s=3600))
    started = time.monotonic()
    out = snakemake(
        oar_user, workdir, PROFILE, "--set-resources", "run:oar_walltime='0:00:10'", limit=180
    )
    print(f"walltime workflow: {time.monotonic() - started:.1f} s")
    assert out.returncode != 0
    assert "Error in rule run" in out.stderr, out.stderr[-3000:]
    [job_id] = job_ids(workdir)
    job = oarstat(oar_user, job_id, workdir)
    assert job["state"] == "Error" and "walltime=0:00:10" in job["initial_request"]
    assert not list((workdir / "results").rglob("done.json"))  # the next invocation reruns it
    # OAR killed the runner outright (SIGKILL): the status command recorded why.
    [record] = [json.loads(p.read_text()) for p in (workdir / "results").rglob("run.json")]
    assert record["status"] == "interrupted", record
    assert f"stopped by OAR (OAR job {job_id}: Error" in record["reason"], record["reason"]
    assert "WALLTIME (" in record["reason"], record["reason"]


def handmade_job(workdir: Path, body: str, marker: bool = True, cores: int = 1) -> Path:
    """A job script as Snakemake writes them: properties line, then the command."""
    done = workdir / "run" / "done.json"
    done.parent.mkdir(exist_ok=True)
    shutil.chown(done.parent, workdir.owner())
    props = {
        "rule": "run",
        "jobid": 1,
        "output": [str(done)] if marker else [],
        "resources": {
            "nodes": 1,
            "tasks_per_node": cores,
            "cpus_per_task": 1,
            "gpus_per_node": 0,
            "runtime": 2,
        },
    }
    script = workdir / f"job-{uuid.uuid4().hex[:6]}.sh"
    script.write_text(f"#!/bin/sh\n# properties = {json.dumps(props)}\n{body}\n")
    shutil.chown(script, workdir.owner())
    return script


def wait_status(user: OarUser, workdir: Path, job_id: str, limit: float = 60) -> str:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        out = user.run([str(PROFILE / "status"), job_id], workdir)
        assert out.returncode == 0 and out.stdout.count("\n") == 1, out.stderr
        if out.stdout.strip() != "running":
            return out.stdout.strip()
        time.sleep(0.5)
    return "running"


def submit(user: OarUser, workdir: Path, script: Path) -> str:
    out = user.run([str(PROFILE / "submit"), str(script)], workdir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().isdigit(), out.stdout  # only the id, never the admission lines
    return out.stdout.strip()


def test_status_success_needs_the_done_marker_and_a_clean_exit(oar_user):
    workdir = oar_user.workdir("status")
    done = workdir / "run" / "done.json"
    cases = {
        "writes its marker": (f'echo \'{{"status": "ok"}}\' > {done}', "success"),
        "exits 3": ("exit 3", "failed"),
        "ends well without its marker": ("true", "failed"),
    }
    for label, (body, expected) in cases.items():
        done.unlink(missing_ok=True)
        job_id = submit(oar_user, workdir, handmade_job(workdir, body))
        assert wait_status(oar_user, workdir, job_id) == expected, label
    # A job that is not a run (no marker to look for) is judged by its exit.
    job_id = submit(oar_user, workdir, handmade_job(workdir, "true", marker=False))
    assert wait_status(oar_user, workdir, job_id) == "success"
    # OAR no longer knows the job: the marker alone decides.
    assert oar.oar_job("987654") is None
    record = workdir / ".snakemake" / "oar_jobs"
    (record / "987654.json").write_text(json.dumps({"done": str(done)}))
    done.unlink(missing_ok=True)
    assert wait_status(oar_user, workdir, "987654") == "failed"
    done.write_text("{}")
    assert wait_status(oar_user, workdir, "987654") == "success"


def test_cancel_deletes_the_job(oar_user):
    workdir = oar_user.workdir("cancel")
    job_id = submit(oar_user, workdir, handmade_job(workdir, "sleep 300"))
    deadline = time.monotonic() + 30
    while oarstat(oar_user, job_id, workdir)["state"] != "Running":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    out = oar_user.run([str(PROFILE / "cancel"), job_id], workdir)
    assert out.returncode == 0, out.stderr
    assert wait_status(oar_user, workdir, job_id) == "failed"
    assert oarstat(oar_user, job_id, workdir)["state"] == "Error"


def test_launch_commands_from_a_real_oar_nodefile(oar_user):
    # The $OAR_NODEFILE OAR really writes: one line per core, host repeated.
    workdir = oar_user.workdir("nodefile")
    copy = workdir / "nodefile"
    job_id = submit(
        oar_user, workdir, handmade_job(workdir, f"cp $OAR_NODEFILE {copy}", marker=False, cores=2)
    )
    assert wait_status(oar_user, workdir, job_id) == "success"
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
    assert argv[:8] == [
        "mpirun",
        "--host",
        "node-1.site,node-2.site",
        "--npernode",
        "1",
        "--mca",
        "plm_rsh_agent",
        "oarsh",
    ]
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
