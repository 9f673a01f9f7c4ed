"""The merged timeline: valid Chrome trace JSON (checked against the trace
event format's rules as a JSON Schema, and by Perfetto's trace processor
where its binary is installed), with the right processes, slices and flows,
the clock alignment written down, long runs cut to a window of steps."""

import io
import json
import os
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd

from analysis import critical_path as cp
from analysis import json_rows, timeline
from conftest import REAL_TRACES as REAL, ddlc, needs_shared
from phase_tables import constructed

# The Trace Event Format (Google, "Trace Event Format" document, the JSON
# Object Format): the event kinds this exporter writes and the fields each
# must carry for chrome://tracing and Perfetto to place it.
NUMBER = {"type": "number", "minimum": 0}
EVENT = {
    "type": "object",
    "required": ["ph", "pid"],
    "properties": {
        "ph": {"enum": ["X", "M", "s", "f"]},
        "pid": {"type": "integer"},
        "tid": {"type": "integer"},
        "name": {"type": "string"},
        "cat": {"type": "string"},
        "args": {"type": "object"},
    },
    "allOf": [
        {
            "if": {"properties": {"ph": {"const": "X"}}},
            "then": {
                "required": ["name", "tid", "ts", "dur"],
                "properties": {"ts": NUMBER, "dur": NUMBER},
            },
        },
        {
            "if": {"properties": {"ph": {"const": "M"}}},
            "then": {
                "required": ["name", "args"],
                "properties": {
                    "name": {"enum": ["process_name", "thread_name", "process_sort_index"]}
                },
            },
        },
        {
            "if": {"properties": {"ph": {"enum": ["s", "f"]}}},
            "then": {"required": ["name", "cat", "id", "tid", "ts"], "properties": {"ts": NUMBER}},
        },
        {
            "if": {"properties": {"ph": {"const": "f"}}},
            "then": {"required": ["bp"], "properties": {"bp": {"const": "e"}}},
        },
    ],
}
TRACE = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": EVENT},
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "otherData": {"type": "object"},
    },
}


def read_valid(path: Path) -> dict:
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, TRACE)
    return doc


def flows_bind_to_slices(events: list[dict]) -> bool:
    """Each flow end lies inside a slice of its own process and thread (what
    the viewers bind it to)."""
    slices = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for e in events:
        if e["ph"] in "sf" and not any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])]):
            return False
    return True


def test_rows_formatted_by_numpy_read_back_exactly():
    """The writer's numbers, nulls, choices and optional fields, against
    Python's own decimal text, edge cases included (0, negatives under a
    microsecond, 19-digit integers, trailing zeros of the decimals)."""
    rng = np.random.default_rng(1)
    n = 5_000
    ns = rng.integers(-(10**15), 10**15, n)
    ns[:6] = [0, -500, 1000, 1500, -1_000_001, 999]
    ints = rng.integers(-(2**62), 2**62, n)
    ints[:3] = [0, -1, 7]
    null, sized = rng.random(n) < 0.2, rng.random(n) < 0.5
    texts = ['"a":"x"', '"a":"y\\"z"', '"a":null']
    codes = rng.integers(0, 3, n)
    out = io.BytesIO()
    out.write(b"[")
    json_rows.write(
        out,
        n,
        [
            json_rows.Text('{"t":'),
            json_rows.Micros(ns),
            json_rows.Text(',"i":'),
            json_rows.Ints(ints, null=null),
            json_rows.Text(","),
            json_rows.Choice(texts, codes),
            json_rows.When(sized, json_rows.Text(',"b":'), json_rows.Ints(ints)),
            json_rows.Text("},"),
        ],
    )
    text = out.getvalue()[:-1] + b"]"
    rows = json.loads(text, parse_float=Decimal)
    assert [r["t"] for r in rows] == [Decimal(int(v)) / 1000 for v in ns]
    assert b'"t":0,' in text and b'"t":-0.5,' in text and b'"t":0.999,' in text  # no 0.500
    assert [r["i"] for r in rows] == [None if z else int(v) for z, v in zip(null, ints)]
    assert [r["a"] for r in rows] == [["x", 'y"z', None][c] for c in codes]
    assert [r.get("b") for r in rows] == [int(v) if m else None for m, v in zip(sized, ints)]
    empty = io.BytesIO()
    assert json_rows.write(empty, 0, [json_rows.Ints(np.array([], np.int64))]) == 0


def test_processes_slices_and_flows(tmp_path):
    phases = constructed(extra=lambda r, s: {"data_load": 20} if r == 2 else {})
    phases.to_parquet(tmp_path / "phases.parquet")
    info = timeline.export([tmp_path / "phases.parquet"], tmp_path / "t.json")
    doc = read_valid(tmp_path / "t.json")
    kinds = Counter(e["ph"] for e in doc["traceEvents"])
    found = cp.analyse(phases)
    path_pieces = (found.path["kind"] != cp.UNTIMED).sum()
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"r1 rank {r} (n0)" for r in range(4)} | {"r1 critical path"}
    assert kinds["X"] == len(phases) + path_pieces
    assert kinds["s"] == kinds["f"] == 20  # one arrow per join
    assert info["counts"] == {"processes": 5, "slices": kinds["X"], "flows": 20}
    flows = [e for e in doc["traceEvents"] if e["ph"] in "sf"]
    assert Counter(e["id"] for e in flows) == Counter({n: 2 for n in range(20)})
    assert {e["pid"] for e in flows if e["ph"] == "s"} == {1000 + 2 + 1}  # rank 2 arrives last
    assert flows_bind_to_slices(doc["traceEvents"])
    # Collectives carry their bytes; times are exact microseconds.
    first = min(e["ts"] for e in doc["traceEvents"] if e["ph"] == "X")
    assert first == 0
    assert doc["otherData"]["runs"]["r1"]["clock_alignment"]["method"] == "trace"


def test_collectives_go_out_with_their_bytes(tmp_path):
    phases = constructed(exposed=False, steps=4)
    phases.to_parquet(tmp_path / "p.parquet")
    timeline.export([tmp_path / "p.parquet"], tmp_path / "t.json")
    events = read_valid(tmp_path / "t.json")["traceEvents"]
    coll = [e for e in events if e.get("cat") == "collective"]
    assert len(coll) == 4 * 4
    assert coll[0]["args"] == {
        "step": coll[0]["args"]["step"],
        "region": "grad_comm",
        "collective": "allreduce",
        "bytes": 4_000_000,
    }
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {"Master thread", "comm 0"}


def test_clocks_of_two_nodes_are_aligned_and_recorded(tmp_path):
    """Node 1's clock reads 5 s ahead: aligned at the joins, rank 2's slow
    data_load is found again, and the offsets are in the file."""
    phases = constructed(
        extra=lambda r, s: {"data_load": 20} if r == 2 else {}, nodes=2, node_clock_ns=5_000_000_000
    )
    phases.to_parquet(tmp_path / "p.parquet")
    info = timeline.export([tmp_path / "p.parquet"], tmp_path / "t.json")
    clock = read_valid(tmp_path / "t.json")["otherData"]["runs"]["r1"]["clock_alignment"]
    assert clock["method"] == "join" and clock["nodes"] == 2
    assert clock["offsets_ns"] == {"0": 0, "1": 0, "2": 5_000_000_000, "3": 5_000_000_000}
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    ends = {
        e["pid"]: e["ts"] + e["dur"]
        for e in events
        if e["ph"] == "X" and e["name"] == "grad_comm" and e["args"]["step"] == 0
    }
    assert len(set(ends.values())) == 1  # every rank leaves the first join together
    starts = [e for e in events if e["ph"] == "s"]
    assert {e["pid"] for e in starts} == {1003}
    assert info["counts"]["flows"] == 20


def test_flows_bind_to_the_thread_their_join_was_read_from(tmp_path):
    """Imported traces put a rank's intervals on many locations (Horovod
    Timeline: one per tensor), and the first one seen need not be where the
    join was read from, nor hold a forward: each arrow's end goes on the
    thread of its join's interval."""
    phases = constructed(extra=lambda r, s: {"data_load": 20} if r == 2 else {})
    phases = phases[phases["phase"] != "forward"]
    ticks = phases[phases["phase"] == "grad_comm"].groupby("rank").head(1)
    ticks = ticks.assign(location="tensor:conv_0", end_ns=ticks["start_ns"], dur_ns=0)
    phases = pd.concat([ticks, phases], ignore_index=True)  # seen first: tid 0
    phases.to_parquet(tmp_path / "p.parquet")
    info = timeline.export([tmp_path / "p.parquet"], tmp_path / "t.json")
    doc = read_valid(tmp_path / "t.json")
    assert info["counts"]["flows"] == 20
    assert {e["tid"] for e in doc["traceEvents"] if e["ph"] in "sf"} == {1}
    assert flows_bind_to_slices(doc["traceEvents"])


def test_long_runs_go_out_as_a_window_of_steps(tmp_path):
    phases = constructed(steps=50)
    phases.to_parquet(tmp_path / "p.parquet")
    info = timeline.export([tmp_path / "p.parquet"], tmp_path / "t.json", max_intervals=200)
    note = info["downsampled"]
    kept = note["steps"][1] - note["steps"][0] + 1
    assert note["intervals"] == kept * 4 * 5 <= 200 and note["of_intervals"] == len(phases)
    assert note["of_steps"] == [0, 49] and 20 <= note["steps"][0] <= 25
    doc = read_valid(tmp_path / "t.json")
    steps = {e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "phase"}
    assert steps == set(range(note["steps"][0], note["steps"][1] + 1))
    assert doc["otherData"]["downsampled"]["why"].startswith("more than 200 intervals")


@needs_shared("scorep-8.4-horovod-torch-mpi-np2", "horovod-timeline-IgorDavidyuk-cpu3")
def test_real_and_imported_traces_through_the_command(tmp_path):
    out = tmp_path / "scorep.json"
    done = ddlc(
        "timeline",
        str(REAL / "scorep-8.4-horovod-torch-mpi-np2"),
        str(REAL / "horovod-timeline-IgorDavidyuk-cpu3" / "timeline.json"),
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert "critical-path flows" in done.stdout
    doc = read_valid(out)
    runs = doc["otherData"]["runs"]
    assert set(runs) == {"scorep-8.4-horovod-torch-mpi-np2", "horovod-timeline-IgorDavidyuk-cpu3"}
    assert runs["scorep-8.4-horovod-torch-mpi-np2"]["join"] == "grad_comm"
    pids = {e["pid"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert {1001, 1002, 1999} <= pids  # two Score-P ranks and their critical path
    assert flows_bind_to_slices(doc["traceEvents"])
    if os.environ.get("PERFETTO_TP_BIN") or shutil.which("trace_processor_shell"):
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

        binary = os.environ.get("PERFETTO_TP_BIN") or shutil.which("trace_processor_shell")
        tp = TraceProcessor(trace=str(out), config=TraceProcessorConfig(bin_path=binary))
        count = next(iter(tp.query("select count(*) as n from slice"))).n
        assert count == doc["otherData"]["counts"]["slices"]


def test_bad_input_is_one_clear_line(tmp_path):
    done = ddlc("timeline", str(tmp_path / "nothing"), "-o", str(tmp_path / "t.json"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {tmp_path / 'nothing'}: no such file or directory"
    (tmp_path / "empty").mkdir()
    done = ddlc("timeline", str(tmp_path / "empty"), "-o", str(tmp_path / "t.json"))
    assert done.returncode == 2 and "empty" in done.stderr and "Traceback" not in done.stderr
    # The workflow's way: what cannot be read is listed, the file is written.
    done = ddlc("timeline", str(tmp_path / "empty"), "-o", str(tmp_path / "t.json"), "--keep-going")
    assert done.returncode == 0 and "skipped" in done.stderr
    doc = read_valid(tmp_path / "t.json")
    assert doc["otherData"]["skipped"][0].startswith(str(tmp_path / "empty"))
    assert doc["otherData"]["counts"]["slices"] == 0
