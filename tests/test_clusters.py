"""What a run's job asks a cluster for, and the OAR commands' parsing and
decisions on exact-format text (the real schedulers: test_slurm, test_oar)."""

from pathlib import Path

import pytest

from ddlcompare.run import oar, runner
from front import workflow_support as ws
from ddlcompare.plan.params import RunRow

# What oarsub 2.5 prints on Grid'5000 (admission rules first).
OARSUB_OUTPUT = """\
[ADMISSION RULE] Modify resource description with type constraints
[ADMISSION RULE] Automatically add the constraint to go on the 'default' queue
[ADMISSION RULE] Set default walltime to 3600.
OAR_JOB_ID=4242123
"""


def row(**config) -> RunRow:
    base = {
        "framework": "torch-ddp",
        "nodes": 1,
        "procs_per_node": 1,
        "threads": 1,
        "device": "cpu",
        "timeout_s": 600,
        "dataset": "fashion-mnist",
        "epochs": 1,
    }
    return RunRow("id", "p", {}, 1, 0, {**base, **config})


def test_one_process_runs_inside_a_step_and_multi_process_runs_own_the_allocation():
    one = ws.job_resources(row())
    assert (one["tasks"], one["mpi"], one["nodes"], one["tasks_per_node"]) == (1, None, 1, 1)
    assert one["runtime"] == 600 // 60 + 5 and one["mem_mb"] == ws.MB_PER_PROCESS
    assert one["gres"] is None and one["gpus_per_node"] == 0
    many = ws.job_resources(row(nodes=2, procs_per_node=4, threads=2))
    assert (many["tasks"], many["mpi"], many["tasks_per_node"]) == (None, "launcher", 4)
    assert many["cpus_per_task"] == 2 and many["mem_mb"] == 4 * ws.MB_PER_PROCESS
    one_per_node = ws.job_resources(row(nodes=3))
    assert (one_per_node["tasks"], one_per_node["mpi"]) == (3, None)


def test_runs_that_cannot_share_a_node_ask_for_whole_nodes():
    """GPI-2 listens on fixed ports on each node: two Tarantella runs on one
    node fail ("Device operation error"); its jobs get whole nodes."""
    shared = ws.job_resources(row(nodes=2))
    assert shared["slurm_extra"] is None and shared["oar_resources"] is None
    whole = ws.job_resources(row(framework="tarantella", nodes=2))
    assert whole["slurm_extra"] == "--exclusive" and whole["oar_resources"] == ""
    assert oar.resource_request({**whole, "runtime": 5}) == "host=2,walltime=0:05:00"


def test_gpu_runs_ask_for_gpus_per_node():
    res = ws.job_resources(row(nodes=2, procs_per_node=4, device="gpu"))
    assert res["gres"] == "gpu:4" and res["gpus_per_node"] == 4 and res["tasks_per_gpu"] == 1
    # hybrid: the GPU processes take one GPU each, the others CPU cores
    hybrid = ws.job_resources(row(procs_per_node=3, device="hybrid", hybrid_gpus=1))
    assert (hybrid["gres"], hybrid["gpus_per_node"], hybrid["tasks_per_gpu"]) == ("gpu:1", 1, None)
    assert hybrid["tasks_per_node"] == 3


def test_oarsub_job_id_after_admission_rules():
    assert oar.parse_job_id(OARSUB_OUTPUT) == "4242123"
    with pytest.raises(oar.OarError, match="no OAR_JOB_ID"):
        oar.parse_job_id("[ERROR] Oarsub failed, please verify your request syntax.\n")


def test_resource_request_cpu_gpu_whole_hosts_and_walltime():
    assert (
        oar.resource_request({"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 3, "runtime": 95})
        == "host=2/core=6,walltime=1:35:00"
    )
    assert (
        oar.resource_request({"nodes": 2, "gpus_per_node": 4, "runtime": 30})
        == "host=2/gpu=4,walltime=0:30:00"
    )
    assert (
        oar.resource_request(
            {"nodes": 3, "oar_resources": "", "runtime": 5, "oar_walltime": "0:00:20"}
        )
        == "host=3,walltime=0:00:20"
    )
    with pytest.raises(oar.OarError, match="oar_walltime"):
        oar.walltime({"oar_walltime": "ten minutes"})


def test_submit_argv_properties_queue_logs_and_environment(tmp_path):
    props = {
        "rule": "run",
        "jobid": 7,
        "output": ["results/x/done.json"],
        "resources": {
            "nodes": 1,
            "gpus_per_node": 2,
            "runtime": 10,
            "oar_properties": "cluster='chifflot'",
            "oar_queue": "production",
        },
    }
    argv = oar.submit_argv(
        props,
        tmp_path / "job.sh",
        tmp_path / "logs",
        {"DDLC_VENV": "/v", "PATH": "/bin", "SECRET": "no"},
    )
    assert argv[:5] == ["oarsub", "-n", "ddlc.run.7", "-l", "host=1/gpu=2,walltime=0:10:00"]
    assert argv[argv.index("-p") + 1] == "cluster='chifflot'"
    assert argv[argv.index("-q") + 1] == "production"
    assert argv[argv.index("-O") + 1] == str(tmp_path / "logs" / "%jobid%.out")
    assert argv[-1] == f"env DDLC_VENV=/v PATH=/bin /bin/sh {tmp_path / 'job.sh'}"


def test_job_properties_from_a_snakemake_job_script(tmp_path):
    script = tmp_path / "snakejob.run.3.sh"
    script.write_text(
        '#!/bin/sh\n# properties = {"rule": "run", "output": '
        '["r/done.json"], "resources": {"nodes": 1}}\ncd /w && python -m x\n'
    )
    props = oar.job_properties(script)
    assert props["rule"] == "run" and oar.done_marker(props).endswith("r/done.json")
    script.write_text("#!/bin/sh\nhostname\n")
    with pytest.raises(oar.OarError, match="properties"):
        oar.job_properties(script)


@pytest.mark.parametrize(
    "job, marker_exists, expected",
    [
        ({"state": "Waiting"}, False, "running"),
        ({"state": "Running"}, False, "running"),
        ({"state": "Finishing"}, True, "running"),
        ({"state": "Terminated", "exit_code": 0}, True, "success"),
        ({"state": "Terminated", "exit_code": 0}, False, "failed"),  # no marker: not done
        ({"state": "Terminated", "exit_code": 768}, True, "failed"),  # exit 3
        ({"state": "Error", "exit_code": None}, False, "failed"),  # walltime, oardel
        (None, True, "success"),  # forgotten by OAR
        (None, False, "failed"),
    ],
)
def test_status_decision(tmp_path, job, marker_exists, expected):
    marker = tmp_path / "done.json"
    if marker_exists:
        marker.write_text("{}")
    assert oar.decide(job, str(marker)) == expected


def test_status_of_a_job_that_is_not_a_run_follows_its_exit():
    assert oar.decide({"state": "Terminated", "exit_code": 0}, None) == "success"
    assert oar.decide({"state": "Terminated", "exit_code": 256}, None) == "failed"
    assert oar.decide(None, None) == "failed"


@pytest.mark.parametrize("marker_exists", [None, False])  # None: not a run (a probe)
def test_a_running_job_on_a_lost_node_has_failed(tmp_path, marker_exists):
    """OAR would keep it until its walltime, and the workflow would wait as
    long: CI's OAR test waited 300 s on a probe whose node was lost."""
    marker = None if marker_exists is None else str(tmp_path / "done.json")
    lost = {"vm-n0": "Suspected"}
    assert oar.decide({"state": "Running"}, marker, lost) == "failed"
    assert oar.decide({"state": "Running"}, marker, {}) == "running"


def test_a_run_that_finished_on_a_node_lost_since_is_left_to_end(tmp_path):
    (tmp_path / "done.json").write_text("{}")
    lost = {"vm-n0": "Suspected"}
    assert oar.decide({"state": "Running"}, str(tmp_path / "done.json"), lost) == "running"


def test_the_marker_oar_looks_for_is_the_runners():
    assert oar.DONE_MARKER == runner.DONE


def test_cli_usage_and_bad_script_give_one_line_not_a_traceback(tmp_path, capsys):
    assert oar.main(["frobnicate"]) == 2
    script = tmp_path / "x.sh"
    script.write_text("#!/bin/sh\n")
    assert oar.main(["submit", str(script)]) == 1
    err = capsys.readouterr().err
    assert "oar submit:" in err and "Traceback" not in err


def test_profiles_name_the_commands_that_exist():
    import yaml

    repo = Path(__file__).resolve().parent.parent
    g5k = yaml.safe_load((repo / "profiles" / "grid5000" / "config.yaml").read_text())
    assert g5k["executor"] == "cluster-generic"
    for key in ("submit", "status", "cancel"):
        script = repo / "profiles" / "grid5000" / g5k[f"cluster-generic-{key}-cmd"]
        assert script.exists() and script.stat().st_mode & 0o111
    slurm = yaml.safe_load((repo / "profiles" / "slurm" / "config.yaml").read_text())
    assert slurm["executor"] == "slurm"
