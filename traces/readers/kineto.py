"""PyTorch profiler (Kineto) Chrome traces, old schema (categories Operator,
Runtime, Kernel, Memcpy) and new (cpu_op, cuda_runtime, kernel, gpu_memcpy,
user_annotation, gpu_user_annotation), plain or gzip-compressed.

Every complete event (``ph: X``) is one interval; ``ts``/``dur`` are
microseconds (integers in old files, decimals in new ones). Intervals nest
per (pid, tid) by time. A GPU activity's parent is the runtime call that
launched it (same ``correlation``), and a GPU-side annotation's the CPU
record it mirrors (same ``External id``), so that GPU work takes the phase
and the collective of the code that launched it. rank:
``distributedInfo.rank`` when present, else the number in the file name
(``rank1.json``), else 0.

Collectives: the ``Collective name`` argument or the rules name them;
``In msg nelems`` (or ``In msg size``) times the ``dtype`` size gives the
bytes. One real collective shows as several nested records (c10d call,
``record_param_comms``, ``nccl:*``, the kernel); traces/table.py keeps one
instance of it (see ``op_id``). A ``wait`` is not a collective.

The events array is read a chunk at a time by the C scanner of
traces/fastjson straight into columns; a chunk it does not take (damaged,
or of shapes it leaves to msgspec), and every chunk where no C compiler is,
is decoded by msgspec into typed records (traces/jsonrecords.py). Either
way everything after that is numpy: no Python per event.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa

from traces import arrow_kernels as ak
from traces import fastjson, jsonrecords, nesting
from traces.readers import Problem, Reader, TraceError, events_opened_at, read_bytes, register
from traces.table import (
    NULL,
    PHASE_CODE,
    Columns,
    finish_columns,
    from_numpy,
    strings,
    to_numpy,
)

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
RUNTIME_CATEGORIES = {"cuda_runtime", "Runtime", "cuda_driver"}
GPU_ANNOTATION = "gpu_user_annotation"
KINETO_KEYS = (
    b'"traceEvents"',
    b'"schemaVersion"',
    b'"deviceProperties"',
    b'"distributedInfo"',
    b'"displayTimeUnit"',
)

# Element sizes by dtype, as PyTorch spells them in different versions
# (torch.float32, float32, Float, c10::Half ...), compared in lower case.
DTYPE_BYTES = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "byte": 1,
    "char": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int16": 2,
    "short": 2,
    "uint16": 2,
    "float32": 4,
    "float": 4,
    "int32": 4,
    "int": 4,
    "uint32": 4,
    "float64": 8,
    "double": 8,
    "int64": 8,
    "long": 8,
    "uint64": 8,
    "complexfloat": 8,
    "complex64": 8,
    "complexdouble": 16,
    "complex128": 16,
    # C++ spellings of ``Input type`` (record_shapes)
    "signed char": 1,
    "unsigned char": 1,
    "short int": 2,
    "unsigned short": 2,
    "unsigned int": 4,
    "long int": 8,
    "long long": 8,
    "long long int": 8,
    "unsigned long": 8,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "complex<c10::half>": 4,
    "complex<float>": 8,
    "complex<double>": 16,
    # c10's ScalarType names the rest (``dtype`` of record_param_comms):
    # MX scales, packed FP4 (one byte an element, two values in it),
    # quantized and bit types
    "complexhalf": 4,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
    "quint4x2": 1,
    "quint2x4": 1,
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
    "bits8": 1,
    "bits16": 2,
}

# ``Collective name`` values -> the collective names of traces/rules.yaml;
# None: not a collective (waits, coalescing markers).
COLLECTIVE_NAMES = {
    "allreduce": "allreduce",
    "all_reduce": "allreduce",
    "allreduce_coalesced": "allreduce",
    "broadcast": "bcast",
    "bcast": "bcast",
    "allgather": "allgather",
    "all_gather": "allgather",
    "_allgather_base": "allgather",
    "allgather_into_tensor_coalesced": "allgather",
    "allgather_coalesced": "allgather",
    "all_gather_into_tensor": "allgather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "wait": None,
    "coalesced": None,
    "startcoalescing": None,
    "endcoalescing": None,
}

Id = int | str | None


class Args(msgspec.Struct, gc=False):
    """The few arguments a phase table needs; msgspec skips the others."""

    name: str | None = None  # of a process_name / thread_name metadata record
    correlation: Id = None
    external_id: Id = msgspec.field(name="External id", default=None)
    collective: str | None = msgspec.field(name="Collective name", default=None)
    nelems: int | float | str | None = msgspec.field(name="In msg nelems", default=None)
    size: int | float | str | None = msgspec.field(name="In msg size", default=None)
    dtype: str | None = None


ABSENT, ZERO = msgspec.Raw(b""), msgspec.Raw(b"0")  # a time's text when the record has none
_NUMBER_START = frozenset(b"-0123456789")
_JSON_KIND = {ord('"'): "str", ord("t"): "bool", ord("f"): "bool", ord("n"): "null"}


def exact_ns(raw, nullable: bool) -> int:
    """Integer nanoseconds of a ``ts``/``dur`` of microseconds from its JSON
    text (ns_of_number); NO_TIME for none (or null, where ``nullable``).
    Anything but a number is refused as msgspec refuses a float field's
    (a ValidationError of the record, which counts it)."""
    if isinstance(raw, int):  # decoded already
        return raw
    text = bytes(raw)
    if not text or (nullable and text == b"null"):
        return NO_TIME
    if text[0] in _NUMBER_START:
        return ns_of_number(Decimal(text.decode("ascii")))
    raise TypeError(f"Expected `float`, got `{_JSON_KIND.get(text[0], 'object')}`")


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str | None = None
    pid: Id = None
    tid: Id = None
    # the number's text, integer nanoseconds once decoded (exact_ns): a
    # double holds 0.25 us steps at today's epoch times; NO_TIME: none (the
    # event is skipped and counted)
    ts: msgspec.Raw = ABSENT
    dur: msgspec.Raw = ZERO
    args: Args | None = None

    def __post_init__(self):
        self.ts = exact_ns(self.ts, nullable=False)  # type: ignore[assignment]
        self.dur = exact_ns(self.dur, nullable=False)  # type: ignore[assignment]


class Document(msgspec.Struct):
    """The events stay raw bytes, decoded in chunks (bounded memory)."""

    traceEvents: msgspec.Raw
    distributedInfo: dict | None = None


# Made once, at import: msgspec builds a Struct's type information on its
# first decoder, and two reader threads building Event's at once (a folder's
# files are read two at a time) crashed the process once (a NULL field type
# in msgspec's struct decoding, the other thread's half-built information).
# Decoders are safe to share between threads.
DOCUMENT_DECODER = msgspec.json.Decoder(Document)
EVENT_DECODER = msgspec.json.Decoder(Event)
EVENTS_DECODER = msgspec.json.Decoder(list[Event])


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_MICROSECONDS = 9_200_000_000_000_000  # of a time in nanoseconds that an int64 holds
NO_TIME = fastjson.NO_TIME  # a ts or dur in nanoseconds: none, not a number, or out of range


@register
class KinetoReader(Reader):
    name = "kineto"
    patterns = (
        "torch_profiler/*.json",
        "torch_profiler/*.json.gz",
        "*.pt.trace.json",
        "*.pt.trace.json.gz",
        "*.json",
        "*.json.gz",
    )
    # numpy.ma: np.unique asks for it (numpy 2.4), in the collectives' join
    # of any trace with collectives: 12 ms that would hold a reader's GIL
    # (pyarrow.compute is not imported: traces/arrow_kernels.py)
    imports = ("numpy.ma",)

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        """A JSON object with Kineto's keys near its start (not any JSON file
        of a run folder), or a bare array of Kineto's events (PyTorch 1.8
        wrote its traces in Chrome's array format; a Horovod Timeline's
        records have no ``cat``)."""
        body = head.lstrip()
        if body.startswith(b"["):
            return b'"cat"' in body and any(mark in body for mark in ARRAY_MARKS)
        return body.startswith(b"{") and any(key in head for key in KINETO_KEYS)

    def read(self, path: Path, rules, run_id: str = ""):
        data, problem = read_bytes(path, kept=True)
        data, unclosed = _as_document(data)
        batches, info, problems = _decode(data, path)
        events = _Events()
        for batch in batches:
            events.add(batch)
        del batches
        problems = ([problem] if problem else []) + problems
        # the document's end, where Kineto writes baseTimeNanoseconds, is lost
        cut_short = (
            problem is not None or unclosed or not bytes(data[-4096:]).rstrip().endswith(b"}")
        )
        if not any(p.lost for p in problems) and (unclosed or _cut_between_records(data)):
            cut_short = True
            problems.append(
                Problem(
                    f"{path}: the trace ends between two of its events (cut?): the events "
                    "array and the document are not closed, so the events after the cut "
                    "are lost; those before it were read"
                )
            )
        if events.untimed:
            problems.append(
                Problem(
                    f"{path}: {events.untimed:,} complete event(s) without a valid 'ts' "
                    "(none, or beyond the year 2262, past what int64 nanoseconds hold) or "
                    "with a 'dur' beyond that were skipped (one without 'dur' is read as "
                    "an instant, zero length)"
                )
            )
        if events.backwards:
            problems.append(
                Problem(
                    f"{path}: {events.backwards:,} complete event(s) of negative 'dur' (they "
                    "end before they begin) were skipped"
                )
            )
        events.sizes_from_shapes(data, rules)
        events.flows_of_unlinked(data)
        base = _base_time_ns(data)
        del data
        rank, said = _rank(info, path)
        if said:
            problems.append(said)
        columns = events.columns(rank)
        if columns.end_ns.size and not (
            0 <= base and base + max(int(columns.end_ns.max()), 0) <= INT64_MAX
        ):
            raise TraceError(
                f"{path}: baseTimeNanoseconds {base:.4g} puts its events beyond the year "
                "2262 (what nanoseconds since 1970 can hold): not a time; the trace is damaged"
            )
        if not base and cut_short and columns.start_ns.size:
            if int(columns.start_ns.min()) < RELATIVE_BEFORE_NS:
                problems.append(
                    Problem(
                        f"{path}: no baseTimeNanoseconds (Kineto writes it after the events, "
                        "and the trace is cut before it): its times are since a base that "
                        "was lost, not Unix time",
                        lost=False,
                    )
                )
        columns.start_ns += base
        columns.end_ns += base
        table = finish_columns(
            columns, rules, self.name, run_id, place=place_by_position, join=join_collectives
        )
        return table, problems


# What a bare array of events shows near its start when Kineto wrote it.
ARRAY_MARKS = (b'"External id"', b'"Trace name": "PyTorch Profiler"', b'"cat": "Operator"')


def _as_document(data: bytes) -> tuple[bytes, bool]:
    """(the trace as Kineto's document, whether it was an array left open):
    a bare array of events (PyTorch 1.8) becomes ``{"traceEvents": [...]}``;
    an array without its ``]`` was cut (PyTorch closed it)."""
    if not data[:4096].lstrip().startswith(b"["):  # no copy of a whole document
        return data, False
    body = data.strip()
    closed = body.endswith(b"]")
    if not closed:
        body = body.rstrip(b",").rstrip() + b"]"
    return b'{"traceEvents": ' + body + b"}", not closed


TAIL_BYTES = 1 << 20  # of a document looked at for how it ends
BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


# Times before this (2001-09-09) are no Unix time of a profiled run: ``ts``
# counted from a baseTimeNanoseconds the trace lost.
RELATIVE_BEFORE_NS = 10**18


def _base_time_ns(data: bytes) -> int:
    """Kineto since 2024 writes every ``ts`` relative to
    ``baseTimeNanoseconds`` (the Unix time at the start of the quarter, so
    that ``ts`` fits a double; written at the document's end): Unix time is
    the base plus ``ts``. 0 where there is none (``ts`` is Unix time)."""
    for part in (data[-TAIL_BYTES:], data[:TAIL_BYTES]):
        found = BASE_TIME.search(part)
        if found:
            return int(found.group(1))
    return 0


# The record a process group's backend writes for each collective
# (``nccl:all_reduce``, ``gloo:broadcast``, ``hccl:allgather`` ...).
BACKEND_RECORD = re.compile(r"^(nccl|gloo|hccl|mpi|ucc|xccl|rccl|mccl|ccl):", re.IGNORECASE)
RECORD_BYTES = 1 << 16  # the most one backend record is looked for in
FLOW_RECORD = re.compile(rb'"ph"\s*:\s*"[sf]"')


def _record_at(data: bytes, name_at: int):
    """The JSON record whose ``name`` value starts at ``name_at`` (Kineto
    writes ``name`` before ``args``: the record opens at the ``{`` before
    it), or None."""
    start = data.rfind(b"{", max(0, name_at - RECORD_BYTES), name_at)
    if start < 0:
        return None
    for size in (4096, RECORD_BYTES):  # most records are far shorter than the most
        text = data[start : start + size].decode("utf-8", errors="replace")
        try:
            return json.JSONDecoder(parse_float=Decimal).raw_decode(text)[0]
        except (ValueError, RecursionError):
            continue
    return None


def _shaped(data: bytes, needle: bytes, at: int, looks: int = 8) -> bool:
    """Whether the first records named ``needle`` (from ``at``) carry
    ``Input Dims``: a trace is recorded with shapes or without, so a few
    tell (a GPU-side copy of the record has no arguments), and a trace
    without them costs no pass over all of its text."""
    for _ in range(looks):
        if at < 0:
            return False
        record = _record_at(data, at)
        if isinstance(record, dict) and "Input Dims" in (record.get("args") or {}):
            return True
        at = data.find(needle, at + len(needle))
    return False


def _shape_bytes(args) -> int | None:
    """Bytes of the tensors a record's ``Input Dims`` and ``Input type``
    describe (scalars and tensor lists, shown as ``[]``, are not counted);
    None when no tensor of a known dtype is there."""
    if not isinstance(args, dict):
        return None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total, known = 0, False
    for shape, dtype in zip(dims, types):
        size = dtype_bytes(dtype) if isinstance(dtype, str) else None
        if size and isinstance(shape, list) and shape and all(type(n) is int for n in shape):
            total += math.prod(shape) * size
            known = True
    return total if known else None


def dtype_bytes(dtype: str) -> int | None:
    """An element's bytes, by its dtype as any reader's trace spells it
    (torch.float32, float32, Float, c10::Half ...); None for one unknown."""
    return DTYPE_BYTES.get(dtype.lower().removeprefix("torch.").removeprefix("c10::"))


def _cut_between_records(data: bytes) -> bool:
    """Whether the document ends where one of its records does, not with the
    ``}`` that closes it: a cut there leaves every record whole, so reading
    them record by record finds no bad one, yet the events after the cut are
    lost. Only the tail is looked at: the first ``{`` from the end whose
    text decodes to the end is the last value, a record when it has ``ph``."""
    tail = data[-TAIL_BYTES:].rstrip().decode("utf-8", errors="replace")
    if not tail.endswith("}"):
        return bool(tail)  # cut inside a value or after a separator
    decoder, at = json.JSONDecoder(), len(tail)
    for _ in range(256):  # the last record's nested objects come first
        at = tail.rfind("{", 0, at)
        if at < 0:
            return False
        try:
            last, end = decoder.raw_decode(tail, at)
        except (ValueError, RecursionError):
            continue
        if end == len(tail):
            return isinstance(last, dict) and "ph" in last
    return False


def _decode(data: bytes, path: Path):
    """(batches of events, distributedInfo, problems), keeping every
    readable event: the events array is decoded a chunk at a time. The
    scanner reads the last chunk up to where the array ends, and msgspec
    only the document around the array (for distributedInfo); where the
    scanner does not take that chunk, the document less all but the last
    chunk is decoded as a whole (for distributedInfo and where the array
    ends). The chunks before need no pass of their own."""
    problems: list = []
    opened = events_opened_at(data)
    if opened >= 0:
        chunks, last = jsonrecords.chunks(data, _first_record(data, opened))
        # the last chunk scanned up to the array's end, which the scanner
        # finds: only the document around the array is left to msgspec
        tail = fastjson.scan(data, last, None, False, open_ended=True)
        if tail is not None:
            try:
                doc = DOCUMENT_DECODER.decode(data[:opened] + data[tail.array_end :])
            except UNREADABLE:
                pass  # as if the scanner had not taken it: below
            else:
                runs = [(data, begin, end, False) for begin, end in chunks]
                batches = itertools.chain(_batches(runs, path, problems), [tail])
                return batches, doc.distributedInfo, problems
        rest = data[:opened] + data[last:] if chunks else data
        try:
            doc = DOCUMENT_DECODER.decode(rest)
        except UNREADABLE:
            pass  # cut or damaged: read as a whole below
        else:
            pieces = _pieces(data, chunks, last, doc.traceEvents)
            return _batches(pieces, path, problems), doc.distributedInfo, problems
    try:
        doc = DOCUMENT_DECODER.decode(data)
    except UNREADABLE:
        return _salvaged(data, path)
    pieces = [(doc.traceEvents, 0, None, True)]
    return _batches(pieces, path, problems), doc.distributedInfo, problems


def _pieces(data: bytes, chunks: list[tuple[int, int]], last: int, tail):
    """(buffer, begin, end, bracketed) of the chunks' records (inside the
    array), then of the last chunk, from ``last`` to the array's end: the
    ``]`` that ends ``tail``, the array as decoded from the document less
    the chunks before (so it lies ``len(tail) - 2`` bytes after ``last``)."""
    for begin, end in chunks:
        yield data, begin, end, False
    end = last + len(tail) - 2
    yield (data, last, end, False) if data[end : end + 1] == b"]" else (tail, 0, None, True)


def _batches(pieces, path: Path, problems: list):
    """Batches of events: scanned into columns in C (traces/fastjson) where
    the scanner is built and the run is of the plain shapes it takes, else
    decoded by msgspec into a list of events (traces/jsonrecords)."""
    return jsonrecords.batches(pieces, fastjson.scan, EVENTS_DECODER, Event, path, problems)


@functools.lru_cache(maxsize=1 << 16)
def _shape_sized(name, rules, unsized_trace: bool) -> bool:
    """Whether a region of this name takes its size from its input's shape
    (see _Events.sizes_from_shapes): a backend record where no record of the
    trace is sized, or a collective outside c10d. Asked once per name and
    rules, not once per name and file (a trace's ranks share their names)."""
    if not isinstance(name, str):
        return False
    if BACKEND_RECORD.match(name):
        return unsized_trace
    return rules.match(name, KinetoReader.name)[1] is not None and not name.startswith("c10d::")


def _first_record(data: bytes, at: int) -> int:
    """Where the first record of the array opened before ``at`` begins."""
    while data[at : at + 1].isspace():
        at += 1
    return at


# What a document that does not decode at once raises: it is then read
# record by record, and each record that does not read is counted with why.
UNREADABLE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)


def _salvaged(data: bytes, path: Path):
    problems: list[Problem] = []
    text = jsonrecords.text_of(data, path, problems)
    found = re.search(r'"traceEvents"\s*:\s*\[', text)
    if found is None:
        raise TraceError(
            f"{path}: not a PyTorch profiler trace, or cut before its events "
            "(truncated or corrupt?): no 'traceEvents' list"
        )
    events, lost = jsonrecords.salvage(text, found.end() - 1, Event, path)
    problems += lost
    # the whole object: since PyTorch 2.1 it nests ("pg_config": [{...}]),
    # which a pattern of flat braces missed (the rank was lost: 0)
    found = re.search(r'"distributedInfo"\s*:\s*(?=\{)', text)
    try:
        info = json.JSONDecoder().raw_decode(text, found.end())[0] if found else None
    except (ValueError, RecursionError):
        info = None
    if not events:
        why = f": {lost[0].split(': ', 1)[1]}" if lost else " (truncated or corrupt?)"
        raise TraceError(f"{path}: no readable event{why}")
    return [events], info, problems


MAX_RANK = (1 << 31) - 1  # the rank column's int32


def _rank(info, path: Path) -> tuple[int, Problem | None]:
    """distributedInfo.rank (torch.distributed runs), else the rank in the
    file name (our runs write torch_profiler/rank<r>.json), else 0; and the
    problem where distributedInfo gives a rank that is none (text, a
    fraction, true, negative, past int32): that one is not taken silently."""
    given = info.get("rank") if isinstance(info, dict) else None
    if type(given) is int and 0 <= given <= MAX_RANK:
        return given, None
    found = re.search(r"rank[-_]?(\d+)", path.name)
    rank = int(found.group(1)) if found and int(found.group(1)) <= MAX_RANK else 0
    if given is None:
        return rank, None
    source = "the rank in the file's name" if found else "rank 0"
    return rank, Problem(
        f"{path}: distributedInfo.rank {json.dumps(given)[:40]} is no rank (a whole "
        f"number from 0); {source} ({rank}) is used",
        lost=False,
    )


class _Codes:
    """Names -> small integer codes, the same across batches."""

    def __init__(self):
        self.index: dict = {}
        # the text names seen, in C (the scanner's name table) or else as
        # Arrow strings with their codes: a batch's known names are looked
        # up there, only new ones in Python
        self.table = fastjson.name_table()
        self.texts = strings([])
        self.text_codes = np.zeros(0, dtype=np.int32)

    def of(self, values: list) -> np.ndarray:
        """Codes of ``values``; strings (and None) through Arrow's dictionary
        encoding, ints through numpy: either is a few times faster than
        hashing Python objects one by one."""
        kinds = set(map(type, values))
        if kinds <= {str, type(None)}:
            return self.of_strings(strings(values))
        if kinds == {int} and INT64_MIN < min(values) and max(values) <= INT64_MAX:
            return self.of_ints(np.fromiter(values, np.int64, len(values)))  # pids and tids
        import pandas as pd  # here only: ids of mixed kinds are rare

        local, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
        return self._known(local, [None if u != u else u for u in uniques])  # None, not NaN

    def of_strings(self, array: pa.StringArray, escaped: bool = False) -> np.ndarray:
        """Codes of an Arrow string array (null: None); ``escaped``: its
        strings may still hold JSON escapes (the scanner's raw bytes)."""
        if not escaped:
            return self._of_texts(array)
        encoded = ak.dictionary_encode(array, null_encoding="encode")
        local = to_numpy(encoded.indices)
        uniques = encoded.dictionary.to_pylist()
        if escaped:
            uniques = [json.loads(f'"{u}"') if u and "\\" in u else u for u in uniques]
        return self._known(local, uniques)

    def _of_texts(self, array: pa.StringArray) -> np.ndarray:
        """Codes of plain strings (null: None): each looked up among the
        names seen, the new ones coded first, in the order they come."""
        if self.table is not None:
            codes = self.table.codes(array, self._code_new)
        else:
            codes = self._looked_up(array)
        if array.null_count:
            none = self.index.setdefault(None, len(self.index))
            codes[to_numpy(ak.is_null(array))] = none
        return codes

    def _code_new(self, names: list):
        """Codes of names, the unseen ones given the next codes in turn."""
        start = len(self.index)
        fresh = dict(zip(names, range(start, start + len(names))))
        # the usual case, each name new and once (a batch's names new to the
        # C table): one dict built in C, not a Python call per name
        if len(fresh) == len(names) and self.index.keys().isdisjoint(fresh):
            self.index.update(fresh)
            return np.arange(start, start + len(names))
        return [self.index.setdefault(u, len(self.index)) for u in names]

    def _looked_up(self, array: pa.StringArray) -> np.ndarray:
        """_of_texts without the compiled library: Arrow's hash lookup among
        the names seen (0 where null)."""
        at = ak.index_in(array, value_set=self.texts)
        new = ak.and_(ak.is_null(at), ak.is_valid(array))
        if ak.any_true(new):
            names = ak.unique(ak.filter(array, new))
            added = self._code_new(names.to_pylist())
            self.texts = pa.concat_arrays([self.texts, names])
            self.text_codes = np.r_[self.text_codes, np.array(added, dtype=np.int32)]
            at = ak.index_in(array, value_set=self.texts)
        if not len(self.texts):  # nulls only, and no name yet
            return np.zeros(len(array), dtype=np.int32)
        return self.text_codes[to_numpy(ak.fill_null(at, 0))]

    def of_ints(self, values: np.ndarray) -> np.ndarray:
        local, uniques = factorize(values)
        return self._known(local, uniques.tolist())

    def of_ids(self, values: np.ndarray, kinds: np.ndarray, text_rows, texts) -> np.ndarray:
        """Codes of the scanner's ids: int64 ``values`` where ``kinds`` says
        an int, None where absent, ``texts`` at ``text_rows``."""
        local = np.full(len(values), -1, dtype=np.int64)
        ints = kinds == fastjson.ID_INT
        local[ints], uniques = factorize(values[ints])
        uniques = uniques.tolist()
        absent = kinds == fastjson.ID_ABSENT
        if absent.any():
            local[absent] = len(uniques)
            uniques.append(None)
        codes = self._known(local, uniques)
        if len(text_rows):
            codes[text_rows] = self.of(texts)
        return codes

    def _known(self, local: np.ndarray, uniques) -> np.ndarray:
        known = np.array(
            [self.index.setdefault(u, len(self.index)) for u in uniques], dtype=np.int32
        )
        return known[local] if len(uniques) else np.zeros(len(local), dtype=np.int32)

    def names(self) -> list:
        return list(self.index)


class _Events:
    """The complete events of a trace as numpy columns, batch by batch: the
    event objects of one batch are dropped before the next is decoded."""

    def __init__(self):
        self.regions, self.categories = _Codes(), _Codes()
        self.pids, self.tids, self.collectives = _Codes(), _Codes(), _Codes()
        self.parts: list[dict] = []
        self.process, self.thread = {}, {}
        self.untimed = 0
        self.backwards = 0  # events of negative duration
        self.shaped: dict = {}  # (region, start, where) -> bytes, from shapes
        self.flows: dict = {}  # (where, start) -> flow id, of unlinked launches and GPU work

    def add(self, batch) -> None:
        """One batch: a list of events (msgspec) or scanned columns."""
        if isinstance(batch, fastjson.Scanned):
            self._add_scanned(batch)
        else:
            self._add_events(batch)

    def _add_events(self, batch: list) -> None:
        """One field at a time over the batch (a list comprehension each),
        then numpy: the cheapest Python there is per event."""
        self._metadata(batch)
        complete = [e for e in batch if e.ph == "X"]
        ts = np.fromiter([e.ts for e in complete], np.int64, len(complete))
        dur = np.fromiter([e.dur for e in complete], np.int64, len(complete))
        timed = self._timed(ts, dur)
        if not timed.all():
            complete = [e for e, ok in zip(complete, timed) if ok]
            ts, dur = ts[timed], dur[timed]
        n = len(complete)
        with_args = np.array(
            [i for i, e in enumerate(complete) if e.args is not None], dtype=np.int64
        )
        present = [e.args for e in complete if e.args is not None]
        self._append(
            ts,
            dur,
            region=self.regions.of([e.name for e in complete]),
            category=self.categories.of([e.cat for e in complete]),
            pid=self.pids.of([e.pid for e in complete]),
            tid=self.tids.of([e.tid for e in complete]),
            correlation=_ids([a.correlation for a in present], with_args, n),
            external=_ids([a.external_id for a in present], with_args, n),
            collectives=self._coded(*_collectives(present, with_args, n)),
        )

    def _add_scanned(self, scanned: fastjson.Scanned) -> None:
        """The scanner's columns; the few records it spans (metadata, and
        complete events with an id written as a string) decoded by msgspec."""
        decode = EVENT_DECODER.decode
        data = memoryview(scanned.data)
        spanned = [decode(data[begin:end]) for begin, end in scanned.spans.tolist()]
        self._metadata(spanned)
        decoded = [(row, e) for row, e in zip(scanned.span_rows.tolist(), spanned) if row >= 0]
        c = scanned.columns
        pid = self.pids.of_ids(c["pid"], c["pid_kind"], *_texts(decoded, lambda e: e.pid))
        tid = self.tids.of_ids(c["tid"], c["tid_kind"], *_texts(decoded, lambda e: e.tid))
        for key, field in (("correlation", "correlation"), ("external", "external_id")):
            at, texts = _texts(decoded, lambda e, f=field: getattr(e.args, f, None))
            c[key][at] = [_text_id(t) for t in texts]
        strings = scanned.strings
        timed = self._timed(c["ts"], c["dur"])
        keep = slice(None)
        if not timed.all():
            keep = np.flatnonzero(timed)
            strings = {key: ak.take(array, from_numpy(keep)) for key, array in strings.items()}
        self._append(
            c["ts"][keep],
            c["dur"][keep],
            region=self.regions.of_strings(strings["names"], scanned.escaped),
            category=self.categories.of_strings(strings["cats"], scanned.escaped),
            pid=pid[keep],
            tid=tid[keep],
            correlation=c["correlation"][keep],
            external=c["external"][keep],
            collectives=self._coded_distinct(
                *_scanned_collectives(
                    strings["collectives"],
                    strings["dtypes"],
                    np.where(np.isnan(c["nelems"]), c["msg_size"], c["nelems"])[keep],
                    scanned.escaped,
                )
            ),
        )

    def _timed(self, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
        """Which events have a time: a ``ts`` and ``dur`` (nanoseconds) that
        were numbers of microseconds nanoseconds can hold, and no negative
        duration (an interval that ends before it begins); the others are
        counted."""
        timed = (ts != NO_TIME) & (dur != NO_TIME)
        backwards = timed & (dur < 0)
        self.untimed += int((~timed).sum())
        self.backwards += int(backwards.sum())
        return timed & ~backwards

    def flows_of_unlinked(self, data: bytes) -> None:
        """Where GPU work carries no correlation id, the launch's flow events
        link it: Kineto draws an ``ac2g`` flow from the runtime call (its
        start, ``ph: s``) to the GPU activity (its start, ``ph: f``), the
        flow's id the correlation id. Only then are those records looked
        for in the text (most traces give every activity its id)."""
        gpu = [c for c, name in enumerate(self.categories.names()) if name in GPU_CATEGORIES]
        if not any(
            (np.isin(p["category"], gpu) & (p["correlation"] == NULL)).any() for p in self.parts
        ):
            return
        pids, tids = self.pids.index, self.tids.index
        for found in FLOW_RECORD.finditer(data):
            record = _record_at(data, found.start())
            if not isinstance(record, dict) or record.get("cat") != "ac2g":
                continue
            pid, tid = pids.get(record.get("pid")), tids.get(record.get("tid"))
            start, flow = ns_of_number(record.get("ts")), record.get("id")
            if pid is None or tid is None or start == NO_TIME:
                continue
            if isinstance(flow, int) and INT64_MIN < flow <= INT64_MAX:
                self.flows[((pid << 32) | tid, start)] = flow

    def _flow_ids(self, joined: dict) -> None:
        """In place: the flow ids flows_of_unlinked found, as the correlation
        of the rows that had none."""
        if not self.flows:
            return
        correlation, where, start = joined["correlation"], joined["where"], joined["start"]
        for row in np.flatnonzero(correlation == NULL).tolist():
            flow = self.flows.get((int(where[row]), int(start[row])))
            if flow is not None:
                correlation[row] = flow
        self.flows = {}

    def sizes_from_shapes(self, data: bytes, rules) -> None:
        """PyTorch before 2.1 names no collective's size: where no record
        gives one (``In msg nelems``), the backend record of each collective
        (``nccl:all_reduce`` ...) gives it as its input's shape and dtype
        (``Input Dims``: [[19618307]], ``Input type``: ["float"]); so does a
        collective outside c10d (``symm_mem::one_shot_all_reduce``, a custom
        all-reduce op) that no record sizes. Only those records are looked
        for in the text and decoded, a few per step."""
        sized = set()
        for p in self.parts:
            sized.update(p["region"][p["bytes"] != NULL].tolist())
        unsized = not sized  # else a backend record is in a sized c10d call
        names = self.regions.names()
        # every new name through the rules at once (then cached); only a
        # collective or a backend record (a ':' after its 3 or 4 letters)
        # can take its size from its shape
        first = rules.first_rules(names, KinetoReader.name)
        named = np.array([r.collective is not None for r in rules.rules] + [False])[first]
        # a ':' after 3 or 4 letters (a backend's name is ASCII letters)
        colon = [isinstance(name, str) and ":" in name[3:5] for name in names]
        maybe = np.flatnonzero(named | np.array(colon, dtype=bool))
        backends = [
            (code, names[code])
            for code in maybe.tolist()
            if code not in sized and _shape_sized(names[code], rules, unsized)
        ]
        pids, tids = self.pids.index, self.tids.index
        for code, name in backends:
            needle = json.dumps(name).encode()
            at = data.find(needle)
            if not _shaped(data, needle, at):
                continue
            while at >= 0:
                record = _record_at(data, at)
                at = data.find(needle, at + len(needle))
                if not isinstance(record, dict) or record.get("name") != name:
                    continue
                nbytes = _shape_bytes(record.get("args"))
                pid, tid = pids.get(record.get("pid")), tids.get(record.get("tid"))
                start = ns_of_number(record.get("ts"))
                if nbytes is None or pid is None or tid is None or start == NO_TIME:
                    continue
                self.shaped[(code, start, (pid << 32) | tid)] = nbytes

    def _shaped_bytes(self, joined: dict) -> None:
        """In place: the bytes sizes_from_shapes found, on their rows."""
        if not self.shaped:
            return
        codes = np.unique([key[0] for key in self.shaped])
        rows = np.flatnonzero(np.isin(joined["region"], codes) & (joined["bytes"] == NULL))
        region, start, where = joined["region"], joined["start"], joined["where"]
        for row in rows.tolist():
            found = self.shaped.get((int(region[row]), int(start[row]), int(where[row])))
            if found is not None:
                joined["bytes"][row] = found
        self.shaped = {}

    def _metadata(self, batch: list) -> None:
        """Process and thread names from the metadata records of ``batch``."""
        for e in [e for e in batch if e.ph == "M" and e.args is not None]:
            if e.name == "process_name":
                self.process[e.pid] = e.args.name
            elif e.name == "thread_name":
                self.thread[(e.pid, e.tid)] = e.args.name

    def _coded(self, rows: np.ndarray, names: list, nbytes: np.ndarray):
        """(rows, their collectives' codes, bytes) of what _collectives gives."""
        return rows, self.collectives.of(names), nbytes

    def _coded_distinct(self, rows: np.ndarray, local: np.ndarray, names: list, nbytes):
        """(rows, their collectives' codes, bytes) of what _scanned_collectives
        gives: each distinct name coded once, not a name per row; the names
        the rows use, in the order they first come (their ``local`` codes
        are in that order), as coding a name per row would give them."""
        used = np.bincount(local, minlength=len(names)) > 0
        place = np.cumsum(used) - 1
        distinct = [name for name, u in zip(names, used.tolist()) if u]
        return rows, self.collectives._known(place[local], distinct), nbytes

    def _append(self, ts, dur, *, region, category, pid, tid, correlation, external, collectives):
        """One batch's columns; ``ts``, ``dur``: nanoseconds; the others
        codes; ``collectives``: (rows, their collectives' codes, the bytes
        of every row)."""
        rows, codes, nbytes = collectives
        collective = np.full(len(ts), -1, dtype=np.int32)
        collective[rows] = codes
        self.parts.append(
            {
                "start": ts,
                "end": ts + dur,
                "region": region,
                "category": category,
                "where": (pid.astype(np.int64) << 32) | tid,
                "correlation": correlation,
                "external": external,
                "collective": collective,
                "bytes": nbytes,
            }
        )

    def columns(self, rank: int) -> Columns:
        joined = {
            key: np.concatenate([p[key] for p in self.parts])
            if self.parts
            else np.zeros(0, dtype=np.int64)
            for key in (
                "start",
                "end",
                "region",
                "category",
                "where",
                "correlation",
                "external",
                "bytes",
                "collective",
            )
        }
        self.parts = []
        self._shaped_bytes(joined)
        self._flow_ids(joined)
        n = len(joined["start"])
        where, keys = factorize(joined["where"])
        parent = nesting.enclosing(where, joined["start"], joined["end"])
        _link(
            parent,
            self.categories.names(),
            joined["category"],
            joined["correlation"],
            joined["external"],
        )
        pids, tids = self.pids.names(), self.tids.names()
        location_names = [self._name(pids[key >> 32], tids[key & 0xFFFFFFFF]) for key in keys]
        return Columns(
            rank=np.full(n, rank, dtype=np.int64),
            node=np.zeros(n, dtype=np.int32),
            node_names=[""],
            location=where.astype(np.int32),
            location_names=location_names,
            region=joined["region"].astype(np.int32),
            region_names=self.regions.names(),
            start_ns=joined["start"],
            end_ns=joined["end"],
            depth=nesting.depths(parent),
            parent_row=parent,
            step=np.full(n, NULL, dtype=np.int64),
            epoch=np.full(n, NULL, dtype=np.int64),
            collective=joined["collective"],
            collective_names=self.collectives.names(),
            bytes=joined["bytes"],
        )

    def _name(self, pid, tid) -> str:
        thread = self.thread.get((pid, tid))
        if thread is None:
            return f"{pid}/{tid}"
        return f"{self.process.get(pid, pid)}/{thread}"


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values) of an integer column, the values in the
    order they first come (``pandas.factorize``'s answer, by Arrow's hash:
    importing pandas cost a Kineto import a tenth of its CPU)."""
    encoded = ak.dictionary_encode(from_numpy(np.ascontiguousarray(values)))
    return (
        to_numpy(encoded.indices).astype(np.int64),
        to_numpy(encoded.dictionary),
    )


def ns_of_number(value) -> int:
    """Integer nanoseconds of a number of microseconds, exact from its
    decimal digits (a Decimal, as exact_ns and _record_at give it; an int),
    rounded half to even below the nanosecond; NO_TIME where it is none, not
    a number, or beyond what an int64 of nanoseconds holds. Never through a
    double: at today's epoch times (1.7e15 us) one holds only 0.25 us steps,
    so that a record ending with its parent seemed to outlive it."""
    if isinstance(value, float):  # a float is its own exact decimal
        value = Decimal(value) if math.isfinite(value) else None
    elif isinstance(value, int) and not isinstance(value, bool):
        value = Decimal(value)
    if not isinstance(value, Decimal) or not value.is_finite() or abs(value) >= MAX_MICROSECONDS:
        return NO_TIME
    return int((value * 1000).to_integral_value(ROUND_HALF_EVEN))


def _texts(decoded: list, field) -> tuple[np.ndarray, list]:
    """(rows, values) of the decoded records whose ``field`` is a string."""
    found = [(row, v) for row, e in decoded if isinstance(v := field(e), str)]
    return np.array([r for r, _ in found], dtype=np.int64), [v for _, v in found]


def _text_id(value: str) -> int:
    """An id written as a string, as an int64 (it only needs to match)."""
    return hash(value) & 0x3FFFFFFFFFFFFFFF


def _ids(values: list, rows: np.ndarray, n: int) -> np.ndarray:
    """Correlation or External ids (``values`` of the ``rows`` that have
    arguments) as int64 of all ``n`` rows, NULL where absent; ids written as
    strings are coded by the string (they only need to match)."""
    out = np.full(n, NULL, dtype=np.int64)
    kinds = set(map(type, values))
    if str not in kinds:  # ints and None: numpy converts them
        ids = np.array(values, dtype=object)
        has = ids != None if type(None) in kinds else slice(None)  # noqa: E711 (elementwise)
        try:
            out[rows[has]] = ids[has].astype(np.int64)
            return out
        except OverflowError:  # an id beyond int64: coded by its text, as below
            pass
    fits = [v.__class__ is int and INT64_MIN < v <= INT64_MAX for v in values]
    out[rows] = [v if ok else NULL for v, ok in zip(values, fits)]
    text = [i for i, v in enumerate(values) if v is not None and not fits[i]]
    out[rows[text]] = [_text_id(str(values[i])) for i in text]
    return out


def _link(
    parent: np.ndarray,
    categories: list,
    category: np.ndarray,
    correlation: np.ndarray,
    external: np.ndarray,
) -> None:
    """In place: a GPU activity runs in the runtime call with its
    correlation id, a GPU annotation in the CPU record with its External id.
    ``category``: codes of ``categories``.

    What launched it wins over the GPU-side annotation it runs under: that
    annotation only spans the first to the last kernel of its CPU range, so
    the ranges that enclose whole steps (the epoch, ``ProfilerStep``) also
    enclose what autograd's thread launched outside them (backward's kernels,
    the all-reduce's copies), and gave those neither phase nor step."""

    def of(names) -> np.ndarray:
        return np.array([c in names for c in categories], dtype=bool)[category]

    gpu = of(GPU_CATEGORIES)
    runtime = of(RUNTIME_CATEGORIES)
    annotation = of({GPU_ANNOTATION})
    on_cpu = ~(gpu | annotation | runtime)
    for children, launchers, key in ((gpu, runtime, correlation), (annotation, on_cpu, external)):
        has = key != NULL
        rows = np.flatnonzero(children & has)
        launch = np.flatnonzero(launchers & has)
        if rows.size == 0 or launch.size == 0:
            continue
        launch = launch[np.unique(key[launch], return_index=True)[1]]  # first per id
        keys = key[launch]
        at = np.clip(np.searchsorted(keys, key[rows]), 0, keys.size - 1)
        found = keys[at] == key[rows]
        parent[rows[found]] = launch[at[found]]


def _collectives(args: list, rows: np.ndarray, n: int) -> tuple[np.ndarray, list, np.ndarray]:
    """(the rows whose arguments name a collective, its name for each, the
    bytes of all ``n`` rows: NULL when unknown); ``args``: those of the
    ``rows`` that have arguments."""
    nbytes = np.full(n, NULL, dtype=np.int64)
    found, names = [], []
    for i, a in [(i, a) for i, a in zip(rows.tolist(), args) if a.collective is not None]:
        name = str(a.collective).lower()
        name = COLLECTIVE_NAMES.get(name, name)
        if name is None:
            continue
        found.append(i)
        names.append(name)
        size = dtype_bytes(str(a.dtype or ""))
        elements = element_count(a.nelems if a.nelems is not None else a.size)
        if size and elements is not None:
            nbytes[i] = elements * size
    return np.array(found, dtype=np.int64), names, nbytes


MAX_ELEMENTS = 2**53  # more is no real message: a damaged or nonsense count


def element_count(value) -> int | None:
    """An element count as written (a number or its text); None where it is
    not one: not a number, not finite, negative, or too large."""
    try:
        count = float(value)
    except (TypeError, ValueError):
        return None
    return int(count) if 0 <= count < MAX_ELEMENTS else None


def _scanned_collectives(names: pa.StringArray, dtypes: pa.StringArray, elements, escaped: bool):
    """What _collectives gives, from the scanner's columns: the rows whose
    ``Collective name`` names a collective (null: none), their names (as
    codes of a list of names: names[local] is each row's), the bytes of
    every row (``elements`` NaN: unknown); the same rules, applied to each
    distinct name and dtype instead of each event."""
    nbytes = np.full(len(names), NULL, dtype=np.int64)
    rows = np.flatnonzero(to_numpy(ak.is_valid(names)))
    if rows.size == 0:
        return rows, np.zeros(0, dtype=np.int64), [], nbytes
    encoded = ak.dictionary_encode(ak.take(names, from_numpy(rows)))
    named = [COLLECTIVE_NAMES.get(n, n) for n in _lower(encoded.dictionary.to_pylist(), escaped)]
    is_collective = np.array([n is not None for n in named], dtype=bool)
    local = to_numpy(encoded.indices)
    rows, local = rows[is_collective[local]], local[is_collective[local]]
    encoded = ak.dictionary_encode(ak.take(dtypes, from_numpy(rows)), null_encoding="encode")
    sizes = [
        dtype_bytes(d) or 0
        for d in _lower([d or "" for d in encoded.dictionary.to_pylist()], escaped)
    ]
    size = np.array(sizes, dtype=np.int64)[to_numpy(encoded.indices)]
    count = elements[rows]
    known = (size > 0) & (count >= 0) & (count < MAX_ELEMENTS)  # NaN: unknown
    nbytes[rows[known]] = np.trunc(count[known]).astype(np.int64) * size[known]
    return rows, local, named, nbytes


def _lower(texts: list, escaped: bool) -> list:
    """Lower case, JSON escapes undone where the scanner left them."""
    if escaped:
        texts = [json.loads(f'"{t}"') if "\\" in t else t for t in texts]
    return [t.lower() for t in texts]


COPIES = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::pin_memory")


def place_by_position(c: Columns, phase: np.ndarray, is_step: np.ndarray) -> None:
    """The training loop's own calls in a step that no annotation names, by
    their place: inside a ProfilerStep, on its thread, the top-level calls
    after the data loading and before the optimizer step are the forward
    (the model's ops, its loss), copies right after the data loading the
    host-to-device transfer. Backward runs on autograd's thread and zero_grad
    and the optimizer have their own records. A trace without ProfilerStep
    (torch.autograd.profiler, a profiler without schedule) has its steps
    from one data load, else one optimizer step, to the next."""
    rows, step = _loop_calls(c, phase, is_step)
    if rows.size == 0:
        return
    group = np.unique(step, return_inverse=True)[1]
    start, mine = c.start_ns[rows], phase[rows]
    # times compared as doubles, as they were when this was pandas'
    at = start.astype(np.float64)
    earliest = np.full(group.max() + 1, INT64_MAX, dtype=np.int64)
    np.minimum.at(earliest, group, start)
    loaded = _per_step(np.maximum, group, at, mine == PHASE_CODE["data_load"])
    after = np.where(np.isnan(loaded), (earliest - 1).astype(np.float64), loaded)
    before = _per_step(np.minimum, group, at, mine == PHASE_CODE["optimizer"])
    free = (mine < 0) & (at > after[group]) & (at < np.nan_to_num(before, nan=np.inf)[group])
    codes, of_row = np.unique(c.region[rows], return_inverse=True)
    copy = np.array([c.region_names[code] in COPIES for code in codes.tolist()], bool)[of_row]
    first_other = np.nan_to_num(_per_step(np.minimum, group, at, free & ~copy), nan=np.inf)
    h2d = free & copy & (at < first_other[group])
    phase[rows[free & ~h2d]] = PHASE_CODE["forward"]
    phase[rows[h2d]] = PHASE_CODE["h2d"]


def _per_step(reduce, group: np.ndarray, values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``reduce`` (np.maximum or np.minimum) of the ``values`` ``where``
    true, per group; NaN for a group with none."""
    out = np.full(group.max() + 1, np.nan)
    has = np.zeros(out.size, dtype=bool)
    has[group[where]] = True
    out[has] = -np.inf if reduce is np.maximum else np.inf
    reduce.at(out, group[where], values[where])
    return out


def _loop_calls(c: Columns, phase: np.ndarray, is_step: np.ndarray):
    """(rows, the step of each): the calls right inside each ProfilerStep,
    on its thread; without any ProfilerStep, the top-level calls of the
    thread that loads the data (else the one that steps the optimizer),
    numbered by the data loads (optimizer steps) before them."""
    if is_step.any():
        parent = np.maximum(c.parent_row, 0)
        rows = np.flatnonzero(
            (c.parent_row >= 0) & is_step[parent] & (c.location == c.location[parent])
        )
        return rows, c.parent_row[rows]
    top = c.parent_row < 0
    for anchor in ("data_load", "optimizer"):
        marks = np.flatnonzero(top & (phase == PHASE_CODE[anchor]))
        if marks.size:
            break
    else:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    loop = c.location[marks[np.argmin(c.start_ns[marks])]]
    marks = marks[c.location[marks] == loop]
    rows = np.flatnonzero(top & (c.location == loop))
    if anchor == "data_load":  # a step from its data load (before the first: none)
        step = np.searchsorted(np.sort(c.start_ns[marks]), c.start_ns[rows], side="right") - 1
    else:  # a step up to the end of its optimizer step
        step = np.searchsorted(np.sort(c.end_ns[marks]), c.start_ns[rows], side="left")
    return rows[step >= 0], step[step >= 0]


def join_collectives(c: Columns, collective: np.ndarray, rows: np.ndarray, top: np.ndarray):
    """``top`` (each collective row's instance) with the records of one
    collective that do not nest joined: a backend record (``hccl:allgather``)
    that starts inside the c10d call before it on its thread and outlives
    it, and one that runs on the backend's own thread (Gloo's), paired with
    the c10d calls of its collective in the order they were made."""
    top = _overlapping(c, collective, rows, top)
    instances = rows[top == rows]
    # the names of the instances only: a trace has many more
    backend = np.zeros(len(c.region_names), dtype=bool)
    call = np.zeros(len(c.region_names), dtype=bool)
    for code in np.unique(c.region[instances]).tolist():
        name = str(c.region_names[code])
        backend[code] = bool(BACKEND_RECORD.match(name))
        call[code] = name.startswith("c10d::")
    head = {}
    for op in np.unique(collective[instances]):
        mine = instances[collective[instances] == op]
        calls = mine[call[c.region[mine]]]
        records = mine[backend[c.region[mine]]]
        records = records[~np.isin(c.location[records], c.location[calls])]
        head.update(_in_order(c, calls, records))
    if not head:
        return top
    moved = np.fromiter(head.keys(), np.int64, len(head))
    heads = np.fromiter(head.values(), np.int64, len(head))
    order = np.argsort(moved)
    moved, heads = moved[order], heads[order]
    at = np.minimum(np.searchsorted(moved, top), moved.size - 1)
    return np.where(moved[at] == top, heads[at], top)


def _in_order(c: Columns, calls: np.ndarray, records: np.ndarray) -> dict:
    """{record row: call row}: each record on another thread goes to the
    oldest call not yet taken that started before it (the backend runs a
    process group's collectives in the order they were called)."""
    calls = calls[np.argsort(c.start_ns[calls], kind="stable")]
    records = records[np.argsort(c.start_ns[records], kind="stable")]
    paired, next_call = {}, 0
    for record in records.tolist():
        if next_call < calls.size and c.start_ns[calls[next_call]] <= c.start_ns[record]:
            paired[record] = int(calls[next_call])
            next_call += 1
    return paired


def _overlapping(c: Columns, collective: np.ndarray, rows: np.ndarray, top: np.ndarray):
    """``top`` with every collective instance that starts inside the one
    before it on its location, of the same collective, moved under that one:
    a backend record (``hccl:allgather`` ...) can outlive the c10d call that
    issued it by a few microseconds, so that it does not nest in it, yet it
    is the same collective, to be counted once."""
    instances = rows[top == rows]  # sorted, as rows are
    if instances.size < 2:
        return top
    order = instances[np.lexsort((c.start_ns[instances], c.location[instances]))]
    location, start, end = c.location[order], c.start_ns[order], c.end_ns[order]
    same = (
        (location[1:] == location[:-1])
        & (collective[order][1:] == collective[order][:-1])
        & (start[1:] < end[:-1])
    )
    if not same.any():
        return top
    first = np.r_[True, ~same]
    head = order[first][np.cumsum(first) - 1]  # each instance's first of its run
    head_of = np.empty(instances.size, dtype=np.int64)
    head_of[np.searchsorted(instances, order)] = head
    return head_of[np.searchsorted(instances, top)]
