"""The C scanner of Kineto's events array (traces/fastjson) gives the table
that msgspec gives, and refuses (so that msgspec reads it) whatever it does
not take exactly as msgspec does."""

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from test_traces_readers import FIXTURES, RULES, garbled_copy, needs_fixtures
from traces import fastjson, jsonrecords, nesting, table
from traces.readers import kineto

KINETO = sorted(p.relative_to(FIXTURES).as_posix() for p in FIXTURES.glob("kineto-*/*.json*"))
needs_scanner = pytest.mark.skipif(
    fastjson.library() is None, reason=f"no C scanner: {fastjson.why_unavailable()}"
)


def both(path: Path, monkeypatch):
    """(table, problems) read with the scanner, then with msgspec alone."""
    out = []
    for engine in ("c", "msgspec"):
        monkeypatch.setenv("DDLC_JSON_SCANNER", engine)
        table, problems = kineto.KinetoReader().read(path, RULES, "r1")
        out.append((table, [str(p) for p in problems]))
    return out


def events_file(path: Path, events: list, raw: str = "") -> Path:
    """A Kineto trace of ``events`` (and ``raw`` JSON records after them)."""
    body = ",\n  ".join(
        [json.dumps(e, ensure_ascii=False) for e in events] + ([raw] if raw else [])
    )
    path.write_text('{\n  "schemaVersion": 1,\n  "traceEvents": [\n  ' + body + "\n  ]\n}\n")
    return path


def x(name, ts, dur=1.0):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 2, "ts": ts, "dur": dur}


@needs_scanner
@needs_fixtures
@pytest.mark.parametrize("name", KINETO)
def test_every_kineto_fixture_scanned_as_msgspec_reads_it(name, monkeypatch):
    """Each fixture (old schema with string thread ids, new with NCCL
    collectives) is taken by the scanner, into the very same table."""
    data = gzip.open(FIXTURES / name).read()
    scanned = fastjson.scan(kineto.msgspec.json.decode(data, type=kineto.Document).traceEvents)
    assert scanned is not None
    events = json.loads(data)["traceEvents"]
    assert scanned.rows == sum(e.get("ph") == "X" for e in events)
    (table, problems), (expected, expected_problems) = both(FIXTURES / name, monkeypatch)
    assert table.equals(expected) and problems == expected_problems == []


@needs_scanner
def test_odd_but_valid_records_read_as_msgspec_reads_them(tmp_path, monkeypatch):
    """Escapes, nulls, string ids, missing fields, a collective's bytes from
    ``In msg size``, an event without ts: the scanner's table is msgspec's."""
    collective = x("record_param_comms", 5.5, 1.0)
    collective["args"] = {"Collective name": "AllReduce", "In msg nelems": None}
    collective["args"].update({"In msg size": 1e3, "dtype": "c10::Half", "correlation": None})
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": 'loop "a"'}},
        x('aten::mm "quoted" \\ back\nslash', 1.25, 8.0),
        {**x("ProfilerStep#1", 0.5, 20), "cat": None, "args": {"External id": "e-1"}},
        {**x("kernel", 3.0), "pid": "Spans", "tid": "stream 7", "args": {"correlation": 9}},
        collective,
        {"ph": "X", "name": "untimed"},
        {"ph": "X", "name": "only ts", "ts": 7},
        {"ph": "i", "name": "instant", "ts": 1.5, "pid": "", "tid": "", "s": "t"},
        {"ph": "X", "name": "caf\u00e9 \u2014 \U0001f600", "ts": 2e0, "dur": 1.5e-3, "pid": 1},
        {**x("nccl:all_reduce", 5.6, 0.5), "args": {"Collective name": "wait"}},
    ]
    path = events_file(tmp_path / "rank-3.json", events)
    assert fastjson.scan(path.read_bytes(), *_array(path.read_bytes())) is not None
    (table, problems), (expected, expected_problems) = both(path, monkeypatch)
    assert table.equals(expected) and problems == expected_problems
    df = table.to_pandas()
    assert 'aten::mm "quoted" \\ back\nslash' in set(df["region"])
    assert df.loc[df["collective"].notna(), "bytes"].tolist() == [2000]
    assert any("without a valid 'ts'" in p for p in problems)


def _array(data: bytes) -> tuple[int, int]:
    """(begin, end) of the events array's JSON in ``data``."""
    begin = data.index(b"[")
    return begin, data.rindex(b"]") + 1


@needs_scanner
@pytest.mark.parametrize(
    "raw",
    [
        '{"ph": "X", "name": "\\u0041", "ts": 1}',  # a \u escape in a name
        '{"ph": "X", "name": "a", "ts": 1, "pid": 1.5}',  # a float pid
        '{"ph": "X", "name": "a", "ts": NaN}',
        '{"ph": "X", "name": "a", "ts": 1, "args": {"correlation": 99999999999999999999}}',
        '{"ph": "X", "name": "a", "ts": 1, "pid": -9223372036854775809}',  # beyond int64
        '{"ph": "X", "name": "a", "ts": 1, "args": {"In msg nelems": "12"}}',
        '{"ph": "X", "name": "a", "ts": 1, "dur": null}',  # msgspec refuses it: a bad record
        '{"ph": "X", "name": "a", "ts": 1,}',
        '{"ph": "X", "name": "a\x07", "ts": 1}',
    ],
)
def test_what_the_scanner_does_not_take_msgspec_reads(tmp_path, monkeypatch, raw):
    """Each of these makes the scanner give up the chunk: the reader's result
    is then msgspec's, records that msgspec cannot read counted."""
    path = events_file(tmp_path / "rank-0.json", [x("a", 1.0), x("b", 2.0)], raw)
    assert fastjson.scan(path.read_bytes(), *_array(path.read_bytes())) is None
    (table, problems), (expected, expected_problems) = both(path, monkeypatch)
    assert table.equals(expected) and problems == expected_problems
    assert table.num_rows >= 2


@needs_scanner
def test_an_open_ended_scan_finds_where_the_array_ends():
    """The last chunk is scanned up to the array's ``]`` (the rest of the
    document after it), whose place the scanner gives: msgspec then decodes
    only the document around the array. A chunk cut before its ``]`` is
    not taken (the reader then decodes it as before)."""
    records = (
        b'{"ph": "X", "name": "a]", "ts": 1, "dur": 2}, {"ph": "X", "name": "b", "ts": 3, "dur": 1}'
    )
    doc = b'{"traceEvents": [' + records + b' ], "distributedInfo": {"rank": 3}, "x": [1]}'
    begin = doc.index(b"{", 1)
    scanned = fastjson.scan(doc, begin, None, False, open_ended=True)
    assert scanned.rows == 2 and scanned.strings["names"].to_pylist() == ["a]", "b"]
    assert scanned.array_end == doc.index(b" ]") + 1
    assert fastjson.scan(doc[: doc.index(b" ]")], begin, None, False, open_ended=True) is None
    assert (
        fastjson.scan(doc, begin, None, False) is None
    )  # not open-ended: the whole must be records


@needs_scanner
@pytest.mark.parametrize("last", ["nested", "garbled"])
def test_the_last_chunk_cut_inside_a_record_or_damaged_reads_as_msgspec_reads_it(
    tmp_path, monkeypatch, last
):
    """The last chunk scanned up to the array's end: where the last cut
    falls inside a nested value that holds the records' separator (so the
    scan begins inside a record and stops at an inner ``]``), or the last
    chunk is damaged, the reader takes the way it took before and gives
    what msgspec alone gives."""
    inner = ",\n  ".join(f'{{"k": {i}}}' for i in range(200))
    nested = x("last", 9000.0) | {"args": "ARGS"}
    raw = json.dumps(nested).replace('"ARGS"', f'{{"list": [{inner}]}}')
    if last == "garbled":
        raw = raw.replace('"ph": "X"', '"ph": \x07 "X"')
    path = events_file(tmp_path / "rank-0.json", [x(f"op{i}", 10.0 * i) for i in range(300)], raw)
    monkeypatch.setattr(jsonrecords, "CHUNK_BYTES", 512)
    (table, problems), (expected, expected_problems) = both(path, monkeypatch)
    assert table.equals(expected) and problems == expected_problems
    assert table.num_rows == 300 + (last == "nested")


@needs_scanner
@needs_fixtures
def test_a_damaged_chunk_costs_only_its_bad_record(tmp_path, monkeypatch):
    """In chunks of 64 KiB, garbage in one chunk sends that chunk to msgspec
    (one record lost and named) and the scanner reads every other."""
    name = "kineto-hta-nccl-ws2-a100-rank0/rank-0.json.gz"
    monkeypatch.setattr(jsonrecords, "CHUNK_BYTES", 1 << 16)
    path = garbled_copy(name, tmp_path / "rank-0.json", 1 / 3)
    (expected, expected_problems) = both(path, monkeypatch)[1]
    monkeypatch.setenv("DDLC_JSON_SCANNER", "c")
    scans, scan = [], fastjson.scan
    monkeypatch.setattr(fastjson, "scan", lambda *a, **k: scans.append(s := scan(*a, **k)) or s)
    table, problems = kineto.KinetoReader().read(path, RULES, "r1")
    assert table.equals(expected) and [str(p) for p in problems] == expected_problems
    assert len(problems) == 1 and "1 record(s) could not be read" in problems[0]
    assert sum(s is None for s in scans) == 1 and len(scans) > 10


@needs_scanner
@pytest.mark.parametrize("seed", range(6))
def test_nesting_in_c_is_the_numpy_nesting(seed, monkeypatch):
    """traces.nesting.enclosing gives the same parents with the C stack as
    with numpy alone: nested, overlapping, tied and empty intervals."""
    rng = np.random.default_rng(seed)
    n = 20_000
    group = rng.integers(0, 1 + seed * 7, n)
    start = rng.integers(0, 10 ** (2 + seed % 3), n)
    end = start + rng.choice([0, 0, 1, 5, 50, 500], n) * rng.integers(0, 3, n)
    fast = nesting.enclosing(group, start, end)
    monkeypatch.setenv("DDLC_JSON_SCANNER", "msgspec")
    slow = nesting.enclosing(group, start, end)
    assert np.array_equal(fast, slow)
    assert (fast >= 0).sum() > n // 10


@needs_scanner
@pytest.mark.parametrize("seed", range(3))
def test_depths_in_c_are_the_pointer_jumping(seed, monkeypatch):
    """traces.nesting.depths in one C pass gives numpy's depths, parents
    before or after their rows; parents in a cycle are left to numpy."""
    rng = np.random.default_rng(seed)
    n = 30_000
    parent = np.where(rng.random(n) < 0.1, -1, rng.integers(0, n, n) % np.maximum(np.arange(n), 1))
    parent[0] = -1
    rows = rng.permutation(n)  # the same forest, its rows in another order
    moved = np.full(n, -1)
    moved[rows] = np.where(parent >= 0, rows[np.maximum(parent, 0)], -1)
    for forest in (parent, moved):
        fast = nesting.depths(forest)
        monkeypatch.setenv("DDLC_JSON_SCANNER", "msgspec")
        slow = nesting.depths(forest)
        monkeypatch.delenv("DDLC_JSON_SCANNER")
        assert np.array_equal(fast, slow) and fast.max() > 5
    assert fastjson.depths(np.array([1, 2, 0, -1])) is None


@pytest.mark.parametrize("ties", [0, 1, 30])
def test_nesting_order_is_the_lexsort_of_key_then_longest_first(ties):
    """traces.nesting sorts by a stable sort of the key, then the tied rows
    again: the order np.lexsort((-end, key)) gives, ties (equal key and
    end) in row order; rows in interleaved runs, as a trace's threads."""
    rng = np.random.default_rng(ties)
    n = 50_000
    tied = np.sort(rng.integers(0, 10**9, n // 7 + 1)).repeat(7)[:n]  # 7 rows a key
    key = tied if ties else np.cumsum(rng.integers(1, 9, n))
    key = key.reshape(-1, 5).T.ravel()  # five interleaved runs
    end = key + rng.integers(0, max(ties, 1), n)
    order = nesting._by_key_longest_first(key, end)
    assert np.array_equal(order, np.lexsort((-end, key)))
    assert (np.diff(key[order]) == 0).any() == bool(ties)


@pytest.mark.parametrize("seed", range(4))
def test_text_columns_are_dictionaries_of_the_names_arrow_takes(seed):
    """The table's text columns, dictionaries of codes and names, hold what
    Arrow's take of the names gives: names of any length and script,
    repeated names (one value in the dictionary), nulls for code -1 and
    for names that are None; codes of any integer type."""
    rng = np.random.default_rng(seed)
    names = [
        "",
        "a",
        "caf\u00e9 \u2192 \U0001f600",
        None,
        "a",
        *(f"region{i}" * i for i in range(40)),
    ]
    for dtype in (np.int8, np.int32, np.int64):
        codes = rng.integers(-1, len(names), int(rng.integers(0, 5000))).astype(dtype)
        built = table._dictionary(table._distinct(names), codes)
        expected = pc.take(
            pa.array([*names, None], pa.string()), np.where(codes < 0, len(names), codes)
        )
        assert built.validate(full=True) is None and built.type == table.TEXT
        assert built.cast(pa.string()).equals(expected)
        assert built.null_count == expected.null_count  # a mask: null tests see them
        assert len(set(built.dictionary.to_pylist())) == len(built.dictionary)
    with pytest.raises(IndexError):  # no such name
        table._dictionary(table._distinct(["a"]), np.array([0, 1]))


@pytest.mark.parametrize("seed", range(3))
def test_text_columns_read_through_another_row(seed):
    """``via``: row i holds the name of row via[i]'s code (a parent's
    region), null where via is -1 or that code is."""
    rng = np.random.default_rng(seed)
    names = ["user:step", None, "MPI_Allreduce", "x" * 40, "user:step"]
    codes = rng.integers(-1, len(names), 3000).astype(np.int32)
    via = rng.integers(-1, len(codes), 3000)
    built = table._dictionary(table._distinct(names), codes, via)
    through = np.where(via >= 0, codes[np.maximum(via, 0)], -1)
    expected = pc.take(
        pa.array([*names, None], pa.string()), np.where(through < 0, len(names), through)
    )
    assert built.validate(full=True) is None and built.cast(pa.string()).equals(expected)


def test_one_value_columns_are_a_dictionary_of_one_name():
    zeros = table.from_numpy(np.zeros(5, dtype=np.int32))
    built, other = table._one_value("r1", zeros), table._one_value("otf2", zeros)
    assert built.type == table.TEXT and built.dictionary.to_pylist() == ["r1"]
    assert built.to_pylist() == ["r1"] * 5 and other.to_pylist() == ["otf2"] * 5


@pytest.mark.parametrize("low, high", [(0, 8), (3, 12), (-2, 5), (70_000, 70_040), (0, 90_000)])
def test_instances_numbered_by_rank_as_by_searching_their_ranks(low, high):
    """op_id by rank (an OTF2 archive's): the rows of smaller ranks, then
    the instance's place among its rank's by time; ranks counted (a radix
    sort where they fit 16 bits) give what sorting and searching them gave."""
    rng = np.random.default_rng(low + high)
    rank = np.sort(rng.integers(low, high, 5000)).astype(np.int32)
    order = rng.permutation(5000)[:700]  # the instances, by time
    by_rank = order[np.argsort(rank[order], kind="stable")]
    ranks = rank[by_rank].astype(np.int64)
    rows_of_rank = np.bincount(rank - rank.min())
    rows_below = (np.cumsum(rows_of_rank) - rows_of_rank)[ranks - rank.min()]
    expected = np.empty(5000, dtype=np.int64)
    expected[by_rank] = rows_below + np.arange(by_rank.size) - np.searchsorted(ranks, ranks)
    assert (table._numbered_by_rank(rank, order) == expected[order]).all()


def random_tree(rng, n: int, parents_first: bool):
    """(parent, depth) of n rows nested at random, parents before their rows
    (or after them: rows in the order their intervals end)."""
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int32)
    for i in range(1, n):
        if rng.random() < 0.8:
            parent[i] = rng.integers(0, i)
            depth[i] = depth[parent[i]] + 1
    if parents_first:
        return parent, depth
    back = n - 1 - np.arange(n)  # row i becomes row n - 1 - i
    return np.where(parent >= 0, back[np.maximum(parent, 0)], -1)[back], depth[back]


@needs_scanner
@pytest.mark.parametrize("seed", range(4))
def test_values_passed_down_in_c_as_level_by_level(seed, monkeypatch):
    """traces.table passes phases, steps and op ids down the nesting in one
    C pass where every parent comes before its rows or every one after
    them, with the same values as level by level in numpy; where neither
    (or a depth is not its parent's plus one) it goes level by level."""
    rng = np.random.default_rng(seed)
    for parents_first in (True, False):
        parent, depth = random_tree(rng, 5000, parents_first)
        assert fastjson.nesting_order(parent, depth) == (1 if parents_first else -1)
        for dtype, missing in ((np.int8, -1), (np.int64, table.NULL)):
            values = np.where(rng.random(5000) < 0.3, rng.integers(0, 9, 5000), missing)
            fast, slow = values.astype(dtype), values.astype(dtype)
            table._Nesting(parent, depth).inherit(fast, missing)
            table._inherit(slow, parent, table._levels(parent, depth), missing)
            assert np.array_equal(fast, slow)
    mixed = np.array([-1, 2, -1, 0], dtype=np.int64)  # one parent before, one after
    assert fastjson.nesting_order(mixed, np.array([0, 1, 0, 1], dtype=np.int32)) == 0
    skewed = np.array([-1, 0], dtype=np.int64)  # a depth two below its parent
    assert fastjson.nesting_order(skewed, np.array([0, 2], dtype=np.int64)) == 0
    monkeypatch.setenv("DDLC_JSON_SCANNER", "msgspec")
    assert table._Nesting(parent, depth).order == 0


@needs_scanner
@pytest.mark.parametrize("seed", range(4))
def test_phases_of_communication_in_c_as_in_numpy(seed):
    """traces.table's communication by context (each nest of communication
    takes the phase of the code around it, a broadcast outside any phase
    init) gives the same phases in one C pass as in numpy's passes."""
    rng = np.random.default_rng(seed)
    comm = [table._PHASE["grad_comm"], table._PHASE["other_comm"]]
    for parents_first in (True, False):
        parent, depth = random_tree(rng, 5000, parents_first)
        phases = rng.integers(0, len(table._PHASE_NAMES), 5000)
        phase = np.where(rng.random(5000) < 0.5, rng.choice(comm, 5000), phases).astype(np.int8)
        collective = rng.integers(-1, 3, 5000).astype(np.int32)
        for bcast in (-2, 1):
            fast, slow = phase.copy(), phase.copy()
            tree = table._Nesting(parent, depth)
            assert tree.order
            table._communication_by_context(fast, tree, collective, bcast)
            tree.order = 0  # numpy's passes
            table._communication_by_context(slow, tree, collective, bcast)
            assert np.array_equal(fast, slow) and (fast != phase).any()
            assert (fast == table._PHASE["init"]).sum() > (phase == table._PHASE["init"]).sum()


@needs_scanner
@pytest.mark.parametrize("seed", range(3))
def test_outermost_in_c_is_the_numpy_walk(seed, monkeypatch):
    """traces.nesting.outermost (collective instances: each collective row's
    outermost collective ancestor) gives the same rows in C as in numpy."""
    rng = np.random.default_rng(seed)
    parent, _ = random_tree(rng, 5000, parents_first=bool(seed % 2))
    marked = rng.random(5000) < 0.3
    rows = np.flatnonzero(marked)
    fast = nesting.outermost(parent, marked, rows)
    monkeypatch.setenv("DDLC_JSON_SCANNER", "msgspec")
    slow = nesting.outermost(parent, marked, rows)
    assert np.array_equal(fast, slow) and (fast != rows).any()


def test_kineto_times_are_exact_nanoseconds_from_the_text(tmp_path, monkeypatch):
    """At today's epoch times a double holds only 0.25 us steps: 130 ns
    after a parent's start rounds to 250, past the parent's end. From the
    text of the number, both engines give the exact nanoseconds, and so the
    right parent and depth (a double made B top level and C B's child at
    depth 1)."""
    base = 1_700_000_000_000_000  # microseconds since 1970 (November 2023)
    raw = [
        '{"ph": "X", "cat": "cpu_op", "name": "A", "pid": 1, "tid": 2, '
        f'"ts": {base}.000, "dur": 0.240}}',
        f'{{"ph": "X", "cat": "cpu_op", "name": "B", "pid": 1, "tid": 2, "ts": {base}.130, '
        '"dur": 0.100}',
        f'{{"ph": "X", "cat": "cpu_op", "name": "C", "pid": 1, "tid": 2, "ts": {base}.140, '
        '"dur": 5e-2}',
    ]
    path = events_file(tmp_path / "t.json", [], ",\n".join(raw))
    ns = base * 1000
    for read, problems in both(path, monkeypatch):
        rows = read.to_pandas().set_index("region")
        assert problems == []
        assert rows["start_ns"].to_dict() == {"A": ns, "B": ns + 130, "C": ns + 140}
        assert rows["dur_ns"].to_dict() == {"A": 240, "B": 100, "C": 50}
        assert rows["parent"].isna()["A"] and rows["parent"][["B", "C"]].tolist() == ["A", "B"]
        assert rows["depth"].to_dict() == {"A": 0, "B": 1, "C": 2}


@needs_scanner
def test_scanner_nanoseconds_round_half_to_even_as_python_does(tmp_path, monkeypatch):
    """Below the nanosecond, beyond int64 and in exponent form the scanner
    gives what the Python reader gives (a Decimal of the text)."""
    texts = ["1.0005", "1.0015", "1.00150001", "-2.0025", "0.0004", "12e-3", "1.5E2", "9.3e15"]
    # the plain form's one-pass reading, and the edges where it hands over
    texts += ["1700000000000.125", "-0", "0.5", "-7.25", "9199999999999999.999"]
    texts += ["9223372036854775.807", "12345678901234567", "0.0001", "3.1415", "10"]
    events = ",\n".join(
        f'{{"ph": "X", "name": "e{i}", "pid": 1, "tid": 2, "ts": {t}, "dur": 1}}'
        for i, t in enumerate(texts)
    )
    scanned = fastjson.scan(("[" + events + "]").encode())
    assert scanned is not None
    expected = [kineto.ns_of_number(kineto.Decimal(t)) for t in texts]
    assert scanned.columns["ts"].tolist() == expected
    assert expected[:7] == [1000, 1002, 1002, -2002, 0, 12, 150_000]
    assert expected[7] == expected[13] == fastjson.NO_TIME
    assert expected[8:13] == [1_700_000_000_000_125, 0, 500, -7250, 9_199_999_999_999_999_999]


@needs_scanner
def test_keys_like_ours_are_not_ours(tmp_path, monkeypatch):
    """The scanner tells a record's keys (and its args') by their first
    letter and one comparison: keys that begin or end like ours, ours
    escaped, and ours where the chunk ends give msgspec's table."""
    events = [
        {**x("a", 1.0), "phase": "M", "p": 1, "names": "n", "ts2": 9, "tid_": 3, "durs": 1},
        {**x("b", 2.0), "cats": None, "ar": {}, "args2": {"correlation": "c"}, "t": 1, "d": 0},
        {**x("c", 3.0), "args": {"correlations": "c", "External": "e", "External id2": "x"}},
        {**x("d", 4.0), "args": {"correlation": 7, "External id": 8, "E": 1, "c": 2}},
        # keys not ours read in one comparison (a flow event's, a kernel's),
        # and keys like them
        {**x("g", 5.0), "id": 3, "bp": "e", "i": 1, "b": 2, "ids": [], "bpx": {}},
        {**x("h", 6.0), "args": {"stream": 7, "s": 1, "streams": 2, "stream id": "x"}},
    ]
    raw = '{"ts": 5, "dur": 1, "p\\/h": "M", "name": "e", "ph": "X"}'  # escaped: falls back
    for last in ('{"ph":"X","ts":6}', '{"ts":6,"ph":"X","name":"f","pid":1,"tid":2,"dur":1}'):
        monkeypatch.delenv("DDLC_JSON_SCANNER", raising=False)  # both() set it
        path = events_file(tmp_path / "rank-1.json", events, last)
        data = path.read_bytes()
        assert fastjson.scan(data, *_array(data)) is not None
        (table, problems), (expected, expected_problems) = both(path, monkeypatch)
        assert table.equals(expected) and problems == expected_problems
        assert table.num_rows == 7
    monkeypatch.delenv("DDLC_JSON_SCANNER")
    path = events_file(tmp_path / "rank-1.json", events, raw)
    data = path.read_bytes()
    assert fastjson.scan(data, *_array(data)) is None
    (table, problems), (expected, expected_problems) = both(path, monkeypatch)
    assert table.equals(expected) and problems == expected_problems
