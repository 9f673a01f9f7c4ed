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

Timestamps are microseconds of Horovod's steady clock.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from traces import jsonrecords, nesting
from traces.readers import Problem, Reader, TraceError, counted, read_bytes, register
from traces.readers.kineto import DTYPE_BYTES
from traces.table import NULL, Columns, finish_columns


class Args(msgspec.Struct, gc=False):
    name: str | None = None
    dtype: str | None = None
    shape: str | list | None = None


class Record(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    ts: float | None = None
    pid: int | str | None = None
    dur: float = 0.0
    args: Args | None = None


@register
class HorovodTimelineReader(Reader):
    name = "horovod_timeline"
    patterns = ("horovod_timeline.json", "horovod_timeline.json.gz", "*.json", "*.json.gz")

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return head.lstrip().startswith(b"[") and b'"ph"' in head

    def read(self, path: Path, rules, run_id: str = ""):
        data, problem = read_bytes(path)
        records, problems = jsonrecords.decode_array(data, Record, path, unterminated=True)
        del data
        problems = ([problem] if problem else []) + problems
        if not records:
            raise TraceError(f"{path}: not a Horovod Timeline: no readable record")
        columns, more = _columns(records, path)
        return finish_columns(columns, rules, self.name, run_id), problems + more


INTERVAL_PHASES = frozenset(("B", "E", "X"))


def _columns(records: list, path: Path):
    tensors = {
        r.pid: r.args.name
        for r in records
        if r.ph == "M" and r.name == "process_name" and r.args is not None
    }
    timed = [r for r in records if r.ts is not None]
    # metadata has no time of its own; an activity without one is lost
    untimed = sum(ph in INTERVAL_PHASES for ph in [r.ph for r in records if r.ts is None])
    ph = np.array([r.ph for r in timed], dtype=object)
    ts = np.rint(np.array([r.ts for r in timed], dtype=np.float64) * 1000).astype(np.int64)
    pid, pids = pd.factorize(pd.Series([r.pid for r in timed], dtype=object))
    is_begin, is_end = ph == "B", ph == "E"
    edges = np.flatnonzero(is_begin | is_end)
    begins, ends, _, unmatched, unclosed = nesting.pair_begin_end(pid[edges], is_begin[edges])
    begins, ends = edges[begins], edges[ends]
    complete = np.flatnonzero(ph == "X")
    ticks = complete[np.array([timed[i].name.isdigit() for i in complete.tolist()], dtype=bool)]
    rows = np.r_[begins, ticks]
    start = np.r_[ts[begins], ts[ticks]]
    end = np.r_[ts[ends], ts[ticks]]
    names = [timed[i].name for i in begins.tolist()] + ["rank_ready"] * len(ticks)
    rank = np.r_[
        np.zeros(len(begins), dtype=np.int64), [int(timed[i].name) for i in ticks.tolist()]
    ].astype(np.int64)
    nbytes = np.r_[[_bytes(timed[i].args) for i in ends.tolist()], np.full(len(ticks), NULL)]
    where = pid[rows].astype(np.int64)
    parent = nesting.enclosing(where, start, end)
    cycles = np.sort(
        ts[ph == "i"][[timed[i].name == "CYCLE_START" for i in np.flatnonzero(ph == "i")]]
    )
    steps, row_step = _steps(names, where, start, end, parent, cycles)
    n_steps = len(steps)
    location_names = [f"tensor:{tensors.get(p) or p}" for p in pids] + ["steps"]
    region, region_names = pd.factorize(pd.Series(names + ["step"] * n_steps, dtype=object))
    problems = _problems(path, untimed, unmatched, unclosed)
    columns = Columns(
        rank=np.r_[rank, np.zeros(n_steps, dtype=np.int64)],
        node=np.zeros(len(rows) + n_steps, dtype=np.int32),
        node_names=[""],
        location=np.r_[where, np.full(n_steps, len(pids))].astype(np.int32),
        location_names=location_names,
        region=region.astype(np.int32),
        region_names=list(region_names),
        start_ns=np.r_[start, steps["start"]],
        end_ns=np.r_[end, steps["end"]],
        depth=np.r_[nesting.depths(parent), np.zeros(n_steps, dtype=np.int64)],
        parent_row=np.r_[parent, np.full(n_steps, -1)],
        step=np.r_[row_step, np.arange(n_steps)].astype(np.int64),
        epoch=np.full(len(rows) + n_steps, NULL, dtype=np.int64),
        collective=np.full(len(rows) + n_steps, -1, dtype=np.int32),
        collective_names=[],
        bytes=np.r_[nbytes, np.full(n_steps, NULL)].astype(np.int64),
    )
    return columns, problems


def _steps(names: list, where, start, end, parent, cycles):
    """((start, end) of each step, the step of each row or NULL).

    The tensors all-reduced most often are the gradients: step k is their
    k-th top-level ALLREDUCE (and its NEGOTIATE_ALLREDUCE), from the cycle
    mark before the first of them where the trace has marks."""
    row_step = np.full(len(names), NULL, dtype=np.int64)
    names = np.asarray(names, dtype=object)
    top = pd.DataFrame({"tensor": where, "start": start, "end": end, "name": names})
    top = top[(parent < 0) & np.isin(names, ["ALLREDUCE", "NEGOTIATE_ALLREDUCE"])]
    reduces = top[top["name"] == "ALLREDUCE"]
    if reduces.empty:
        return pd.DataFrame({"start": [], "end": []}, dtype=np.int64), row_step
    counts = reduces.groupby("tensor").size()
    top = top[top["tensor"].isin(counts.index[counts == counts.max()])]
    top = top.sort_values("start", kind="stable")
    k = top.groupby(["tensor", "name"]).cumcount()
    row_step[k.index.to_numpy()] = k.to_numpy()
    reduces = top[top["name"] == "ALLREDUCE"]
    steps = reduces.groupby(k[reduces.index].to_numpy()).agg(
        start=("start", "min"), end=("end", "max")
    )
    if cycles.size:
        at = np.searchsorted(cycles, steps["start"].to_numpy(), side="right") - 1
        steps["start"] = np.where(at >= 0, cycles[np.maximum(at, 0)], steps["start"])
    return steps.reset_index(drop=True), row_step


def _problems(path: Path, untimed: int, unmatched: int, unclosed: int) -> list[Problem]:
    return counted(
        path,
        (untimed, "records without a valid 'ts' were skipped", True),
        (unclosed, "activities begun but never ended (run cut short?); left out", True),
        (unmatched, "end records without a begin; left out", True),
    )


def _bytes(args) -> int:
    """Tensor bytes from the dtype and shape Horovod writes on an activity's
    End; NULL when it does not say."""
    if args is None or args.shape is None:
        return NULL
    shape = args.shape if isinstance(args.shape, str) else json.dumps(args.shape)
    return _tensor_bytes(args.dtype, shape)


@functools.lru_cache(maxsize=1 << 14)
def _tensor_bytes(dtype, shape: str) -> int:
    """Bytes of a tensor of ``dtype`` and ``shape`` (JSON text): each tensor's
    pair recurs every step, so each is worked out once."""
    size = DTYPE_BYTES.get(str(dtype or "").lower().replace("torch.", ""))
    try:
        shape = json.loads(shape)
    except ValueError:
        return NULL
    if size is None or not isinstance(shape, list):
        return NULL
    return int(np.prod(shape, dtype=np.int64)) * size
