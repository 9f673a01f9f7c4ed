"""PyTorch profiler (Kineto) Chrome traces, old schema (categories Operator,
Runtime, Kernel, Memcpy) and new (cpu_op, cuda_runtime, kernel, gpu_memcpy,
user_annotation), plain or gzip-compressed.

Every complete event (``ph: X``) is one interval; ``ts``/``dur`` are
microseconds (integers in old files, decimals in new ones). Intervals nest
per (pid, tid) by time; a GPU activity's parent is the runtime call that
launched it (same ``correlation``), so a kernel takes the phase of the code
that launched it. rank: ``distributedInfo.rank`` when present, else the
number in the file name (``rank1.json``), else 0.
Collective sizes come from the ``In msg nelems``/``dtype`` arguments newer
PyTorch versions write on NCCL/Gloo records.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from traces.readers import TraceError, load_json
from traces.readers.horovod_timeline import DTYPE_BYTES
from traces.table import Rows, finish

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
RUNTIME_CATEGORIES = {"cuda_runtime", "Runtime", "cuda_driver"}


def read(path: Path, rules, run_id: str = ""):
    doc = load_json(path)
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
    else:
        events = doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a PyTorch profiler trace (no 'traceEvents' list)")
    rank = _rank(doc, path)
    names = _thread_names(events)
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    try:
        frame = pd.DataFrame({
            "name": [e.get("name", "") for e in complete],
            "cat": [e.get("cat", "") for e in complete],
            "pid": [str(e.get("pid")) for e in complete],
            "tid": [str(e.get("tid")) for e in complete],
            "start": np.rint(np.array([float(e["ts"]) for e in complete]) * 1000).astype(np.int64),
            "dur": np.rint(np.array([float(e.get("dur", 0)) for e in complete]) * 1000)
            .astype(np.int64),
        })
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{path}: a complete event without a valid ts/dur: {exc}") from None
    frame["end"] = frame["start"] + frame["dur"]
    depth, parent = _nesting(frame)
    _link_gpu_to_launch(complete, frame, depth, parent)
    rows = Rows()
    for i, event in enumerate(complete):
        collective, nbytes = _collective_size(event.get("args"))
        key = (frame["pid"].iat[i], frame["tid"].iat[i])
        rows.add(rank, "", names.get(key, f"{key[0]}/{key[1]}"), frame["name"].iat[i],
                 int(frame["start"].iat[i]), int(frame["end"].iat[i]), int(depth[i]), i,
                 None if parent[i] < 0 else int(parent[i]), collective=collective,
                 nbytes=nbytes)
    return finish(rows, rules, "kineto", run_id), []


def _rank(doc, path: Path) -> int:
    """distributedInfo.rank (torch.distributed runs), else the rank in the
    file name (our runs write torch_profiler/rank<r>.json), else 0."""
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    if info and "rank" in info:
        return int(info["rank"])
    found = re.search(r"rank-?(\d+)", path.name)
    return int(found.group(1)) if found else 0


def _thread_names(events) -> dict:
    """(pid, tid) -> 'process/thread' names from the metadata records."""
    process, thread = {}, {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            args = e.get("args") or {}
            if e.get("name") == "process_name":
                process[str(e.get("pid"))] = args.get("name")
            elif e.get("name") == "thread_name":
                thread[(str(e.get("pid")), str(e.get("tid")))] = args.get("name")
    out = {}
    for (pid, tid), name in thread.items():
        out[(pid, tid)] = f"{process.get(pid, pid)}/{name}"
    return out


def _nesting(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Depth and parent row of each interval within its (pid, tid), by time."""
    n = len(frame)
    depth = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    order = frame.sort_values(["pid", "tid", "start", "end"], ascending=[True, True, True, False],
                              kind="stable").index.to_numpy()
    pid, tid = frame["pid"].to_numpy(), frame["tid"].to_numpy()
    start, end = frame["start"].to_numpy(), frame["end"].to_numpy()
    stack: list[int] = []
    current = None
    for i in order:
        key = (pid[i], tid[i])
        if key != current:
            stack, current = [], key
        while stack and end[stack[-1]] <= start[i] and not (
                end[stack[-1]] == start[i] == end[i]):
            stack.pop()
        while stack and end[i] > end[stack[-1]]:  # overlaps without nesting: not a child
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            depth[i] = depth[stack[-1]] + 1
        stack.append(i)
    return depth, parent


def _link_gpu_to_launch(events, frame, depth, parent) -> None:
    """A GPU activity's parent is the runtime call with the same correlation id."""
    launches = {}
    for i, e in enumerate(events):
        if e.get("cat") in RUNTIME_CATEGORIES:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = i
    for i, e in enumerate(events):
        if e.get("cat") in GPU_CATEGORIES:
            launch = launches.get((e.get("args") or {}).get("correlation"))
            if launch is not None and parent[i] < 0:
                parent[i] = launch
                depth[i] = depth[launch] + 1


def _collective_size(args) -> tuple[str | None, int | None]:
    if not args:
        return None, None
    name = args.get("Collective name")
    elements = args.get("In msg nelems", args.get("In msg size"))
    size = DTYPE_BYTES.get(str(args.get("dtype", "")).lower().replace("torch.", ""))
    nbytes = int(elements) * size if elements is not None and size else None
    return (str(name).lower() if name else None), nbytes
