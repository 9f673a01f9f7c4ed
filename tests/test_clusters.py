"""What a run's job asks a cluster for, and how the OAR executor plugin
(plugins/snakemake-executor-plugin-oar) maps it to oarsub and reads OAR's
answers, on exact-format text (the real schedulers: test_slurm, test_oar)."""

import ast
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from snakemake_executor_plugin_oar import oar
from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

from conftest import REPO, write_design
from ddlcompare.plan import design as design_mod
from ddlcompare.run.schedulers import oar as oar_record
from runfiles import names
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
    assert oar.resource_request({"gpu": 1}) == "host=1/gpu=1,walltime=1:00:00"
    assert (
        oar.resource_request(
            {"nodes": 3, "oar_resources": "", "runtime": 5, "oar_walltime": "0:00:20"}
        )
        == "host=3,walltime=0:00:20"
    )
    # Neither tasks nor GPUs: the job's threads, and the default walltime.
    assert (
        oar.resource_request({}, threads=4, default_minutes=90) == "host=1/core=4,walltime=1:30:00"
    )
    with pytest.raises(oar.OarError, match="oar_walltime"):
        oar.walltime({"oar_walltime": "ten minutes"}, 60)
    with pytest.raises(oar.OarError, match="resource nodes: 'two'"):
        oar.resource_request({"nodes": "two"})
    with pytest.raises(oar.OarError, match="resource runtime"):
        oar.walltime({"runtime": 0}, 60)


def test_submit_argv_properties_queue_types_logs_and_environment():
    resources = {
        "nodes": 1,
        "gpus_per_node": 2,
        "runtime": 10,
        "oar_properties": "cluster='chifflot'",
        "oar_queue": "production",
        "oar_project": "lab",
        "oar_types": "exotic, night",
    }
    env = oar.passed_env({"DDLC_VENV": "/v", "PATH": "/bin", "SECRET": "no"}, "PATH, DDLC_*")
    argv = oar.submit_argv("snakemake.run.7", resources, "/w/job 7.sh", "/w/logs/%jobid%", env)
    assert argv[:5] == ["oarsub", "-n", "snakemake.run.7", "-l", "host=1/gpu=2,walltime=0:10:00"]
    assert argv[argv.index("-p") + 1] == "cluster='chifflot'"
    assert argv[argv.index("-q") + 1] == "production"
    assert argv[argv.index("--project") + 1] == "lab"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-t"] == ["exotic", "night"]
    assert argv[argv.index("-O") + 1] == "/w/logs/%jobid%.out"
    assert argv[argv.index("-E") + 1] == "/w/logs/%jobid%.err"
    assert argv[-1] == "env DDLC_VENV=/v PATH=/bin /bin/sh '/w/job 7.sh'"


def test_one_oarstat_for_a_batch_and_its_json_read():
    assert oar.status_argv(["3", "4"]) == ["oarstat", "-f", "-J", "-j", "3", "-j", "4"]
    assert oar.parse_jobs("") == {}  # OAR knows none of them
    answer = json.dumps({"3": {"state": "Running"}, "4": {"state": "Terminated", "exit_code": 0}})
    assert oar.parse_jobs(answer)["4"]["state"] == "Terminated"
    with pytest.raises(oar.OarError, match="not JSON"):
        oar.parse_jobs("DBI connect failed")


def test_lost_nodes_from_oarnodes():
    answer = json.dumps(
        {"n1": {"1": "Alive", "2": "Alive"}, "n2": {"3": "Suspected", "4": "Suspected"}}
    )
    assert oar.lost_nodes(answer) == {"n2": "Suspected"}
    assert oar.lost_nodes("not json") == {}


@pytest.mark.parametrize(
    "job, outputs_exist, expected",
    [
        ({"state": "Waiting"}, False, "running"),
        ({"state": "Running"}, False, "running"),
        ({"state": "Finishing"}, True, "running"),
        ({"state": "Terminated", "exit_code": 0}, True, "success"),
        ({"state": "Terminated", "exit_code": 768}, True, "failed"),  # exit 3
        ({"state": "Error", "exit_code": None}, False, "failed"),  # walltime, oardel
        (None, True, "success"),  # unknown to OAR: its outputs decide
        (None, False, "failed"),
    ],
)
def test_verdict(job, outputs_exist, expected):
    assert oar.verdict(job, outputs_exist) == expected


def test_a_running_job_on_a_lost_node_is_judged_by_its_outputs():
    """OAR would keep it until its walltime, and the workflow would wait as
    long: CI's OAR test waited 300 s on a probe whose node was lost."""
    lost = {"vm-n0": "Suspected"}
    assert oar.verdict({"state": "Running"}, False, lost) == "failed"
    assert oar.verdict({"state": "Running"}, False, {}) == "running"
    # finished before its node was lost: OAR would keep the job to its walltime
    assert oar.verdict({"state": "Running"}, True, lost) == "success"


def test_a_job_finishing_on_a_lost_node_is_worth_telling_also_when_its_outputs_exist():
    """A run that failed as a node under it was lost has written its outputs;
    OAR's job, still finishing, is judged a success by them. CI's cluster
    test saw the run's record without OAR's words when finaud suspected the
    node before the job's end was seen."""
    finishing, lost = {"state": "Finishing"}, {"vm-n2": "Suspected"}
    said = oar.verdict(finishing, True, lost)
    assert said == "success" and oar.worth_telling(said, finishing, lost)
    assert not oar.worth_telling("success", {"state": "Terminated", "exit_code": 0}, {})
    assert oar.worth_telling("failed", None)
    walltime = {"state": "Error", "events": [{"type": "WALLTIME", "description": "10 s"}]}
    assert oar.worth_telling("success", walltime)


def test_oars_words_give_state_lost_nodes_and_causes_not_mechanics():
    job = {
        "state": "Error",
        "exit_code": None,
        "events": [
            {"type": "WALLTIME", "description": "[sarko] Job [7] from 1 with 10 s"},
            {"type": "SEND_KILL_JOB", "description": "kill"},
        ],
    }
    said = oar.words("7", job, {"n2": "Suspected"})
    assert (
        said == "OAR job 7: Error, node n2 Suspected, WALLTIME ([sarko] Job [7] from 1 with 10 s)"
    )
    assert oar.words("8", None) == "OAR job 8: no longer known to OAR"


def test_a_jobs_log_folder_is_one_level_per_rule_and_wildcards():
    assert (
        oar.log_name("run", {"path": "torch-ddp/epochs~500"})
        == "rule_run/path-torch-ddp_epochs-500"
    )
    assert oar.log_name("collect", {}) == "rule_collect"
    # oarsub refuses other characters in a log path (OAR::IO): made '-'.
    assert oar.log_name("run", {"p": "a=b~c:d"}) == "rule_run/p-a-b-c-d"
    oar.check_log_dir("/home/alice/w 1/.snakemake/oar_logs")
    with pytest.raises(oar.OarError, match="--oar-logdir"):
        oar.check_log_dir("/home/alice/run~1/.snakemake/oar_logs")


def test_the_plugin_imports_nothing_of_the_project():
    """A package of its own, for any Snakemake user: Snakemake's interfaces only."""
    ours = {"runfiles", "frameworks", "traces", "ddlcompare", "analysis", "front"}
    for path in (REPO / "plugins" / "snakemake-executor-plugin-oar").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import) else
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            )  # fmt: skip
            assert not {n.split(".")[0] for n in names} & ours, (path, names)


# ---- the job end command (profiles/grid5000/job-end) -----------------------------------


def test_a_run_killed_by_oar_is_recorded_interrupted_and_released(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / names.RUN_RECORD).write_text(json.dumps({"status": "running"}))
    (run / names.OWNER).write_text("{}")
    (run / "rank0.json").write_text(json.dumps({"rank": 0, "hostname": "n1"}))
    (run / "rank1.json").write_text('{"rank": 1, "host')  # cut short by the kill
    said = "OAR job 7: Error, WALLTIME (...)"
    assert oar_record.main(["7", "failed", said, str(run / names.DONE)]) == 0
    record = json.loads((run / names.RUN_RECORD).read_text())
    assert record["status"] == "interrupted" and f"stopped by OAR ({said})" in record["reason"]
    assert not (run / names.OWNER).exists()
    assert record["ranks"] == [{"rank": 0, "hostname": "n1"}]


def test_a_failed_job_leaves_another_jobs_attempt_alone(tmp_path):
    """A workflow started again while its earlier job still ran: the new
    job's runner found the folder busy and failed. Its job end command
    leaves the earlier job's attempt running and owning its folder (it was
    recorded interrupted and released, and stopped as it lost its folder);
    the job's own attempt is recorded as before."""
    run = tmp_path / "r"
    run.mkdir()
    running = {"status": "running", "job": oar_record.Oar().job_id({"OAR_JOB_ID": "7"})}
    (run / names.RUN_RECORD).write_text(json.dumps(running))
    (run / names.OWNER).write_text("{}")
    assert oar_record.main(["8", "failed", "OAR job 8: Error", str(run / names.DONE)]) == 0
    assert json.loads((run / names.RUN_RECORD).read_text()) == running
    assert (run / names.OWNER).exists()
    assert oar_record.main(["7", "failed", "OAR job 7: Error", str(run / names.DONE)]) == 0
    assert json.loads((run / names.RUN_RECORD).read_text())["status"] == "interrupted"
    assert not (run / names.OWNER).exists()


def test_a_run_that_failed_under_a_lost_node_gets_oars_words_beside_its_own(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    for name in (names.DONE, names.RUN_RECORD):
        (run / name).write_text(json.dumps({"status": "failed", "reason": "rank 1 died"}))
    said = "OAR job 9: Terminated, exit code 0, node n2 Suspected"
    assert oar_record.main(["9", "success", said, str(run / names.DONE)]) == 0
    for name in (names.DONE, names.RUN_RECORD):
        assert json.loads((run / name).read_text())["reason"] == f"rank 1 died; {said}"
    # Not a run's job: nothing to record, nothing written.
    assert oar_record.main(["10", "failed", said, str(tmp_path / "tables.tsv")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


@pytest.mark.parametrize("verdict", ["failed", "success"])
def test_job_end_leaves_records_that_are_not_records_alone(tmp_path, verdict):
    """run.json and done.json that are not JSON objects (a list, a string):
    the job end command changes nothing and ends well, no traceback."""
    run = tmp_path / "r"
    run.mkdir()
    (run / names.RUN_RECORD).write_text("[1, 2]")
    if verdict == "success":
        (run / names.DONE).write_text('"failed"')
    before = {p.name: p.read_text() for p in run.iterdir()}
    assert oar_record.main(["7", verdict, "OAR job 7: Error", str(run / names.DONE)]) == 0
    assert {p.name: p.read_text() for p in run.iterdir()} == before


def test_job_end_usage_is_one_line_not_a_traceback(capsys):
    assert oar_record.main(["7", "maybe", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:") and "Traceback" not in err


def test_the_grid5000_profile_runs_the_oar_plugin_and_its_job_end_command():
    import yaml

    g5k = yaml.safe_load((REPO / "profiles" / "grid5000" / "config.yaml").read_text())
    assert g5k["executor"] == "oar"
    script = REPO / "profiles" / "grid5000" / g5k["oar-job-end-command"]
    assert script.exists() and script.stat().st_mode & 0o111
    slurm = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert slurm["executor"] == "slurm"


def test_a_long_log_folder_name_is_cut_and_kept_unique():
    long_a, long_b = ("x" * 300 + "a"), ("x" * 300 + "b")
    a, b = (oar.log_name("run", {"path": p}).split("/")[1] for p in (long_a, long_b))
    assert len(a) == oar.MAX_NAME and a != b


def test_a_users_slurm_extra_reaches_runs_beside_their_own():
    """--default-resources "slurm_extra='--no-requeue'" (docs/clusters.md): a
    rule's own slurm_extra replaces the default's in Snakemake, so the run
    rule joins them; Tarantella's whole nodes keep --exclusive."""
    from snakemake.resources import Resources

    def users(*exprs: str):
        return ws.users_slurm_extra(Resources.parse(list(exprs), allow_expressions=True))

    given = users("slurm_extra='--no-requeue --mail-type=END'", "mem_mb=1000")
    assert given == "--no-requeue --mail-type=END"
    assert ws.slurm_extra(row(framework="tarantella"), given) == f"--exclusive {given}"
    assert ws.slurm_extra(row(), given) == given
    assert ws.slurm_extra(row(framework="tarantella"), users("mem_mb=1000")) == "--exclusive"
    assert ws.slurm_extra(row(), users()) is None and ws.users_slurm_extra(None) is None


def test_a_slurm_extra_that_is_not_one_string_is_one_line(capsys):
    from snakemake.resources import Resources

    with pytest.raises(SystemExit):
        ws.users_slurm_extra(Resources.parse(["slurm_extra=2"], allow_expressions=True))
    err = capsys.readouterr().err
    assert err.startswith("error: --default-resources slurm_extra=2: give") and "\n" == err[-1]


def test_this_machines_cores_are_warned_of_only_where_the_jobs_run_on_it(tmp_path, capsys):
    """Runs of 4 x cores threads: the local executor's jobs share this
    machine, a cluster's run on its nodes. Snakemake names its executor only
    after parsing; so the workflow's parse says nothing of cores (a dry run
    through the Slurm profile here), its onstart says it for the local one."""
    threads = 4 * (os.cpu_count() or 1)
    doc = {
        "factors": {"framework": ["torch-ddp"], "batch_size": [32]},
        "fixed": {"threads": threads},
    }
    path = write_design(tmp_path, doc)
    design = design_mod.load(str(path))
    plugins = ExecutorPluginRegistry()
    for executor, warned in (("local", True), ("slurm", False), ("oar", False)):
        workflow = SimpleNamespace(executor_plugin=plugins.get_plugin(executor))
        ws.warn_of_shared_cores(str(path), design, workflow)
        said = capsys.readouterr().err
        assert (f"start {threads} processes x threads" in said) == warned, (executor, said)
    snakemake = [sys.executable, "-m", "snakemake", "--profile", "slurm", "-n", "-d", str(tmp_path)]
    planned = subprocess.run(
        [*snakemake, "--config", f"design={path}"], cwd=REPO, capture_output=True, text=True
    )
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "processes x threads" not in planned.stderr and "run " in planned.stdout, planned.stdout
