"""What else the machine did while a run measured.

The runner samples the machine about once a second while its training
runs: the CPU time every process spent (the kernel's /proc/stat, which
counts processes too short-lived to be seen), the CPU time of the run's own
processes (the runner, its descendants and its launcher's session:
machine_lock.attempt_processes), each other process's CPU time, and the
1-minute load average. Over the run's measured steps (from the first step
after warm-up to the last, on the steps files' clock) that gives:

- ``foreign_cpu_share``: CPU time of processes not the run's, as a share of
  the machine's (window x cores);
- ``busiest_foreign``: the processes that took most of it;
- ``loaded``: true when ``foreign_cpu_share`` reaches ``LOADED_SHARE``:
  the run was measured beside heavy foreign load, so its figures are not
  clean (the runs table and the report say so per cell).

run.json keeps it all under ``machine_load``.
"""

from __future__ import annotations

import csv
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from runfiles.names import steps as steps_file
from ddlcompare.run import machine_lock

# A quarter of the machine's CPU time, spent by others while the run
# measured: on 2 cores, half a core busy all along (one busy loop beside a
# run of 2 ranks takes about a third of the machine).
LOADED_SHARE = 0.25
BUSIEST = 5
RECORD = "machine_load"


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


@dataclass
class Interval:
    """One sampling interval: its bounds (perf_counter ns), the CPU seconds
    the machine, the run and each other process spent in it, and the load."""

    start: int
    end: int
    busy: float
    own: float
    others: dict[tuple[int, float], float]
    load_1m: float


@dataclass
class Meter:
    """Samples the machine for one run: ``sample()`` about once a second
    while the launcher runs, ``summary()`` at the end."""

    runner: int
    session: int
    intervals: list[Interval] = field(default_factory=list)
    names: dict[tuple[int, float], str] = field(default_factory=dict)
    _last: tuple | None = None

    def sample(self) -> None:
        now, wall, busy = time.perf_counter_ns(), time.time(), _busy_seconds()
        table = list(psutil.process_iter(["ppid", "create_time", "cpu_times"]))
        own = {p.pid for p in machine_lock.attempt_processes(self.runner, self.session, table)}
        times: dict[tuple[int, float], tuple[bool, float]] = {}
        for p in table:
            created, cpu = p.info["create_time"], p.info["cpu_times"]
            if created is None or cpu is None:
                continue  # gone, or not ours to read
            key = (p.pid, created)
            times[key] = (p.pid in own, cpu.user + cpu.system)
            if p.pid not in own and key not in self.names:
                self.names[key] = _name(p)
        if self._last is not None:
            self.intervals.append(self._interval(now, wall, busy, times))
        self._last = (now, wall, busy, times)

    def _interval(self, now: int, wall: float, busy: float, times: dict) -> Interval:
        """CPU seconds since the last sample. A process started since then
        counts from its start; one gone since then loses its last moments
        (the machine's total still has them)."""
        start, wall_before, busy_before, before = self._last
        own, others = 0.0, {}
        for key, (is_own, seconds) in times.items():
            if key in before:
                spent = seconds - before[key][1]
            else:  # started since the last sample, or unreadable then (no baseline)
                spent = seconds if key[1] >= wall_before - 0.05 else 0.0
            if is_own:
                own += max(spent, 0.0)
            elif spent > 0:
                others[key] = spent
        return Interval(start, now, busy - busy_before, own, others, os.getloadavg()[0])

    def summary(self, window: tuple[int, int], label: str) -> dict:
        """The machine's load over ``window`` (perf_counter ns), each
        interval weighed by how much of it lies inside."""
        cores = psutil.cpu_count() or 1
        seconds = foreign = 0.0
        per_process: dict[tuple[int, float], float] = {}
        loads = []
        for iv in self.intervals:
            lo, hi = max(iv.start, window[0]), min(iv.end, window[1])
            if hi <= lo:
                continue
            part = (hi - lo) / (iv.end - iv.start)
            seconds += (hi - lo) / 1e9
            foreign += max(iv.busy - iv.own, 0.0) * part
            for key, spent in iv.others.items():
                per_process[key] = per_process.get(key, 0.0) + spent * part
            loads.append(iv.load_1m)
        share = foreign / (seconds * cores) if seconds else None
        busiest = sorted(per_process.items(), key=lambda kv: -kv[1])[:BUSIEST]
        return {
            "window": label,
            "window_s": round(seconds, 3),
            "cores": cores,
            "foreign_cpu_share": None if share is None else round(min(share, 1.0), 4),
            "load_avg_1m_max": max(loads) if loads else None,
            "busiest_foreign": [
                {
                    "pid": pid,
                    "command": self.names.get((pid, created), "?"),
                    "cores": round(spent / seconds, 3),
                }
                for (pid, created), spent in busiest
                if seconds and spent / seconds >= 0.01
            ],
            "loaded": share is not None and share >= LOADED_SHARE,
            "loaded_from_share": LOADED_SHARE,
        }


def _name(p: psutil.Process) -> str:
    try:
        words = p.cmdline() or [p.name()]
    except psutil.Error:
        return "?"
    return " ".join(words)[:120]


def measured_window(run_dir: Path, ranks: int, warmup: int, held: tuple[int, int]) -> tuple | None:
    """From the first measured step's start to the last one's end over the
    ranks' steps files (perf_counter ns, this machine's monotonic clock), or
    None when they are missing or outside the held window (another clock)."""
    first = last = None
    for rank in range(ranks):
        try:
            with open(Path(run_dir) / steps_file(rank), newline="") as f:
                for row in csv.DictReader(f, delimiter="\t"):
                    if int(row["step"]) < warmup:
                        continue
                    start, end = int(row["start_ns"]), int(row["end_ns"])
                    first = start if first is None else min(first, start)
                    last = end if last is None else max(last, end)
        except (OSError, ValueError, KeyError):
            return None
    if first is None or not (held[0] <= first < last <= held[1]):
        return None
    return first, last


def summarize(meter: Meter, run_dir: Path, config: dict, ranks: int, held: tuple[int, int]) -> dict:
    """run.json's ``machine_load``: over the measured steps where the steps
    files tell them, else over the whole training."""
    window = measured_window(run_dir, ranks, config.get("warmup_steps") or 0, held)
    if window is None:
        return meter.summary(held, "training")
    return meter.summary(window, "measured steps")
