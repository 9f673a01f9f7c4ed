"""A cluster on this machine, Slurm and OAR on the same nodes, to try the
slurm and grid5000 profiles before spending cluster hours, and for the tests.

    ./ddlc cluster up [--nodes N] [--rate-mbit R] [--cores-per-node C]
                                                    start it (refused while one runs)
    ./ddlc cluster status                           its nodes, both schedulers, every
                                                    daemon (exit 1 when one is gone)
    ./ddlc cluster down                             stop everything it started

Each node is a network namespace and a UTS namespace of its own (its own
host name and address), as in ddlcompare/run/netem.py, whose EmulatedNetwork
builds the links: one veth per node into a bridge, tbf-shaped to the rate
both ways. This machine joins the bridge too, as the cluster's frontend:
slurmctld runs here, one slurmd runs in each node, and jobs are submitted
from here (SLURM_CONF, printed by ``up`` and ``status``). The nodes share
this machine's file system, as cluster nodes share a home over NFS.
With ``--cores-per-node C`` each node also has cores of its own (node i:
cores [i*C, (i+1)*C), by affinity, as the design's ``cores_per_node`` gives
emulated nodes: ddlcompare/run/cores.py): its daemons start confined to
them, and so does every job they start (TaskPlugin=task/none and OAR
without cpusets leave a job the affinity of the daemon that started it).
Without it the nodes share this machine's cores.

Inside a node, /etc/hosts names every node and /etc/slurm is the cluster's
(``ip netns exec`` binds /etc/netns/<node>/*), so an srun in a job reaches
this cluster whatever else this machine runs. Its own munged (own socket)
and its own ports leave a one-node test Slurm (envs/schedulers/slurm.sh)
undisturbed. Every process it starts carries a mark in its environment
(CLUSTER_MARK, unique to the cluster) and inherits it to its children:
``down`` stops those, the daemons' children included (an OAR server's
Almighty modules outlived it once and held its port), not only what the PID
files name.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ddlcompare.plan import envs

from ddlcompare.run import cores, netem
from runfiles import variables
from runfiles.ownership import ended, wait_ended

REPO = Path(__file__).resolve().parents[2]
STATE = Path(variables.value("DDLC_CLUSTER_DIR"))
RECORD = STATE / "cluster.json"
TAG = "cluster"  # namespaces ddlc-cluster-sw, ddlc-cluster-n0...: never a runner's (netem.STALE)
FRONTEND_LINK = "ddlcfe"  # this machine's end of its link into the bridge
MUNGE_SOCKET = Path("/run/munge/ddlc-cluster.socket")
SLURMCTLD_PORT, SLURMD_PORT = 6917, 6918  # not Slurm's defaults: a test Slurm may hold those
HOSTS_BEGIN, HOSTS_END = "# ddlc cluster: begin", "# ddlc cluster: end"
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "iproute2", "socat"]
OAR_SCRIPT = REPO / "envs" / "schedulers" / "oar.sh"  # installs OAR, then as the test OAR
OAR_SERVER_PORT = 6666  # Almighty; one OAR server per machine (/etc/oar is global)
POSTGRES_PORT = 5432
FORWARD_OFFSET = 20000  # the relays' ports on the bridge: 25432, 26666
OAR_CORES_PER_NODE = 2
CPUS_PER_NODE = 2
MEMORY_MB_PER_NODE = 8000
# Slurm's nodes claim CPUS_PER_NODE each: more than this many times the
# machine's cores, every node's jobs would crawl.
OVERCOMMIT = 4
MB_PER_NODE_AT_LEAST = 3000  # one run's process (workflow_support.MB_PER_PROCESS)
MAX_RATE_MBIT = 100_000  # tc's tbf, as netem shapes links
CLUSTER_MARK = "DDLC_CLUSTER_MARK"  # in the environment of every process the cluster starts


class ClusterError(RuntimeError):
    """Why the cluster cannot start or stop; printed without a traceback."""


def say(text: str) -> None:
    print(f"cluster: {text}", file=sys.stderr, flush=True)


# ---- up ---------------------------------------------------------------------


def check_size(nodes: int, rate_mbit: int) -> None:
    """The arguments against this machine: a node count its cores and memory
    can carry, a rate tc can shape."""
    if nodes < 2:
        raise ClusterError(f"--nodes {nodes}: a cluster needs at least 2 nodes")
    machine_cores = os.cpu_count() or 1
    most = max(3, OVERCOMMIT * machine_cores // CPUS_PER_NODE)
    if nodes > most:
        raise ClusterError(
            f"--nodes {nodes}: each node claims {CPUS_PER_NODE} CPUs, and this machine has "
            f"{machine_cores} cores; at most {most} nodes here"
        )
    memory_mb = psutil.virtual_memory().total // 2**20
    if nodes * MB_PER_NODE_AT_LEAST > memory_mb:
        raise ClusterError(
            f"--nodes {nodes}: each node needs {MB_PER_NODE_AT_LEAST} MB for a run's process, "
            f"and this machine has {memory_mb} MB; at most {memory_mb // MB_PER_NODE_AT_LEAST} nodes"
        )
    if not 1 <= rate_mbit <= MAX_RATE_MBIT:
        raise ClusterError(
            f"--rate-mbit {rate_mbit}: give a link rate from 1 to {MAX_RATE_MBIT} Mbit/s"
        )


def memory_per_node(nodes: int) -> int:
    """What each node tells Slurm it has: 8 GB, or its share of this machine's."""
    return min(MEMORY_MB_PER_NODE, psutil.virtual_memory().total // 2**20 // nodes)


def own_cores(nodes: int, per_node: int | None) -> list[list[int]] | None:
    """Each node's cores with ``--cores-per-node``, else None (shared)."""
    if per_node is None:
        return None
    usable = sorted(os.sched_getaffinity(0))
    if per_node < 1 or nodes * per_node > len(usable):
        raise ClusterError(
            f"--cores-per-node {per_node}: {nodes} nodes need 1 or more cores each, at most "
            f"{len(usable)} in all (this machine's {cores.span(usable)}); lower it or --nodes, "
            "or leave it out (the nodes then share the cores)"
        )
    return cores.node_cpus({"nodes": nodes, "cores_per_node": per_node}, set(usable))


def up(nodes: int = 3, rate_mbit: int = 1000, cores_per_node: int | None = None) -> dict:
    check_size(nodes, rate_mbit)
    node_cpus = own_cores(nodes, cores_per_node)
    if RECORD.exists():
        record = json.loads(RECORD.read_text())
        if not abandoned(record):
            raise ClusterError(
                f"a cluster is already up (started {record['started']}); "
                "'./ddlc cluster down' stops it"
            )
        print(
            f"cluster: the cluster started {record['started']} is gone (none of its "
            "processes runs: ended without 'cluster down', a killed session); clearing "
            "what it left",
            file=sys.stderr,
        )
        down()
    if os.geteuid() != 0:
        raise ClusterError("the cluster needs root (namespaces, links, daemons); run it as root")
    if found := netem.problems("local"):
        raise ClusterError("; ".join(found))
    install_packages()
    for folder in ("etc", "run", "log", "state", "spool"):
        shutil.rmtree(STATE / folder, ignore_errors=True)
        (STATE / folder).mkdir(parents=True)
    net = netem.EmulatedNetwork(TAG, nodes, rate_mbit, 0, node_cpus)
    subnet = ipaddress.ip_interface(f"{net.nodes[0].address}/{net.prefixlen}").network
    frontend = netem.Node("", str(subnet[-2]), os.uname().nodename.split(".")[0], "fe")
    record = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mark": f"{os.getpid()}-{time.time_ns()}",
        "rate_mbit": rate_mbit,
        "cores_per_node": cores_per_node,  # None: the nodes share this machine's cores
        "frontend": frontend.__dict__,
        "nodes": [n.__dict__ for n in net.nodes],
        "slurm_conf": str(STATE / "etc" / "slurm.conf"),
    }
    RECORD.write_text(json.dumps(record, indent=1))  # from here on, down undoes it
    try:
        net.create()
        join_frontend(net, frontend)
        write_hosts(net.nodes, frontend)
        start_slurm(net.nodes, frontend)
        start_oar(net.nodes, frontend)
        grant_oar_user()
    except BaseException:
        down()
        raise
    return record


def install_packages() -> None:
    """Debian's Slurm and munge, installed as the test schedulers install
    them (their daemons kept stopped)."""
    script = REPO / "envs" / "schedulers" / "common.sh"
    shell = (
        f'say() {{ echo "cluster: $*" >&2; }}; source {script}; '
        f"packages=({' '.join(PACKAGES)}); install_packages"
    )
    if subprocess.run(["bash", "-c", shell]).returncode != 0:
        raise ClusterError(f"installing {' '.join(PACKAGES)} failed; see apt-get's output above")


def join_frontend(net: netem.EmulatedNetwork, frontend: netem.Node) -> None:
    """A veth from this machine into the bridge, shaped like a node's."""
    netem._ip(
        "link", "add", FRONTEND_LINK, "type", "veth", "peer", "name", frontend.port,
        "netns", net.switch,
    )  # fmt: skip
    netem._ip("-n", net.switch, "link", "set", frontend.port, "master", netem.BRIDGE, "up")
    netem._ip("addr", "add", f"{frontend.address}/{net.prefixlen}", "dev", FRONTEND_LINK)
    netem._ip("link", "set", FRONTEND_LINK, "up")
    netem._run(["tc", "qdisc", "add", "dev", FRONTEND_LINK, "root", *net._tbf()])
    netem._tc(net.switch, "qdisc", "add", "dev", frontend.port, "root", *net._tbf())


def write_hosts(nodes: list[netem.Node], frontend: netem.Node) -> None:
    """Every node and this machine know every node by name."""
    names = [f"{n.address} {n.hostname}" for n in nodes]
    for node in nodes:
        hosts = netem.NETNS_ETC / node.namespace / "hosts"
        hosts.write_text(hosts.read_text() + f"{frontend.address} {frontend.hostname}\n")
    text = _without_our_hosts(Path("/etc/hosts").read_text())
    Path("/etc/hosts").write_text(text + "\n".join([HOSTS_BEGIN, *names, HOSTS_END]) + "\n")


def _without_our_hosts(text: str) -> str:
    lines, ours = [], False
    for line in text.splitlines(keepends=True):
        if line.strip() == HOSTS_BEGIN:
            ours = True
        if not ours:
            lines.append(line)
        if line.strip() == HOSTS_END:
            ours = False
    return "".join(lines)


def slurm_conf(nodes: list[netem.Node], frontend: netem.Node) -> str:
    state = STATE
    # A node with cores of its own tells Slurm how many; shared, each claims CPUS_PER_NODE.
    cpus = {n.hostname: len(cores.cpu_list(n.cpus)) if n.cpus else CPUS_PER_NODE for n in nodes}
    lines = [
        "ClusterName=ddlccluster",
        f"SlurmctldHost={frontend.hostname}({frontend.address})",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root",
        f"SlurmctldPidFile={state}/run/slurmctld.pid",
        f"SlurmdPidFile={state}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={state}/log/slurmctld.log",
        f"SlurmdLogFile={state}/log/slurmd-%n.log",
        f"StateSaveLocation={state}/state",
        f"SlurmdSpoolDir={state}/spool/%n",
        "AuthType=auth/munge",
        f"AuthInfo=socket={MUNGE_SOCKET}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=1000",
        "SlurmdParameters=config_overrides",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MailProg=/bin/true",
        # No accounting here: Snakemake asks squeue, which must still know
        # a job 3x its first status check later (docs/clusters.md).
        "MinJobAge=600",
        "KillWait=5",
        # A lost node is noticed within seconds, not Slurm's 5 minutes.
        "SlurmdTimeout=10",
        "SchedulerParameters=sched_interval=2",
        "ReturnToService=2",
        *(
            f"NodeName={n.hostname} NodeAddr={n.address} CPUs={cpus[n.hostname]} Boards=1 "
            f"SocketsPerBoard=1 CoresPerSocket={cpus[n.hostname]} ThreadsPerCore=1 "
            f"RealMemory={memory_per_node(len(nodes))} State=UNKNOWN"
            for n in nodes
        ),
        "PartitionName=cluster Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def start_slurm(nodes: list[netem.Node], frontend: netem.Node) -> None:
    conf = STATE / "etc" / "slurm.conf"
    conf.write_text(slurm_conf(nodes, frontend))
    for node in nodes:  # the node's /etc/slurm (ip netns exec binds it)
        folder = netem.NETNS_ETC / node.namespace / "slurm"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(conf, folder / "slurm.conf")
        # pmix's client folders are named by job step alone: on one file
        # system, each node needs a base of its own.
        pmix = STATE / "spool" / node.hostname / "pmix"
        pmix.mkdir(parents=True)
        (folder / "mpi.conf").write_text(f"PMIxCliTmpDirBase={pmix}\n")
    Path("/etc/slurm").mkdir(exist_ok=True)
    start_munge()
    _daemon(["/usr/sbin/slurmctld", "-f", str(conf)], "slurmctld")
    for node in nodes:
        _daemon(in_node(node, ["/usr/sbin/slurmd", "-f", "/etc/slurm/slurm.conf"]), "slurmd")
    env = client_env()
    _wait(
        60,
        f"{len(nodes)} idle Slurm nodes",
        lambda: _sinfo(env).count("idle") == len(nodes),
        STATE / "log",
    )


def in_node(node: netem.Node, argv: list[str]) -> list[str]:
    """argv as a daemon of the node: netem's node namespaces, plus the
    cgroup file systems slurmd looks for, which ``ip netns exec`` hides (it
    mounts the namespace's own /sys): this machine's hierarchies, mounted
    again (binding them is refused in a container)."""
    mounts = (
        "if [ -d /proc/1/root/sys/fs/cgroup/unified ] || ! [ -f /proc/1/root/sys/fs/cgroup/cgroup.controllers ]; then "
        "mount -t tmpfs cgroup /sys/fs/cgroup; "
        "for c in $(cut -f1 /proc/cgroups | grep -v '^#'); do "
        "mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c || rmdir /sys/fs/cgroup/$c; done; "
        "mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd; "
        "else mount -t cgroup2 cgroup /sys/fs/cgroup; fi; "
        'exec "$@"'
    )
    return netem.enter_node(node, ["sh", "-c", mounts, "sh", *argv])


def start_munge() -> None:
    MUNGE_SOCKET.parent.mkdir(exist_ok=True)
    shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
    pidfile = MUNGE_SOCKET.with_suffix(".pid")
    _daemon(
        ["runuser", "-u", "munge", "--", "/usr/sbin/munged", f"--socket={MUNGE_SOCKET}",
         f"--pid-file={pidfile}", "--force"],
        "munged",
    )  # fmt: skip
    _wait(10, "munged", lambda: pidfile.exists() and MUNGE_SOCKET.exists(), STATE / "log")
    shutil.copy(pidfile, STATE / "run" / "munged.pid")


def marked_env() -> dict:
    """The environment of a daemon the cluster starts: this one's, and the
    cluster's mark, which its children inherit and down looks for."""
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    return {**os.environ, CLUSTER_MARK: record.get("mark", "")}


def client_env() -> dict:
    """What Slurm's commands need here, on the frontend."""
    return {**os.environ, "SLURM_CONF": str(STATE / "etc" / "slurm.conf")}


def _sinfo(env: dict) -> str:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env
    )
    return out.stdout if out.returncode == 0 else ""


def _daemon(argv: list[str], what: str) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=marked_env())
    if out.returncode != 0:
        raise ClusterError(f"{what} did not start: {(out.stderr or out.stdout).strip()[-500:]}")


def _wait(seconds: float, what: str, ready, logs: Path) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not up after {seconds:.0f} s; logs in {logs}")
        time.sleep(0.3)


def oar_env(nodes: list[dict] | list[netem.Node]) -> dict:
    """envs/schedulers/oar.sh's settings for this cluster's OAR."""
    entries = [n if isinstance(n, dict) else n.__dict__ for n in nodes]
    own = entries[0].get("cpus")  # every node has as many, or none has its own
    return {
        **marked_env(),
        "DDLC_OAR_DIR": str(STATE / "oar"),
        "DDLC_OAR_NODES": " ".join(
            f"{n['hostname']}={n['namespace']}={n['address']}={n.get('cpus', '')}" for n in entries
        ),
        "DDLC_OAR_CORES": str(len(cores.cpu_list(own)) if own else OAR_CORES_PER_NODE),
    }


def start_oar(nodes: list[netem.Node], frontend: netem.Node) -> None:
    """OAR's server here, a node sshd in each node (oar.sh). What a node
    asks of the server's machine (oarsh and oarstat read PostgreSQL; a job's
    end is told to Almighty) goes to localhost, as on a one-machine OAR:
    each node's localhost ports are relayed to this machine's (socat), which
    see the connections come from localhost, as their configuration expects."""
    if _listening(OAR_SERVER_PORT):
        raise ClusterError(
            f"an OAR server already listens on port {OAR_SERVER_PORT} (the test OAR? "
            "'envs/schedulers/oar.sh stop' stops it): OAR's configuration is one per machine"
        )
    for port in (POSTGRES_PORT, OAR_SERVER_PORT):
        relay = port + FORWARD_OFFSET  # this machine's relay on its bridge address
        _forward("here", None, f"{frontend.address}:{relay}", f"127.0.0.1:{port}")
        for node in nodes:
            _forward(
                node.hostname, node.namespace, f"127.0.0.1:{port}", f"{frontend.address}:{relay}"
            )
    _oar_script("start", nodes)


def grant_oar_user() -> None:
    """OAR's user runs snakemake and the jobs: it must reach every built
    environment's Python (it may live under a home of mode 0700) and this
    checkout (envs/schedulers/oar.sh grant)."""
    pythons = {envs.python_for(name) for name in envs.ENV_DIRS}
    found = [str(p) for p in sorted(pythons) if p.exists()]
    _oar_script("grant", json.loads(RECORD.read_text())["nodes"], *found, str(REPO / "ddlc"))


def _oar_script(action: str, nodes: list, *args: str) -> None:
    """envs/schedulers/oar.sh, its output in a log file: the daemons it
    starts keep what they inherit, and a pipe would never close."""
    log = STATE / "log" / "oar.sh.log"
    with open(log, "a") as out:
        done = subprocess.run(
            [str(OAR_SCRIPT), action, *args], env=oar_env(nodes), stdin=subprocess.DEVNULL,
            stdout=out, stderr=out, timeout=900,
        )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"OAR {action} failed: {log.read_text().strip()[-1500:]}")


def _forward(where: str, namespace: str | None, listen: str, to: str) -> None:
    """A socat that relays ``listen`` (in ``namespace``, else here) to ``to``."""
    address, port = listen.split(":")
    argv = ["socat", f"TCP-LISTEN:{port},bind={address},reuseaddr,fork", f"TCP:{to}"]
    if namespace:
        argv = ["ip", "netns", "exec", namespace, *argv]
    # No stream of ours: a caller that reads our output would wait on it forever.
    quiet = subprocess.DEVNULL
    proc = subprocess.Popen(
        argv, start_new_session=True, stdin=quiet, stdout=quiet, stderr=quiet, env=marked_env()
    )
    (STATE / "run" / f"forward-{where}-{port}.pid").write_text(str(proc.pid))


def _listening(port: int) -> bool:
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True)
    return bool(out.stdout.strip())


# ---- faults -----------------------------------------------------------------


def lose_node(hostname: str) -> None:
    """The node fails as a crashed machine does: everything in it is killed
    (its slurmd, its OAR sshd, the jobs' processes)."""
    node = _node(hostname)
    _kill_namespace(node["namespace"])
    for pidfile in (STATE / "run").glob(f"*{hostname}*.pid"):
        pidfile.unlink()


def restore_node(hostname: str, oar: bool = True) -> None:
    """Start a lost node's daemons again; Slurm takes it back (ReturnToService=2),
    OAR once oar.sh's start sets the node Alive again. ``oar``: OAR's too,
    where OAR runs."""
    record = json.loads(RECORD.read_text())
    node, frontend = netem.Node(**_node(hostname)), netem.Node(**record["frontend"])
    _daemon(in_node(node, ["/usr/sbin/slurmd", "-f", "/etc/slurm/slurm.conf"]), "slurmd")
    if oar and (STATE / "oar").exists():
        for port in (POSTGRES_PORT, OAR_SERVER_PORT):
            relay = f"{frontend.address}:{port + FORWARD_OFFSET}"
            _forward(node.hostname, node.namespace, f"127.0.0.1:{port}", relay)
        _oar_script("start", record["nodes"])


def _node(hostname: str) -> dict:
    record = json.loads(RECORD.read_text())
    found = [n for n in record["nodes"] if n["hostname"] == hostname]
    if not found:
        raise ClusterError(f"{hostname}: no node of the cluster")
    return found[0]


# ---- down -------------------------------------------------------------------


LEFT_INSTALLED = (
    "left on this machine: the Debian packages up installed (Slurm, munge, socat, OAR, "
    "PostgreSQL), OAR's user {user} and its home, OAR's configuration in /etc/oar and its "
    "database, and the state folder {state} (logs)"
)


def live_record() -> dict | None:
    """The record of a cluster that is up or coming up; None when there is
    none, or only one left by a cluster whose processes all ended."""
    if not RECORD.exists():
        return None
    record = json.loads(RECORD.read_text())
    return None if abandoned(record) else record


def abandoned(record: dict) -> bool:
    """Whether nothing of the recorded cluster runs: none of its daemons,
    no process carrying its mark, and the ``up`` that wrote the record has
    ended (a session killed before ``cluster down`` leaves this). The
    daemons' liveness is status()'s where the record carries it."""
    mark = record.get("mark") or ""
    running = record["daemons"] if "daemons" in record else daemons()
    if any(running.values()) or (mark and _marked(mark)):
        return False
    pid, _, written_ns = mark.partition("-")
    try:
        writer = psutil.Process(int(pid))
        # The pid is the writer's while its process began before the record.
        return ended(writer) or writer.create_time() > int(written_ns) / 1e9
    except (ValueError, psutil.Error):
        return True


def down() -> bool:
    """Stop what ``up`` started: its PID files' daemons, then every process
    that carries the cluster's mark (the daemons' children too), remove the
    namespaces and the hosts lines. False when no cluster was up."""
    if not RECORD.exists():
        return False
    record = json.loads(RECORD.read_text())
    if (STATE / "oar").exists():
        _oar_script("stop", record["nodes"])
        _stop_processes(_orphaned_oar_helpers())
    _stop_all(sorted((STATE / "run").glob("*.pid")))
    if mark := record.get("mark"):
        _stop_processes(_marked(mark))
    for node in record["nodes"]:  # whatever still runs in a node: its jobs
        _kill_namespace(node["namespace"])
    netem.remove_namespace(f"{netem.PREFIX}{TAG}-sw")
    for node in record["nodes"]:
        netem.remove_namespace(node["namespace"])
    subprocess.run(["ip", "link", "del", FRONTEND_LINK], capture_output=True)
    hosts = Path("/etc/hosts")
    hosts.write_text(_without_our_hosts(hosts.read_text()))
    MUNGE_SOCKET.unlink(missing_ok=True)
    RECORD.unlink()
    return True


def _orphaned_oar_helpers() -> list[psutil.Process]:
    """The OAR server's helpers ("Almighty: appendice", its "bipbip") left
    running when the server itself was killed: reparented to init, they
    keep OAR's port, so that no OAR starts again. The server gives them a
    fresh environment, so the mark misses them; a live server's helpers
    have the server as their parent and are not taken."""
    found = []
    for process in psutil.process_iter(["cmdline", "ppid"]):
        args = process.info["cmdline"] or []  # psutil splits a rewritten one at spaces
        if " ".join(args).startswith("Almighty: ") and process.info["ppid"] == 1:
            with contextlib.suppress(psutil.Error):
                found += [process, *process.children(recursive=True)]
    return found


def _stop_all(pidfiles: list[Path], grace_s: float = 10) -> None:
    """Every daemon of the PID files, stopped (_stop_processes)."""
    daemons = []
    for pidfile in pidfiles:
        try:
            daemons.append(psutil.Process(int(pidfile.read_text().split()[0])))
        except (ValueError, IndexError, psutil.Error):
            pass
        pidfile.unlink(missing_ok=True)
    _stop_processes(daemons, grace_s)


def _marked(mark: str) -> list[psutil.Process]:
    """This machine's processes that carry the cluster's mark (their own or
    inherited environment), this one aside."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(CLUSTER_MARK) == mark:
                found.append(process)
        except psutil.Error:
            pass  # gone, or not ours to read
    return found


def _stop_processes(daemons: list[psutil.Process], grace_s: float = 10) -> None:
    """SIGTERM to every process at once, then SIGKILL to those still running
    after ``grace_s`` (a daemon exited but not reaped yet has ended:
    ownership.ended)."""
    for daemon in daemons:
        try:
            daemon.terminate()
        except psutil.Error:
            pass
    for daemon in wait_ended(daemons, grace_s):
        try:
            daemon.kill()
        except psutil.Error:
            pass


def _kill_namespace(namespace: str) -> None:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    for pid in out.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---- status -----------------------------------------------------------------


def status() -> dict | None:
    """The record, every daemon's liveness (by its PID file), and what each
    scheduler says of the nodes."""
    if not RECORD.exists():
        return None
    record = json.loads(RECORD.read_text())
    record["slurm"] = [line for line in _sinfo(client_env()).split("\n") if line]
    record["daemons"] = daemons()
    record["oar"] = _oarnodes() if (STATE / "oar").exists() else {}
    record["oar_user"] = _oar_user(record["nodes"]) if (STATE / "oar").exists() else None
    return record


def daemons() -> dict[str, bool]:
    """Each daemon the cluster started, by its PID file's name: running or not."""
    found = {}
    for pidfile in sorted([*(STATE / "run").glob("*.pid"), *(STATE / "oar" / "run").glob("*.pid")]):
        try:
            found[pidfile.stem] = not ended(psutil.Process(int(pidfile.read_text().split()[0])))
        except (ValueError, IndexError, OSError, psutil.Error):
            found[pidfile.stem] = False
    return found


def _oarnodes() -> dict[str, str]:
    """OAR's state of each node, e.g. {"host-n0": "Alive"}; {} when OAR cannot be asked."""
    out = subprocess.run(["oarnodes", "-J", "-s"], capture_output=True, text=True)
    try:
        nodes = json.loads(out.stdout) if out.returncode == 0 else {}
    except ValueError:
        return {}
    return {host: "/".join(sorted(set(ids.values()))) for host, ids in sorted(nodes.items())}


def _oar_user(nodes: list) -> str:
    out = subprocess.run([str(OAR_SCRIPT), "user"], env=oar_env(nodes), capture_output=True)
    return out.stdout.decode().strip() or "?"


def describe(record: dict) -> str:
    lines = [f"up since {record['started']}, links shaped to {record['rate_mbit']} Mbit/s"]
    for node in record["nodes"]:
        own = f", cores {node['cpus']}" if node.get("cpus") else ""
        lines.append(f"  {node['hostname']:<24} {node['address']:<15} ({node['namespace']}{own})")
    fe = record["frontend"]
    lines.append(
        f"  {fe['hostname']:<24} {fe['address']:<15} (this machine: slurmctld, OAR's server)"
    )
    lines.append(
        f"Slurm: export SLURM_CONF={record['slurm_conf']}; "
        "snakemake --profile slurm --slurm-status-command squeue ..."
    )
    lines += [f"  {line}" for line in record.get("slurm", [])]
    if record.get("oar_user"):
        lines.append(
            f"OAR: as {record['oar_user']} (OAR refuses root's jobs): runuser -u "
            f"{record['oar_user']} -- {Path(sys.executable).parent / 'snakemake'} "
            f"--profile {REPO / 'grid5000'} -d DIR ..."
        )
        lines += [f"  {host} {state}" for host, state in record.get("oar", {}).items()]
    if record.get("daemons"):
        gone = [name for name, alive in record["daemons"].items() if not alive]
        lines.append(
            f"daemons: {len(record['daemons']) - len(gone)} of {len(record['daemons'])} running"
            + (f"; gone: {', '.join(gone)}" if gone else "")
        )
    if abandoned(record):
        lines.append(
            "abandoned: none of its processes runs (ended without 'cluster down'); "
            "'./ddlc cluster down' or 'up' clears what it left"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="./ddlc cluster",
        description=__doc__.split("\n\n")[0] + "\n(docs/clusters.md)",
        epilog="\n".join(__doc__.split("\n\n")[1].splitlines()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--nodes", type=int, default=3, help="nodes, 2 or more (up; default 3)")
    p.add_argument(
        "--rate-mbit",
        type=int,
        default=1000,
        help=f"each link's rate, 1 to {MAX_RATE_MBIT} Mbit/s (up; default 1000)",
    )
    p.add_argument(
        "--cores-per-node",
        type=int,
        help="cores of its own for each node, by affinity (up; default: the nodes share them)",
    )
    args = p.parse_args(argv)
    try:
        if args.action == "up":
            started = time.monotonic()
            record = up(args.nodes, args.rate_mbit, args.cores_per_node)
            say(f"up in {time.monotonic() - started:.1f} s")
            print(describe(record))
        elif args.action == "down":
            nodes = json.loads(RECORD.read_text())["nodes"] if RECORD.exists() else []
            if not down():
                print("cluster: none was up")
                return 0
            print("cluster: down")
            say(LEFT_INSTALLED.format(user=_oar_user(nodes), state=STATE))
        else:
            found = status()
            if not found:
                print("down")
                return 3
            print(describe(found))
            return 1 if not all(found["daemons"].values()) else 0
    except (ClusterError, netem.NetworkError, OSError) as exc:
        print(f"cluster {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
