"""The network's own limit: an MPI all-reduce bandwidth probe (mpi4py).

Before the runs of a scale of two processes or more, the workflow runs
``mpirun -n P python -m ddlcompare.probe`` on the same hosts: it times
MPI_Allreduce of float32 buffers at the sizes of the model's gradients (each
layer's, and the whole model's, which is what a fusion buffer or a DDP
bucket carries) and writes probe-<P>.json beside the tables. The report sets
each framework's achieved gradient-exchange bandwidth against it.

Bandwidths are reported as nccl-tests defines them: ``algbw`` = bytes /
time, ``busbw`` = algbw x 2 (P - 1) / P, the bytes each rank actually moves
in a ring all-reduce, comparable across process counts and with a link's
rate.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

FLOAT32 = 4
REPEATS = 20
WARMUP = 3


def gradient_sizes(model: str, dataset: str) -> list[int]:
    """Bytes of each layer's gradient (weights and biases) and of them all,
    from the shared model specification (no framework needed)."""
    from frameworks import data, models
    info = data.DATASETS[dataset]
    spec = models.MODELS[model]
    layers = [row["params"] * FLOAT32 for row in models.layer_shapes(spec, info.shape, info.classes)
              if row["params"]]
    return sorted({*layers, sum(layers)})


def bus_factor(processes: int) -> float:
    return 2 * (processes - 1) / processes


def measure(sizes: list[int], repeats: int = REPEATS) -> list[dict]:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rows = []
    for size in sizes:
        send = np.ones(max(1, size // FLOAT32), dtype=np.float32)
        recv = np.empty_like(send)
        times = []
        for i in range(WARMUP + repeats):
            comm.Barrier()
            start = time.perf_counter()
            comm.Allreduce(send, recv, op=MPI.SUM)
            elapsed = time.perf_counter() - start
            # the slowest rank's time is the collective's
            elapsed = comm.allreduce(elapsed, op=MPI.MAX)
            if i >= WARMUP:
                times.append(elapsed)
        seconds = float(np.median(times))
        algbw = send.nbytes / seconds
        rows.append({"bytes": int(send.nbytes), "seconds": seconds, "algbw_bytes_per_s": algbw,
                     "busbw_bytes_per_s": algbw * bus_factor(comm.size)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rows = measure(gradient_sizes(args.model, args.dataset), args.repeats)
    hosts = sorted(set(comm.allgather(MPI.Get_processor_name())))
    if comm.rank == 0:
        from ddlcompare.atomic import write_text
        doc = {"processes": comm.size, "hosts": hosts,
               "mpi": MPI.Get_library_version().splitlines()[0].rstrip("\x00"), "model": args.model,
               "dataset": args.dataset, "sizes": rows}
        write_text(Path(args.out), json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
