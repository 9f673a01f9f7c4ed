"""The cluster on one machine with cores of its own per node
(`./ddlc cluster up --cores-per-node 1`): every job a node runs, through
Slurm and through OAR, may use that node's core and no other. A cluster of
its own, after test_cluster's (a cluster of any size after another)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddlcompare.run import cluster, cores
from runfiles import ownership
from test_cluster import DDLC, _namespaces_allowed
from test_oar import OarUser

AFFINITY = 'echo "$(hostname) $(grep Cpus_allowed_list /proc/self/status | cut -f2)"'


@pytest.fixture(scope="module")
def one_core_nodes(schedulers_alone):
    if why := _namespaces_allowed():
        pytest.skip(why)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two one-core nodes need two cores")
    if cluster.live_record():  # one left by a killed session: up clears it
        pytest.skip(f"a cluster is already up ({cluster.RECORD}); the tests start their own")
    argv = [DDLC, "cluster", "up", "--nodes", "2", "--cores-per-node", "1"]
    up = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    record = cluster.status()
    yield record
    down = subprocess.run([DDLC, "cluster", "down"], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_node_with_its_own_core_runs_every_job_on_it(one_core_nodes, tmp_path):
    record = one_core_nodes
    own = {n["hostname"]: n["cpus"] for n in record["nodes"]}
    assert sorted(own.values()) == ["0", "1"], own
    status = subprocess.run([DDLC, "cluster", "status"], capture_output=True, text=True)
    assert all(f"cores {cpus}" in status.stdout for cpus in own.values()), status.stdout

    # Slurm: one task on each node, and Slurm knows each node has one CPU.
    env = {**cluster.client_env(), "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run(
        ["srun", "-N2", "-n2", "--mem=50", "sh", "-c", AFFINITY],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert dict(line.split() for line in out.stdout.splitlines()) == own, out.stdout
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %c"], capture_output=True, text=True, env=env
    ).stdout
    assert {tuple(line.split()) for line in nodes.splitlines()} == {(h, "1") for h in own}

    # OAR: a job on each node, as OAR's user, once OAR holds both nodes Alive.
    deadline = time.monotonic() + 120
    while set(cluster._oarnodes().values()) != {"Alive"} and time.monotonic() < deadline:
        time.sleep(1)
    user = OarUser(cluster._oar_user(record["nodes"]))
    workdir = user.workdir("cores")
    user.env["PWD"] = str(workdir)  # oarsub takes its job's folder from it
    for host in own:
        out = user.run(
            ["oarsub", "-p", f"host='{host}'", "-l", "core=1,walltime=0:05:00",
             "-O", f"{host}.out", "-E", f"{host}.err", AFFINITY],
            workdir,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
        (workdir / f"{h}.out").exists() and (workdir / f"{h}.out").read_text() for h in own
    ):
        time.sleep(1)
    seen = dict((workdir / f"{h}.out").read_text().split() for h in own)
    assert seen == own, seen
    assert cores.cpu_list(",".join(own.values())) == [0, 1]


@pytest.mark.slow
@pytest.mark.schedulers
def test_a_cluster_killed_under_a_running_job_comes_up_again(one_core_nodes):
    """A session killed between up and down, with an OAR job running (every
    process of the cluster that carries its mark or has a PID file
    SIGKILLed, PostgreSQL and the OAR server among them; the job's oarexec,
    started by OAR's sshd in a fresh environment, lives on): `cluster up`
    refused as if a cluster were up; with the record cleared, OAR's
    database still held the job, and the next up's oardel of it waited on
    the gone server's job (some 70 s more here, quiet; past the 90 s the
    first job is given, loaded). Now status says the cluster is abandoned
    and the next up ends the orphaned job, starts OAR's database afresh
    and runs its first job."""
    record = cluster.live_record()
    assert record is not None and record["mark"] == one_core_nodes["mark"]
    user = OarUser(cluster._oar_user(record["nodes"]))
    workdir = user.workdir("killed")
    user.env["PWD"] = str(workdir)
    out = user.run(["oarsub", "-l", "core=1,walltime=0:10:00", "sleep 600"], workdir)
    assert out.returncode == 0, out.stdout + out.stderr
    job = re.search(r"OAR_JOB_ID=(\d+)", out.stdout).group(1)
    deadline = time.monotonic() + 60
    while not _oarexecs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _oarexecs(), "the job did not start in 60 s"
    pidfiles = [
        *(cluster.STATE / "run").glob("*.pid"),
        *(cluster.STATE / "oar" / "run").glob("*.pid"),
    ]
    killed = cluster._marked(record["mark"])
    for pidfile in pidfiles:
        with contextlib.suppress(psutil.Error, ValueError):
            killed.append(psutil.Process(int(pidfile.read_text().split()[0])))
    for process in killed:
        with contextlib.suppress(psutil.Error):
            process.kill()
    ownership.wait_ended(killed, 30)
    assert cluster.live_record() is None and cluster.RECORD.exists()
    status = subprocess.run([DDLC, "cluster", "status"], capture_output=True, text=True)
    assert "abandoned: none of its processes runs" in status.stdout, status.stdout
    oar_log = cluster.STATE / "log" / "oar.sh.log"
    before = oar_log.stat().st_size
    argv = [DDLC, "cluster", "up", "--nodes", "2", "--cores-per-node", "1"]
    up = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert up.returncode == 0, up.stderr[-3000:]
    assert f"the cluster started {record['started']} is gone" in up.stderr, up.stderr[-3000:]
    said = oar_log.read_bytes()[before:].decode()
    assert re.search(rf"starting OAR's database afresh: jobs [\d ]*\b{job}\b", said), said
    # The killed server's job is gone, not ended by oardel and kept: OAR
    # waited on it, past the 90 s the first job is given on a loaded machine.
    left = user.run(["oarstat", "-f", "-J", "-j", job], workdir)
    assert "sleep 600" not in left.stdout, left.stdout
    assert not _oarexecs(), "the killed server's job still runs"
    again = cluster.live_record()
    assert again is not None and again["mark"] != record["mark"]
    assert all(cluster.daemons().values()), cluster.daemons()


def _oarexecs() -> list[psutil.Process]:
    """OAR's job executors running on this machine (one a running job)."""
    return [
        p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == ["OAREXEC"]
    ]


def test_cores_per_node_is_checked_against_this_machine():
    usable = len(os.sched_getaffinity(0))
    for nodes, per_node in [(usable + 1, 1), (2, 0), (2, usable)]:
        if nodes * per_node <= usable and per_node >= 1:
            continue
        with pytest.raises(cluster.ClusterError, match=f"--cores-per-node {per_node}: "):
            cluster.own_cores(nodes, per_node)
    assert cluster.own_cores(2, None) is None
    out = subprocess.run(
        [sys.executable, "-m", "ddlcompare.run.cluster", "up", "--cores-per-node", "0"],
        capture_output=True, text=True, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert out.returncode == 1 and out.stderr.startswith("cluster up: --cores-per-node 0: ")
