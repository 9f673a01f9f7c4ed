"""Critical path and delay analysis speed and memory, beside a baseline from
the same run.

    python bench/critical_path.py [--ranks 8] [--steps 10000]

Generates (numpy, in memory) a phase table shaped like a traced Horovod run:
per rank and step a ``step`` interval, data_load, h2d, forward, backward,
an exposed grad_comm that ends when the last rank arrives, optimizer, and
five bucket all-reduces with their bytes on a comm location: 8 ranks x
10,000 steps = 0.96 M intervals, with lognormal noise and a straggler rank.
Then, pinned to one core, it times analysis.critical_path.analyse with the
per-run, per-rank, per-cause and per-phase summaries, and its peak resident
memory above the process's before it (VmHWM, reset just before). Baseline:
today's bottleneck analysis of the same table (analysis.bottlenecks.per_step
and collective_wait: per-step pivot and Scalasca's wait at the collective).

It also times the merged timeline (analysis/timeline.py) of the same
table: all of it, and the default window of steps; baseline: pandas'
to_json (C) writing the same rows as flat records.

Goal: at most 10 s on one core; the timeline in a few seconds
(TIMELINE_GOAL_S, critical path included). Last line: key=value pairs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analysis import bottlenecks, critical_path, timeline  # noqa: E402
from measuring import holding_the_machine, load, load_fields  # noqa: E402

MEAN_MS = {"data_load": 4.0, "h2d": 1.0, "forward": 12.0, "backward": 24.0, "optimizer": 3.0}
BUCKETS = 5
GOAL_S = 10.0
TIMELINE_GOAL_S = 3.0  # "a few seconds" for 1 M intervals, read, analysed and written


def generate(ranks: int, steps: int, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    dur = {
        p: (rng.lognormal(0, 0.15, (steps, ranks)) * ms * 1e6).astype(np.int64)
        for p, ms in MEAN_MS.items()
    }
    dur["data_load"][:, ranks - 1] += (rng.random(steps) < 0.3) * 8_000_000  # a straggler
    pre = sum(dur[p] for p in ("data_load", "h2d", "forward", "backward"))
    comm = (rng.lognormal(0, 0.1, steps) * 5e6).astype(np.int64)
    # Step s on every rank starts when that rank leaves step s-1's optimizer.
    start = np.zeros((steps, ranks), dtype=np.int64)
    clock = np.full(ranks, 1_700_000_000_000_000_000, dtype=np.int64)
    join_end = np.zeros(steps, dtype=np.int64)
    for s in range(steps):  # one step at a time across all ranks (10,000 vector ops)
        start[s] = clock
        join_end[s] = (clock + pre[s]).max() + comm[s]
        clock = join_end[s] + dur["optimizer"][s]
    cols = {
        k: []
        for k in ("rank", "step", "phase", "start_ns", "end_ns", "location", "collective", "bytes")
    }
    rank_ix = np.broadcast_to(np.arange(ranks), (steps, ranks))
    step_ix = np.broadcast_to(np.arange(steps)[:, None], (steps, ranks))

    def add(phase, a, b, location="Master thread", collective=None, nbytes=None):
        n = a.size
        cols["rank"].append(rank_ix.ravel()), cols["step"].append(step_ix.ravel())
        cols["phase"].append(np.full(n, phase, dtype=object))
        cols["start_ns"].append(a.ravel()), cols["end_ns"].append(b.ravel())
        cols["location"].append(np.full(n, location, dtype=object))
        cols["collective"].append(np.full(n, collective, dtype=object))
        cols["bytes"].append(np.full(n, np.nan if nbytes is None else nbytes))

    t = start.copy()
    for phase in ("data_load", "h2d", "forward", "backward"):
        add(phase, t, t + dur[phase])
        if phase == "backward":  # buckets handed over during backward
            for k in range(BUCKETS):
                handed = t + dur[phase] * (k + 1) // (BUCKETS + 1)
                add(
                    "grad_comm",
                    handed,
                    np.maximum(
                        handed + 400_000,
                        join_end[:, None] if k == BUCKETS - 1 else handed + 400_000,
                    ),
                    "comm 0",
                    "allreduce",
                    4_000_000,
                )
        t = t + dur[phase]
    add("grad_comm", t, np.broadcast_to(join_end[:, None], t.shape))
    add("optimizer", join_end[:, None] + 0 * t, join_end[:, None] + dur["optimizer"])
    add("step", start, join_end[:, None] + dur["optimizer"])
    table = pd.DataFrame({k: np.concatenate(v) for k, v in cols.items()})
    return table.assign(
        run_id="bench", epoch=1, dur_ns=table["end_ns"] - table["start_ns"], source="bench"
    )


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    started = time.perf_counter()
    phases = generate(args.ranks, args.steps)
    print(f"generated {len(phases)} intervals in {time.perf_counter() - started:.1f} s", flush=True)
    runs = pd.DataFrame(
        [
            {
                "run_id": "bench",
                "status": "ok",
                "framework": "horovod-torch",
                "world_size": args.ranks,
                "batch_size": 64,
                "warmup_steps": 0,
                "setting": "batch_size 64",
            }
        ]
    )

    before = status_bytes("VmRSS")
    reset_peak()
    started = time.perf_counter()
    found = critical_path.analyse(phases, runs)
    table = critical_path.cell_table(found, runs)
    critical_path.rank_table(found), critical_path.phase_shares(found)
    seconds = time.perf_counter() - started
    peak = status_bytes("VmHWM") - before

    started = time.perf_counter()
    # It reads the phase recorder's table: the phases, without the collectives.
    recorder = phases[phases["collective"].isna() & (phases["phase"] != "step")]
    bottlenecks.collective_wait(bottlenecks.per_step(recorder, runs))
    baseline = time.perf_counter() - started

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "phases.parquet"
        phases.to_parquet(source)
        started = time.perf_counter()
        timeline.export([source], Path(tmp) / "all.json", max_intervals=len(phases))
        export_s = time.perf_counter() - started
        size = (Path(tmp) / "all.json").stat().st_size
        # Baseline: pandas' own JSON writer (C) over the same rows, flat.
        started = time.perf_counter()
        pd.read_parquet(source).to_json(Path(tmp) / "flat.json", orient="records")
        flat_s = time.perf_counter() - started
        started = time.perf_counter()
        info = timeline.export([source], Path(tmp) / "window.json")
        window_s = time.perf_counter() - started
        window_size = (Path(tmp) / "window.json").stat().st_size
        window = info["downsampled"] or {"steps": [0, args.steps - 1], "intervals": len(phases)}

    print(table["finding"].iloc[0])
    print(
        f"critical path + delay analysis: {seconds:.2f} s on one core, peak +{peak / 2**20:.0f} "
        f"MiB ({peak / len(phases):.0f} bytes/interval); goal <= {GOAL_S:.0f} s; {load()}"
    )
    print(f"baseline, today's per-step pivot and Scalasca wait: {baseline:.2f} s; {load()}")
    print(
        f"timeline of all {len(phases)} intervals (with the critical path): {export_s:.2f} s, "
        f"{size / 2**20:.0f} MiB; default window (steps {window['steps'][0]}-"
        f"{window['steps'][1]}, {window['intervals']} intervals): {window_s:.2f} s, "
        f"{window_size / 2**20:.0f} MiB; "
        f"goal <= {TIMELINE_GOAL_S:.0f} s; {load()}"
    )
    print(
        f"baseline, pandas' to_json of the same rows (flat records, no critical path): "
        f"{flat_s:.2f} s; {load()}"
    )
    print(
        f"intervals={len(phases)} ranks={args.ranks} steps={args.steps} seconds={seconds:.2f} "
        f"peak_mib={peak / 2**20:.0f} baseline_seconds={baseline:.2f} "
        f"ratio_to_baseline={seconds / baseline:.2f} goal_met={seconds <= GOAL_S} "
        f"timeline_s={export_s:.2f} timeline_mib={size / 2**20:.0f} "
        f"timeline_baseline_s={flat_s:.2f} timeline_ratio={export_s / flat_s:.2f} "
        f"timeline_window_s={window_s:.2f} timeline_window_mib={window_size / 2**20:.0f} "
        f"timeline_goal_met={export_s <= TIMELINE_GOAL_S} {load_fields()}"
    )


if __name__ == "__main__":
    with holding_the_machine("critical path"):
        main()
