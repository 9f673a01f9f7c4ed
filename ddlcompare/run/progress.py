"""How far a design's runs are, and about how long the rest will take: the
line ``ddlc plan`` and ``./ddlc run -n`` print, and each run's start line in
``./ddlc run``. How the estimate is made: docs/design.md ("How long")."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ddlcompare.plan.params import RunRow, cell_of
from frameworks import data
from runfiles import files
from runfiles.names import DONE, RUN_RECORD
from runfiles.run_config import RunConfig

# First guesses, for frameworks no run has timed here yet: a run's start-up,
# and its seconds per 1,000 images trained, from the default design's quiet
# runs of 2026-11-28 on the 2-core development machine (docs/measurements.md:
# at 30,000 images, medians of 20 s a torch-ddp run, 21.5 s horovod-torch,
# 52 s Tarantella; LBANN's is a guess).
START_S = 10.0
SECONDS_PER_1000_IMAGES = {"tarantella": 1.4, "tarantella-patched": 1.4, "lbann": 1.4}
OTHER_SECONDS_PER_1000_IMAGES = 0.35
# The workflow's own time: per run, Snakemake's job around the run's record
# (45 s over 47 runs and 33 s over 46 in the two quiet runs of the default
# design); once, after the last run, the tables, figures and report (31 s
# and 39 s there).
BETWEEN_RUNS_S = 1.0
REPORT_S = 40.0


@dataclass(frozen=True)
class Planned:
    """The runs planned so far, and per cell how many more replications:
    auto's next round may add (fewest, most): a fixed design's runs, none
    more (analysis/replication.py's forecast fills it for auto)."""

    rows: list[RunRow]
    more: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Progress:
    total: int
    done: int
    left_s: tuple[float, float]  # fewest runs added, most
    from_cells: int  # runs to do estimated from earlier runs of their cell
    from_framework: int  # ... from timed runs of their framework
    guessed: int  # ... from the first guess per framework
    more: tuple[int, int] = (0, 0)  # runs replications: auto may add, fewest and most
    damaged: int = 0  # done, as the workflow sees it, but the done marker is no record

    def line(self) -> str:
        return self._counts_and_time() + (
            f"; {self.damaged} of the runs done have a damaged done.json "
            "(ddlc check says which; ddlc check --rerun runs them again)"
            if self.damaged
            else ""
        )

    def _counts_and_time(self) -> str:
        todo = self.total - self.done
        if not todo and not self.more[1]:
            return f"{self.done} of {self.total} runs done; none to do"
        sources = [
            f"{n} {what}"
            for n, what in [
                (self.from_cells, "from earlier runs of their cells"),
                (self.from_framework, "from their framework's timed runs"),
                (self.guessed, "from a first guess per framework"),
            ]
            if n
        ]
        fewest, most = self.more
        added = ""
        if most and fewest == most:
            added = f" and {most} more that replications: auto adds"
        elif most:
            added = (
                f" and {fewest} to {most} more that replications: auto may add (as many as "
                "the first runs' spread asks)"
            )
        counts = f"{self.done} of {self.total} runs done" + (f", {todo} to do" if todo else "")
        return f"{counts}{added}: about {durations(*self.left_s)} left, the report included" + (
            f" ({', '.join(sources)})" if sources else ""
        )


def duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 1:
        return f"{round(seconds)} s"
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def durations(low: float, high: float) -> str:
    """A range of durations, its unit said once where both share it."""
    first, second = duration(low), duration(high)
    if first == second:
        return first
    unit = " min"
    if first.endswith(unit) and second.endswith(unit) and "h" not in first + second:
        first = first.removesuffix(unit)
    return f"{first} to {second}"


def timed_seconds(run_dir: Path) -> float | None:
    """A run's time from start to end, less the part of its wait for the
    machine that fell inside it; None when its record does not say (not
    ended, or unreadable). The recorded wait also counts what the job's
    shell waited before the run started (workflows/share_machine.sh), so
    only the wait between the start and the hold (``machine_held``) is
    taken off: all of it, a run that waited longer than it lasted gave
    no time at all."""
    try:
        record = files.read_json(run_dir / RUN_RECORD)
        start, end = (
            datetime.strptime(record[k], "%Y-%m-%dT%H:%M:%S%z").timestamp()
            for k in ("start", "end")
        )
        waited = float(record.get("waited_for_machine_s") or 0)
        held = record.get("machine_held")
        if held:
            waited = min(waited, max(0.0, float(held[0]) - start))
    except (OSError, ValueError, KeyError, TypeError, IndexError):  # none, or not a record
        return None
    seconds = end - start - waited
    return seconds if seconds > 0 else None


def first_guess(config: RunConfig) -> float:
    world = config["nodes"] * config["procs_per_node"]
    trained = data.epoch_steps(config) * config["batch_size"] * world * config["epochs"]
    rate = SECONDS_PER_1000_IMAGES.get(config["framework"], OTHER_SECONDS_PER_1000_IMAGES)
    return START_S + rate * trained / 1000


def summary(planned: Planned, results: Path) -> Progress:
    rows = planned.rows
    # Done as the workflow sees it: a marker there, whatever it holds.
    done = {r.path for r in rows if (results / r.path / DONE).exists()}
    damaged = _damaged_markers(results, done)
    estimate = estimator(rows, results)
    left, counts = 0.0, [0, 0, 0]
    for r in rows:
        if r.path not in done:
            seconds, source = estimate(r)
            left += seconds
            counts[source] += 1
    # A cell's added runs take as long as its others (any of its rows says how long).
    per_run = {cell_of(r): estimate(r)[0] for r in rows}
    fewest, most = (sum(n[i] for n in planned.more.values()) for i in (0, 1))
    low, high = (left + sum(per_run[c] * n[i] for c, n in planned.more.items()) for i in (0, 1))
    after = REPORT_S if len(done) < len(rows) or most else 0.0
    cells, framework, guessed = counts
    return Progress(
        len(rows),
        len(done),
        (low + after, high + after),
        cells,
        framework,
        guessed,
        (fewest, most),
        damaged,
    )


def _damaged_markers(results: Path, done: set[str]) -> int:
    if not done:
        return 0
    from runfiles import records  # pandas, which `ddlc plan` needs only here

    return sum(records.done_status(results / path)[0] == "damaged" for path in done)


def estimator(rows: list[RunRow], results: Path) -> Callable[[RunRow], tuple[float, int]]:
    """How long a run of ``rows`` takes, and from what (0: earlier runs of
    its cell, 1: its framework's timed cells, 2: the first guess), with
    the workflow's own time around it."""
    cells: dict[str, float] = {}
    for cell in {cell_of(r) for r in rows}:
        times = [t for d in (results / cell).glob("rep~*") if (t := timed_seconds(d))]
        if times:
            cells[cell] = statistics.median(times)
    by_framework: dict[str, list[float]] = {}
    for r in rows:
        if cell_of(r) in cells:
            by_framework.setdefault(r.config["framework"], []).append(cells[cell_of(r)])

    def estimate(row: RunRow) -> tuple[float, int]:
        if cell_of(row) in cells:
            return BETWEEN_RUNS_S + cells[cell_of(row)], 0
        if timed := by_framework.get(row.config["framework"]):
            return BETWEEN_RUNS_S + statistics.median(timed), 1
        return BETWEEN_RUNS_S + first_guess(row.config), 2

    return estimate


# The workflow's run job opens fd 3 on the console (workflows/runs.smk) while
# its own output goes to the run's log.
CONSOLE_FD = 3


def start_line(planned: Planned, row: RunRow, results: Path) -> str:
    """The console's line as ``row`` starts: the design's progress. A run
    beyond the planned ones the counts are of says so."""
    if row.path not in {r.path for r in planned.rows}:
        return f"ddlc: starting {row.path}: a replication added beyond the {len(planned.rows)} planned\n"
    return f"ddlc: starting {row.path}: {summary(planned, results).line()}\n"


def announce(planned: Callable[[], Planned], row: RunRow, results: Path) -> None:
    """Say on the console, where the job has one, which run starts and how
    far the design is (``planned`` is asked only then: under replications:
    auto it reads every finished run's metrics)."""
    try:
        os.fstat(CONSOLE_FD)
    except OSError:
        return
    text = start_line(planned(), row, results)
    try:
        os.write(CONSOLE_FD, text.encode())
    except OSError:
        pass  # a console gone does not stop the run
