"""Chrome-trace events arrays (Kineto's, the Horovod Timeline) straight into
columns, in C (scanner.c).

msgspec builds a Python object per event and per field, and taking the
fields back out of them costs more than the decoding: together about 1.3 µs
an event, most of the Kineto reader's time. ``scan()`` reads a chunk of the
array in one pass into numpy columns (Arrow string offsets for names and
categories), and hands back only the few records a reader still needs as
objects (metadata, collectives) as byte spans. It takes only well-formed
JSON of the shapes the reader's msgspec structs accept; on anything else it
returns None and the reader decodes the chunk with msgspec, as it would
without it.

``stack_parents()`` is traces/nesting.py's nesting rule in one C pass;
``nesting_order()``/``inherit()``, ``communication_by_context()``,
``outermost()``, ``any_outlives()`` and ``any_parent_elsewhere()``
are traces/table.py's values passed down the nesting, its phases of
communication, its collective instances and the OTF2 reader's two-thread
check, each one C pass
where numpy would make several and their temporary arrays.

The library is built on first use with gcc into
``~/.cache/ddl-compare/fastjson/`` (one file per hash of the source); with
no compiler, or with ``DDLC_JSON_SCANNER=msgspec``, ``scan()`` and
``stack_parents()`` give None always: msgspec reads everything and numpy
nests (slower: bench/trace_read_json.py measures both).

    python -m traces.fastjson     # build it now; prints its path or why not
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from runfiles import variables
from traces import arrow_kernels
from traces.fastotf2 import CompiledLibrary, compile_library

SOURCE = Path(__file__).with_name("scanner.c")
# -O3, not -O2: gcc then inlines more of the scanner's small readers into
# its loop over a record's members (fewer instructions: docs/tracing.md)
CFLAGS = ("-O3", "-shared", "-fPIC", "-Wall")

RECORD_BYTES = 40  # fewer bytes than any trace's records take, on average
SCAN_FULL = 2  # kineto_scan: more records than the capacity

_workspace = threading.local()


class _Scan(ctypes.Structure):
    """Mirrors ``Scan`` in scanner.c."""

    _fields_ = [
        ("capacity", ctypes.c_int64),
        ("names_capacity", ctypes.c_int64),
        *(
            (field, ctypes.c_void_p)
            for field in (
                "name_offsets",
                "names",
                "cat_offsets",
                "cats",
                "cat_valid",
                "collective_offsets",
                "collectives",
                "collective_valid",
                "dtype_offsets",
                "dtypes",
                "dtype_valid",
                "shape_offsets",
                "shapes",
                "shape_valid",
                "ph",
                "nelems",
                "msg_size",
                "pid",
                "pid_kind",
                "tid",
                "tid_kind",
                "ts",
                "dur",
                "correlation",
                "external",
                "spans",
            )
        ),
        ("rows", ctypes.c_int64),
        ("n_spans", ctypes.c_int64),
        ("escaped", ctypes.c_int32),
        ("failed_at", ctypes.c_int64),
        ("all_records", ctypes.c_int32),
        ("open_ended", ctypes.c_int32),
        ("array_end", ctypes.c_int64),
    ]


NO_TIME = -(1 << 63)  # in ts, dur: no time, not a number, or none an int64 holds
ID_ABSENT, ID_INT, ID_TEXT = 0, 1, 2  # the kinds of an id in pid_kind, tid_kind

# row column -> dtype
ROW_COLUMNS = {
    "ph": np.uint8,  # its one character; 0: none, '?': longer
    "nelems": np.float64,
    "msg_size": np.float64,
    "pid": np.int64,
    "pid_kind": np.uint8,
    "tid": np.int64,
    "tid_kind": np.uint8,
    "ts": np.int64,  # nanoseconds, exact from the text; NO_TIME: none
    "dur": np.int64,
    "correlation": np.int64,
    "external": np.int64,
}


# string column -> its offsets, bytes and (but the name) validity in _Scan
STRING_COLUMNS = {
    "names": ("name_offsets", "names", None),
    "cats": ("cat_offsets", "cats", "cat_valid"),
    "collectives": ("collective_offsets", "collectives", "collective_valid"),
    "dtypes": ("dtype_offsets", "dtypes", "dtype_valid"),
    "shapes": ("shape_offsets", "shapes", "shape_valid"),
}


@dataclass
class Scanned:
    """The complete events (ph "X") of a chunk, or all its records, as
    columns, and the byte spans in ``data`` of its metadata records
    (``span_rows`` -1) and of the complete events with an id written as a
    string (their row)."""

    data: object  # the buffer the spans are in
    strings: dict[str, pa.StringArray]  # STRING_COLUMNS; null: absent
    columns: dict[str, np.ndarray]
    spans: np.ndarray  # (n, 2) start, end
    span_rows: np.ndarray
    escaped: bool  # some name or cat is still JSON-escaped
    array_end: int = -1  # scan(open_ended=True): where the array's ']' is

    @property
    def rows(self) -> int:
        return len(self.strings["names"])


def _declare(lib: ctypes.CDLL) -> None:
    lib.kineto_scan.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.POINTER(_Scan),
    ]
    lib.kineto_scan.restype = ctypes.c_int
    lib.count_byte.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32]
    lib.count_byte.restype = ctypes.c_int64
    lib.value_end.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.value_end.restype = ctypes.c_int64
    lib.stack_parents.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] + [ctypes.c_void_p] * 2
    lib.stack_parents.restype = None
    lib.pair_edges.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 5
    lib.pair_edges.restype = ctypes.c_int64
    lib.depths.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    lib.depths.restype = ctypes.c_int32
    lib.nesting_order.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int32, ctypes.c_int64]
    lib.nesting_order.restype = ctypes.c_int32
    for name, kind in (("inherit_i64", ctypes.c_int64), ("inherit_i8", ctypes.c_int8)):
        getattr(lib, name).argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64, kind, ctypes.c_int32]
        getattr(lib, name).restype = None
    lib.communication_by_context.argtypes = [ctypes.c_void_p] * 3 + [
        ctypes.c_int64,
        ctypes.c_int32,
        *[ctypes.c_int8] * 3,
        ctypes.c_void_p,
        ctypes.c_int32,
        *[ctypes.c_void_p] * 2,
    ]
    lib.communication_by_context.restype = None
    lib.any_outlives.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64]
    lib.any_outlives.restype = ctypes.c_int32
    lib.any_parent_elsewhere.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64]
    lib.any_parent_elsewhere.restype = ctypes.c_int32
    lib.outermost.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_void_p]
    lib.outermost.restype = None
    lib.name_table_new.argtypes = []
    lib.name_table_new.restype = ctypes.c_void_p
    lib.name_table_free.argtypes = [ctypes.c_void_p]
    lib.name_table_free.restype = None
    lib.name_table_lookup.argtypes = (
        [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2
    )
    lib.name_table_lookup.restype = ctypes.c_int64
    lib.name_table_code.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64]
    lib.name_table_code.restype = None


_LIBRARY = CompiledLibrary(lambda: compile_library(SOURCE, "fastjson", CFLAGS, ()), _declare)


def library() -> ctypes.CDLL | None:
    """The compiled scanner, built on first use; None when it cannot be or
    when DDLC_JSON_SCANNER=msgspec."""
    if variables.get("DDLC_JSON_SCANNER") == "msgspec":
        return None
    return _LIBRARY.get()


def why_unavailable() -> str:
    return _LIBRARY.why


def value_end(data, begin: int) -> int | None:
    """Where the JSON value at ``data[begin]`` (bytes or any buffer) ends:
    the index after it; -1 where no whole value lies in ``data``
    (malformed, or cut: more data may complete it); None: no scanner
    here."""
    lib = library()
    if lib is None:
        return None
    buffer = np.frombuffer(data, dtype=np.uint8)
    return lib.value_end(buffer.ctypes.data, begin, len(buffer))


def scan(
    data,
    begin: int = 0,
    end: int | None = None,
    bracketed: bool = True,
    all_records: bool = False,
    keep: tuple[str, ...] | None = None,
    open_ended: bool = False,
):
    """Scanned columns of the records in ``data[begin:end]`` (``data``: bytes
    or any buffer, such as msgspec.Raw; a JSON array when ``bracketed``, else
    the comma-separated records inside one), or None: no scanner here, or
    the chunk is not of the plain shapes it takes (the caller then decodes
    it with msgspec). The rows: the complete events (Kineto), or every
    record when ``all_records`` (the Horovod Timeline, whose ids are never
    strings: a string id falls back). ``keep``: the columns (of ROW_COLUMNS
    and STRING_COLUMNS; "names" always) to copy out of the scanner's arrays,
    None: all; a reader that never uses the others need not hold them.
    ``open_ended``: the records inside an array from ``begin`` on, ``data``
    running on past its ``]`` (the rest of the document), whose place the
    answer gives (``array_end``): where the array ends, without a pass of
    msgspec over its last chunk."""
    lib = library()
    if lib is None:
        return None
    buffer = np.frombuffer(data, dtype=np.uint8)
    address = buffer.ctypes.data
    end = len(buffer) if end is None else end
    capacity = (end - begin) // RECORD_BYTES + 16
    for _ in range(2):
        out, arrays = _output(capacity, end - begin)
        out.all_records, out.open_ended = int(all_records), int(open_ended)
        done = lib.kineto_scan(address, begin, end, int(bracketed), ctypes.byref(out))
        if done != SCAN_FULL:
            break
        capacity = lib.count_byte(address, begin, end, ord("{")) + 1  # each record opens one
    if done != 0:
        return None
    rows, strings, spans = arrays
    n, spans = out.rows, spans[: out.n_spans].copy()
    kept = None if keep is None else {"names", *keep}
    return Scanned(
        data=data,
        strings={
            key: _string_array(n, *(strings.get(k) for k in parts))
            for key, parts in STRING_COLUMNS.items()
            if kept is None or key in kept
        },
        columns={
            key: array[:n].copy() for key, array in rows.items() if kept is None or key in kept
        },
        spans=spans[:, :2],
        span_rows=spans[:, 2],
        escaped=bool(out.escaped),
        array_end=out.array_end if open_ended else -1,
    )


def _output(capacity: int, size: int):
    """(_Scan, its arrays) for at least ``capacity`` records of ``size``
    bytes: this thread's, kept from call to call (the columns are copied out
    of them), so that their memory is not mapped and faulted in anew for
    every chunk."""
    kept = getattr(_workspace, "kept", None)
    if kept is None or kept[0].capacity < capacity or kept[0].names_capacity < size:
        _workspace.kept = kept = _arrays(capacity, size)
    return kept


def let_go() -> None:
    """Frees this thread's scanner arrays (the next scan maps them anew): for
    a reader whose memory peaks after its scanning, not during it."""
    _workspace.__dict__.pop("kept", None)


def _arrays(capacity: int, size: int):
    rows = {key: np.empty(capacity, dtype=dtype) for key, dtype in ROW_COLUMNS.items()}
    strings = {}
    for offsets, data_key, valid in STRING_COLUMNS.values():
        strings[offsets] = np.empty(capacity + 1, dtype=np.int32)
        strings[data_key] = np.empty(size, dtype=np.uint8)
        if valid:
            strings[valid] = np.empty(capacity, dtype=np.uint8)
    spans = np.empty((capacity, 3), dtype=np.int64)
    out = _Scan(capacity=capacity, names_capacity=size)
    for key, array in (*rows.items(), *strings.items(), ("spans", spans)):
        setattr(out, key, array.ctypes.data)
    return out, (rows, strings, spans)


def _string_array(n: int, offsets: np.ndarray, data: np.ndarray, valid) -> pa.StringArray:
    """The first ``n`` strings the scanner wrote (null where not valid)."""
    nulls = None
    if valid is not None and not (valid := valid[:n].astype(bool)).all():
        nulls = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.StringArray.from_buffers(
        n,
        pa.py_buffer(offsets[: n + 1].copy()),
        pa.py_buffer(data[: offsets[n]].copy()),
        nulls,
    )


def stack_parents(group: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Parent (sorted row, -1: none) of each row sorted by (group, start,
    longest first), by a stack in C (traces/nesting.py's rule), or None
    when there is no compiled library."""
    lib = library()
    if lib is None:
        return None
    columns = [np.ascontiguousarray(a, dtype=np.int64) for a in (group, start, end)]
    parent, stack = np.empty(len(start), dtype=np.int64), np.empty(len(start), dtype=np.int64)
    lib.stack_parents(
        *(a.ctypes.data for a in columns), len(start), parent.ctypes.data, stack.ctypes.data
    )
    return parent


def pair_edges(key: np.ndarray, is_begin: np.ndarray):
    """(begin rows in file order, the end row of each, their depth, ends
    without a begin, begins never ended): Begin and End records matched by a
    stack per key in C (traces/nesting.py's rule), or None when there is no
    compiled library."""
    lib = library()
    if lib is None:
        return None
    n = len(key)
    key = np.ascontiguousarray(key, dtype=np.int64)
    keys = int(key.max()) + 1 if n else 0
    if n and (key.min() < 0 or keys > 4 * n + 1024):
        return None  # not dense codes: numpy pairs them
    is_begin = np.ascontiguousarray(is_begin, dtype=np.uint8)
    end_of, depth, below = (np.empty(n, dtype=np.int64) for _ in range(3))
    top, unclosed = np.empty(keys, dtype=np.int64), ctypes.c_int64()
    unmatched = lib.pair_edges(
        key.ctypes.data,
        is_begin.ctypes.data,
        n,
        keys,
        end_of.ctypes.data,
        depth.ctypes.data,
        top.ctypes.data,
        below.ctypes.data,
        ctypes.byref(unclosed),
    )
    begins = np.flatnonzero(end_of >= 0)
    return begins, end_of[begins], depth[begins], int(unmatched), unclosed.value


def depths(parent: np.ndarray) -> np.ndarray | None:
    """Each row's number of ancestors, in one C pass (traces/nesting.py's
    rule); None with no compiled library or where the parents make a
    cycle."""
    lib = library()
    if lib is None:
        return None
    parent = np.ascontiguousarray(parent, dtype=np.int64)
    depth, path = np.empty(len(parent), dtype=np.int64), np.empty(len(parent), dtype=np.int64)
    if not lib.depths(parent.ctypes.data, len(parent), depth.ctypes.data, path.ctypes.data):
        return None
    return depth


def nesting_order(parent: np.ndarray, depth: np.ndarray) -> int:
    """1 when every row's parent comes before it, -1 when after it, 0 when
    neither or where a depth is not its parent's plus one (or with no
    compiled library): the order in which ``inherit`` passes values down."""
    lib = library()
    if lib is None or depth.dtype not in (np.int32, np.int64) or len(parent) != len(depth):
        return 0
    parent = np.ascontiguousarray(parent, dtype=np.int64)
    depth = np.ascontiguousarray(depth)
    return lib.nesting_order(parent.ctypes.data, depth.ctypes.data, depth.itemsize, len(parent))


def inherit(values: np.ndarray, parent: np.ndarray, missing, order: int) -> None:
    """In place: the rows whose value is ``missing`` take their parent's,
    in the ``order`` nesting_order() gave (not 0)."""
    name = {np.dtype(np.int64): "inherit_i64", np.dtype(np.int8): "inherit_i8"}[values.dtype]
    assert values.flags.c_contiguous and parent.dtype == np.int64 and order
    getattr(library(), name)(values.ctypes.data, parent.ctypes.data, len(values), missing, order)


def communication_by_context(
    phase: np.ndarray,
    parent: np.ndarray,
    collective: np.ndarray,
    bcast: int,
    order: int,
    codes: tuple[int, int, int],
    comm_in: np.ndarray,
) -> bool:
    """traces/table.py's _communication_by_context in one C pass, ``phase``
    (int8) in place, in the ``order`` nesting_order() gave (not 0);
    ``codes``: those of grad_comm, other_comm and init. False with no
    compiled library (phase unchanged)."""
    lib = library()
    if lib is None:
        return False
    assert phase.dtype == np.int8 and phase.flags.c_contiguous and parent.dtype == np.int64
    assert parent.flags.c_contiguous and order
    collective = np.ascontiguousarray(collective, dtype=np.int32)
    comm_in = np.ascontiguousarray(comm_in, dtype=np.int8)
    context, placed = np.empty_like(phase), np.empty_like(phase)
    lib.communication_by_context(
        phase.ctypes.data,
        parent.ctypes.data,
        collective.ctypes.data,
        len(phase),
        order,
        *codes,
        comm_in.ctypes.data,
        bcast,
        context.ctypes.data,
        placed.ctypes.data,
    )
    phase[:] = placed
    return True


def any_outlives(parent: np.ndarray, end: np.ndarray) -> bool | None:
    """Whether a row ends after its parent; None with no compiled library."""
    return _any_against_parent("any_outlives", parent, end, np.int64)


def any_parent_elsewhere(parent: np.ndarray, location: np.ndarray) -> bool | None:
    """Whether a row's parent is on another location; None with no
    compiled library."""
    return _any_against_parent("any_parent_elsewhere", parent, location, np.int32)


def _any_against_parent(test: str, parent: np.ndarray, values: np.ndarray, dtype) -> bool | None:
    """One C pass of ``test`` over each row's value and its parent's."""
    lib = library()
    if lib is None:
        return None
    parent = np.ascontiguousarray(parent, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=dtype)
    return bool(getattr(lib, test)(parent.ctypes.data, values.ctypes.data, len(parent)))


def outermost(parent: np.ndarray, marked: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """traces.nesting.outermost in one C pass; None with no compiled library."""
    lib = library()
    if lib is None:
        return None
    parent = np.ascontiguousarray(parent, dtype=np.int64)
    marked = np.ascontiguousarray(marked, dtype=np.bool_)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    top = np.empty(len(rows), dtype=np.int64)
    lib.outermost(
        parent.ctypes.data, marked.ctypes.data, rows.ctypes.data, len(rows), top.ctypes.data
    )
    return top


class NameTable:
    """Names -> codes, kept in C from batch to batch (scanner.c's
    NameTable): each row of a batch costs one hash probe there, and only the
    names never seen before come to Python, to be given their codes."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        self._handle = lib.name_table_new()
        if not self._handle:
            raise MemoryError("the scanner's name table")
        weakref.finalize(self, lib.name_table_free, self._handle)

    def codes(self, array: pa.StringArray, code_new) -> np.ndarray:
        """The code of each row of ``array`` (0 where null: the caller marks
        those); ``code_new(names)`` gives the codes of the names not seen
        before, in the order of their first rows."""
        n = len(array)
        codes = np.zeros(n, dtype=np.int32)
        if n == 0:
            return codes
        valid, offsets, data = array.buffers()
        new_rows = np.empty(n, dtype=np.int64)
        added = self._lib.name_table_lookup(
            self._handle,
            offsets.address,
            data.address if data is not None else 0,
            valid.address if valid is not None else None,
            array.offset,
            n,
            codes.ctypes.data,
            new_rows.ctypes.data,
        )
        if added < 0:
            raise MemoryError("the scanner's name table")
        if added:
            # Arrow's array from the buffer (pa.array() would import pandas)
            rows = pa.Array.from_buffers(pa.int64(), added, [None, pa.py_buffer(new_rows[:added])])
            names = arrow_kernels.take(array, rows).to_pylist()
            given = np.ascontiguousarray(code_new(names), dtype=np.int32)
            self._lib.name_table_code(self._handle, given.ctypes.data, added)
            new = codes < 0
            codes[new] = given[-codes[new] - 1]
        return codes


def name_table() -> NameTable | None:
    """A new NameTable, or None when there is no compiled library."""
    lib = library()
    return None if lib is None else NameTable(lib)


def main() -> int:
    lib = library()
    print(lib._name if lib is not None else f"unavailable: {why_unavailable()}")
    return 0 if lib is not None else 1
