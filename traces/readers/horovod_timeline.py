"""Horovod Timeline: Chrome trace JSON written by the coordinator (rank 0),
plain or gzip-compressed.

Horovod leaves the JSON array open (no closing ``]``) and may stop mid-record
when killed; every readable record is kept and the others are counted.
``pid`` is a tensor (its name in the ``process_name`` metadata), not a rank:
every activity is rank 0's view, on location ``tensor:<name>``. Begin/End
pairs nest per tensor (NEGOTIATE_ALLREDUCE, then ALLREDUCE > MPI_ALLREDUCE,
MEMCPY_*_FUSION_BUFFER, ...); the End of a top-level activity carries the
tensor's dtype and shape, hence its bytes.

- Readiness ticks: under NEGOTIATE_*, Horovod marks when each rank reported
  the tensor ready (a complete event of no length named by the rank). Each
  becomes a ``rank_ready`` row on that rank: the last rank to tick is the
  one the others waited for (the straggler signal Horovod gives).
- Steps: the tensors all-reduced most often are the gradients, all-reduced
  once a step; step k spans their k-th all-reduces, from the cycle mark
  (CYCLE_START, ``--timeline-mark-cycles``) that began it where the trace
  has marks. Each step is a ``step`` row on location ``steps``; other
  activities take the step they fall in.

The array is read a run of records at a time (traces/jsonrecords): scanned
into columns in C (traces/fastjson) where it can be, else decoded by msgspec
into records, which become the same columns. Everything after is numpy and
Arrow over those columns, with no Python per record.

Timestamps are microseconds of Horovod's steady clock.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa

# pyarrow.compute (some 30 ms of imports) is imported in the functions that
# use it: every reader's module is imported for any conversion, and that of
# an OTF2 archive needs none of it.

from runfiles.names import HOROVOD_TIMELINE
from traces import fastjson, jsonrecords, nesting
from traces.readers import Problem, Reader, TraceError, counted, read_bytes, register
from traces.readers.kineto import ABSENT, ZERO, NO_TIME, dtype_bytes, element_count, exact_ns
from traces.table import NULL, Columns, finish_columns


class Args(msgspec.Struct, gc=False):
    name: str | None = None
    dtype: str | None = None
    shape: str | list | None = None


class Record(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    ts: msgspec.Raw = ABSENT  # nanoseconds, exact, as Kineto's (exact_ns)
    pid: int | str | None = None
    dur: msgspec.Raw = ZERO
    args: Args | None = None

    def __post_init__(self):
        self.ts = exact_ns(self.ts, nullable=True)  # type: ignore[assignment]
        self.dur = exact_ns(self.dur, nullable=False)  # type: ignore[assignment]


@register
class HorovodTimelineReader(Reader):
    name = "horovod_timeline"
    patterns = (HOROVOD_TIMELINE, f"{HOROVOD_TIMELINE}.gz", "*.json", "*.json.gz")
    imports = ("pyarrow.compute",)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return head.lstrip().startswith(b"[") and b'"ph"' in head

    def read(self, path: Path, rules, run_id: str = ""):
        data, problem = read_bytes(path)
        problems = [problem] if problem else []
        parts, reading = _read_records(data, path, problems)
        del data  # before the runs' records are joined: the file's bytes are the most
        records = Records.joined(parts)
        if not (len(records.edge_ns) or len(records.tick_ns) or len(records.mark_ns)):
            why = next((p.split(": ", 1)[1] for p in problems if p.lost), None)
            raise TraceError(
                f"{path}: no readable record: {why}"
                if why
                else f"{path}: not a Horovod Timeline: no readable record"
            )
        columns, more = _columns(records, reading, path)  # consumes the records
        del records
        table = finish_columns(columns, rules, self.name, run_id)
        return table, problems + more


# the record kinds (ph) the reader uses, as the scanner's byte codes
BEGIN, END, COMPLETE, INSTANT = (ord(c) for c in "BEXi")
OTHER_PH = ord("?")  # a ph of more than one character
TICK_NAME = r"^[0-9]{1,9}$"  # a readiness tick is named by the rank
CYCLE_MARK = "CYCLE_START"

# only the columns the reader takes are copied out of the scanner
SCAN = functools.partial(
    fastjson.scan, all_records=True, keep=("ph", "pid", "pid_kind", "ts", "dtypes", "shapes")
)
# Runs of a quarter of Kineto's chunk: a run's columns, and the work on them,
# sit on top of the whole file's bytes, which the reader holds to the end of
# its reading; smaller runs are scanned as fast.
RUN_SHARE = 4
DECODER = msgspec.json.Decoder(list[Record])
METADATA_DECODER = msgspec.json.Decoder(Record)


@dataclass
class Records:
    """What the reader takes from a Timeline's records, in file order:
    Begin/End records (``edge_*``; ``edge_region`` -1 on an End,
    ``edge_bytes`` NULL on a Begin), readiness ticks (``tick_*``) and cycle
    marks, times in ns; ``edge_pid``/``tick_pid`` are location codes."""

    edge_begin: np.ndarray
    edge_ns: np.ndarray
    edge_pid: np.ndarray
    edge_region: np.ndarray
    edge_bytes: np.ndarray
    tick_ns: np.ndarray
    tick_pid: np.ndarray
    tick_rank: np.ndarray
    mark_ns: np.ndarray
    untimed: int = 0

    @classmethod
    def joined(cls, parts: list[Records]) -> Records:
        """The parts as one; consumes them: each field of the parts is let
        go once joined, so that the records are not held twice over."""
        fields = [f for f in cls.__dataclass_fields__ if f != "untimed"]
        joined = {}
        for f in fields:
            joined[f] = np.concatenate([getattr(p, f) for p in parts])
            for p in parts:
                setattr(p, f, None)
        return cls(**joined, untimed=sum(p.untimed for p in parts))

    def let_go(self) -> None:
        """Drops the arrays (``untimed`` stays): their memory goes back
        while the records' object is still referenced."""
        for f in self.__dataclass_fields__:
            if f != "untimed":
                setattr(self, f, None)


class _Reading:
    """The codes a Timeline's runs share: locations (pids: int, text or
    none, in the order first seen, each named by its process_name
    metadata) and activity names (regions)."""

    def __init__(self):
        self.pids: dict = {}
        self.tensors: dict = {}
        self.regions: dict = {}

    def part(self, batch) -> Records:
        """The run's records the reader uses (from the scanner's columns or
        msgspec's records)."""
        if isinstance(batch, fastjson.Scanned):
            return self._records(*self._scanned(batch))
        return self._records(*self._decoded(batch))

    def location_names(self) -> list[str]:
        return [f"tensor:{self.tensors.get(k) or k[1]}" for k in self.pids]

    def region_names(self) -> list[str]:
        return list(self.regions)

    def _codes(self, table: dict, keys) -> np.ndarray:
        return np.array([table.setdefault(k, len(table)) for k in keys], dtype=np.int64)

    def _metadata(self, record: Record) -> None:
        if record.ph == "M" and record.name == "process_name" and record.args is not None:
            self.tensors[_key(record.pid)] = record.args.name

    def _scanned(self, scanned: fastjson.Scanned) -> tuple:
        import pandas as pd

        for begin, end in scanned.spans[scanned.span_rows < 0].tolist():
            self._metadata(METADATA_DECODER.decode(scanned.data[begin:end]))
        columns, strings = scanned.columns, scanned.strings
        pid = np.full(scanned.rows, self._codes(self.pids, [_key(None)])[0])
        ints = columns["pid_kind"] == fastjson.ID_INT  # else none: text falls back
        inverse, uniques = pd.factorize(columns["pid"][ints])
        pid[ints] = self._codes(self.pids, (("int", v) for v in uniques.tolist()))[inverse]
        names, dtypes, shapes = strings["names"], strings["dtypes"], strings["shapes"]
        return columns["ph"], names, columns["ts"], pid, dtypes, shapes

    def _decoded(self, records: list) -> tuple:
        for record in records:
            self._metadata(record)
        args = [r.args or Args() for r in records]
        shapes = [a.shape if not isinstance(a.shape, list) else json.dumps(a.shape) for a in args]
        return (
            np.array([_ph_code(r.ph) for r in records], dtype=np.uint8),
            pa.array([r.name for r in records], pa.string()),
            np.fromiter([r.ts for r in records], np.int64, len(records)),
            self._codes(self.pids, (_key(r.pid) for r in records)),
            pa.array([a.dtype for a in args], pa.string()),
            pa.array(shapes, pa.string()),
        )

    def _records(self, ph, names, ts, pid, dtypes, shapes) -> Records:
        import pyarrow.compute as pc

        timed = ts != NO_TIME
        # metadata has no time of its own; an activity without one is lost
        untimed = int((~timed & ((ph == BEGIN) | (ph == END) | (ph == COMPLETE))).sum())
        edges = np.flatnonzero(timed & ((ph == BEGIN) | (ph == END)))
        begin = ph[edges] == BEGIN
        region = np.full(len(edges), -1, dtype=np.int32)
        region[begin] = self._region_codes(names.take(edges[begin]))
        nbytes = np.full(len(edges), NULL, dtype=np.int64)
        ends = edges[~begin]
        nbytes[~begin] = _bytes(dtypes.take(ends), shapes.take(ends))
        complete = np.flatnonzero(timed & (ph == COMPLETE))
        tick_names = names.take(complete)
        is_tick = pc.match_substring_regex(tick_names, TICK_NAME)
        ticks = complete[is_tick.to_numpy(zero_copy_only=False)]
        instants = np.flatnonzero(timed & (ph == INSTANT))
        marks = instants[pc.equal(names.take(instants), CYCLE_MARK).to_numpy(zero_copy_only=False)]
        return Records(
            edge_begin=begin,
            edge_ns=ts[edges],
            edge_pid=pid[edges].astype(np.int32),
            edge_region=region,
            edge_bytes=nbytes,
            tick_ns=ts[ticks],
            tick_pid=pid[ticks].astype(np.int32),
            tick_rank=pc.cast(tick_names.filter(is_tick), pa.int64()).to_numpy(),
            mark_ns=ts[marks],
            untimed=untimed,
        )

    def _region_codes(self, names: pa.StringArray) -> np.ndarray:
        encoded = names.dictionary_encode()
        codes = self._codes(self.regions, encoded.dictionary.to_pylist())
        return codes[encoded.indices.to_numpy(zero_copy_only=False)]


def _key(pid) -> tuple:
    """A pid as a location key: 1 and "1" are different locations."""

    return ("int" if isinstance(pid, int) else "text", pid)


def _ph_code(ph: str) -> int:
    encoded = ph.encode()
    return encoded[0] if len(encoded) == 1 else 0 if not encoded else OTHER_PH


def _read_records(data: bytes, path: Path, problems: list) -> tuple[list[Records], _Reading]:
    """Every readable record of the array in ``data`` that the reader uses,
    run by run (the runs' parts, to join); unreadable records counted in
    ``problems``."""
    opened = data.find(b"[")
    if opened < 0:
        raise TraceError(f"{path}: not a Horovod Timeline: no JSON array of records")
    first = opened + 1
    while data[first : first + 1].isspace():
        first += 1
    runs, last = jsonrecords.chunks(data, first, RUN_SHARE)
    runs.append((last, _records_end(data, last)))
    reading = _Reading()
    batches = jsonrecords.batches(
        ((data, b, e, False) for b, e in runs), _scan, DECODER, Record, path, problems
    )
    parts = [reading.part(batch) for batch in batches]
    fastjson.let_go()  # the scanner's arrays: not held beside the table to come
    return parts, reading


def _records_end(data: bytes, begin: int) -> int:
    """Where the array's last record ends: before the closing ``]`` Horovod
    may leave out, and the ``,`` it leaves after every record."""
    end = len(data)
    for closing in (b"]", b","):
        while end > begin and data[end - 1 : end].isspace():
            end -= 1
        if data[end - 1 : end] == closing:
            end -= 1
    while end > begin and data[end - 1 : end].isspace():
        end -= 1
    return end


def _scan(buffer, begin, end, bracketed):
    """The scanner's columns of a run, or None for msgspec to decode it: no
    scanner, or a name the scanner leaves JSON-escaped."""
    scanned = SCAN(buffer, begin, end, bracketed)
    return None if scanned is None or scanned.escaped else scanned


def _columns(records: Records, reading: _Reading, path: Path):
    begins, ends, _, unmatched, unclosed = nesting.pair_begin_end(
        records.edge_pid, records.edge_begin
    )
    forward = records.edge_ns[ends] >= records.edge_ns[begins]  # else it ends before it begins
    backwards = int((~forward).sum())
    begins, ends = begins[forward], ends[forward]
    n_ticks = len(records.tick_ns)
    start = np.r_[records.edge_ns[begins], records.tick_ns]
    end = np.r_[records.edge_ns[ends], records.tick_ns]
    where = np.r_[records.edge_pid[begins], records.tick_pid]
    rank = np.r_[np.zeros(len(begins), dtype=np.int64), records.tick_rank]
    nbytes = np.r_[records.edge_bytes[ends], np.full(n_ticks, NULL)]
    activity_regions = records.edge_region[begins]
    marks = np.sort(records.mark_ns)
    del begins, ends, forward
    records.let_go()  # the rows are built: the records are not needed beside them
    parent = nesting.enclosing(where, start, end)
    region, region_names = _regions(activity_regions, reading.region_names(), n_ticks)
    del activity_regions
    steps, row_step = _steps(region, region_names, where, start, end, parent, marks)
    n_steps = len(steps["start"])
    if n_steps and "step" not in region_names:
        region_names.append("step")
    step_region = region_names.index("step") if n_steps else 0
    locations = reading.location_names()
    n = len(start) + n_steps
    # each column with the steps' rows after it, one at a time, each
    # taking the place of the one it extends: the rows are held once over
    depth = _extended(nesting.depths(parent), 0, n_steps)
    parent = _extended(parent, -1, n_steps)
    start = _extended(start, steps["start"], n_steps)
    end = _extended(end, steps["end"], n_steps)
    rank = _extended(rank, 0, n_steps)
    where = _extended(where, len(locations), n_steps, np.int32)
    region = _extended(region, step_region, n_steps, np.int32)
    row_step = _extended(row_step, np.arange(n_steps), n_steps)
    nbytes = _extended(nbytes, NULL, n_steps)
    columns = Columns(
        rank=rank,
        node=np.zeros(n, dtype=np.int32),
        node_names=[""],
        location=where,
        location_names=locations + ["steps"],
        region=region,
        region_names=region_names,
        start_ns=start,
        end_ns=end,
        depth=depth,
        parent_row=parent,
        step=row_step,
        epoch=np.full(n, NULL, dtype=np.int64),
        collective=np.full(n, -1, dtype=np.int32),
        collective_names=[],
        bytes=nbytes,
    )
    return columns, _problems(path, records.untimed, unmatched, unclosed, backwards)


def _extended(values: np.ndarray, tail, n: int, dtype=np.int64) -> np.ndarray:
    """``values`` then ``n`` more (``tail``: one value or ``n``), as ``dtype``."""
    out = np.empty(len(values) + n, dtype=dtype)
    out[: len(values)] = values
    out[len(values) :] = tail
    return out


def _regions(codes: np.ndarray, names: list[str], ticks: int) -> tuple[np.ndarray, list[str]]:
    """Region codes of the matched activities, then of the ticks
    (``rank_ready``), among the names of those activities only."""
    used, codes = np.unique(codes, return_inverse=True)
    region_names = [names[i] for i in used.tolist()]
    if ticks and "rank_ready" not in region_names:
        region_names.append("rank_ready")
    tick = region_names.index("rank_ready") if ticks else 0
    return np.r_[codes.astype(np.int64), np.full(ticks, tick, dtype=np.int64)], region_names


def _steps(region, region_names: list, where, start, end, parent, cycles):
    """({start, end} of each step, the step of each row or NULL).

    The tensors all-reduced most often are the gradients: step k is their
    k-th top-level ALLREDUCE (and its NEGOTIATE_ALLREDUCE), from the cycle
    mark before the first of them where the trace has marks."""
    import pandas as pd

    row_step = np.full(len(region), NULL, dtype=np.int64)
    code = {name: i for i, name in enumerate(region_names)}
    top = parent < 0
    is_reduce = top & (region == code.get("ALLREDUCE", -1))
    if not is_reduce.any():
        return {"start": np.zeros(0, np.int64), "end": np.zeros(0, np.int64)}, row_step
    counts = np.bincount(where[is_reduce])
    gradient = np.zeros(max(len(counts), int(where.max()) + 1), dtype=bool)
    gradient[: len(counts)] = counts == counts.max()
    negotiate = top & (region == code.get("NEGOTIATE_ALLREDUCE", -1))
    rows = np.flatnonzero((is_reduce | negotiate) & gradient[where])
    rows = rows[np.argsort(start[rows], kind="stable")]
    k = _cumcount(where[rows] * 2 + is_reduce[rows])
    row_step[rows] = k
    reduces = is_reduce[rows]
    k, first, last = k[reduces], start[rows][reduces], end[rows][reduces]
    n = int(k.max()) + 1
    steps = {
        "start": pd.Series(first).groupby(k).min().reindex(range(n)).to_numpy(np.int64),
        "end": pd.Series(last).groupby(k).max().reindex(range(n)).to_numpy(np.int64),
    }
    if cycles.size:
        at = np.searchsorted(cycles, steps["start"], side="right") - 1
        steps["start"] = np.where(at >= 0, cycles[np.maximum(at, 0)], steps["start"])
    return steps, row_step


def _cumcount(key: np.ndarray) -> np.ndarray:
    """How many earlier entries have the same key, for each entry."""
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    group_start = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    sizes = np.diff(np.r_[group_start, len(key)])
    counts = np.empty(len(key), dtype=np.int64)
    counts[order] = np.arange(len(key)) - np.repeat(group_start, sizes)
    return counts


def _problems(
    path: Path, untimed: int, unmatched: int, unclosed: int, backwards: int = 0
) -> list[Problem]:
    return counted(
        path,
        (untimed, "records without a valid 'ts' were skipped", True),
        (unclosed, "activities begun but never ended (run cut short?); left out", True),
        (unmatched, "end records without a begin; left out", True),
        (backwards, "activities that end before they begin (negative duration); left out", True),
    )


def _bytes(dtypes: pa.StringArray, shapes: pa.StringArray) -> np.ndarray:
    """Tensor bytes from the dtype and shape Horovod writes on an activity's
    End (NULL when it does not say), worked out once per distinct pair."""
    import pyarrow.compute as pc

    dtypes = pc.fill_null(dtypes, "")
    pairs = pc.binary_join_element_wise(dtypes, shapes, "\x1f").dictionary_encode()
    sizes = [_tensor_bytes(*pair.split("\x1f", 1)) for pair in pairs.dictionary.to_pylist()]
    codes = pc.fill_null(pairs.indices, -1).to_numpy()  # -1: no shape, the NULL last
    return np.array(sizes + [NULL], dtype=np.int64)[codes]


@functools.lru_cache(maxsize=1 << 14)
def _tensor_bytes(dtype: str, shape: str) -> int:
    """Bytes of a tensor of ``dtype`` and ``shape`` (JSON text: a list of
    sizes); NULL where either is not one."""
    size = dtype_bytes(dtype)
    try:
        shape = json.loads(shape)
    except ValueError:
        return NULL
    if size is None or not isinstance(shape, list):
        return NULL
    if not all(type(d) is int and d >= 0 for d in shape):
        return NULL
    elements = element_count(math.prod(shape))
    return NULL if elements is None else elements * size
