"""Every real trace in the shared fixtures converts, with counts checked
against otf2-print (OTF2) or against the JSON itself; broken traces give a
clear error naming the file."""

import functools
import gzip
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REAL_TRACES, REPO, needs_shared
from runfiles import tables
from traces import convert, jsonrecords, readers
from traces.readers import TraceError
from traces.rules import PhaseRules, RulesError
from traces.table import COLUMNS, NULL, SCHEMA, SCHEMA_VERSION, TEXT, Columns, finish_columns
from runfiles.tables import plain_text

FIXTURES = REAL_TRACES
needs_fixtures = needs_shared()
needs_otf2_print = pytest.mark.skipif(
    shutil.which("otf2-print") is None, reason="otf2-print (Debian otf2-tools) not installed"
)
RULES = PhaseRules()


def read(path: Path):
    table, problems = readers.read(path, RULES, "r1")
    return table.to_pandas(), problems


def besides_unsized(problems: list) -> list:
    """The problems but the count of collectives of unknown size (a trace
    that gives none says so: tests/test_real_traces_more.py)."""
    return [p for p in problems if "without a byte count" not in p]


@functools.cache
def read_fixture(name: str):
    """Large fixtures are read once per test session."""
    return read(FIXTURES / name)


def otf2_print_counts(anchor: Path) -> Counter:
    """(record kind, location) -> count, from otf2-print's event listing."""
    out = subprocess.run(
        ["otf2-print", str(anchor)], capture_output=True, text=True, check=True
    ).stdout
    counts = Counter()
    for line in out.splitlines():
        found = re.match(r"^([A-Z_]+)\s+(\d+)\s+\d+", line)
        if found:
            counts[found.group(1), int(found.group(2))] += 1
    return counts


def leaves_per_location(counts: Counter) -> Counter:
    return Counter({loc: n for (kind, loc), n in counts.items() if kind == "LEAVE"})


def of_kind(counts: Counter, kind: str) -> int:
    """How many records of one kind otf2-print lists, over every location."""
    return sum(n for (k, _), n in counts.items() if k == kind)


def read_beside_otf2_print(fixture: str, anchor: str = "traces.otf2"):
    """A fixture archive as we read it (table, problems), and otf2-print's
    count of its records (the reference)."""
    path = FIXTURES / fixture / anchor
    return *read(path), otf2_print_counts(path)


@needs_fixtures
@needs_otf2_print
def test_scorep_71_ping_pong_matches_otf2_print():
    df, problems, counts = read_beside_otf2_print("pipit-ping-pong-otf2")
    assert problems == []
    assert len(df) == of_kind(counts, "LEAVE") == 42
    assert sorted(df["rank"].unique()) == [0, 1] and set(df["node"]) == {"quartz10"}
    sends, recvs = df[df["region"] == "MPI_Send"], df[df["region"] == "MPI_Recv"]
    assert len(sends) == counts["MPI_SEND", 0] + counts["MPI_SEND", 1] == 16
    assert len(recvs) == 16
    # message sizes from the MpiSend/MpiRecv records, 16 KiB up
    assert sends["bytes"].min() == 16384 and (sends["bytes"] >= 16384).all()
    assert sorted(sends["bytes"]) == sorted(recvs["bytes"])
    assert set(df.loc[df["region"] == "MPI_Init", "phase"]) == {"init"}
    assert (df["dur_ns"] >= 0).all() and (df["end_ns"] - df["start_ns"] == df["dur_ns"]).all()


@needs_fixtures
@needs_otf2_print
def test_scorep_84_horovod_user_regions_become_steps():
    df, problems, counts = read_beside_otf2_print("scorep-8.4-horovod-torch-mpi-np2")
    assert len(df) == of_kind(counts, "LEAVE")
    # Horovod's background thread shares the master thread's location: its
    # MPI_Allreduce regions overlap the user regions without nesting.
    assert any("overlap" in p for p in problems)
    for rank in (0, 1):
        mine = df[(df["rank"] == rank) & df["region"].str.startswith("user:")]
        assert len(mine) == 100 and mine["step"].nunique() == 20
        for _, step in mine.sort_values("start_ns").groupby("step"):
            assert list(step["phase"]) == [
                "data_load",
                "forward",
                "backward",
                "grad_comm",
                "optimizer",
            ]
    allreduce = df[df["region"] == "MPI_Allreduce"]
    ends = of_kind(counts, "MPI_COLLECTIVE_END")
    assert (
        len(allreduce)
        + len(
            df[
                df["region"].str.startswith("MPI_")
                & df["collective"].notna()
                & (df["region"] != "MPI_Allreduce")
            ]
        )
        <= ends
    )
    assert set(allreduce["collective"]) == {"allreduce"}
    assert set(allreduce["phase"]) == {"grad_comm"}
    assert allreduce["bytes"].max() == 824872


@needs_fixtures
@needs_otf2_print
def test_scorep_90_otf2_31_with_metric_locations():
    df, problems, counts = read_beside_otf2_print("fastotf2-simple-mi300")
    assert problems == []
    assert len(df) == of_kind(counts, "LEAVE") == 40
    assert set(df["node"]) == {"faraday.ftpn.ornl.gov"}
    assert df["location"].str.endswith("Master thread").any()
    assert counts["METRIC", 0] == 0  # metric samples sit on their own locations, not read


def timeline_records(path: Path) -> list:
    """The Horovod Timeline's records, by the standard library (the array is
    left open)."""
    return json.loads(path.read_text().rstrip().rstrip(",") + "]")


def kineto_events(path: Path) -> list:
    return json.loads(gzip.open(path).read())["traceEvents"]


TIMELINE = FIXTURES / "horovod-timeline-IgorDavidyuk-cpu3" / "timeline.json"
UNSIZED_TAIL = (
    "; the start-up broadcast of the parameters often has none): their bytes are unknown, not 0"
)


@needs_fixtures
def test_horovod_timeline_unterminated_array():
    text = TIMELINE.read_text()
    assert not text.rstrip().endswith("]")
    records = timeline_records(TIMELINE)
    df, problems = read(TIMELINE)
    # Horovod wrote no shape on its start-up broadcasts: said, not taken as 0
    assert problems == [
        f"{TIMELINE}: 31 collective(s) without a byte count in the trace (31 bcast" + UNSIZED_TAIL
    ]
    pairs = df[df["region"] != "step"]
    ticks = [r for r in records if r.get("ph") == "X" and r["name"].isdigit()]
    assert len(pairs) == sum(r.get("ph") == "E" for r in records) + len(ticks)
    tensors = {r["args"]["name"] for r in records if r.get("name") == "process_name"}
    assert {loc.removeprefix("tensor:") for loc in pairs["location"]} <= tensors
    top = df[df["region"] == "ALLREDUCE"]
    assert len(top) == sum(r.get("name") == "ALLREDUCE" for r in records)
    assert set(top["phase"]) == {"grad_comm"} and set(top["collective"]) == {"allreduce"}
    # the tensor's dtype and shape on the End record give the bytes: [3,3,64,64] float32
    assert (top["bytes"] == 3 * 3 * 64 * 64 * 4).sum() == 498
    # one collective instance per all-reduce: MPI_ALLREDUCE is nested in it
    nested = df[df["region"] == "MPI_ALLREDUCE"]
    assert set(nested["parent"]) == {"ALLREDUCE"} and set(nested["depth"]) == {1}
    assert nested["collective"].isna().all() and nested["op_id"].notna().all()
    assert df["collective"].notna().sum() == len(top) + sum(
        r.get("name") == "BROADCAST" for r in records
    )
    assert df["op_id"].nunique() == df["collective"].notna().sum()


@needs_fixtures
def test_horovod_timeline_steps_and_readiness_ticks():
    records = timeline_records(TIMELINE)
    df, _ = read_fixture("horovod-timeline-IgorDavidyuk-cpu3/timeline.json")
    # steps: the gradient tensors are all-reduced once a step (independent count)
    per_tensor = Counter(r["pid"] for r in records if r.get("name") == "ALLREDUCE")
    steps = df[df["phase"] == "step"]
    assert len(steps) == max(per_tensor.values()) == 498
    assert list(steps["step"]) == list(range(498))
    gradients = df[(df["region"] == "ALLREDUCE") & df["step"].notna()]
    assert len(gradients) >= 10 * 498
    # each step starts at a cycle mark
    cycles = {int(r["ts"]) * 1000 for r in records if r.get("name") == "CYCLE_START"}
    assert set(steps["start_ns"]) <= cycles
    # the readiness ticks of NEGOTIATE_*: one row per tick on its rank
    ticks = Counter(int(r["name"]) for r in records if r.get("ph") == "X")
    ready = df[df["region"] == "rank_ready"]
    assert Counter(ready["rank"]) == ticks and sorted(ticks) == [0, 1, 2]
    assert set(ready["parent"]) <= {"NEGOTIATE_ALLREDUCE", "NEGOTIATE_BROADCAST"}
    assert (ready["dur_ns"] == 0).all()


@needs_fixtures
def test_horovod_timeline_gzipped_and_with_a_bad_record(tmp_path):
    whole, _ = read_fixture("horovod-timeline-IgorDavidyuk-cpu3/timeline.json")
    packed = tmp_path / "timeline.json.gz"
    packed.write_bytes(gzip.compress(TIMELINE.read_bytes()))
    df, problems = read(packed)
    assert len(problems) == 1 and not problems[0].lost and len(df) == len(whole)
    # garbage in place of one record in the middle: every other record is kept
    lines = TIMELINE.read_text().splitlines(keepends=True)
    middle = next(i for i in range(len(lines) // 2, len(lines)) if '"ph": "i"' in lines[i])
    lines[middle] = '{"ph": "i", "name": \x00\x07 garbage,\n'
    broken = tmp_path / "broken.json"
    broken.write_text("".join(lines))
    df, problems = read(broken)
    assert len(df) == len(whole)  # a cycle mark is no row
    lost = [p for p in problems if p.lost]
    assert len(lost) == 1 and "1 record(s)" in lost[0]
    out = tmp_path / "phases.parquet"
    assert convert.main([str(broken), "-o", str(out)]) == 1
    assert convert.errors_of(convert.metadata_of(out)) == lost


@needs_fixtures
@pytest.mark.parametrize(
    "name,steps",
    [
        ("kineto-hta-ddp-ws2-v100-rank1/rank-1.json.gz", 5),
        ("kineto-tb-resnet50-numworkers0/worker0.pt.trace.json.gz", 6),
        ("kineto-hta-nccl-ws2-a100-rank0/rank-0.json.gz", 3),
        ("kineto-hta-sampled-ws128-rank0-1/rank-0.json.gz", 2),
        ("kineto-hta-sampled-ws128-rank0-1/rank-1.json.gz", 2),
    ],
)
def test_kineto_old_and_new_schema(name, steps):
    path = FIXTURES / name
    doc = json.loads(gzip.open(path).read())
    df, problems = read_fixture(name)
    df = df.copy()
    assert besides_unsized(problems) == []
    assert len(df) == sum(e.get("ph") == "X" for e in doc["traceEvents"])
    assert df["region"].str.startswith("ProfilerStep#").sum() == steps
    assert set(df.loc[df["region"].str.startswith("ProfilerStep#"), "phase"]) == {"step"}
    assert df["step"].nunique() == steps
    assert set(df.loc[df["region"].str.startswith("Optimizer.step"), "phase"]) == {"optimizer"}
    assert set(df.loc[df["region"].str.contains("zero_grad"), "phase"]) <= {"backward"}
    rank = doc.get("distributedInfo", {}).get("rank", 0)
    assert set(df["rank"]) == {rank}
    # the model's forward is found in every trace: annotated or by its place
    assert (df["phase"] == "forward").sum() > 0.05 * len(df)
    kernels = df[
        df["region"].str.contains("backward", case=False)
        & (df["depth"] > 0)
        & df["parent"].str.startswith("cuda", na=False)
    ]
    if name.startswith(("kineto-hta-ddp", "kineto-tb")):
        # a GPU kernel takes the phase of the code that launched it
        assert len(kernels) and (kernels["phase"] == "backward").mean() > 0.9


@needs_fixtures
def test_kineto_read_in_chunks_gives_the_whole_table(tmp_path, monkeypatch):
    """Kineto's events are decoded a chunk at a time: in chunks of 64 KiB a
    real trace gives the table it gives in one, and garbage in one chunk
    costs that one record, not its chunk."""
    name = "kineto-hta-nccl-ws2-a100-rank0/rank-0.json.gz"
    whole, _ = read_fixture(name)
    monkeypatch.setattr(jsonrecords, "CHUNK_BYTES", 1 << 16)
    df, problems = read(FIXTURES / name)
    assert problems == [] and df.equals(whole)
    assert_one_record_lost(garbled_copy(name, tmp_path / "rank-0.json", 1 / 3), whole)


def garbled_copy(name: str, dest: Path, where: float) -> Path:
    """The fixture's JSON with garbage in one event's ``ph``, ``where``
    (a fraction) into the text."""
    text = gzip.open(FIXTURES / name).read().decode()
    at = text.index('"ph": "X"', int(len(text) * where))
    dest.write_text(text[:at] + '"ph": \x07\x07 "X"' + text[at + 9 :])
    return dest


def assert_one_record_lost(path: Path, whole) -> None:
    df, problems = read(path)
    assert len(df) == len(whole) - 1
    assert len(problems) == 1 and "1 record(s) could not be read" in problems[0]


@needs_fixtures
def test_kineto_nccl_allreduce_is_one_instance_per_collective():
    name = "kineto-hta-ddp-ws2-v100-rank1/rank-1.json.gz"
    df, _ = read_fixture(name)
    events = kineto_events(FIXTURES / name)
    calls = sum(e.get("name") == "c10d::allreduce_" for e in events)
    nccl = df[
        df["region"].str.startswith(("c10d::allreduce_", "nccl:all_reduce", "ncclKernel_AllReduce"))
    ]
    assert len(nccl) == 3 * calls == 3 * 2020
    assert set(nccl["phase"]) == {"grad_comm"}
    instances = df[df["collective"].notna()]
    assert len(instances) == calls and set(instances["collective"]) == {"allreduce"}
    assert set(instances["region"]) == {"c10d::allreduce_"}
    # the NCCL record and the kernel are linked to their instance
    assert nccl["op_id"].notna().all() and nccl["op_id"].nunique() == calls


@needs_fixtures
def test_kineto_collective_bytes_dtypes_and_names():
    name = "kineto-hta-nccl-ws2-a100-rank0/rank-0.json.gz"
    df, _ = read_fixture(name)
    # independent count: one record_param_comms per real collective
    size = {"Float": 4, "Long": 8, "Byte": 1}
    expected = Counter()
    calls = Counter()
    for e in kineto_events(FIXTURES / name):
        args = e.get("args", {})
        if e.get("name") == "record_param_comms" and args.get("Collective name") != "wait":
            op = {"broadcast": "bcast"}.get(args["Collective name"], args["Collective name"])
            expected[op] += args["In msg nelems"] * size[args["dtype"]]
            calls[op] += 1
    assert expected == {"allreduce": 306_684_384, "bcast": 638_712}
    instances = df[df["collective"].notna()]
    assert Counter(instances["collective"]) == calls == {"allreduce": 15, "bcast": 6}
    assert instances.groupby("collective")["bytes"].sum().to_dict() == expected
    assert "wait" not in set(instances["collective"])
    # HTA-style annotations
    for phase in ("forward", "backward", "optimizer"):
        assert set(df.loc[df["region"] == f"## {phase} ##", "phase"]) == {phase}
    sampled, _ = read_fixture("kineto-hta-sampled-ws128-rank0-1/rank-0.json.gz")
    assert {"all_to_all", "allgather", "allreduce"} <= set(sampled["collective"].dropna())
    assert set(sampled.loc[sampled["region"] == "## data_load ##", "phase"]) == {"data_load"}


@needs_fixtures
def test_kineto_steps_from_the_optimizer_without_profiler_steps(tmp_path):
    name = "kineto-tb-resnet50-numworkers0/worker0.pt.trace.json.gz"
    doc = json.loads(gzip.open(FIXTURES / name).read())
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    path = tmp_path / "worker0.pt.trace.json"
    path.write_text(json.dumps(doc))
    df, _ = read(path)
    optimizer_steps = sum(
        str(e.get("name")).startswith("Optimizer.step#") for e in doc["traceEvents"]
    )
    assert df["step"].nunique() == optimizer_steps == 6
    opt = df[df["region"].str.startswith("Optimizer.step#")]
    assert sorted(opt["step"]) == list(range(6))


@needs_fixtures
@needs_otf2_print
def test_apex_process_ids_are_not_ranks():
    df, problems, counts = read_beside_otf2_print("apex-hpx-test-archive", "APEX.otf2")
    assert set(df["rank"]) == {0}  # "process 148165": one process
    # APEX leaves a renamed HPX task under its new name: every Enter is a row
    assert len(df) == of_kind(counts, "ENTER") == 8062
    renamed, broadcasts = problems
    assert not renamed.lost and "renames" in renamed
    # HPX's broadcast actions look like communication: named, not lost
    assert not broadcasts.lost and "'broadcast_iterate_action' (99)" in broadcasts


@needs_fixtures
@needs_otf2_print
def test_scorep_horovod_collectives_on_their_mpi_region():
    anchor = FIXTURES / "scorep-8.4-horovod-torch-mpi-np2" / "traces.otf2"
    df, _, counts = read_beside_otf2_print("scorep-8.4-horovod-torch-mpi-np2")
    ends = of_kind(counts, "MPI_COLLECTIVE_END")
    listing = subprocess.run(["otf2-print", str(anchor)], capture_output=True, text=True).stdout
    handles = len(re.findall(r"^MPI_COLLECTIVE_END .*Operation: \w+_HANDLE", listing, re.M))
    assert handles > 0  # communicator management: no collective
    assert df["collective"].notna().sum() == ends - handles
    assert df.loc[df["collective"].notna(), "region"].str.startswith("MPI_").all()
    assert df.loc[df["bytes"].notna(), "region"].str.startswith("MPI_").all()
    allreduce = df[df["region"] == "MPI_Allreduce"]
    assert allreduce["collective"].eq("allreduce").all()
    user = df["region"].str.startswith("user:")
    assert not df.loc[user, "parent"].str.startswith("MPI_", na=False).any()
    assert not df.loc[~user, "parent"].str.startswith("user:", na=False).any()


@needs_fixtures
def test_convert_cli_writes_versioned_table(tmp_path):
    out = tmp_path / "phases.parquet"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "traces.convert",
            str(FIXTURES / "pipit-ping-pong-otf2"),
            str(TIMELINE),
            "-o",
            str(out),
            "--run-id",
            "r9",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out)
    assert tuple(table.column_names) == COLUMNS
    meta = table.schema.metadata
    assert meta[b"ddlcompare.schema_version"] == str(SCHEMA_VERSION).encode()
    assert int(meta[b"ddlcompare.rules_version"]) == RULES.version
    assert set(table.column("run_id").to_pylist()) == {"r9"}
    assert set(table.column("source").to_pylist()) == {"otf2", "horovod_timeline"}
    timeline, _ = read_fixture("horovod-timeline-IgorDavidyuk-cpu3/timeline.json")
    assert table.num_rows == 42 + len(timeline)
    ids = table.column("op_id").drop_null().to_pylist()
    assert len(set(ids)) == table.column("collective").drop_null().__len__()


@needs_fixtures
def test_parts_with_dictionaries_of_their_own_read_back_as_written(tmp_path):
    """Parts written one after another under one schema, each text column a
    dictionary of its own part's names (an OTF2 archive's, a Timeline's, in
    orders of their own): the file gives each row its own name back, and
    the analysis reads plain strings, as before schema 3."""
    paths = [FIXTURES / "pipit-ping-pong-otf2", TIMELINE]
    in_memory, _, errors = convert.convert(paths, RULES, "r9")
    assert errors == [] and in_memory.column("region").num_chunks == 2
    first, second = (chunk.dictionary for chunk in in_memory.column("region").chunks)
    assert not first.equals(second)
    out = tmp_path / "phases.parquet"
    rows, _, errors = convert.write(paths, out, RULES, "r9")
    assert rows == in_memory.num_rows and errors == []
    back = pq.read_table(out)
    assert back.schema.equals(SCHEMA)  # the dictionaries, not strings
    assert plain_text(back).equals(plain_text(in_memory))
    analysed = tables.read_table(out)
    assert analysed.equals(plain_text(in_memory).to_pandas())
    for column in ("region", "parent", "collective", "phase", "run_id", "source"):
        dtype = analysed[column].dtype  # pandas' text, as a column of strings gives it
        assert pd.api.types.is_string_dtype(dtype), column
        assert not isinstance(dtype, pd.CategoricalDtype), column
    assert analysed["collective"].isna().any() and analysed["collective"].notna().any()
    one = pq.read_table(out, columns=["region"], filters=[("source", "=", "horovod_timeline")])
    assert one.num_rows == (in_memory.column("source").to_numpy() == "horovod_timeline").sum()


def test_tables_of_schema_2_cast_to_this_one_with_their_values():
    """A phase table of schema version 2 (text as plain strings), as a run
    converted before version 3 left it: analysis/collect.py casts it to
    this schema, every value kept."""
    old = pa.table(
        {
            name: pa.array(["a", None, "b"])
            if SCHEMA.field(name).type == TEXT
            else pa.array([1, None, 3], SCHEMA.field(name).type)
            for name in COLUMNS
        }
    )
    cast = old.cast(SCHEMA)
    assert cast.schema.equals(SCHEMA) and plain_text(cast).equals(old)


def truncated_copy(src: Path, dest: Path, keep: float) -> Path:
    data = src.read_bytes()
    dest.write_bytes(data[: int(len(data) * keep)])
    return dest


def otf2_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "ping-pong"
    shutil.copytree(FIXTURES / "pipit-ping-pong-otf2", dest)
    for path in dest.rglob("*"):
        path.chmod(0o644 if path.is_file() else 0o755)
    return dest


@needs_fixtures
@pytest.mark.parametrize("engine", ["fastotf2", "python"])
@pytest.mark.parametrize(
    "damage", ["cut_definitions", "no_definitions", "no_anchor", "empty_anchor"]
)
def test_broken_otf2_gives_clear_error_naming_the_file(
    tmp_path, monkeypatch, capfd, damage, engine
):
    monkeypatch.setenv("DDLC_OTF2_READER", engine)
    archive = otf2_copy(tmp_path)
    if damage == "cut_definitions":
        truncated_copy(archive / "traces.def", archive / "traces.def", 0.4)
    elif damage == "no_definitions":
        (archive / "traces.def").unlink()
    elif damage == "no_anchor":
        (archive / "traces.otf2").write_bytes(b"not an anchor")
    else:
        (archive / "traces.otf2").write_bytes(b"")
    with pytest.raises(TraceError, match=re.escape(str(archive / "traces.otf2"))):
        read(archive / "traces.otf2")
    out = tmp_path / "phases.parquet"
    assert convert.main([str(archive), "-o", str(out)]) == 1
    err = capfd.readouterr().err
    # one error line; the OTF2 library's own report folded into it
    assert [line for line in err.splitlines() if line.strip()] == [
        line for line in err.splitlines() if line.startswith("error: ")
    ]


@needs_fixtures
@needs_otf2_print
@pytest.mark.parametrize("engine", ["fastotf2", "python"])
@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_broken_rank_file_costs_only_that_rank(tmp_path, monkeypatch, capfd, damage, engine):
    monkeypatch.setenv("DDLC_OTF2_READER", engine)
    archive = otf2_copy(tmp_path)
    counts = leaves_per_location(otf2_print_counts(archive / "traces.otf2"))
    events = archive / "traces" / "1.evt"
    if damage == "cut":
        truncated_copy(events, events, 0.5)
    else:
        data = events.read_bytes()
        events.write_bytes(data[: len(data) // 2] + b"\x07" * 64 + data[len(data) // 2 + 64 :])
    table, problems = readers.read(archive / "traces.otf2", RULES, "r1")
    assert table.schema.metadata[b"ddlcompare.otf2_reader"] == engine.encode()
    df = table.to_pandas()
    assert (df["rank"] == 0).sum() == counts[0]  # the other rank whole
    assert 0 < (df["rank"] == 1).sum() < counts[1]  # this one up to the fault
    assert any(p.lost and "1 of 2 locations" in p for p in problems)
    out = tmp_path / "phases.parquet"
    assert convert.main([str(archive), "-o", str(out)]) == 1
    err = capfd.readouterr().err
    assert all(line.startswith(("error: ", "warning: ")) for line in err.splitlines()), err
    assert pq.read_table(out).num_rows == len(df)


@needs_fixtures
def test_broken_json_traces_keep_every_readable_record(tmp_path):
    name = "kineto-tb-resnet50-numworkers0/worker0.pt.trace.json.gz"
    whole, _ = read_fixture(name)
    cut = truncated_copy(FIXTURES / name, tmp_path / "w.pt.trace.json.gz", 0.5)
    df, problems = read(cut)
    assert 0 < len(df) < len(whole) and all(p.lost for p in problems)
    assert any("gzip stream is cut" in p for p in problems)
    # garbage in the middle of the events: that one event is lost, no other
    assert_one_record_lost(garbled_copy(name, tmp_path / "g.pt.trace.json", 1 / 2), whole)
    plain = tmp_path / "k.json"
    plain.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    with pytest.raises(TraceError, match=re.escape(str(plain))):
        read(plain)
    # A Horovod Timeline cut inside a record keeps its complete records.
    cut = truncated_copy(TIMELINE, tmp_path / "timeline.json", 0.5)
    df, problems = read(cut)
    assert 0 < len(df) < 20930 and any("could not be read" in p for p in problems)


@needs_fixtures
@pytest.mark.parametrize("name", ["timeline.json", "rank-0.json.gz", "rank-0.json", "traces.otf2"])
def test_empty_trace_files_are_named(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(gzip.compress(b"") if name.endswith(".gz") else b"")
    out = tmp_path / "phases.parquet"
    assert convert.main([str(path), "-o", str(out)]) == 1
    assert str(path) in convert.errors_of(convert.metadata_of(out))[0]


@needs_fixtures
def test_one_broken_trace_does_not_stop_the_others(tmp_path):
    archive = otf2_copy(tmp_path)
    truncated_copy(archive / "traces" / "1.evt", archive / "traces" / "1.evt", 0.3)
    out = tmp_path / "phases.parquet"
    code = convert.main([str(archive), str(FIXTURES / "fastotf2-simple-mi300"), "-o", str(out)])
    assert code == 1
    errors = convert.errors_of(convert.metadata_of(out))
    assert errors and all(str(archive / "traces.otf2") in e for e in errors)
    assert pq.read_table(out).num_rows > 40 + 21 - 1  # the other trace, the other rank
    assert convert.main([str(archive), "-o", str(out), "--keep-going"]) == 0


def test_folder_without_trace_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text('{"run_id": "x"}')  # JSON, but no trace
    out = tmp_path / "phases.parquet"
    assert convert.main([str(tmp_path), "-o", str(out)]) == 1
    table = pq.read_table(out)
    assert table.num_rows == 0 and tuple(table.column_names) == COLUMNS
    assert "no trace this converter knows" in convert.errors_of(convert.metadata_of(out))[0]
    assert convert.main([str(tmp_path), "-o", str(out), "--keep-going"]) == 0


def test_unknown_file_and_bad_rules_are_named(tmp_path):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello")
    with pytest.raises(TraceError, match=re.escape(str(odd))):
        readers.read(odd, RULES)
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules:\n  - {pattern: 'x', phase: fwd}\n")
    with pytest.raises(RulesError, match="rule 1: unknown phase 'fwd'"):
        PhaseRules(rules)
    rules.write_text("version: 1\nrules:\n  - {pattern: 'x', phase: init, sources: [otf3]}\n")
    with pytest.raises(RulesError, match="rule 1: 'sources' must be a list of .*horovod_timeline"):
        readers.read(odd, PhaseRules(rules))


def test_rules_first_match_and_sources():
    assert RULES.match("user:forward", "otf2") == ("forward", None)
    assert RULES.match("MPI_Allreduce", "otf2") == ("grad_comm", "allreduce")
    assert RULES.match("MEMCPY_IN_FUSION_BUFFER", "horovod_timeline")[0] == "grad_comm"
    assert RULES.match("MEMCPY_IN_FUSION_BUFFER", "kineto") == (None, None)
    assert RULES.match("ProfilerStep#7", "kineto") == ("step", None)
    assert RULES.match("aten::conv2d", "kineto") == (None, None)  # takes its parent's phase


def _first_rule(rules: PhaseRules, region: str, source: str) -> int:
    """The rule that names a region, as the rules file defines it: each rule
    searched in order, the first that matches wins (-1: none)."""
    return next(
        (
            i
            for i, rule in enumerate(rules.rules)
            if (rule.sources is None or source in rule.sources) and rule.pattern.search(region)
        ),
        -1,
    )


def test_rules_first_rules_asked_from_two_threads_matches_new_names_once():
    """A folder's files are read in threads, and their first files ask for
    the same new names at about the same time: they are matched once (the
    bench's 31,000 names cost 0.07 s), and each thread gets the answer."""

    class Counted(PhaseRules):
        matched = 0

        def _first_matches(self, regions, source):
            Counted.matched += 1
            time.sleep(0.2)  # both threads are asking meanwhile
            return super()._first_matches(regions, source)

    rules = Counted()
    names = [f"aten::op{i}" for i in range(100)] + ["nccl:all_reduce", "ProfilerStep#3"]
    barrier = threading.Barrier(2)

    def ask():
        barrier.wait()
        return rules.first_rules(list(names), "kineto")

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: ask(), range(2)))
    assert Counted.matched == 1
    assert (
        answers[0].tolist()
        == answers[1].tolist()
        == PhaseRules().first_rules(names, "kineto").tolist()
    )


def test_rules_first_rules_is_each_rule_searched_in_order():
    """first_rules searches a rule only in the names that hold a string it
    needs: the same first match as every rule searched in every name, on the
    names of the real traces and on ones made to trip the shortcut (case,
    non-ASCII letters a case-insensitive pattern folds, newlines, digits
    inside a needed string, which the names' forms without digits would
    show), with and without names of newlines (the forms are then not
    used)."""
    names = set()
    for trace in sorted((REPO / "tests" / "data" / "real-traces").rglob("*.json*")):
        names.update(readers.read(trace, RULES)[0].column("region").unique().to_pylist())
    names.update(f"{kind}{i}" for i in range(50) for kind in ("layer", "nn.Module: layer"))
    names.update(
        [
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)",
            "void ALL_REDUCE_kernel<float>",
            "my_allgather_copy",
            "symm_mem::one_shot_all_reduce",
            "ALL_REDUCE\u212a",
            "all_reduce\u212a",
            "reduce_\u017fcatter",
            "nccl:all_reduce\n",
            "step\n",
            "user:step\n",
            "x\nBackward",
            "save_for_backward",
            "## Forward ##",
            "MPI_Iallreduce",
            "NEGOTIATE_ALLREDUCE",
            "all1reduce",
            "nccl1:all_reduce",
            "Back7ward",
            "c1 0d::allreduce_",
            "c10d::allreduce_",
            "## for3ward ##",
            "",
        ]
    )
    names = sorted(names)
    assert len(names) > 100
    with_newlines = [(source, names) for source in ("kineto", "otf2", "horovod_timeline")]
    without = [n for n in names if "\n" not in n]
    for source, names in [*with_newlines, *((s, without) for s in ("kineto", "otf2"))]:
        expected = [_first_rule(RULES, name, source) for name in names]
        rules = PhaseRules()
        assert rules.first_rules(names, source).tolist() == expected, source
        assert rules.first_rules(names, source).tolist() == expected, source  # cached
        assert [rules.match(name, source) for name in names] == [
            RULES.rules[i].found if i >= 0 else (None, None) for i in expected
        ]


def test_files_read_into_the_kept_buffer_are_each_files_bytes(tmp_path):
    """The kept buffer, resized from file to file, holds each file's bytes
    exactly (larger, smaller, empty, gzipped); a view of one file still held
    keeps that file's bytes: the next is read into a buffer of its own."""
    contents = [b"a" * 5000, b"bc" * 100, b"", b'{"x": 1}' * 900, bytes(range(256)) * 40]
    paths = []
    for i, content in enumerate(contents):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(content)
    (tmp_path / "f.gz").write_bytes(gzip.compress(contents[3]))
    for path, content in [*zip(paths, contents), (tmp_path / "f.gz", contents[3])]:
        data, problem = readers.read_bytes(path, kept=True)
        assert (bytes(data), problem) == (content, None)
    held = memoryview(readers.read_bytes(paths[3], kept=True)[0])
    assert bytes(readers.read_bytes(paths[0], kept=True)[0]) == contents[0]
    assert held.tobytes() == contents[3]
    held.release()
    readers.let_go()


def test_a_new_format_is_one_registered_class(tmp_path):
    """A reader registered from anywhere (here, this test) is detected, found
    in folders, converted and allowed in the rules' `sources`."""
    from traces.readers import REGISTRY, Reader, register
    from traces.table import Rows, finish

    @register
    class Intervals(Reader):
        name = "tsv_intervals"
        patterns = ("*.intervals.tsv",)

        @classmethod
        def recognises(cls, path, head):
            return path.name.endswith(".intervals.tsv")

        def read(self, path, rules, run_id=""):
            rows = Rows()
            for i, line in enumerate(path.read_text().splitlines()):
                region, start, end = line.split("\t")
                rows.add(0, "h", "main", region, int(start), int(end), 0, i, None)
            return finish(rows, rules, self.name, run_id), []

    try:
        trace = tmp_path / "run.intervals.tsv"
        trace.write_text("user:step\t0\t100\nMPI_Allreduce\t10\t20\n")
        assert readers.detect(trace) == "tsv_intervals"
        assert readers.traces_in(tmp_path) == [trace]
        out = tmp_path / "phases.parquet"
        assert convert.main([str(tmp_path), "-o", str(out)]) == 0
        df = pq.read_table(out).to_pandas()
        assert list(df["phase"]) == ["step", "grad_comm"] and set(df["source"]) == {"tsv_intervals"}
        rules = tmp_path / "rules.yaml"
        rules.write_text(
            "version: 1\nrules:\n  - {pattern: 'x', phase: forward, sources: [tsv_intervals]}\n"
        )
        assert PhaseRules(rules).match("x", "tsv_intervals") == ("forward", None)
    finally:
        REGISTRY.forget("tsv_intervals")


def test_traces_import_graph_has_no_cycle():
    """No module of traces/ imports, even inside a function, a module that
    imports it back, however far round (the readers' registry imports its
    reader modules by name, which is no edge here)."""
    from graphlib import CycleError, TopologicalSorter

    from test_layers import REPO, imports, module_name

    paths = sorted((REPO / "traces").rglob("*.py"))
    modules = {module_name(path) for path in paths}

    def resolved(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    graph = {
        module_name(path): {
            m for t in imports(path) if (m := resolved(t)) and m != module_name(path)
        }
        for path in paths
    }
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"import circle in traces/: {' -> '.join(exc.args[1])}")


def test_names_that_look_like_communication_in_lower_case_as_with_ignorecase():
    """An ASCII name is searched in lower case (six times faster than the
    patterns' (?i)); the answer is (?i)'s, for any other name too."""
    from traces import table

    names = ["NCCL AllReduce", "ncclKernel_AllReduce_RING_LL", "c10d::allreduce_", "Gloo:BCAST"]
    names += ["aten::all_reduce", "ALL_TO_ALL wait", "custom_AR", "custom_arx", "CCL_x", "ccl"]
    names += ["\u017fymm_mem", "\u212aernel nccl", "caf\u00e9 broadcast", "Init nccl", "x", ""]
    expected = [
        table.LOOKS_LIKE_COMMUNICATION.search(n) is not None
        and table.NOT_COMMUNICATION.search(n) is None
        for n in names
    ]
    assert [table._looks_like_communication(n) for n in names] == expected
    assert expected[:4] == [True] * 4 and expected[4:10] == [False, False, True, False, True, False]
    assert expected[10:13] == [True, True, True] and table._looks_like_communication(None) is False


def test_communication_takes_the_phase_of_where_it_runs(tmp_path):
    """Only in the backward pass and the optimizer (or outside any phase,
    on a communication thread) is a collective gradient exchange: one in
    the forward pass is other_comm, with the rows inside it; a broadcast
    in start-up or outside any phase is init; DDP's prepare_for_backward
    at the end of forward is forward."""

    def x(name, ts, dur, tid=1):
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "pid": 1,
            "tid": tid,
            "ts": ts,
            "dur": dur,
        }

    events = [
        x("ProfilerStep#1", 0, 1000),
        x("## forward ##", 10, 300),
        x("nccl:all_to_all", 20, 50),
        x("record_param_comms", 30, 10),
        x("DistributedDataParallel.prepare_for_backward", 100, 10),
        x("## backward ##", 400, 300),
        x("nccl:all_reduce", 410, 50),
        x("## optimizer ##", 800, 100),
        x("nccl:all_reduce", 810, 50),
        x("init", 2000, 100),
        x("nccl:broadcast", 2010, 50),
        x("nccl:broadcast", 3000, 50, tid=2),
        x("nccl:all_reduce", 3100, 50, tid=2),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    df, _ = read(path)
    assert df.sort_values("start_ns")["phase"].tolist() == [
        "step",
        "forward",
        "other_comm",
        "other_comm",  # inside the all-to-all
        "forward",
        "backward",
        "grad_comm",
        "optimizer",
        "grad_comm",
        "init",
        "init",
        "init",  # outside any phase: the start-up broadcast
        "grad_comm",  # a communication thread's
    ]


@needs_fixtures
@pytest.mark.parametrize("engine", ["fastotf2", "python"])
def test_lost_locations_counted_of_the_whole_archive_when_read_in_parts(
    tmp_path, monkeypatch, engine
):
    """Read a rank at a time, the fast reader counted the lost location of
    its part's ("1 of 1 locations"); both readers count the archive's."""
    from traces.readers import otf2_reader

    monkeypatch.setenv("DDLC_OTF2_READER", engine)
    monkeypatch.setattr(otf2_reader, "PART_EVENTS", 1)  # a part per rank
    monkeypatch.setattr(otf2_reader, "PART_LOCATIONS", 1)
    archive = otf2_copy(tmp_path)
    truncated_copy(archive / "traces" / "1.evt", archive / "traces" / "1.evt", 0.5)
    said = [p for _, problems in readers.parts(archive / "traces.otf2", RULES) for p in problems]
    assert [p for p in said if "locations could not be read" in p] == [
        next(p for p in said if "1 of 2 locations could not be read" in p)
    ]


def test_durations_are_written_over_the_parent_rows():
    """finish_columns consumes its columns: the durations take the memory of
    the parent rows (no fresh pages to fault in), once the parent column
    has been read through them."""
    parent_row = np.array([-1, 0, 1, 0], dtype=np.int64)
    nothing = np.full(4, NULL, dtype=np.int64)
    columns = Columns(
        rank=np.zeros(4, dtype=np.int32),
        node=np.zeros(4, dtype=np.int32),
        node_names=["node"],
        location=np.zeros(4, dtype=np.int32),
        location_names=["thread"],
        region=np.array([0, 1, 2, 3], dtype=np.int32),
        region_names=["main", "forward", "conv", "backward"],
        start_ns=np.array([0, 10, 12, 30], dtype=np.int64),
        end_ns=np.array([100, 20, 15, 70], dtype=np.int64),
        depth=np.array([0, 1, 2, 1], dtype=np.int32),
        parent_row=parent_row,
        step=nothing.copy(),
        epoch=nothing.copy(),
        collective=np.full(4, -1, dtype=np.int32),
        collective_names=[],
        bytes=nothing.copy(),
    )
    table = finish_columns(columns, RULES, "otf2")
    assert table.column("parent").to_pylist() == [None, "main", "forward", "main"]
    assert table.column("dur_ns").to_pylist() == [100, 10, 3, 40]
    durations = table.column("dur_ns").chunk(0).buffers()[1]
    assert np.shares_memory(np.frombuffer(durations, dtype=np.int64), parent_row)
