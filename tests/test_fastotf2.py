"""The C reader of OTF2 events (traces/fastotf2) gives exactly the Python
reader's table: on every real OTF2 fixture, on our own archives, and on an
archive made of the awkward cases (overlapping regions, unmatched Enter and
Leave, non-blocking MPI messages, a collective's bytes, a clock that does not
tick in nanoseconds, a metric location)."""

import json
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import one_rank_part
from test_traces_readers import FIXTURES, needs_fixtures, otf2_copy
from traces import convert, fastotf2
from frameworks.otf2_writer import write_archive
from traces.readers import otf2_reader
from traces.rules import PhaseRules
from runfiles.tables import plain_text

RULES = PhaseRules()
ORDER = ["rank", "location", "start_ns", "end_ns", "depth", "region"]


def both_readers(anchor: Path):
    """The tables of both readers, rows in one order, and their problems."""
    out = {}
    for engine in ("fastotf2", "python"):
        table, problems = otf2_reader.read(anchor, RULES, "r1", engine=engine)
        assert table.schema.metadata[otf2_reader.META_READER] == engine.encode()
        # the values: each reader's dictionaries may hold names no row uses
        df = plain_text(table).to_pandas()
        df = df.sort_values(ORDER, kind="stable").reset_index(drop=True)
        out[engine] = (df, problems)
    return out["fastotf2"], out["python"]


def assert_same(anchor: Path):
    (fast, fast_problems), (slow, slow_problems) = both_readers(anchor)
    assert len(fast) == len(slow) > 0
    for column in slow.columns:
        assert fast[column].equals(slow[column]), column
    assert fast_problems == slow_problems
    return fast, fast_problems


def test_the_c_reader_builds():
    assert fastotf2.library() is not None, fastotf2.why_unavailable()
    assert fastotf2.library_path().is_file()


@needs_fixtures
@pytest.mark.parametrize(
    "name", ["pipit-ping-pong-otf2", "scorep-8.4-horovod-torch-mpi-np2", "fastotf2-simple-mi300"]
)
def test_same_table_as_the_python_reader_on_real_traces(name):
    df, _ = assert_same(FIXTURES / name / "traces.otf2")
    assert df["phase"].notna().all()


def test_same_table_on_our_own_archive(tmp_path):
    part = one_rank_part(
        intervals=[
            ("data_load", 1, 0, 10, 20),
            ("forward", 1, 0, 20, 40),
            ("backward", 1, 0, 40, 70),
            ("optimizer", 1, 0, 70, 80),
        ],
        collectives=[("allreduce", 4096, 45, 90), ("allreduce", 512, 50, 60)],
    )
    df, problems = assert_same(write_archive([part], tmp_path / "trace"))
    assert problems == [] and len(df) == 7
    assert sorted(df.loc[df["collective"] == "allreduce", "bytes"]) == [512, 4096]
    assert set(df["step"]) == {0}


def awkward_archive(folder: Path) -> Path:
    import otf2
    from otf2.enums import CollectiveOp, GroupType, LocationType, Paradigm, Type

    with otf2.writer.open(str(folder), "traces", timer_resolution=1_000_000) as trace:
        defs = trace.definitions
        machine = defs.system_tree_node("machine", class_name="machine")
        node = defs.system_tree_node("n1", class_name="node", parent=machine)
        region = {
            name: defs.region(name)
            for name in (
                "step",
                "user:forward",
                "MPI_Isend",
                "MPI_Irecv",
                "MPI_Allreduce",
                "X",
                "Y",
                "Z",
                "W",
                "cudaMemcpyHtoD",
            )
        }
        step, epoch = (
            defs.attribute("step", "", Type.INT64),
            defs.attribute("epoch", "", Type.INT64),
        )
        masters = []
        for rank in (0, 1):
            group = defs.location_group(f"MPI Rank {rank}", system_tree_parent=node)
            defs.location("metrics", type=LocationType.METRIC, group=group)
            masters.append(defs.location("Master thread", group=group))
        defs.group(
            "locations", group_type=GroupType.COMM_LOCATIONS, paradigm=Paradigm.MPI, members=masters
        )
        world = defs.group(
            "world", group_type=GroupType.COMM_GROUP, paradigm=Paradigm.MPI, members=[0, 1]
        )
        comm = defs.comm("world", group=world)
        for rank, location in enumerate(masters):
            w, t = trace.event_writer_from_location(location), 1_000_000 + 3 * rank
            w.mpi_send(t - 1, 1 - rank, comm, 0, 64)  # outside any region: counted
            w.enter(t, region["step"], attributes={step: 4, epoch: 1})
            w.enter(t + 1, region["user:forward"])
            w.enter(t + 2, region["MPI_Isend"])
            w.mpi_isend(t + 3, 1 - rank, comm, 0, 4096, 7)
            w.mpi_isend(t + 3, 1 - rank, comm, 0, 100, 8)
            w.leave(t + 4, region["MPI_Isend"])
            w.enter(t + 5, region["MPI_Irecv"])
            w.mpi_irecv(t + 6, 1 - rank, comm, 0, 1024, 9)
            w.leave(t + 7, region["MPI_Irecv"])
            w.enter(t + 8, region["MPI_Allreduce"])
            w.mpi_collective_begin(t + 9)
            w.mpi_collective_end(t + 10, CollectiveOp.ALLREDUCE, comm, 0xFFFFFFFF, 10, 20)
            w.leave(t + 11, region["MPI_Allreduce"])
            w.enter(t + 12, region["cudaMemcpyHtoD"], attributes={epoch: 3})
            w.leave(t + 13, region["cudaMemcpyHtoD"])
            w.leave(t + 14, region["user:forward"])
            w.leave(t + 15, region["step"])
            w.enter(t + 20, region["X"], attributes={step: -1})
            w.enter(t + 21, region["Y"])
            w.leave(t + 22, region["X"])  # X and Y overlap without nesting
            w.leave(t + 23, region["Y"])
            w.leave(t + 24, region["Z"])  # never entered
            w.enter(t + 30, region["W"])  # never left
    return folder / "traces.otf2"


def test_same_table_on_awkward_cases(tmp_path):
    df, problems = assert_same(awkward_archive(tmp_path / "awkward"))
    assert len(df) == 2 * 8
    assert [p.split(": ", 1)[1].split(" ")[0] for p in problems] == ["2", "2", "2", "2"]
    assert "2 MPI message or collective records outside any region" in problems[3]
    assert [p.lost for p in problems] == [True, True, False, False]
    assert set(df.loc[df["region"] == "MPI_Isend", "bytes"]) == {4196}
    assert set(df.loc[df["region"] == "MPI_Irecv", "bytes"]) == {1024}
    allreduce = df[df["region"] == "MPI_Allreduce"]
    assert set(allreduce["bytes"]) == {20} and set(allreduce["collective"]) == {"allreduce"}
    assert set(df.loc[df["depth"] == 2, "step"]) == {4}
    # microsecond ticks become nanoseconds
    assert set(df.loc[df["region"] == "MPI_Isend", "dur_ns"]) == {2000}


@needs_fixtures
def test_converter_uses_and_records_the_c_reader(tmp_path, monkeypatch):
    out = tmp_path / "phases.parquet"
    assert convert.main([str(FIXTURES / "pipit-ping-pong-otf2"), "-o", str(out)]) == 0
    sources = json.loads(convert.metadata_of(out)[b"ddlcompare.sources"])
    assert [s["reader"] for s in sources] == ["fastotf2"]
    monkeypatch.setenv(otf2_reader.READER_ENV, "python")
    assert convert.main([str(FIXTURES / "pipit-ping-pong-otf2"), "-o", str(out)]) == 0
    sources = json.loads(convert.metadata_of(out)[b"ddlcompare.sources"])
    assert [s["reader"] for s in sources] == ["python"]
    assert pq.read_table(out).num_rows == 42


@needs_fixtures
def test_converted_a_group_of_ranks_at_a_time(tmp_path, monkeypatch):
    """Part by part (here one rank a part), the file holds the same rows as
    the whole table, one row group per part, and the analysis can read one
    rank's row group and a few columns only."""
    anchor = FIXTURES / "scorep-8.4-horovod-torch-mpi-np2" / "traces.otf2"
    whole, _ = otf2_reader.read(anchor, RULES, "r1")
    monkeypatch.setattr(otf2_reader, "PART_EVENTS", 1)
    monkeypatch.setattr(otf2_reader, "PART_LOCATIONS", 1)
    out = tmp_path / "phases.parquet"
    assert convert.main([str(anchor), "-o", str(out), "--run-id", "r1"]) == 0
    assert pq.ParquetFile(out).num_row_groups == 2
    parts = pq.read_table(out).to_pandas().sort_values(ORDER, kind="stable")
    expected = whole.to_pandas().sort_values(ORDER, kind="stable")
    for column in ("rank", "region", "phase", "step", "collective", "bytes", "parent"):
        assert (
            parts[column].astype(object).fillna("-").tolist()
            == expected[column].astype(object).fillna("-").tolist()
        ), column
    one = pq.read_table(out, columns=["rank", "phase", "dur_ns"], filters=[("rank", "=", 1)])
    assert one.num_rows == (expected["rank"] == 1).sum() and one.num_columns == 3


def test_the_table_does_not_depend_on_how_the_ranks_are_grouped(tmp_path, monkeypatch):
    """op_id and the rows' order are the same whether an archive is read in
    one part or a part per rank (a real archive of 3 ranks with collectives
    on each), and the Python reader (one part) gives that table too."""
    anchor = Path(__file__).parent / "data/real-traces/scorep-8.4-mpi-pthread-np3/traces.otf2"
    tables = []
    for engine, part_events in (("fastotf2", 10**9), ("fastotf2", 1), ("python", 1)):
        monkeypatch.setattr(otf2_reader, "PART_EVENTS", part_events)
        monkeypatch.setattr(otf2_reader, "PART_LOCATIONS", 1)
        monkeypatch.setenv(otf2_reader.READER_ENV, engine)
        out = tmp_path / f"{engine}-{part_events}.parquet"
        assert convert.main([str(anchor), "-o", str(out), "--run-id", "r1"]) == 0
        tables.append(plain_text(pq.read_table(out)))
    assert pq.ParquetFile(tmp_path / "fastotf2-1.parquet").num_row_groups == 3
    assert 0 < tables[0].column("op_id").null_count < tables[0].num_rows
    assert tables[1].equals(tables[0]) and tables[2].equals(tables[0])


def test_a_part_read_while_the_one_before_is_written(tmp_path, monkeypatch):
    """With two cores free (READ_AHEAD), an OTF2 archive's next part is read
    in a thread while the part before is written, and the file holds what
    reading and writing in turn gives: a real archive of 3 ranks, a part
    each."""
    anchor = Path(__file__).parent / "data/real-traces/scorep-8.4-mpi-pthread-np3/traces.otf2"
    monkeypatch.setattr(otf2_reader, "PART_EVENTS", 1)  # a part per rank
    monkeypatch.setattr(convert, "READ_AHEAD", 1)
    rows, sources, errors = convert.write([anchor], tmp_path / "in-turn.parquet", RULES, "r1")
    in_turn = pq.read_table(tmp_path / "in-turn.parquet")
    assert pq.ParquetFile(tmp_path / "in-turn.parquet").num_row_groups == 3

    reads, overlapped = [], []
    next_part_read = threading.Event()
    read_columns, write_table = otf2_reader._read_columns, pq.ParquetWriter.write_table

    def reading(*args, **kwargs):
        reads.append(threading.current_thread() is threading.main_thread())
        if len(reads) > 1:
            next_part_read.set()
        return read_columns(*args, **kwargs)

    def writing(self, table, *args, **kwargs):
        if len(overlapped) < 2:  # the parts with a part after them
            overlapped.append(next_part_read.wait(timeout=20))
            next_part_read.clear()
        return write_table(self, table, *args, **kwargs)

    monkeypatch.setattr(otf2_reader, "_read_columns", reading)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", writing)
    monkeypatch.setattr(convert, "READ_AHEAD", 2)
    ahead = convert.write([anchor], tmp_path / "ahead.parquet", RULES, "r1")
    # the first part read on the caller's thread, the next ones in another
    assert overlapped == [True, True] and reads == [True, False, False]
    assert ahead == (rows, sources, errors) and not errors
    assert pq.read_table(tmp_path / "ahead.parquet").equals(in_turn)


def test_parts_are_small_with_a_location_for_each_thread(monkeypatch):
    """A part is whole ranks, begun anew once it holds PART_EVENTS events
    and PART_LOCATIONS locations (for the C reader's threads): a first part's
    memory is faulted in, the next parts reuse it."""

    def groups(locations_a_rank: int, events_a_location: int) -> list[set]:
        refs = range(4 * locations_a_rank)  # 4 ranks, their locations in turn
        defs = otf2_reader.Definitions(
            locations=[(ref, events_a_location) for ref in refs],
            located={ref: (ref // locations_a_rank, 0, "") for ref in refs},
            attribute_kinds={},
            region_names={},
            context_regions={},
            clock=otf2_reader.Clock(1, 0, 0),
        )
        return otf2_reader._rank_groups(defs)

    monkeypatch.setattr(otf2_reader, "PART_EVENTS", 1000)
    monkeypatch.setattr(otf2_reader, "PART_LOCATIONS", 2)
    # a location a rank: two ranks a part, for the two threads
    assert groups(1, 5000) == [{0, 1}, {2, 3}]
    # two locations a rank: a rank a part
    assert groups(2, 5000) == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    # small ranks: as many as make PART_EVENTS
    assert groups(1, 400) == [{0, 1, 2}, {3}]


@needs_fixtures
def test_same_table_on_apex_whose_definitions_undercount_events():
    """APEX announces 79 events a location and writes thousands: the C reader
    makes room from the files' sizes and still gives the Python reader's table."""
    df, problems = assert_same(FIXTURES / "apex-hpx-test-archive" / "APEX.otf2")
    assert len(df) == 8062 and not any(p.lost for p in problems)


@needs_fixtures
def test_same_table_on_a_broken_rank_file(tmp_path):
    """Garbage in one rank's events: both readers keep that rank's rows up to
    the fault and the other rank whole, and name the location they lost."""
    archive = otf2_copy(tmp_path)
    events = archive / "traces" / "1.evt"
    data = events.read_bytes()
    events.write_bytes(data[: len(data) // 2] + b"\x07" * 64 + data[len(data) // 2 + 64 :])
    (fast, fast_problems), (slow, slow_problems) = both_readers(archive / "traces.otf2")
    assert 0 < len(fast) == len(slow) < 42
    for column in slow.columns:
        assert fast[column].equals(slow[column]), column
    # the same problems; the reasons are the library's words (the C reader
    # also has the library's detail)
    lost = "1 of 2 locations could not be read to their end (MPI Rank 1/Master thread): "
    for problems in (fast_problems, slow_problems):
        assert lost in problems[0] and "INVALID_DATA" in problems[0] and problems[0].lost
    assert fast_problems[1:] == slow_problems[1:]


@needs_fixtures
@pytest.mark.parametrize(
    "anchor", ["scorep-8.4-horovod-torch-mpi-np2/traces.otf2", "apex-hpx-test-archive/APEX.otf2"]
)
def test_same_table_whatever_the_number_of_reading_threads(anchor, monkeypatch):
    """Each reading thread writes into its own stretch of shared columns,
    joined by moving rows down (or copied, where a chunk held more events
    than announced, as APEX's do): the table does not depend on how many
    threads read it."""
    read_intervals = fastotf2.read_intervals
    tables = {}
    for workers in (1, 3):
        monkeypatch.setattr(
            fastotf2, "read_intervals", lambda *a, w=workers: read_intervals(*a, workers=w)
        )
        tables[workers], _ = otf2_reader.read(FIXTURES / anchor, RULES, "r1", engine="fastotf2")
    assert tables[1].num_rows > 0 and tables[3].equals(tables[1])


def sparse_archive(folder: Path) -> Path:
    """One location, 100 steps; its region and attribute refs sparse (the
    forward region's ref 4e9, the step attribute's 3e9), as another writer
    may number its definitions."""
    import otf2
    from otf2.enums import Type

    with otf2.writer.open(str(folder), "traces", timer_resolution=1_000_000_000) as trace:
        defs = trace.definitions
        group = defs.location_group("MPI Rank 0", system_tree_parent=defs.system_tree_node("n1"))
        location = defs.location("Master thread", group=group)
        step = defs.region("step")
        defs._regions._ref = 4_000_000_000 - 1  # the bindings number from the last ref
        forward = defs.region("user:forward")
        defs._attributes._ref = 3_000_000_000 - 1
        number = defs.attribute("step", "", Type.INT64)
        w = trace.event_writer_from_location(location)
        for i in range(100):
            w.enter(1000 + 10 * i, step, attributes={number: i})
            w.enter(1001 + 10 * i, forward)
            w.leave(1008 + 10 * i, forward)
            w.leave(1009 + 10 * i, step)
    return folder / "traces.otf2"


def test_memory_follows_the_definitions_present_not_the_largest_ref(tmp_path):
    """Sparse refs cost the C reader nothing: same table as Python's, in
    the memory of an interpreter (a table by ref would be 30 GiB)."""
    import subprocess
    import sys

    from conftest import REPO
    from test_traces_inputs import PEAK_KIB

    anchor = sparse_archive(tmp_path / "sparse")
    df, problems = assert_same(anchor)
    assert problems == [] and len(df) == 200 and sorted(df["step"].unique()) == list(range(100))
    probe = (
        PEAK_KIB + "import sys; from pathlib import Path; from traces.readers import otf2_reader; "
        "from traces.rules import PhaseRules; "
        "t, _ = otf2_reader.read(Path(sys.argv[1]), PhaseRules(), 'r', engine='fastotf2'); "
        "print(t.num_rows, PEAK())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(anchor)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    rows, peak_kib = map(int, done.stdout.split())
    assert rows == 200 and peak_kib < 400 * 1024


def test_a_region_ending_before_it_begins_is_left_out_by_both_readers(tmp_path):
    """The clock went back inside a region (as a writer other than the OTF2
    library may write it; the library itself refuses to): both readers leave
    it out and count it, and what it held moves up to the region around it."""
    import otf2

    marker = 0x5EED_0000_0000_1023  # a time written once, then moved back
    with otf2.writer.open(str(tmp_path), "traces", timer_resolution=1_000_000_000) as trace:
        defs = trace.definitions
        group = defs.location_group("MPI Rank 0", system_tree_parent=defs.system_tree_node("n1"))
        location = defs.location("Master thread", group=group)
        forward, backwards, mm = (defs.region(n) for n in ("user:forward", "odd", "aten::mm"))
        w = trace.event_writer_from_location(location)
        w.enter(marker - 30, forward)
        w.enter(marker - 10, backwards)
        w.enter(marker - 9, mm)
        w.leave(marker - 8, mm)
        w.leave(marker, backwards)
        w.leave(marker + 10, forward)
    [events] = tmp_path.glob("traces/*.evt")
    data = events.read_bytes()
    assert data.count(marker.to_bytes(8, "little")) == 1
    events.write_bytes(
        data.replace(marker.to_bytes(8, "little"), (marker - 20).to_bytes(8, "little"))
    )
    df, problems = assert_same(tmp_path / "traces.otf2")
    assert sorted(df["region"]) == ["aten::mm", "user:forward"] and (df["dur_ns"] >= 0).all()
    inner = df[df["region"] == "aten::mm"].iloc[0]
    assert inner["parent"] == "user:forward" and inner["depth"] == 1
    [problem] = problems
    assert problem.lost and ": 1 regions that end before they begin" in problem


IN_TREE = Path(__file__).parent / "data" / "real-traces"
# every OTF2 archive of the tests, shared (where present) and in the tree
OTF2_ARCHIVES = {
    p.parent.name: p for folder in (FIXTURES, IN_TREE) for p in sorted(folder.glob("*/*.otf2"))
}


@pytest.mark.parametrize("name", [*OTF2_ARCHIVES, "awkward"])
def test_same_table_with_the_nesting_and_text_in_c_or_numpy(name, monkeypatch, tmp_path):
    """The table's C kernels (traces/fastjson: values passed down the
    nesting, the two-thread check, the text columns) give the table that
    numpy and Arrow give without them, with either event reader."""
    path = awkward_archive(tmp_path / "a") if name == "awkward" else OTF2_ARCHIVES[name]
    for engine in ("fastotf2", "python"):
        tables = {}
        for kernels in ("c", "msgspec"):  # msgspec: no fastjson library
            monkeypatch.setenv("DDLC_JSON_SCANNER", kernels)
            tables[kernels] = otf2_reader.read(path, RULES, "r1", engine=engine)
        (fast, fast_problems), (slow, slow_problems) = tables["c"], tables["msgspec"]
        assert fast.num_rows > 0 and fast.equals(slow, check_metadata=True)
        assert fast_problems == slow_problems


@pytest.mark.parametrize("name", [*OTF2_ARCHIVES, "awkward"])
def test_definitions_read_in_c_are_the_bindings(name, monkeypatch, tmp_path):
    """The global definitions the fast path reads in C (reader.c, no import
    of the ``otf2`` bindings) resolve to what the bindings give: every
    location, its rank, node and name, regions, step attributes, calling
    contexts and clock."""
    path = awkward_archive(tmp_path / "a") if name == "awkward" else OTF2_ARCHIVES[name]
    in_c = otf2_reader._resolved(*fastotf2.definitions(path))
    monkeypatch.setattr(fastotf2, "definitions", lambda path: None)
    assert in_c == otf2_reader._definitions(path)


def test_definitions_that_do_not_resolve_are_left_to_the_bindings(tmp_path):
    """A reference to a definition the archive does not hold (before it),
    a name that is no UTF-8, two definitions of one ref: the C reader's
    records are not taken, and the bindings say what is wrong."""
    records, blob = fastotf2.definitions(awkward_archive(tmp_path / "a"))
    assert otf2_reader._resolved(records, blob)
    first = records["locations"][0]
    broken = [
        {**records, "locations": [(*first[:4], 999, first[5]), *records["locations"][1:]]},
        {**records, "strings": [(0, 0, 2, 0)]},
        {**records, "regions": records["regions"] + records["regions"][:1]},
        {**records, "clocks": []},
    ]
    for changed, text in zip(broken, [blob, b"\xff\xfe", blob, blob]):
        with pytest.raises(otf2_reader.Unresolved):
            otf2_reader._resolved(changed, text)


def test_collective_operations_named_as_the_bindings_name_them():
    import otf2

    for value, name in enumerate(otf2_reader.OPERATIONS):
        assert str(otf2.CollectiveOp(value)).rsplit(".", 1)[-1] == name
