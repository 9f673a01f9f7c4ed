"""The all-reduce probe against the emulated link's configured rate.

On two emulated nodes (ddlcompare/run/netem.py) at --rate Mbit/s, each figure
as a share of the rate:
- baseline, in the same run: plain TCP streams, one way, then both ways at
  once (one stream each way, as the two directions of an all-reduce);
- the probe (ddlcompare/run/probe.py) with Open MPI's default of one TCP
  connection per pair of processes, and with the probe's own setting
  (probe.TCP_LINKS): its Sendrecv ring (link) and its all-reduce of the
  whole model's gradients (busbw, the bytes per direction over time).
Needs root for the network namespaces; where others use the emulation too,
run it under ``flock LOCKFILE``, the lock file all of them take.

    .venv/bin/python bench/probe_network.py [--rate 100]
Last line: key=value pairs, each a share of the configured rate.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare.run import netem, probe  # noqa: E402
from measuring import holding_the_machine, load, load_fields  # noqa: E402

PORT = 5301
# Each side sends SECONDS at the rate; the receiver reads until the peer closes.
SECONDS = 3
STREAM = """
import socket, sys, time
role, address, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "receive":
    server = socket.create_server((address, int(sys.argv[4])))
    print("ready", flush=True)
    c, _ = server.accept()
    while c.recv(1 << 20):
        pass
    c.sendall(b"x")
else:
    c = socket.create_connection((address, int(sys.argv[4])))
    chunk, start = bytes(1 << 16), time.perf_counter()
    for _ in range(total // len(chunk)):
        c.sendall(chunk)
    c.shutdown(socket.SHUT_WR)
    c.recv(1)
    print(total / (time.perf_counter() - start), flush=True)
"""


def streams(net, directions: list[tuple[int, int]], rate: float) -> list[float]:
    """Plain TCP streams, all at once, one per (sender, receiver) node pair:
    each one's goodput as a share of the rate."""
    total = int(rate * SECONDS)
    receivers = []
    for i, (_, dst) in enumerate(directions):
        node = net.nodes[dst]
        argv = [sys.executable, "-c", STREAM, "receive", node.address, "0", str(PORT + i)]
        receiver = subprocess.Popen(netem.enter_node(node, argv), stdout=subprocess.PIPE, text=True)
        assert receiver.stdout.readline().strip() == "ready"
        receivers.append(receiver)
    senders = [
        subprocess.Popen(
            netem.enter_node(
                net.nodes[src],
                [
                    sys.executable,
                    "-c",
                    STREAM,
                    "send",
                    net.nodes[dst].address,
                    str(total),
                    str(PORT + i),
                ],
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, (src, dst) in enumerate(directions)
    ]
    shares = [float(s.communicate(timeout=120)[0]) / rate for s in senders]
    for receiver in receivers:
        receiver.wait(timeout=30)
    return shares


def probed(rate_mbit: int, tcp_links: int, rate: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "probe.json"
        options = f"--nodes 2 --procs-per-node 1 --net-rate-mbit {rate_mbit} --out {out}"
        if probe.main([*options.split(), "--tcp-links", str(tcp_links)]) != 0:
            raise SystemExit(f"the probe failed with --tcp-links {tcp_links}")
        doc = json.loads(out.read_text())
    return {
        "link": doc["link_bytes_per_s"] / rate,
        "allreduce": doc["sizes"][-1]["busbw_bytes_per_s"] / rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=100, help="Mbit/s (default 100)")
    args = parser.parse_args()
    rate = args.rate * 1e6 / 8  # bytes per second
    config = {"run_id": "benchprobe", "nodes": 2, "procs_per_node": 1, "net_rate_mbit": args.rate}
    with tempfile.TemporaryDirectory() as scratch, netem.network(config, Path(scratch)) as net:
        one_way = streams(net, [(0, 1)], rate)[0]
        both = min(streams(net, [(0, 1), (1, 0)], rate))
    found = {"tcp_one_way": one_way, "tcp_both_ways": both}
    for links in (1, probe.TCP_LINKS):
        for name, share in probed(args.rate, links, rate).items():
            found[f"probe_{name}_links{links}"] = share
    print(f"emulated link at {args.rate} Mbit/s, shares of the rate ({load()}):")
    for name, share in found.items():
        print(f"  {name}: {share:.0%}")
    print(" ".join([*(f"{name}={share:.3f}" for name, share in found.items()), load_fields()]))


if __name__ == "__main__":
    with holding_the_machine("network probe"):
        main()
