"""Converter speed on an OTF2 trace: events/s of ``traces.convert``'s OTF2
reader against ``otf2-print`` (the C reader, writing text to /dev/null) and
against a plain loop over the ``otf2`` Python reader, on the same trace.

    python bench/convert_speed.py [--events 1000000] [--ranks 8] [--trace DIR]

Without --trace, an 8-rank trace shaped like ours (steps of phases, overlapping
collectives) is generated first. Last line: key=value pairs.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from traces.otf2_writer import write_archive  # noqa: E402
from traces.readers import otf2_reader  # noqa: E402
from traces.rules import PhaseRules  # noqa: E402

LOOP = ("data_load", "forward", "backward", "grad_comm", "optimizer")


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
                intervals.append((phase, 1, step, t, t + 900))
                if phase == "backward":
                    collectives.append(("allreduce", 4 << 20, t + 100, t + 2500))
                    collectives.append(("allreduce", 1 << 20, t + 200, t + 2600))
                t += 1000
            step_rows.append((1, step, start, t))
            t += 100
        parts.append({"rank": rank, "world": ranks, "hostname": f"node{rank // 4}",
                      "run_id": "bench", "offset_ns": 0, "intervals": intervals,
                      "steps": step_rows, "collectives": collectives})
    return parts


def count_events(anchor: Path) -> int:
    import otf2
    with otf2.reader.open(str(anchor)) as trace:
        return sum(loc.number_of_events for loc in trace.definitions.locations)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def python_loop(anchor: Path) -> None:
    import otf2
    with otf2.reader.open(str(anchor)) as trace:
        for _location, _event in trace.events:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--trace", type=Path, help="an existing OTF2 anchor file instead")
    parser.add_argument("--skip-python-loop", action="store_true")
    args = parser.parse_args()
    if shutil.which("otf2-print") is None:
        raise SystemExit("otf2-print not found: install Debian's otf2-tools (envs/setup.sh)")
    with tempfile.TemporaryDirectory() as tmp:
        anchor = args.trace
        if anchor is None:
            started = time.perf_counter()
            anchor = write_archive(synthetic_parts(args.events, args.ranks), Path(tmp) / "trace")
            print(f"generated {anchor} in {time.perf_counter() - started:.1f} s")
        events = count_events(anchor)
        rules = PhaseRules()
        convert_s = timed(lambda: otf2_reader.read(anchor, rules, "bench"))
        with open("/dev/null", "w") as sink:
            print_s = timed(lambda: subprocess.run(["otf2-print", str(anchor)], stdout=sink,
                                                   check=True))
        loop_s = None if args.skip_python_loop else timed(lambda: python_loop(anchor))
    convert_rate, print_rate = events / convert_s, events / print_s
    print(f"{events} events: converter {convert_s:.2f} s, otf2-print {print_s:.2f} s"
          + (f", plain otf2 Python loop {loop_s:.2f} s" if loop_s else ""))
    line = (f"events={events} convert_events_per_s={convert_rate:.0f} "
            f"otf2_print_events_per_s={print_rate:.0f} ratio={convert_rate / print_rate:.3f}")
    if loop_s:
        line += (f" python_loop_events_per_s={events / loop_s:.0f} "
                 f"ratio_to_python_loop={convert_rate / (events / loop_s):.2f}")
    print(line)


if __name__ == "__main__":
    main()
