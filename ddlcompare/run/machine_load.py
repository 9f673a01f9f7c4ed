"""What else the machine did while a run measured.

The runner samples the machine about once a second while its training
runs: the CPU time every process spent (the kernel's /proc/stat, which
counts processes too short-lived to be seen), the CPU time of the run's own
processes (the runner, its descendants and its launcher's session:
machine_lock.attempt_processes), each other process's CPU time, and the
1-minute load average. Over the run's measured steps (from the first step
after warm-up to the last, on the steps files' clock) that gives:

- ``foreign_cpu_share``: CPU time of processes not the run's, as a share of
  the run's cores' (window x cores): the machine's, or where the run is
  confined to some (``cores_per_node``) those alone, so that a process busy
  on another core is not counted against it (``cores``, ``cpus``);
- ``busiest_foreign``: the processes that took most of it;
- ``loaded``: true when ``foreign_cpu_share`` reaches ``LOADED_SHARE``:
  the run was measured beside heavy foreign load, so its figures are not
  clean (the runs table and the report say so per cell).

And, from the kernel's per-thread scheduler counters of the run's own
threads (/proc/<pid>/task/<tid>/schedstat: time on a CPU, time runnable
but waiting for one; voluntary context switches from its status):

- ``threads``: each thread's CPU and run-queue wait as shares of the
  window, and how often it blocked of its own accord;
- ``spinning``: the threads that never block yet take a core: runnable
  through at least ``SPINNING_RUNNABLE`` of the window, blocking less than
  ``SPINNING_BLOCKS_PER_S`` times a second, not their process's main
  thread (a busy-polling progress thread, as Tarantella's GaspiCxx runs);
- ``not_spinning``: the run's other threads together: the cores they ran
  on, the cores' worth of time they waited for one, and how much of that
  wait the spinning threads account for (each thread's wait blamed on what
  was runnable beside it, in proportion to how long: the spinning threads,
  the run's other threads, other processes), and the largest share of
  the window one of them waited; from these analysis/improve.py predicts
  what stopping the spinning would give.

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
from runfiles.records import LOADED_SHARE
from ddlcompare.run import machine_lock
from runfiles.run_config import RunConfig

BUSIEST = 5
# A spinning thread: runnable (on a CPU or waiting for one) through 90 % of
# the window and blocking of its own accord less than once a second. A
# compute thread of a training loop blocks on its peers, its data and its
# workers many times a second; a progress thread polling a queue never does.
SPINNING_RUNNABLE = 0.9
SPINNING_BLOCKS_PER_S = 1.0
THREADS_KEPT = 12  # the busiest of the run's threads, in run.json


@dataclass(frozen=True)
class ThreadCounters:
    """One thread's cumulative counters: seconds on a CPU, seconds runnable
    but waiting for one, voluntary context switches."""

    name: str
    cpu: float
    wait: float
    blocks: int


def thread_counters(pid: int) -> dict[tuple[int, int], ThreadCounters]:
    """The counters of every thread of ``pid`` ((pid, tid) -> counters);
    empty where the kernel keeps no scheduler statistics or the process is
    gone."""
    found: dict[tuple[int, int], ThreadCounters] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/schedstat") as f:
                on_cpu, waiting = f.read().split()[:2]
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/status") as f:
                blocks = next(
                    int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches")
                )
        except (OSError, ValueError, StopIteration):
            continue
        found[(pid, int(tid))] = ThreadCounters(name, int(on_cpu) / 1e9, int(waiting) / 1e9, blocks)
    return found


def _busy_seconds(cpus: tuple[int, ...] | None = None) -> float:
    """CPU seconds the machine (or those of its cores) spent busy since boot."""
    per_cpu = [psutil.cpu_times()] if cpus is None else psutil.cpu_times(percpu=True)
    chosen = per_cpu if cpus is None else [per_cpu[i] for i in cpus if i < len(per_cpu)]
    return sum(
        t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0) for t in chosen
    )


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
    threads: dict[tuple[int, int], tuple[float, float, int]] = field(default_factory=dict)


@dataclass
class Meter:
    """Samples the machine for one run: ``sample()`` about once a second
    while the launcher runs, ``summary()`` at the end."""

    runner: int
    session: int
    # The cores the run is confined to (None: the whole machine). The run's
    # own CPU time is taken off theirs whole; the runner itself, unconfined,
    # may spend a few hundredths of a core elsewhere.
    cpus: tuple[int, ...] | None = None
    intervals: list[Interval] = field(default_factory=list)
    names: dict[tuple[int, float], str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    _last: tuple | None = None
    _last_threads: dict = field(default_factory=dict)

    def sample(self) -> None:
        now, wall, busy = time.perf_counter_ns(), time.time(), _busy_seconds(self.cpus)
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
        threads = {}
        for pid in own:
            threads.update(thread_counters(pid))
        if self._last is not None:
            interval = self._interval(self._last, now, wall, busy, times)
            interval.threads = self._thread_deltas(threads)
            self.intervals.append(interval)
        self._last, self._last_threads = (now, wall, busy, times), threads
        for key, counters in threads.items():
            self.thread_names.setdefault(key, counters.name)

    def _thread_deltas(self, threads: dict) -> dict:
        """Each thread's (CPU s, wait s, voluntary switches) since the last
        sample; a thread started since then counts from its start."""
        deltas = {}
        for key, now in threads.items():
            before = self._last_threads.get(key, ThreadCounters(now.name, 0.0, 0.0, 0))
            deltas[key] = (
                max(now.cpu - before.cpu, 0.0),
                max(now.wait - before.wait, 0.0),
                max(now.blocks - before.blocks, 0),
            )
        return deltas

    def _interval(self, last: tuple, now: int, wall: float, busy: float, times: dict) -> Interval:
        """CPU seconds since the last sample. A process started since then
        counts from its start; one gone since then loses its last moments
        (the machine's total still has them)."""
        start, wall_before, busy_before, before = last
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
        cores = len(self.cpus) if self.cpus else psutil.cpu_count() or 1
        seconds = foreign = 0.0
        per_process: dict[tuple[int, float], float] = {}
        per_thread: dict[tuple[int, int], list[float]] = {}
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
            for key, counts in iv.threads.items():
                total = per_thread.setdefault(key, [0.0, 0.0, 0.0])
                for i, value in enumerate(counts):
                    total[i] += value * part
            loads.append(iv.load_1m)
        share = foreign / (seconds * cores) if seconds else None
        busiest = sorted(per_process.items(), key=lambda kv: -kv[1])[:BUSIEST]
        return {
            "window": label,
            "window_s": round(seconds, 3),
            "cores": cores,
            "cpus": list(self.cpus) if self.cpus else None,  # None: the whole machine
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
            **self._threads(per_thread, seconds, foreign / seconds if seconds else 0.0),
        }

    def _threads(self, per_thread: dict, seconds: float, foreign_cores: float) -> dict:
        """run.json's ``threads``, ``spinning`` and ``not_spinning`` (see
        the module's docstring) over ``seconds`` of window."""
        if not per_thread or not seconds:
            return {}
        rows = [
            {
                "pid": pid,
                "tid": tid,
                "name": self.thread_names.get((pid, tid), "?"),
                "cpu_share": round(cpu / seconds, 4),
                "wait_share": round(wait / seconds, 4),
                "blocks_per_s": round(blocks / seconds, 2),
            }
            for (pid, tid), (cpu, wait, blocks) in per_thread.items()
        ]
        for row in rows:
            row["spinning"] = (
                row["tid"] != row["pid"]
                and row["cpu_share"] + row["wait_share"] >= SPINNING_RUNNABLE
                and row["blocks_per_s"] < SPINNING_BLOCKS_PER_S
            )
        others = [r for r in rows if not r["spinning"]]
        rows.sort(key=lambda r: -(r["cpu_share"] + r["wait_share"]))
        return {
            "threads": rows[:THREADS_KEPT],
            "spinning": [r for r in rows if r["spinning"]],
            "not_spinning": {
                "cpu_cores": round(sum(r["cpu_share"] for r in others), 4),
                "wait_cores": round(sum(r["wait_share"] for r in others), 4),
                "wait_behind_spinning_cores": round(_wait_behind_spinning(rows, foreign_cores), 4),
                "largest_wait_share": max((r["wait_share"] for r in others), default=0.0),
            },
        }


def _wait_behind_spinning(rows: list[dict], foreign_cores: float) -> float:
    """Of the other threads' wait for a CPU, what the spinning threads account
    for: each thread's wait blamed on everything else that was runnable
    beside it (the spinning threads, the run's other threads, other
    processes' CPU) in proportion to how long each was runnable."""
    runnable = [r["cpu_share"] + r["wait_share"] for r in rows]
    spinning = sum(x for x, r in zip(runnable, rows) if r["spinning"])
    others = sum(x for x, r in zip(runnable, rows) if not r["spinning"])
    blamed = 0.0
    for x, r in zip(runnable, rows):
        rivals = spinning + others - x + foreign_cores
        if not r["spinning"] and rivals > 0:
            blamed += r["wait_share"] * spinning / rivals
    return blamed


def _name(p: psutil.Process) -> str:
    try:
        words = p.cmdline() or [p.name()]
    except psutil.Error:
        return "?"
    return " ".join(words)[:120]


def measured_window(run_dir: Path, ranks: int, warmup: int, held: tuple[int, int]) -> tuple | None:
    """From the first measured step's start to the last one's end over the
    ranks' steps files (perf_counter ns, this machine's monotonic clock), or
    None when they are missing, damaged (a disk that filled cuts a row short:
    its missing fields read as None) or outside the held window (another
    clock)."""
    first: int | None = None
    last: int | None = None
    for rank in range(ranks):
        try:
            with open(Path(run_dir) / steps_file(rank), newline="") as f:
                for row in csv.DictReader(f, delimiter="\t"):
                    if int(row["step"]) < warmup:
                        continue
                    start, end = int(row["start_ns"]), int(row["end_ns"])
                    first = start if first is None else min(first, start)
                    last = end if last is None else max(last, end)
        except (OSError, ValueError, KeyError, TypeError, csv.Error):
            return None
    if first is None or last is None or not (held[0] <= first < last <= held[1]):
        return None
    return first, last


def summarize(
    meter: Meter, run_dir: Path, config: RunConfig, ranks: int, held: tuple[int, int]
) -> dict:
    """run.json's ``machine_load``: over the measured steps where the steps
    files tell them, else over the whole training."""
    window = measured_window(run_dir, ranks, config.get("warmup_steps") or 0, held)
    if window is None:
        return meter.summary(held, "training")
    return meter.summary(window, "measured steps")
