"""Real traces the converter had not seen (tests/data/real-traces/, see its
README) and damaged copies of them and of the shared fixtures: every record
that reads is kept, counts match an independent count of the JSON or of
otf2-print, and what was lost exits non-zero with one line, no traceback."""

import gzip
import json
import math
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO
from test_traces_readers import (
    FIXTURES,
    besides_unsized,
    needs_fixtures,
    needs_otf2_print,
    otf2_copy,
    otf2_print_counts,
)
from traces import fastotf2, readers
from traces.readers import otf2_reader
from traces.rules import PhaseRules
from runfiles.tables import plain_text

RULES = PhaseRules()
REAL = Path(__file__).parent / "data" / "real-traces"


def convert_cli(*paths: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "traces.convert", *map(str, paths), "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_fixtures
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_first_rank_with_no_interval_keeps_the_others(tmp_path, monkeypatch, workers):
    """The C reader's threads each fill a stretch of shared columns; when the
    first stretch holds no row (rank 0's event file empty or cut before its
    first Leave), the next ones must still be moved into place, not left as
    uninitialised memory (it gave garbage rows and a traceback)."""
    archive = otf2_copy(tmp_path)
    (archive / "traces" / "0.evt").write_bytes(b"")
    anchor = archive / "traces.otf2"
    read_intervals = fastotf2.read_intervals
    monkeypatch.setattr(fastotf2, "read_intervals", lambda *a: read_intervals(*a, workers=workers))
    fast, fast_problems = otf2_reader.read(anchor, RULES, "r1", engine="fastotf2")
    slow, slow_problems = otf2_reader.read(anchor, RULES, "r1", engine="python")
    fast, slow = plain_text(fast).to_pandas(), plain_text(slow).to_pandas()  # the values
    assert len(fast) == len(slow) == 21  # rank 1's intervals (otf2-print: 21 Leave)
    assert set(fast["rank"]) == {1} and (fast["region"] == "MPI_Send").sum() == 8
    assert fast.drop(columns="op_id").equals(slow.drop(columns="op_id"))
    assert "MPI Rank 0/Master thread" in fast_problems[0] and fast_problems[0].lost
    monkeypatch.undo()
    done = convert_cli(anchor, out=tmp_path / "phases.parquet")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and "21 rows" in done.stdout


def json_of(path: Path):
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def read_df(path: Path):
    table, problems = readers.read(path, RULES, "r1")
    return table.to_pandas(), problems


# Independent of the reader's tables: what the backend records say.
BACKEND_COLLECTIVES = {
    "all_reduce": "allreduce",
    "all_to_all": "all_to_all",
    "_all_gather_base": "allgather",
    "broadcast": "bcast",
}
ELEMENT_BYTES = {"float": 4, "int": 4, "long": 8, "signed char": 1, "unsigned char": 1}


def shaped_collectives(path: Path) -> tuple[Counter, Counter]:
    """(records, bytes) per collective, from the ``nccl:``/``gloo:``
    records' Input Dims and Input type."""
    records, nbytes = Counter(), Counter()
    for e in json_of(path)["traceEvents"]:
        backend, _, op = str(e.get("name")).partition(":")
        if e.get("ph") != "X" or backend not in ("nccl", "gloo"):
            continue
        op = BACKEND_COLLECTIVES[op]
        records[op] += 1
        args = e["args"]
        for dims, dtype in zip(args["Input Dims"], args["Input type"]):
            nbytes[op] += math.prod(dims) * ELEMENT_BYTES[dtype]
    return records, nbytes


KINETO_WITH_SHAPES = [
    REAL / "hta" / "rank-34.cpu-only-gloo.pt.trace.json.gz",
    REAL / "hta" / "rank-1.trace-compare-base.json.gz",
    REAL / "hta" / "no-distributed-info-alltoall.json.gz",
    FIXTURES / "kineto-hta-sampled-ws128-rank0-1" / "rank-0.json.gz",
    FIXTURES / "kineto-hta-sampled-ws128-rank0-1" / "rank-1.json.gz",
]


@pytest.mark.parametrize("path", KINETO_WITH_SHAPES, ids=lambda p: p.name)
def test_kineto_collective_bytes_from_input_shapes(path):
    """PyTorch before 2.1 writes no ``In msg nelems``: a collective's size
    is its backend record's input shape times its dtype's size (``float``,
    ``long``, ``signed char``); every byte count was lost."""
    if not path.is_file():
        pytest.skip(
            f"{path} is missing: the real traces ship in tests/data/real-traces, the larger ones in ../shared beside the checkout (DDLC_SHARED)"
        )
    doc = json_of(path)
    df, problems = read_df(path)
    assert problems == []
    assert len(df) == sum(e.get("ph") == "X" for e in doc["traceEvents"])
    assert set(df["rank"]) == {(doc.get("distributedInfo") or {}).get("rank", 0)}
    records, nbytes = shaped_collectives(path)
    instances = df[df["collective"].notna()]
    assert Counter(instances["collective"]) == records and sum(records.values()) > 0
    assert instances["bytes"].notna().all()
    assert instances.groupby("collective")["bytes"].sum().to_dict() == nbytes
    # DLRM's all-to-alls: gradient exchange in the backward pass, not in forward
    comm = df[df["region"].str.match(r"(nccl|gloo):")]
    alltoall = comm["region"] == "nccl:all_to_all"
    assert set(comm.loc[~alltoall, "phase"]) <= {"grad_comm"}
    assert set(comm.loc[alltoall, "phase"]) <= {"grad_comm", "other_comm"}


def record_starts(text: str, fractions) -> list[int]:
    """Where a complete event begins, near each fraction of the text (its
    ``{``: Kineto writes ``ph`` first)."""
    return [text.rfind("{", 0, text.index('"ph": "X"', int(len(text) * f))) for f in fractions]


@pytest.mark.parametrize(
    "path",
    [
        REAL / "hta" / "rank-1.trace-compare-base.json.gz",  # one line, records ", "-separated
        REAL / "hta" / "no-distributed-info-alltoall.json.gz",
        FIXTURES / "kineto-hta-nccl-ws2-a100-rank0" / "rank-0.json.gz",
    ],
    ids=lambda p: p.name,
)
def test_kineto_cut_between_two_events_is_data_lost(tmp_path, path):
    """A trace cut where one event ends and the next begins has no bad
    record to count; it still lost every event after the cut (it exited 0
    with the table short)."""
    if not path.is_file():
        pytest.skip(
            f"{path} is missing: the real traces ship in tests/data/real-traces, the larger ones in ../shared beside the checkout (DDLC_SHARED)"
        )
    text = gzip.decompress(path.read_bytes()).decode()
    for k, at in enumerate(record_starts(text, (0.2, 0.6, 0.97))):
        for end in (",", ""):  # after the separator, or on the event's "}"
            cut = text[:at].rstrip().rstrip(",") + end
            copy = tmp_path / f"cut{k}{end and 'comma'}.json"
            copy.write_text(cut)
            df, problems = read_df(copy)
            assert len(df) == cut.count('"ph": "X"') > 0
            [lost] = [p for p in problems if p.lost]  # besides a base time cut off
            assert "cut" in lost and len(problems) <= 2
    done = convert_cli(copy, out=tmp_path / "phases.parquet")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    df, problems = read_df(path)  # the whole trace: nothing said
    assert problems == [] and len(df) == text.count('"ph": "X"')


@pytest.mark.parametrize("path", sorted((REAL / "hta").glob("*.gz")), ids=lambda p: p.name)
def test_kineto_from_hta_counts(path):
    """Every complete event a row, each ProfilerStep a step, the rank from
    distributedInfo (0 without it)."""
    events = json_of(path)["traceEvents"]
    df, problems = read_df(path)
    assert besides_unsized(problems) == [] and len(df) == sum(e.get("ph") == "X" for e in events)
    steps = {e["name"] for e in events if str(e.get("name")).startswith("ProfilerStep#")}
    assert df["step"].nunique() == len(steps)
    assert df["phase"].notna().all() and (df["dur_ns"] >= 0).all()


SCOREP_PTHREAD = REAL / "scorep-8.4-mpi-pthread-np3" / "traces.otf2"
HANDLES = ("CREATE_HANDLE", "DESTROY_HANDLE")
VOCABULARY = {"ALLREDUCE": "allreduce", "ALLTOALL": "all_to_all", "BCAST": "bcast"}
VOCABULARY |= {"REDUCE_SCATTER_BLOCK": "reduce_scatter", "ALLGATHER": "allgather"}


def otf2_print_collectives(anchor: Path) -> tuple[Counter, Counter, int]:
    """From otf2-print: (collectives, bytes) per operation, blocking and
    non-blocking, communicator management (*_HANDLE) left out; its count."""
    listing = subprocess.run(
        ["otf2-print", str(anchor)], capture_output=True, text=True, check=True
    ).stdout
    ops, nbytes, handles = Counter(), Counter(), 0
    for line in listing.splitlines():
        if not line.startswith(("MPI_COLLECTIVE_END ", "NON_BLOCKING_COLLECTIVE_COMPLETE ")):
            continue
        op = line.split("Operation: ")[1].split(",")[0]
        if op in HANDLES:
            handles += 1
            continue
        sent = int(line.split("Sent: ")[1].split(",")[0])
        received = int(line.split("Received: ")[1].split(",")[0])
        ops[VOCABULARY[op]] += 1
        nbytes[VOCABULARY[op]] += max(sent, received)
    return ops, nbytes, handles


@needs_otf2_print
@pytest.mark.parametrize("engine", ["fastotf2", "python"])
def test_scorep_nonblocking_collectives_and_one_vocabulary(engine):
    """A non-blocking collective's operation and bytes (Score-P's
    NonBlockingCollectiveComplete, in MPI_Wait) were dropped; OTF2's
    operation names (ALLTOALL, REDUCE_SCATTER_BLOCK) were not the names of
    the other traces; MPI_Init_thread, MPI_Comm_dup and MPI_Finalize
    (CREATE/DESTROY_HANDLE) counted as collectives."""
    table, problems = otf2_reader.read(SCOREP_PTHREAD, RULES, "r1", engine=engine)
    df = table.to_pandas()
    counts = otf2_print_counts(SCOREP_PTHREAD)
    assert problems == []
    assert len(df) == sum(n for (kind, _), n in counts.items() if kind == "LEAVE") == 171
    assert sorted(df["rank"].unique()) == [0, 1, 2]
    assert df.groupby("rank")["step"].nunique().tolist() == [5, 5, 5]
    ops, nbytes, handles = otf2_print_collectives(SCOREP_PTHREAD)
    instances = df[df["collective"].notna()]
    assert Counter(instances["collective"]) == ops and handles == 3 * 2
    assert df.loc[df["region"].isin(["MPI_Init_thread", "MPI_Finalize"]), "collective"].isna().all()
    assert instances.groupby("collective")["bytes"].sum().to_dict() == nbytes
    iallreduce = df[df["region"] == "MPI_Iallreduce"]
    assert len(iallreduce) == 15 and set(iallreduce["bytes"]) == {4096 * 4 * 2}
    assert df.loc[df["region"] == "MPI_Wait", "collective"].isna().all()
    background = df[df["location"].str.endswith("Pthread thread 1")]
    assert set(background["region"]) == {"MPI_Allreduce"} and len(background) == 15
    for phase in ("forward", "backward", "optimizer"):
        assert (df.loc[df["region"] == phase, "phase"] == phase).all()


@needs_otf2_print
def test_scorep_openmp_workers_take_their_masters_phase():
    """An OpenMP team's regions on the worker threads (their own locations,
    at top level there) were ``other``: they run in the phase the master
    forked them in, as the master's copies of them do."""
    anchor = REAL / "scorep-8.4-mpi-openmp-np2" / "traces.otf2"
    df, problems = read_df(anchor)
    counts = otf2_print_counts(anchor)
    assert problems == []
    leaves = {loc: n for (kind, loc), n in counts.items() if kind == "LEAVE"}
    assert len(df) == sum(leaves.values()) == 58
    assert sorted(df["rank"].unique()) == [0, 1]
    workers = df[df["location"].str.endswith("OMP thread 1")]
    assert len(workers) == 2 * 9 and workers["region"].str.startswith("!$omp").all()
    assert set(workers["phase"]) == {"forward"}
    assert df.groupby("rank")["step"].nunique().tolist() == [3, 3]
    assert workers.groupby("rank")["step"].nunique().tolist() == [3, 3]
    assert set(df.loc[df["region"] == "MPI_Allreduce", "phase"]) == {"grad_comm"}


@needs_otf2_print
@pytest.mark.parametrize("engine", ["fastotf2", "python"])
def test_scorep_with_unwinding_calling_contexts_are_their_regions(engine):
    """With unwinding (or sampling), Score-P writes CallingContextEnter and
    CallingContextLeave instead of Enter and Leave: the trace gave no row
    at all. Each context stands for its region."""
    anchor = REAL / "scorep-8.4-unwinding-np2" / "traces.otf2"
    table, problems = otf2_reader.read(anchor, RULES, "r1", engine=engine)
    df = table.to_pandas()
    counts = otf2_print_counts(anchor)
    assert problems == []
    leaves = sum(n for (kind, _), n in counts.items() if kind == "CALLING_CONTEXT_LEAVE")
    assert len(df) == leaves == 114 and not any(k == "LEAVE" for k, _ in counts)
    ops, nbytes, _ = otf2_print_collectives(anchor)
    instances = df[df["collective"].notna()]
    assert Counter(instances["collective"]) == ops
    assert instances.groupby("collective")["bytes"].sum().to_dict() == nbytes
    assert df.groupby("rank")["step"].nunique().tolist() == [5, 5]
    for phase in ("forward", "backward", "optimizer"):
        assert (df.loc[df["region"] == phase, "phase"] == phase).sum() == 10


def damaged_copy(src: Path, dest: Path, name: str, damage: str) -> Path:
    """A copy of the archive folder ``src`` with its file ``name`` damaged."""
    shutil.copytree(src, dest)
    target = dest / name
    data = target.read_bytes()
    if damage == "cut":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        middle = len(data) // 2
        target.write_bytes(data[:middle] + b"\xff" * 32 + data[middle + 32 :])
    elif damage == "empty":
        target.write_bytes(b"")
    elif damage == "last byte":
        target.write_bytes(data[:-1])
    else:
        target.unlink()
    return dest


@needs_otf2_print
@pytest.mark.parametrize("engine", ["fastotf2", "python"])
@pytest.mark.parametrize("damage", ["cut", "garbage", "empty", "missing"])
def test_scorep_damaged_rank_file_costs_that_location(tmp_path, engine, damage):
    """One master thread's event file damaged: the other five locations
    whole, that one's records up to the fault, the loss named."""
    archive = damaged_copy(SCOREP_PTHREAD.parent, tmp_path / "a", "traces/1.evt", damage)
    table, problems = otf2_reader.read(archive / "traces.otf2", RULES, "r1", engine=engine)
    df = table.to_pandas()
    whole = otf2_print_counts(SCOREP_PTHREAD)
    others = sum(n for (kind, loc), n in whole.items() if kind == "LEAVE" and loc != 1)
    assert len(df[df["location"] != "MPI Rank 1/Master thread"]) == others
    assert others <= len(df) < 171
    assert problems[0].lost and "MPI Rank 1/Master thread" in problems[0]
    assert all("\n" not in p for p in problems)


@pytest.mark.parametrize("engine", ["fastotf2", "python"])
def test_an_event_file_cut_where_the_library_sees_no_fault_is_named(tmp_path, engine):
    """An event file less its last byte: the OTF2 library reads every record
    and reports nothing (a file cut inside its last chunk may read the same,
    or not, depending on what its buffer held before). The file's missing
    end says it was cut: named, its records kept."""
    archive = damaged_copy(SCOREP_PTHREAD.parent, tmp_path / "a", "traces/1.evt", "last byte")
    table, problems = otf2_reader.read(archive / "traces.otf2", RULES, "r1", engine=engine)
    assert table.num_rows == 171  # all (otf2-print: 171 Leave)
    assert problems[0].lost and "MPI Rank 1/Master thread" in problems[0]
    assert otf2_reader.UNFINISHED in problems[0]


@pytest.mark.parametrize("damage", ["cut", "garbage", "empty", "missing"])
def test_scorep_damaged_definitions_name_the_archive(tmp_path, damage):
    archive = damaged_copy(SCOREP_PTHREAD.parent, tmp_path / "a", "traces.def", damage)
    done = convert_cli(archive, out=tmp_path / "phases.parquet")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {archive / 'traces.otf2'}: ")
    # the library's own report, folded into the one line
    assert "(OTF2: " in lines[0] or "Error: " in lines[0]
    if damage == "missing":
        assert "traces.def" in lines[0].split("(OTF2: ")[1]


@pytest.mark.parametrize("path", sorted((REAL / "hta").glob("*.gz")), ids=lambda p: p.name)
def test_kineto_gzip_cut_keeps_what_came_before(tmp_path, path):
    whole, _ = read_df(path)
    cut = tmp_path / path.name
    raw = path.read_bytes()
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    text = gzip.decompress(raw).decode()
    try:
        df, problems = read_df(cut)
    except readers.TraceError as exc:  # cut before its first event
        assert str(cut) in str(exc)
        return
    problems = besides_unsized(problems)
    assert len(df) < len(whole) and problems and "gzip stream is cut" in problems[0]
    # and where the trace has one, its baseTimeNanoseconds was cut off
    assert all(p.lost or "baseTimeNanoseconds" in p for p in problems)
    assert len(df) <= text.count('"ph": "X"')


TB = REAL / "kineto-tb"


def test_kineto_bare_array_of_events_is_kineto(tmp_path):
    """PyTorch 1.8 wrote its traces as a bare JSON array (no ``traceEvents``
    object): taken for a Horovod Timeline, it gave no row at all."""
    path = TB / "array-format-resnet50-first-step.pt.trace.json.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    assert text.lstrip().startswith("[") and "traceEvents" not in text
    assert readers.detect(path) == "kineto"
    df, problems = read_df(path)
    assert problems == [] and len(df) == text.count('"ph": "X"') == 7073
    assert df["step"].nunique() == 1 and (df["phase"] == "forward").sum() > 0.1 * len(df)
    assert set(df.loc[df["region"] == "Optimizer.step#SGD.step", "phase"]) == {"optimizer"}
    # cut: the array is not closed (between two events, or inside one)
    for cut in (text.rstrip()[:-1], text[: len(text) // 2]):
        copy = tmp_path / "worker0.pt.trace.json"
        copy.write_text(cut)
        df, problems = read_df(copy)
        assert 0 < len(df) <= cut.count('"ph": "X"') and len(problems) == 1
        assert problems[0].lost


def test_kineto_without_profiler_step_finds_the_forward():
    """torch.autograd.profiler writes no ProfilerStep: the model's ops, at
    top level on the loop's thread after the data loading, were ``other``.
    A step runs from one data load to the next; copies right after the
    load are h2d, calls before the first load no step's."""
    path = TB / "autograd-api-resnet50-first-step.json.gz"
    events = json_of(path)["traceEvents"]
    df, problems = read_df(path)
    assert problems == [] and len(df) == sum(e.get("ph") == "X" for e in events)
    assert not df["region"].str.startswith("ProfilerStep").any()
    load = df[df["region"].str.startswith("enumerate(DataLoader)")]
    loop = df[(df["location"] == load["location"].iloc[0]) & (df["depth"] == 0)]
    loop = loop.sort_values("start_ns")
    after = loop[loop["start_ns"] > load["end_ns"].iloc[0]]
    optimizer = after[after["region"].str.startswith("Optimizer.step")]
    model = after[after["start_ns"] < optimizer["start_ns"].iloc[0]]
    assert (model["region"] == "aten::conv2d").sum() > 10
    calls = model[~model["region"].str.contains("zero_grad")]
    assert set(calls.iloc[:2]["region"]) == {"aten::to"} and set(calls.iloc[:2]["phase"]) == {"h2d"}
    assert set(calls.iloc[2:]["phase"]) == {"forward"}
    assert set(loop[loop["start_ns"] < load["start_ns"].iloc[0]]["phase"]) == {"other"}
    assert df["step"].nunique() == 1


@needs_otf2_print
def test_scorep_python_functions_give_phases_and_steps():
    """Score-P's Python bindings with the instrumenter on and no user
    regions: every region is a Python function (``module.Class:method``);
    all rows were ``other``, with no step. The loader's ``__next__``, the
    module calls, ``Tensor.backward``, the optimizer's step and
    ``zero_grad`` name the phases; a step runs from one data load to the
    next, the loader's last call (its StopIteration) is no step."""
    anchor = REAL / "scorep-8.4-python-torch-loop" / "traces.otf2"
    df, problems = read_df(anchor)
    counts = otf2_print_counts(anchor)
    assert problems == []
    assert len(df) == sum(n for (kind, _), n in counts.items() if kind == "LEAVE") == 2120
    top = df[df["depth"] == 0].sort_values("start_ns")
    loads = top[top["region"].str.endswith("DataLoaderIter:__next__")]
    assert len(loads) == 5 and set(loads["phase"]) == {"data_load"}
    assert loads["step"].tolist()[:4] == [0, 1, 2, 3] and pd.isna(loads["step"].iloc[4])
    assert df["step"].nunique() == 4
    for name, phase in (
        ("torch.nn.modules.module.Sequential:_wrapped_call_impl", "forward"),
        ("torch._tensor.Tensor:backward", "backward"),
        ("torch.optim.sgd.SGD:step", "optimizer"),
        ("torch.optim.optimizer.SGD:zero_grad", "backward"),
    ):
        rows = df[df["region"] == name]
        assert len(rows) >= 4 and set(rows["phase"]) == {phase}, name
    inside = df[df["step"].notna()]
    assert (inside["phase"] == "other").mean() < 0.1


@pytest.mark.parametrize("name", ["rank3.json.gz", "rank-3.json.gz", "job_rank_3.pt.trace.json.gz"])
def test_kineto_rank_from_the_file_name_without_distributed_info(tmp_path, name):
    """Without distributedInfo the rank is the one in the file's name,
    written rank3, rank-3 or rank_3 (the last gave rank 0)."""
    copy = tmp_path / name
    copy.write_bytes((REAL / "hta" / "no-distributed-info-alltoall.json.gz").read_bytes())
    df, _ = read_df(copy)
    assert set(df["rank"]) == {3}


@needs_fixtures
def test_kineto_times_from_base_time_are_unix_time():
    """Kineto since 2024 writes ts relative to baseTimeNanoseconds (the
    start of the quarter): the rows' times were ~50 days after 1970, not
    when the trace was taken, which its own log lines say (local time,
    here 7 hours behind UTC: 2024-05-22 17:15:22 to 17:15:23)."""
    path = FIXTURES / "kineto-hta-nccl-ws2-a100-rank0" / "rank-0.json.gz"
    doc = json_of(path)
    df, _ = read_df(path)
    base = doc["baseTimeNanoseconds"]
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    assert df["start_ns"].min() == base + round(first * 1000)
    logged = pd.to_datetime([line[5:24] for line in doc["INFO"]])
    start = pd.to_datetime(df["start_ns"].min(), unit="ns")
    end = pd.to_datetime(df["end_ns"].max(), unit="ns")
    offset = round((start - logged.min()).total_seconds() / 3600)
    assert 0 <= abs(offset) <= 14
    hour = pd.Timedelta(hours=offset)
    assert logged.min() <= start - hour and end - hour <= logged.max() + pd.Timedelta(seconds=1)
    # a trace without the base: ts is already Unix time
    old, _ = read_df(REAL / "hta" / "rank-1.trace-compare-base.json.gz")
    assert str(pd.to_datetime(old["start_ns"].min(), unit="ns").year) == "2022"


def test_kineto_backend_record_outliving_its_call_is_the_same_collective():
    """``hccl:allgather`` starts inside its ``c10d::allgather_`` and ends a
    few microseconds after it: not nested, yet the same collective, not a
    second one."""
    path = REAL / "hta" / "mtia-allgathers-window.json.gz"
    events = json_of(path)["traceEvents"]
    df, problems = read_df(path)
    assert besides_unsized(problems) == [] and len(df) == sum(e.get("ph") == "X" for e in events)
    calls = [e for e in events if e.get("name") == "c10d::allgather_"]
    backend = [e for e in events if e.get("name") == "hccl:allgather"]
    assert len(calls) == len(backend) == 6
    assert all(
        c["ts"] < b["ts"] < c["ts"] + c["dur"] < b["ts"] + b["dur"]
        for c, b in zip(
            sorted(calls, key=lambda e: e["ts"]), sorted(backend, key=lambda e: e["ts"])
        )
    )
    instances = df[df["collective"].notna() & (df["collective"] != "barrier")]
    assert Counter(instances["collective"]) == {"allgather": 6}
    assert (df["collective"] == "barrier").sum() == 3  # gloo:barrier, a collective too
    assert set(instances["region"]) == {"c10d::allgather_"}
    hccl = df[df["region"] == "hccl:allgather"]
    assert sorted(hccl["op_id"]) == sorted(instances["op_id"])


def test_kineto_microseconds_since_1970_keep_their_nesting():
    """Times of µs since 1970 (1.66e15) times 1000 are beyond a double's
    precision: rounded to 256 ns, a record ending with its parent seemed to
    outlive it and lost its place (and its collective was counted twice)."""
    path = REAL / "hta" / "no-distributed-info-alltoall.json.gz"
    events = [e for e in json_of(path)["traceEvents"] if e.get("ph") == "X"]
    assert {e["cat"] for e in events} <= {"cpu_op", "user_annotation"}
    assert min(e["ts"] for e in events) > 1e15
    by_thread = {}
    for e in events:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    inside = 0  # records lying within another record of their thread
    for spans in by_thread.values():
        for (b, f), k in Counter(spans).items():  # of k equal spans, k - 1 nest
            held = any(s <= b and f <= t and (s, t) != (b, f) for s, t in spans)
            inside += k if held else k - 1
    df, _ = read_df(path)
    assert (df["depth"] > 0).sum() == inside
    assert (df["start_ns"] % 1000 == 0).all()  # whole microseconds stay whole


@pytest.mark.parametrize("rank", [0, 1])
def test_kineto_gloo_record_on_its_own_thread_is_the_calls_collective(rank):
    """Gloo runs a collective on a thread of its own: the ``gloo:*`` record
    there and the c10d call on the training thread were two collectives
    (DDP over Gloo, as CPU runs of this project are, counted twice)."""
    path = REAL / "kineto-gloo-ddp-np2" / f"rank{rank}.json.gz"
    events = [e for e in json_of(path)["traceEvents"] if e.get("ph") == "X"]
    calls = Counter(e["name"] for e in events if e["name"].startswith("c10d::"))
    records = [e for e in events if e["name"].startswith("gloo:")]
    assert calls == {"c10d::allreduce_": 4, "c10d::broadcast_": 2}
    assert {e["tid"] for e in records}.isdisjoint(
        e["tid"] for e in events if e["name"].startswith("c10d::")
    )
    df, problems = read_df(path)
    assert problems == [] and set(df["rank"]) == {rank}
    instances = df[df["collective"].notna()]
    assert Counter(instances["collective"]) == {"allreduce": 4, "bcast": 2}
    assert set(instances["region"]) == set(calls)
    gloo = df[df["region"].str.startswith("gloo:")]
    assert gloo["op_id"].isin(instances["op_id"]).all() and gloo["op_id"].is_unique
    float_bytes = sum(math.prod(e["args"]["Input Dims"][0]) * 4 for e in records)
    assert instances["bytes"].sum() == float_bytes


def test_real_cuda_trace_gpu_work_takes_its_launchs_step_and_phase():
    """torch-ddp on an H200 (bench/gpu_check.py --small-traces, 4 steps): the
    GPU-side copy of the ``epoch`` range encloses every kernel, yet each one
    takes the step and phase of what launched it. Backward's kernels,
    launched by autograd's thread, are backward in their step (26 of 145
    were, and none in a step); DDP's bucket copies in and out (8 gradients)
    are grad_comm in every step (they were `other` or backward)."""
    table, _ = readers.read(REAL / "kineto-cuda-h200" / "kineto-gpu-rank0.json.gz", RULES, "r1")
    df = table.to_pandas()
    gpu = df[df["location"].str.contains("stream")]
    per_step = gpu.pivot_table(index="phase", columns="step", values="dur_ns", aggfunc="size")
    assert list(per_step.columns) == [0, 1, 2, 3]
    assert (per_step.loc["backward"] >= 36).all()
    assert (per_step.loc["grad_comm"] == 16).all()
    assert per_step.loc["optimizer"].min() >= 12
    # what runs in no step: the evaluation after the last step, and the
    # epoch's own GPU-side range
    last_step_end = df.loc[df["phase"] == "step", "end_ns"].max()
    outside = gpu[gpu["step"].isna() & (gpu["phase"] != "epoch")]
    assert outside["phase"].isin(["eval", "forward", "h2d", "other"]).all()
    assert (outside.loc[outside["phase"] != "other", "start_ns"] > last_step_end).all()


def test_unsized_collectives_are_counted():
    """Every collective the trace gives no size of is counted, by kind, an
    instance once however many records show it (not only broadcasts); a
    barrier sends nothing and is not. MTIA's window: 6 all-gathers and 3
    barriers, none sized."""
    path = REAL / "hta" / "mtia-allgathers-window.json.gz"
    df, problems = read_df(path)
    assert df.loc[df["collective"] == "allgather", "op_id"].nunique() == 6
    assert [str(p) for p in problems] == [
        f"{path}: 6 collective(s) without a byte count in the trace (6 allgather; the start-up "
        "broadcast of the parameters often has none): their bytes are unknown, not 0"
    ]
    assert not problems[0].lost


def test_two_processes_on_one_rank_are_named(tmp_path):
    """Traces with neither distributedInfo's rank nor one in their file's
    name are all rank 0: two such processes of one run, at the same time,
    were mixed as one rank with nothing said. The same rank at other times
    (one process's profiling windows) is no such mix."""
    trace = REAL / "hta" / "no-distributed-info-alltoall.json.gz"
    window = REAL / "kineto-tb" / "array-format-resnet50-first-step.pt.trace.json.gz"
    run = tmp_path / "job"
    run.mkdir()
    for name, source in (
        ("host-a.json.gz", trace),
        ("host-b.json.gz", trace),
        ("host-c.json.gz", window),
    ):
        shutil.copy(source, run / name)
    done = convert_cli(run, out=tmp_path / "phases.parquet")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    [warning] = [line for line in done.stderr.splitlines() if "same time" in line]
    assert warning.startswith(
        f"warning: {run / 'host-b.json.gz'}: rank 0 of run 'job' at the same time as {run / 'host-a.json.gz'}"
    )
    for k, name in enumerate(("host-a.json.gz", "host-b.json.gz")):
        (run / name).rename(run / f"rank{k}.json.gz")
    done = convert_cli(run, out=tmp_path / "phases.parquet")
    assert done.returncode == 0 and "same time" not in done.stderr, done.stderr


def test_kineto_cut_trace_keeps_its_rank_from_nested_distributed_info(tmp_path):
    """Since PyTorch 2.1 distributedInfo nests (``pg_config``: a list of
    objects): a cut trace, read record by record, took its rank from a
    pattern of flat braces, found none, and was rank 0 (this one is 34 of
    300, its file name no help)."""
    text = gzip.decompress((REAL / "hta" / "rank-34.cpu-only-gloo.pt.trace.json.gz").read_bytes())
    assert b'"pg_config": [{' in text
    cut = tmp_path / "cpu-only-gloo.json"
    cut.write_bytes(text[: len(text) * 8 // 10])
    df, problems = read_df(cut)
    assert set(df["rank"]) == {34} and len(df) > 0
    assert len([p for p in problems if p.lost]) == 1


def test_kineto_cut_before_its_base_time_says_its_times_are_not_unix_time(tmp_path):
    """Kineto since 2024 writes baseTimeNanoseconds after the events: a
    trace cut before it keeps its events, whose times are then since a
    lost base (some 50 days after 1970), not Unix time; that was not said."""
    text = gzip.decompress((REAL / "hta" / "mi250-rocm6.2-minitoy-train.json.gz").read_bytes())
    assert text.rindex(b'"baseTimeNanoseconds"') > text.rindex(b'"ph": "X"')
    cut = tmp_path / "rank0.json"
    cut.write_bytes(text[: len(text) * 8 // 10])
    df, problems = read_df(cut)
    assert len(df) > 0 and df["start_ns"].max() < 10**18
    [said] = [p for p in problems if "baseTimeNanoseconds" in p]
    assert not said.lost and "not Unix time" in said
    df, problems = read_df(REAL / "hta" / "mi250-rocm6.2-minitoy-train.json.gz")
    assert problems == [] and df["start_ns"].min() > 10**18
