"""Where an OTF2 conversion's time goes: the C reader against the Python
after it, each stage timed inside one conversion (the readers' goals:
docs/tracing.md, "Speed and memory").

    python bench/otf2_stages.py ANCHOR [--cores N]

ANCHOR: an OTF2 anchor file, e.g. the trace ``bench/trace_read.py
--c-generated`` leaves in ~/.cache/ddl-compare/bench/. Run it twice: the
first run after writing the trace may read it from disk. Last line:
key=value pairs (seconds of wall clock per stage, events/s in all). Beside
the in-process figure, ``ddlc import ANCHOR`` timed from outside, start-up
and imports included: what a user waits for.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from measuring import (  # noqa: E402
    bench_cache,
    cli,
    holding_the_machine,
    load,
    load_fields,
    whole_line,
    whole_process,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STAGES = {
    "c_reader": "the C reader (fastotf2.read_intervals)",
    "separate_threads": "separate_threads",
    "finish_columns": "finish_columns (phases, steps, collectives, the Arrow table)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("anchor", type=Path)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cores]))
    import otf2
    import pyarrow as pa

    pa.set_cpu_count(args.cores)
    from traces import convert, fastotf2
    from traces.readers import otf2_reader
    from traces.rules import PhaseRules

    if fastotf2.library() is None:
        raise SystemExit(f"fastotf2 unavailable: {fastotf2.why_unavailable()}")
    convert.no_huge_pages()  # as ddlc import sets up its process
    convert.reuse_freed_memory()
    with otf2.reader.open(str(args.anchor)) as trace:
        events = sum(loc.number_of_events for loc in trace.definitions.locations)
    spent = dict.fromkeys(STAGES, 0.0)

    def timed(stage, fn):
        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[stage] += time.perf_counter() - started

        return wrapper

    fastotf2.read_intervals = timed("c_reader", fastotf2.read_intervals)
    otf2_reader.separate_threads = timed("separate_threads", otf2_reader.separate_threads)
    otf2_reader.finish_columns = timed("finish_columns", otf2_reader.finish_columns)
    started = time.perf_counter()
    table, _ = otf2_reader.read(args.anchor, PhaseRules(), "bench", engine="fastotf2")
    total = time.perf_counter() - started
    spent["rest"] = total - sum(spent.values())
    print(
        f"{events} events -> {table.num_rows} rows on {args.cores} core(s): {total:.2f} s, "
        f"{events / total / 1e6:.2f} M events/s; {load()}"
    )
    for stage, seconds in spent.items():
        what = STAGES.get(stage, "the rest (definitions, codes, columns)")
        print(f"  {what}: {seconds:.2f} s ({events / seconds / 1e6:.1f} M events/s)")
    out = bench_cache() / "otf2_stages-phases.parquet"
    whole = whole_process(cli("import", str(args.anchor), "-o", str(out)))
    out.unlink(missing_ok=True)
    per = f", {events / whole['wall'] / 1e6:.2f} M events/s of wall time"
    print(whole_line("ddlc import of the same archive (all cores)", whole, per))
    print(
        f"events={events} cores={args.cores} seconds={total:.3f} "
        f"whole_process_wall_s={whole['wall']:.3f} whole_process_cpu_s={whole['cpu']:.3f} "
        f"events_per_s={events / total:.0f} "
        + " ".join(f"{stage}_s={seconds:.3f}" for stage, seconds in spent.items())
        + " "
        + load_fields()
    )


if __name__ == "__main__":
    with holding_the_machine("OTF2 reader's stages"):
        main()
