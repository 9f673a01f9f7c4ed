"""Chrome-trace JSON (PyTorch profiler, Horovod Timeline) decoded into typed
records with msgspec, keeping every readable record of a damaged file.

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
from pathlib import Path

import msgspec

from traces.readers import Problem

_RECORD_START = re.compile(r"[\[,]\s*\{")


def decode_array(data: bytes, record_type, path: Path, *, unterminated: bool = False):
    """(records, problems) of a JSON array of records. ``unterminated``: the
    array may lack its closing ``]`` (Horovod leaves it open)."""
    body = data.rstrip()
    if unterminated and not body.endswith(b"]"):
        body = body.rstrip(b",") + b"]"
    try:
        return msgspec.json.decode(body, type=list[record_type]), []
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    text = data.decode("utf-8", errors="replace")
    start = text.find("[")
    return salvage(text, start if start >= 0 else 0, record_type, path)


def salvage(text: str, start: int, record_type, path: Path):
    """(records, problems): the array's records that read, from ``start``
    (the position of its ``[``) to the end of the text."""
    decoder = json.JSONDecoder()
    starts = _record_starts(text, start)
    records, bad, first_bad, i = [], 0, None, 0
    while i < len(starts):
        at = starts[i]
        try:
            record, end = decoder.raw_decode(text, at)
            records.append(msgspec.convert(record, record_type))
        except (ValueError, msgspec.ValidationError):
            bad += 1
            first_bad = first_bad if first_bad is not None else at
            i += 1
            continue
        while i < len(starts) and starts[i] < end:  # objects nested in this record
            i += 1
    problems = []
    if bad:
        problems.append(
            Problem(
                f"{path}: {bad} record(s) could not be read (cut or corrupt; the first at "
                f"character {first_bad:,}) and were skipped; {len(records):,} records were read"
            )
        )
    return records, problems


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
