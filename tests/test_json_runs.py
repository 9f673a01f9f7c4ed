"""Chrome-trace JSON read a run of records at a time (traces/jsonrecords):
the Horovod Timeline through the C scanner gives the table msgspec gives, in
any layout and whatever the damage; a run cut inside a nested value loses
nothing; and Begin/End records pair in C as in numpy."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from test_fastjson import needs_scanner
from test_traces_readers import RULES, TIMELINE, needs_fixtures
from traces import fastjson, jsonrecords, nesting
from traces.readers import horovod_timeline, kineto
from runfiles.tables import plain_text


def both(reader, path: Path, monkeypatch):
    """(table, problems) read with the scanner, then with msgspec alone."""
    out = []
    for engine in ("c", "msgspec"):
        monkeypatch.setenv("DDLC_JSON_SCANNER", engine)
        table, problems = reader.read(path, RULES, "r1")
        out.append((table, [str(p) for p in problems]))
    return out


def variants(tmp_path: Path) -> dict[str, Path]:
    """The real Timeline as Horovod writes it, and as it may come: closed,
    on one line, with Windows line ends, gzipped, cut, with garbage."""
    text = TIMELINE.read_bytes()
    half = len(text) // 2
    forms = {
        "as-written": text,
        "closed": text.rstrip().rstrip(b",") + b"\n]\n",
        "one-line": text.replace(b",\n", b", "),
        "crlf": text.replace(b"\n", b"\r\n"),
        "cut-mid-record": text[:half],
        "cut-at-the-end": text[:-7],
        "garbage": text[: len(text) // 3]
        + b'{"ph": "B", "name": \x07bad,\n'
        + text[len(text) // 3 :],
    }
    out = {}
    for name, data in forms.items():
        out[name] = tmp_path / f"{name}.json"
        out[name].write_bytes(data)
    out["gzip-cut"] = tmp_path / "gzip-cut.json.gz"
    out["gzip-cut"].write_bytes(gzip.compress(text)[:200_000])
    return out


@needs_scanner
@needs_fixtures
def test_timeline_scanned_in_runs_as_msgspec_reads_it(tmp_path, monkeypatch):
    """In every layout and every damage, read in runs of 64 KiB, the scanner
    gives the table and the problems msgspec gives, and the whole file read
    at once gives the same."""
    reader = horovod_timeline.HorovodTimelineReader()
    for name, path in variants(tmp_path).items():
        monkeypatch.setattr(jsonrecords, "CHUNK_BYTES", 1 << 16)
        (table, problems), (expected, expected_problems) = both(reader, path, monkeypatch)
        assert table.equals(expected) and problems == expected_problems, name
        monkeypatch.setattr(jsonrecords, "CHUNK_BYTES", 1 << 30)
        (whole, whole_problems), _ = both(reader, path, monkeypatch)
        assert table.equals(whole) and problems == whole_problems, name
        assert table.num_rows > 10_000, name
        lost = any("could not be read" in p for p in problems)
        assert lost == (name in ("cut-mid-record", "cut-at-the-end", "garbage", "gzip-cut")), name


@needs_scanner
@needs_fixtures
def test_a_bad_record_is_named_by_its_byte_in_the_file(tmp_path, monkeypatch):
    """Read in runs, the one bad record costs only itself, and the message
    gives where it is in the file, not in its run."""
    monkeypatch.setattr(jsonrecords, "CHUNK_BYTES", 1 << 16)
    text = TIMELINE.read_bytes()
    at = text.index(b"\n{", len(text) * 2 // 3) + 1
    path = tmp_path / "timeline.json"
    path.write_bytes(text[:at] + b'{"ph": "E", \x07 },\n' + text[at:])
    table, problems = horovod_timeline.HorovodTimelineReader().read(path, RULES, "r1")
    clean, _ = horovod_timeline.HorovodTimelineReader().read(TIMELINE, RULES, "r1")
    assert table.num_rows == clean.num_rows
    assert len(problems) == 1 and f"the first at byte {at:,})" in problems[0]


@needs_scanner
def test_timeline_records_the_scanner_leaves_to_msgspec(tmp_path, monkeypatch):
    """Escaped names, text pids, shapes written as lists and records without
    a time go to msgspec, into the same table; text pid "1" and int pid 1
    are two tensors."""
    records = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad/caf\u00e9"}},
        {"ph": "B", "name": "ALLREDUCE", "ts": 10, "pid": 1},
        {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 11, "pid": 1},
        {"ph": "E", "ts": 19, "pid": 1},
        {"ph": "E", "ts": 20, "pid": 1, "args": {"dtype": "float32", "shape": [8, 4]}},
        {"ph": "B", "name": "ALLREDUCE", "ts": 30, "pid": "1"},
        {"ph": "E", "ts": 40, "pid": "1", "args": {"dtype": "int64", "shape": "[3]"}},
        {"ph": "B", "name": "WAIT_FOR_DATA\u2192", "ts": 41, "pid": 1},
        {"ph": "E", "ts": None, "pid": 1},
        {"ph": "X", "name": "2", "ts": 42, "pid": 1, "dur": 0},
    ]
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + "".join(json.dumps(r) + ",\n" for r in records))
    reader = horovod_timeline.HorovodTimelineReader()
    (table, problems), (expected, expected_problems) = both(reader, path, monkeypatch)
    assert table.equals(expected) and problems == expected_problems
    df = table.to_pandas()
    reduces = df[df["region"] == "ALLREDUCE"]
    assert sorted(reduces["bytes"]) == [24, 128]
    assert sorted(reduces["location"]) == ["tensor:1", "tensor:grad/caf\u00e9"]
    assert "records without a valid 'ts'" in " ".join(problems)
    assert "begun but never ended" in " ".join(problems)


@needs_scanner
def test_a_cut_inside_a_nested_value_loses_nothing(tmp_path, monkeypatch):
    """Records on one line whose args hold lists of objects: runs are cut at
    "}, {" that lie inside those lists. Each such run is joined to the next,
    and no record is lost. (The plain records at the end keep the last cut
    between records, so the whole document is not decoded at once.)"""
    nested = {"Input Dims": [{"dim": i, "of": [i, i + 1]} for i in range(60)]}
    events = [kineto_event(f"aten::op{i}", 10.0 * i, nested) for i in range(100)]
    events += [kineto_event(f"aten::add{i}", 1e4 + i, {}) for i in range(300)]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))  # one line
    monkeypatch.setattr(jsonrecords, "CHUNK_BYTES", 1 << 12)
    data = path.read_bytes()
    runs, last = jsonrecords.chunks(data, data.index(b"{", 1))
    inside = [end for _, end in runs if not data[end:].startswith(b', {"ph"')]
    assert len(inside) > 10 and data[last - 2 : last] == b", "  # cuts inside and between
    refused, scan = [], fastjson.scan
    monkeypatch.setattr(fastjson, "scan", lambda *a, **k: refused.append(s := scan(*a, **k)) or s)
    (table, problems), (expected, expected_problems) = both(
        kineto.KinetoReader(), path, monkeypatch
    )
    assert problems == expected_problems == []
    assert table.equals(expected) and table.num_rows == 400
    assert sum(s is None for s in refused) >= len(inside)


def kineto_event(name: str, ts: float, args: dict) -> dict:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": 1,
        "tid": 2,
        "ts": ts,
        "dur": 5.0,
        "args": args,
    }


@needs_scanner
@pytest.mark.parametrize("seed", range(5))
def test_pairing_in_c_is_the_numpy_pairing(seed, monkeypatch):
    """traces.nesting.pair_begin_end gives the same pairs, depths and counts
    in C as in numpy: nested, interleaved keys, ends without a begin and
    begins never ended."""
    rng = np.random.default_rng(seed)
    n = 20_000
    key = rng.integers(0, 1 + seed * 13, n)
    is_begin = rng.random(n) < 0.45 + seed * 0.03
    fast = nesting.pair_begin_end(key, is_begin)
    assert fastjson.pair_edges(key, is_begin) is not None  # C paired them
    monkeypatch.setenv("DDLC_JSON_SCANNER", "msgspec")
    slow = nesting.pair_begin_end(key, is_begin)
    for got, want in zip(fast, slow):
        assert np.array_equal(got, want)
    assert len(fast[0]) > n // 4 and fast[3] > 0 and fast[4] > 0
    assert np.array_equal(fast[0], np.sort(fast[0]))  # in the order of the begins


@pytest.mark.parametrize(
    "shape, nbytes",
    [
        ('"[2, 3]"', 24),
        ("[2, 3]", 24),
        ('"[]"', 4),
        ('"[-1, 3]"', None),
        ('"[\\"a\\"]"', None),
        ('"[[2], 3]"', None),
        ('"[true]"', None),
        ('"[99999999999, 99999999999]"', None),
        ('"not json"', None),
    ],
)
def test_timeline_bytes_only_from_a_real_shape(shape, nbytes, tmp_path, monkeypatch):
    """A shape that is not a list of sizes >= 0 (or too large to be real)
    gives no byte count, never a wrong one nor an error, either way."""
    path = tmp_path / "timeline.json"
    path.write_text(
        '[\n{"ph": "B", "name": "ALLREDUCE", "ts": 1, "pid": 1},\n'
        f'{{"ph": "E", "ts": 2, "pid": 1, "args": {{"dtype": "float32", "shape": {shape}}}}},\n'
    )
    reader = horovod_timeline.HorovodTimelineReader()
    (table, problems), (expected, _) = both(reader, path, monkeypatch)
    assert plain_text(table).equals(plain_text(expected)) and problems == []
    assert table.column("bytes").to_pylist()[0] == nbytes


@pytest.mark.parametrize(
    "count, nbytes",
    [("12", 48), ('"12"', 48), ("3.5", 12), ("NaN", None), ("Infinity", None), ("1e400", None)]
    + [("1e300", None), ("-5", None), ('"abc"', None), ("null", None)],
)
def test_kineto_bytes_only_from_a_real_element_count(count, nbytes, tmp_path, monkeypatch):
    """An element count that is not a finite number >= 0 gives no byte
    count, never a wrong one nor an error (it raised on infinity), either
    way."""
    comms = {"Collective name": "allreduce", "In msg nelems": "COUNT", "dtype": "Float"}
    events = [kineto_event("record_param_comms", 1.0, comms), kineto_event("aten::add", 9.0, {})]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}).replace('"COUNT"', count))
    (table, problems), (expected, _) = both(kineto.KinetoReader(), path, monkeypatch)
    assert plain_text(table).equals(plain_text(expected)) and problems == []
    assert table.column("bytes").to_pylist()[0] == nbytes


@pytest.mark.parametrize(
    "dtype, size",
    [("ComplexHalf", 4), ("Float8_e8m0fnu", 1), ("Float4_e2m1fn_x2", 1), ("QInt32", 4)]
    + [("QUInt4x2", 1), ("Bits16", 2), ("c10::Float8_e8m0fnu", 1)],
)
def test_kineto_bytes_of_every_scalar_type(dtype, size, tmp_path, monkeypatch):
    """Every dtype c10 names has its element size: an MX scale's
    Float8_e8m0fnu, packed FP4, complex half and the quantized types
    left a collective's size unknown."""
    comms = {"Collective name": "allgather", "In msg nelems": 1000, "dtype": dtype}
    events = [kineto_event("record_param_comms", 1.0, comms), kineto_event("aten::add", 9.0, {})]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (table, problems), (expected, _) = both(kineto.KinetoReader(), path, monkeypatch)
    assert plain_text(table).equals(plain_text(expected)) and problems == []
    assert table.column("bytes").to_pylist()[0] == 1000 * size


def generated_timeline(path: Path, seed: int, steps: int = 40) -> Path:
    """A Timeline as Horovod writes it (the array left open, a record a
    line) of random tensors: negotiation with readiness ticks, all-reduces
    with nested activities, sizes in many dtypes and shapes, cycle marks, a
    broadcast without a size, Ends that come before their Begin's time, and
    activities left open at the end."""
    rng = np.random.default_rng(seed)
    tensors = [f"DistributedOptimizer_Allreduce/layer{i}.weight_{i}" for i in range(12)]
    lines = []
    for pid, tensor in enumerate(tensors, start=1):
        lines.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": tensor}})
    t = 1_000_000
    lines.append({"ph": "B", "name": "BROADCAST", "ts": t, "pid": 1})
    lines.append({"ph": "E", "ts": t + 5, "pid": 1})
    for _ in range(steps):
        lines.append({"ph": "i", "name": "CYCLE_START", "ts": t, "s": "g"})
        for pid in rng.permutation(len(tensors))[: int(rng.integers(6, 13))] + 1:
            pid = int(pid)
            lines.append({"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t + 1, "pid": pid})
            for rank in rng.permutation(4)[: int(rng.integers(0, 5))]:
                tick = {"ph": "X", "name": str(rank), "ts": t + 2, "pid": pid, "dur": 0}
                lines.append(tick)
            t += int(rng.integers(3, 30))
            lines.append({"ph": "E", "ts": t, "pid": pid})
            lines.append({"ph": "B", "name": "ALLREDUCE", "ts": t + 1, "pid": pid})
            for inner in ("MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE"):
                lines.append({"ph": "B", "name": inner, "ts": t + 2, "pid": pid})
                t += int(rng.integers(1, 50))
                lines.append({"ph": "E", "ts": t, "pid": pid})
            dtype = str(rng.choice(["float32", "float16", "int64", "bfloat16", "weird"]))
            shape = str([int(d) for d in rng.integers(1, 70, int(rng.integers(0, 4)))])
            end = t + 3 if rng.random() > 0.02 else t - 10_000  # before it began
            lines.append(
                {"ph": "E", "ts": end, "pid": pid, "args": {"dtype": dtype, "shape": shape}}
            )
            t += 5
        t += int(rng.integers(100, 1000))
    lines.append({"ph": "B", "name": "ALLREDUCE", "ts": t, "pid": 2})  # never ended
    path.write_text("[\n" + "".join(json.dumps(r) + ",\n" for r in lines))
    return path


@needs_scanner
@needs_fixtures
@pytest.mark.parametrize("seed", [None, *range(4)])
def test_timelines_through_scanner_and_msgspec_give_one_table(seed, tmp_path, monkeypatch):
    """The real Timeline (seed None) and generated ones, converted through
    the C scanner and through msgspec alone, in runs of 64 KiB and whole:
    the very same tables and problems."""
    path = TIMELINE if seed is None else generated_timeline(tmp_path / "timeline.json", seed)
    reader = horovod_timeline.HorovodTimelineReader()
    results = []
    for chunk in (1 << 16, 1 << 30):
        monkeypatch.setattr(jsonrecords, "CHUNK_BYTES", chunk)
        results += both(reader, path, monkeypatch)
    (table, problems), *others = results
    assert table.num_rows > 100
    for other, other_problems in others:
        # the values: the scanner's dictionaries may hold names no row uses
        assert plain_text(table).equals(plain_text(other)) and problems == other_problems
