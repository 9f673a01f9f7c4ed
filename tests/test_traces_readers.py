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
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import REPO
from traces import convert, readers
from traces.readers import TraceError
from traces.rules import PhaseRules, RulesError
from traces.table import COLUMNS, SCHEMA_VERSION

# CI clones the repository next to a `shared` folder.
FIXTURES = Path(REPO).parent / "shared" / "fixtures" / "real-traces"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"no fixtures at {FIXTURES}")
needs_otf2_print = pytest.mark.skipif(shutil.which("otf2-print") is None,
                                      reason="otf2-print (Debian otf2-tools) not installed")
RULES = PhaseRules()


def read(path: Path):
    table, problems = readers.read(path, RULES, "r1")
    return table.to_pandas(), problems


@functools.lru_cache(maxsize=None)
def read_fixture(name: str):
    """Large fixtures are read once per test session."""
    return read(FIXTURES / name)


def otf2_print_counts(anchor: Path) -> Counter:
    """(record kind, location) -> count, from otf2-print's event listing."""
    out = subprocess.run(["otf2-print", str(anchor)], capture_output=True, text=True,
                         check=True).stdout
    counts = Counter()
    for line in out.splitlines():
        found = re.match(r"^([A-Z_]+)\s+(\d+)\s+\d+", line)
        if found:
            counts[found.group(1), int(found.group(2))] += 1
    return counts


def leaves_per_location(counts: Counter) -> Counter:
    return Counter({loc: n for (kind, loc), n in counts.items() if kind == "LEAVE"})


@needs_fixtures
@needs_otf2_print
def test_scorep_71_ping_pong_matches_otf2_print():
    anchor = FIXTURES / "pipit-ping-pong-otf2" / "traces.otf2"
    df, problems = read(anchor)
    counts = otf2_print_counts(anchor)
    assert problems == []
    assert len(df) == sum(leaves_per_location(counts).values()) == 42
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
    anchor = FIXTURES / "scorep-8.4-horovod-torch-mpi-np2" / "traces.otf2"
    df, problems = read(anchor)
    counts = otf2_print_counts(anchor)
    assert len(df) == sum(leaves_per_location(counts).values())
    # Horovod's background thread shares the master thread's location: its
    # MPI_Allreduce regions overlap the user regions without nesting.
    assert any("overlap" in p for p in problems)
    for rank in (0, 1):
        mine = df[(df["rank"] == rank) & df["region"].str.startswith("user:")]
        assert len(mine) == 100 and mine["step"].nunique() == 20
        for _, step in mine.sort_values("start_ns").groupby("step"):
            assert list(step["phase"]) == ["data_load", "forward", "backward", "grad_comm",
                                           "optimizer"]
    allreduce = df[df["region"] == "MPI_Allreduce"]
    ends = sum(n for (kind, _), n in counts.items() if kind == "MPI_COLLECTIVE_END")
    assert len(allreduce) + len(df[df["region"].str.startswith("MPI_") & df["collective"].notna()
                                   & (df["region"] != "MPI_Allreduce")]) <= ends
    assert set(allreduce["collective"]) == {"allreduce"}
    assert set(allreduce["phase"]) == {"grad_comm"}
    assert allreduce["bytes"].max() == 824872


@needs_fixtures
@needs_otf2_print
def test_scorep_90_otf2_31_with_metric_locations():
    anchor = FIXTURES / "fastotf2-simple-mi300" / "traces.otf2"
    df, problems = read(anchor)
    counts = otf2_print_counts(anchor)
    assert problems == []
    assert len(df) == sum(leaves_per_location(counts).values()) == 40
    assert set(df["node"]) == {"faraday.ftpn.ornl.gov"}
    assert df["location"].str.endswith("Master thread").any()
    assert counts["METRIC", 0] == 0  # metric samples sit on their own locations, not read


@needs_fixtures
def test_horovod_timeline_unterminated_array():
    path = FIXTURES / "horovod-timeline-IgorDavidyuk-cpu3" / "timeline.json"
    text = path.read_text()
    assert not text.rstrip().endswith("]")
    records = json.loads(text.rstrip().rstrip(",") + "]")
    df, problems = read(path)
    assert problems == []
    assert len(df) == sum(r.get("ph") == "E" for r in records)  # one row per Begin/End pair
    assert set(df["rank"]) == {0}  # pid is a tensor: rank 0's view of all of them
    tensors = {r["args"]["name"] for r in records if r.get("name") == "process_name"}
    assert {loc.removeprefix("tensor:") for loc in df["location"]} <= tensors
    top = df[df["region"] == "ALLREDUCE"]
    assert len(top) == sum(r.get("name") == "ALLREDUCE" for r in records)
    assert set(top["phase"]) == {"grad_comm"} and set(top["collective"]) == {"allreduce"}
    # the tensor's dtype and shape on the End record give the bytes: [3,3,64,64] float32
    assert (top["bytes"] == 3 * 3 * 64 * 64 * 4).sum() == 498
    nested = df[df["region"] == "MPI_ALLREDUCE"]
    assert set(nested["parent"]) == {"ALLREDUCE"} and set(nested["depth"]) == {1}


@needs_fixtures
@pytest.mark.parametrize("name,steps", [
    ("kineto-hta-ddp-ws2-v100-rank1/rank-1.json.gz", 5),
    ("kineto-tb-resnet50-numworkers0/worker0.pt.trace.json.gz", 6)])
def test_kineto_old_and_new_schema(name, steps):
    path = FIXTURES / name
    doc = json.loads(gzip.open(path).read())
    df, problems = read_fixture(name)
    df = df.copy()
    assert len(df) == sum(e.get("ph") == "X" for e in doc["traceEvents"])
    assert df["region"].str.startswith("ProfilerStep#").sum() == steps
    assert set(df.loc[df["region"].str.startswith("ProfilerStep#"), "phase"]) == {"step"}
    assert df["step"].nunique() == steps
    assert set(df.loc[df["region"].str.startswith("Optimizer.step"), "phase"]) == {"optimizer"}
    rank = doc.get("distributedInfo", {}).get("rank", 0)
    assert set(df["rank"]) == {rank}
    # a GPU kernel takes the phase of the code that launched it
    kernels = df[df["region"].str.contains("backward", case=False) & (df["depth"] > 0)
                 & df["parent"].str.startswith("cuda", na=False)]
    assert len(kernels) and (kernels["phase"] == "backward").mean() > 0.9


@needs_fixtures
def test_kineto_nccl_allreduce_is_grad_comm():
    df, _ = read_fixture("kineto-hta-ddp-ws2-v100-rank1/rank-1.json.gz")
    nccl = df[df["region"].str.startswith(("nccl:all_reduce", "ncclKernel_AllReduce"))]
    assert len(nccl) == 4040
    assert set(nccl["phase"]) == {"grad_comm"} and set(nccl["collective"]) == {"allreduce"}


@needs_fixtures
def test_convert_cli_writes_versioned_table(tmp_path):
    out = tmp_path / "phases.parquet"
    done = subprocess.run([sys.executable, "-m", "traces.convert",
                           str(FIXTURES / "pipit-ping-pong-otf2"),
                           str(FIXTURES / "horovod-timeline-IgorDavidyuk-cpu3" / "timeline.json"),
                           "-o", str(out), "--run-id", "r9"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    table = pq.read_table(out)
    assert tuple(table.column_names) == COLUMNS
    meta = table.schema.metadata
    assert meta[b"ddlcompare.schema_version"] == str(SCHEMA_VERSION).encode()
    assert int(meta[b"ddlcompare.rules_version"]) == RULES.version
    assert set(table.column("run_id").to_pylist()) == {"r9"}
    assert set(table.column("source").to_pylist()) == {"otf2", "horovod_timeline"}
    assert table.num_rows == 42 + 20930


def truncated_copy(src: Path, dest: Path, keep: float) -> Path:
    data = src.read_bytes()
    dest.write_bytes(data[:int(len(data) * keep)])
    return dest


def otf2_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "ping-pong"
    shutil.copytree(FIXTURES / "pipit-ping-pong-otf2", dest)
    for path in dest.rglob("*"):
        path.chmod(0o644 if path.is_file() else 0o755)
    return dest


@needs_fixtures
@pytest.mark.parametrize("engine", ["fastotf2", "python"])
@pytest.mark.parametrize("damage", ["cut_events", "garbage_events", "cut_definitions",
                                    "no_anchor"])
def test_broken_otf2_gives_clear_error_naming_the_file(tmp_path, monkeypatch, damage, engine):
    monkeypatch.setenv("DDLC_OTF2_READER", engine)
    archive = otf2_copy(tmp_path)
    events = archive / "traces" / "0.evt"
    if damage == "cut_events":
        truncated_copy(events, events, 0.5)
    elif damage == "garbage_events":
        events.write_bytes(b"\x07" * 64 + events.read_bytes()[64:])
    elif damage == "cut_definitions":
        truncated_copy(archive / "traces.def", archive / "traces.def", 0.4)
    else:
        (archive / "traces.otf2").write_bytes(b"not an anchor")
    with pytest.raises(TraceError, match=re.escape(str(archive / "traces.otf2"))):
        read(archive / "traces.otf2")


@needs_fixtures
def test_broken_json_traces_give_clear_errors(tmp_path):
    kineto = truncated_copy(FIXTURES / "kineto-tb-resnet50-numworkers0" /
                            "worker0.pt.trace.json.gz", tmp_path / "w.pt.trace.json.gz", 0.5)
    with pytest.raises(TraceError, match=re.escape(str(kineto)) + ".*truncated or corrupt"):
        read(kineto)
    plain = tmp_path / "k.json"
    plain.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    with pytest.raises(TraceError, match=re.escape(str(plain))):
        read(plain)
    # A Horovod Timeline cut inside a record keeps its complete records.
    src = FIXTURES / "horovod-timeline-IgorDavidyuk-cpu3" / "timeline.json"
    cut = truncated_copy(src, tmp_path / "timeline.json", 0.5)
    df, problems = read(cut)
    assert 0 < len(df) < 20930 and any("cut inside a record" in p for p in problems)


@needs_fixtures
def test_one_broken_trace_does_not_stop_the_others(tmp_path):
    archive = otf2_copy(tmp_path)
    truncated_copy(archive / "traces" / "1.evt", archive / "traces" / "1.evt", 0.3)
    out = tmp_path / "phases.parquet"
    code = convert.main([str(archive), str(FIXTURES / "fastotf2-simple-mi300"), "-o", str(out)])
    assert code == 1
    errors = convert.errors_of(out)
    assert len(errors) == 1 and str(archive / "traces.otf2") in errors[0]
    assert pq.read_table(out).num_rows == 40
    assert convert.main([str(archive), "-o", str(out), "--keep-going"]) == 0
    assert pq.read_table(out).num_rows == 0


def test_run_without_trace_gives_an_empty_table(tmp_path):
    out = tmp_path / "phases.parquet"
    assert convert.main([str(tmp_path), "-o", str(out)]) == 0
    table = pq.read_table(out)
    assert table.num_rows == 0 and tuple(table.column_names) == COLUMNS
    assert convert.errors_of(out) == []


def test_unknown_file_and_bad_rules_are_named(tmp_path):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello")
    with pytest.raises(TraceError, match=re.escape(str(odd))):
        readers.read(odd, RULES)
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules:\n  - {pattern: 'x', phase: fwd}\n")
    with pytest.raises(RulesError, match="rule 1: unknown phase 'fwd'"):
        PhaseRules(rules)


def test_rules_first_match_and_sources():
    assert RULES.match("user:forward", "otf2") == ("forward", None)
    assert RULES.match("MPI_Allreduce", "otf2") == ("grad_comm", "allreduce")
    assert RULES.match("MEMCPY_IN_FUSION_BUFFER", "horovod_timeline")[0] == "grad_comm"
    assert RULES.match("MEMCPY_IN_FUSION_BUFFER", "kineto") == (None, None)
    assert RULES.match("ProfilerStep#7", "kineto") == ("step", None)
    assert RULES.match("aten::conv2d", "kineto") == (None, None)  # takes its parent's phase
