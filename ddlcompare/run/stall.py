"""A run that has stopped making progress, seen long before its timeout.

The timeout (runner.derived_timeout) is sized for the slowest honest run:
an hour for 5 short epochs of 4,000 images. A hang shows far sooner. Rank 0
rewrites epochs.tsv after every epoch (frameworks/epoch_loop.py, and
Tarantella's fit loop), so once an epoch has ended, a silence many times
longer than the slowest epoch so far is a hang, not a slow epoch: two
Tarantella ranks waiting for each other in a collective's set-up
(docs/improvements.md, "Hangs") spin there until the timeout.

Inside the first epoch nothing says yet how long an epoch takes, and the
documented hangs came there, at its end. So every rank also keeps a
heartbeat (``progress.rank<r>``, rewritten at most once a second as its
steps end: frameworks/recorder.py): once the ranks have begun stepping
(start-up and a first compile are over), a silence of every rank's
heartbeat longer than the floor before the first epoch has ended is a hang,
unless a rank said it is evaluating (the test set can take longer than the
floor, and no step ends then).
After the last epoch the run is writing its outputs (a trace's unification
can take a while) and is left alone. Frameworks that write neither
heartbeats nor epochs.tsv as they go (LBANN) are left to the timeout.
"""

from __future__ import annotations

import time
from pathlib import Path

from runfiles import tables
from runfiles import files, names, variables

# A silence of this many slowest epochs so far, and never less than the
# floor (DDLC_STALL_FLOOR_S: an epoch of a few seconds, then a pause of the
# machine's own).
FACTOR = 10


def configured_floor_s() -> float:
    text = variables.value("DDLC_STALL_FLOOR_S")
    try:
        floor = variables.number("DDLC_STALL_FLOOR_S", text)
    except ValueError:
        floor = 0.0
    if not floor > 0:  # the runner records this as the run's reason, without a traceback
        raise RuntimeError(
            f"DDLC_STALL_FLOOR_S={text!r} is not a number of seconds above 0: "
            "unset it (120 s) or set, say, DDLC_STALL_FLOOR_S=300"
        )
    return floor


class EpochWatch:
    """Watches one run's epochs.tsv for the silence of a hang."""

    def __init__(
        self, path: Path, epochs: int, factor: float = FACTOR, floor_s: float | None = None
    ):
        self.path, self.epochs = path, epochs
        self.factor = factor
        self.floor_s = configured_floor_s() if floor_s is None else floor_s
        self._seen_ns: int | None = None
        self.done, self.slowest_s = 0, 0.0

    def _read(self, mtime_ns: int) -> None:
        """Epochs done and the slowest one's wall time, read once per rewrite."""
        if mtime_ns == self._seen_ns:
            return
        self._seen_ns = mtime_ns
        try:
            walls = tables.read_tsv(self.path, ("wall_s",), min_rows=0)["wall_s"]
        except tables.Damaged:
            return  # gone, or being rewritten: read again at the next rewrite
        if walls.isna().any():
            return  # a row half written: likewise
        self.done, self.slowest_s = len(walls), float(walls.max()) if len(walls) else 0.0

    def limit_s(self) -> float:
        return max(self.floor_s, self.factor * self.slowest_s)

    def last_beat(self) -> float | None:
        """When a rank last said it ended a step (unix s; None before any)."""
        beats = []
        for path in self.path.parent.glob(names.PROGRESS_GLOB):
            try:
                beats.append(path.stat().st_mtime)
            except OSError:
                continue  # being rewritten: the others, or the next poll
        return max(beats, default=None)

    def evaluating(self) -> bool:
        """Whether a rank's last heartbeat says it is evaluating: no step
        ends then, for as long as the test set takes."""
        for path in self.path.parent.glob(names.PROGRESS_GLOB):
            try:
                said = files.read_text(path, limit=256).split()
            except (OSError, UnicodeDecodeError):
                continue  # being rewritten: the next poll
            if said[-1:] == [names.PROGRESS_EVALUATING]:
                return True
        return False

    def stalled(self, now: float | None = None) -> str | None:
        """Why the run counts as hung, or None while it makes progress."""
        now = now if now is not None else time.time()
        try:
            stat = self.path.stat()
        except OSError:
            return self._stalled_in_first_epoch(now)
        self._read(stat.st_mtime_ns)
        if self.done == 0:
            return self._stalled_in_first_epoch(now)
        if not 0 < self.done < self.epochs:
            return None
        silent = now - stat.st_mtime
        if silent <= self.limit_s():
            return None
        return (
            f"stalled: no epoch ended in {silent:.0f} s after epoch {self.done} of "
            f"{self.epochs} (the slowest so far took {self.slowest_s:.1f} s; a hang is "
            f"{self.factor:g} times that, at least {self.floor_s:.0f} s); killed"
        )

    def _stalled_in_first_epoch(self, now: float) -> str | None:
        """A hang before the first epoch ends: the ranks began stepping,
        then every heartbeat fell silent for longer than the floor."""
        beat = self.last_beat()
        if beat is None or now - beat <= self.floor_s or self.evaluating():
            return None
        return (
            f"stalled: no step ended in {now - beat:.0f} s inside epoch 1 of {self.epochs} "
            f"(the ranks had begun stepping; a hang before the first epoch ends is a silence "
            f"of every rank's heartbeat of at least {self.floor_s:.0f} s); killed"
        )
