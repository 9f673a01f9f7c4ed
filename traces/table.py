"""The phase table: one row per matched interval (an Enter with its Leave, a
begin with its end, a complete event), whatever the trace format.

Columns (schema version in the Parquet metadata, key ``ddlcompare.schema_version``):

- ``run_id``, ``rank``, ``node`` (host name), ``location`` (thread, stream,
  tensor: where the interval happened), ``source`` (the reader);
- ``step``, ``epoch``: the training step and epoch it belongs to (null when
  outside steps or unknown);
- ``phase``: one of runfiles.phases.PHASES, or ``step`` for the interval that
  encloses a whole step; ``region``: the name in the trace;
- ``start_ns``, ``end_ns``, ``dur_ns``: on the trace's own clock (Unix epoch
  where the trace gives it), in nanoseconds;
- ``depth`` (0 at top level), ``parent`` (the enclosing region's name);
- ``collective`` (allreduce, bcast, ... or null), ``bytes`` (message or
  buffer size of a collective or message, null when unknown): one row per
  real collective carries them, the outermost of the nested records a trace
  may give it (a c10d call, its NCCL record, the kernel; Horovod's
  ALLREDUCE and MPI_ALLREDUCE);
- ``op_id``: that collective row's id (unique in the table), on it and on
  every record nested in it, so that the kernel of an all-reduce finds its
  instance; null elsewhere.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from traces import arrow_kernels as ak
from traces import fastjson, nesting
from runfiles.phases import EPOCH, MARKERS, PHASES, STEP, STEP_PHASES
from traces.rules import PhaseRules

if TYPE_CHECKING:
    # pandas is imported by the functions that use it, on paths an OTF2
    # archive with step intervals does not take: `ddlc import` of one then
    # starts without it (about a third of its imports)
    import pandas as pd

# Version 3: the text columns dictionary-encoded (version 2 held them as
# plain strings; a table of version 2 casts to this schema, see
# analysis/collect.py's phase_tables).
SCHEMA_VERSION = 3
# A trace has few distinct names: each text column is a dictionary (codes
# into its names), as the readers already hold it, not a string per row.
TEXT = pa.dictionary(pa.int32(), pa.string())
SCHEMA = pa.schema(
    [
        ("run_id", TEXT),
        ("rank", pa.int32()),
        ("node", TEXT),
        ("location", TEXT),
        ("step", pa.int64()),
        ("epoch", pa.int64()),
        ("phase", TEXT),
        ("region", TEXT),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("depth", pa.int32()),
        ("parent", TEXT),
        ("collective", TEXT),
        ("bytes", pa.int64()),
        ("source", TEXT),
        ("op_id", pa.int64()),
    ]
)
COLUMNS = tuple(SCHEMA.names)
META_VERSION = b"ddlcompare.schema_version"


class Rows:
    """Column lists a reader fills, one entry per interval.

    ``row_id`` identifies the interval (given when it opens) and ``parent_id``
    the interval it runs in (None at top level), so that unmatched regions can
    take their parent's phase and step."""

    FIELDS = (
        "rank",
        "node",
        "location",
        "step",
        "epoch",
        "region",
        "start_ns",
        "end_ns",
        "depth",
        "collective",
        "bytes",
        "row_id",
        "parent_id",
    )

    def __init__(self):
        for name in self.FIELDS:
            setattr(self, name, [])

    def add(
        self,
        rank,
        node,
        location,
        region,
        start_ns,
        end_ns,
        depth,
        row_id,
        parent_id,
        step=None,
        epoch=None,
        collective=None,
        nbytes=None,
    ) -> None:
        self.rank.append(rank)
        self.node.append(node)
        self.location.append(location)
        self.region.append(region)
        self.start_ns.append(start_ns)
        self.end_ns.append(end_ns)
        self.depth.append(depth)
        self.row_id.append(row_id)
        self.parent_id.append(parent_id)
        self.step.append(step)
        self.epoch.append(epoch)
        self.collective.append(collective)
        self.bytes.append(nbytes)

    def __len__(self) -> int:
        return len(self.region)


def empty_table() -> pa.Table:
    # not SCHEMA.empty_table(): that imports pandas (a third of the imports
    # of `ddlc import`)
    return pa.Table.from_batches([], schema=SCHEMA)


NULL = np.iinfo(np.int64).min  # a missing step, epoch or byte count in Columns


@dataclass
class Columns:
    """Intervals as numpy arrays, one entry per row; names as codes into short
    lists (a trace has few distinct regions, locations and nodes, so the
    rules run once per name, not once per row).

    Codes of -1 and integers equal to NULL stand for a missing value;
    ``parent_row`` is the row of the enclosing interval, -1 at top level."""

    rank: np.ndarray
    node: np.ndarray
    node_names: list
    location: np.ndarray
    location_names: list
    region: np.ndarray
    region_names: list
    start_ns: np.ndarray
    end_ns: np.ndarray
    depth: np.ndarray
    parent_row: np.ndarray
    step: np.ndarray
    epoch: np.ndarray
    collective: np.ndarray
    collective_names: list
    bytes: np.ndarray

    @classmethod
    def of_rows(cls, rows: Rows) -> Columns:
        node, node_names = _codes(rows.node)
        location, location_names = _codes(rows.location)
        region, region_names = _codes(rows.region)
        collective, collective_names = _codes(rows.collective)
        return cls(
            np.asarray(rows.rank, dtype=np.int64),
            node,
            node_names,
            location,
            location_names,
            region,
            region_names,
            np.asarray(rows.start_ns, dtype=np.int64),
            np.asarray(rows.end_ns, dtype=np.int64),
            np.asarray(rows.depth, dtype=np.int64),
            _parent_rows(rows.row_id, rows.parent_id),
            _nullable(rows.step),
            _nullable(rows.epoch),
            collective,
            collective_names,
            _nullable(rows.bytes),
        )

    def without_backwards(self) -> tuple[Columns, int]:
        """These intervals less those that end before they begin (a writer's
        clock went back: no duration to give them), and how many: the rows
        inside one move up to its own parent, one level less deep."""
        backwards = self.end_ns < self.start_ns
        dropped = int(backwards.sum())
        if not dropped:
            return self, 0
        parent, depth = self.parent_row.copy(), self.depth.copy()
        while (lift := (parent >= 0) & backwards[np.maximum(parent, 0)]).any():
            parent[lift] = self.parent_row[parent[lift]]  # one dropped level at a time
            depth[lift] -= 1
        kept = ~backwards
        new_row = np.cumsum(kept) - 1
        parent = np.where(parent >= 0, new_row[np.maximum(parent, 0)], -1)
        arrays = {
            f.name: getattr(self, f.name)[kept]
            for f in fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)
        }
        arrays.update(parent_row=parent[kept], depth=depth[kept])
        return replace(self, **arrays), dropped


def _codes(values: list) -> tuple[np.ndarray, list]:
    import pandas as pd

    codes, names = pd.factorize(pd.Series(values, dtype=object))
    return codes.astype(np.int32), list(names)


def _nullable(values: list) -> np.ndarray:
    import pandas as pd

    return pd.array(values, dtype="Int64").to_numpy(dtype=np.int64, na_value=NULL)


def _parent_rows(row_ids: list, parent_ids: list) -> np.ndarray:
    """Row index of each row's parent interval, -1 at top level."""
    import pandas as pd

    index = pd.Series(np.arange(len(row_ids)), index=np.asarray(row_ids))
    parents = pd.Series(parent_ids, dtype=object)
    has = parents.notna().to_numpy()
    out = np.full(len(row_ids), -1, dtype=np.int64)
    if has.any():
        found = index.reindex(parents[has].to_numpy()).to_numpy()
        out[has] = np.where(np.isnan(found), -1, found).astype(np.int64)
    return out


def finish(rows: Rows, rules: PhaseRules, source: str, run_id: str = "") -> pa.Table:
    """The phase table of a reader's rows (see :func:`finish_columns`)."""
    if len(rows) == 0:
        return empty_table()
    return finish_columns(Columns.of_rows(rows), rules, source, run_id)


_PHASE_NAMES = [*PHASES, *MARKERS]
_PHASE = {name: code for code, name in enumerate(_PHASE_NAMES)}
PHASE_CODE = _PHASE  # phase name -> its code in finish_columns' phase array


def finish_columns(
    c: Columns,
    rules: PhaseRules,
    source: str,
    run_id: str = "",
    metadata: dict | None = None,
    place=None,
    join=None,
) -> pa.Table:
    """Phases from the rules, then step and epoch: from the trace, from the
    enclosing interval, or from the step interval the row starts in.
    ``place(c, phase, is_step)``: a reader's own way to give phases (codes of
    PHASE_CODE) to rows no rule matched (-1), in place, before they pass to
    the rows inside them. ``join(c, collective, rows, top)``: a reader's own
    way to tell records of one collective that do not nest (``top``: the
    instance each collective row belongs to; returns it changed).

    Consumes ``c``: its arrays become the table's or change in place."""
    n = len(c.start_ns)
    if n == 0:
        return empty_table()
    notes: dict = {}
    columns = _columns(c, rules, source, run_id, place, join, notes)
    table = pa.Table.from_arrays([columns[name] for name in COLUMNS], schema=SCHEMA)
    return table.replace_schema_metadata(
        {
            META_VERSION: str(SCHEMA_VERSION).encode(),
            b"ddlcompare.rules_version": str(rules.version).encode(),
            **notes,
            **(metadata or {}),
        }
    )


META_UNRECOGNISED = b"ddlcompare.unrecognised_communication"
# Words of communication in a region's name: what a collective of a library
# the rules do not know yet would likely be called.
LOOKS_LIKE_COMMUNICATION = re.compile(
    r"(?i)nccl|rccl|hccl|ccl[:_]|gloo|mscclpp|nvshmem|symm_mem|multimem|all_?reduce|"
    r"all_?gather|reduce_?scatter|all_?to_?all|broadcast|bcast|custom_?ar\b|lamport"
)
NOT_COMMUNICATION = re.compile(r"(?i)^aten::|wait|init|destroy|abort|copy|unique_?id")
# The same in lower case, for ASCII names in lower case: (?i) costs about six
# times the search (the bench's 31,000 Kineto names: 126 ms against 21,
# beside other work; the patterns are written in lower case). Where a name
# is not ASCII, (?i) decides (its Kelvin sign is a k, its long s an s).
_LOWER_COMMUNICATION, _LOWER_NOT_COMMUNICATION = (
    re.compile(p.pattern.removeprefix("(?i)"))
    for p in (LOOKS_LIKE_COMMUNICATION, NOT_COMMUNICATION)
)


META_UNSIZED = b"ddlcompare.unsized_collectives"


def _unsized(collective: np.ndarray, names: list, nbytes: np.ndarray) -> dict:
    """{META_UNSIZED: JSON {collective: count}} of the collectives whose
    bytes the trace does not give on any of their records (the start-up
    broadcast of the parameters, a Horovod Timeline's, often has none; a
    barrier sends none and is not counted): their bytes are unknown, not 0,
    and a table summed over them would say less than was sent; {} when
    every one has. Called after _collective_instances: one row per
    instance holds its collective, with the largest bytes of its records,
    so a count of rows is one of instances (no search for duplicates: a
    hash of 700 k op_ids cost 0.25 s)."""
    unknown = collective[(collective >= 0) & (nbytes == NULL)]
    if unknown.size == 0:
        return {}
    counts = np.bincount(unknown, minlength=len(names))
    unsized: dict[str, int] = {}
    for code in np.flatnonzero(counts).tolist():
        if names[code] != "barrier":
            unsized[names[code]] = unsized.get(names[code], 0) + int(counts[code])
    return {META_UNSIZED: json.dumps(unsized).encode()} if unsized else {}


@functools.lru_cache(maxsize=1 << 16)
def _looks_like_communication(name) -> bool:
    """Asked once per name, not once per name and file (a trace's ranks
    share their names)."""
    if not isinstance(name, str):
        return False
    if name.isascii():
        name = name.lower()
        return _LOWER_COMMUNICATION.search(
            name
        ) is not None and not _LOWER_NOT_COMMUNICATION.search(name)
    return LOOKS_LIKE_COMMUNICATION.search(name) is not None and not NOT_COMMUNICATION.search(name)


def _unrecognised_communication(
    c: Columns, unmatched: np.ndarray, op_id: np.ndarray, tree: _Nesting
) -> dict:
    """{META_UNRECOGNISED: JSON [[name, rows], ...]} of the regions whose
    name looks like communication but that no rule knows (``unmatched``:
    whether no rule matched each region name), that are no collective
    and neither in one nor around one (a user's annotation of it), most
    rows first; {} when there is none."""
    suspects = [
        code
        for code in np.flatnonzero(unmatched).tolist()
        if _looks_like_communication(c.region_names[code])
    ]
    if not suspects:
        return {}
    near = op_id != NULL  # in a collective (or one), then around one
    for rows in reversed(tree.levels):
        near[c.parent_row[rows[near[rows]]]] = True
    loose = np.isin(c.region, suspects) & ~near
    counts = np.bincount(c.region[loose], minlength=len(c.region_names))
    found = sorted(
        ((c.region_names[code], int(counts[code])) for code in suspects if counts[code]),
        key=lambda item: -item[1],
    )
    return {META_UNRECOGNISED: json.dumps(found).encode()} if found else {}


def _columns(
    c: Columns,
    rules: PhaseRules,
    source: str,
    run_id: str,
    place,
    join,
    notes: dict,
) -> dict:
    """The table's columns by name (see :func:`finish_columns`); ``notes``:
    metadata for the table, filled."""
    n = len(c.start_ns)
    tree = _Nesting(c.parent_row, c.depth)
    first = rules.first_rules(c.region_names, source)
    # each rule's phase, and -1 last: what first's -1 (no rule) takes
    rule_phase = np.array([_PHASE[r.phase] for r in rules.rules] + [-1], dtype=np.int8)
    phase = rule_phase[first].take(c.region)
    is_step = phase == _PHASE[STEP]
    if place is not None:
        place(c, phase, is_step)
    is_epoch = phase == _PHASE[EPOCH]
    # what the unmatched rows inside a step or an epoch take
    phase[is_step | is_epoch] = _PHASE["other"]
    tree.inherit(phase, -1)
    if source == "otf2" and _phases_of_teams(c, phase):
        tree.inherit(phase, -1)
    phase[phase < 0] = _PHASE["other"]
    phase[is_step] = _PHASE[STEP]
    phase[is_epoch] = _PHASE[EPOCH]

    collective_names, rule_collective = _rule_collectives(c.collective_names, rules, first)
    collective = _collectives_by_rule(c, rule_collective[first])
    bcast = collective_names.index("bcast") if "bcast" in collective_names else -2
    _communication_by_context(phase, tree, collective, bcast)
    op_id = _collective_instances(c, collective, tree, join, by_rank=source == "otf2")
    notes.update(_unrecognised_communication(c, first < 0, op_id, tree))
    notes.update(_unsized(collective, collective_names, c.bytes))

    step, epoch = c.step, c.epoch  # filled in place
    _number_steps(c, is_step, step)
    _number_epochs(c, is_epoch, epoch)
    del is_epoch
    tree.inherit(step, NULL)
    tree.inherit(epoch, NULL)
    _steps_by_time(c, phase, step, epoch)
    _steps_of_launches(c, tree, step, epoch)
    del tree
    regions = _distinct(c.region_names)  # once for region and parent (Kineto: ~30 k)
    # the parent's region read through parent_row: no column of codes; read
    # before _durations writes over parent_row
    parent = _dictionary(regions, c.region, c.parent_row)
    zeros = from_numpy(np.zeros(n, dtype=np.int32))
    columns = {
        "run_id": _one_value(run_id, zeros),
        "rank": from_numpy(c.rank.astype(np.int32, copy=False)),
        "step": _integers(step),
        "epoch": _integers(epoch),
        "start_ns": from_numpy(c.start_ns),
        "end_ns": from_numpy(c.end_ns),
        "dur_ns": from_numpy(_durations(c)),
        "depth": from_numpy(c.depth.astype(np.int32, copy=False)),
        "bytes": _integers(c.bytes),
        "source": _one_value(source, zeros),
        "op_id": _integers(op_id),
        # Codes and names, as the readers hold them: no string per row to
        # build (the take and ~250 MiB of new memory for 7 M rows, that
        # plain strings cost), and a table of a few bytes per text cell.
        "region": _dictionary(regions, c.region),
        "location": _dictionary(_distinct(c.location_names), c.location),
        "node": _dictionary(_distinct(c.node_names), c.node),
        "parent": parent,
        "phase": _dictionary(_distinct(_PHASE_NAMES), phase),
        "collective": _dictionary(_distinct(collective_names), collective),
    }
    return columns


def _durations(c: Columns) -> np.ndarray:
    """end_ns - start_ns, written over parent_row where it can be (its
    last reader is done by then, and finish_columns consumes ``c``): the
    column then takes no fresh memory, whose every page the kernel zeroes
    as it is first written (OTF2, 3 M rows: 5.9 k page faults fewer, some
    2 % of the in-process conversion's CPU)."""
    into = c.parent_row
    if (
        into.dtype == np.int64
        and into.flags.writeable
        and into.flags.c_contiguous
        and into.shape == c.start_ns.shape
        and not any(
            np.may_share_memory(into, other)
            for other in (c.start_ns, c.end_ns, c.step, c.epoch, c.bytes, c.rank, c.depth)
        )
    ):
        return np.subtract(c.end_ns, c.start_ns, out=into)
    return c.end_ns - c.start_ns


# The phase communication takes by the phase of the code it runs in (the
# nearest enclosing row that is not communication): only in the backward
# pass and the optimizer, or outside any phase (a communication thread's,
# a GPU stream's without its launch), is it the exchange of gradients; in
# start-up it is init; anywhere else other_comm (docs/tracing.md).
_COMMUNICATION = np.array([_PHASE["grad_comm"], _PHASE["other_comm"]], dtype=np.int8)
_COMM_IN = np.full(len(_PHASE_NAMES), _PHASE["other_comm"], dtype=np.int8)
_COMM_IN[[_PHASE[p] for p in ("backward", "optimizer", STEP, EPOCH)]] = _PHASE["grad_comm"]
_COMM_IN[_PHASE["init"]] = _PHASE["init"]


def _communication_by_context(
    phase: np.ndarray, tree: _Nesting, collective: np.ndarray, bcast: int
) -> None:
    """In place: the outermost grad_comm row of each nest of communication
    takes the phase of communication in its context (_COMM_IN), the rows
    inside it take its phase. One outside any phase stays grad_comm, but
    a broadcast (``collective`` equal to ``bcast``): that is the start-up
    broadcast of the parameters (init, as a Horovod Timeline's; one in a
    step is inside a phase). One C pass where the nesting has an order
    (some eight numpy passes and their arrays over every row otherwise)."""
    if tree.order and phase.dtype == np.int8 and phase.flags.c_contiguous:
        codes = (_PHASE["grad_comm"], _PHASE["other_comm"], _PHASE["init"])
        if fastjson.communication_by_context(
            phase, tree.parent_row, collective, bcast, tree.order, codes, _COMM_IN
        ):
            return
    comm = phase == _PHASE["grad_comm"]
    if not comm.any():
        return
    parent = tree.parent_row
    in_comm = np.isin(phase, _COMMUNICATION)
    context = phase.copy()
    context[in_comm] = -1
    tree.inherit(context, -1)
    outer = comm & ((parent < 0) | ~in_comm[np.maximum(parent, 0)])
    placed = phase.copy()
    placed[comm & ~outer] = -1  # takes its outermost communication's
    known = outer & (context >= 0)
    placed[known] = _COMM_IN[context[known]]
    placed[outer & (context < 0) & (collective == bcast)] = _PHASE["init"]
    tree.inherit(placed, -1)
    phase[:] = placed


def _collectives_by_rule(c: Columns, of_region: np.ndarray) -> np.ndarray:
    """The reader's collective of each row, else the one the rules give its
    region (``of_region``, -1: none): c.collective, in place. Only the rows
    of regions that a rule makes collectives are looked at."""
    collective = c.collective.astype(np.int32, copy=False)
    regions = np.flatnonzero(of_region >= 0)
    if regions.size == 0:
        return collective
    ruled = np.zeros(len(of_region), dtype=np.bool_)
    ruled[regions] = True
    rows = np.flatnonzero(ruled.take(c.region) & (collective < 0))
    collective[rows] = of_region[c.region[rows]]
    return collective


def _rule_collectives(names: list, rules: PhaseRules, first: np.ndarray):
    """(``names`` and after them the collectives the rules name, in the order
    their first regions come; the code of each rule's collective among
    them, and -1 last: what first's -1, no rule, takes)."""
    names = list(names)
    used = first[first >= 0]
    in_order = used[np.sort(np.unique(used, return_index=True)[1])]
    for index in in_order.tolist():
        name = rules.rules[index].collective
        if name and name not in names:
            names.append(name)
    code: dict = {}
    for i, name in enumerate(names):
        code.setdefault(name, i)
    return names, np.array(
        [code.get(r.collective, -1) if r.collective else -1 for r in rules.rules] + [-1],
        dtype=np.int32,
    )


def _collective_instances(
    c: Columns, collective: np.ndarray, tree: _Nesting, join=None, by_rank: bool = False
) -> np.ndarray:
    """One instance per real collective: a collective row nested in another
    gives it its bytes (the largest known) and is no collective of its own;
    so does one that ``join`` (a reader's) puts under another.
    Returns op_id (in place, ``collective`` and ``c.bytes`` change).

    ``by_rank`` (an OTF2 archive, read a group of whole ranks at a time):
    an instance's id is the number of rows of smaller ranks, then its place
    among its rank's instances by time, so that it does not depend on how
    the ranks were grouped (the groups' rows come in rank order, and the
    converter adds the rows of the groups before)."""
    marked = collective >= 0
    rows = np.flatnonzero(marked)
    top = nesting.outermost(c.parent_row, marked, rows)
    if join is not None and rows.size:
        top = join(c, collective, rows, top)
    inner = top != rows
    nested, top_of_nested = rows[inner], top[inner]
    np.maximum.at(c.bytes, top_of_nested, c.bytes[nested])
    collective[nested] = -1
    c.bytes[nested] = NULL
    # Numbered by time (then place), not by row, so that the id does not
    # depend on the order a reader found the rows in.
    instances = rows[~inner]
    start = c.start_ns[instances]
    by_start = np.argsort(start, kind="stable")  # a merge of the locations' runs
    if (np.diff(start[by_start]) == 0).any():  # ties: the other keys decide
        by_start = np.lexsort(
            (c.region[instances], c.location[instances], c.end_ns[instances], start)
        )
    order = instances[by_start]
    op_id = np.full(len(collective), NULL, dtype=np.int64)
    if by_rank and order.size:
        op_id[order] = _numbered_by_rank(c.rank, order)
    else:
        op_id[order] = np.arange(order.size)
    op_id[nested] = op_id[top_of_nested]
    if rows.size:  # only rows below the shallowest collective can inherit one
        shallowest = c.depth[rows].min()
        tree.inherit(op_id, NULL, below=shallowest)
    return op_id


def _numbered_by_rank(rank: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The id of each instance of ``order`` (by time): the rows of smaller
    ranks, then its place among its rank's instances by time. Ranks are
    counted, not searched: their few values index small tables (a search
    of each instance's rank among all of them was 94 M instructions of an
    in-process reading of the bench's 7 M-event archive)."""
    low = int(rank.min())
    key = rank[order] if low == 0 else rank[order] - low
    if key.max() < 1 << 16:  # numpy's stable sort of 16-bit keys is a radix sort
        key = key.astype(np.uint16)
    order_by_rank = np.argsort(key, kind="stable")  # by time within a rank
    key = key[order_by_rank]
    rows_of_rank = np.bincount(rank if low == 0 else rank - low)
    instances_of_rank = np.bincount(key, minlength=rows_of_rank.size)
    # rows of smaller ranks less the instances of smaller ranks: plus the
    # instance's place in the whole order, its place in its rank's
    offset = np.cumsum(rows_of_rank) - rows_of_rank
    offset -= np.cumsum(instances_of_rank) - instances_of_rank
    numbered = np.empty(order.size, dtype=np.int64)
    numbered[order_by_rank] = offset.take(key) + np.arange(order.size)
    return numbered


def _dictionary(distinct: tuple, codes: np.ndarray, via=None) -> pa.DictionaryArray:
    """names[code] per row as a dictionary array (``distinct``: the names'
    :func:`_distinct`), null where the code is -1 or its name None
    (``via``: the code of row via[i], null where that is -1). The codes are
    the array's own where they can be (no copy)."""
    values, new_code = distinct
    if via is not None:
        codes = codes.take(via)  # via's -1 takes the last row's: nulled next
        codes[via < 0] = -1
    if new_code is not None:  # the code of -1 is the last: -1
        codes = new_code.take(codes)
    codes = codes.astype(np.int32, copy=False)
    # -1 becomes a null of the validity mask, not a null among the names:
    # Arrow's and pandas' null tests (is_null, notna) see only the mask.
    # Checked against the names here (Arrow's own check, safe=True, takes
    # four times as long where there are nulls).
    if codes.size and codes.max() >= len(values):
        raise IndexError(f"a code past the {len(values)} names")
    missing = codes < 0 if codes.size and codes.min() < 0 else None
    return pa.DictionaryArray.from_arrays(from_numpy(codes, missing), values, safe=False)


def _distinct(names: list) -> tuple[pa.Array, np.ndarray | None]:
    """(the names once each, not None, as an Arrow array; None, or each
    old code's new code and -1 last, where they differ): two regions of
    one name (OTF2 definitions may repeat a name) are one value of a
    dictionary (pandas' categories must be distinct). In Arrow, not a
    Python loop: a Kineto trace has some 30 k names a file. Kept for the
    next ask: a trace's files (one a rank) often hold the same names, and
    a tuple of them is hashed in a fraction of the time they are built."""
    return _distinct_of(tuple(names))


# a table asks 5 lists (regions, locations, nodes, phases, collectives):
# 8 keep the regions' from one file to the next, and hold at most about
# three files' names where every file's differ
@functools.lru_cache(maxsize=8)
def _distinct_of(names: tuple) -> tuple[pa.Array, np.ndarray | None]:
    values = strings(names)
    if values.null_count == 0 and len(set(names)) == len(names):
        return values, None
    encoded = ak.dictionary_encode(values)  # None stays null: code -1
    new_code = to_numpy(ak.fill_null(encoded.indices, -1)).astype(np.int32)
    return encoded.dictionary, np.append(new_code, np.int32(-1))


def _one_value(value: str, zeros: pa.Array) -> pa.DictionaryArray:
    """``value`` on each row: a dictionary of one name, its codes ``zeros``
    (an int32 array of zeros: not a copy of the name per row). The columns
    of one value share one array of zeros (Arrow's arrays are immutable): a
    second would be as many fresh pages again, zeroed (calloc)."""
    # safe=False: Arrow's check would read every zero, faulting in pages
    # that np.zeros leaves untouched
    return pa.DictionaryArray.from_arrays(zeros, strings([value]), safe=False)


def _integers(values: np.ndarray) -> pa.Array:
    missing = values == NULL
    return from_numpy(values, missing if missing.any() else None)


# The table's arrays are made from their buffers, not by pa.array(): that
# looks for pandas first, and importing it is a third of the start-up of
# `ddlc import` of an OTF2 archive, which needs nothing else of pandas.


def from_numpy(values: np.ndarray, missing: np.ndarray | None = None) -> pa.Array:
    """A numpy array as Arrow's, sharing its memory; null where ``missing``."""
    values = np.ascontiguousarray(values)
    validity, nulls = None, 0
    if missing is not None:
        nulls = int(np.count_nonzero(missing))
        if nulls == len(values):  # a trace without epochs: no mask to pack
            validity = pa.py_buffer(np.zeros((len(values) + 7) // 8, dtype=np.uint8))
        else:
            validity = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(values.dtype),
        len(values),
        [validity, pa.py_buffer(values)],
        null_count=nulls,
    )


def to_numpy(array: pa.Array) -> np.ndarray:
    """An Arrow array of integers or booleans without nulls as numpy's (the
    integers sharing its memory, read-only): what ``array.to_numpy()``
    gives, without the look for pandas that imports it."""
    if array.null_count:
        raise ValueError("to_numpy: an array with nulls")
    start, n = array.offset, len(array)
    if n == 0:
        return np.zeros(0, dtype=np.bool_ if pa.types.is_boolean(array.type) else str(array.type))
    if pa.types.is_boolean(array.type):
        bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        return np.unpackbits(bits, count=start + n, bitorder="little")[start:].view(np.bool_)
    dtype = np.dtype(str(array.type))  # int8 ... uint64 are numpy's names too
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=n, offset=start * dtype.itemsize)


def strings(names: list | tuple) -> pa.StringArray:
    """``pa.array(names, pa.string())``: None is null."""
    encoded = [b"" if name is None else name.encode() for name in names]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    present = np.array([name is not None for name in names], dtype=bool)
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(
        pa.string(),
        len(encoded),
        [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
        null_count=int(len(present) - np.count_nonzero(present)),
    )


class _Nesting:
    """The rows' nesting, to pass values down from parent to rows: one C
    pass in row order where every parent comes before its rows, or every
    one after them, at one level less deep (fastjson.nesting_order); else
    level by level, top level first, in numpy. The levels are built only
    when asked for."""

    def __init__(self, parent_row: np.ndarray, depth: np.ndarray):
        self.parent_row, self.depth = parent_row, depth
        plain = parent_row.dtype == np.int64 and parent_row.flags.c_contiguous
        self.order = fastjson.nesting_order(parent_row, depth) if plain else 0

    @functools.cached_property
    def levels(self) -> list[np.ndarray]:
        return _levels(self.parent_row, self.depth)

    def inherit(self, values: np.ndarray, missing, below=None) -> None:
        """Fill missing values from the parent, in place; ``below``: only
        rows deeper than that take one (none above it can: a shortcut of
        the level-by-level path)."""
        if self.order and values.dtype in (np.int8, np.int64) and values.flags.c_contiguous:
            fastjson.inherit(values, self.parent_row, missing, self.order)
            return
        levels = self.levels
        if below is not None:
            levels = [level for level in levels if self.depth[level[0]] > below]
        _inherit(values, self.parent_row, levels, missing)


def _levels(parent_row: np.ndarray, depth: np.ndarray) -> list[np.ndarray]:
    """The rows that have a parent, by depth, top level first."""
    has = parent_row >= 0
    if not has.any():
        return []
    present = np.flatnonzero(np.bincount(depth[has]))
    return [np.flatnonzero(has & (depth == d)) for d in present]


def _phases_of_teams(c: Columns, phase: np.ndarray) -> bool:
    """In place: a thread's top-level region that no rule names takes the
    phase of the same region on another thread of its rank that overlaps it
    in time (the one starting nearest): an OpenMP team's ``!$omp parallel``
    region, recorded on every thread of the team (a worker's may start
    before its master's), belongs to the phase the master thread forked it
    in, not ``other`` on the workers. Whether any row changed."""
    loose = np.flatnonzero((c.parent_row < 0) & (phase < 0))
    if loose.size == 0:
        return False
    donors = np.flatnonzero((phase >= 0) & np.isin(c.region, np.unique(c.region[loose])))
    if donors.size == 0:
        return False
    import pandas as pd

    frame = {"rank": c.rank, "region": c.region, "start": c.start_ns}
    found = pd.merge_asof(
        pd.DataFrame({k: v[loose] for k, v in frame.items()} | {"row": loose}).sort_values("start"),
        pd.DataFrame({k: v[donors] for k, v in frame.items()} | {"donor": donors}).sort_values(
            "start"
        ),
        on="start",
        by=["rank", "region"],
        direction="nearest",
    ).dropna(subset=["donor"])
    row, donor = found["row"].to_numpy(), found["donor"].to_numpy(dtype=np.int64)
    overlap = (c.start_ns[donor] <= c.end_ns[row]) & (c.end_ns[donor] >= c.start_ns[row])
    team = overlap & (c.location[donor] != c.location[row])
    phase[row[team]] = phase[donor[team]]
    return bool(team.any())


def _inherit(values: np.ndarray, parent_row: np.ndarray, levels: list, missing) -> None:
    """Fill missing values from the parent, top level first, in place."""
    for rows in levels:
        need = rows[values[rows] == missing]
        values[need] = values[parent_row[need]]


_STEP_NUMBER = re.compile(r"#(\d+)$")


def _number_steps(c: Columns, is_step: np.ndarray, step: np.ndarray) -> None:
    """Step intervals without a step number take it from their name
    (``ProfilerStep#12``) or from their order on their location."""
    rows = np.flatnonzero(is_step & (step == NULL))
    if rows.size == 0:
        return
    # the number in the name, read once per step's region name, not once
    # per row nor for every name
    region = c.region[rows]
    codes = np.flatnonzero(np.bincount(region))  # no sort: codes are small
    number_of = np.full(codes[-1] + 1, np.nan)
    number_of[codes] = [_step_number(c.region_names[code]) for code in codes.tolist()]
    number = number_of[region]
    unnamed = np.isnan(number)
    if unnamed.any():
        number = np.where(unnamed, _order_on_location(c, rows), number)
    step[rows] = number.astype(np.int64)


def _step_number(name) -> float:
    """The number that ends a step's name (``ProfilerStep#12``), NaN where none."""
    found = _STEP_NUMBER.search(name) if isinstance(name, str) else None
    return float(found.group(1)) if found else np.nan


def _number_epochs(c: Columns, is_epoch: np.ndarray, epoch: np.ndarray) -> None:
    """Epoch intervals without an epoch number (Score-P user regions carry
    none) are numbered from 1 in their order on their location, as the
    adapters count epochs; the rows inside them take their number."""
    rows = np.flatnonzero(is_epoch & (epoch == NULL))
    if rows.size == 0:
        return
    epoch[rows] = _order_on_location(c, rows) + 1


def _order_on_location(c: Columns, rows: np.ndarray) -> np.ndarray:
    """Each of ``rows``' place by start time (then row) among those of its
    rank and location, from 0."""
    keys = (c.start_ns[rows], c.location[rows], c.rank[rows])
    # Readers give a location's rows together, mostly by start already:
    # sorted only where they are not.
    order = None if _ascending(*keys) else np.lexsort(keys)
    _, location, rank = keys if order is None else (k[order] for k in keys)
    first = np.flatnonzero(np.r_[True, (rank[1:] != rank[:-1]) | (location[1:] != location[:-1])])
    in_order = np.arange(rows.size) - np.repeat(first, np.diff(np.r_[first, rows.size]))
    if order is None:
        return in_order
    place = np.empty(rows.size, dtype=np.int64)
    place[order] = in_order
    return place


def _ascending(*keys: np.ndarray) -> bool:
    """Whether the rows are in np.lexsort(keys)'s order already (the last
    key first)."""
    if keys[0].size < 2:
        return True
    at_or_after = np.ones(keys[0].size - 1, dtype=bool)  # within ties so far
    for key in keys:  # the least significant first
        step = np.diff(key)
        at_or_after = (step > 0) | ((step == 0) & at_or_after)
    return bool(at_or_after.all())


def _step_windows(
    c: Columns, phase: np.ndarray, step: np.ndarray, epoch: np.ndarray
) -> dict[str, np.ndarray]:
    """(rank, start, end, step, epoch) of every step, int64 columns: the
    step intervals, or where a rank has none (Score-P user regions), each
    run of step phases from one data_load to the next."""
    is_step = phase == _PHASE[STEP]
    windows = {
        "rank": c.rank[is_step],
        "start": c.start_ns[is_step],
        "end": c.end_ns[is_step],
        "step": step[is_step],
        "epoch": epoch[is_step],
    }
    ranks_without = sorted(set(_present(c.rank)) - set(_present(windows["rank"])))
    parts = [windows]
    if ranks_without:  # pandas only here: most traces have their step intervals
        parts += [
            {key: frame[key].to_numpy(dtype=np.int64) for key in windows}
            for frame in _inferred_windows(c, phase, ranks_without)
        ]
    return {key: np.concatenate([p[key] for p in parts]).astype(np.int64) for key in windows}


def _present(values: np.ndarray) -> list:
    """The distinct values of an integer column (ranks: few and small, so
    counted rather than sorted where they are)."""
    if values.size and values.min() >= 0 and values.max() < 4 * values.size + (1 << 16):
        return np.flatnonzero(np.bincount(values)).tolist()
    return np.unique(values).tolist()


def _inferred_windows(c: Columns, phase: np.ndarray, ranks_without: list) -> list[pd.DataFrame]:
    """The step windows of ranks without step intervals: from their data
    loading, else from their optimizer steps (_optimizer_windows)."""
    import pandas as pd

    step_phases = [_PHASE[p] for p in STEP_PHASES]
    inferred = []
    # the outermost row of each phase: not the loader's own calls inside it
    outermost = (c.parent_row < 0) | (phase[np.maximum(c.parent_row, 0)] != phase)
    for rank in sorted(ranks_without):
        rows = np.flatnonzero((c.rank == rank) & np.isin(phase, step_phases) & outermost)
        mine = pd.DataFrame(
            {
                "phase": np.asarray(_PHASE_NAMES, dtype=object)[phase[rows]],
                "region": np.asarray(c.region_names, dtype=object)[c.region[rows]],
                "location": c.location[rows],
                "start_ns": c.start_ns[rows],
                "end_ns": c.end_ns[rows],
            }
        )
        loads = mine[mine["phase"] == "data_load"].sort_values("start_ns", kind="stable")
        if loads.empty:
            continue
        # The training loop's own phase regions (e.g. user:forward), not the
        # regions that run inside them or beside them on another thread.
        name = loads["region"].iloc[0]
        top = mine[mine["location"] == loads["location"].iloc[0]]
        if name.endswith("data_load"):
            top = top[top["region"] == name[: -len("data_load")] + top["phase"]]
        top = top.sort_values("start_ns", kind="stable")
        number = (top["phase"] == "data_load").cumsum() - 1
        # the loader's last call, that ends the epoch (StopIteration), is
        # no step: a last window of nothing but data loading
        if (top.loc[number == number.max(), "phase"] == "data_load").all():
            number[number == number.max()] = -1
        top = top[number >= 0]
        grouped = top.groupby(number[number >= 0])
        inferred.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "start": grouped["start_ns"].min(),
                    "end": grouped["end_ns"].max(),
                    "step": grouped["start_ns"].min().index.astype(np.int64),
                    "epoch": NULL,
                }
            )
        )
    found = set().union(*(set(w["rank"]) for w in inferred))
    for rank in sorted(set(ranks_without) - found):
        inferred.append(_optimizer_windows(c, phase, rank))
    return [w for w in inferred if not w.empty]


def _optimizer_windows(c: Columns, phase: np.ndarray, rank) -> pd.DataFrame:
    """Steps of a rank with neither step intervals nor data loading (a
    PyTorch profiler trace without ProfilerStep): each step ends with an
    optimizer step and starts where the previous one ended (the first at
    the rank's first record)."""
    import pandas as pd

    mine = c.rank == rank
    optimizer = mine & (phase == _PHASE["optimizer"])
    parent_phase = phase[np.maximum(c.parent_row, 0)]
    top = np.flatnonzero(optimizer & ((c.parent_row < 0) | (parent_phase != _PHASE["optimizer"])))
    if top.size == 0:
        return pd.DataFrame(columns=["rank", "start", "end", "step", "epoch"])
    top = top[c.location[top] == c.location[top[0]]]
    top = top[np.argsort(c.start_ns[top], kind="stable")]
    ends = c.end_ns[top]
    starts = np.r_[c.start_ns[mine].min(), ends[:-1]]
    return pd.DataFrame(
        {
            "rank": rank,
            "start": starts,
            "end": ends,
            "step": np.arange(top.size, dtype=np.int64),
            "epoch": NULL,
        }
    )


def _steps_of_launches(c: Columns, tree: _Nesting, step: np.ndarray, epoch: np.ndarray) -> None:
    """In place: a row whose parent is on another location (GPU work under
    the runtime call that launched it, found by correlation id), and every
    row inside it, is in its launch's step, not in the one its own start
    falls in: backward's kernels, launched from autograd's thread, run after
    the launch, often in the next step or after the last."""
    if fastjson.any_parent_elsewhere(c.parent_row, c.location) is False:
        return  # one C pass, no new columns: most traces have no such row
    parent = np.maximum(c.parent_row, 0)
    launched = (c.parent_row >= 0) & (c.location != c.location[parent])
    if not launched.any():
        return
    for rows in tree.levels:  # top level first: a parent is final before its rows
        mine = rows[launched[rows] | launched[parent[rows]]]
        launched[mine] = True
        step[mine] = step[parent[mine]]
        epoch[mine] = epoch[parent[mine]]


def _steps_by_time(c: Columns, phase: np.ndarray, step: np.ndarray, epoch: np.ndarray) -> None:
    """Rows still without a step take the step window they start in, on their rank."""
    need_all = step == NULL
    if not need_all.any():
        return
    windows = _step_windows(c, phase, step, epoch)
    if windows["rank"].size == 0:
        return
    rank, number, of_epoch, start, end = _one_window_per_step(windows)
    # the rows in need and their ranks, once: not a pass over every row per rank
    need_rows = np.flatnonzero(need_all)
    need_ranks = c.rank[need_rows]
    for r in np.unique(rank).tolist():
        mine = np.flatnonzero(rank == r)
        if not _ascending(end[mine], start[mine]):  # most ranks' steps are in order
            mine = mine[np.lexsort((end[mine], start[mine]))]  # by start, then end; stable
        need = need_rows[need_ranks == r]
        if need.size == 0:
            continue
        starts = c.start_ns[need]
        at = np.searchsorted(start[mine], starts, side="right") - 1
        inside = (at >= 0) & (starts < end[mine][np.maximum(at, 0)])
        step[need[inside]] = number[mine][at[inside]]
        epoch[need[inside]] = of_epoch[mine][at[inside]]


def _one_window_per_step(windows: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """(rank, step, epoch, start, end) of one window per step, in that
    order of rank, step and epoch, from its earliest start to its latest
    end: a step's GPU-side copy (gpu_user_annotation ProfilerStep#1, on its
    stream, shorter) would otherwise hide the CPU-side window it starts
    inside. In numpy: pandas' groupby cost a few ms a trace file."""
    column = windows
    by = (column["epoch"], column["step"], column["rank"])
    if _ascending(*by):  # the step intervals' own order, most often: no sort
        keys = np.stack(by[::-1])
        starts, ends = column["start"], column["end"]
    else:
        order = np.lexsort(by)
        keys = np.stack([column[k][order] for k in ("rank", "step", "epoch")])
        starts, ends = column["start"][order], column["end"][order]
    first = np.flatnonzero(np.r_[True, (keys[:, 1:] != keys[:, :-1]).any(axis=0)])
    start = np.minimum.reduceat(starts, first)
    end = np.maximum.reduceat(ends, first)
    return (*keys[:, first], start, end)
