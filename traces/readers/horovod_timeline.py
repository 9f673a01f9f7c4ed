"""Horovod Timeline: Chrome trace JSON written by the coordinator (rank 0).

Horovod leaves the JSON array open (no closing ``]``) and may stop mid-record
when killed; the complete records are read and a cut one is reported. ``pid``
is a tensor (its name in the ``process_name`` metadata), not a rank: every
interval is rank 0's view, on location ``tensor:<name>``. Begin/End pairs
nest per tensor (ALLREDUCE > MPI_ALLREDUCE, MEMCPY_*_FUSION_BUFFER, ...); the
End of a top-level activity carries the tensor's dtype and shape, hence its
bytes. Instants (CYCLE_START) and the per-rank readiness ticks under
NEGOTIATE_* (complete events named by rank, zero long) are not intervals.
Timestamps are microseconds of Horovod's steady clock.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from traces.readers import TraceError
from traces.table import Rows, finish

DTYPE_BYTES = {"uint8": 1, "int8": 1, "bool": 1, "float16": 2, "bfloat16": 2, "int16": 2,
               "uint16": 2, "float32": 4, "int32": 4, "uint32": 4, "float64": 8, "int64": 8,
               "uint64": 8}


def parse_records(path: Path) -> tuple[list, str | None]:
    """The complete records of the (possibly unterminated) array, and a
    problem line when the file was cut inside a record."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    body = text.strip()
    if not body.startswith("["):
        raise TraceError(f"{path}: not a Horovod Timeline (expected a JSON array)")
    if body.endswith("]"):
        try:
            return json.loads(body), None
        except ValueError:
            pass
    decoder, records, i = json.JSONDecoder(), [], 1
    n = len(body)
    while True:
        while i < n and body[i] in " \t\r\n,":
            i += 1
        if i >= n or body[i] == "]":
            return records, None
        try:
            record, i = decoder.raw_decode(body, i)
        except ValueError:
            if not records:
                raise TraceError(f"{path}: not a Horovod Timeline: no complete record") from None
            return records, (f"{path}: cut inside a record after {len(records)} records "
                             "(truncated?); the complete records were read")
        records.append(record)


def read(path: Path, rules, run_id: str = ""):
    records, cut = parse_records(path)
    tensors = {r.get("pid"): r.get("args", {}).get("name") for r in records
               if r.get("ph") == "M" and r.get("name") == "process_name"}
    rows, stacks, next_id, unmatched = Rows(), {}, 0, 0
    for record in records:
        kind = record.get("ph")
        if kind == "B":
            stack = stacks.setdefault(record.get("pid"), [])
            parent = stack[-1][2] if stack else None
            stack.append([record.get("name", ""), _ns(record, path), next_id, parent])
            next_id += 1
        elif kind == "E":
            stack = stacks.get(record.get("pid"))
            if not stack:
                unmatched += 1
                continue
            name, start, row_id, parent = stack.pop()
            pid = record.get("pid")
            rows.add(0, "", f"tensor:{tensors.get(pid) or pid}", name, start, _ns(record, path),
                     len(stack), row_id, parent, nbytes=_bytes(record.get("args")))
    problems = [cut] if cut else []
    unclosed = sum(len(s) for s in stacks.values())
    if unclosed:
        problems.append(f"{path}: {unclosed} activities begun but never ended (run cut "
                        "short?); left out")
    if unmatched:
        problems.append(f"{path}: {unmatched} end records without a begin")
    return finish(rows, rules, "horovod_timeline", run_id), problems


def _ns(record: dict, path: Path) -> int:
    try:
        return int(round(float(record["ts"]) * 1000))
    except (KeyError, TypeError, ValueError):
        raise TraceError(f"{path}: a record without a valid 'ts': {record!r:.200}") from None


def _bytes(args) -> int | None:
    """Tensor bytes from the dtype and shape Horovod writes on an activity's End."""
    if not args or "shape" not in args:
        return None
    size = DTYPE_BYTES.get(str(args.get("dtype", "")).replace("torch.", ""))
    try:
        shape = json.loads(args["shape"]) if isinstance(args["shape"], str) else args["shape"]
    except ValueError:
        return None
    if size is None or not isinstance(shape, list):
        return None
    return int(np.prod(shape, dtype=np.int64)) * size
