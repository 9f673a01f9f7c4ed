"""Why the GaspiCxx patch shortens Tarantella's step where a core is free
(docs/improvements.md, "The patch where a core is free"): CPU share, a lock,
or the caches?

At 1 rank on this machine's cores with 1 compute thread (``threads: 1``)
the patch took a quarter off the step, though a core stood beside the
rank's compute. Three mechanisms could do that, and the kernel's
per-thread counters tell them apart:

- **CPU share**: the rank has more runnable threads than its one compute
  thread (TensorFlow's inter-op pool runs kernels on two threads at once),
  so the spinning progress thread still takes a core they want. Then the
  busy threads wait for a core (run-queue wait) about as long per step as
  the step grows, and their CPU time per step does not change.
- **A lock**: the spinning thread takes each collective's mutex in its
  loop, and the thread that starts or finishes a collective sleeps on it.
  Then the busy threads are *blocked* longer per step (sleeping, not
  waiting for a core).
- **Caches and memory**: a thread spinning beside them slows the same work.
  Then the busy threads take more CPU time per step. (This KVM guest has no
  hardware counters: ``perf stat -e cycles`` reads "<not supported>"; CPU
  time per step is the test.)

And one intervention: a third arm, **plain-idle**, runs the plain build
with its spinning thread moved to the idle scheduling class (SCHED_IDLE)
as soon as the bench sees it spin, before the measured steps. It still
spins, takes its mutexes and touches its caches, but gives a core up to
any other thread that wants one. CPU share predicts plain-idle close to
patched; a lock or the caches predict it close to plain.

Runs: bench/free_core_threads.yaml, ``--reps`` of each arm, one at a time
through ``./ddlc run-one`` (each takes the host-wide measuring lock), in
rounds of the three arms shuffled per round (seeded), so the arms
interleave in time. Beside each run, every ``--sample-s``, the rank's
threads' counters (/proc/<pid>/task/<tid>/: schedstat: on a CPU, waiting
for one; status: voluntary and involuntary switches; stat: the CPU it last
ran on) and the machine's steal time. They are summed over the measured
steps alone (the sampling intervals inside each epoch's measured steps,
weighed by their overlap; the epochs' boundaries apart), and each busy
thread's step split into on a CPU, waiting for one, and blocked.

Printed per run, beside its figures: the run's conditions (run.json:
other processes' share of the CPU, loaded or not, cores per rank, load) and
the bench's own (steal, its own CPU). Then per arm and the differences with
95 % Welch intervals, what the what-if (analysis/improve.py, spinning
stopped) predicted from each plain run's record, and the same formula fed
the steps-only counters; last, the answer.

    .venv/bin/python bench/free_core_threads.py
        [--reps 4] [--arms plain,patched,plain-idle] [--results DIR] [--seed 1]
        [--design bench/free_core_threads.yaml]
Needs both Tarantella builds (./ddlc run builds them: envs/tarantella.md)
and root or CAP_SYS_NICE for plain-idle. About 35 s a run on a quiet machine (2026-11-27, 32c9cfe,
the 2-core machine of that day, its CPU not recorded; 12 runs, about 7
minutes; --reps 5: 15 runs, about 9). Last line: key=value pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
from scipy import stats as scipy_stats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from measuring import CHILD_ENV, cli, load_fields  # noqa: E402

from analysis import collect, improve  # noqa: E402
from ddlcompare.plan import design as design_mod  # noqa: E402
from ddlcompare.run.machine_load import SPINNING_BLOCKS_PER_S, SPINNING_RUNNABLE  # noqa: E402
from runfiles import names  # noqa: E402

DESIGN = REPO / "bench" / "free_core_threads.yaml"
ARMS = ("plain", "patched", "plain-idle")
FRAMEWORK = {"plain": "tarantella", "patched": "tarantella-patched", "plain-idle": "tarantella"}
BUSY_SHARE = 0.05  # a thread on a CPU this share of the steps is one of the step's busy threads
# The answer's thresholds: the share of plain's extra step that plain-idle
# takes back, and that the busy threads' run-queue wait accounts for.
RECOVERED = 0.8
EXPLAINED = 0.7


@dataclass(frozen=True)
class Counters:
    """One thread's cumulative counters (ns on a CPU, ns waiting for one,
    voluntary and involuntary switches), the CPU it last ran on, and where
    in the kernel it sleeps now (wchan: futex_wait_queue a lock or a pool's
    condition, hrtimer_nanosleep a timed sleep, do_epoll_wait a socket;
    "0" running)."""

    cpu: int
    wait: int
    voluntary: int
    involuntary: int
    last_cpu: int
    wchan: str = "?"


@dataclass
class Sample:
    at: int  # perf_counter_ns: the steps files' clock
    steal: float  # the machine's steal seconds since boot
    threads: dict[int, Counters]


def thread_counters(pid: int, tid: int) -> Counters | None:
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/schedstat") as f:
            cpu, wait = (int(x) for x in f.read().split()[:2])
        with open(f"{base}/status") as f:
            switches = {
                k: int(v) for k, v in (line.split(":") for line in f if "ctxt_switches" in line)
            }
        with open(f"{base}/stat") as f:
            last_cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(f"{base}/wchan") as f:
            wchan = f.read().strip() or "?"
    except OSError:
        wchan = "?"
    return Counters(
        cpu,
        wait,
        switches.get("voluntary_ctxt_switches", 0),
        switches.get("nonvoluntary_ctxt_switches", 0),
        last_cpu,
        wchan,
    )


def _steal() -> float:
    return getattr(psutil.cpu_times(), "steal", 0.0)


@dataclass
class Watch:
    """Samples the run's rank (``python -m frameworks.worker RUN_DIR``) until
    stopped; with ``idle``, moves a thread that spins to SCHED_IDLE."""

    path: str  # the run's path under its results folder
    sample_s: float
    idle: bool
    pid: int | None = None
    samples: list[Sample] = field(default_factory=list)
    idled: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.sample_s):
            if self.pid is None:
                self.pid = self._find_rank()
                continue
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
            except OSError:
                return  # the rank ended
            now = Sample(time.perf_counter_ns(), _steal(), {})
            for tid in tids:
                counters = thread_counters(self.pid, tid)
                if counters is not None:
                    now.threads[tid] = counters
            self.samples.append(now)
            if self.idle and not self.idled:
                self._idle_spinner()

    def _find_rank(self) -> int | None:
        for p in psutil.process_iter(["cmdline"]):
            words = p.info["cmdline"] or []
            if "frameworks.worker" in words and any(
                w.rstrip("/").endswith(self.path) for w in words
            ):
                return p.pid
        return None

    def _idle_spinner(self) -> None:
        """A thread runnable throughout the last half second or more that
        never blocked, not the main thread: the spinning progress thread
        (machine_load's rule)."""
        if len(self.samples) < 3:
            return
        last, before = self.samples[-1], self.samples[-3]
        seconds = (last.at - before.at) / 1e9
        for tid, now in last.threads.items():
            then = before.threads.get(tid)
            if tid == self.pid or then is None:
                continue
            runnable = (now.cpu - then.cpu + now.wait - then.wait) / 1e9 / seconds
            blocks = (now.voluntary - then.voluntary) / seconds
            if runnable >= SPINNING_RUNNABLE and blocks < SPINNING_BLOCKS_PER_S:
                try:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                except OSError as exc:
                    self.idled.append({"tid": tid, "at": last.at, "error": str(exc)})
                    continue
                self.idled.append({"tid": tid, "at": last.at})


def step_blocks(run_dir: Path, warmup: int) -> tuple[pd.DataFrame, list[tuple[int, int]]]:
    """The measured steps and each epoch's span of them (start, end ns)."""
    steps = pd.read_csv(run_dir / names.steps(0), sep="\t")
    measured = steps[steps["step"] >= warmup]
    spans = measured.groupby("epoch").agg(start=("start_ns", "min"), end=("end_ns", "max"))
    return measured, list(spans.itertuples(index=False, name=None))


def _overlap(lo: int, hi: int, spans: list[tuple[int, int]]) -> int:
    return sum(max(0, min(hi, e) - max(lo, s)) for s, e in spans)


def thread_sums(samples: list[Sample], spans: list[tuple[int, int]]) -> tuple[dict, float, float]:
    """Each thread's counters summed over the spans (each sampling interval
    weighed by its overlap with them), the seconds covered, and the
    machine's steal over them."""
    sums: dict[int, np.ndarray] = {}
    seconds = steal = 0.0
    for before, now in zip(samples, samples[1:]):
        inside = _overlap(before.at, now.at, spans)
        if not inside:
            continue
        part = inside / (now.at - before.at)
        seconds += inside / 1e9
        steal += (now.steal - before.steal) * part
        for tid, c in now.threads.items():
            b = before.threads.get(tid, Counters(0, 0, 0, 0, c.last_cpu))
            delta = np.array(
                [
                    c.cpu - b.cpu,
                    c.wait - b.wait,
                    c.voluntary - b.voluntary,
                    c.involuntary - b.involuntary,
                ],
                dtype=float,
            )
            sums[tid] = sums.get(tid, np.zeros(4)) + np.maximum(delta, 0) * part
    return sums, seconds, steal


def _gaps(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The epochs' boundaries: between one epoch's last measured step and
    the next one's first."""
    return [(a[1], b[0]) for a, b in zip(spans, spans[1:])]


def threads_table(sums: dict, seconds: float, step_s: float, pid: int) -> list[dict]:
    """Per thread: its shares of the window, and per step (ms) its time on a
    CPU, waiting for one and blocked; which is spinning, busy, the main."""
    rows = []
    for tid, (cpu, wait, vol, invol) in sums.items():
        cpu_share, wait_share = cpu / 1e9 / seconds, wait / 1e9 / seconds
        spinning = bool(
            tid != pid
            and cpu_share + wait_share >= SPINNING_RUNNABLE
            and vol / seconds < SPINNING_BLOCKS_PER_S
        )
        rows.append(
            {
                "tid": tid,
                "main": tid == pid,
                "spinning": spinning,
                "busy": bool(not spinning and cpu_share >= BUSY_SHARE),
                "cpu_share": cpu_share,
                "wait_share": wait_share,
                "cpu_ms": cpu_share * step_s * 1e3,
                "wait_ms": wait_share * step_s * 1e3,
                "blocked_ms": max(1 - cpu_share - wait_share, 0.0) * step_s * 1e3,
                "voluntary_per_s": vol / seconds,
                "involuntary_per_s": invol / seconds,
            }
        )
    return sorted(rows, key=lambda r: -r["cpu_share"])


def run_one(design: Path, results: Path, path: str, watch: Watch) -> int:
    thread = watch.start()
    try:
        done = subprocess.run(
            cli("run-one", "--design", str(design), "--results", str(results), "--path", path),
            env=CHILD_ENV,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    finally:
        watch.stop()
        thread.join()
    if done.returncode:
        print(done.stdout[-2000:], flush=True)
    return done.returncode


def measure(arm: str, rep: int, run_dir: Path, watch: Watch, warmup: int) -> dict:
    """One run's figures and conditions."""
    record = json.loads((run_dir / "run.json").read_text())
    out: dict = {"arm": arm, "rep": rep, "status": record.get("status")}
    conditions = record.get("conditions") or {}
    load = record.get("machine_load") or {}
    out.update(
        foreign_cpu_share=conditions.get("foreign_cpu_share"),
        loaded=conditions.get("loaded"),
        cores_per_rank=conditions.get("cores_per_rank"),
        compute_threads=conditions.get("compute_threads"),
        load_max=load.get("load_avg_1m_max"),
        start=record.get("start"),
    )
    if record.get("status") != "ok" or not watch.samples:
        return out
    measured, spans = step_blocks(run_dir, warmup)
    step_s = float(((measured["end_ns"] - measured["start_ns"]) / 1e9).mean())
    sums, seconds, steal = thread_sums(watch.samples, spans)
    gap_sums, gap_seconds, _ = thread_sums(watch.samples, _gaps(spans))
    rows = threads_table(sums, seconds, step_s, watch.pid)
    busy = [r for r in rows if r["busy"]]
    others = [r for r in rows if not r["spinning"]]
    gaps = _gaps(spans)
    first_measured = spans[0][0] if spans else None
    out.update(
        step_ms=step_s * 1e3,
        forward_ms=measured["forward_ns"].mean() / 1e6,
        backward_ms=measured["backward_ns"].mean() / 1e6,
        epoch_boundary_s=float(np.mean([(b - a) / 1e9 for a, b in gaps])) if gaps else None,
        covered_s=seconds,
        steal_share=steal / seconds / (psutil.cpu_count() or 1) if seconds else None,
        spinning_cores=sum(r["cpu_share"] for r in rows if r["spinning"]),
        busy_threads=len(busy),
        busy_main=any(r["main"] for r in busy),
        busy_cpu_ms=sum(r["cpu_ms"] for r in busy),
        busy_wait_ms=sum(r["wait_ms"] for r in busy),
        busy_wait_max_ms=max((r["wait_ms"] for r in busy), default=0.0),
        busy_blocked_ms=sum(r["blocked_ms"] for r in busy),
        busy_voluntary_per_s=sum(r["voluntary_per_s"] for r in busy),
        busy_involuntary_per_s=sum(r["involuntary_per_s"] for r in busy),
        others_cpu_cores=sum(r["cpu_share"] for r in others),
        others_wait_cores=sum(r["wait_share"] for r in others),
        others_largest_wait_share=max((r["wait_share"] for r in others), default=0.0),
        idled_before_steps=bool(
            watch.idled
            and "error" not in watch.idled[0]
            and first_measured is not None
            and watch.idled[0]["at"] < first_measured
        ),
        idle_error=watch.idled[0].get("error") if watch.idled else None,
        gap_main=_gap_main(gap_sums, gap_seconds, watch.pid),
        gap_main_wchan=where_main_sleeps(watch.samples, gaps, watch.pid),
        gap_threads=threads_table(gap_sums, gap_seconds, 1.0, watch.pid)[:4] if gap_seconds else [],
        threads=rows[:8],
    )
    out["whatif_record"] = _whatif_from_record(record)
    out["whatif_steps"] = _whatif(
        out["others_cpu_cores"],
        out["others_wait_cores"],
        out["spinning_cores"],
        out["others_largest_wait_share"],
        record,
    )
    return out


def where_main_sleeps(samples: list[Sample], spans: list[tuple[int, int]], pid: int | None) -> dict:
    """The main thread's wchan at the samples taken inside the spans, as
    shares of those samples (the most frequent first)."""
    seen = Counter(
        s.threads[pid].wchan
        for s in samples
        if pid in s.threads and any(a <= s.at < b for a, b in spans)
    )
    total = sum(seen.values())
    return {k: round(v / total, 3) for k, v in seen.most_common(4)} if total else {}


def _gap_main(sums: dict, seconds: float, pid: int | None) -> dict | None:
    """The main thread at the epochs' boundaries: its shares on a CPU,
    waiting for one, blocked."""
    if not seconds or pid not in sums:
        return None
    cpu, wait = sums[pid][0] / 1e9 / seconds, sums[pid][1] / 1e9 / seconds
    return {"cpu": cpu, "wait": wait, "blocked": max(1 - cpu - wait, 0.0)}


def _whatif_from_record(record: dict) -> float | None:
    """The what-if's spinning-stopped gain from the run's own record, as
    ./ddlc improve computes it (analysis/improve.py)."""
    figures = pd.DataFrame([collect.load_figures(record)])
    if not figures["spinning_threads"].fillna(0).gt(0).all():
        return None
    share, _ = improve._cpu_share_saved(figures.apply(pd.to_numeric, errors="coerce"))
    return float(share.iloc[0])


def _whatif(c: float, w: float, spinning: float, largest: float, record: dict) -> float | None:
    """The same formula fed the counters of the measured steps alone."""
    if not spinning:
        return None
    load = record.get("machine_load") or {}
    figures = pd.DataFrame(
        [
            {
                "others_cpu_cores": c,
                "others_wait_cores": w,
                "spinning_cores": spinning,
                "others_largest_wait_share": largest,
                "machine_cores": load.get("cores"),
                "foreign_cpu_share": load.get("foreign_cpu_share"),
            }
        ]
    )
    share, _ = improve._cpu_share_saved(figures.apply(pd.to_numeric, errors="coerce"))
    return float(share.iloc[0])


def welch(a: pd.Series, b: pd.Series) -> tuple[float, float, float]:
    """Mean of a minus mean of b, with its 95 % Welch interval."""
    a, b = a.dropna(), b.dropna()
    diff = a.mean() - b.mean()
    if len(a) < 2 or len(b) < 2:
        return diff, float("nan"), float("nan")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = (va + vb) ** 0.5
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se else 1.0
    half = scipy_stats.t.ppf(0.975, dof) * se
    return diff, diff - half, diff + half


RUN_LINE = (
    "{arm:<10} rep {rep}  step {step_ms:6.1f} ms (fwd {forward_ms:5.1f}, bwd {backward_ms:5.1f})"
    "  busy x{busy_threads}{main}: cpu {busy_cpu_ms:5.1f} wait {busy_wait_ms:5.1f}"
    " blocked {busy_blocked_ms:6.1f} ms/step; vol {busy_voluntary_per_s:5.0f}/s"
    " invol {busy_involuntary_per_s:5.0f}/s  spin {spinning_cores:.2f} cores"
    "  epoch boundary {epoch_boundary_s:.2f} s"
    "  | conditions: foreign {foreign_cpu_share:.1%}{loaded}, load<={load_max:.1f},"
    " cores/rank {cores_per_rank}, compute threads {compute_threads},"
    " steal {steal_share:.1%}, {start}"
)


def print_run(r: dict) -> None:
    if "step_ms" not in r:
        print(f"{r['arm']:<10} rep {r['rep']}  status {r['status']}: no figures", flush=True)
        return
    print(
        RUN_LINE.format(
            **{
                **r,
                "epoch_boundary_s": r["epoch_boundary_s"] or 0.0,
                "main": " (main among them)" if r["busy_main"] else "",
                "loaded": " LOADED" if r["loaded"] else "",
            }
        ),
        flush=True,
    )
    if (r["epoch_boundary_s"] or 0) > 0.5 and r.get("gap_threads"):
        print(
            "    at its epoch boundaries: "
            + ", ".join(
                f"{'main' if t['main'] else 'spinning' if t['spinning'] else t['tid']}"
                f" cpu {t['cpu_share']:.0%} wait {t['wait_share']:.0%}"
                for t in r["gap_threads"]
            )
            + "; the main thread in "
            + ", ".join(f"{k} {v:.0%}" for k, v in (r.get("gap_main_wchan") or {}).items()),
            flush=True,
        )
    if r.get("idle_error"):
        print(f"    plain-idle: SCHED_IDLE refused: {r['idle_error']}", flush=True)
    elif r["arm"] == "plain-idle" and not r["idled_before_steps"]:
        print("    plain-idle: the spinner was NOT idled before the measured steps", flush=True)


COMPONENTS = [
    ("step_ms", "step"),
    ("busy_cpu_ms", "busy threads on a CPU"),
    ("busy_wait_ms", "busy threads waiting for a CPU"),
    ("busy_wait_max_ms", "  the one that waited most"),
    ("busy_blocked_ms", "busy threads blocked"),
    ("busy_voluntary_per_s", "busy threads' voluntary switches /s"),
    ("busy_involuntary_per_s", "busy threads' involuntary switches /s"),
    ("backward_ms", "backward phase"),
    ("forward_ms", "forward phase"),
    ("epoch_boundary_s", "epoch boundary (s, outside the steps)"),
]


def summarize(table: pd.DataFrame) -> list[str]:
    """Per arm, the differences, the what-if, and the answer."""
    ok = table[table.get("step_ms", pd.Series(dtype=float)).notna()]
    arms = [a for a in ARMS if a in set(ok["arm"])]
    lines = ["", "per arm (mean over its runs; ms per step unless said):"]
    lines.append(f"  {'':40}" + "".join(f"{a:>14}" for a in arms))
    for key, label in COMPONENTS:
        cells = "".join(f"{ok[ok.arm == a][key].mean():14.1f}" for a in arms)
        lines.append(f"  {label:40}{cells}")
    lines.append(
        "  "
        + f"{'runs (of which loaded)':40}"
        + "".join(
            f"{len(ok[ok.arm == a]):>10} ({int(ok[ok.arm == a]['loaded'].fillna(False).sum())})"
            for a in arms
        )
    )
    pairs = [
        (a, b) for a, b in (("plain", "patched"), ("plain", "plain-idle")) if {a, b} <= set(arms)
    ]
    for a, b in pairs:
        lines.append(f"{a} minus {b} (95 % Welch interval):")
        for key, label in COMPONENTS[:6]:
            d, lo, hi = welch(ok[ok.arm == a][key], ok[ok.arm == b][key])
            lines.append(f"  {label:40}{d:+8.1f}  [{lo:+.1f}, {hi:+.1f}]")
    lines += _boundary_lines(ok, arms)
    lines += _whatif_lines(ok)
    lines += _answer(ok)
    return lines


def _boundary_lines(ok: pd.DataFrame, arms: list[str]) -> list[str]:
    """The main thread at the epochs' boundaries (outside the steps): on a
    CPU, waiting for one, blocked, as shares of the boundaries' time."""
    lines = ["main thread at the epoch boundaries (shares of their time: cpu/wait/blocked):"]
    for arm in arms:
        found = [g for g in ok[ok.arm == arm]["gap_main"] if isinstance(g, dict)]
        if found:
            mean = {k: np.mean([g[k] for g in found]) for k in ("cpu", "wait", "blocked")}
            where = Counter()
            for seen in ok[ok.arm == arm]["gap_main_wchan"].dropna():
                where.update(seen)
            asleep = ", ".join(f"{k} {v / len(found):.0%}" for k, v in where.most_common(3))
            lines.append(
                f"  {arm:<12}{mean['cpu']:.0%} / {mean['wait']:.0%} / {mean['blocked']:.0%}"
                f" ({len(found)} runs); asleep in {asleep or '?'}"
            )
    return lines


def _whatif_lines(ok: pd.DataFrame) -> list[str]:
    plain, patched = ok[ok.arm == "plain"], ok[ok.arm == "patched"]
    if plain.empty or patched.empty:
        return []
    measured = 1 - patched["step_ms"].mean() / plain["step_ms"].mean()
    record = plain["whatif_record"].dropna()
    steps = plain["whatif_steps"].dropna()
    return [
        "the what-if (spinning stopped; analysis/improve.py) against the measured gain:",
        f"  measured: {measured:.1%} of the step",
        f"  from each plain run's record (measured-steps window, epoch boundaries in it): "
        f"{record.mean():.1%} (runs {', '.join(f'{x:.1%}' for x in record)})",
        f"  the same formula on the measured steps alone: "
        f"{steps.mean():.1%} (runs {', '.join(f'{x:.1%}' for x in steps)})",
    ]


def _answer(ok: pd.DataFrame) -> list[str]:
    plain, patched = ok[ok.arm == "plain"], ok[ok.arm == "patched"]
    if plain.empty or patched.empty:
        return ["answer: needs plain and patched runs"]
    gap = plain["step_ms"].mean() - patched["step_ms"].mean()
    wait = plain["busy_wait_max_ms"].mean() - patched["busy_wait_max_ms"].mean()
    cpu = plain["busy_cpu_ms"].mean() - patched["busy_cpu_ms"].mean()
    blocked = plain["busy_blocked_ms"].mean() - patched["busy_blocked_ms"].mean()
    idle = ok[ok.arm == "plain-idle"]
    recovered = (plain["step_ms"].mean() - idle["step_ms"].mean()) / gap if len(idle) else None
    lines = [
        f"answer: plain's step is {gap:+.1f} ms longer than patched's; of it, the busy thread that "
        f"waited most waited {wait:+.1f} ms more for a core ({wait / gap:.0%}); the busy threads' "
        f"CPU time changed by {cpu:+.1f} ms and their blocked time by {blocked:+.1f} ms"
        + (f"; plain-idle took back {recovered:.0%} of it" if recovered is not None else ""),
    ]
    loaded = int(ok["loaded"].fillna(False).astype(bool).sum())
    if loaded:
        lines.append(
            f"  ({loaded} of {len(ok)} runs measured beside heavy foreign load: not clean)"
        )
    share = wait / gap >= EXPLAINED and (recovered is None or recovered >= RECOVERED)
    lines.append(
        "  => CPU share: the spinning thread takes a core the busy threads want"
        if share
        else "  => not CPU share alone: see the blocked time (a lock) and the CPU per step (caches)"
    )
    return lines


def order(arms: list[str], reps: int, seed: int) -> list[tuple[str, int]]:
    """Rounds of one run per arm, each round shuffled: the arms interleave."""
    rng = random.Random(seed)
    runs = []
    for rep in range(1, reps + 1):
        round_ = list(arms)
        rng.shuffle(round_)
        runs += [(arm, rep) for arm in round_]
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--results", type=Path, help="where the runs go (a new temporary folder)")
    parser.add_argument("--sample-s", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--design",
        type=Path,
        default=DESIGN,
        help="its two cells (plain and patched Tarantella at 1 rank) under other fixed "
        "settings, e.g. designs/tarantella-free-core.yaml (one inter-op thread)",
    )
    args = parser.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    if unknown := set(arms) - set(ARMS):
        print(f"--arms: {', '.join(sorted(unknown))} unknown; choose from {', '.join(ARMS)}")
        return 2
    results = args.results or Path(tempfile.mkdtemp(prefix="free-core-threads-"))
    design = design_mod.load(str(args.design))
    by_cell = {(r.factors["framework"], r.rep): r.path for r in design.runs()}
    if args.reps > design.replications:
        print(f"--reps {args.reps}: at most {design.replications} ({args.design.name})")
        return 2
    warmup = design.fixed["warmup_steps"]
    print(
        f"runs in {results}; {load_fields()}; {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    )
    found = []
    for arm, rep in order(arms, args.reps, args.seed):
        # plain-idle: the plain build's runs again, in a folder of their own
        folder = results / arm
        path = by_cell[(FRAMEWORK[arm], rep)]
        watch = Watch(path, args.sample_s, idle=arm == "plain-idle")
        t0 = os.times()
        code = run_one(args.design, folder, path, watch)
        t1 = os.times()
        if code:
            print(f"{arm} rep {rep}: run-one exited {code}", flush=True)
            found.append({"arm": arm, "rep": rep, "status": f"exit {code}"})
            continue
        r = measure(arm, rep, folder / path, watch, warmup)
        r["bench_cpu_s"] = (t1.user + t1.system) - (t0.user + t0.system)
        found.append(r)
        print_run(r)
    (results / "free_core_threads.json").write_text(json.dumps(found, indent=1, default=str))
    table = pd.DataFrame(found)
    for line in summarize(table):
        print(line)
    ok = table[table.get("step_ms", pd.Series(dtype=float)).notna()]
    means = {a: ok[ok.arm == a]["step_ms"].mean() for a in arms}
    print(
        " ".join(f"step_ms_{a.replace('-', '_')}={m:.2f}" for a, m in means.items())
        + f" runs={len(ok)} loaded={int(ok['loaded'].fillna(False).sum())} {load_fields()}"
        + f" results={results}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
