"""The network's own limit: an MPI all-reduce bandwidth probe (mpi4py).

For each scale of two processes or more, the workflow runs
``python -m ddlcompare.run.probe --nodes N --procs-per-node P ...``: it finds
the hosts as a run does (schedulers.detect: the job's allocation, or the
emulated network of ddlcompare/run/netem.py when net_rate_mbit is set) and
starts itself under mpirun on them, where it times
MPI_Allreduce of float32 buffers at the sizes of the model's gradients (each
layer's, and the whole model's, which is what a fusion buffer or a DDP
bucket carries) and writes probe-<P>.json beside the tables. The report sets
each framework's achieved gradient-exchange bandwidth against it.

Bandwidths are reported as nccl-tests defines them: ``algbw`` = bytes /
time, ``busbw`` = algbw x 2 (P - 1) / P, the bytes each rank actually moves
in a ring all-reduce, comparable across process counts and with a link's
rate.

Open MPI's TCP transport is given TCP_LINKS connections per pair of
processes: with its default of one, a pair that sends both ways at once
(every all-reduce does) gets about half the link's rate in each direction,
where plain TCP streams get all of it (docs/network.md, "The probe against
the configured rate"). The probe measures the network, not that default.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOAT32 = 4
REPO = Path(__file__).resolve().parents[2]
REPEATS = 20
WARMUP = 3
# The link rate is timed on a message long enough for TCP to reach its pace
# (a 2 MB message at 100 Mbit/s is mostly slow start and handshakes).
LINK_BYTES = 16 * 2**20
LINK_REPEATS = 5
# TCP connections per pair of processes (btl_tcp_links); see the docstring.
TCP_LINKS = 4
# At 10 Mbit/s the probe moves about 200 MB: some 3-4 minutes (estimated).
TIMEOUT_S = 900
STOP_S = 20  # for mpirun to stop what it started


def gradient_sizes(model: str, dataset: str) -> list[int]:
    """Bytes of each layer's gradient (weights and biases) and of them all,
    from the shared model specification (no framework needed)."""
    from frameworks import data, models

    info = data.DATASETS[dataset]
    spec = models.MODELS[model]
    layers = [
        row["params"] * FLOAT32
        for row in models.layer_shapes(spec, info.shape, info.classes)
        if row["params"]
    ]
    return sorted({*layers, sum(layers)})


def scales(runs: list) -> dict[str, object]:
    """One probe per scale and network of two processes or more: its file
    name (probe-<nodes>x<procs>-<model>-<dataset>-<network>) and a run of
    that scale, whose job shape the probe's job takes."""
    found: dict[str, object] = {}
    for run in runs:
        c = run.config
        if run.world_size < 2:
            continue
        network = (
            "own"
            if c.get("net_rate_mbit") is None
            else f"{c['net_rate_mbit']}mbit{c.get('net_delay_ms') or 0:g}ms"
        )
        found.setdefault(
            f"probe-{c['nodes']}x{c['procs_per_node']}-{c['model']}-{c['dataset']}-{network}", run
        )
    return found


def arguments(run) -> str:
    """The probe's command-line options for a run's scale and network."""
    c = run.config
    words = [
        f"--nodes {c['nodes']}",
        f"--procs-per-node {c['procs_per_node']}",
        f"--model {c['model']}",
        f"--dataset {c['dataset']}",
    ]
    if c.get("net_rate_mbit") is not None:
        words += [
            f"--net-rate-mbit {c['net_rate_mbit']}",
            f"--net-delay-ms {c.get('net_delay_ms') or 0}",
        ]
    return " ".join(words)


def bus_factor(processes: int) -> float:
    """nccl-tests' bus bandwidth factor of a ring all-reduce."""
    return 2 * (processes - 1) / processes


def _timed(operation, repeats: int) -> float:
    """Median over ``repeats`` (after WARMUP) of the slowest rank's time."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    times = []
    for i in range(WARMUP + repeats):
        comm.Barrier()
        start = time.perf_counter()
        operation()
        elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if i >= WARMUP:
            times.append(elapsed)
    return float(np.median(times))


def link_rate(size: int, repeats: int = REPEATS) -> float:
    """Bytes per second each rank sends to the next while receiving from the
    previous (a ring of Sendrecv): the links' own rate, whatever algorithm
    MPI's all-reduce picks."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    send = np.ones(max(1, size // FLOAT32), dtype=np.float32)
    recv = np.empty_like(send)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    seconds = _timed(lambda: comm.Sendrecv(send, right, recvbuf=recv, source=left), repeats)
    return send.nbytes / seconds


def measure(sizes: list[int], repeats: int = REPEATS) -> list[dict]:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rows = []
    for size in sizes:
        send = np.ones(max(1, size // FLOAT32), dtype=np.float32)
        recv = np.empty_like(send)
        seconds = _timed(lambda: comm.Allreduce(send, recv, op=MPI.SUM), repeats)  # noqa: B023 (called at once)
        algbw = send.nbytes / seconds
        rows.append(
            {
                "bytes": int(send.nbytes),
                "seconds": seconds,
                "algbw_bytes_per_s": algbw,
                "busbw_bytes_per_s": algbw * bus_factor(comm.size),
            }
        )
    return rows


def launch(args) -> int:
    """Start the probe under mpirun on the hosts a run of this scale gets,
    inside the emulated network when there is one."""
    from ddlcompare.run import machine_lock, netem, schedulers

    config = {
        "nodes": args.nodes,
        "procs_per_node": args.procs_per_node,
        "net_rate_mbit": args.net_rate_mbit,
        "net_delay_ms": args.net_delay_ms,
        "run_id": f"probe{os.getpid()}",
    }
    with tempfile.TemporaryDirectory() as scratch, netem.network(config, Path(scratch)) as net:
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {
            **os.environ,
            **net.env,
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1",
            "PYTHONPATH": path,
        }
        scheduler, found = schedulers.detect(args.nodes, args.procs_per_node, env)
        argv = [
            "mpirun",
            "-n",
            str(args.nodes * args.procs_per_node),
            "--host",
            ",".join(f"{h.name}:{h.slots}" for h in found),
            *scheduler.mpirun_args(),
            "--mca",
            "btl_tcp_links",
            str(args.tcp_links),
            "-x",
            "PYTHONPATH",
            sys.executable,
            "-m",
            "ddlcompare.run.probe",
            "--measure",
            "--model",
            args.model,
            "--dataset",
            args.dataset,
            "--out",
            str(Path(args.out).resolve()),
            "--repeats",
            str(args.repeats),
            "--nodes",
            str(args.nodes),
            "--procs-per-node",
            str(args.procs_per_node),
        ]
        if args.net_rate_mbit:
            argv += ["--net-rate-mbit", str(args.net_rate_mbit)]
        if not scheduler.one_machine:  # the job has its nodes to itself
            return _run_or_stop(net.enter(argv), env, args.timeout)
        with machine_lock.measuring(
            f"all-reduce probe {args.out}", lambda text: print(text, file=sys.stderr, flush=True)
        ) as waited:
            held = [time.time()]
            code = _run_or_stop(net.enter(argv), env, args.timeout)
            held.append(time.time())
        if code == 0:
            _note_held(Path(args.out), held, waited)
        return code


def _note_held(out: Path, held: list[float], waited: float) -> None:
    """Add to the probe's file when it held the machine (unix seconds), as
    runs record it."""
    from ddlcompare.run import machine_lock
    from runfiles.atomic import write_text

    doc = json.loads(out.read_text())
    doc.update(
        machine_held=held,
        waited_for_machine_s=round(waited, 1),
        machine_shared=machine_lock.shared_mode(),
    )
    write_text(out, json.dumps(doc, indent=1))


def _run_or_stop(argv: list[str], env: dict, timeout: float) -> int:
    """Run mpirun; past ``timeout`` stop it with all it started. Open MPI
    with several TCP connections per pair hung here twice (8 links; 2 links
    without the put protocol), never with TCP_LINKS: a probe that hangs must
    fail, not hold the workflow."""
    with subprocess.Popen(argv, env=env, start_new_session=True) as mpirun:
        try:
            return mpirun.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            mpirun.terminate()  # mpirun stops its ranks (which have process groups of their own)
            try:
                mpirun.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(mpirun.pid, signal.SIGKILL)
                mpirun.wait()
            print(
                f"probe: no result after {timeout:g} s, stopped; rerun it with "
                "--tcp-links 1 (Open MPI's default) or a larger --timeout",
                file=sys.stderr,
            )
            return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--procs-per-node", type=int, default=2)
    parser.add_argument("--net-rate-mbit", type=int, default=None)
    parser.add_argument("--net-delay-ms", type=float, default=0)
    parser.add_argument(
        "--tcp-links",
        type=int,
        default=TCP_LINKS,
        help=f"TCP connections per pair of processes (default {TCP_LINKS}; Open MPI's is 1)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT_S,
        help=f"seconds before a hung mpirun is stopped (default {TIMEOUT_S})",
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="(under mpirun) time the all-reduces; without it, start mpirun",
    )
    args = parser.parse_args(argv)
    if not args.measure:
        return launch(args)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    sizes = gradient_sizes(args.model, args.dataset)
    rows = measure(sizes, args.repeats)
    link = link_rate(max(sizes[-1], LINK_BYTES), min(args.repeats, LINK_REPEATS))
    hosts = sorted(set(comm.allgather(MPI.Get_processor_name())))
    if comm.rank == 0:
        from runfiles.atomic import write_text

        doc = {
            "processes": comm.size,
            "nodes": args.nodes,
            "net_rate_mbit": args.net_rate_mbit,
            "hosts": hosts,
            "link_bytes_per_s": link,
            # as mpirun handed it to the ranks (1: Open MPI's default)
            "tcp_links": int(os.environ.get("OMPI_MCA_btl_tcp_links", 1)),
            "mpi": MPI.Get_library_version().splitlines()[0].rstrip("\x00"),
            "model": args.model,
            "dataset": args.dataset,
            "sizes": rows,
        }
        write_text(Path(args.out), json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
