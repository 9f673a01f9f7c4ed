"""Launch generation for the TensorFlow family, Tarantella and LBANN, and
the per-node spawner that gives each MultiWorkerMirroredStrategy worker its
own TF_CONFIG (real processes)."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, mpirun_per_node, tiny_design
from ddlcompare.plan import design
from ddlcompare.plan import envs
from ddlcompare.run import launch, preflight, runner, schedulers, spawn
from ddlcompare.run.launchers import tarantella as tarantella_launcher
from ddlcompare.run.schedulers import Host

CONFIG = {
    "threads": 1,
    "run_id": "abc123",
    "horovod_controller": "gloo",
    "device": "cpu",
    "nodes": 1,
    "procs_per_node": 2,
}
RUN = Path("/r/run")


def tf_workers(hosts, scheduler):
    return launch.command("tf-workers", hosts, {**CONFIG, "framework": "tf-mwms"}, RUN, scheduler)


def test_tf_workers_locally_one_spawner_on_free_ports():
    argv, env = tf_workers([Host("localhost", 2)], "local")
    assert argv[0] == str(envs.python_for("tensorflow"))
    assert argv[1:5] == ["-m", "ddlcompare.run.spawn", "--per-node", "2"]
    workers = argv[argv.index("--workers") + 1].split(",")
    assert len(workers) == 2 and all(w.startswith("localhost:") for w in workers)
    assert len(set(workers)) == 2
    assert argv[argv.index("--") + 1 :] == [
        str(envs.python_for("tensorflow")),
        "-m",
        "frameworks.worker",
        "/r/run",
    ]
    assert env["OMP_NUM_THREADS"] == "1"


def test_tf_workers_under_slurm_one_spawner_per_node():
    argv, _ = tf_workers([Host("n1", 2), Host("n2", 2)], "slurm")
    assert "srun" in argv and "--ntasks-per-node=1" in argv and "--nodelist=n1,n2" in argv
    assert argv[argv.index("--workers") + 1] == "n1:23456,n1:23457,n2:23456,n2:23457"


def test_tf_workers_under_oar_through_oarsh():
    argv, _ = tf_workers([Host("n1", 1), Host("n2", 1)], "oar")
    assert argv[:8] == mpirun_per_node("n1,n2", "oarsh")
    assert argv[argv.index("--workers") + 1] == "n1:23456,n2:23456"


def test_spawner_gives_each_process_its_place_in_the_cluster():
    workers = ["a:1", "a:2", "b:1", "b:2"]
    first = spawn.process_envs(workers, 2, {"SLURM_PROCID": "1"})
    assert [json.loads(e["TF_CONFIG"]) for e in first] == [
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}} for i in (2, 3)
    ]
    assert [e["DDLC_LOCAL_RANK"] for e in first] == ["0", "1"]
    assert spawn.node_index({"OMPI_COMM_WORLD_RANK": "1"}) == 1
    assert spawn.node_index({}) == 0
    with pytest.raises(SystemExit, match="beyond the 4 workers"):
        spawn.process_envs(workers, 2, {"SLURM_PROCID": "2"})


def run_spawner(*command, timeout=60):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlcompare.run.spawn",
            "--per-node",
            "2",
            "--workers",
            "localhost:1,localhost:2",
            "--",
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_spawner_starts_every_local_process(tmp_path):
    done = run_spawner(
        sys.executable,
        "-c",
        "import json, os, sys; "
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
        "open(os.path.join(sys.argv[1], str(index)), 'w').write("
        "os.environ['DDLC_LOCAL_RANK'])",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"0": "0", "1": "1"}


def test_spawner_stops_the_others_when_one_fails():
    """A failed worker must not leave its peer waiting in a collective."""
    start = time.monotonic()
    done = run_spawner(
        sys.executable,
        "-c",
        "import os, sys, time; "
        "sys.exit(3) if os.environ['DDLC_LOCAL_RANK'] == '1' else time.sleep(120)",
    )
    assert done.returncode == 3
    assert time.monotonic() - start < 30


@pytest.fixture
def tarantella_env(tmp_path, monkeypatch):
    """An environment folder with a tarantella executable: what the launcher
    checks before it builds the command (Tarantella itself cannot run here)."""
    (tmp_path / "bin").mkdir()
    for name in ("python", "tarantella"):
        (tmp_path / "bin" / name).write_text("")
    monkeypatch.setenv("DDLC_VENV_TARANTELLA", str(tmp_path))
    return tmp_path / "bin"


def tarantella(hosts, scheduler, run_dir=RUN, **config):
    return launch.command(
        "tarantella", hosts, {**CONFIG, "framework": "tarantella", **config}, run_dir, scheduler
    )


def test_tarantella_on_one_node(tarantella_env):
    argv, env = tarantella([Host("localhost", 2)], "local")
    # In the run's folder: Tarantella writes its machine file where it starts.
    assert argv[:4] == ["sh", "-c", 'cd "$0" && exec "$@"', "/r/run"]
    assert env["PYTHONPATH"].split(":")[0] == str(REPO)
    argv = argv[4:]
    assert argv[:2] == ["flock", str(tarantella_launcher.GPI2_LOCK)]  # GPI-2's fixed ports: one job
    argv = argv[2:]
    assert argv[:4] == [str(tarantella_env / "tarantella"), "-n", "2", "--no-gpu"]
    assert argv[4] == "-x" and "OMP_NUM_THREADS=1" in argv[5 : argv.index("--")]
    # each rank under its guard, which starts the worker (rank_guard.py)
    assert argv[argv.index("--") :] == ["--", "-m", "ddlcompare.run.rank_guard", "/r/run"]
    # gaspi_run's ssh to this host runs here; then its ranks run this env's python
    assert env["PATH"].startswith(f"{launch.LOCAL_SSH}:{tarantella_env}:")


def test_tarantella_hostfile_from_the_scheduler_nodes(tarantella_env, tmp_path):
    argv, env = tarantella([Host("n1", 4), Host("n2", 4)], "slurm", run_dir=tmp_path, device="gpu")
    argv = argv[4:]
    assert argv[1:5] == ["--hostfile", str(tmp_path / "hostfile"), "--n-per-node", "4"]
    assert "--no-gpu" not in argv
    assert (tmp_path / "hostfile").read_text() == "n1\nn2\n"
    assert str(launch.LOCAL_SSH) not in env["PATH"]  # other nodes: the scheduler's ssh
    assert env["PATH"].startswith(str(schedulers.get("slurm").ssh_dir))  # srun_as_ssh


def test_missing_tarantella_inside_a_worker_names_the_environment():
    from frameworks.adapters import tarantella as adapter
    from frameworks.common import RunError

    with pytest.raises(RunError, match="envs/tarantella.md"):
        adapter.import_tarantella()


def test_preflight_points_cluster_frameworks_to_their_build_notes(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLC_VENV_TARANTELLA", str(tmp_path / "a"))
    monkeypatch.setenv("DDLC_VENV_LBANN", str(tmp_path / "b"))
    found = preflight.problems(design.parse(tiny_design(["tarantella", "lbann"]), "t.yaml"))
    assert any("tarantella" in p and "bash envs/setup.sh tarantella" in p for p in found)
    assert any(
        "lbann" in p and "bash envs/build-lbann.sh" in p and "DDLC_VENV_LBANN" in p for p in found
    )


def test_lbann_driver_is_one_process_here(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    monkeypatch.setenv("DDLC_VENV_LBANN", str(tmp_path))
    argv, _ = launch.command(
        "lbann-driver",
        [Host("n1", 2), Host("n2", 2)],
        {**CONFIG, "framework": "lbann"},
        RUN,
        "slurm",
    )
    assert argv == [str(tmp_path / "bin" / "python"), "-m", "frameworks.worker", "/r/run"]


@pytest.mark.parametrize(
    "framework, variable, fix",
    [
        ("tarantella", "DDLC_VENV_TARANTELLA", "bash envs/setup.sh tarantella"),  # minutes
        ("lbann", "DDLC_VENV_LBANN", "bash envs/build-lbann.sh"),  # its own build script
    ],
)
def test_a_missing_framework_is_a_failed_run_naming_its_build(
    tmp_path, monkeypatch, framework, variable, fix
):
    """Not dropped: the run is recorded as failed, with the command that
    builds the framework (the report lists failed runs with their reasons)."""
    monkeypatch.setenv(variable, str(tmp_path / "nowhere"))
    row = design.parse(tiny_design([framework]), "tiny.yaml").runs()[0]
    assert runner.execute(row, tmp_path) == 0
    done = json.loads((tmp_path / row.path / "done.json").read_text())
    assert done["status"] == "failed"
    assert f"framework {framework}: its environment '{framework}' is not built" in done["reason"]
    assert fix in done["reason"]


def test_report_tells_frameworks_left_out_installed_or_not_with_their_build_command(
    tmp_path, monkeypatch
):
    """A framework not in the design is never dropped silently; one
    not installed here is named with the command that builds it."""
    import html
    from types import SimpleNamespace

    from analysis import provenance
    from frameworks import registry

    for env in ("LBANN", "TARANTELLA", "TENSORFLOW"):
        monkeypatch.setenv(f"DDLC_VENV_{env}", str(tmp_path / "nowhere"))
    plan = design.parse(tiny_design(["torch-ddp"]), "t.yaml")
    section = provenance.frameworks_section(SimpleNamespace(design=plan)).html()
    left_out = section.split("<h3>Frameworks not in this design</h3>")[1]
    rows = {  # the cells' text, unescaped
        name: (installed, html.unescape(how))
        for name, installed, how in re.findall(
            r"<tr>\s*<td>(.*?)</td>\s*<td>(.*?)</td>\s*<td>(.*?)</td>", left_out
        )
    }
    assert set(rows) == set(registry.FRAMEWORKS) - {"torch-ddp"}
    assert rows["horovod-torch"] == ("yes", "add it to the design")  # this checkout's .venv
    assert rows["horovod-keras"] == (
        "no",
        "add it to the design: ./ddlc run sets it up; "
        "or run 'bash envs/setup.sh tensorflow' (envs/tensorflow.txt)",
    )
    assert rows["tarantella"] == (
        "no",
        "add it to the design: ./ddlc run sets it up; "
        "or run 'bash envs/setup.sh tarantella' (envs/build-tarantella.sh, minutes)",
    )
    installed, how = rows["lbann"]  # hours to build: never by set-up
    assert installed == "no" and how.startswith("build it with 'bash envs/build-lbann.sh'")
    assert how.endswith("; then add it to the design")


def test_tarantella_on_the_emulated_network_reaches_nodes_with_the_netns_ssh(
    tarantella_env, tmp_path
):
    from ddlcompare.run import netem

    argv, env = tarantella(
        [Host("10.213.0.1", 1), Host("10.213.0.2", 1)], "netns", run_dir=tmp_path
    )
    assert argv[0] != "flock"  # the lock is for runs sharing one machine's ports
    assert env["PATH"].startswith(f"{netem.NETNS_SSH.parent}:")
    assert (tmp_path / "hostfile").read_text() == "10.213.0.1\n10.213.0.2\n"
