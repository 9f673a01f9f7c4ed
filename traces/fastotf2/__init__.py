"""The OTF2 event pass in C (reader.c), for traces of millions of events.

``library()`` gives the compiled reader, building it on first use with gcc
against Debian's ``libopen-trace-format2-dev`` (``envs/setup.sh`` installs it
and builds it) into ``~/.cache/ddl-compare/fastotf2/``, one file per hash of
the source, so an edit to reader.c rebuilds it. Without gcc or the library,
``library()`` is None and ``why_unavailable()`` says why: the Python reader
then reads the trace.

    python -m traces.fastotf2     # build it now; prints its path or why not
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runfiles import variables
from runfiles.atomic import entry_lock

SOURCE = Path(__file__).with_name("reader.c")
HEADER = Path("/usr/include/otf2/otf2.h")
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall")
LIBS = ("-lopen-trace-format2",)
ATTR_STEP, ATTR_EPOCH = 1, 2
NULL = np.iinfo(np.int64).min  # same as traces.table.NULL
OVERFLOW = "more events than the definitions announce"


class _Columns(ctypes.Structure):
    """Mirrors ``Columns`` in reader.c."""

    _fields_ = [
        ("capacity", ctypes.c_int64),
        ("start", ctypes.c_void_p),
        ("end", ctypes.c_void_p),
        ("location", ctypes.c_void_p),
        ("rank", ctypes.c_void_p),
        ("node", ctypes.c_void_p),
        ("region", ctypes.c_void_p),
        ("depth", ctypes.c_void_p),
        ("parent", ctypes.c_void_p),
        ("step", ctypes.c_void_p),
        ("epoch", ctypes.c_void_p),
        ("collective", ctypes.c_void_p),
        ("bytes", ctypes.c_void_p),
        ("enter_row", ctypes.c_void_p),
        ("enter_capacity", ctypes.c_int64),
        ("attribute_ref", ctypes.c_void_p),
        ("attribute_kind", ctypes.c_void_p),
        ("attribute_kinds", ctypes.c_uint32),
        ("context_ref", ctypes.c_void_p),
        ("context_region", ctypes.c_void_p),
        ("context_regions", ctypes.c_uint32),
        ("region_ref", ctypes.c_void_p),
        ("regions", ctypes.c_uint32),
        ("region_of_ref", ctypes.c_void_p),
        ("region_of_refs", ctypes.c_uint32),
        ("location_rank", ctypes.c_void_p),
        ("location_node", ctypes.c_void_p),
        ("region_seen", ctypes.c_void_p),
        ("op_seen", ctypes.c_void_p),
        ("failed", ctypes.c_void_p),
        ("rows", ctypes.c_int64),
        ("unbalanced", ctypes.c_int64),
        ("overlapping", ctypes.c_int64),
        ("unclosed", ctypes.c_int64),
        ("messages_outside", ctypes.c_int64),
        ("renamed", ctypes.c_int64),
        ("overflowed", ctypes.c_int64),
        ("error", ctypes.c_char * 1024),
    ]


# column -> dtype, in the order of _Columns
COLUMN_TYPES = {
    "start": np.int64,
    "end": np.int64,
    "location": np.int32,
    "rank": np.int32,
    "node": np.int32,
    "region": np.uint32,
    "depth": np.int32,
    "parent": np.int64,
    "step": np.int64,
    "epoch": np.int64,
    "collective": np.int32,
    "bytes": np.int64,
}


def cache_dir(name: str = "fastotf2") -> Path:
    return variables.cache(name)


def library_path() -> Path:
    return _built_path(SOURCE, "fastotf2", CFLAGS, LIBS)


def _built_path(source: Path, name: str, cflags, libs) -> Path:
    digest = hashlib.sha256(source.read_bytes() + " ".join(cflags + libs).encode())
    return cache_dir(name) / f"lib{name}-{digest.hexdigest()[:16]}.so"


def build() -> Path:
    """Compile reader.c unless this version is built already; RuntimeError
    saying what is missing otherwise."""
    if not library_path().is_file() and not HEADER.is_file():
        raise RuntimeError(
            f"{HEADER} missing: install Debian's libopen-trace-format2-dev (envs/setup.sh does)"
        )
    return compile_library(SOURCE, "fastotf2", CFLAGS, LIBS)


def compile_library(source: Path, name: str, cflags, libs) -> Path:
    """The shared library of ``source`` in the cache (``~/.cache/ddl-compare/
    <name>/``), compiled with gcc unless this version (hash of the source and
    flags) is built already; RuntimeError saying why not."""
    target = _built_path(source, name, cflags, libs)
    if target.is_file():
        return target
    # Only a build needs these (some 7-15 ms of every import's start-up).
    import shutil
    import subprocess
    import tempfile

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError(f"no C compiler (gcc) to build {source}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Checkouts share the cache: one builds under the entry's lock while the
    # others wait, then use what it built.
    with entry_lock(target):
        if target.is_file():
            return target
        if target.is_dir():  # damaged: a folder where the library belongs
            shutil.rmtree(target)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(fd)
        done = subprocess.run(
            [compiler, *cflags, str(source), *libs, "-o", tmp], capture_output=True, text=True
        )
        if done.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"building {source} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # one rename: a reader never sees half a library
    return target


class CompiledLibrary:
    """A C library built on first use and loaded once (``build`` gives its
    path, ``declare`` sets its functions' types); ``why`` says why it could
    not be."""

    def __init__(self, build, declare):
        self._build, self._declare = build, declare
        self._lib: ctypes.CDLL | None = None
        self.why = ""

    def get(self) -> ctypes.CDLL | None:
        if self._lib is None and not self.why:
            try:
                lib = ctypes.CDLL(str(self._build()))
            except (RuntimeError, OSError) as exc:
                self.why = str(exc)
                return None
            self._declare(lib)
            self._lib = lib
        return self._lib


class _DefTable(ctypes.Structure):
    """Mirrors ``DefTable`` in reader.c."""

    _fields_ = [("rows", ctypes.c_void_p), ("n", ctypes.c_int64), ("room", ctypes.c_int64)]


# the kinds of global definitions reader.c keeps (DEF_* there), each
# record's fields: the archive's, then the record's place in the file
DEFINITION_FIELDS = {
    "strings": ("ref", "offset", "length", "seq"),
    "clocks": ("resolution", "offset", "realtime", "seq"),
    "nodes": ("ref", "name", "class_name", "parent", "seq"),
    "groups": ("ref", "name", "type", "parent", "creator", "seq"),
    "locations": ("ref", "name", "type", "events", "group", "seq"),
    "regions": ("ref", "name", "canonical", "description", "file", "seq"),
    "attributes": ("ref", "name", "description", "seq"),
    "contexts": ("ref", "region", "where", "parent", "seq"),
}


class _Definitions(ctypes.Structure):
    """Mirrors ``Definitions`` in reader.c."""

    _fields_ = [
        ("table", _DefTable * len(DEFINITION_FIELDS)),
        ("blob", ctypes.c_void_p),
        ("blob_len", ctypes.c_int64),
        ("blob_room", ctypes.c_int64),
        ("seq", ctypes.c_uint64),
        ("failed", ctypes.c_int),
    ]


def definitions(anchor: Path) -> tuple[dict, bytes] | None:
    """The archive's global definitions as reader.c keeps them: ({kind: its
    records, each a tuple of DEFINITION_FIELDS[kind]}, the strings' bytes),
    without the ``otf2`` bindings; None when the library could not read
    them whole (its report went to the standard error)."""
    lib = library()
    found = _Definitions()
    if lib is None or lib.fastotf2_definitions(str(anchor).encode(), ctypes.byref(found)) != 0:
        return None
    try:
        records = {}
        for table, (kind, fields) in zip(found.table, DEFINITION_FIELDS.items()):
            flat = (ctypes.c_uint64 * (table.n * len(fields))).from_address(table.rows or 0)
            rows = np.frombuffer(flat, dtype=np.uint64) if table.n else np.zeros(0, np.uint64)
            records[kind] = [tuple(r) for r in rows.reshape(-1, len(fields)).tolist()]
        blob = ctypes.string_at(found.blob, found.blob_len) if found.blob_len else b""
    finally:
        lib.fastotf2_definitions_free(ctypes.byref(found))
    return records, blob


def _declare(lib: ctypes.CDLL) -> None:
    lib.fastotf2_definitions.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Definitions)]
    lib.fastotf2_definitions.restype = ctypes.c_int
    lib.fastotf2_definitions_free.argtypes = [ctypes.POINTER(_Definitions)]
    lib.fastotf2_definitions_free.restype = None
    lib.fastotf2_read.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.POINTER(_Columns),
    ]
    lib.fastotf2_read.restype = ctypes.c_int


_LIBRARY = CompiledLibrary(build, _declare)


def library() -> ctypes.CDLL | None:
    """The compiled reader, built on first use; None when it cannot be."""
    return _LIBRARY.get()


def why_unavailable() -> str:
    return _LIBRARY.why


class ReadError(Exception):
    """The C reader stopped: the message says why (the library's own words)."""


COUNTS = ("unbalanced", "overlapping", "unclosed", "messages_outside", "renamed")
OPERATIONS = 256  # OTF2_CollectiveOp is a uint8_t


@dataclass(frozen=True)
class Locations:
    """The locations to read, in order: their refs, the events each
    announces, the most each can hold (its file's size), and the rank and
    node (codes) each row of theirs takes."""

    refs: np.ndarray
    events: np.ndarray
    bounds: np.ndarray
    ranks: np.ndarray
    nodes: np.ndarray

    @classmethod
    def of(cls, refs, events, bounds, ranks, nodes) -> Locations:
        return cls(
            np.asarray(refs, dtype=np.uint64),
            np.asarray(events, dtype=np.int64),
            np.asarray(bounds, dtype=np.int64),
            np.asarray(ranks, dtype=np.int32),
            np.asarray(nodes, dtype=np.int32),
        )

    def __len__(self) -> int:
        return len(self.refs)

    def part(self, first: int, stop: int) -> Locations:
        return Locations(*(a[first:stop] for a in vars(self).values()))


class Lookups:
    """The definitions the C reader looks up by ref, as large as the
    definitions present, whatever their refs: the step and epoch attributes
    (ref -> ATTR_STEP or ATTR_EPOCH), each calling context's region, and the
    regions defined (rows give a region's index among ``region_refs``,
    sorted; ``len(region_refs)`` for a ref not defined)."""

    def __init__(self, attribute_kinds: dict, region_refs, context_regions: dict | None = None):
        self.attributes = _lookup(attribute_kinds, np.uint8)
        self.contexts = _lookup(context_regions or {}, np.uint32)
        self.region_refs = np.unique(np.asarray(list(region_refs), dtype=np.uint32))
        refs = self.region_refs
        # a table by ref where the refs are dense; else searched by halves
        self.region_of_ref = None
        if refs.size and int(refs[-1]) < 4 * refs.size + (1 << 16):
            self.region_of_ref = np.full(int(refs[-1]) + 1, refs.size, dtype=np.uint32)
            self.region_of_ref[refs] = np.arange(refs.size, dtype=np.uint32)


def read_intervals(
    anchor: Path, locations: Locations, lookups: Lookups, workers: int | None = None
):
    """(columns, counts, seen, failed): one entry per matched interval of the
    given locations, in that order; ``seen``: whether any row holds each
    region index ("region", ``len(lookups.region_refs) + 1`` long) and each
    collective operation ("collective"); ``failed``: per location, whether it
    could not be read to its end (its rows before the fault are kept).

    A location that holds more events than it announces is read again with
    room for its bound. Locations are read in parallel, ``workers`` at a
    time (default: the cores this process may use); ctypes lets go of the
    GIL while the C reader runs. Raises ReadError when the archive cannot be
    read at all."""
    workers = workers or len(os.sched_getaffinity(0))
    chunks = _chunks(len(locations), locations.events.tolist(), workers)

    # One set of columns for all chunks, each chunk's rows written into its
    # own stretch of them: joined afterwards by moving rows down, in memory
    # already touched, not by copying every column into new memory.
    capacities = [int(locations.events[chunk].sum()) // 2 + 1 for chunk in chunks]
    shared = _empty_columns(sum(capacities))
    bases = np.cumsum([0, *capacities])

    def read(k):
        chunk = chunks[k]
        into = {name: a[bases[k] : bases[k + 1]] for name, a in shared.items()}
        first = chunk[0] if chunk else 0
        return _read_chunk(anchor, locations.part(first, first + len(chunk)), lookups, into)

    if len(chunks) == 1:
        parts = [read(0)]
    else:
        with ThreadPoolExecutor(len(chunks)) as pool:
            parts = list(pool.map(read, range(len(chunks))))
    return _merge(parts, chunks, shared, bases)


def _lookup(values: dict, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(refs sorted, their values): what the C reader searches by halves, as
    large as the definitions present, whatever their refs."""
    refs = np.array(sorted(values), dtype=np.uint32)
    return refs, np.array([values[int(r)] for r in refs], dtype=dtype)


def _chunks(n: int, events: list[int], workers: int) -> list[list[int]]:
    """Consecutive location indices in about equal shares of the events."""
    if n == 0:
        return [[]]
    total = max(sum(events), 1)
    share = total / max(1, min(workers, n))
    chunks, current, load = [], [], 0
    for i in range(n):
        current.append(i)
        load += events[i]
        if load >= share * (len(chunks) + 1) and len(chunks) < workers - 1:
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks


def _read_chunk(anchor: Path, locations: Locations, lookups: Lookups, into: dict):
    result = _call(anchor, locations, lookups, int(locations.events.sum()), into)
    if result is None:  # more events than announced: room for the files' bound
        room = int(np.maximum(locations.events, locations.bounds).sum())
        result = _call(anchor, locations, lookups, room)
    if result is None:
        raise ReadError(OVERFLOW)
    return result


def _empty_columns(capacity: int) -> dict:
    # np.empty: pages the reader never writes cost no memory
    return {name: np.empty(capacity, dtype=dtype) for name, dtype in COLUMN_TYPES.items()}


def _call(anchor: Path, locations: Locations, lookups: Lookups, events: int, into=None):
    """(columns, counts, seen, failed) of one call of the C reader; None on
    overflow. ``into``: columns to write into, if they hold enough rows."""
    lib = library()
    capacity = events // 2 + 1
    if into is not None and len(into["start"]) >= capacity:
        columns = into
    else:
        columns = _empty_columns(capacity)
    enter_row = np.empty(events + 1, dtype=np.int64)
    failed = np.zeros(max(len(locations), 1), dtype=np.int8)
    seen = {
        "region": np.zeros(lookups.region_refs.size + 1, dtype=np.uint8),
        "collective": np.zeros(OPERATIONS, dtype=np.uint8),
    }
    dense = lookups.region_of_ref
    out = _Columns(
        capacity=capacity,
        enter_row=enter_row.ctypes.data,
        enter_capacity=enter_row.size,
        attribute_ref=lookups.attributes[0].ctypes.data,
        attribute_kind=lookups.attributes[1].ctypes.data,
        attribute_kinds=lookups.attributes[0].size,
        context_ref=lookups.contexts[0].ctypes.data,
        context_region=lookups.contexts[1].ctypes.data,
        context_regions=lookups.contexts[0].size,
        region_ref=lookups.region_refs.ctypes.data,
        regions=lookups.region_refs.size,
        region_of_ref=dense.ctypes.data if dense is not None else None,
        region_of_refs=dense.size if dense is not None else 0,
        location_rank=locations.ranks.ctypes.data,
        location_node=locations.nodes.ctypes.data,
        region_seen=seen["region"].ctypes.data,
        op_seen=seen["collective"].ctypes.data,
        failed=failed.ctypes.data,
        **{name: a.ctypes.data for name, a in columns.items()},
    )
    status = lib.fastotf2_read(
        str(anchor).encode(), locations.refs.ctypes.data, len(locations), ctypes.byref(out)
    )
    if out.overflowed:
        return None
    if status != 0:
        raise ReadError(out.error.decode(errors="replace") or "unknown error")
    del enter_row
    rows = out.rows
    # Slices keep the whole allocation alive, but only the rows were touched.
    columns = {name: a[:rows] for name, a in columns.items()}
    counts = {name: getattr(out, name) for name in COUNTS}
    counts["error"] = out.error.decode(errors="replace")
    return columns, counts, seen, failed[: len(locations)].astype(bool)


def _merge(parts: list, chunks: list[list[int]], shared: dict, bases: np.ndarray):
    """One set of columns from the chunks': location indices and parent rows
    shifted to the whole. When every chunk was read into its stretch of
    ``shared``, the rows are moved down into place; else (a chunk held more
    events than announced and was read again) they are copied into new
    columns."""
    if len(parts) == 1:
        return parts[0]
    sizes = [len(p[0]["start"]) for p in parts]
    in_place = all(
        part[0]["start"].ctypes.data == shared["start"][base:].ctypes.data
        for part, base in zip(parts, bases)
    )
    if not in_place:
        shared = _empty_columns(sum(sizes))
    at = 0
    for (cols, *_), chunk, size, base in zip(parts, chunks, sizes, bases):
        for name, column in shared.items():
            piece = column[at : at + size]
            # a chunk's rows are in place only where every chunk before it
            # filled its whole stretch (chunks of no rows included)
            if at != base or not in_place:
                piece[:] = cols[name]  # numpy moves overlapping rows right
            if name == "location" and chunk and chunk[0]:
                piece += np.int32(chunk[0])
            elif name == "parent" and at:
                piece[piece >= 0] += at
        at += size
    columns = {name: column[:at] for name, column in shared.items()}
    counts = {name: sum(p[1][name] for p in parts) for name in COUNTS}
    counts["error"] = next((p[1]["error"] for p in parts if p[1]["error"]), "")
    seen = {name: np.bitwise_or.reduce([p[2][name] for p in parts]) for name in parts[0][2]}
    return columns, counts, seen, np.concatenate([p[3] for p in parts])


def main() -> int:
    try:
        print(build())
    except RuntimeError as exc:
        print(f"fastotf2: {exc}", file=sys.stderr)
        return 1
    return 0
