"""A slow network between the ranks of this machine, for studying it here.

With ``net_rate_mbit`` set, each design node becomes a network namespace on
this machine (its ranks share it, as on a cluster where traffic within a
node never touches the NIC). A "switch" namespace holds a bridge; every node
namespace has one veth link into it, named ``ddlc0`` in every node, with an
address of a private subnet. The root namespace gets no address and no
route: nothing can leave the machine. tc's token bucket (tbf) on both ends
of each link limits what a node sends and what it receives to the rate, as
a full-duplex NIC does; ``net_delay_ms`` adds netem's delay to what a node
sends (where the kernel has netem).

The runner creates the network before the launch and always removes it
after; namespaces carry the runner's pid, so those of a killed runner are
removed by the next run. Seen from the launchers this is one more scheduler,
"netns" (ddlcompare/run/schedulers/netns.py): the hosts are the node addresses, the launcher
runs in node 0, and remote starts go through ``netns_as_ssh/ssh``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from runfiles.names import NETWORK
from ddlcompare.run import cores, schedulers
from runfiles.atomic import write_json

IFACE = "ddlc0"  # the node's NIC, same name in every node namespace
BRIDGE = "br0"
PREFIX = "ddlc-"
# Node subnets are tried in this range; the first that overlaps no route of
# this machine is used, so an address never means two things in a log.
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
HOSTS_MAP = "DDLC_NETNS_MAP"  # "address=namespace ..." for the netns scheduler and the ssh shim
NETNS_ETC = Path("/etc/netns")  # ip netns exec binds /etc/netns/<ns>/hosts on /etc/hosts
NETNS_SSH = Path(__file__).resolve().parent / "schedulers" / "netns_as_ssh" / "ssh"
STALE = re.compile(rf"^{PREFIX}(\d+)-")


class NetworkError(RuntimeError):
    """The emulated network cannot be set up; the message says why and what to do."""


@dataclass(frozen=True)
class Node:
    namespace: str
    address: str
    hostname: str  # its own, as a cluster node has: launchers find themselves by it
    port: str  # the link's end in the switch namespace
    cpus: str = ""  # its own cores (ddlcompare/run/cores.py), "" where it shares the machine's


class NoEmulation:
    """The machine's own network: nothing to set up; the one node's cores
    where cores_per_node confines it."""

    env: dict[str, str] = {}
    hostnames: list[str] = []  # the machine's own: every rank is on node 0

    def __init__(self, node_cpus: list[list[int]] | None = None):
        self.node_cpus = node_cpus

    def enter(self, argv: list[str]) -> list[str]:
        return cores.confine(self.node_cpus[0] if self.node_cpus else None, argv)


class EmulatedNetwork:
    def __init__(
        self,
        tag: str,
        nodes: int,
        rate_mbit: int,
        delay_ms: float,
        node_cpus: list[list[int]] | None = None,
    ):
        subnet = free_subnet()
        self.switch = f"{PREFIX}{tag}-sw"
        self.prefixlen = subnet.prefixlen
        machine = os.uname().nodename.split(".")[0][:40]
        self.node_cpus = node_cpus
        self.nodes = [
            Node(
                f"{PREFIX}{tag}-n{i}",
                str(subnet[i + 1]),
                f"{machine}-n{i}",
                f"n{i}",
                cores.span(node_cpus[i]) if node_cpus else "",
            )
            for i in range(nodes)
        ]
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms

    @property
    def hostnames(self) -> list[str]:
        return [n.hostname for n in self.nodes]

    @property
    def env(self) -> dict[str, str]:
        """What the launchers and the ranks need to know: the hosts (read by
        the netns scheduler and the ssh shim) and the interface to talk on."""
        return {
            HOSTS_MAP: " ".join(
                f"{n.address}={n.namespace}={n.hostname}" + (f"={n.cpus}" if n.cpus else "")
                for n in self.nodes
            ),
            "GLOO_SOCKET_IFNAME": IFACE,
            "OMPI_MCA_btl_tcp_if_include": IFACE,
            "OMPI_MCA_oob_tcp_if_include": IFACE,
        }

    def enter(self, argv: list[str]) -> list[str]:
        """The launcher runs on the first node, as a job script does."""
        return enter_node(self.nodes[0], argv)

    def create(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", self.switch, "link", "set", BRIDGE, "up")
        for node in self.nodes:
            _ip("netns", "add", node.namespace)
            _write_hosts(node, self.nodes)
            _ip(
                "link",
                "add",
                IFACE,
                "netns",
                node.namespace,
                "mtu",
                "1500",
                "type",
                "veth",
                "peer",
                "name",
                node.port,
                "netns",
                self.switch,
                "mtu",
                "1500",
            )
            _ip("-n", self.switch, "link", "set", node.port, "master", BRIDGE, "up")
            _ip(
                "-n",
                node.namespace,
                "addr",
                "add",
                f"{node.address}/{self.prefixlen}",
                "dev",
                IFACE,
            )
            _ip("-n", node.namespace, "link", "set", IFACE, "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
            self._limit(node)

    def _limit(self, node: Node) -> None:
        """tbf on the node's egress (what it sends) and on the switch port's
        egress (what it receives); netem's delay before the node's tbf."""
        sent = ["dev", IFACE, "root"]
        if self.delay_ms:
            _tc(
                node.namespace,
                "qdisc",
                "add",
                *sent,
                "handle",
                "1:",
                "netem",
                "delay",
                f"{self.delay_ms}ms",
                what="net_delay_ms",
            )
            sent = ["dev", IFACE, "parent", "1:1"]
        _tc(node.namespace, "qdisc", "add", *sent, "handle", "10:", *self._tbf())
        _tc(self.switch, "qdisc", "add", "dev", node.port, "root", *self._tbf())

    def _tbf(self) -> list[str]:
        rate = self.rate_mbit * 1_000_000 // 8  # bytes per second
        # The bucket holds 4 ms at the rate (one kernel tick even at HZ=250),
        # and never less than a 64 KiB segment.
        burst = max(rate // 250, 65536)
        return ["tbf", "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "latency", "50ms"]

    def counters(self) -> dict[str, dict[str, int]]:
        """Each node's NIC counters (kernel's), and what its queues dropped."""
        found = {}
        for node in self.nodes:
            link = json.loads(_ip("-n", node.namespace, "-j", "-s", "link", "show", IFACE))[0]
            stats = link["stats64"]
            qdiscs = json.loads(
                _run(["tc", "-n", node.namespace, "-j", "-s", "qdisc", "show", "dev", IFACE])
            )
            found[node.address] = {
                "tx_bytes": stats["tx"]["bytes"],
                "rx_bytes": stats["rx"]["bytes"],
                "tx_packets": stats["tx"]["packets"],
                "rx_packets": stats["rx"]["packets"],
                "tx_dropped": sum(q.get("drops", 0) for q in qdiscs if q["kind"] == "tbf"),
            }
        return found

    def destroy(self) -> None:
        """The switch first: deleting it deletes every link, even while a
        leftover rank still holds its node namespace."""
        for name in [self.switch, *(n.namespace for n in self.nodes)]:
            remove_namespace(name)

    def record(self, before: dict, after: dict) -> dict:
        nodes = []
        for node in self.nodes:
            delta = {
                k: after[node.address][k] - before[node.address][k] for k in after[node.address]
            }
            nodes.append({"address": node.address, "namespace": node.namespace, **delta})
        return {
            "emulated": True,
            "rate_mbit": self.rate_mbit,
            "delay_ms": self.delay_ms,
            "interface": IFACE,
            "nodes": nodes,
            "tx_bytes": sum(n["tx_bytes"] for n in nodes),
            "rx_bytes": sum(n["rx_bytes"] for n in nodes),
        }


@contextlib.contextmanager
def network(config: Mapping[str, Any], run_dir: Path):
    """The run's network: the machine's own, or an emulated one that exists
    exactly as long as this block and whose traffic goes to network.json.
    ``config``: a run's, or the probe's few keys (nodes, procs_per_node,
    net_rate_mbit, net_delay_ms, run_id)."""
    node_cpus = cores.node_cpus(config)
    if config.get("net_rate_mbit") is None:
        if node_cpus and len(node_cpus) > 1:
            raise cores.CoresError(
                "cores_per_node: the nodes of one machine have cores of their own only as "
                "emulated nodes; set net_rate_mbit (e.g. 10000) or nodes: 1"
            )
        yield NoEmulation(node_cpus)
        return
    require_capable(schedulers.detect(config["nodes"], config["procs_per_node"])[0])
    remove_stale()
    net = EmulatedNetwork(
        f"{os.getpid()}-{config['run_id'][:6]}",
        config["nodes"],
        config["net_rate_mbit"],
        config.get("net_delay_ms") or 0,
        node_cpus,
    )
    try:
        net.create()
        before = net.counters()
        try:
            yield net
        finally:
            write_json(run_dir / NETWORK, net.record(before, net.counters()))
    finally:
        net.destroy()


def problems(scheduler: schedulers.Scheduler | str) -> list[str]:
    """Why this machine cannot emulate a network now (empty when it can)."""
    scheduler = schedulers.get(scheduler)
    found = []
    if not scheduler.one_machine:
        found.append(
            f"net_rate_mbit: the emulated network joins ranks of this machine; this "
            f"run is in a {scheduler.name} allocation, whose nodes have a real network "
            "(set net_rate_mbit: null)"
        )
    missing = [tool for tool in ("ip", "tc") if not shutil.which(tool)]
    if missing:
        found.append(
            f"net_rate_mbit: {' and '.join(missing)} not found; install iproute2 "
            "(apt-get install iproute2)"
        )
    if lacking := [name for name, bit in CAPABILITIES.items() if not _capable(bit)]:
        found.append(
            f"net_rate_mbit: emulating the network needs {' and '.join(lacking)} "
            "(network namespaces, veth links, tc), which this process lacks; run as "
            "root (a container needs --cap-add NET_ADMIN --cap-add SYS_ADMIN) or set "
            "net_rate_mbit: null"
        )
    return found


# Linux capability bits (linux/capability.h): namespaces are mounted, links
# and queues configured.
CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}


def _capable(bit: int) -> bool:
    status = Path("/proc/self/status").read_text()
    found = re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)
    effective = int(found.group(1), 16) if found else 0  # no line: no capability known
    return bool(effective >> bit & 1)


def require_capable(scheduler: schedulers.Scheduler) -> None:
    if found := problems(scheduler):
        raise NetworkError("; ".join(found))


def free_subnet(prefixlen: int = 24) -> ipaddress.IPv4Network:
    """The first subnet of SUBNETS that no route of this machine touches."""
    routes = json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]))
    taken = [
        ipaddress.ip_network(r["dst"], strict=False)
        for r in routes
        if r.get("dst") not in (None, "default")
    ]
    for subnet in SUBNETS.subnets(new_prefix=prefixlen):
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
    raise NetworkError(f"no subnet of {SUBNETS} is free of this machine's routes")


def namespaces() -> list[str]:
    return sorted(p.name for p in Path("/run/netns").glob(f"{PREFIX}*"))


def remove_stale() -> None:
    """Remove the namespaces of runners that are gone (killed ones)."""
    names = set(namespaces()) | {p.name for p in NETNS_ETC.glob(f"{PREFIX}*")}
    for name in sorted(names, key=lambda n: not n.endswith("-sw")):
        owner = STALE.match(name)
        if owner and not psutil.pid_exists(int(owner.group(1))):
            remove_namespace(name)


def remove_namespace(name: str) -> None:
    if (Path("/run/netns") / name).exists():
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def enter_node(node: Node, argv: list[str]) -> list[str]:
    """argv in the node: its network namespace (and its /etc/hosts), and a
    UTS namespace of its own with the node's host name, confined to the
    node's cores where it has its own. netns_as_ssh/ssh enters a node the
    same way."""
    confined = ["taskset", "--cpu-list", node.cpus] if node.cpus else []
    return [
        "ip",
        "netns",
        "exec",
        node.namespace,
        *confined,
        "unshare",
        "--uts",
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        node.hostname,
        *argv,
    ]


def _write_hosts(node: Node, nodes: list[Node]) -> None:
    """Every node resolves every node's host name to its address, as on a
    cluster: launchers find themselves (torchrun's rendezvous host) and each
    other (torchrun's MASTER_ADDR is rank 0's host name) by name."""
    folder = NETNS_ETC / node.namespace
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{n.address} {n.hostname}" for n in nodes]
    (folder / "hosts").write_text("\n".join(lines) + "\n")


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _tc(namespace: str, *args: str, what: str = "net_rate_mbit") -> str:
    try:
        return _run(["tc", "-n", namespace, *args])
    except NetworkError as exc:
        qdisc = "netem" if what == "net_delay_ms" else "tbf"
        if "qdisc kind is unknown" in str(exc):
            raise NetworkError(
                f"{what}: this kernel has no {qdisc} queueing discipline "
                f"(module sch_{qdisc}); load it on the host, or set "
                f"{what}: {0 if what == 'net_delay_ms' else 'null'}"
            ) from None
        raise NetworkError(f"{what}: {exc}") from None


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except OSError as exc:
        raise NetworkError(f"{argv[0]}: {exc.strerror}; install iproute2") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise NetworkError(
            f"'{' '.join(argv)}' failed: {message[-1] if message else done.returncode}"
        )
    return done.stdout
