"""One reader per trace format, each filling the same :class:`traces.table.Rows`.

``detect(path)`` names the format of a file or folder; ``read(path, rules,
run_id)`` returns the phase table. Anything a reader cannot make sense of
raises :class:`TraceError` with the file's name, never a traceback.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path


class TraceError(Exception):
    """A trace that cannot be read: the message names the file and why."""


def detect(path: Path) -> str:
    """``otf2``, ``horovod_timeline`` or ``kineto`` for one trace file."""
    path = Path(path)
    if path.suffix == ".otf2":
        return "otf2"
    head = _head(path)
    if head.lstrip().startswith("["):
        return "horovod_timeline"
    if head.lstrip().startswith("{"):
        return "kineto"
    raise TraceError(f"{path}: not a trace this converter knows (expected an OTF2 anchor "
                     "file *.otf2, a Horovod Timeline JSON array or a PyTorch profiler "
                     "JSON object)")


def _head(path: Path) -> str:
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", errors="replace") as f:
            return f.read(4096)
    except (OSError, EOFError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None


def load_json(path: Path):
    """A JSON document, gzip-compressed or not."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise TraceError(f"{path}: cannot read (truncated or corrupt?): {exc}") from None
    try:
        return json.loads(data)
    except ValueError as exc:
        raise TraceError(f"{path}: not valid JSON (truncated or corrupt?): {exc}") from None


def read(path: Path, rules, run_id: str = "", source: str | None = None):
    from traces.readers import horovod_timeline, kineto, otf2_reader
    source = source or detect(path)
    reader = {"otf2": otf2_reader, "horovod_timeline": horovod_timeline, "kineto": kineto}[source]
    return reader.read(Path(path), rules, run_id)
