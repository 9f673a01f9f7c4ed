"""Trace readers, one class per format and one file per class, each
producing the same phase table (traces/table.py), as Pipit's readers do.

A reader is a subclass of :class:`Reader` decorated with :func:`register`
in any module of this package: every module here is imported on first use,
so a new format is one new file. It says

- ``name``: the value of the table's ``source`` column and of ``sources`` in
  traces/rules.yaml;
- ``patterns``: the files it may read inside a folder, as globs relative to
  that folder (a run folder's layout, or a folder of traces from elsewhere);
- ``recognises(path, head)``: whether one file is its format (``head``: the
  first bytes, gzip already undone);
- ``read(path, rules, run_id)``: ``(table, problems)``; and, for a format
  whose traces can outgrow memory, ``parts(...)``: the same, a part at a time.

Anything a reader cannot make sense of raises :class:`TraceError` with the
file's name, never a traceback. What it read but had to leave out is a
:class:`Problem`; ``lost`` marks records that were in the file and are not in
the table (the converter then exits non-zero).
"""

from __future__ import annotations

import gzip
import json
import importlib
import os
import re
import threading
import zlib
from pathlib import Path
from typing import Literal, overload

from runfiles.backends import Registry
from traces.formats import TRACE_FIRST_KEYS
from traces.rules import PhaseRules
from traces.table import META_UNRECOGNISED, META_UNSIZED


class TraceError(Exception):
    """A trace that cannot be read: the message names the file and why."""


class Problem(str):
    """One line about what a reader left out or could not place; ``lost``:
    records of the file are missing from the table."""

    lost: bool

    def __new__(cls, text: str, lost: bool = True):
        problem = super().__new__(cls, text)
        problem.lost = lost
        return problem


def counted(path: Path, *counts: tuple) -> list[Problem]:
    """One Problem per (count, what, lost) whose count is not 0:
    "<path>: <count> <what>"."""
    return [Problem(f"{path}: {count} {what}", lost) for count, what, lost in counts if count]


class Reader:
    """One trace format; subclasses set the attributes and both methods."""

    name: str = ""
    patterns: tuple[str, ...] = ()
    # modules its reading imports on the way: imported ahead by the thread
    # that waits while the first files are read in others (import_ahead)
    imports: tuple[str, ...] = ()

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        raise NotImplementedError

    def read(self, path: Path, rules, run_id: str = ""):
        raise NotImplementedError

    def parts(self, path: Path, rules, run_id: str = ""):
        """(table, problems) of one part of the trace at a time; one part,
        the whole trace, unless a format reads large traces in pieces."""
        yield self.read(path, rules, run_id)


REGISTRY: Registry[type[Reader]] = Registry(__name__, "trace reader")
register = REGISTRY.register  # class decorator: a reader known by its name


def readers() -> Registry[type[Reader]]:
    """Every registered reader, by name."""
    return REGISTRY


def names() -> tuple[str, ...]:
    return tuple(readers())


def detect(path: Path) -> str:
    """The name of the reader for one trace file."""
    path = Path(path)
    head = _head(path) if path.is_file() else b""
    for name, reader in readers().items():
        if reader.recognises(path, head):
            return name
    raise TraceError(
        f"{path}: not a trace this converter knows (readers: "
        f"{', '.join(names())}; e.g. an OTF2 anchor file *.otf2, a Horovod "
        "Timeline JSON array or a PyTorch profiler JSON object)"
    )


def traces_in(folder: Path, skipped: list | None = None) -> list[Path]:
    """The files in a folder that some reader recognises, by the readers'
    patterns (each file once, in pattern order); ``skipped``: filled with
    those a pattern names but no reader recognises."""
    found: dict[Path, None] = {}
    for reader in readers().values():
        for pattern in reader.patterns:
            for path in sorted(folder.glob(pattern)):
                if path.is_file():
                    found.setdefault(path)
    known = [path for path in found if _known(path)]
    if skipped is not None:
        skipped += [path for path in found if path not in known]
    return known


def _known(path: Path) -> bool:
    try:
        detect(path)
    except TraceError:
        return False
    return True


def checked(rules: PhaseRules) -> PhaseRules:
    """The rules, once their ``sources`` are known to name readers here
    (RulesError if not)."""
    rules.check_sources(names())
    return rules


def read(path: Path, rules, run_id: str = "", source: str | None = None):
    """(table, problems) of one trace file."""
    checked(rules)
    reader = readers()[source or detect(path)]
    table, problems = reader().read(Path(path), rules, run_id)
    return table, problems + _noted(path, table)


def import_ahead(source: str) -> None:
    """Imports what the reader of that name imports on its way (its
    ``imports``): in a thread that would only wait, while the first files are
    read in others, so that none of them holds the interpreter's lock for
    it (pyarrow.compute: some 30 ms of it)."""
    for module in readers()[source].imports:
        importlib.import_module(module)


def in_one_part(source: str) -> bool:
    """Whether the reader of that name reads a file in one part (it keeps
    Reader's own ``parts``): a whole file's table then may be read ahead,
    beside others, without holding more than one part of any."""
    return readers()[source].parts is Reader.parts


def parts(path: Path, rules, run_id: str = "", source: str | None = None):
    """(table, problems) of one trace file, part by part."""
    checked(rules)
    reader = readers()[source or detect(path)]
    for table, problems in reader().parts(Path(path), rules, run_id):
        yield table, problems + _noted(path, table)
        del table  # before the next part is read: its memory is then reused


def _noted(path: Path, table) -> list[Problem]:
    """What the phase table noted of the trace: collectives without a byte
    count, and regions that look like communication but that no rule names
    a collective (they count as the phase they run in, compute most
    likely)."""
    meta, problems = table.schema.metadata or {}, []
    if unsized := json.loads(meta.get(META_UNSIZED, b"{}")):
        each = ", ".join(f"{count:,} {name}" for name, count in sorted(unsized.items()))
        problems.append(
            Problem(
                f"{path}: {sum(unsized.values()):,} collective(s) without a byte count in the "
                f"trace ({each}; the start-up broadcast of the parameters often has none): "
                "their bytes are unknown, not 0",
                lost=False,
            )
        )
    if regions := json.loads(meta.get(META_UNRECOGNISED, b"[]")):
        named = ", ".join(f"{name!r} ({rows:,})" for name, rows in regions[:5])
        more = f" and {len(regions) - 5} more" if len(regions) > 5 else ""
        problems.append(
            Problem(
                f"{path}: {sum(rows for _, rows in regions):,} intervals of {len(regions)} "
                f"region(s) look like communication but are no collective the rules know: "
                f"{named}{more}; they count as the phase they run in (add a rule with "
                "'collective:' to traces/rules.yaml if they are)",
                lost=False,
            )
        )
    return problems


HEAD_BYTES = 4096
# Bytes of a JSON document read to find where its events array opens. A
# trace has a few KiB of keys before it (Kineto's schemaVersion,
# deviceProperties, distributedInfo ...); a document that holds none in its
# first 64 MiB is no trace, refused in a quarter of a second here (with the
# whole first GiB read: 7.6 s and 3.2 GB for a 1 GiB one opening with
# "metadata", 2026-11-29).
WALK_LIMIT = 64 << 20


def _head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of a file (gzip undone), or, for a JSON
    object, its structure: the top-level keys up to ``traceEvents`` and the
    first ``size`` bytes of that array, however large the values before it
    (a profiler trace may open with megabytes of metadata)."""
    try:
        with open(path, "rb") as raw:
            f = gzip.GzipFile(fileobj=raw) if raw.read(2) == b"\x1f\x8b" else raw
            raw.seek(0)
            data = _upto(f, size)
            return _walked(f, data, size) if data.lstrip()[:1] == b"{" else data
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None


def _upto(f, size: int, reads: int = 512) -> bytes:
    """Up to ``size`` bytes of ``f``, in reads of ``reads`` bytes: fewer at
    its end, or where a gzip stream is cut or corrupt (what the reads before
    it gave)."""
    pieces, got = [], 0
    while got < size:
        try:
            piece = f.read(min(reads, size - got))
        except (EOFError, zlib.error, gzip.BadGzipFile):
            break
        if not piece:
            break
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces)


_EVENTS = b'"traceEvents"'
_STRUCTURE = re.compile(rb'[{}\[\]:,"]')
_STRING_REST = re.compile(rb'(?:[^"\\]|\\.)*"', re.DOTALL)


def _walked(f, data: bytes, size: int) -> bytes:
    """``{"<key>": 0, ..., "traceEvents": [<first bytes of the array>``, from
    a JSON object's top-level keys, read on from ``f`` (``data``: what was
    read of it) until the events array opens; without one (in the first
    WALK_LIMIT bytes), the keys alone (see _top_level)."""
    keys, buffer, at, _ = _top_level(f, data)
    if at < 0:
        return b"{" + b"".join(k + b": 0, " for k in keys)
    rest = buffer[at : at + size]
    if len(rest) < size:
        rest += _upto(f, size - len(rest))
    return b"{" + b"".join(k + b": 0, " for k in keys[:-1]) + _EVENTS + b": [" + rest


def events_opened_at(data) -> int:
    """Where the top-level events array of the JSON object in ``data``
    opens (the index after its ``[``), -1 where it has none: a
    "traceEvents" inside another value (or a string) is not it."""
    _, _, at, base = _top_level(None, data)
    return at if at < 0 else base + at


def _top_level(f, data) -> tuple[list[bytes], bytes, int, int]:
    """(top-level keys, buffer, where in it the events array opens or -1,
    buffer's offset in the document) of a JSON object, walked from
    ``data`` (what was read of it) and ``f`` (None: data is all of it)
    until "traceEvents" opens an array, for at most WALK_LIMIT bytes: a
    key's name inside a value counts for nothing. A document whose first
    key is none of TRACE_FIRST_KEYS is not walked past it. A value is
    skipped whole by the JSON scanner where it is built (token by token
    here, a 1 GiB document opening with "metadata" took 6 minutes)."""
    keys: list[bytes] = []
    # WALK_LIMIT bounds what is read from f: a document in memory is walked
    # whatever its size (a trace over 1 GiB was otherwise decoded whole)
    depth, at, last, key, base = 0, 0, None, None, 0
    read = len(data) if f is not None else 0
    buffer = data
    while read <= WALK_LIMIT:
        found = _STRUCTURE.search(buffer, at)
        if found is None or (found.group() == b'"' and not _STRING_REST.match(buffer, found.end())):
            more = _upto(f, 1 << 20) if f is not None else b""
            if not more:
                break
            kept = found.start() if found else len(buffer)
            buffer, at, read, base = buffer[kept:] + more, 0, read + len(more), base + kept
            continue
        token, at = found.group(), found.end()
        if token == b'"':
            string = _STRING_REST.match(buffer, at)
            assert string is not None  # the read above ends only past a whole string
            end = string.end()
            if depth == 1 and last in (b"{", b","):
                key = bytes(buffer[at - 1 : end])
            at, token = end, b'"'
        elif token in b"{[":
            if depth == 1 and last == b":" and key == _EVENTS and token == b"[":
                return keys, buffer, at, base
            if depth == 1 and (past := _past_value(f, buffer, at - 1, read)) is not None:
                buffer, dropped, end, read = past
                base += dropped
                if end >= 0:
                    at, token = end, b"}"
                else:  # not JSON as the scanner takes it, or cut: token by token
                    at, depth = at - dropped, depth + 1
            else:
                depth += 1
        elif token in b"}]":
            depth -= 1
            if depth <= 0:
                break
        elif token == b":" and depth == 1 and key is not None:
            if not keys and key not in TRACE_FIRST_KEYS:
                break
            keys.append(key)
        last = token
    return keys, buffer, -1, base


def _past_value(f, buffer, at: int, read: int):
    """(buffer, bytes of the old one dropped from its start, index past the
    value or -1, bytes read) for the value opening at ``buffer[at]``,
    skipped in C: where it runs on past the buffer, ``f`` (None: no more)
    is read on into a new one that begins with the value (each read seven
    times what is held, no further than WALK_LIMIT: the value is scanned again from
    its start after each, about 1.2 times in all). -1: no whole value as
    the scanner takes JSON (malformed, or cut); None: no scanner here."""
    from traces import fastjson  # the reader's own, built and imported to read the trace

    end = fastjson.value_end(buffer, at)
    if end is None or end >= 0 or f is None:
        return None if end is None else (buffer, 0, end, read)
    held = bytearray(buffer[at:])
    while (end := fastjson.value_end(held, 0)) == -1:
        more = _upto(f, min(max(7 * len(held), 1 << 20), WALK_LIMIT + 1 - read), 1 << 24)
        if not more:
            break
        held += more
        read += len(more)
    return held, at, end, read


# A gzip stream may inflate to this many times its size, at most: JSON traces
# compress 10 to 30 times; a gzip bomb a thousand times.
MAX_INFLATION = 200
INFLATE_FLOOR = 64 << 20  # bytes any compressed trace may inflate to


@overload
def read_bytes(path: Path, kept: Literal[False] = False) -> tuple[bytes, Problem | None]: ...


@overload
def read_bytes(path: Path, kept: Literal[True]) -> tuple[bytes | bytearray, Problem | None]: ...


def read_bytes(path: Path, kept: bool = False) -> tuple[bytes | bytearray, Problem | None]:
    """A file's bytes, gzip undone: (data, problem) where the problem says the
    compressed stream was cut or corrupt (the data then is what came before).
    The stream is inflated a piece at a time, and no further than
    MAX_INFLATION times the file (nor than the memory there is): a gzip bomb
    is refused, not inflated into memory. ``kept``: read into this thread's
    buffer, kept from file to file (see _read_kept); the caller holds
    neither it nor a view of it once done with the file."""
    try:
        raw = _read_kept(path) if kept else path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    if raw[:2] != b"\x1f\x8b":
        return raw, None
    bound = min(max(INFLATE_FLOOR, MAX_INFLATION * len(raw)), _memory_for_data())
    parts: list[bytes] = []
    inflate, size, at = zlib.decompressobj(16 + zlib.MAX_WBITS), 0, 0
    while at < len(raw) or inflate.unconsumed_tail:
        piece = inflate.unconsumed_tail or raw[at : at + (1 << 16)]
        if not inflate.unconsumed_tail:
            at += len(piece)
        try:
            out = inflate.decompress(piece, 1 << 24)
        except zlib.error:
            return _cut(path, parts)
        size += len(out)
        if size > bound:
            raise TraceError(
                f"{path}: inflates to more than {bound:,} bytes from {len(raw):,} "
                f"({size // len(raw):,} times its size before it was stopped; JSON traces "
                f"compress at most some tens of times): a gzip bomb or not a trace; refused"
            )
        parts.append(out)
        if inflate.eof:
            if inflate.unused_data[:2] == b"\x1f\x8b":  # another member follows
                raw, at = inflate.unused_data, 0
                inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                continue
            return b"".join(parts), None
    return _cut(path, parts)


_kept = threading.local()


def _read_kept(path: Path) -> bytearray:
    """The file's bytes in this thread's buffer, resized to each file: a
    trace's files are read one after the other, and new memory for each is
    a new mapping whose every page the kernel faults in and zeroes before
    the read fills it (0.27 s of CPU for the 8 files of 59 MiB of
    bench/trace_read_json.py, 0.06 s into one kept buffer)."""
    buffer = getattr(_kept, "buffer", None)
    with path.open("rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            if buffer is None:
                raise BufferError
            if len(buffer) > size:
                del buffer[size:]  # a little less: bytearray keeps its memory
            else:
                buffer.extend(bytes(size - len(buffer)))
        except BufferError:  # none yet, or a view of the last file still held
            buffer = _kept.buffer = bytearray(size)
        done, view = 0, memoryview(buffer)
        while done < size and (got := f.readinto(view[done:])):
            done += got
        view.release()
        del buffer[done:]  # the file shrank meanwhile
        buffer += f.read()  # or grew
    return buffer


def let_go() -> None:
    """Frees this thread's kept buffer (see _read_kept): once its traces are
    read, it is not held beside what comes after."""
    _kept.__dict__.pop("buffer", None)


def _cut(path: Path, parts: list) -> tuple[bytes, Problem]:
    data = b"".join(parts)
    return data, Problem(
        f"{path}: the gzip stream is cut or corrupt after "
        f"{len(data):,} bytes (truncated?); what came before was read"
    )


def _memory_for_data() -> int:
    """Half the memory available now: what one trace's bytes may take (its
    reading takes about as much again)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62
