"""How far a design's runs are, and about how long the rest will take: the
line ``ddlc plan`` and ``./ddlc run -n`` print, and each run's start line in
``./ddlc run``.

A run is done when its done marker is there (whatever its status). A run to
do is estimated from the runs of its cell that ended before (the median of
their time from start to end, less their wait for the machine), else from
the cells of its framework timed in the same results folder, else from a
first guess per framework. The estimate covers the runs, not the analysis
after them."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ddlcompare.plan.design import Design
from ddlcompare.plan.params import RunRow
from frameworks import data
from runfiles import files
from runfiles.names import DONE, RUN_RECORD
from runfiles.run_config import RunConfig

# First guesses, for frameworks no run has timed here yet: a run's start-up,
# and its seconds per 1,000 images trained, from the default design's runs
# on the 2-core development machine under load (design.yaml's notes: about
# 20 s a PyTorch run and 40 s a Tarantella run at 30,000 images).
START_S = 10.0
SECONDS_PER_1000_IMAGES = {"tarantella": 1.0, "tarantella-patched": 1.0, "lbann": 1.0}
OTHER_SECONDS_PER_1000_IMAGES = 0.33


@dataclass(frozen=True)
class Progress:
    total: int
    done: int
    left_s: float
    from_cells: int  # runs to do estimated from earlier runs of their cell
    from_framework: int  # ... from timed runs of their framework
    guessed: int  # ... from the first guess per framework

    def line(self) -> str:
        todo = self.total - self.done
        if not todo:
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
        return (
            f"{self.done} of {self.total} runs done, {todo} to do: about "
            f"{duration(self.left_s)} left ({', '.join(sources)})"
        )


def duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 1:
        return f"{round(seconds)} s"
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def cell_of(row: RunRow) -> str:
    """The run's cell: its path without the replication."""
    return row.path.rsplit("/rep~", 1)[0]


def timed_seconds(run_dir: Path) -> float | None:
    """A run's time from start to end, less its wait for the machine; None
    when its record does not say (not ended, or unreadable)."""
    try:
        record = files.read_json(run_dir / RUN_RECORD)
        start, end = (datetime.strptime(record[k], "%Y-%m-%dT%H:%M:%S%z") for k in ("start", "end"))
        waited = float(record.get("waited_for_machine_s") or 0)
    except (OSError, ValueError, KeyError, TypeError):  # none, or not a record
        return None
    seconds = (end - start).total_seconds() - waited
    return seconds if seconds > 0 else None


def first_guess(config: RunConfig) -> float:
    world = config["nodes"] * config["procs_per_node"]
    trained = data.epoch_steps(config) * config["batch_size"] * world * config["epochs"]
    rate = SECONDS_PER_1000_IMAGES.get(config["framework"], OTHER_SECONDS_PER_1000_IMAGES)
    return START_S + rate * trained / 1000


def summary(design: Design, results: Path) -> Progress:
    rows = design.runs()
    done = [r for r in rows if (results / r.path / DONE).is_file()]
    cells: dict[str, float] = {}
    for cell in {cell_of(r) for r in rows}:
        times = [t for d in (results / cell).glob("rep~*") if (t := timed_seconds(d))]
        if times:
            cells[cell] = statistics.median(times)
    by_framework: dict[str, list[float]] = {}
    for r in rows:
        if cell_of(r) in cells:
            by_framework.setdefault(r.config["framework"], []).append(cells[cell_of(r)])
    left = 0.0
    counts = [0, 0, 0]
    done_paths = {r.path for r in done}
    for r in rows:
        if r.path in done_paths:
            continue
        if cell_of(r) in cells:
            left, counts[0] = left + cells[cell_of(r)], counts[0] + 1
        elif timed := by_framework.get(r.config["framework"]):
            left, counts[1] = left + statistics.median(timed), counts[1] + 1
        else:
            left, counts[2] = left + first_guess(r.config), counts[2] + 1
    return Progress(len(rows), len(done), left, *counts)


# The workflow's run job opens fd 3 on the console (workflows/runs.smk) while
# its own output goes to the run's log.
CONSOLE_FD = 3


def start_line(design: Design, row: RunRow, results: Path) -> str:
    """The console's line as ``row`` starts: the design's progress. A round
    that replications: auto adds lies beyond the planned runs the counts are
    of: it says so, rather than "none to do" as it starts."""
    now = summary(design, results)
    if row.path not in {r.path for r in design.runs()}:
        return f"ddlc: starting {row.path}: a replication added beyond the {now.total} planned\n"
    return f"ddlc: starting {row.path}: {now.line()}\n"


def announce(design: Design, row: RunRow, results: Path) -> None:
    """Say on the console, where the job has one, which run starts and how
    far the design is."""
    try:
        os.fstat(CONSOLE_FD)
    except OSError:
        return
    text = start_line(design, row, results)
    try:
        os.write(CONSOLE_FD, text.encode())
    except OSError:
        pass  # a console gone does not stop the run
