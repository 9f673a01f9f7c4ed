"""The emulated slow network: nodes as network namespaces of this machine,
joined by a bridge, each link limited by tc. Real namespaces, real links,
real traffic and real training runs; they need root (CAP_NET_ADMIN and
CAP_SYS_ADMIN) and iproute2, and are skipped with the reason without them."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from analysis import collect
from conftest import REPO, TINY_FIXED, mpirun_per_node
from ddlcompare.plan import design
from ddlcompare.run import cores, launch, netem, preflight, runner, schedulers
from ddlcompare.run.schedulers import Host
from runfiles.names import DONE, NETWORK, RUN_RECORD
from frameworks import data, models

CANNOT = netem.problems("local")
needs_netns = pytest.mark.skipif(bool(CANNOT), reason="; ".join(CANNOT))
CONFIG = {
    "run_id": "abcdef012345",
    "nodes": 2,
    "procs_per_node": 1,
    "net_rate_mbit": 100,
    "net_delay_ms": 0,
}
PARAM_BYTES = 4 * sum(
    r["params"]
    for r in models.layer_shapes(models.MODELS["cnn"], data.DATASETS["fashion-mnist"].shape, 10)
)


def ours(tag: str) -> list[str]:
    """Namespaces and /etc/netns folders whose names carry ``tag``, but for
    those of a live process outside this test's tree: another checkout's
    suite beside this one gives its runs the same ids (the same designs),
    and its networks are its own to remove."""
    return [name for name in carrying(tag) if not _another_processes(name)]


def carrying(tag: str) -> list[str]:
    """Every namespace and /etc/netns folder whose name carries ``tag``."""
    found = netem.namespaces() + [p.name for p in netem.NETNS_ETC.glob(f"{netem.PREFIX}*")]
    return [name for name in found if tag in name]


def _another_processes(name: str) -> bool:
    owner = netem.STALE.match(name)
    if not owner:
        return False
    try:
        process = psutil.Process(int(owner.group(1)))
        return process.pid != os.getpid() and os.getpid() not in {p.pid for p in process.parents()}
    except psutil.NoSuchProcess:
        return False  # gone and its network left: a leak, ours to see


def root_addresses() -> list:
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True)
    return sorted(
        (i["ifname"], a["local"]) for i in json.loads(out.stdout) for a in i.get("addr_info", [])
    )


def in_node(net, index: int, *argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        netem.enter_node(net.nodes[index], list(argv)),
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )


@needs_netns
def test_network_exists_for_the_block_only(tmp_path):
    before = root_addresses()
    with pytest.raises(runner.Interrupted):
        with netem.network(CONFIG, tmp_path) as net:
            tag = net.switch.removesuffix("-sw")
            names = [n.namespace for n in net.nodes]
            assert sorted(ours(tag)) == sorted([net.switch, *names, *names])  # + /etc/netns
            assert root_addresses() == before  # nothing of it in the machine's namespace
            a, b = net.nodes
            assert in_node(net, 0, "hostname").stdout.strip() == a.hostname
            resolved = in_node(
                net,
                0,
                sys.executable,
                "-c",
                f"import socket; print(socket.gethostbyname('{b.hostname}'))",
            )
            assert resolved.stdout.strip() == b.address
            # Stopped by a signal, as the runner's block is on SIGTERM.
            raise runner.Interrupted(15)
    assert ours(tag) == []
    recorded = json.loads((tmp_path / NETWORK).read_text())
    assert recorded["rate_mbit"] == 100 and [n["address"] for n in recorded["nodes"]] == [
        a.address,
        b.address,
    ]


SENDER = """
import socket, sys, time
total, chunk = int(sys.argv[2]), b"\\0" * (1 << 16)
c = socket.create_connection((sys.argv[1], 5201))
start = time.perf_counter()
for _ in range(total // len(chunk)):
    c.sendall(chunk)
c.shutdown(socket.SHUT_WR)
c.recv(1)
print(time.perf_counter() - start)
"""
RECEIVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 5201))
print("ready", flush=True)
c, _ = s.accept()
while c.recv(1 << 20):
    pass
c.sendall(b"x")
"""


@contextlib.contextmanager
def receiving(node):
    """RECEIVER listening in ``node`` (ready before the block runs), until
    the block's sender or connector is done with it."""
    receiver = subprocess.Popen(
        netem.enter_node(node, [sys.executable, "-c", RECEIVER, node.address]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout.readline().strip() == "ready"
        yield
    finally:
        receiver.wait(timeout=30)


@needs_netns
def test_rate_limit_holds_between_two_nodes(tmp_path):
    """A TCP transfer of 2 s at the limit: its goodput is within 20 % of the
    rate (TCP/IP headers take about 3 % of it), and the kernel counted it."""
    size = 100 * 1_000_000 // 8 * 2
    with netem.network(CONFIG, tmp_path) as net:
        a, b = net.nodes
        with receiving(b):
            sent = in_node(net, 0, sys.executable, "-c", SENDER, b.address, str(size))
        counted = net.counters()
    mbit = size * 8 / float(sent.stdout) / 1e6
    assert 80 <= mbit <= 101, f"{mbit:.1f} Mbit/s through a 100 Mbit/s link"
    assert counted[a.address]["tx_bytes"] >= size
    assert counted[b.address]["rx_bytes"] >= size


CONNECTOR = """
import socket, sys, time
start = time.perf_counter()
c = socket.create_connection((sys.argv[1], 5201))
print(time.perf_counter() - start)
c.shutdown(socket.SHUT_WR)
c.recv(1)
"""


@needs_netns
def test_delay_is_applied_or_refused_with_the_reason(tmp_path):
    """Where the kernel has netem, a TCP connect (one round trip) from node
    1 to node 0 takes at least twice the one-way delay; where it has not
    (as in many containers), the error names the setting and the module."""
    try:
        with netem.network({**CONFIG, "net_delay_ms": 20}, tmp_path) as net:
            a = net.nodes[0]
            with receiving(a):
                connect = in_node(net, 1, sys.executable, "-c", CONNECTOR, a.address)
    except netem.NetworkError as exc:
        assert "net_delay_ms" in str(exc) and "sch_netem" in str(exc), str(exc)
        assert ours(CONFIG["run_id"][:6]) == []
        pytest.skip(f"no delay here: {exc}")
    assert float(connect.stdout) >= 2 * 0.020 * 0.9


def test_stale_namespaces_of_a_dead_runner_are_removed():
    if CANNOT:
        pytest.skip("; ".join(CANNOT))
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{netem.PREFIX}{dead.pid}-stale0-n0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    (netem.NETNS_ETC / name).mkdir(parents=True)
    alive = f"{netem.PREFIX}{1}-alive0-n0"  # pid 1 lives
    subprocess.run(["ip", "netns", "add", alive], check=True)
    try:
        netem.remove_stale()
        assert carrying("stale0") == [] and carrying("alive0") == [alive]
    finally:
        netem.remove_namespace(alive)


def emulated_design(framework: str, **fixed) -> dict:
    return {
        "name": "netem",
        "replications": 1,
        "factors": {
            "framework": [framework],
            "nodes": [2],
            "procs_per_node": [1],
            "batch_size": [32],
        },
        "fixed": {**TINY_FIXED, "epochs": 1, "tracer": "none", "net_rate_mbit": 1000, **fixed},
    }


def run_emulated(doc: dict, results: Path):
    plan = design.parse(doc, "netem.yaml")
    row = plan.runs()[0]
    assert runner.execute(row, results) == 0
    folder = results / row.path
    return plan, row, json.loads((folder / DONE).read_text()), folder


@pytest.mark.slow
@needs_netns
@pytest.mark.parametrize("framework", ["torch-ddp", "horovod-torch"])
def test_two_nodes_train_over_the_emulated_network(tmp_path, framework):
    """Two nodes of one process each: every gradient all-reduce crosses the
    link, so each node sends at least the gradients' bytes per step (a ring
    of two sends each half twice); start-up, evaluation and TCP/IP headers
    add a little."""
    plan, row, done, folder = run_emulated(emulated_design(framework), tmp_path)
    assert done["status"] == "ok", done["reason"]
    assert ours(row.run_id[:6]) == []
    ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
    assert [r["hostname"][-3:] for r in ranks] == ["-n0", "-n1"]  # a host name per node
    network = json.loads((folder / NETWORK).read_text())
    steps = json.loads((folder / "metrics.json").read_text())["steps_per_epoch"]
    for node in network["nodes"]:
        assert (
            steps * PARAM_BYTES
            <= node["tx_bytes"]
            <= 1.2 * steps * PARAM_BYTES + 3 * PARAM_BYTES + 1e6
        ), (node, steps, PARAM_BYTES)
    runs = collect.tables(plan, tmp_path)["runs"].iloc[0]
    assert runs["net_tx_bytes"] == network["tx_bytes"]
    assert runs["net_tx_bytes_per_step"] == network["tx_bytes"] / steps


@pytest.mark.slow
@needs_netns
def test_nodes_with_cores_of_their_own_confine_each_rank(tmp_path):
    """cores_per_node: 1 on two emulated nodes: each rank reads back one
    core, its node's, and the two nodes' cores differ (torchrun starts the
    second node's rank through the ssh shim, which confines it too)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two nodes of one core each need two cores")
    _, row, done, folder = run_emulated(emulated_design("torch-ddp", cores_per_node=1), tmp_path)
    assert done["status"] == "ok", done["reason"]
    record = json.loads((folder / RUN_RECORD).read_text())
    seen = [rank["cpus"] for rank in sorted(record["ranks"], key=lambda r: r["rank"])]
    assert seen == record["cores"]["nodes"] and seen[0] != seen[1], seen
    assert record["conditions"]["cores_per_rank"] == [1, 1]
    assert record["conditions"]["own_cores"] is True
    assert record["conditions"]["network"] == {"emulated": True, "rate_mbit": 1000, "delay_ms": 0}


def test_more_cores_than_the_machine_has_is_refused_in_one_line():
    with pytest.raises(cores.CoresError, match="cores_per_node: 2 node\\(s\\) x 3 core"):
        cores.node_cpus({"nodes": 2, "cores_per_node": 3}, available={0, 1, 2, 3})
    assert cores.node_cpus({"nodes": 2, "cores_per_node": 2}, available={0, 1, 2, 5}) == [
        [0, 1],
        [2, 5],
    ]
    assert cores.span([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


@pytest.mark.slow
@needs_netns
def test_failed_run_leaves_no_network(tmp_path):
    # No step of 4000 images per process fits in 100 images.
    doc = emulated_design("torch-ddp", train_images=100)
    doc["factors"]["batch_size"] = [4000]
    _, row, done, folder = run_emulated(doc, tmp_path)
    assert done["status"] == "failed" and "no step fits in an epoch" in done["reason"]
    assert ours(row.run_id[:6]) == []
    assert (folder / NETWORK).exists()


def test_without_privileges_the_run_fails_with_the_reason(tmp_path):
    """As an unprivileged user: the preflight message, and a run that
    records it instead of a traceback."""
    if (
        subprocess.run(["which", "setpriv"], capture_output=True).returncode
        or not Path("/proc/self/status").exists()
    ):
        pytest.skip("setpriv (util-linux) not found")
    code = "from ddlcompare.run import netem; print(netem.problems('local'))"
    out = subprocess.run(
        [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        pytest.skip(f"cannot run as nobody here: {out.stderr.strip()[-200:]}")
    assert "needs CAP_NET_ADMIN and CAP_SYS_ADMIN" in out.stdout and "run as root" in out.stdout


def test_emulation_is_refused_under_a_real_scheduler():
    [problem] = [p for p in netem.problems("slurm") if "allocation" in p]
    assert problem.startswith("net_rate_mbit:") and "net_rate_mbit: null" in problem


def test_delay_without_rate_is_a_design_problem():
    doc = emulated_design("torch-ddp", net_rate_mbit=None, net_delay_ms=5)
    found = preflight.network_problems(design.parse(doc, "netem.yaml"))
    assert found and found[0].startswith("net_delay_ms:") and "net_rate_mbit" in found[0]
    assert (
        preflight.network_problems(
            design.parse(emulated_design("torch-ddp", net_rate_mbit=None), "netem.yaml")
        )
        == []
    )


MAP = {"DDLC_NETNS_MAP": "10.213.0.1=ddlc-9-a-n0=vm-n0 10.213.0.2=ddlc-9-a-n1=vm-n1"}


def test_emulated_nodes_are_a_scheduler_of_their_own():
    scheduler, found = schedulers.detect(2, 3, env=MAP)
    assert (scheduler.name, found) == ("netns", [Host("10.213.0.1", 3), Host("10.213.0.2", 3)])


def test_launchers_reach_emulated_nodes_through_the_shim():
    nodes = [Host("10.213.0.1", 1), Host("10.213.0.2", 1)]
    config = {"threads": 1, "run_id": "abc", "framework": "torch-ddp", "horovod_controller": "gloo"}
    argv, _ = launch.command("torchrun", nodes, config, Path("/r"), "netns")
    assert argv[:8] == mpirun_per_node("10.213.0.1,10.213.0.2", str(netem.NETNS_SSH))
    argv, env = launch.command(
        "horovodrun", nodes, {**config, "framework": "horovod-torch"}, Path("/r"), "netns"
    )
    assert env["PATH"].startswith(f"{netem.NETNS_SSH.parent}:")
    assert argv[argv.index("--network-interface") + 1] == netem.IFACE
    argv, _ = launch.command(
        "horovodrun",
        nodes,
        {**config, "framework": "horovod-torch", "horovod_controller": "mpi"},
        Path("/r"),
        "netns",
    )
    assert f"--mpi-args=--mca plm_rsh_agent {netem.NETNS_SSH}" in argv


@needs_netns
def test_shim_parses_destination_as_ssh_does(tmp_path):
    """Options before and after the destination, as horovodrun and mpirun
    pass them; the words after it run through a shell on that node; an
    unknown destination fails as an unreachable host does (255)."""
    with netem.network(CONFIG, tmp_path) as net:
        env = {**net.env, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        b = net.nodes[1]
        shim = [
            str(netem.NETNS_SSH),
            "-o",
            "PasswordAuthentication=no",
            "-x",
            b.address,
            "-p",
            "22",
            "hostname;",
            "ip -o -4 addr show",
            netem.IFACE,
        ]
        there = subprocess.run(shim, env=env, capture_output=True, text=True, timeout=30)
        assert there.returncode == 0, there.stderr
        name, link = there.stdout.splitlines()
        assert name == b.hostname and f"inet {b.address}/" in link
        nowhere = subprocess.run(
            [str(netem.NETNS_SSH), "10.9.9.9", "true"], env=env, capture_output=True, text=True
        )
        assert nowhere.returncode == 255 and "10.9.9.9" in nowhere.stderr
