"""Chrome-trace JSON arrays (PyTorch profiler, Horovod Timeline) read a run of
records at a time, keeping every readable record of a damaged file.

Each run is scanned into columns in C where it can be (traces/fastjson),
else decoded with msgspec into typed records.

msgspec decodes straight into small typed structs and skips the fields a
reader does not ask for, so it parses and holds a trace several times faster
and smaller than ``json``/orjson dictionaries (which build every key and
every ``args`` entry of every event), and with no per-event Python.

When the whole document does not decode (a cut file, garbage in the middle,
a record of the wrong shape), the records are read one by one from the
positions where records start; each one that does not read is counted, and
the caller reports how many and where.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path

import msgspec

from traces.readers import Problem

_RECORD_START = re.compile(r"[\[,]\s*\{")

CHUNK_BYTES = 16 << 20  # of JSON decoded at a time: memory stays a few times this


def chunks(data: bytes, first: int, share: int = 1) -> tuple[list[tuple[int, int]], int]:
    """((begin, end) of runs of whole records of about CHUNK_BYTES / ``share``
    bytes from ``first``, the array's first record, cut where one record
    ends and the next begins in the layout the file is written in; where the
    last run begins). A cut that falls inside a nested value (the same bytes can
    appear there) is mended by batches()."""
    separator = _separator(data, first)
    size = max(1, CHUNK_BYTES // share)
    runs, begin = [], first
    while separator is not None and begin + size < len(data):
        at = data.find(separator, begin + size)
        if at < 0:
            break
        runs.append((begin, at + 1))
        begin = at + len(separator) - 1
    return runs, begin


def _separator(data: bytes, first: int) -> bytes | None:
    """What lies between two records: a newline and the first record's
    indentation (Kineto's two spaces, Horovod's none), or ", " / "," when
    the records share a line; None when there is no second record near."""
    line = data.rfind(b"\n", 0, first)
    indent = data[line + 1 : first]
    if line >= 0 and not indent.strip():
        newline = b"\r\n" if data[line - 1 : line] == b"\r" else b"\n"
        candidates = (b"}," + newline + indent + b"{",)
    else:
        candidates = (b"}, {", b"},{")
    near = first + (1 << 16)
    return next((sep for sep in candidates if data.find(sep, first, near) >= 0), None)


def batches(runs, scan, decoder, record_type, path: Path, problems: list):
    """A batch of records for each run (buffer, begin, end, bracketed): what
    ``scan`` gives (columns; None where it does not take the run), else the
    run decoded by ``decoder`` (msgspec, typed records). A run that ends
    inside a record (a cut inside a nested value, where the separator's
    bytes appear too) is joined to the runs after it until it ends between
    records; a damaged run is read record by record, the records that do
    not read counted in ``problems``."""
    runs = list(runs)
    reasons: Counter[str] = Counter()
    i, bad, first_bad = 0, 0, 0
    while i < len(runs):
        run = runs[i]
        batch, cut = _decoded(run, scan, decoder)
        while batch is None and cut and i + 1 < len(runs):
            joined = _joined(run, runs[i + 1])
            if joined is None:
                break
            run, i = joined, i + 1
            batch, cut = _decoded(run, scan, decoder)
        if batch is None:
            buffer, begin, end, bracketed = run
            piece = buffer if bracketed else b"[" + buffer[begin:end] + b"]"
            text = _text(bytes(piece), reasons)
            batch, lost, at = _salvaged(text, 0, record_type, reasons)
            if lost and not bad:  # bytes of the file before the bad record
                first_bad = len(text[:at].encode()) + (0 if bracketed else begin - 1)
            bad += lost
        yield batch
        i += 1
    problems += _lost(path, bad, first_bad, reasons)


_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")


def _decoded(run, scan, decoder):
    """(the run's batch or None, whether it failed only for ending inside a
    record: msgspec stopped at the very end, at the ``]`` added after it)."""
    buffer, begin, end, bracketed = run
    scanned = scan(buffer, begin, end, bracketed)
    if scanned is not None:
        return scanned, False
    piece = buffer if bracketed else b"[" + buffer[begin:end] + b"]"
    try:
        return decoder.decode(piece), False
    except (msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return None, False  # read record by record, where each is told
    except msgspec.DecodeError as error:
        at = _ERROR_BYTE.search(str(error))
        cut = "truncated" in str(error) or (at is not None and int(at.group(1)) >= len(piece) - 1)
        return None, cut and not bracketed


def _joined(run, after):
    """The two runs as one, where they are consecutive records of one buffer."""
    if run[0] is not after[0] or run[3] or after[3] or after[1] < run[2]:
        return None
    return run[0], run[1], after[2], False


def text_of(data: bytes, path: Path, problems: list) -> str:
    """The text of bytes that should be UTF-8; invalid bytes become U+FFFD,
    and a warning says how many."""
    reasons: Counter[str] = Counter()
    text = _text(data, reasons)
    problems += [Problem(f"{path}: {n:,} {reason}", lost=False) for reason, n in reasons.items()]
    return text


def _text(data: bytes, reasons: Counter) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        reasons[INVALID_UTF8] += text.count("\ufffd") - data.count("\ufffd".encode())
        return text


INVALID_UTF8 = "invalid UTF-8 sequence(s), read as U+FFFD (the names holding them changed)"


def salvage(text: str, start: int, record_type, path: Path):
    """(records, problems): the array's records that read, from ``start``
    (the position of its ``[``) to the end of the text."""
    reasons: Counter[str] = Counter()
    records, bad, first_bad = _salvaged(text, start, record_type, reasons)
    return records, _lost(path, bad, len(text[:first_bad].encode()) if bad else 0, reasons)


def _lost(path: Path, bad: int, first_byte: int, reasons: Counter) -> list[Problem]:
    """One line for the records that could not be read, with why (the
    reasons' counts), and one for invalid UTF-8 read as U+FFFD."""
    problems = []
    if reasons[INVALID_UTF8]:
        problems.append(Problem(f"{path}: {reasons.pop(INVALID_UTF8):,} {INVALID_UTF8}", False))
    if bad:
        why = "; ".join(f"{n:,} {reason}" for reason, n in reasons.most_common())
        problems.append(
            Problem(
                f"{path}: {bad:,} record(s) could not be read ({why}; the first at "
                f"byte {first_byte:,}) and were skipped; the others were read"
            )
        )
    return problems


def _reason(error: Exception) -> str:
    """Why one record did not read, in a user's words."""
    if isinstance(error, RecursionError):
        return "nested too deeply to read"
    if isinstance(error, msgspec.ValidationError):
        if "got `str`" in str(error) and ("`float`" in str(error) or "`int`" in str(error)):
            return f"with a number written as text ({str(error).rsplit(' - ', 1)[-1]})"
        return f"of the wrong shape ({error})"
    return "cut or corrupt"


def _salvaged(text: str, start: int, record_type, reasons: Counter):
    """(records that read, how many did not, where the first of those is);
    ``reasons``: why each did not, counted."""
    decoder = json.JSONDecoder()
    starts = _record_starts(text, start)
    records, bad, first_bad, i = [], 0, None, 0
    while i < len(starts):
        at, end = starts[i], None
        try:
            end = decoder.raw_decode(text, at)[1]
            records.append(_one_record(text[at:end], record_type))
        except (ValueError, msgspec.ValidationError, RecursionError) as error:
            reasons[_reason(error)] += 1
            bad += 1
            first_bad = first_bad if first_bad is not None else at
            if end is None:  # not even JSON: where it ends is unknown
                i += 1
                continue
        # objects nested in this record (a record of the wrong shape
        # included: they are not records, and not more bad ones)
        while i < len(starts) and starts[i] < end:
            i += 1
    return records, bad, first_bad


# Numbers msgspec refuses but Python's JSON reader takes: NaN, Infinity and
# those beyond a double or an int64.
_LARGEST_FLOAT, _INT64 = Decimal("1.7e308"), 1 << 63
_NUMBERS_AS_WRITTEN = msgspec.json.Encoder(decimal_format="number")


def _one_record(text: str, record_type):
    """One record from its text, as a whole chunk is decoded, so that a
    number keeps its digits. A record msgspec refuses only for a number it
    cannot hold (NaN, Infinity, 1e400: Python's reader takes them) is read
    with those numbers as null, as a field with no value, never refused
    whole; a record that is not JSON, or of the wrong shape, still is."""
    try:
        return msgspec.json.decode(text, type=record_type)
    except msgspec.DecodeError:
        value = json.loads(
            text,
            parse_float=lambda s: Decimal(s) if abs(Decimal(s)) < _LARGEST_FLOAT else None,
            parse_int=lambda s: int(s) if -_INT64 <= int(s) < _INT64 else None,
            parse_constant=lambda _: None,
        )
        return msgspec.json.decode(_NUMBERS_AS_WRITTEN.encode(value), type=record_type)


def _record_starts(text: str, start: int) -> list[int]:
    """Where records may start: a ``{`` at the line indentation of the
    array's first record (one record per line or block, as Kineto and
    Horovod write them), else any ``{`` after ``[`` or ``,``."""
    first = text.find("{", start)
    if first < 0:
        return []
    line = text.rfind("\n", 0, first)
    indent = text[line + 1 : first]
    if line >= 0 and not indent.strip():
        marker = "\n" + indent + "{"
        out, at = [first], text.find(marker, first)
        while at >= 0:
            out.append(at + len(marker) - 1)
            at = text.find(marker, at + 1)
        return out
    return [m.end() - 1 for m in _RECORD_START.finditer(text, start)]
