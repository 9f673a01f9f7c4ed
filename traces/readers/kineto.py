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

The JSON is decoded by msgspec into typed records (traces/jsonrecords.py)
and everything after that is numpy: no Python per event.
"""
from __future__ import annotations

import re
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from traces import jsonrecords, nesting
from traces.readers import Problem, Reader, TraceError, read_bytes, register
from traces.table import NULL, PHASE_CODE, Columns, finish_columns

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
RUNTIME_CATEGORIES = {"cuda_runtime", "Runtime", "cuda_driver"}
GPU_ANNOTATION = "gpu_user_annotation"
KINETO_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"',
               b'"distributedInfo"', b'"displayTimeUnit"')

# Element sizes by dtype, as PyTorch spells them in different versions
# (torch.float32, float32, Float, c10::Half ...), compared in lower case.
DTYPE_BYTES = {
    "uint8": 1, "int8": 1, "bool": 1, "byte": 1, "char": 1, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "float16": 2, "half": 2, "bfloat16": 2, "int16": 2, "short": 2,
    "uint16": 2, "float32": 4, "float": 4, "int32": 4, "int": 4, "uint32": 4,
    "float64": 8, "double": 8, "int64": 8, "long": 8, "uint64": 8, "complexfloat": 8,
    "complex64": 8, "complexdouble": 16, "complex128": 16,
}

# ``Collective name`` values -> the collective names of traces/rules.yaml;
# None: not a collective (waits, coalescing markers).
COLLECTIVE_NAMES = {
    "allreduce": "allreduce", "all_reduce": "allreduce", "allreduce_coalesced": "allreduce",
    "broadcast": "bcast", "bcast": "bcast",
    "allgather": "allgather", "all_gather": "allgather", "_allgather_base": "allgather",
    "allgather_into_tensor_coalesced": "allgather", "allgather_coalesced": "allgather",
    "all_gather_into_tensor": "allgather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced":
        "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter", "barrier": "barrier",
    "send": "send", "recv": "recv", "wait": None, "coalesced": None,
    "startcoalescing": None, "endcoalescing": None,
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


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str | None = None
    pid: Id = None
    tid: Id = None
    ts: float | None = None
    dur: float = 0.0
    args: Args | None = None


class Header(msgspec.Struct):
    """Kineto's document keys, the events excepted (decoded separately)."""
    distributedInfo: dict | None = None


class Document(msgspec.Struct):
    traceEvents: list[Event]
    distributedInfo: dict | None = None


@register
class KinetoReader(Reader):
    name = "kineto"
    patterns = ("torch_profiler/*.json", "torch_profiler/*.json.gz", "*.pt.trace.json",
                "*.pt.trace.json.gz", "*.json", "*.json.gz")

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        """A JSON object with Kineto's keys near its start (not any JSON file
        of a run folder)."""
        return head.lstrip().startswith(b"{") and any(key in head for key in KINETO_KEYS)

    def read(self, path: Path, rules, run_id: str = ""):
        data, problem = read_bytes(path)
        events, info, problems = _decode(data, path)
        del data
        problems = ([problem] if problem else []) + problems
        columns, more = _columns(events, _rank(info, path), path)
        problems += more
        return finish_columns(columns, rules, self.name, run_id, place=place_by_position), \
            problems


def _decode(data: bytes, path: Path):
    """(events, distributedInfo, problems), keeping every readable event."""
    try:
        doc = msgspec.json.decode(data, type=Document)
        return doc.traceEvents, doc.distributedInfo, []
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    text = data.decode("utf-8", errors="replace")
    found = re.search(r'"traceEvents"\s*:\s*\[', text)
    if found is None:
        raise TraceError(f"{path}: not a PyTorch profiler trace, or cut before its events "
                         "(truncated or corrupt?): no 'traceEvents' list")
    events, problems = jsonrecords.salvage(text, found.end() - 1, Event, path)
    info = re.search(r'"distributedInfo"\s*:\s*(\{[^{}]*\})', text)
    try:
        info = msgspec.json.decode(info.group(1)) if info else None
    except msgspec.DecodeError:
        info = None
    if not events:
        raise TraceError(f"{path}: no readable event (truncated or corrupt?)")
    return events, info, problems


def _rank(info, path: Path) -> int:
    """distributedInfo.rank (torch.distributed runs), else the rank in the
    file name (our runs write torch_profiler/rank<r>.json), else 0."""
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    found = re.search(r"rank-?(\d+)", path.name)
    return int(found.group(1)) if found else 0


def _columns(events: list, rank: int, path: Path):
    """(Columns, problems) of the complete events."""
    names = _thread_names(events)
    complete = [e for e in events if e.ph == "X"]
    untimed = sum(e.ts is None for e in complete)
    if untimed:
        complete = [e for e in complete if e.ts is not None]
    n = len(complete)
    start = np.rint(np.array([e.ts for e in complete], dtype=np.float64) * 1000).astype(np.int64)
    end = start + np.rint(np.array([e.dur for e in complete], dtype=np.float64) * 1000) \
        .astype(np.int64)
    keys = pd.Series([(e.pid, e.tid) for e in complete], dtype=object)
    where, wheres = pd.factorize(keys)
    parent = nesting.enclosing(where, start, end)
    category = pd.Series([e.cat for e in complete], dtype=object)
    args = [e.args for e in complete]
    _link(parent, category, args)
    collective, nbytes = _collectives(args)
    region, region_names = pd.factorize(pd.Series([e.name for e in complete], dtype=object))
    ops, op_names = pd.factorize(pd.Series(collective, dtype=object))
    problems = []
    if untimed:
        problems.append(Problem(f"{path}: {untimed} complete event(s) without a 'ts' were "
                                "skipped"))
    columns = Columns(
        rank=np.full(n, rank, dtype=np.int64), node=np.zeros(n, dtype=np.int32),
        node_names=[""], location=where.astype(np.int32),
        location_names=[names.get(k, f"{k[0]}/{k[1]}") for k in wheres],
        region=region.astype(np.int32), region_names=list(region_names), start_ns=start,
        end_ns=end, depth=nesting.depths(parent), parent_row=parent,
        step=np.full(n, NULL, dtype=np.int64), epoch=np.full(n, NULL, dtype=np.int64),
        collective=ops.astype(np.int32), collective_names=list(op_names), bytes=nbytes)
    return columns, problems


def _thread_names(events) -> dict:
    """(pid, tid) -> 'process/thread' names from the metadata records."""
    process, thread = {}, {}
    for e in events:
        if e.ph == "M" and e.args is not None:
            if e.name == "process_name":
                process[e.pid] = e.args.name
            elif e.name == "thread_name":
                thread[(e.pid, e.tid)] = e.args.name
    return {(pid, tid): f"{process.get(pid, pid)}/{name}" for (pid, tid), name in thread.items()}


def _link(parent: np.ndarray, category: pd.Series, args: list) -> None:
    """In place: a GPU activity without a parent on its stream runs in the
    runtime call with its correlation id, a GPU annotation in the CPU record
    with its External id."""
    correlation = pd.Series([a.correlation if a is not None else None for a in args],
                            dtype=object)
    external = pd.Series([a.external_id if a is not None else None for a in args],
                         dtype=object)
    gpu = category.isin(GPU_CATEGORIES).to_numpy()
    runtime = category.isin(RUNTIME_CATEGORIES).to_numpy()
    annotation = (category == GPU_ANNOTATION).to_numpy()
    on_cpu = ~(gpu | annotation | runtime) & external.notna().to_numpy()
    for children, launchers, key in ((gpu, runtime, correlation),
                                     (annotation, on_cpu, external)):
        rows = np.flatnonzero(children & (parent < 0) & key.notna().to_numpy())
        if rows.size == 0:
            continue
        launch = np.flatnonzero(launchers & key.notna().to_numpy())
        index = pd.Series(launch, index=key.iloc[launch].to_numpy())
        index = index[~index.index.duplicated()]
        found = index.reindex(key.iloc[rows].to_numpy()).to_numpy()
        ok = ~np.isnan(found)
        parent[rows[ok]] = found[ok].astype(np.int64)


def _collectives(args: list) -> tuple[list, np.ndarray]:
    """Per event: the collective its arguments name (or None) and its bytes
    (NULL when unknown)."""
    n = len(args)
    nbytes = np.full(n, NULL, dtype=np.int64)
    names = [None] * n
    for i in [i for i, a in enumerate(args) if a is not None and a.collective is not None]:
        a = args[i]
        name = str(a.collective).lower()
        names[i] = COLLECTIVE_NAMES.get(name, name)
        if names[i] is None:
            continue
        size = DTYPE_BYTES.get(str(a.dtype or "").lower().removeprefix("torch.")
                               .removeprefix("c10::"))
        elements = a.nelems if a.nelems is not None else a.size
        try:
            if size and elements is not None:
                nbytes[i] = int(float(elements)) * size
        except ValueError:
            pass
    return names, nbytes


COPIES = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::pin_memory")


def place_by_position(c: Columns, phase: np.ndarray, is_step: np.ndarray) -> None:
    """The training loop's own calls in a step that no annotation names, by
    their place: inside a ProfilerStep, on its thread, the top-level calls
    after the data loading and before the optimizer step are the forward
    (the model's ops, its loss), copies right after the data loading the
    host-to-device transfer. Backward runs on autograd's thread and zero_grad
    and the optimizer have their own records."""
    parent = np.maximum(c.parent_row, 0)
    rows = np.flatnonzero((c.parent_row >= 0) & is_step[parent]
                          & (c.location == c.location[parent]))
    if rows.size == 0:
        return
    frame = pd.DataFrame({"step": c.parent_row[rows], "start": c.start_ns[rows],
                          "phase": phase[rows], "row": rows})
    by_step = frame.groupby("step")["start"]
    loaded = frame["start"].where(frame["phase"] == PHASE_CODE["data_load"])
    optimized = frame["start"].where(frame["phase"] == PHASE_CODE["optimizer"])
    after = loaded.groupby(frame["step"]).transform("max").fillna(by_step.transform("min") - 1)
    before = optimized.groupby(frame["step"]).transform("min").fillna(np.inf)
    free = (frame["phase"] < 0) & (frame["start"] > after) & (frame["start"] < before)
    names = np.asarray(c.region_names, dtype=object)[c.region[rows]]
    copy = pd.Series(np.isin(names, COPIES), index=frame.index)
    first_other = frame["start"].where(free & ~copy).groupby(frame["step"]).transform("min")
    h2d = free & copy & (frame["start"] < first_other.fillna(np.inf))
    phase[rows[(free & ~h2d).to_numpy()]] = PHASE_CODE["forward"]
    phase[rows[h2d.to_numpy()]] = PHASE_CODE["h2d"]
