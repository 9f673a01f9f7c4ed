"""Where a whole ``ddlc import`` goes: CPU time and page faults, stage by
stage, in a fresh process set up as ``ddlc import`` sets up its own.

    python bench/import_ledger.py TRACE [--runs 3] [--one-at-a-time]

TRACE: an OTF2 anchor file or a folder of traces (e.g. the archive and the
Kineto folder that bench/trace_read.py and bench/trace_read_json.py leave
in ~/.cache/ddl-compare/bench/). Each run is a new process: the start-up of
Python, the imports of ``traces.convert``, the phase rules, then for each
part of the table (an OTF2 archive: a group of ranks; a folder: a file) its
reading (for OTF2: the definitions, the C reader, finish_columns) and its
Parquet write, and the exit. A stage's figures are the process's own
account (getrusage: user + system CPU of all its threads, minor page
faults) from the end of the stage before; the run of median CPU is
printed, the whole process's CPU and wall from outside beside it, with the
load. The first touch of new memory shows as page faults and system time:
a second part that reuses the first's memory faults far less. A folder's
files are read two at a time, in threads (traces/convert.py), and an OTF2
archive's next part is read while the part before is written, so a
part's figures then hold some of the next one's reading: --one-at-a-time
reads them one after the other (each stage its own).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from measuring import (
    bench_cache,
    cli,
    holding_the_machine,
    load,
    load_fields,
    median_run,
    whole_line,
    whole_process,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's packages, wherever it runs from


def child(trace: Path, out: Path, one_at_a_time: bool) -> None:
    """One conversion with its stages marked; the ledger as JSON on stdout."""
    ledger: list[list] = []
    last = [0.0, 0]

    def mark(stage: str) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu, faults = usage.ru_utime + usage.ru_stime, usage.ru_minflt
        ledger.append([stage, cpu - last[0], faults - last[1]])
        last[:] = [cpu, faults]

    mark("Python's start-up")
    from traces.loading import converter_loading

    with converter_loading():  # as ddlc import loads them
        import pyarrow.parquet as pq

        from traces import convert, fastotf2, readers
        from traces.readers import otf2_reader
        from traces.rules import PhaseRules

    mark("imports (traces.convert and what it needs)")
    convert.no_huge_pages()  # as traces.convert.main sets up its process
    convert.reuse_freed_memory()
    if one_at_a_time:
        convert.READ_AHEAD = 1
    rules = readers.checked(PhaseRules())
    mark("phase rules")

    def marked(stage: str, fn):
        def wrapper(*args, **kwargs):
            mark(before[stage])
            result = fn(*args, **kwargs)
            mark(stage)
            return result

        return wrapper

    before = {
        "C reader": "definitions and the rest before the C reader",
        "finish_columns": "between the C reader and finish_columns",
        "Parquet write": "reading the part (OTF2: what follows finish_columns)",
    }
    fastotf2.read_intervals = marked("C reader", fastotf2.read_intervals)
    otf2_reader.finish_columns = marked("finish_columns", otf2_reader.finish_columns)
    pq.ParquetWriter.write_table = marked("Parquet write", pq.ParquetWriter.write_table)
    convert.write([trace], out, rules)
    mark("closing the file")
    json.dump(ledger, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # the exit's own cost is measured from outside


def run_once(trace: Path, out: Path, one_at_a_time: bool) -> dict:
    argv = [sys.executable, __file__, "--child", str(trace), "-o", str(out)]
    argv += ["--one-at-a-time"] if one_at_a_time else []
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    return {"ledger": json.loads(done.stdout), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="a folder's files, an archive's parts, read one after the other",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("-o", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.trace, args.o, args.one_at_a_time)
    out = bench_cache() / "import_ledger-phases.parquet"
    runs = []
    for _ in range(args.runs):
        run = run_once(args.trace, out, args.one_at_a_time)
        run["cpu"] = sum(cpu for _, cpu, _ in run["ledger"])
        runs.append(run)
    run = median_run(runs)
    print(
        f"{args.trace}: the run of median CPU of {len(runs)}, stage by stage "
        f"(CPU of all threads, minor page faults); {load()}"
    )
    merged: dict[str, list] = {}  # stage -> [(cpu, faults) of each part]
    for stage, cpu, faults in run["ledger"]:
        merged.setdefault(stage, []).append((cpu, faults))
    for stage, each in merged.items():
        cpu, faults = sum(c for c, _ in each), sum(f for _, f in each)
        parts = ""
        if len(each) > 1:  # the first part touches new memory, the next reuse it
            parts = f" ({len(each)} parts: " + ", ".join(f"{c:.3f} s/{f}" for c, f in each) + ")"
        print(f"  {stage}: {cpu:.3f} s CPU, {faults} page faults{parts}")
    print(f"  in all, to the file closed: {run['cpu']:.3f} s CPU, {run['wall']:.2f} s wall")
    whole = median_run(
        [whole_process(cli("import", str(args.trace), "-o", str(out))) for _ in range(args.runs)]
    )
    out.unlink(missing_ok=True)
    print(whole_line("ddlc import of the same (the median of its runs)", whole))
    keys = {"imports (traces.convert and what it needs)": "imports", "C reader": "c_reader"}
    keys.update({"finish_columns": "finish_columns", "Parquet write": "parquet_write"})
    print(
        " ".join(f"{keys[s]}_s={sum(c for c, _ in merged[s]):.3f}" for s in keys if s in merged)
        + f" ledger_cpu_s={run['cpu']:.3f} whole_process_cpu_s={whole['cpu']:.3f} "
        + load_fields()
    )


if __name__ == "__main__":
    if "--child" in sys.argv:
        main()
    else:
        with holding_the_machine("ddlc import's stages"):
            main()
