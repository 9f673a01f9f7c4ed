"""Our OTF2 tracer: a :class:`~frameworks.recorder.Sink` per rank, one archive per run.

Each rank keeps its intervals in memory (a list append per interval) and, at
the end of the run, writes them to ``trace.parts/rank<r>.json`` in the run
directory (the folders' names: ``runfiles/names.py``). The rank that completes the set assembles the run's archive,
``trace/traces.otf2``, laid out as Score-P lays its traces out:

- the system tree ``machine > node <hostname>``, one location group
  ``Rank <r>`` per rank under its node;
- the location ``Master thread`` per rank with Enter/Leave of a ``step``
  region around each step's phase regions (region names = phase names); the
  Enter of a step and of a phase outside steps carries ``epoch`` and ``step``
  attributes, which the phases inside a step take from it (as the readers do);
- ``comm <k>`` locations per rank with one ``allreduce`` region per
  collective, its MpiCollectiveBegin/End records giving the bytes (collectives
  overlap each other and the backward pass, so they cannot nest on the
  master thread; each takes the first comm location free at its start);
- clock properties in nanoseconds since the epoch (each rank's monotonic
  clock shifted by its wall clock offset, measured once at start).

The Python ``otf2`` writer cannot write one archive from several processes,
hence the parts. ``otf2-print`` reads the result.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from runfiles import names
from runfiles.atomic import write_text
from runfiles.phases import PHASES, STEP
from frameworks.recorder import Sink

ARCHIVE_DIR = names.OTF2_DIR
ARCHIVE_NAME = "traces"
PARTS_DIR = names.OTF2_PARTS_DIR
MASTER_THREAD = "Master thread"
COLLECTIVE_REGION = "allreduce"


def archive_anchor(run_dir: Path) -> Path:
    return Path(run_dir) / ARCHIVE_DIR / f"{ARCHIVE_NAME}.otf2"


class Otf2Sink(Sink):
    """One rank's share of the run's OTF2 archive."""

    def __init__(self, run_dir: Path, rank: int, world: int, run_id: str = ""):
        self.run_dir, self.rank, self.world, self.run_id = Path(run_dir), rank, world, run_id
        self.hostname = socket.gethostname()
        # perf_counter_ns is CLOCK_MONOTONIC: shared by the ranks of a node,
        # not across nodes. Shifting it by the wall clock puts every rank on
        # one (NTP-synchronised) time line.
        self.offset_ns = time.time_ns() - time.perf_counter_ns()
        self.intervals: list[tuple] = []
        self.steps: list[tuple] = []
        self.collectives: list[tuple] = []
        # The recorder's rows kept as they come: each event costs one list
        # append in C, no Python call (bench/otf2_parts.py).
        self.interval = self.intervals.append
        self.step = self.steps.append
        self.collective = self.collectives.append

    def close(self) -> None:
        parts = self.run_dir / PARTS_DIR
        parts.mkdir(parents=True, exist_ok=True)
        part = {
            "rank": self.rank,
            "world": self.world,
            "hostname": self.hostname,
            "run_id": self.run_id,
            "offset_ns": self.offset_ns,
            "intervals": self.intervals,
            "steps": self.steps,
            "collectives": self.collectives,
        }
        # A full disk raises here: no part, and the runner fails the run for its lost trace.
        write_text(parts / f"rank{self.rank}.json", json.dumps(part))
        assemble_if_complete(self.run_dir, self.world)


def assemble_if_complete(run_dir: Path, world: int) -> bool:
    """Write the archive if every rank's part is there and no other rank is
    writing it already (the last rank to finish does it)."""
    parts = Path(run_dir) / PARTS_DIR
    files = [parts / f"rank{r}.json" for r in range(world)]
    if not all(f.exists() for f in files):
        return False
    try:
        os.close(os.open(parts / ".assembling", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    write_archive([json.loads(f.read_text()) for f in files], Path(run_dir) / ARCHIVE_DIR)
    for f in files:
        f.unlink()
    (parts / ".assembling").unlink()
    parts.rmdir()
    return True


def write_archive(parts: list[dict], folder: Path) -> Path:
    """One OTF2 archive from every rank's part; returns the anchor file."""
    import otf2
    from otf2.enums import CollectiveOp, GroupType, Paradigm, RegionRole, Type

    if folder.exists():
        import shutil

        shutil.rmtree(folder)  # OTF2 refuses to write into an existing archive
    archive = otf2.writer.open(str(folder), ARCHIVE_NAME, timer_resolution=1_000_000_000)
    with archive as trace:
        defs = trace.definitions
        machine = defs.system_tree_node("machine", class_name="machine")
        nodes = {}
        regions = {
            name: defs.region(name, region_role=RegionRole.CODE, paradigm=Paradigm.USER)
            for name in (*PHASES, STEP)
        }
        allreduce = defs.region(
            COLLECTIVE_REGION, region_role=RegionRole.COLL_ALL2ALL, paradigm=Paradigm.USER
        )
        epoch_attr = defs.attribute("epoch", "training epoch (1-based)", Type.INT64)
        step_attr = defs.attribute("step", "training step (-1: outside steps)", Type.INT64)
        masters, comm_events = [], []
        for part in sorted(parts, key=lambda p: p["rank"]):
            host = part["hostname"]
            if host not in nodes:
                nodes[host] = defs.system_tree_node(host, class_name="node", parent=machine)
            group = defs.location_group(f"Rank {part['rank']}", system_tree_parent=nodes[host])
            master = defs.location(MASTER_THREAD, group=group)
            masters.append(master)
            with _Records(trace, master) as writer:
                _write_master(writer, part, regions, epoch_attr, step_attr)
            comm_events.append((group, part))
        defs.group(
            "locations",
            group_type=GroupType.COMM_LOCATIONS,
            paradigm=Paradigm.USER,
            members=masters,
        )
        world = defs.group(
            "world",
            group_type=GroupType.COMM_GROUP,
            paradigm=Paradigm.USER,
            members=list(range(len(masters))),
        )
        comm = defs.comm("world", group=world)
        for group, part in comm_events:
            _write_collectives(trace, defs, group, part, allreduce, comm, CollectiveOp)
        first = min((t for p in parts for t in _times(p)), default=None)
        if first is not None:
            # The writer stamps the wall time at which it saw the first event;
            # ours were recorded earlier, and are wall-clock ns already.
            trace._realtime_timestamp = first / 1e9
    return folder / f"{ARCHIVE_NAME}.otf2"


class _Records:
    """A location's event writer that writes plain records (no attributes)
    through the OTF2 C functions themselves. The bindings' writer builds an
    event object, an attribute list and the ctypes signature anew for every
    record: about 20 us a record, the most of handing a run's trace over.
    Records with attributes still go through the bindings."""

    _functions: dict = {}

    def __init__(self, trace, location):
        self.trace, self.location = trace, location
        self.bindings = trace.event_writer_from_location(location)
        self.handle = self.bindings.handle
        self.count, self.first, self.last = 0, None, None
        self.c = self._c_functions()

    @classmethod
    def _c_functions(cls) -> dict:
        if not cls._functions:
            import ctypes
            import _otf2
            from _otf2.AttributeList import AttributeList
            from _otf2.ErrorCodes import ErrorCode, HandleErrorCode
            from _otf2.Events import CollectiveOp
            from _otf2.EvtWriter import EvtWriter
            from _otf2.GeneralDefinitions import CommRef, RegionRef, TimeStamp

            head = [ctypes.POINTER(EvtWriter), ctypes.POINTER(AttributeList), TimeStamp]
            for name, rest in (
                ("Enter", [RegionRef]),
                ("Leave", [RegionRef]),
                ("MpiCollectiveBegin", []),
                (
                    "MpiCollectiveEnd",
                    [CollectiveOp, CommRef, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64],
                ),
            ):
                function = getattr(_otf2.conf.lib, f"OTF2_EvtWriter_{name}")
                function.argtypes = head + rest
                function.restype = ErrorCode
                function.errcheck = HandleErrorCode
                cls._functions[name] = function
        return cls._functions

    def _counted(self, time: int) -> None:
        self.count += 1
        if self.first is None:
            self.first = time
        self.last = time  # each location's records are written in time order

    def enter(self, time: int, region, attributes=None) -> None:
        if attributes:
            self.bindings.enter(time, region, attributes=attributes)
            return
        self.c["Enter"](self.handle, None, time, region._ref)
        self._counted(time)

    def leave(self, time: int, region) -> None:
        self.c["Leave"](self.handle, None, time, region._ref)
        self._counted(time)

    def mpi_collective_begin(self, time: int) -> None:
        self.c["MpiCollectiveBegin"](self.handle, None, time)
        self._counted(time)

    def mpi_collective_end(self, time: int, op, comm, root: int, sent: int, received: int):
        self.c["MpiCollectiveEnd"](self.handle, None, time, op, comm._ref, root, sent, received)
        self._counted(time)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """The bindings' bookkeeping for the records written past them."""
        self.location._number_of_events_written += self.count
        for stamp in (self.first, self.last):
            if stamp is not None:
                self.trace._update_timestamps(stamp)
        return False


def _times(part: dict):
    offset = part["offset_ns"]
    for row in part["intervals"]:
        yield row[3] + offset
    for row in part["steps"]:
        yield row[2] + offset


def _write_master(writer, part: dict, regions: dict, epoch_attr, step_attr) -> None:
    """Enter/Leave records of the phases, nested in their steps."""
    offset = part["offset_ns"]
    spans = [(start, end, STEP, epoch, step) for epoch, step, start, end in part["steps"]]
    spans += [
        (start, end, phase, epoch, step) for phase, epoch, step, start, end in part["intervals"]
    ]
    # Outer spans first at equal starts, so that a step encloses its first phase.
    spans.sort(key=lambda s: (s[0], -s[1], s[2] != STEP))
    open_spans: list[tuple] = []
    for start, end, name, epoch, step in spans:
        while open_spans and open_spans[-1][0] <= start:
            closing_end, closing_name = open_spans.pop()
            writer.leave(closing_end + offset, regions[closing_name])
        if open_spans and open_spans[-1][1] == STEP:
            writer.enter(start + offset, regions[name])  # its step's, read from the step
        else:
            writer.enter(
                start + offset,
                regions[name],
                attributes={epoch_attr: int(epoch), step_attr: int(step)},
            )
        open_spans.append((end, name))
    while open_spans:
        closing_end, closing_name = open_spans.pop()
        writer.leave(closing_end + offset, regions[closing_name])


def _write_collectives(trace, defs, group, part, region, comm, CollectiveOp) -> None:
    """Each collective on the first ``comm <k>`` location free at its start."""
    offset = part["offset_ns"]
    lanes: list[tuple] = []  # (_Records, end of its last collective)
    for op, nbytes, start, end in sorted(part["collectives"], key=lambda c: c[2]):
        lane = next((i for i, (_, busy) in enumerate(lanes) if busy <= start), None)
        if lane is None:
            location = defs.location(f"comm {len(lanes)}", group=group)
            lanes.append((_Records(trace, location), 0))
            lane = len(lanes) - 1
        writer = lanes[lane][0]
        lanes[lane] = (writer, end)
        writer.enter(start + offset, region)
        writer.mpi_collective_begin(start + offset)
        writer.mpi_collective_end(
            end + offset, getattr(CollectiveOp, op.upper()), comm, 0xFFFFFFFF, nbytes, nbytes
        )
        writer.leave(end + offset, region)
    for writer, _ in lanes:
        writer.__exit__()
