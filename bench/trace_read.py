"""OTF2 -> phase table speed and memory, each beside its baseline from the same run.

    python bench/trace_read.py [--events 10000000] [--ranks 8] [--trace ANCHOR]
                               [--loop-events N] [--streamed]

On an 8-rank OTF2 trace shaped like ours (steps of phases with step/epoch
attributes, overlapping collectives with byte counts on their own locations),
written once by frameworks/otf2_writer.py and cached in
~/.cache/ddl-compare/bench/, it measures:

- the converter (traces.readers.otf2_reader with the fastotf2 C reader: OTF2
  archive -> the phase table in memory), in a fresh process pinned to one
  core, with its peak resident memory above the process's before it (VmHWM,
  reset just before);
- the same with every core this process may use: the C reader reads the
  locations in parallel threads;
- with --streamed, ``python -m traces.convert`` into a Parquet file, a group
  of ranks at a time (bounded memory; its ``target_peak_bytes`` key);
- a plain loop over the ``otf2`` Python reader's events (every event, or the
  first N with --loop-events), the baseline (``target_ratio``);
- the floor: bench/otf2_count.c, the OTF2 library reading every event of
  every location and only counting them.

Both sides are timed the same way, in-process CPU time of the reading on
one core: ours after its imports, the floor after its process started,
each reading the files from the page cache (the floor runs once untimed
first), ours in a process set up as ``ddlc import`` sets up its own
(numpy's huge pages off, freed memory reused), in ``--repeats`` pairs (the floor, then the converter), their
medians reported and each pair printed. The converter's process then reads
the archive again, into the memory the first read freed: its CPU without
the first touch of fresh pages (each a page fault, the kernel zeroing the
page), beside the first read's page faults.
The events are counted from the archive's own records by the floor (the
definitions only declare them) and must match the declared count. The
whole bench holds the host-wide measuring lock, and each figure has the
load average beside it.

Beside those in-process figures, the whole process as a user waits for it:
``ddlc import`` (python -m front.cli import) and the floor's program, each
timed from outside (wall, and the system's account of the child's user and
system CPU), start-up and imports included, in ``--repeats`` pairs; and the
import with numpy's huge-page advice left on (traces/convert.py turns it off),
and the import with each part read, then written, as on one core (it reads
part k+1 while part k is written where two cores are free). The floor reads
on one thread: the wall-time ratio sets ours on every core against it.

The goals (issues 30 and 45) and every figure measured against them, with
its commit, machine and load: docs/tracing.md, "Speed and memory". The
``goal_*`` keys this bench prints beside its figures are those goals
(``GOAL_*`` below); its ``target_*`` keys are its own first thresholds
(``TARGET_*``), not goals of an issue. Last line: key=value pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
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

LOOP = ("data_load", "forward", "backward", "grad_comm", "optimizer")
TARGET_EVENTS_PER_S = 3_000_000
TARGET_RATIO = 10
# Issue 30's and 45's goals: the reader's CPU in-process and the whole
# `ddlc import` over the floor's (both in CPU and in wall time), peak memory.
GOAL_CPU_VS_FLOOR = 2
GOAL_WHOLE_PROCESS_VS_FLOOR = 3
GOAL_BYTES_PER_EVENT = 100


def synthetic_parts(events: int, ranks: int) -> list[dict]:
    """Parts as our ranks write them; each step is 12 Enter/Leave events plus
    2 collectives of 4 records each."""
    per_step = 2 * (1 + len(LOOP)) + 2 * 4
    steps = max(1, events // (per_step * ranks))
    parts = []
    for rank in range(ranks):
        intervals, step_rows, collectives, t = [], [], [], 1_000_000 + rank * 7
        for step in range(steps):
            start = t
            for phase in LOOP:
                intervals.append((phase, 1 + step // 1000, step, t, t + 900))
                if phase == "backward":
                    collectives.append(("allreduce", 4 << 20, t + 100, t + 2500))
                    collectives.append(("allreduce", 1 << 20, t + 200, t + 2600))
                t += 1000
            step_rows.append((1 + step // 1000, step, start, t))
            t += 100
        parts.append(
            {
                "rank": rank,
                "world": ranks,
                "hostname": f"node{rank // 4}",
                "run_id": "bench",
                "offset_ns": 0,
                "intervals": intervals,
                "steps": step_rows,
                "collectives": collectives,
            }
        )
    return parts


def cached_trace(events: int, ranks: int) -> Path:
    """The generated archive, written once per size and writer version."""
    from frameworks.otf2_writer import write_archive

    digest = hashlib.sha256(
        (REPO / "frameworks" / "otf2_writer.py").read_bytes()
        + inspect.getsource(synthetic_parts).encode()
    )
    base = variables.cache_root()
    folder = base / "bench" / f"otf2-{events}ev-{ranks}r-{digest.hexdigest()[:12]}"
    anchor = folder / "trace" / "traces.otf2"
    if (folder / "complete").is_file():
        return anchor
    started = time.perf_counter()
    print(f"generating a {events}-event {ranks}-rank trace in {folder} (once)", flush=True)
    write_archive(synthetic_parts(events, ranks), folder / "trace")
    (folder / "complete").touch()
    print(f"generated in {time.perf_counter() - started:.0f} s", flush=True)
    return anchor


def c_generated_trace(events: int, ranks: int) -> Path:
    """A large archive written by bench/otf2_generate.c (built here with gcc
    against the OTF2 library): user:step > phases > MPI_Allreduce per step,
    14 events a step, once per size and generator version."""
    source = REPO / "bench" / "otf2_generate.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    folder = bench_cache() / f"otf2c-{events}ev-{ranks}r-{digest}"
    anchor = folder / "traces.otf2"
    if (folder / "complete").is_file():
        return anchor
    program = bench_cache() / f"otf2_generate-{digest}"
    if not program.is_file():
        subprocess.run(
            ["gcc", "-O2", "-o", str(program), str(source), "-lopen-trace-format2"], check=True
        )
    shutil.rmtree(folder, ignore_errors=True)
    print(f"generating a {events}-event {ranks}-rank trace in {folder} (once, in C)", flush=True)
    subprocess.run(
        [str(program), str(folder), str(ranks), str(max(1, events // (14 * ranks)))], check=True
    )
    (folder / "complete").touch()
    return anchor


def declared_events(anchor: Path) -> int:
    import otf2

    with otf2.reader.open(str(anchor)) as trace:
        return sum(loc.number_of_events for loc in trace.definitions.locations)


def floor(anchor: Path) -> tuple[int, float]:
    """(events, CPU seconds) of bench/otf2_count.c on one core: the events
    the library reads from the archive's records, and the cost of reading
    them with nothing done per event."""
    program = floor_program()
    core = str(sorted(os.sched_getaffinity(0))[0])
    out = subprocess.run(
        ["taskset", "-c", core, str(program), str(anchor)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), float(out[2])


def floor_program() -> Path:
    """bench/otf2_count.c, built once into the bench cache."""
    source = REPO / "bench" / "otf2_count.c"
    program = bench_cache() / f"otf2_count-{hashlib.sha256(source.read_bytes()).hexdigest()[:12]}"
    if not program.is_file():
        subprocess.run(
            ["gcc", "-O2", "-o", str(program), str(source), "-lopen-trace-format2"], check=True
        )
    return program


def paired_runs(anchor: Path, repeats: int) -> tuple[dict, float, list]:
    """(the converter's median run, the floor's median CPU seconds, every
    run of the converter): the
    floor and the converter one after the other, ``repeats`` times, each
    pair printed with the load (on a shared machine one run of either can
    be slowed by half; a pair sees about the same machine)."""
    floors, fasts = [], []
    for i in range(repeats):
        floors.append(floor(anchor)[1])
        fasts.append(convert_in_child(anchor))
        print(
            f"pair {i + 1}/{repeats}: the floor {floors[-1]:.3f} s CPU, the converter "
            f"{fasts[-1]['cpu']:.3f} s CPU ({fasts[-1]['cpu'] / floors[-1]:.2f}x, "
            f"{fasts[-1]['faults']} page faults; read again in the same process: "
            f"{fasts[-1]['cpu_warm']:.3f} s, {fasts[-1]['cpu_warm'] / floors[-1]:.2f}x, "
            f"{fasts[-1]['faults_warm']} faults); {load()}",
            flush=True,
        )
    by_cpu = sorted(fasts, key=lambda run: run["cpu"])
    return by_cpu[(repeats - 1) // 2], statistics.median(floors), fasts  # lower middle if even


# `ddlc import` as a user runs it, but with numpy's huge-page advice left on
# (traces/convert.py turns it off): to see what turning it off saves
WITH_HUGE_PAGES = (
    "import sys; from traces import convert; convert.no_huge_pages = lambda: None; "
    "sys.exit(convert.main(sys.argv[1:]))"
)
# `ddlc import` as a user runs it, but as on one core: each part read, then
# written (traces/convert.py reads part k+1 while part k is written where
# two cores are free): what the overlap saves in wall time, and costs in CPU
IN_TURN = (
    "import runpy, sys; from traces import memory; memory.files_at_once = lambda: 1; "
    "sys.argv[0] = 'front.cli'; runpy.run_module('front.cli', run_name='__main__')"
)


def whole_process_pairs(anchor: Path, repeats: int) -> tuple[dict, dict, dict]:
    """(the median whole `ddlc import`, the floor's median whole process,
    the median import with each part read, then written):
    both timed from outside as a user waits for them, start-up and imports
    included, one after the other ``repeats`` times; each pair, and the
    import with numpy's huge pages on, printed with the load."""
    program = floor_program()
    floors, imports, huge, in_turn = [], [], [], []
    for i in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            out = str(Path(folder) / "phases.parquet")
            floors.append(whole_process([str(program), str(anchor)]))
            imports.append(whole_process(cli("import", str(anchor), "-o", out)))
            huge.append(
                whole_process([sys.executable, "-c", WITH_HUGE_PAGES, str(anchor), "-o", out])
            )
            in_turn.append(
                whole_process([sys.executable, "-c", IN_TURN, "import", str(anchor), "-o", out])
            )
        if imports[-1]["returncode"] != 0:
            raise SystemExit(f"ddlc import failed:\n{imports[-1]['stderr'][-3000:]}")
        print(
            f"whole-process pair {i + 1}/{repeats}: the floor {floors[-1]['cpu']:.2f} s CPU, "
            f"ddlc import {imports[-1]['cpu']:.2f} s CPU "
            f"({imports[-1]['cpu'] / floors[-1]['cpu']:.2f}x; wall {imports[-1]['wall']:.2f} s "
            f"against {floors[-1]['wall']:.2f} s, {imports[-1]['wall'] / floors[-1]['wall']:.2f}x; "
            f"{imports[-1]['system']:.2f} s "
            f"system, {huge[-1]['system']:.2f} s with numpy's huge pages; each part read, "
            f"then written: {in_turn[-1]['cpu']:.2f} s CPU, {in_turn[-1]['wall']:.2f} s wall); "
            f"{load()}",
            flush=True,
        )
    whole, whole_floor, with_huge = median_run(imports), median_run(floors), median_run(huge)
    turn = median_run(in_turn)
    print(whole_line("the floor (bench/otf2_count.c)", whole_floor), flush=True)
    print(
        whole_line(
            "ddlc import (the median run)",
            whole,
            f", {whole['cpu'] / whole_floor['cpu']:.2f}x the floor's CPU, "
            f"{whole['wall'] / whole_floor['wall']:.2f}x its wall time (the floor reads on one "
            "thread; ddlc import reads on every core, a part while the one before is written)",
        ),
        flush=True,
    )
    print(whole_line("ddlc import with numpy's huge pages on", with_huge), flush=True)
    print(
        whole_line(
            "ddlc import, each part read then written (as on one core)",
            turn,
            f", {turn['cpu'] / whole_floor['cpu']:.2f}x the floor's CPU, "
            f"{turn['wall'] / whole_floor['wall']:.2f}x its wall time",
        ),
        flush=True,
    )
    return whole, whole_floor, turn


def convert_in_child(anchor: Path, cores: int = 1, streamed: bool = False) -> dict:
    """Time and peak memory of one conversion, in a fresh process."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(anchor), "--cores", str(cores)]
        + (["--streamed"] if streamed else []),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"conversion failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def child(anchor: Path, cores: int, streamed: bool) -> None:
    """``cores`` cores; the reader built, the modules imported and the
    process set up as ``ddlc import`` sets up its own (numpy's huge pages
    off, freed memory kept for reuse: traces/convert.py) before the clock
    starts."""
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:cores]))
    from traces.loading import converter_loading

    with converter_loading():  # as ddlc import loads them
        import pyarrow as pa

        from traces import convert, fastotf2
        from traces.readers import otf2_reader
        from traces.rules import PhaseRules

    pa.set_cpu_count(cores)
    convert.no_huge_pages()
    convert.reuse_freed_memory()

    if fastotf2.library() is None:
        raise SystemExit(f"fastotf2 unavailable: {fastotf2.why_unavailable()}")

    rules = PhaseRules()
    if streamed:
        with tempfile.TemporaryDirectory() as folder:
            before = reset_peak_rss()
            started = time.perf_counter()
            rows, sources, errors = convert.write(
                [anchor], Path(folder) / "phases.parquet", rules, "bench"
            )
            seconds = time.perf_counter() - started
        print(
            json.dumps(
                {
                    "seconds": seconds,
                    "rows": rows,
                    "before": before,
                    "peak": status_bytes("VmHWM"),
                    "table_bytes": 0,
                    "problems": errors,
                    "reader": sources[0].get("reader", "?"),
                }
            )
        )
        return
    before = reset_peak_rss()
    started, cpu, faults = time.perf_counter(), time.process_time(), minor_faults()
    table, problems = otf2_reader.read(anchor, rules, "bench", engine="fastotf2")
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    faults = minor_faults() - faults
    peak = status_bytes("VmHWM")
    rows, table_bytes = table.num_rows, table.nbytes
    reader = table.schema.metadata[otf2_reader.META_READER].decode()
    # Read again in the same process, into the memory the first read freed
    # (kept for reuse, as between an archive's parts): the same work
    # without the first touch of fresh pages, which the kernel zeroes one
    # by one (the first read's page faults).
    del table
    cpu_warm, faults_warm = time.process_time(), minor_faults()
    otf2_reader.read(anchor, rules, "bench", engine="fastotf2")
    cpu_warm, faults_warm = time.process_time() - cpu_warm, minor_faults() - faults_warm
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu": cpu,
                "faults": faults,
                "cpu_warm": cpu_warm,
                "faults_warm": faults_warm,
                "rows": rows,
                "before": before,
                "peak": peak,
                "table_bytes": table_bytes,
                "problems": problems,
                "reader": reader,
            }
        )
    )


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no {field} in /proc/self/status")


def reset_peak_rss() -> int:
    """The resident size now, after resetting the peak to it (ru_maxrss
    would still hold the parent's peak: it survives fork and exec)."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")


def python_loop(anchor: Path, limit: int) -> tuple[int, float]:
    """(events, seconds) of a plain loop over the otf2 Python reader; the
    OTF2 library's error lines kept off the terminal (the bindings ask for
    each location's local definitions, which bench/otf2_generate.c does
    not write: a line for each)."""
    import otf2

    from traces.readers.otf2_reader import library_lines

    seen = 0
    with library_lines() as lines:
        started = time.process_time()  # CPU, as the other figures
        with otf2.reader.open(str(anchor)) as trace:
            try:
                for _location, _event in trace.events:
                    seen += 1
                    if seen == limit:
                        break
            except Exception as exc:  # the bindings stop at records they cannot map
                stopped = exc
            else:
                stopped = None
        seconds = time.process_time() - started
    if stopped is not None:
        said = f" (the library's last line: {lines[-1]})" if lines else ""
        print(f"the otf2 Python reader stopped after {seen} events: {stopped}{said}", flush=True)
    return seen, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--trace", type=Path, help="an existing OTF2 anchor file instead")
    parser.add_argument(
        "--loop-events",
        type=int,
        default=0,
        help="time the plain Python loop on the first N events only (0: all)",
    )
    parser.add_argument(
        "--c-generated",
        action="store_true",
        help="generate the trace with bench/otf2_generate.c (for 10^7..10^9 "
        "events: the Python writer takes hours)",
    )
    parser.add_argument(
        "--streamed",
        action="store_true",
        help="also convert into a Parquet file a group of ranks at a time",
    )
    parser.add_argument(
        "--only-streamed",
        action="store_true",
        help="only the streamed conversion (a trace too large for memory)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="pairs of the floor and the converter on one core; medians are reported",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cores", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.cores, args.streamed)
    anchor = args.trace or (
        c_generated_trace(args.events, args.ranks)
        if args.c_generated
        else cached_trace(args.events, args.ranks)
    )
    with holding_the_machine(f"trace_read {anchor}"):
        measure(anchor, args)


def measure(anchor: Path, args) -> None:
    declared = declared_events(anchor)
    # the count; untimed: both sides then read the files from the page cache
    events, _ = floor(anchor)
    if events != declared:
        raise SystemExit(
            f"{anchor}: its definitions declare {declared} events, its records hold {events} "
            "(counted by the OTF2 library): fix the writer before timing anything"
        )
    if args.only_streamed:
        streamed = convert_in_child(anchor, len(os.sched_getaffinity(0)), streamed=True)
        peak = streamed["peak"] - streamed["before"]
        print(
            f"{events} events -> {streamed['rows']} rows into Parquet, a group of ranks at a "
            f"time: {streamed['seconds']:.1f} s, peak memory +{peak / 2**20:.0f} MiB; {load()}"
        )
        print(
            f"events={events} rows={streamed['rows']} streamed_seconds="
            f"{streamed['seconds']:.1f} streamed_peak_bytes={peak} "
            f"streamed_events_per_s={events / streamed['seconds']:.0f} "
            f"target_peak_bytes={2 << 30} {load_fields()}"
        )
        return
    fast, floor_cpu, runs = paired_runs(anchor, args.repeats)
    print(
        f"{events} events (the definitions' count, matched by the OTF2 library's own reading); "
        f"the floor, the library reading them and only counting: {floor_cpu:.2f} s CPU "
        f"(median), {events / floor_cpu / 1e6:.2f} M events/s on one core; {load()}",
        flush=True,
    )
    fast_rate = events / fast["cpu"]
    warm_cpu = statistics.median(run["cpu_warm"] for run in runs)
    per_event = (fast["peak"] - fast["before"]) / events
    print(
        f"{events} events -> {fast['rows']} rows ({fast['reader']}): {fast['cpu']:.2f} s CPU "
        "(the median run) "
        f"({fast['seconds']:.2f} s wall), {fast_rate / 1e6:.2f} M events/s on one core, "
        f"{fast['cpu'] / floor_cpu:.2f}x the floor's CPU; peak memory "
        f"+{(fast['peak'] - fast['before']) / 2**20:.0f} MiB = {per_event:.1f} B/event "
        f"(the table itself: {fast['table_bytes'] / events:.1f} B/event; the process set up as "
        f"ddlc import's); read again in the same process, into the memory the first read "
        f"freed: {warm_cpu:.2f} s CPU (the median), {warm_cpu / floor_cpu:.2f}x the floor's: "
        f"the rest is the first touch of fresh memory, {fast['faults']} page faults; {load()}",
        flush=True,
    )
    whole, whole_floor, in_turn = whole_process_pairs(anchor, args.repeats)
    cores = len(os.sched_getaffinity(0))
    parallel = convert_in_child(anchor, cores)
    parallel_rate = events / parallel["seconds"]
    print(
        f"the same on {cores} cores (locations read in parallel): "
        f"{parallel['seconds']:.2f} s wall, {parallel_rate / 1e6:.2f} M events/s; {load()}",
        flush=True,
    )
    streamed_peak = 0
    if args.streamed:
        streamed = convert_in_child(anchor, cores, streamed=True)
        streamed_peak = streamed["peak"] - streamed["before"]
        print(
            f"traces.convert into Parquet, a group of ranks at a time: "
            f"{streamed['seconds']:.2f} s, peak memory +{streamed_peak / 2**20:.0f} MiB "
            f"({streamed['rows']} rows); {load()}",
            flush=True,
        )
    looped, loop_s = python_loop(anchor, args.loop_events)
    loop_rate = looped / loop_s
    print(
        f"plain otf2 Python loop: {looped} events in {loop_s:.1f} s, "
        f"{loop_rate / 1e6:.3f} M events/s; {load()}",
        flush=True,
    )
    print(
        f"events={events} rows={fast['rows']} fast_events_per_s={fast_rate:.0f} "
        f"parallel_events_per_s={parallel_rate:.0f} cores={cores} "
        f"streamed_peak_bytes={streamed_peak} "
        f"python_loop_events_per_s={loop_rate:.0f} ratio_to_python_loop={fast_rate / loop_rate:.1f} "
        f"floor_events_per_s={events / floor_cpu:.0f} "
        f"whole_process_cpu_s={whole['cpu']:.2f} whole_process_floor_cpu_s={whole_floor['cpu']:.2f} "
        f"whole_process_ratio={whole['cpu'] / whole_floor['cpu']:.2f} "
        f"whole_process_wall_s={whole['wall']:.2f} "
        f"whole_process_floor_wall_s={whole_floor['wall']:.2f} "
        f"whole_process_wall_ratio={whole['wall'] / whole_floor['wall']:.2f} "
        f"in_turn_cpu_s={in_turn['cpu']:.2f} in_turn_wall_s={in_turn['wall']:.2f} "
        f"cpu_vs_floor={fast['cpu'] / floor_cpu:.2f} timing=in-process-cpu "
        f"page_faults={fast['faults']} cpu_vs_floor_read_again={warm_cpu / floor_cpu:.2f} "
        f"repeats={args.repeats} "
        f"peak_bytes_per_event={per_event:.1f} target_events_per_s={TARGET_EVENTS_PER_S} "
        f"target_ratio={TARGET_RATIO} goal_cpu_vs_floor={GOAL_CPU_VS_FLOOR} "
        f"goal_whole_process_vs_floor={GOAL_WHOLE_PROCESS_VS_FLOOR} "
        f"goal_bytes_per_event={GOAL_BYTES_PER_EVENT} {load_fields()}"
    )


if __name__ == "__main__":
    main()
