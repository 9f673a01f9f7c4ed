"""The Slurm profile against a real one-node Slurm (munge, MariaDB, slurmdbd,
slurmctld, slurmd) that envs/schedulers/slurm.sh starts on localhost: a
tiny design runs through `snakemake --profile profiles/slurm` and trains
exactly as a local run; a run past its time limit fails and the workflow
ends; launch commands from the node list Slurm really gives."""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (
    REPO,
    SCHEDULED,
    final_losses,
    scheduler_up,
    srun_per_node,
    workflow_limit,
    write_design,
)
from ddlcompare.run import launch, schedulers
from ddlcompare.run.schedulers import Host, slurm as slurm_scheduler
from test_runner import RUNNER, STUBBORN

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
SCRIPT = REPO / "envs" / "schedulers" / "slurm.sh"
# Fast enough for a test: 1 epoch of 6 steps, processes 1 (an srun step)
# and 2 (the launcher owns the allocation).
DESIGN = SCHEDULED
pytestmark = [pytest.mark.slow, pytest.mark.schedulers]


def scheduler_env(**extra) -> dict:
    # Jobs import this checkout's code whatever the cwd (snakemake's workdir).
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DDLC_VENV": str(Path(sys.executable).parents[1]),
        **extra,
    }


@pytest.fixture(scope="module")
def slurm(schedulers_alone):
    with scheduler_up(SCRIPT, "Slurm"):
        conf = subprocess.run([str(SCRIPT), "env"], capture_output=True, text=True).stdout.strip()
        yield scheduler_env(**dict([conf.split("=", 1)]))


def slurm_snakemake(workdir: Path, env: dict):
    """The slurm profile over ``workdir``'s design, with the test's settings
    layered on it: poll often."""
    limit = workflow_limit(workdir / "design.yaml")
    argv = [
        "timeout", "-k", "30", str(limit), SNAKEMAKE, "-s", str(REPO / "Snakefile"),
        "--profile", str(REPO / "profiles" / "slurm"), "-d", str(workdir),
        "--config", f"design={workdir / 'design.yaml'}",
        "--slurm-init-seconds-before-status-checks", "2",
        "--seconds-between-status-checks", "2", "--latency-wait", "5",
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=workdir)


def test_tiny_design_through_the_slurm_profile_matches_a_local_run(
    slurm, trained_locally, tmp_path
):
    on_slurm = tmp_path / "slurm"
    on_slurm.mkdir()
    write_design(on_slurm, DESIGN)
    started, since = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S")
    out = slurm_snakemake(on_slurm, slurm)
    print(f"slurm workflow: {time.monotonic() - started:.1f} s")
    assert out.returncode == 0, out.stderr[-4000:]
    records = [json.loads(p.read_text()) for p in (on_slurm / "results").rglob("run.json")]
    assert sorted(r["config"]["procs_per_node"] for r in records) == [1, 2]
    for record in records:
        assert record["status"] == "ok", record.get("reason")
        assert record["scheduler"] == "slurm"  # both routes saw the allocation
        assert record["hosts"] == [
            {"name": os.uname().nodename.split(".")[0], "slots": record["config"]["procs_per_node"]}
        ]
    jobs = subprocess.run(
        ["sacct", "-n", "-X", "-S", since, "-o", "AllocCPUS,ReqMem,Timelimit"],
        capture_output=True,
        text=True,
        env=slurm,
    ).stdout
    assert sorted(line.split()[:2] for line in jobs.splitlines()) == [
        ["1", "3000M"],
        ["2", "1000M"],
        ["2", "6000M"],
    ]  # CPUs and memory sized per run; the 2-process scale's bandwidth probe (1000M)

    assert final_losses(on_slurm / "results") == trained_locally  # same seed, same training


def test_a_job_slurm_goes_on_with_is_no_stop_of_slurms(slurm):
    """A runner whose launcher failed asks Slurm whether it is ending the job
    (a lost node fails srun as Slurm ends the job): in a job that runs on,
    Slurm has said nothing, and the failure is the run's own."""
    ask = (
        "import os; from ddlcompare.run import schedulers; "
        "print(schedulers.current().stop_reason(os.environ))"
    )
    out = subprocess.run(
        ["srun", "-N1", "-n1", "--mem=100", sys.executable, "-c", ask],
        capture_output=True,
        text=True,
        env=slurm,
        cwd=REPO,
        timeout=120,
    )
    assert (out.returncode, out.stdout.strip()) == (0, "None"), out.stderr


def test_a_stop_is_recorded_in_slurms_words_before_the_launcher_is_stopped(slurm, tmp_path):
    """scancel: Slurm signals the job's processes and kills them outright
    KillWait later (5 s here). The runner records the stop, in Slurm's
    words, before it stops its launcher: one that outlives SIGTERM holds it
    for kill_tree's whole grace (5 s), after which the runner was killed
    before it could ask Slurm."""
    job_script = tmp_path / "job.sh"
    job_script.write_text(
        f"#!/bin/sh\nexec {shlex.join([sys.executable, '-c', RUNNER, str(tmp_path), STUBBORN])}\n"
    )
    job_script.chmod(0o755)
    out = subprocess.run(
        ["sbatch", "--parsable", "--mem=100", "-o", str(tmp_path / "job.out"), str(job_script)],
        capture_output=True,
        text=True,
        env=slurm,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    launcher = tmp_path / "launcher.pid"

    def state() -> str:
        said = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", job],
            capture_output=True,
            text=True,
            env=slurm,
        ).stdout
        return slurm_scheduler.ending_state(said) or ""

    try:
        deadline = time.monotonic() + 120
        while not (launcher.exists() and launcher.read_text().strip()):
            assert time.monotonic() < deadline, f"job {job}: no launcher after 120 s ({state()})"
            time.sleep(0.5)
        subprocess.run(["scancel", job], env=slurm, check=True, timeout=60)
        deadline = time.monotonic() + 60
        while state().split(",")[0] in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            assert time.monotonic() < deadline, f"job {job}: {state()} after 60 s"
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job], env=slurm, timeout=60)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "interrupted", record
    assert record["reason"].startswith(f"stopped by SIGTERM (Slurm job {job}: CANCELLED"), record


def test_launch_commands_from_a_real_slurm_node_list(slurm):
    # The node list and job environment Slurm really gives a two-task job.
    out = subprocess.run(
        ["srun", "-N1", "-n2", "--mem=100", "sh", "-c", 'echo "$SLURM_JOB_NODELIST $SLURM_JOB_ID"'],
        capture_output=True,
        text=True,
        env=slurm,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    nodelist, job_id = out.stdout.split("\n")[0].split()
    node = os.uname().nodename.split(".")[0]
    assert slurm_scheduler.expand(nodelist) == [node]
    scheduler, found = schedulers.detect(1, 2, env={"SLURM_JOB_NODELIST": nodelist})
    assert (scheduler.name, found) == ("slurm", [Host(node, 2)])
    # Where Snakemake's job step left only the job id: asked of Slurm.
    assert schedulers.detect(1, 2, env={"SLURM_JOB_ID": job_id})[1] == found
    # Two nodes (this one twice, as a two-node allocation would name two).
    two = [Host(node, 2), Host(node, 2)]
    config = {"threads": 1, "run_id": "r1", "horovod_controller": "gloo", "framework": "torch-ddp"}
    argv, _ = launch.command("torchrun", two, config, Path("/r"), "slurm")
    argv = argv[argv.index("srun") :]
    assert argv[:6] == srun_per_node([node, node])
    assert (
        f"--rdzv_endpoint={node}:{launch.run_port(29500, config)}" in argv and "--nnodes=2" in argv
    )
    argv, _ = launch.command("horovodrun", two, config, Path("/r"), "slurm")
    assert argv[1:6] == ["-np", "4", "-H", f"{node}:2,{node}:2", "--gloo"]


@pytest.mark.parametrize(
    "line, said",
    [
        # As scontrol printed them in this suite's cluster test (CI, 2026-11-25):
        # a job past its time limit while its processes still handle SIGTERM.
        (
            "JobId=16 JobName=run JobState=COMPLETING Reason=TimeLimit Dependency=(null)",
            "TIMEOUT, TimeLimit",
        ),
        (
            "JobId=16 JobName=run JobState=TIMEOUT Reason=TimeLimit Dependency=(null)",
            "TIMEOUT, TimeLimit",
        ),
        ("JobId=9 JobName=run JobState=CANCELLED Reason=None Dependency=(null)", "CANCELLED"),
        (
            "JobId=9 JobName=run JobState=COMPLETING Reason=NodeDown Dependency=(null)",
            "NODE_FAIL, NodeDown",
        ),
        ("JobId=9 JobName=run JobState=COMPLETING Reason=None Dependency=(null)", "COMPLETING"),
        ("slurm_load_jobs error: Invalid job id specified", None),
    ],
)
def test_a_job_slurm_ends_is_named_by_how_it_ends(line, said):
    assert slurm_scheduler.ending_state(line) == said


# slurmstepd's lines in a job's output, as the cluster on one machine
# (Slurm 22.05) wrote them on 2026-11-27; while the job's processes live,
# scontrol shows all these jobs as COMPLETING, with Reason=None for 1 and 3.
ENDS = {
    "1": "slurmstepd-vm-n0: error: *** JOB 1 ON vm-n0 CANCELLED AT 2026-11-27T16:40:18 ***",
    "2": "slurmstepd-vm-n0: error: *** JOB 2 ON vm-n0 CANCELLED AT 2026-11-27T16:41:15 DUE TO "
    "TIME LIMIT ***",
    "3": "slurmstepd-vm-n0: error: *** JOB 3 ON vm-n0 CANCELLED AT 2026-11-27T16:41:58 DUE TO "
    "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***",
}


@pytest.mark.parametrize(
    "job, said", [("1", "CANCELLED"), ("2", "TIMEOUT"), ("3", "NODE_FAIL"), ("12", None)]
)
def test_slurms_line_in_the_jobs_output_says_how_it_ended(job, said):
    text = "\n".join(["training...", *ENDS.values(), "snakemake: error"])
    assert slurm_scheduler.told_in_output(job, text) == said
    # A step's line is not the job's.
    assert slurm_scheduler.told_in_output("1", ENDS["1"].replace("JOB 1", "STEP 1.0")) is None
