"""PyTorch profiler (Kineto) JSON and Horovod Timeline -> phase table: speed
and memory, beside the same reader without its C parts and (Kineto) HTA's own loader on the
same folder in the same run.

    python bench/trace_read_json.py [--events 5000000] [--ranks 8]
                                    [--hta-python .venv-hta/bin/python]
    python bench/trace_read_json.py --format horovod [--events 5000000]

A multi-rank Kineto trace shaped like real ones (5 ProfilerSteps a rank, as
torch.profiler's schedule records, more layers for more events; DataLoader,
DDP forward with nested aten ops, autograd's backward thread, CUDA runtime
launches and their kernels linked by correlation, NCCL collectives as
c10d call > record_param_comms > nccl:all_reduce > kernel, HTA-style
annotations, flow and instant events, metadata) is generated once per size
into ~/.cache/ddl-compare/bench/, one uncompressed file per rank.

- ours: traces.convert over the folder (every rank's file -> one phase
  table in memory), in a fresh process pinned to one core; peak resident
  memory above the process's before it (VmHWM, reset just before);
- msgspec alone, as baseline: the same with ``DDLC_JSON_SCANNER=msgspec``
  (no C scanner nor C nesting: msgspec's typed records, then numpy), which
  is also what runs where no C compiler is;
- HTA (Kineto only: it has no Horovod Timeline loader), on the very same
  folder: ``TraceAnalysis(trace_dir=...)`` from ``holistictraceanalysis``,
  installed in a separate virtual environment (it pins its own pandas and
  numpy), in a fresh process pinned to the same one core; its peak is the
  larger of its own and its parsing workers'.

- the whole process, as a user waits for it: ``ddlc import`` of the folder
  (python -m front.cli import), timed from outside, start-up and imports
  included (events per second of its CPU, and of its wall time), and the
  same with the folder's files read one at a time (``ddlc import`` reads
  two at once, in threads: more CPU, less wall time where a core is free);
- beside each of those whole runs, a fixed reference: a fresh Python that
  reads the same files and hashes them (SHA-256, two at a time, in threads),
  code that no change of ours touches. This machine's speed drifts by a
  fifth within minutes; the reference drifts with it, so the whole import's
  wall time over the reference's, run by run, says what the goal figure
  would read at the reference's usual speed (docs/tracing.md gives it);
- the refusal of a 1 GiB JSON file that is no trace, of each kind of
  NOT_TRACES, ``ddlc import`` whole process.

The goals (issues 30 and 45) and every figure measured against them, with
its commit, machine and load: docs/tracing.md, "Speed and memory"; the
``goal_*`` keys this bench prints beside its figures are those goals
(``GOAL_*`` below). Rates are
events per second of CPU time in-process (the child's and its workers',
imports excluded), for every tool alike: on a shared, loaded machine the
wall clock also counts the time spent waiting for the core. The bench
holds the host-wide measuring lock; each figure has the load beside it.
Last line: key=value pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from measuring import (  # noqa: E402
    bench_cache,
    cli,
    holding_the_machine,
    load,
    load_fields,
    median_run,
    whole_line,
    whole_process,
)
from runfiles import variables  # noqa: E402

# The goals: issue 30's for the reader in-process (events/s of one core's
# CPU, peak memory over the files, against HTA), issue 45's for the whole
# process as a user waits for it (events/s of wall time, the refusal).
GOAL_EVENTS_PER_S = 2_000_000
GOAL_PEAK_VS_FILE = 1.5
GOAL_VS_HTA = 10
GOAL_WHOLE_PROCESS_EVENTS_PER_WALL_S = 2_000_000
GOAL_REFUSAL_S = 1.0
LAYERS = ("conv1", "bn1", "relu", "conv2", "bn2", "fc")


def rank_events(rank: int, ranks: int, steps: int, layers: tuple = LAYERS):
    """The trace events of one rank, as JSON text lines (what torch.profiler
    writes, less the fields no reader uses); a step's forward and backward
    run over ``layers``."""
    pid, main, autograd, stream = 1000 + rank, 11, 12, 7
    corr = ext = 0
    t = 1_700_000_000_000.0 + rank * 3.7

    def x(cat, name, tid, ts, dur, args=None, p=pid):
        extra = f', "args": {json.dumps(args)}' if args else ""
        return (
            f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {p}, "tid": {tid}, '
            f'"ts": {ts:.3f}, "dur": {dur:.3f}{extra}}}'
        )

    yield (
        f'{{"name": "process_name", "ph": "M", "pid": {pid}, "tid": 0, '
        f'"args": {{"name": "python {pid}"}}}}'
    )
    yield (
        f'{{"name": "thread_name", "ph": "M", "pid": {pid}, "tid": {main}, '
        f'"args": {{"name": "thread {main} (python)"}}}}'
    )
    for step in range(steps):
        start = t
        length = 1100 + 900 * len(layers)
        yield x("user_annotation", f"ProfilerStep#{step}", main, t, length - 100)
        yield x("user_annotation", "## data_load ##", main, t + 1, 500)
        yield x(
            "user_annotation",
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            main,
            t + 2,
            490,
        )
        t += 510
        yield x("cpu_op", "DistributedDataParallel.forward", main, t, 2400)
        for i, layer in enumerate(layers):
            at = t + 10 + i * 390
            yield x("cpu_op", f"nn.Module: {layer}", main, at, 380)
            yield x("cpu_op", "aten::conv2d", main, at + 5, 300)
            corr += 1
            ext += 1
            yield x(
                "cuda_runtime",
                "cudaLaunchKernel",
                main,
                at + 10,
                20,
                {"correlation": corr, "External id": ext},
            )
            yield x(
                "kernel",
                f"void forward_kernel_{layer}<float>",
                stream,
                at + 40,
                200,
                {"correlation": corr, "External id": ext, "stream": stream},
                p=0,
            )
            yield (
                f'{{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {main}, "ts": {at + 10:.3f}, '
                f'"cat": "ac2g", "name": "ac2g"}}'
            )
            yield (
                f'{{"ph": "f", "id": {corr}, "pid": 0, "tid": {stream}, "ts": {at + 40:.3f}, '
                f'"cat": "ac2g", "name": "ac2g", "bp": "e"}}'
            )
        t += 10 + 390 * len(layers)
        yield x("cpu_op", "Optimizer.zero_grad#SGD.zero_grad", main, t, 50)
        t += 60
        for i, layer in enumerate(reversed(layers)):
            at = t + i * 500
            yield x(
                "cpu_op",
                f"autograd::engine::evaluate_function: {layer}Backward0",
                autograd,
                at,
                450,
            )
            yield x("cpu_op", f"{layer}Backward0", autograd, at + 5, 400)
            corr += 1
            yield x(
                "cuda_runtime", "cudaLaunchKernel", autograd, at + 10, 20, {"correlation": corr}
            )
            yield x(
                "kernel",
                f"void backward_kernel_{layer}<float>",
                stream,
                at + 40,
                300,
                {"correlation": corr, "stream": stream},
                p=0,
            )
            if i % 2 == 1:  # a gradient bucket's all-reduce
                elems = 1_000_000 + i
                yield x("cpu_op", "c10d::allreduce_", autograd, at + 410, 36)
                yield x(
                    "cpu_op",
                    "record_param_comms",
                    autograd,
                    at + 411,
                    34,
                    {
                        "Collective name": "allreduce",
                        "In msg nelems": elems,
                        "Out msg nelems": elems,
                        "dtype": "Float",
                        "Group size": ranks,
                    },
                )
                yield x("user_annotation", "nccl:all_reduce", autograd, at + 412, 32)
                corr += 1
                yield x(
                    "cuda_runtime",
                    "cudaLaunchKernel",
                    autograd,
                    at + 413,
                    20,
                    {"correlation": corr},
                )
                yield x(
                    "kernel",
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)",
                    stream + 1,
                    at + 420,
                    900,
                    {
                        "correlation": corr,
                        "Collective name": "allreduce",
                        "In msg nelems": elems,
                        "dtype": "Float",
                    },
                    p=0,
                )
        t += 500 * len(layers) + 100
        yield x("cpu_op", "Optimizer.step#SGD.step", main, t, 400)
        yield x("cpu_op", "aten::add_", main, t + 10, 100)
        yield (
            f'{{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": {pid}, '
            f'"tid": {main}, "ts": {t + 5:.3f}, "s": "t", "args": {{"Bytes": 4096}}}}'
        )
        t = start + length


def write_rank(path: Path, rank: int, ranks: int, steps: int, layers: tuple = LAYERS) -> int:
    """One rank's file; returns its number of events."""
    tmp = path.with_suffix(".tmp")
    n = 0
    with open(tmp, "w") as f:
        f.write(
            '{\n  "schemaVersion": 1,\n  "distributedInfo": '
            f'{{"backend": "nccl", "rank": {rank}, "world_size": {ranks}}},\n'
            '  "deviceProperties": [],\n  "traceEvents": [\n'
        )
        for i, line in enumerate(rank_events(rank, ranks, steps, layers)):
            f.write(("  " if i == 0 else ",\n  ") + line)
            n += 1
        f.write('\n  ],\n  "traceName": "bench"\n}\n')
    tmp.replace(path)
    return n


def events_per_layer() -> int:
    """Events a layer adds to a step (forward and backward, a bucket's
    all-reduce every other layer, on average)."""
    two = sum(1 for _ in rank_events(0, 1, 1, ("a", "b")))
    four = sum(1 for _ in rank_events(0, 1, 1, ("a", "b", "c", "d")))
    return (four - two) // 2


# ProfilerSteps a rank's trace holds: torch.profiler's schedule records a
# few active steps (HTA's cost grows with their number, so a trace of
# thousands of tiny steps would misstate it); a larger trace has larger
# steps, as a larger model's do.
STEPS = 5


GRADIENTS = tuple(f"{layer}.{part}" for layer in LAYERS for part in ("weight", "bias")) * 2
TICKED_STEPS = 3  # steps before Horovod's response cache stops the negotiation ticks


def timeline_records(ranks: int, steps: int):
    """A Horovod Timeline's records (what rank 0 writes), as JSON text."""
    t = 546_174_382_480
    for pid, tensor in enumerate(GRADIENTS, start=1):
        name = f"DistributedOptimizer_Allreduce/{tensor}_{pid}"
        yield f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": "{name}"}}}}'
        yield f'{{"name": "process_sort_index", "ph": "M", "pid": {pid}, "args": {{"sort_index": {pid}}}}}'
        yield f'{{"ph": "B", "name": "NEGOTIATE_BROADCAST", "ts": {t}, "pid": {pid}}}'
        yield f'{{"ph": "E", "ts": {t + 3}, "pid": {pid}}}'
        yield f'{{"ph": "B", "name": "BROADCAST", "ts": {t + 4}, "pid": {pid}}}'
        yield f'{{"ph": "E", "ts": {t + 40}, "pid": {pid}, "args": {{"dtype": "float32", "shape": "[64, 32]"}}}}'
        t += 50
    for step in range(steps):
        yield f'{{"ph": "i", "name": "CYCLE_START", "ts": {t}, "s": "g"}}'
        for pid, tensor in enumerate(GRADIENTS, start=1):
            shape = "[64, 32, 3, 3]" if tensor.endswith("weight") else "[64]"
            yield f'{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": {t + 1}, "pid": {pid}}}'
            if step < TICKED_STEPS:
                for rank in range(ranks):
                    yield f'{{"ph": "X", "name": "{rank}", "ts": {t + 2 + rank}, "pid": {pid}, "dur": 0}}'
            t += ranks + 3
            yield f'{{"ph": "E", "ts": {t}, "pid": {pid}}}'
            yield f'{{"ph": "B", "name": "ALLREDUCE", "ts": {t + 1}, "pid": {pid}}}'
            for i, activity in enumerate(
                ("MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER")
            ):
                yield f'{{"ph": "B", "name": "{activity}", "ts": {t + 2 + 30 * i}, "pid": {pid}}}'
                yield f'{{"ph": "E", "ts": {t + 30 + 30 * i}, "pid": {pid}}}'
            t += 95
            yield f'{{"ph": "E", "ts": {t}, "pid": {pid}, "args": {{"dtype": "float32", "shape": "{shape}"}}}}'
            if pid % 8 == 0:
                yield f'{{"ph": "i", "name": "CYCLE_START", "ts": {t + 1}, "s": "g"}}'
        t += 2000


def write_timeline(path: Path, ranks: int, steps: int) -> None:
    """A Horovod Timeline file: one record a line, the array left open."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write("[\n")
        for line in timeline_records(ranks, steps):
            f.write(line + ",\n")
    tmp.replace(path)


def cached_trace(events: int, ranks: int, form: str = "kineto") -> Path:
    """The folder of a generated trace of about ``events`` events, made once."""
    writers = (
        (rank_events, write_rank, cached_trace)
        if form == "kineto"
        else (timeline_records, write_timeline)
    )
    digest = hashlib.sha256(b"".join(inspect.getsource(f).encode() for f in writers))
    base = variables.cache_root()
    folder = base / "bench" / f"{form}-{events}ev-{ranks}r-{digest.hexdigest()[:12]}"
    if (folder / "complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    print(
        f"generating a {ranks}-rank {form} trace of about {events} events in {folder} (once)",
        flush=True,
    )
    if form == "kineto":
        count = max(2, events // (events_per_layer() * STEPS * ranks))
        layers = tuple(f"layer{i}" for i in range(count))
        for rank in range(ranks):
            write_rank(folder / f"rank-{rank}.json", rank, ranks, STEPS, layers)
    else:
        per_step = 1 + len(GRADIENTS) * 10 + len(GRADIENTS) // 8
        write_timeline(folder / "horovod_timeline.json", ranks, max(1, events // per_step))
    (folder / "complete").touch()
    return folder


def trace_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("rank-*.json")) or [folder / "horovod_timeline.json"]


def count_events(folder: Path) -> int:
    """Independent count: the records of every rank's traceEvents list, or
    of the Timeline's array (closed here, as Horovod does not)."""
    if (folder / "horovod_timeline.json").is_file():
        text = (folder / "horovod_timeline.json").read_text().rstrip().rstrip(",")
        return len(json.loads(text + "]"))
    return sum(len(json.loads(p.read_bytes())["traceEvents"]) for p in trace_files(folder))


# The fixed reference run beside each whole import: the files read and
# hashed, two at a time (hashlib lets go of the GIL), as the import reads
# them; code of the standard library only, which no change of ours touches.
REFERENCE = (
    "import hashlib, sys; from concurrent.futures import ThreadPoolExecutor\n"
    "def digest(path):\n"
    "    with open(path, 'rb') as f:\n"
    "        return hashlib.sha256(f.read()).hexdigest()\n"
    "with ThreadPoolExecutor(2) as pool:\n"
    "    print(len(list(pool.map(digest, sys.argv[1:]))))"
)

# `ddlc import` as a user runs it, but with a folder's files read one after
# the other (traces/convert.py reads two at once)
ONE_AT_A_TIME = (
    "import sys; from traces import convert; convert.READ_AHEAD = 1; "
    "sys.exit(convert.main(sys.argv[1:]))"
)


def run_child(python: str, args: list[str], env: dict | None = None) -> dict:
    core = str(sorted(os.sched_getaffinity(0))[0])
    done = subprocess.run(
        ["taskset", "-c", core, python, __file__, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise SystemExit(f"{python} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def ours(folder: Path) -> None:
    """In the child: our converter over the folder, on one core."""
    import pyarrow as pa

    pa.set_cpu_count(1)
    from trace_read import reset_peak_rss, status_bytes
    from traces import convert, fastjson, readers
    from traces.rules import PhaseRules

    rules = PhaseRules()
    readers.readers()  # the readers' modules imported before the clock starts
    fastjson.library()  # and the C scanner built, if it is to be used
    before = reset_peak_rss()
    started, cpu = time.perf_counter(), cpu_seconds()
    table, _, errors = convert.convert([folder], rules, "bench")
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "cpu": cpu_seconds() - cpu,
                "rows": table.num_rows,
                "errors": errors,
                "peak": status_bytes("VmHWM") - before,
            }
        )
    )


def cpu_seconds() -> float:
    """CPU time of this process and its finished children: on a loaded
    machine, the time it had the core, not the time it waited for it."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def hta(folder: Path) -> None:
    """In the child (HTA's environment): TraceAnalysis over the folder. Its
    peak is the largest resident size of this process and its parsing
    workers together, sampled every 20 ms (ru_maxrss would carry the
    parent's peak over fork and exec)."""
    import threading

    before = tree_rss(os.getpid())
    peak = [before]

    def sample():
        while True:
            peak[0] = max(peak[0], tree_rss(os.getpid()))
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    from hta.trace_analysis import TraceAnalysis

    started, cpu = time.perf_counter(), cpu_seconds()
    analysis = TraceAnalysis(trace_dir=str(folder))
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    rows = sum(len(analysis.t.get_trace(r)) for r in analysis.t.get_all_traces())
    print(json.dumps({"seconds": seconds, "cpu": cpu, "rows": rows, "peak": peak[0] - before}))


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants (0 once gone)."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
        total = int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
        children = [
            int(c)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()
        ]
    except (OSError, ValueError):
        return 0
    return total + sum(tree_rss(child) for child in children)


def summary(who: str, result: dict, events: int, size: int) -> str:
    return (
        f"{who}: {events} events ({size / 2**20:.0f} MiB of JSON) -> {result['rows']} rows "
        f"in {result['cpu']:.2f} s of CPU ({result['seconds']:.2f} s wall), "
        f"{events / result['cpu'] / 1e6:.3f} M events/s on one core; peak "
        f"+{result['peak'] / 2**20:.0f} MiB = {result['peak'] / size:.2f}x the files; {load()}"
    )


def steps_of(folder: Path) -> int:
    """ProfilerSteps of the first rank's file, counted in its text."""
    return trace_files(folder)[0].read_text().count('"name": "ProfilerStep#')


# The two kinds of JSON that is no trace, each 1 GiB: a PyTorch execution
# trace (refused on its first key), and a document opening with a key a trace
# may open with, "metadata" (a model's safetensors index), whose value runs
# past the bytes read for its events array (traces/readers WALK_LIMIT).
NOT_TRACES = {
    "execution-trace": "a sparse file that opens like a PyTorch execution trace",
    "metadata": 'one that opens with "metadata" and holds no events array',
}


def not_a_trace(kind: str) -> Path:
    """The 1 GiB file of ``kind`` (NOT_TRACES), made once in the bench cache."""
    path = bench_cache() / (
        "not-a-trace-1gib.json" if kind == "execution-trace" else f"not-a-trace-{kind}-1gib.json"
    )
    if path.is_file() and path.stat().st_size == 1 << 30:
        return path
    with path.open("wb") as f:
        if kind == "execution-trace":
            f.write(b'{"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": [')
            f.truncate(1 << 30)
            return path
        f.write(b'{"metadata": {"numbers": [')
        numbers = b",".join(b"%d.25" % k for k in range(1 << 16)) + b","
        while f.tell() + len(numbers) < (1 << 30) - 4:
            f.write(numbers)
        f.write(b"0" + b" " * ((1 << 30) - 4 - f.tell()) + b"]}}")  # valid JSON, whole
    return path


def refused_in(kind: str) -> dict:
    """``ddlc import`` of a 1 GiB JSON file of ``kind`` that is no trace,
    whole process (printed)."""
    path = not_a_trace(kind)
    out = bench_cache() / "not-a-trace.parquet"
    run = whole_process(cli("import", str(path), "-o", str(out)))
    out.unlink(missing_ok=True)
    if run["returncode"] == 0 or "not a trace" not in run["stderr"]:
        raise SystemExit(f"{path}: not refused as no trace:\n{run['stderr'][-2000:]}")
    print(
        whole_line(
            f"ddlc import refusing a 1 GiB JSON file that is no trace, {NOT_TRACES[kind]}", run
        ),
        flush=True,
    )
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=("kineto", "horovod"), default="kineto")
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument(
        "--hta-python",
        default=str(REPO / ".venv-hta" / "bin" / "python"),
        help="a Python with holistictraceanalysis installed",
    )
    parser.add_argument(
        "--whole-runs",
        type=int,
        default=5,
        help="runs of each whole ddlc import, in turn; the run of median CPU is reported "
        "(one run is as likely to be the slowest as the typical)",
    )
    parser.add_argument("--child", choices=("ours", "hta"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return {"ours": ours, "hta": hta}[args.child](args.folder)
    folder = cached_trace(args.events, args.ranks, args.format)
    if args.format == "kineto" and not Path(args.hta_python).is_file():
        raise SystemExit(
            f"{args.hta_python}: no such Python; install HTA in a venv of its own:"
            " python3 -m venv .venv-hta && .venv-hta/bin/pip install "
            "holistictraceanalysis"
        )
    with holding_the_machine(f"trace_read_json {folder}"):
        measure(folder, args)


def measure(folder: Path, args) -> None:
    events = count_events(folder)
    size = sum(p.stat().st_size for p in trace_files(folder))
    child = ["--child", "ours", "--folder", str(folder)]
    if args.format == "kineto":
        print(
            f"{events} events, {steps_of(folder)} ProfilerSteps a rank; every tool reads this "
            "same folder, timed the same way: in-process CPU on one core, imports excluded"
        )
    mine = run_child(sys.executable, child)
    rate = events / mine["cpu"]
    print(
        summary(f"this reader, {args.format}, {args.ranks} ranks", mine, events, size), flush=True
    )
    out = bench_cache() / "trace_read_json-phases.parquet"
    # the same with the files read one at a time (traces/convert.py reads
    # two at once, in threads): what that costs in CPU and saves in wall time;
    # and the fixed reference: the three in turn, so that a drift of the
    # machine's speed falls on all
    together = cli("import", str(folder), "-o", str(out))
    one_at_a_time = [sys.executable, "-c", ONE_AT_A_TIME, str(folder), "-o", str(out)]
    reference = [sys.executable, "-c", REFERENCE, *map(str, trace_files(folder))]
    runs = [
        (whole_process(together), whole_process(one_at_a_time), whole_process(reference))
        for _ in range(args.whole_runs)
    ]
    whole = median_run([run for run, _, _ in runs])
    one_by_one = median_run([run for _, run, _ in runs])
    fixed = median_run([run for _, _, run in runs])
    out.unlink(missing_ok=True)
    if failed := [run for trio in runs for run in trio if run["returncode"] != 0]:
        raise SystemExit(f"a whole run failed:\n{failed[0]['stderr'][-3000:]}")
    for what, run in (("", whole), (", its files read one at a time", one_by_one)):
        what += f" (the run of median CPU of {args.whole_runs})"
        per = (
            f", {events / run['cpu'] / 1e6:.2f} M events/s of CPU, "
            f"{events / run['wall'] / 1e6:.2f} M events/s of wall time"
        )
        print(whole_line(f"ddlc import of the {args.format} folder{what}", run, per), flush=True)
    print(whole_line("the fixed reference (its files read and hashed)", fixed), flush=True)
    vs_reference = sorted(run["wall"] / ref["wall"] for run, _, ref in runs)
    print(
        f"ddlc import's wall time over the reference's beside it, run by run: median "
        f"{statistics.median(vs_reference):.3f} (min {vs_reference[0]:.3f}, max "
        f"{vs_reference[-1]:.3f})",
        flush=True,
    )
    refusal = refused_in("execution-trace")
    refusal_metadata = refused_in("metadata")
    before = run_child(sys.executable, child, {"DDLC_JSON_SCANNER": "msgspec"})
    print(summary("msgspec alone", before, events, size), flush=True)
    figures = (
        f"events={events} events_per_s={rate:.0f} "
        f"before_events_per_s={events / before['cpu']:.0f} "
        f"ratio_vs_before={before['cpu'] / mine['cpu']:.2f} "
        f"peak_bytes_per_event={mine['peak'] / events:.1f} "
        f"file_bytes_per_event={size / events:.1f} peak_vs_file={mine['peak'] / size:.2f} "
        f"before_peak_bytes_per_event={before['peak'] / events:.1f} "
        f"goal_events_per_s={GOAL_EVENTS_PER_S} goal_peak_vs_file={GOAL_PEAK_VS_FILE} "
        f"whole_process_events_per_cpu_s={events / whole['cpu']:.0f} "
        f"whole_process_events_per_wall_s={events / whole['wall']:.0f} "
        f"goal_whole_process_events_per_wall_s={GOAL_WHOLE_PROCESS_EVENTS_PER_WALL_S} "
        f"one_at_a_time_events_per_cpu_s={events / one_by_one['cpu']:.0f} "
        f"one_at_a_time_events_per_wall_s={events / one_by_one['wall']:.0f} "
        f"reference_wall_s={fixed['wall']:.3f} reference_cpu_s={fixed['cpu']:.3f} "
        f"whole_process_wall_vs_reference={statistics.median(vs_reference):.3f} "
        f"refusal_1gib_wall_s={refusal['wall']:.2f} "
        f"refusal_metadata_1gib_wall_s={refusal_metadata['wall']:.2f} "
        f"goal_refusal_1gib_wall_s={GOAL_REFUSAL_S} "
        f"timing=in-process-cpu {load_fields()}"
    )
    if args.format == "horovod":
        print(f"format=horovod {figures}")  # HTA has no Horovod Timeline loader
        return
    theirs = run_child(args.hta_python, ["--child", "hta", "--folder", str(folder)])
    hta_rate = events / theirs["cpu"]
    print(summary("HTA TraceAnalysis", theirs, events, size), flush=True)
    print(
        f"format=kineto {figures} hta_events_per_s={hta_rate:.0f} "
        f"ratio_vs_hta={rate / hta_rate:.1f} goal_ratio_vs_hta={GOAL_VS_HTA} "
        f"hta_peak_bytes_per_event={theirs['peak'] / events:.1f}"
    )


if __name__ == "__main__":
    main()
