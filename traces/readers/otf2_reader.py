"""OTF2 archives: ours, and Score-P's (7.x with OTF2 2.x up to 9.x with OTF2 3.1).

The fast reader reads the global definitions in C too (``_definitions``:
reader.c keeps the records, resolved here as the ``otf2`` bindings resolve
them), so that a conversion does not import the bindings; definitions that
would not resolve there (a reference to no earlier definition, a duplicate,
a name that is no UTF-8) are read by the bindings, which refuse a broken
archive in their words. The Python reader takes them from the bindings. The
events (only the records a phase table needs: Enter, Leave, MPI messages and
collectives; metric locations are not read at all) are read by one of two
readers that give the same table:

- ``fastotf2`` (traces/fastotf2/reader.c, the OTF2 C library; millions of
  events/s), the default wherever it is built;
- ``python``: the library's event reader, location after location, with a
  Python callback per record (~0.1 M events/s), when the C reader cannot be
  built (no gcc or no libopen-trace-format2-dev), when the definitions
  under-count a location's events, or when ``DDLC_OTF2_READER=python`` asks
  for it.

Both read location by location: a location that cannot be read to its end
keeps its rows up to the fault and is named in a lost-data problem; the
others are read whole.

The table's metadata (``ddlcompare.otf2_reader``) names the one used.

- rank: the number in the location group's name (``MPI Rank 3``, ``Rank 3``),
  else the process group's position (APEX and HPX name groups by process
  id: ``process 148165`` is a process, not rank 148165); an accelerator's
  group takes its creator's rank;
- node: the system tree node of class ``node`` above the group;
- location: ``<group name>/<location name>``;
- times: ticks -> ns since the Unix epoch where the clock properties give it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from runfiles import variables
from traces import fastjson, fastotf2, nesting
from traces.readers import Problem, Reader, TraceError, counted, register
from traces.table import NULL, Columns, Rows, finish_columns

_RANK_IN_NAME = re.compile(r"\brank\s*(\d+)\s*$", re.IGNORECASE)
STEP_ATTRIBUTES = ("step", "epoch")
READER_ENV = "DDLC_OTF2_READER"  # "python": the Python reader even where fastotf2 is built
META_READER = b"ddlcompare.otf2_reader"


def read(path: Path, rules, run_id: str = "", engine: str | None = None):
    """(table, problems); ``engine``: ``fastotf2``, ``python`` or None (the
    fast one when it is built, unless DDLC_OTF2_READER says otherwise). The
    OTF2 library's own error lines are kept off the terminal: the first one
    becomes part of the error or problem that reports it."""
    columns, problems, engine = _quietly(_read_columns, path, engine)
    columns = separate_threads(columns)
    table = finish_columns(columns, rules, "otf2", run_id, {META_READER: engine.encode()})
    return table, problems


def _quietly(call, *args):
    """``call(*args)`` with the OTF2 library's error lines kept off the
    terminal; a TraceError it raises gets the first of them as its reason
    (they are only known once the call has returned)."""
    with library_lines() as lines:
        try:
            return call(*args)
        except TraceError as exc:
            failure = exc
    raise TraceError(_with_library_line(str(failure), lines)) from None


# A part: whole ranks, a new part begun once one holds PART_EVENTS events
# and PART_LOCATIONS locations (the C reader reads a part's locations in
# threads: two at least; a constant, not the cores here, because the
# parts decide the op_id numbering and the row order, and a table must not
# depend on the machine that converted it). Parts are kept small because
# a conversion's memory is faulted in (the kernel zeroing each new page)
# for its first part and reused by the next (glibc's heap kept,
# traces/memory.py): the first part's size makes most of the reading's
# page faults (docs/tracing.md, "Speed and memory").
PART_EVENTS = 500_000
PART_LOCATIONS = 2


def read_parts(path: Path, rules, run_id: str = ""):
    """(table, problems) a group of ranks at a time (see PART_EVENTS), so
    that converting a trace of any number of ranks holds one group in
    memory; one part where the C reader is not built."""
    engine = variables.get(READER_ENV) or "fastotf2"
    if engine == "python" or fastotf2.library() is None:
        yield read(path, rules, run_id)
        return
    defs = _quietly(_definitions, path)
    for group in _rank_groups(defs):
        columns, problems, engine = _quietly(_read_columns, path, engine, group, defs)
        columns = separate_threads(columns)
        yield (
            finish_columns(columns, rules, "otf2", run_id, {META_READER: engine.encode()}),
            problems,
        )
        # this part's arrays go before the next part is read, so that the
        # next reuses their memory rather than fault in new pages
        del columns


def _rank_groups(defs: Definitions) -> list[set]:
    """Location refs by groups of whole ranks (see PART_EVENTS)."""
    events: dict = {}
    refs: dict = {}
    for ref, number_of_events in defs.locations:
        if ref in defs.located:
            rank = defs.located[ref][0]
            events[rank] = events.get(rank, 0) + number_of_events
            refs.setdefault(rank, set()).add(ref)
    groups, load = [set()], 0
    for rank in sorted(refs):
        if load >= PART_EVENTS and len(groups[-1]) >= PART_LOCATIONS:
            groups.append(set())
            load = 0
        groups[-1] |= refs[rank]
        load += events[rank]
    return groups


def _open(path: Path):
    import otf2

    try:
        return otf2.reader.Reader(str(path))
    except Exception as exc:  # the bindings raise several types; all mean unreadable
        raise TraceError(
            f"{path}: cannot read the OTF2 definitions (truncated or corrupt?): {_reason(exc)}"
        ) from None


def _close(reader) -> None:
    try:
        reader.close()
    except Exception:
        pass


def _read_columns(
    path: Path, engine: str | None, only: set | None = None, defs: Definitions | None = None
):
    """(Columns, problems, engine) of the locations ``only`` (all: None);
    ``defs``: the archive's, where they were read already."""
    engine = engine or variables.get(READER_ENV) or "fastotf2"
    if engine != "python" and fastotf2.library() is not None:
        columns, problems = _read_events_fast(defs or _definitions(path), path, only)
    else:
        engine = "python"
        reader = _open(path)
        try:
            rows, problems = _read_events(reader, path)
        finally:
            _close(reader)
        columns = Columns.of_rows(rows)
    columns, backwards = columns.without_backwards()
    problems += counted(
        path,
        (
            backwards,
            "regions that end before they begin (the clock went back); left out, "
            "the regions inside them moved up to the one around",
            True,
        ),
    )
    return columns, problems, engine


@contextlib.contextmanager
def library_lines():
    """Collects what the OTF2 library writes to the standard error (its
    error reports, file and line included) instead of showing it."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    # A file in memory, not tempfile's (whose imports cost some 8 ms of every start-up).
    with open(os.memfd_create("otf2-library-lines"), "w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines += sink.read().decode(errors="replace").splitlines()


def _with_library_line(message: str, lines: list[str]) -> str:
    """The error, with the library's first report where it adds a reason
    (or, where the ``otf2`` bindings' definition callback raised, what it
    raised: a KeyError is a reference to a definition the archive lacks)."""
    raised = [line for line in lines if re.match(r"^\w+(Error|Exception): ", line)]
    if raised and any("DefReaderCallback" in line for line in lines):
        kind, _, detail = raised[-1].partition(": ")
        reason = (
            f"a definition refers to one the archive does not define (reference {detail}; "
            "missing definitions?)"
            if kind == "KeyError"
            else raised[-1]
        )
        return f"{message} ({reason})"
    reports = [line for line in lines if line.strip()]
    if not reports:
        return message
    found = re.search(r"\]\s*(?:\S+:\d+:\s*)?(?:error:\s*)?(.*)$", reports[0])
    reason = (found.group(1) if found else reports[0]).strip()
    return message if reason in message else f"{message} (OTF2: {reason})"


def _reason(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class _State:
    """Open intervals per location while events stream in."""

    def __init__(self, defs, locations: dict):
        self.defs = defs
        self.regions = {r._ref: r.name for r in defs.regions}
        self.context_regions = _context_regions(defs)
        self.attributes = {a._ref: a.name for a in defs.attributes}
        self.locations = locations  # ref -> (rank, node, name)
        self.stacks: dict[int, list] = {ref: [] for ref in locations}
        self.rows = Rows()
        self.next_id = 0
        self.unbalanced = 0
        self.overlapping = 0
        self.outside = 0  # message and collective records outside any region
        self.renamed = 0  # Leaves that closed an open region of another name
        # Non-blocking collectives in flight: (location, request) -> the open
        # entry that requested it; its row once that region has ended.
        self.requested: dict = {}
        self.row_of: dict = {}
        clock = defs.clock_properties
        self.offset = clock.global_offset
        self.scale = 1e9 / clock.timer_resolution
        realtime = clock.realtime_timestamp
        self.base = realtime if 0 < realtime < 2**63 else 0
        self.exact = clock.timer_resolution == 1_000_000_000

    def ns(self, ticks: int) -> int:
        if self.exact:
            return ticks - self.offset + self.base
        return int(round((ticks - self.offset) * self.scale)) + self.base

    def enter(self, location, time, attribute_list, region):
        stack = self.stacks[location]
        step = epoch = None
        if attribute_list is not None:
            step, epoch = self._step_attributes(attribute_list)
        if step is None and stack:
            step, epoch = stack[-1][4], stack[-1][5]
        parent = stack[-1][2] if stack else None
        # [region, start, id, parent, step, epoch, collective, bytes]
        stack.append([region, time, self.next_id, parent, step, epoch, None, None])
        self.next_id += 1

    def context(self, location, time, attribute_list, context, leave=False):
        """A calling context's Enter or Leave (Score-P with unwinding): its
        region's."""
        region = self.context_regions.get(context)
        if region is None:
            self.unbalanced += 1  # a context the definitions do not have
        elif leave:
            self.leave(location, time, attribute_list, region)
        else:
            self.enter(location, time, attribute_list, region)

    def leave(self, location, time, attribute_list, region):
        stack = self.stacks[location]
        if not stack:
            self.unbalanced += 1
            return
        at = len(stack) - 1
        while at >= 0 and stack[at][0] != region:
            at -= 1
        if at < 0:
            # No open region of that name: close the innermost, as OTF2 says
            # a Leave does (APEX leaves an HPX task under its new name).
            self.renamed += 1
            at = len(stack) - 1
        elif at != len(stack) - 1:
            # Not the innermost open region: two threads' regions share one
            # location (Score-P's Python bindings put Horovod's background
            # thread on the master thread). Close the one that ends, as it
            # is, and keep the others open.
            self.overlapping += 1
        self._emit(location, stack.pop(at), time, at)

    def _emit(self, location, entry, end, depth):
        region, start, row_id, parent, step, epoch, collective, nbytes = entry
        rank, node, name = self.locations[location]
        if row_id in self.row_of:
            self.row_of[row_id] = len(self.rows.row_id)
        self.rows.add(
            rank,
            node,
            name,
            self.regions.get(region, f"region {region}"),
            self.ns(start),
            self.ns(end),
            depth,
            row_id,
            parent,
            step=None if step is None or step < 0 else step,
            epoch=None if epoch is None or epoch < 0 else epoch,
            collective=collective,
            nbytes=nbytes,
        )

    def message(self, location, nbytes):
        stack = self.stacks[location]
        if stack:
            stack[-1][7] = (stack[-1][7] or 0) + nbytes
        else:
            self.outside += 1

    def collective_end(self, location, op, sent, received):
        stack = self.stacks[location]
        if stack:
            self._collective_on(stack[-1], op, sent, received)
        else:
            self.outside += 1

    def collective_request(self, location, request):
        """A non-blocking collective (MPI_Iallreduce ...) completes in another
        region (MPI_Wait ...): its operation and bytes go to the region that
        requested it, as a blocking collective's go to its own."""
        stack = self.stacks[location]
        if stack:
            self.requested[(location, request)] = stack[-1]
            self.row_of[stack[-1][2]] = None
        else:
            self.outside += 1

    def collective_complete(self, location, op, sent, received, request):
        entry = self.requested.pop((location, request), None)
        if entry is None:  # no request seen: where it completes
            self.collective_end(location, op, sent, received)
            return
        row = self.row_of.get(entry[2])
        if row is None:  # the requesting region is still open
            self._collective_on(entry, op, sent, received)
        else:
            name = _collective_name(op)
            self.rows.collective[row] = name
            self.rows.bytes[row] = max(sent, received) if name else None

    @staticmethod
    def _collective_on(entry, op, sent, received):
        """Communicator management (CREATE_HANDLE ...) is no collective."""
        entry[6] = _collective_name(op)
        entry[7] = max(sent, received) if entry[6] else None

    def _step_attributes(self, attribute_list):
        import _otf2

        found = {}
        for i in range(_otf2.AttributeList_GetNumberOfElements(attribute_list)):
            ref, kind, value = _otf2.AttributeList_GetAttributeByIndex(attribute_list, i)
            name = self.attributes.get(ref)
            if name in STEP_ATTRIBUTES:
                found[name] = int(value.int64)
        return found.get("step"), found.get("epoch")


# OTF2's collective operations -> the collective names of every trace
# (traces/rules.yaml, the Kineto and Horovod readers); None: communicator
# and window management, no data moved.
COLLECTIVE_OPS = {
    "BARRIER": "barrier",
    "BCAST": "bcast",
    "GATHER": "gather",
    "GATHERV": "gather",
    "SCATTER": "scatter",
    "SCATTERV": "scatter",
    "ALLGATHER": "allgather",
    "ALLGATHERV": "allgather",
    "ALLTOALL": "all_to_all",
    "ALLTOALLV": "all_to_all",
    "ALLTOALLW": "all_to_all",
    "ALLREDUCE": "allreduce",
    "REDUCE": "reduce",
    "REDUCE_SCATTER": "reduce_scatter",
    "REDUCE_SCATTER_BLOCK": "reduce_scatter",
    "SCAN": "scan",
    "EXSCAN": "exscan",
    "CREATE_HANDLE": None,
    "DESTROY_HANDLE": None,
    "ALLOCATE": None,
    "DEALLOCATE": None,
    "CREATE_HANDLE_AND_ALLOCATE": None,
    "DESTROY_HANDLE_AND_DEALLOCATE": None,
}


# OTF2_CollectiveOp's names by value (OTF2_Events.h): the C reader's ops
# named without importing the bindings' enum
OPERATIONS = (
    *("BARRIER", "BCAST", "GATHER", "GATHERV", "SCATTER", "SCATTERV", "ALLGATHER"),
    *("ALLGATHERV", "ALLTOALL", "ALLTOALLV", "ALLTOALLW", "ALLREDUCE", "REDUCE"),
    *("REDUCE_SCATTER", "SCAN", "EXSCAN", "REDUCE_SCATTER_BLOCK", "CREATE_HANDLE"),
    *("DESTROY_HANDLE", "ALLOCATE", "DEALLOCATE", "CREATE_HANDLE_AND_ALLOCATE"),
    "DESTROY_HANDLE_AND_DEALLOCATE",
)


def _op_name(op: int) -> str:
    return OPERATIONS[op] if 0 <= op < len(OPERATIONS) else str(op)


def _collective_name(op) -> str | None:
    name = (getattr(op, "name", None) or str(op)).rsplit(".", 1)[-1]
    return COLLECTIVE_OPS.get(name, name.lower())


# OTF2's enums (OTF2_Definitions.h), as the `otf2` bindings number them
GROUP_PROCESS = 1  # OTF2_LOCATION_GROUP_TYPE_PROCESS
LOCATION_METRIC = 3  # OTF2_LOCATION_TYPE_METRIC


class Node(NamedTuple):
    """A system tree node: its name, class and parent's ref (None: the root)."""

    name: str
    class_name: str | None
    parent: int | None


class Group(NamedTuple):
    """A location group: its name, type, system tree node and creator (refs)."""

    name: str
    type: int
    node: int | None
    creator: int | None


class Location(NamedTuple):
    ref: int
    name: str
    type: int
    events: int
    group: Group


def _located(nodes: dict, groups: dict, locations: list) -> dict:
    """ref -> (rank, node, 'group/location') for every location with events
    worth reading (metric locations only hold metric samples); ``nodes`` and
    ``groups`` by ref in the archive's order, ``locations`` in its order."""
    process_index = {}
    for ref, group in groups.items():
        if group.type == GROUP_PROCESS:
            process_index[ref] = len(process_index)

    def rank_of(ref, seen=0):
        group = groups[ref]
        if ref not in process_index and group.creator is not None and seen < 8:
            return rank_of(group.creator, seen + 1)
        found = _RANK_IN_NAME.search(group.name or "")
        return int(found.group(1)) if found else process_index.get(ref, 0)

    def node_of(group) -> str:
        walk = group.node
        while walk is not None:
            if nodes[walk].class_name == "node":
                return nodes[walk].name
            walk = nodes[walk].parent
        return nodes[group.node].name if group.node is not None else ""

    out = {}
    for location in locations:
        if location.type == LOCATION_METRIC:
            continue
        group = groups.get(location.group)
        if group is None:
            raise ValueError(f"location {location.ref} has no location group")
        out[location.ref] = (
            rank_of(location.group),
            node_of(group),
            f"{group.name}/{location.name}",
        )
    return out


def _locations(defs) -> dict:
    """_located of the `otf2` bindings' definitions."""

    def ref(definition):
        return None if definition is None else definition._ref

    nodes = {n._ref: Node(n.name, n.class_name, ref(n.parent)) for n in defs.system_tree_nodes}
    groups = {
        g._ref: Group(
            g.name,
            g.location_group_type.value,
            ref(g.system_tree_parent),
            ref(getattr(g, "creating_location_group", None)),
        )
        for g in defs.location_groups
    }
    locations = [
        Location(loc._ref, loc.name, loc.type.value, loc.number_of_events, ref(loc.group))
        for loc in defs.locations
    ]
    return _located(nodes, groups, locations)


def _checked_locations(defs, path: Path):
    """The locations to read, once the definitions are known to be usable."""
    if defs.clock_properties is None:
        raise TraceError(f"{path}: the OTF2 definitions have no clock properties")
    try:
        return _locations(defs)
    except Exception as exc:
        raise TraceError(f"{path}: inconsistent OTF2 definitions: {_reason(exc)}") from None


class Clock(NamedTuple):
    timer_resolution: int
    global_offset: int
    realtime_timestamp: int


@dataclass(frozen=True)
class Definitions:
    """What the fast reader needs of an archive's global definitions, read
    in C (reader.c) or, where they do not resolve there, by the bindings."""

    locations: list  # (ref, events announced) of every location, in order
    located: dict  # ref -> (rank, node, name): the locations worth reading
    attribute_kinds: dict  # the step and epoch attributes: ref -> fastotf2.ATTR_*
    region_names: dict  # ref -> name
    context_regions: dict  # calling context ref -> its region's ref
    clock: Clock


def _definitions(path: Path) -> Definitions:
    """The archive's definitions, read in C where they resolve (no import
    of the ``otf2`` bindings); else by the bindings, which refuse a broken
    archive in their words."""
    found = fastotf2.definitions(path)
    if found is not None:
        with contextlib.suppress(Unresolved):
            return _resolved(*found)
    reader = _open(path)
    try:
        defs = reader.definitions
        located = _checked_locations(defs, path)
        clock = defs.clock_properties
        return Definitions(
            [(loc._ref, loc.number_of_events) for loc in defs.locations],
            located,
            _attribute_kinds({a._ref: a.name for a in defs.attributes}),
            {r._ref: r.name for r in defs.regions},
            _context_regions(defs),
            Clock(clock.timer_resolution, clock.global_offset, clock.realtime_timestamp),
        )
    finally:
        _close(reader)


def _attribute_kinds(names: dict) -> dict:
    return {
        ref: fastotf2.ATTR_STEP if name == "step" else fastotf2.ATTR_EPOCH
        for ref, name in names.items()
        if name in STEP_ATTRIBUTES
    }


class Unresolved(Exception):
    """Definitions that the bindings would not take as they are."""


UNDEFINED = 0xFFFFFFFF  # OTF2_UNDEFINED_UINT32: no reference


def _resolved(records: dict, blob: bytes) -> Definitions:
    """Definitions from reader.c's records, resolved as the ``otf2``
    bindings resolve them (a reference to a definition earlier in the file,
    a name string of UTF-8, "<Kind> #<ref>" where a name is undefined);
    Unresolved wherever they would not resolve, so that the bindings say
    what is wrong."""
    strings: dict = {}
    for ref, offset, length, seq in records["strings"]:
        try:
            strings[ref] = (blob[offset : offset + length].decode(), seq)
        except UnicodeDecodeError:
            raise Unresolved from None
    _unique(records["strings"], strings)

    def earlier(found: dict, ref: int, seq: int, optional: bool = True):
        """The definition ``ref`` stands for, None for no reference."""
        if ref == UNDEFINED and optional:
            return None
        if ref not in found or found[ref][-1] > seq:
            raise Unresolved
        return found[ref]

    def string(ref: int, seq: int) -> str | None:
        text = earlier(strings, ref, seq)
        return None if text is None else text[0]

    def named(kind: str, ref: int, name: int, seq: int) -> str:
        text = string(name, seq)
        return f"{kind} #{ref}" if text is None else text

    if len(records["clocks"]) != 1:
        raise Unresolved
    nodes: dict = {}
    for ref, name, class_name, parent, seq in records["nodes"]:
        earlier(nodes, parent, seq)
        node = Node(
            named("SystemTreeNode", ref, name, seq),
            string(class_name, seq),
            None if parent == UNDEFINED else parent,
        )
        nodes[ref] = (node, seq)
    groups: dict = {}
    for ref, name, kind, node, creator, seq in records["groups"]:
        earlier(nodes, node, seq)
        earlier(groups, creator, seq)
        group = Group(
            named("LocationGroup", ref, name, seq),
            kind,
            None if node == UNDEFINED else node,
            None if creator == UNDEFINED else creator,
        )
        groups[ref] = (group, seq)
    locations: list = []
    for ref, name, kind, events, group, seq in records["locations"]:
        earlier(groups, group, seq, optional=False)
        locations.append(Location(ref, named("Location", ref, name, seq), kind, events, group))
    regions: dict = {}
    for ref, name, canonical, description, file, seq in records["regions"]:
        for text in (canonical, description, file):
            string(text, seq)
        regions[ref] = (named("Region", ref, name, seq), seq)
    attributes: dict = {}
    for ref, name, description, seq in records["attributes"]:
        string(description, seq)
        attributes[ref] = (named("Attribute", ref, name, seq), seq)
    contexts: dict = {}
    for ref, region, where, parent, seq in records["contexts"]:
        earlier(regions, region, seq, optional=False)
        earlier(contexts, parent, seq)
        if where != UNDEFINED:  # source code locations are not kept: the bindings read them
            raise Unresolved
        contexts[ref] = (region, seq)
    for kind, found in (("nodes", nodes), ("groups", groups), ("regions", regions)):
        _unique(records[kind], found)
    _unique(records["attributes"], attributes)
    _unique(records["contexts"], contexts)
    if len({loc.ref for loc in locations}) != len(locations):
        raise Unresolved
    resolution, offset, realtime, _ = records["clocks"][0]
    return Definitions(
        [(loc.ref, loc.events) for loc in locations],
        _located(
            {ref: node for ref, (node, _) in nodes.items()},
            {ref: group for ref, (group, _) in groups.items()},
            locations,
        ),
        _attribute_kinds({ref: name for ref, (name, _) in attributes.items()}),
        {ref: name for ref, (name, _) in regions.items()},
        {ref: region for ref, (region, _) in contexts.items()},
        Clock(resolution, offset, realtime),
    )


def _unique(records: list, found: dict) -> None:
    """Two definitions of one ref: the bindings refuse the archive."""
    if len(found) != len(records):
        raise Unresolved


def _read_events(reader, path: Path):
    """(Rows, problems), location after location as the C reader does, so
    that a location that cannot be read to its end costs its own rows after
    the fault, not the others'."""
    import _otf2

    defs = reader.definitions
    locations = _checked_locations(defs, path)
    state = _State(defs, locations)
    if not locations:
        return state.rows, []
    # rank after rank, as the C reader reads them
    selected = sorted(
        (loc for loc in defs.locations if loc._ref in locations),
        key=lambda loc: locations[loc._ref][0],
    )
    handle = reader.handle
    try:
        for location in selected:
            _otf2.Reader_SelectLocation(handle, location._ref)
        def_files = _opened(_otf2.Reader_OpenDefFiles, handle)
        _opened(_otf2.Reader_OpenEvtFiles, handle)
    except Exception as exc:
        raise TraceError(
            f"{path}: cannot read the OTF2 events (truncated or corrupt?): {_reason(exc)}"
        ) from None
    errors: dict[int, str] = {}  # location ref -> why it was not read to its end
    if def_files:
        for location in selected:
            why = _read_local_definitions(handle, location._ref)
            if why:
                errors[location._ref] = why
        _otf2.Reader_CloseDefFiles(handle)
    callbacks, failures, _alive = _event_callbacks(state)
    folder = path.with_suffix("")
    for location in selected:
        if location._ref not in errors:
            why = _read_location_events(handle, location._ref, callbacks, failures)
            if not why and _ends_unfinished(folder / f"{location._ref}.evt"):
                why = UNFINISHED
            if why:
                errors[location._ref] = why
    _otf2.EvtReaderCallbacks_Delete(callbacks)
    _opened(_otf2.Reader_CloseEvtFiles, handle)
    unclosed = sum(len(s) for s in state.stacks.values())
    problems = _problems(
        path, unclosed, state.unbalanced, state.overlapping, state.outside, state.renamed
    )
    if errors:
        names = [locations[ref][2] for ref in errors]
        problems.insert(0, _lost_locations(path, names, len(selected), next(iter(errors.values()))))
    return state.rows, problems


UNFINISHED = "its event file ends unfinished (cut short, or never closed by its writer)"


def _ends_unfinished(events: Path) -> bool:
    """Whether an event file lacks the byte that every OTF2 writer ends a
    file with on closing it (END_OF_BUFFER, 1: otf2_buffer_finalize in the
    library's OTF2_Buffer.c). The library reads a file cut inside its last
    chunk into a buffer it fills only that far, decodes what the buffer held
    before, and may then find no fault at all: this says so whatever the
    buffer held. A file that is not there (another substrate, compressed)
    is the library's to judge."""
    try:
        with open(events, "rb") as file:
            if file.seek(0, os.SEEK_END) == 0:
                return False  # empty: the library says so
            file.seek(-1, os.SEEK_END)
            return file.read(1) != b"\x01"
    except OSError:
        return False


def _opened(call, handle) -> bool:
    """As the library's own readers do: a missing local definition or event
    file is not an error here (reading the location says what is missing)."""
    import _otf2

    try:
        call(handle)
    except _otf2.Error:
        return False
    return True


def _read_local_definitions(handle, ref: int) -> str:
    """'' when read (or when the location has none), else why not."""
    import _otf2

    reader = _otf2.Reader_GetDefReader(handle, ref)
    if not reader:
        return ""
    try:
        _otf2.Reader_ReadAllLocalDefinitions(handle, reader)
    except Exception as exc:
        return f"cannot read its local definitions: {_library_reason(exc)}"
    finally:
        _otf2.Reader_CloseDefReader(handle, reader)
    return ""


def _event_callbacks(state: _State):
    """(OTF2 local event callbacks into ``state``, the list that collects
    their errors, the Python callbacks: the bindings attach each ctypes
    function pointer to its Python callback only, so keep these alive while
    the library may call them)."""
    import _otf2

    failures: list[str] = []
    alive: list = []

    def guarded(fn):
        def callback(location, time, _position, _user, attribute_list, *args):
            try:
                fn(location, time, attribute_list, *args)
            except Exception as exc:  # the location's reading then stops
                failures.append(_reason(exc))
                return _otf2.CALLBACK_INTERRUPT
            return _otf2.CALLBACK_SUCCESS

        alive.append(callback)
        return callback

    callbacks = _otf2.EvtReaderCallbacks_New()
    _otf2.EvtReaderCallbacks_SetEnterCallback(callbacks, guarded(state.enter))
    _otf2.EvtReaderCallbacks_SetLeaveCallback(callbacks, guarded(state.leave))
    _otf2.EvtReaderCallbacks_SetCallingContextEnterCallback(
        callbacks,
        guarded(lambda loc, t, attrs, context, _unwound: state.context(loc, t, attrs, context)),
    )
    _otf2.EvtReaderCallbacks_SetCallingContextLeaveCallback(
        callbacks,
        guarded(lambda loc, t, attrs, context: state.context(loc, t, attrs, context, leave=True)),
    )
    for name in ("MpiSend", "MpiIsend", "MpiRecv", "MpiIrecv"):
        # one Python callback each: the bindings keep one pointer per callback
        message = guarded(
            lambda loc, t, attrs, peer, comm, tag, length, *request: state.message(loc, length)
        )
        getattr(_otf2, f"EvtReaderCallbacks_Set{name}Callback")(callbacks, message)
    _otf2.EvtReaderCallbacks_SetMpiCollectiveEndCallback(
        callbacks,
        guarded(
            lambda loc, t, attrs, op, comm, root, sent, received: state.collective_end(
                loc, op, sent, received
            )
        ),
    )
    _otf2.EvtReaderCallbacks_SetNonBlockingCollectiveRequestCallback(
        callbacks, guarded(lambda loc, t, attrs, request: state.collective_request(loc, request))
    )
    _otf2.EvtReaderCallbacks_SetNonBlockingCollectiveCompleteCallback(
        callbacks,
        guarded(
            lambda loc, t, attrs, op, comm, root, sent, received, request: (
                state.collective_complete(loc, op, sent, received, request)
            )
        ),
    )
    return callbacks, failures, alive


def _read_location_events(handle, ref: int, callbacks, failures: list) -> str:
    """Reads one location's events into the callbacks' state: '' when read
    to the end, else why not (its rows before the fault stay)."""
    import _otf2

    reader = _otf2.Reader_GetEvtReader(handle, ref)
    if not reader:
        return "cannot open its events"
    seen = len(failures)
    try:
        _otf2.Reader_RegisterEvtCallbacks(handle, reader, callbacks, None)
        _otf2.Reader_ReadAllLocalEvents(handle, reader)
    except Exception as exc:
        return failures[seen] if len(failures) > seen else _library_reason(exc)
    finally:
        _otf2.Reader_CloseEvtReader(handle, reader)
    return ""


def _library_reason(exc: Exception) -> str:
    """An OTF2 error as the C reader words it: name, then description."""
    name, description = getattr(exc, "name", None), getattr(exc, "description", None)
    return f"{name}: {description}" if name and description else _reason(exc)


def _lost_locations(path: Path, names: list[str], total: int, reason: str) -> Problem:
    """The problem of locations not read to their end (both readers)."""
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return Problem(
        f"{path}: {len(names)} of {total} locations could not be read to their end "
        f"({shown}): {reason}; their records up to the fault were kept"
    )


def _problems(
    path: Path, unclosed: int, unbalanced: int, overlapping: int, outside: int = 0, renamed: int = 0
) -> list[Problem]:
    return counted(
        path,
        (unclosed, "regions entered but never left (trace cut short?); left out", True),
        (unbalanced, "Leave records without a matching Enter; left out", True),
        (
            overlapping,
            "Leave records close a region that is not the innermost one open (exits "
            "out of order: a region left before one entered inside it); kept with "
            "their own times, overlapping without nesting",
            False,
        ),
        (
            outside,
            "MPI message or collective records outside any region; counted here, not "
            "in the table (no interval to hold them)",
            False,
        ),
        (
            renamed,
            "Leave records naming no open region closed the innermost one (as OTF2 "
            "says; APEX renames HPX tasks while they run)",
            False,
        ),
    )


def _read_events_fast(defs: Definitions, path: Path, only: set | None = None):
    """(Columns, problems) through traces/fastotf2, the locations read in
    parallel; a location that cannot be read to its end costs its own rows
    after the fault, not the others'."""
    locations = defs.located
    # rank after rank (as a group of ranks, a part, gives them), each rank's
    # locations in the definitions' order
    selected = sorted(
        (
            (ref, events)
            for ref, events in defs.locations
            if ref in locations and (only is None or ref in only)
        ),
        key=lambda location: locations[location[0]][0],
    )
    region_names = defs.region_names
    lookups = fastotf2.Lookups(defs.attribute_kinds, region_names, defs.context_regions)
    described = [locations[ref] for ref, _ in selected]  # (rank, node, name)
    nodes = list(dict.fromkeys(node for _, node, _ in described))
    folder = path.with_suffix("")
    try:
        raw, counts, seen, failed = fastotf2.read_intervals(
            path,
            fastotf2.Locations.of(
                [ref for ref, _ in selected],
                [events for _, events in selected],
                [_file_size(folder / f"{ref}.evt") for ref, _ in selected],
                [rank for rank, _, _ in described],
                [nodes.index(node) for _, node, _ in described],
            ),
            lookups,
        )
    except fastotf2.ReadError as exc:
        raise TraceError(
            f"{path}: cannot read the OTF2 events (truncated or corrupt?): {exc}"
        ) from None
    for name in ("start", "end"):
        _ticks_to_ns(raw[name], defs.clock)
    names, region = _region_codes(
        raw.pop("region"),
        seen["region"],
        [*(region_names[int(ref)] for ref in lookups.region_refs), "(undefined region)"],
    )
    raw_ops = raw.pop("collective")
    ops, collective, unnamed = _collective_codes(raw_ops, seen["collective"])
    nbytes = raw["bytes"]  # NULL where unknown, from the C reader
    if unnamed:  # communicator management present: no collective, no bytes
        nbytes[(raw_ops >= 0) & (collective < 0)] = NULL
    columns = Columns(
        rank=raw["rank"],
        node=raw["node"],
        node_names=nodes,
        location=raw["location"],
        location_names=[name for _, _, name in described],
        region=region,
        region_names=names,
        start_ns=raw["start"],
        end_ns=raw["end"],
        depth=raw["depth"],
        parent_row=raw["parent"],
        step=raw["step"],
        epoch=raw["epoch"],
        collective=collective,
        collective_names=ops,
        bytes=nbytes,
    )
    problems = _problems(
        path,
        counts["unclosed"],
        counts["unbalanced"],
        counts["overlapping"],
        counts["messages_outside"],
        counts["renamed"],
    )
    unfinished = [
        i
        for i, (ref, _) in enumerate(selected)
        if not failed[i] and _ends_unfinished(folder / f"{ref}.evt")
    ]
    if unfinished:
        counts["error"] = counts["error"] or UNFINISHED
        failed[unfinished] = True
    if failed.any():
        names = [described[i][2] for i in np.flatnonzero(failed)]
        # of the archive's locations, as the Python reader counts, not of
        # this part's (``only``)
        total = sum(ref in locations for ref, _ in defs.locations)
        problems.insert(0, _lost_locations(path, names, total, _library_words(counts["error"])))
    return columns, problems


def _context_regions(defs) -> dict[int, int]:
    """Calling context ref -> its region's ref (Score-P with unwinding
    records Enter and Leave as those of calling contexts)."""
    return {context._ref: context.region._ref for context in defs.calling_contexts}


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _library_words(error: str) -> str:
    """The C reader's first error, less the location reference it starts with."""
    return re.sub(r"^location \d+: ", "", error.strip()) or "unknown error"


def _ticks_to_ns(ticks: np.ndarray, clock) -> None:
    """In place, exactly as _State.ns does it."""
    realtime = clock.realtime_timestamp
    base = realtime if 0 < realtime < 2**63 else 0
    offset = clock.global_offset
    if clock.timer_resolution == 1_000_000_000 and 0 <= offset < 2**63:
        # one pass: the two int64 sums, wrapping as numpy's would
        ticks += (base - offset + 2**63) % 2**64 - 2**63
        return
    ticks -= clock.global_offset
    ticks[:] = np.rint(ticks.astype(np.float64) * (1e9 / clock.timer_resolution))
    ticks += base


def _region_codes(index: np.ndarray, seen: np.ndarray, names: list) -> tuple[list, np.ndarray]:
    """The C reader's region indices (``names``' order) -> (names, codes):
    one code per region the rows use (``seen``), in that order."""
    used = np.flatnonzero(seen)
    if used.size == 0 or used[-1] == used.size - 1:  # the first ones: indices are codes
        return names[: used.size], index.view(np.int32)
    code_of = np.full(len(names), -1, dtype=np.int32)
    code_of[used] = np.arange(used.size, dtype=np.int32)
    return [names[i] for i in used.tolist()], code_of.take(index)


def _collective_codes(ops: np.ndarray, seen: np.ndarray) -> tuple[list, np.ndarray, bool]:
    """OTF2 collective ops (-1: none; ``seen``: those the rows hold) ->
    (names, codes, whether some op is no collective); ops that are no
    collective (communicator management) take -1 as well."""
    present = np.flatnonzero(seen)
    named = [_collective_name(_op_name(int(op))) for op in present]
    names = list(dict.fromkeys(n for n in named if n))
    # one more entry, -1, for op -1 (numpy's index -1 is the last)
    code_of = np.full(seen.size + 1, -1, dtype=np.int32)
    code_of[present] = [names.index(n) if n else -1 for n in named]
    return names, code_of.take(ops), None in named


@register
class Otf2Reader(Reader):
    """OTF2 archives by their anchor file; in a run folder, our tracer's
    archive and Score-P's experiment."""

    name = "otf2"
    patterns = (
        "*.otf2",
        "trace/traces.otf2",
        "scorep/traces.otf2",
        "scorep/rank*/traces.otf2",
        "rank*/traces.otf2",
    )

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return path.suffix == ".otf2"

    def read(self, path: Path, rules, run_id: str = ""):
        return read(path, rules, run_id)

    def parts(self, path: Path, rules, run_id: str = ""):
        return read_parts(path, rules, run_id)


def separate_threads(c: Columns) -> Columns:
    """Undo what several threads recorded on one location do to nesting.

    Score-P's Python bindings record Horovod's background thread on the
    master thread's location: its MPI calls then seem to run inside whatever
    user region the master thread is in, a collective's end record lands on
    that region when it is innermost, and regions overlap without nesting.
    On a location where a row outlives its parent (the sign of two threads),
    MPI regions and the others form two separate nestings: a collective
    record (and message bytes) on a user region goes to the MPI region it
    ran in, and no user region is the parent of an MPI call or the reverse.
    Elsewhere nothing changes."""
    parent = c.parent_row
    if fastjson.any_outlives(parent, c.end_ns) is False:  # one C pass, no arrays
        return c
    has = parent >= 0
    up = np.maximum(parent, 0)
    outlives = has & (c.end_ns > c.end_ns[up])
    if not outlives.any():
        return c
    mixed = np.isin(c.location, np.unique(c.location[outlives]))
    is_mpi_region = np.array([str(n).startswith("MPI_") for n in c.region_names], dtype=bool)
    mpi = is_mpi_region[c.region] if c.region.size else np.zeros(0, dtype=bool)
    # Records on a user region that belong to the MPI region it sits in (the
    # nearest one still without a collective of its own).
    moved = np.flatnonzero(mixed & ~mpi & ((c.collective >= 0) | (c.bytes != NULL)))
    target = _nearest(parent, mpi & (c.collective < 0), moved)
    ok = target >= 0
    moved, target = moved[ok], target[ok]
    c.collective[target] = c.collective[moved]
    np.maximum.at(c.bytes, target, c.bytes[moved])
    c.collective[moved] = -1
    c.bytes[moved] = NULL
    # Two nestings: MPI calls do not nest in one thread, so on such a
    # location each is a call of its own; the other regions keep their
    # nearest ancestor that is not an MPI call.
    new_parent = parent.copy()
    new_parent[mixed & mpi] = -1
    rows = np.flatnonzero(mixed & ~mpi & has & mpi[up])
    new_parent[rows] = _nearest(parent, ~mpi, rows)
    c.parent_row = new_parent
    c.depth = nesting.depths(new_parent)
    return c


def _nearest(parent: np.ndarray, wanted: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each row, its nearest strict ancestor where ``wanted``; -1 if none."""
    found = np.full(len(rows), -1, dtype=np.int64)
    at = parent[rows].copy()
    active = np.flatnonzero(at >= 0)
    while active.size:
        here = at[active]
        hit = wanted[here]
        found[active[hit]] = here[hit]
        active = active[~hit]
        at[active] = parent[at[active]]
        active = active[at[active] >= 0]
    return found
