"""Host lists from scheduler environments, and the launch commands built
from them: argument lists, never shell strings."""

import textwrap
from pathlib import Path

import pytest

from conftest import mpirun_per_node, srun_per_node

from ddlcompare.run import launch, schedulers
from ddlcompare.run.launchers.tf_workers import tf_worker_addresses
from ddlcompare.run.schedulers import Host, oar, slurm

CONFIG = {"threads": 1, "run_id": "abc123", "horovod_controller": "gloo", "framework": "torch-ddp"}
RUN = Path("/r/run")


def on_two_nodes(launcher: str, scheduler: str, per_node: int = 2, **config):
    """The launcher's command line and environment for two nodes, n1 and
    n2, of ``per_node`` processes each."""
    hosts = [Host("n1", per_node), Host("n2", per_node)]
    return launch.command(launcher, hosts, {**CONFIG, **config}, RUN, scheduler)


def detect(nodes, per_node, env):
    scheduler, found = schedulers.detect(nodes, per_node, env=env)
    return scheduler.name, found


def test_local_is_one_host_with_every_process():
    assert detect(1, 2, {}) == ("local", [Host("localhost", 2)])


def test_oar_nodefile_one_line_per_core():
    text = "\n".join(["n-1.site"] * 4 + ["n-2.site"] * 4) + "\n"
    assert oar.distinct_hosts(text) == ["n-1.site", "n-2.site"]


def test_oar_environment(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\na\nb\nb\n")
    assert detect(2, 3, {"OAR_NODEFILE": str(nodefile)}) == ("oar", [Host("a", 3), Host("b", 3)])


def test_slurm_nodelist_expansion():
    assert slurm.expand("gpu[01-03,07],login5") == ["gpu01", "gpu02", "gpu03", "gpu07", "login5"]


def test_slurm_bad_nodelist_is_named():
    with pytest.raises(schedulers.SchedulerError, match="n\\[1-"):
        slurm.expand("n[1-")


def test_allocation_smaller_than_design_is_an_error():
    with pytest.raises(schedulers.SchedulerError, match="nodes=3"):
        schedulers.detect(3, 1, env={"SLURM_JOB_NODELIST": "n[1-2]"})


def test_a_new_scheduler_is_one_file(tmp_path, monkeypatch):
    """A scheduler module dropped into the package is detected (before the
    fallback, local) and drives the launchers, with no other change."""
    module = Path(schedulers.__file__).parent / "dummy_for_test.py"
    module.write_text(
        textwrap.dedent("""
        from ddlcompare.run.schedulers import Scheduler, register

        @register
        class Dummy(Scheduler):
            name = "dummy_for_test"
            rsh_agent = "dummysh"

            @staticmethod
            def detected(env):
                return "DUMMY_NODES" in env

            def host_names(self, env):
                return env["DUMMY_NODES"].split(",")
        """)
    )
    try:
        scheduler, found = schedulers.detect(2, 1, env={"DUMMY_NODES": "x,y"})
        assert scheduler.name == "dummy_for_test" and found == [Host("x", 1), Host("y", 1)]
        argv, _ = launch.command("torchrun", found, CONFIG, RUN, scheduler)
        assert argv[:8] == mpirun_per_node("x,y", "dummysh")
    finally:
        module.unlink()
        schedulers.REGISTRY.forget("dummy_for_test")


def test_torchrun_single_node():
    argv, env = launch.command("torchrun", [Host("localhost", 2)], CONFIG, RUN, "local")
    assert argv[1:] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=2",
        "-m",
        "frameworks.worker",
        "/r/run",
    ]
    assert env["OMP_NUM_THREADS"] == "1"


def test_torchrun_multi_node_under_slurm():
    argv, _ = on_two_nodes("torchrun", "slurm", per_node=4)
    assert argv[0] == "env"  # without a one-task step's own size (schedulers/slurm.py)
    argv = argv[argv.index("srun") :]
    assert argv[:6] == srun_per_node(["n1", "n2"])
    assert (
        f"--rdzv_endpoint=n1:{launch.run_port(29500, CONFIG)}" in argv
        and "--nproc_per_node=4" in argv
    )


def test_torchrun_multi_node_under_oar_uses_oarsh():
    argv, _ = on_two_nodes("torchrun", "oar")
    assert argv[:8] == mpirun_per_node("n1,n2", "oarsh")


def test_horovodrun_hosts_and_controller():
    argv, _ = on_two_nodes("horovodrun", "slurm", horovod_controller="mpi")
    assert argv[1:6] == ["-np", "4", "-H", "n1:2,n2:2", "--mpi"]
    assert argv[-3:] == ["-m", "frameworks.worker", "/r/run"]


def test_horovodrun_gloo_under_oar_reaches_nodes_with_oarsh():
    argv, env = on_two_nodes("horovodrun", "oar")
    assert argv[5] == "--gloo"
    shim = Path(env["PATH"].split(":")[0]) / "ssh"
    assert "exec oarsh" in shim.read_text() and shim.stat().st_mode & 0o111


def test_tf_worker_addresses_one_per_process_in_rank_order():
    assert tf_worker_addresses([Host("n1", 2), Host("n2", 1)], port=7000) == [
        "n1:7000",
        "n1:7001",
        "n2:7000",
    ]
