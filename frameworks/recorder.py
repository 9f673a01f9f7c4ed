"""The phase recorder every framework adapter uses.

Within a step the recorder keeps one duration per phase (a few hundred
nanoseconds of bookkeeping per phase); phases outside steps (``init``,
``eval``) are kept as intervals. Event tracers (OTF2, Score-P)
attach as sinks and see every interval.

Each step also counts ``comm_bytes``: the bytes of the buffers this rank
handed to collectives during the step (what the adapter reports through
:meth:`PhaseRecorder.collective` or :meth:`PhaseRecorder.count_bytes`),
left empty in the table by adapters that cannot see their buffers.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns

from runfiles import names
from runfiles.phases import EPOCH, PHASES, STEP

_INDEX = {p: i for i, p in enumerate(PHASES)}
BEAT_NS = 1_000_000_000  # a heartbeat a second at most: one small write, not one a step


class Sink:
    """Receives each interval as it closes (an event tracer).

    Each call hands one row, a tuple, so that a sink that keeps rows can
    make the method its list's ``append`` (no Python frame per event: these
    calls are in the steps' time). Times are ``perf_counter_ns()`` values of
    the process that records.
    """

    def interval(self, row: tuple) -> None:
        """``(phase, epoch, step, start_ns, end_ns)``; step -1 outside steps."""
        raise NotImplementedError

    def step(self, row: tuple) -> None:
        """``(epoch, step, start_ns, end_ns)``: one whole training step (it
        encloses that step's phase intervals)."""

    def collective(self, row: tuple) -> None:
        """``(op, nbytes, start_ns, end_ns)``: one collective operation (e.g. a
        gradient bucket's all-reduce), possibly overlapping the phases and
        other collectives."""

    def close(self) -> None:
        pass


class LiveRegions:
    """Told as each phase opens and closes, for tools that time regions
    themselves (Score-P user regions, PyTorch profiler annotations)."""

    def begin(self, name: str) -> None:
        raise NotImplementedError

    def end(self, name: str) -> None:
        raise NotImplementedError


class _Span:
    __slots__ = ("recorder", "index", "start")

    def __init__(self, recorder: PhaseRecorder, index: int):
        self.recorder, self.index = recorder, index

    # The hot path of every phase, traced or not: module-level clock, no
    # argument tuple, the tools' lists looked at only when they hold some.
    def __enter__(self):
        if self.recorder.live:
            for live in self.recorder.live:
                live.begin(PHASES[self.index])
        self.start = perf_counter_ns()
        return self

    def __exit__(self, exc_type, exc, tb):
        recorder = self.recorder
        if recorder.synchronize is not None:
            recorder.synchronize()
        end = perf_counter_ns()
        if recorder.live:
            for live in recorder.live:
                live.end(PHASES[self.index])
        recorder._close(self.index, self.start, end)
        return False


class PhaseRecorder:
    """Times phases of steps and of the run; writes per-rank tables."""

    def __init__(self, sinks: list[Sink] | None = None):
        self.sinks = sinks or []
        self.live: list[LiveRegions] = []
        # On a GPU, kernels run after the call that queues them returns: a
        # device synchronisation closing each phase charges its kernels to
        # it rather than to whichever later phase first waits for them.
        self.synchronize: Callable[..., object] | None = None
        self.epoch = 0
        self.step = -1
        self._in_step = False
        self._step_start = 0
        self._current = [0] * len(PHASES)
        self.measures_bytes = False  # set by adapters that report their collectives' bytes
        # A collective over one rank sends nothing, whatever it is handed
        # (DDP calls its hook even then, Horovod skips its all-reduce).
        self.one_rank = False
        # this step's buffers: list.append is atomic under the GIL, so the
        # communication threads need no lock (summed when the step ends)
        self._comm_bytes: list[int] = []
        # (epoch, step, start_ns, end_ns, *phase durations, comm_bytes)
        self.steps: list[tuple] = []
        self.intervals: list[tuple] = []  # (phase, epoch, start_ns, end_ns)
        # The rank's heartbeat file (runfiles/names.progress), rewritten at
        # most once every BEAT_NS as steps end, and as evaluation begins: the
        # runner's hang watch sees steps stop inside an epoch, where
        # epochs.tsv says nothing yet.
        self.heartbeat: Path | None = None
        self._next_beat_ns = 0

    def attach(self, sinks: list[Sink]) -> None:
        """Add sinks once the run knows where they write (after ``init``);
        they receive the intervals recorded so far first."""
        for sink in sinks:
            for phase, epoch, start, end in self.intervals:
                sink.interval((phase, epoch, -1, start, end))
        self.sinks.extend(sinks)

    def __call__(self, phase: str) -> _Span:
        return _Span(self, _INDEX[phase])

    def begin_epoch(self, epoch: int) -> None:
        """Tools that time regions see the epoch open (steps take ``epoch``)."""
        self.epoch = epoch
        for live in self.live:
            live.begin(EPOCH)

    def end_epoch(self) -> None:
        for live in self.live:
            live.end(EPOCH)

    def begin_step(self, epoch: int, step: int) -> None:
        self.epoch, self.step, self._in_step = epoch, step, True
        self._current = [0] * len(PHASES)
        self._comm_bytes = []
        for live in self.live:
            live.begin(STEP)
        self._step_start = perf_counter_ns()

    def end_step(self, end_ns: int | None = None) -> None:
        """Close the step, now or at ``end_ns`` (a step whose phases were
        read back after it ended: the reading is not the step's)."""
        end = perf_counter_ns() if end_ns is None else end_ns
        for live in self.live:
            live.end(STEP)
        comm_bytes = sum(self._comm_bytes) if self.measures_bytes else ""
        self.steps.append(
            (self.epoch, self.step, self._step_start, end, *self._current, comm_bytes)
        )
        self._in_step = False
        if self.heartbeat is not None and end >= self._next_beat_ns:
            self._beat(end)
        if self.sinks:
            row = (self.epoch, self.step, self._step_start, end)
            for sink in self.sinks:
                sink.step(row)

    def evaluation(self) -> _Span:
        """The eval phase, said in the heartbeat first: evaluation ends no
        step, and on a slow model (ResNet-34 on a CPU) it outlasts the hang
        watch's floor, which must not take it for a hang."""
        self._beat(perf_counter_ns(), names.PROGRESS_EVALUATING)
        return self("eval")

    def _beat(self, now_ns: int, doing: str = "") -> None:
        self._next_beat_ns = now_ns + BEAT_NS
        if self.heartbeat is None:
            return
        try:
            self.heartbeat.write_text(f"{self.epoch} {self.step} {doing}".rstrip() + "\n")
        except OSError:
            pass  # a full disk or a removed folder: the watch then sees silence

    def add(self, phase: str, start_ns: int, end_ns: int) -> None:
        """A phase the framework timed itself (a fused step's parts read
        back from its own clock, converted to ``perf_counter_ns``); tools
        that time regions live do not see it."""
        self._close(_INDEX[phase], start_ns, end_ns)

    def count_bytes(self, nbytes: int) -> None:
        """Add a buffer handed to a collective to this step's comm_bytes.
        May be called from communication threads."""
        if not self.one_rank:
            self._comm_bytes.append(nbytes)

    def collective(self, op: str, nbytes: int, start_ns: int, end_ns: int) -> None:
        """Record one collective operation: its bytes count in the step's
        comm_bytes, and event tracers keep the operation.
        May be called from a communication thread."""
        self.count_bytes(nbytes)
        if self.sinks:
            row = (op, nbytes, start_ns, end_ns)
            for sink in self.sinks:
                sink.collective(row)

    def _close(self, index: int, start: int, end: int) -> None:
        if self._in_step:
            self._current[index] += end - start
            step = self.step
        else:
            self.intervals.append((PHASES[index], self.epoch, start, end))
            step = -1
        if self.sinks:
            row = (PHASES[index], self.epoch, step, start, end)
            for sink in self.sinks:
                sink.interval(row)

    def write(self, folder: Path, rank: int) -> None:
        """``steps.rank<r>.tsv`` (one row per step) and ``intervals.rank<r>.tsv``."""
        with open(folder / names.steps(rank), "w", newline="") as f:
            out = csv.writer(f, delimiter="\t")
            out.writerow(
                ["epoch", "step", "start_ns", "end_ns"]
                + [f"{p}_ns" for p in PHASES]
                + ["comm_bytes"]
            )
            out.writerows(self.steps)
        with open(folder / names.intervals(rank), "w", newline="") as f:
            out = csv.writer(f, delimiter="\t")
            out.writerow(["phase", "epoch", "start_ns", "end_ns"])
            out.writerows(self.intervals)
        for sink in self.sinks:
            sink.close()
