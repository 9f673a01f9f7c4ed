"""Classes of input that real tools write and the readers once got wrong
(issue 30), each on a small file made to show it: GPU work in the step
that launched it, collectives of every library, detection by structure,
hostile input that costs only its own trace, refusals with their reason."""

import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import REPO, one_rank_part
from traces import convert, readers
from traces.rules import PhaseRules

RULES = PhaseRules()
REAL = Path(__file__).parent / "data" / "real-traces"
# A process's own peak memory in KiB (VmHWM: getrusage's ru_maxrss keeps the
# parent's peak across fork and exec, a test runner's hundreds of MB).
PEAK_KIB = (
    "PEAK = lambda: int(next(line.split()[1] for line in open('/proc/self/status') "
    "if line.startswith('VmHWM:'))); "
)


def kineto(path: Path, events: list, **document) -> Path:
    """A PyTorch profiler trace of ``events`` (complete events by default)."""
    records = [{"ph": "X", "pid": 1, "tid": 1, **e} for e in events]
    doc = {"schemaVersion": 1, "traceEvents": records, **document}
    path.write_text(json.dumps(doc))
    return path


def read(path: Path):
    table, problems = readers.read(path, RULES, "r1")
    return table.to_pandas(), problems


def python(*args: str) -> subprocess.CompletedProcess:
    """This Python run in the checkout with ``args``, its output kept."""
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return python("-m", "traces.convert", *args)


def backward_launch(cpu: dict, gpu: dict, at: int, correlation: int) -> list[dict]:
    """A backward op on ``cpu``'s thread launching a kernel that runs on
    ``gpu``'s stream 100 us later, in the next step's window."""
    link = {"args": {"correlation": correlation}}
    return [
        {**cpu, "name": "MulBackward0", "cat": "cpu_op", "ts": at, "dur": 40},
        {**cpu, "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": at + 10, "dur": 1, **link},
        {**gpu, "name": "mul_kernel", "cat": "kernel", "ts": at + 100, "dur": 30, **link},
    ]


def test_gpu_work_takes_the_step_of_its_launch(tmp_path):
    """Backward runs on autograd's thread (no ProfilerStep there): a kernel
    it launches late in step 1 that runs on the GPU during step 2, or after
    the last step, is step 1's, as the launch is."""
    main, autograd, stream = {"tid": 1}, {"tid": 2}, {"pid": 0, "tid": 7}
    events = [
        {**main, "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100},
        {**main, "name": "ProfilerStep#2", "cat": "user_annotation", "ts": 100, "dur": 100},
        *backward_launch(autograd, stream, at=50, correlation=7),
        *backward_launch(autograd, stream, at=150, correlation=8),
    ]
    df, problems = read(kineto(tmp_path / "rank0.json", events))
    kernels = df[df["region"] == "mul_kernel"].sort_values("start_ns")
    assert kernels["step"].tolist() == [1, 2]
    assert set(kernels["phase"]) == {"backward"}


def test_real_rocm_trace_backward_kernels_are_in_their_step():
    """HTA's MI250 trace: the GPU-side copy of ProfilerStep#1 is shorter
    than the CPU one, and backward's kernels run after it: all of them are
    in step 1, with their launches."""
    df, _ = read(REAL / "hta" / "mi250-rocm6.2-minitoy-train.json.gz")
    gpu = df[df["location"].str.contains("stream")]
    assert len(gpu) == 18 and gpu["step"].notna().all() and set(gpu["step"]) == {1}


def test_collectives_of_every_library_are_collectives(tmp_path):
    """Symmetric-memory, custom and vendor all-reduces (an inference run's
    forward, record_shapes on) are all-reduces with their bytes, the kernel
    each launches inside it; a name that only looks like communication is
    reported, not silently counted as compute."""
    cpu, stream = {"tid": 1}, {"pid": 0, "tid": 7}
    shapes = {"Input Dims": [[1024, 64]], "Input type": ["c10::BFloat16"]}
    ops = [
        ("symm_mem::one_shot_all_reduce", "one_shot_all_reduce_kernel<bf16>"),
        ("_C_custom_ar::all_reduce", "void vllm::cross_device_reduce_1stage<bf16, 8>"),
        ("trtllm::allreduce", "oneShotAllReduceKernel"),
        ("oneccl_bindings_for_pytorch::allgather", "ccl_kernel"),
        ("hccl:broadcast", "hccl_kernel"),
        ("mylib::fancy_multimem_exchange", "exchange_kernel"),
    ]
    events = [{**cpu, "name": "## forward ##", "cat": "user_annotation", "ts": 0, "dur": 1000}]
    for i, (op, kernel) in enumerate(ops):
        at = 10 + 100 * i
        events += [
            {**cpu, "name": op, "cat": "cpu_op", "ts": at, "dur": 50, "args": dict(shapes)},
            {
                **cpu,
                "name": "cudaLaunchKernel",
                "cat": "cuda_runtime",
                "ts": at + 10,
                "dur": 5,
                "args": {"correlation": i + 1},
            },
            {
                **stream,
                "name": kernel,
                "cat": "kernel",
                "ts": at + 20,
                "dur": 200,
                "args": {"correlation": i + 1},
            },
        ]
    df, problems = read(kineto(tmp_path / "inference.json", events))
    found = df[df["collective"].notna()].set_index("region")
    assert found["collective"].to_dict() == {
        "symm_mem::one_shot_all_reduce": "allreduce",
        "_C_custom_ar::all_reduce": "allreduce",
        "trtllm::allreduce": "allreduce",
        "oneccl_bindings_for_pytorch::allgather": "allgather",
        "hccl:broadcast": "bcast",
    }
    assert set(found["bytes"]) == {1024 * 64 * 2}
    kernels = df[df["location"].str.endswith("/7") & ~df["region"].isin(["exchange_kernel"])]
    # an inference engine's collectives (in forward) are no gradient exchange
    assert kernels["op_id"].notna().all() and set(kernels["phase"]) == {"other_comm"}
    [note] = [p for p in problems if "look like communication" in p]
    assert not note.lost and "'mylib::fancy_multimem_exchange' (1)" in note


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_trace_opening_with_large_metadata_is_recognised(tmp_path, gzipped):
    """Detection walks the document's top-level keys to its events array,
    whatever comes before it (brackets and the key's name inside strings
    included): not the first 4 KiB."""
    meta = {"notes": "]}" * 40000 + '"traceEvents": [', "nested": [[{"a": "{["}]] * 3000}
    events = [
        {"ph": "X", "pid": 1, "tid": 1, "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 2}
    ]
    text = json.dumps({"metadata": meta, "traceEvents": events}).encode()
    assert len(text) > 64 * 1024
    path = tmp_path / ("big.json.gz" if gzipped else "big.json")
    path.write_bytes(gzip.compress(text) if gzipped else text)
    assert readers.detect(path) == "kineto"
    assert convert.traces_in(tmp_path) == [path]
    df, problems = read(path)
    assert df["region"].tolist() == ["aten::mm"] and problems == []


def test_a_json_document_without_events_is_still_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"run_id": "x", "nested": {"traceEvents": [{"ph": "X"}]}}))
    with pytest.raises(readers.TraceError, match="not a trace this converter knows"):
        readers.detect(path)


def hostile(folder: Path) -> dict:
    """One trace of each kind of hostile input, and a good one beside them."""
    good = {"ph": "X", "pid": 1, "tid": 1, "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 2}
    timeline = b'[\n{"name": "ALLREDUCE", "ph": "B", "ts": 10, "pid": 0, "args": %s},\n'
    files = {
        "good.json": json.dumps({"schemaVersion": 1, "traceEvents": [good]}).encode(),
        "utf8-timeline.json": b'[\n{"name": "process_name", "ph": "M", "pid": 0, "args": '
        b'{"name": "grad\xff\xfe"}},\n{"name": "ALLREDUCE", "ph": "B", "ts": 10, "pid": 0},\n'
        b'{"name": "", "ph": "E", "ts": 20, "pid": 0},\n',
        "deep-timeline.json": timeline % (b"[" * 100_000 + b"]" * 100_000),
        "deep-kineto.json": json.dumps({"schemaVersion": 1, "traceEvents": [dict(good, args="@")]})
        .encode()
        .replace(b'"@"', b"[" * 100_000 + b"]" * 100_000),
        "base-time.json": json.dumps(
            {"schemaVersion": 1, "traceEvents": [good], "baseTimeNanoseconds": 10**23}
        ).encode(),
        "text-numbers.json": json.dumps(
            {
                "schemaVersion": 1,
                "traceEvents": [
                    dict(good, ts=str(i), args={"l": [{"ts": "1"}, {"ts": "2"}]}) for i in range(7)
                ],
            }
        ).encode(),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


EXPECTED = {
    "deep-timeline.json": "nested too deeply to read",
    "deep-kineto.json": "nested too deeply to read",
    "base-time.json": "baseTimeNanoseconds 1e+23 puts its events beyond the year 2262",
    "text-numbers.json": "7 record(s) could not be read (7 with a number written as text",
}


@pytest.mark.parametrize("keep_going", [False, True])
def test_hostile_input_costs_only_its_own_trace(tmp_path, keep_going):
    """Invalid UTF-8, 100,000-deep nesting (Timeline and Kineto), a base
    time of 10^23, numbers written as text: one clear line each, no
    traceback, and the good trace of the same call is converted."""
    hostile(tmp_path)
    out = tmp_path / "phases.parquet"
    done = run_cli(str(tmp_path), "-o", str(out), *(["--keep-going"] if keep_going else []))
    assert "Traceback" not in done.stderr
    assert done.returncode == (0 if keep_going else 1)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    for name, reason in EXPECTED.items():
        mine = [line for line in errors if f"/{name}:" in line]
        assert mine and reason in mine[0], (name, errors)
    assert not [line for line in errors if "good.json" in line or "utf8" in line]
    [utf8] = [line for line in done.stderr.splitlines() if "UTF-8" in line]
    assert utf8.startswith("warning:") and "utf8-timeline.json: 2 invalid UTF-8 sequence" in utf8
    sources = {
        Path(s["path"]).name: s["rows"]
        for s in json.loads(convert.metadata_of(out)[b"ddlcompare.sources"])
    }
    assert sources["good.json"] == 1 and sources["utf8-timeline.json"] >= 1


def test_a_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    """256 MiB of blanks in 0.25 MB of gzip: refused once it inflates past
    its bound (64 MiB here), never inflated whole; the good trace beside it
    converts."""
    import zlib

    pack = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [pack.compress(b'{"schemaVersion": 1, "traceEvents": [')]
    parts += [pack.compress(b" " * (1 << 24)) for _ in range(16)]
    (tmp_path / "bomb.json.gz").write_bytes(b"".join([*parts, pack.compress(b"]}"), pack.flush()]))
    hostile(tmp_path)
    out = tmp_path / "phases.parquet"
    probe = (
        PEAK_KIB + "import sys; from traces import convert; code = convert.main(sys.argv[1:]); "
        "print('peak', PEAK()); sys.exit(code)"
    )
    done = python(
        "-c", probe, str(tmp_path / "bomb.json.gz"), str(tmp_path / "good.json"), "-o", str(out)
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    [bomb] = [line for line in done.stderr.splitlines() if "bomb.json.gz" in line]
    assert bomb.startswith("error:") and "a gzip bomb or not a trace; refused" in bomb
    assert "good.json: 1 intervals" in done.stdout
    peak_kib = int(done.stdout.split("peak ")[1].split()[0])
    assert peak_kib < 400 * 1024  # the bound (64 MiB) and the interpreter, not 256 MiB more


def test_ddlc_import_converts_traces_from_elsewhere(tmp_path):
    """``ddlc import`` is the converter as a user command: folders and
    files, one table, one error line per trace that cannot be read."""
    from conftest import ddlc

    (tmp_path / "in").mkdir()
    hostile(tmp_path / "in")
    out = tmp_path / "phases.parquet"
    done = ddlc("import", str(REAL / "hta"), str(tmp_path / "in" / "good.json"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"{out}: 2935 rows" in done.stdout
    done = ddlc("import", str(tmp_path / "in"), "-o", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert ddlc("import", str(tmp_path / "in"), "-o", str(out), "--keep-going").returncode == 0


def test_timeline_refusal_names_the_file_once(tmp_path):
    from conftest import ddlc

    hostile(tmp_path)
    done = ddlc("timeline", str(tmp_path / "text-numbers.json"), "-o", str(tmp_path / "t.json"))
    path = tmp_path / "text-numbers.json"
    assert done.returncode == 2 and "number written as text" in done.stderr
    assert done.stderr.startswith(f"error: {path}: 7 record(s)")  # not "{path}: {path}: ..."


def test_smaller_classes(tmp_path):
    """An interval ending before it begins is left out and counted; the
    forward's save_for_backward stays forward."""
    events = [
        {"name": "## forward ##", "cat": "user_annotation", "ts": 0, "dur": 100},
        {"name": "MyFn.save_for_backward", "cat": "python_function", "ts": 10, "dur": 5},
        {"name": "aten::mm", "cat": "cpu_op", "ts": 20, "dur": -5},
    ]
    df, problems = read(kineto(tmp_path / "t.json", events))
    assert df["region"].tolist() == ["## forward ##", "MyFn.save_for_backward"]
    assert set(df["phase"]) == {"forward"}
    [negative] = problems
    assert negative.lost and "1 complete event(s) of negative 'dur'" in negative


def test_timeline_activity_ending_before_it_begins_is_left_out(tmp_path):
    path = tmp_path / "horovod_timeline.json"
    path.write_text(
        '[\n{"name": "ALLREDUCE", "ph": "B", "ts": 20, "pid": 0},\n'
        '{"name": "", "ph": "E", "ts": 10, "pid": 0},\n'
        '{"name": "ALLREDUCE", "ph": "B", "ts": 30, "pid": 0},\n'
        '{"name": "", "ph": "E", "ts": 40, "pid": 0},\n'
    )
    df, problems = read(path)
    assert (df["dur_ns"] >= 0).all() and (df["region"] == "ALLREDUCE").sum() == 1
    [backwards] = [p for p in problems if "end before they begin" in p]
    assert backwards.lost and ": 1 activities" in backwards


def test_gpu_work_without_correlation_is_linked_by_its_flow(tmp_path):
    """A kernel without a correlation id is still its launch's, by the
    ``ac2g`` flow Kineto draws from the launch to it: step and phase too."""
    main, autograd, stream = {"tid": 1}, {"tid": 2}, {"pid": 0, "tid": 7}
    events = [
        {**main, "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100},
        {**main, "name": "ProfilerStep#2", "cat": "user_annotation", "ts": 100, "dur": 100},
        {**autograd, "name": "MulBackward0", "cat": "cpu_op", "ts": 50, "dur": 40},
        {**autograd, "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 60, "dur": 1},
        {**stream, "name": "mul_kernel", "cat": "kernel", "ts": 150, "dur": 30},
    ]
    flows = [
        {"ph": "s", "id": 9, "pid": 1, "tid": 2, "ts": 60, "cat": "ac2g", "name": "ac2g"},
        {
            "ph": "f",
            "id": 9,
            "pid": 0,
            "tid": 7,
            "ts": 150,
            "cat": "ac2g",
            "name": "ac2g",
            "bp": "e",
        },
    ]
    path = kineto(tmp_path / "t.json", events)
    doc = json.loads(path.read_text())
    doc["traceEvents"] += flows
    path.write_text(json.dumps(doc))
    df, problems = read(path)
    kernel = df[df["region"] == "mul_kernel"].iloc[0]
    assert kernel["parent"] == "cudaLaunchKernel" and kernel["step"] == 1
    assert kernel["phase"] == "backward"


def bytes_read() -> int:
    """Bytes this process has had read() give it so far (Linux)."""
    io = Path("/proc/self/io").read_text().split()
    return int(io[io.index("rchar:") + 1])


def test_json_that_is_no_trace_is_refused_on_its_first_key(tmp_path):
    """A PyTorch execution trace (a JSON object opening with "schema", then
    megabytes of "nodes") is refused from its first bytes, not walked for
    an events array to its end (half an hour for 1 GiB; bench/
    trace_read_json.py times the refusal); in a folder beside a real trace
    it is skipped with one line, not silently."""
    shutil.copy(REAL / "hta" / "mtia-allgathers-window.json.gz", tmp_path)
    node = {"name": "aten::mm", "id": 1, "inputs": {"values": [[1, 2, 3]] * 20}}
    other = tmp_path / "execution_trace.json"
    other.write_text(
        json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": [node] * 12000})
    )  # 3 MB
    assert other.stat().st_size > 3 << 20
    readers.names()  # every reader's module imported: their files read before
    before = bytes_read()
    with pytest.raises(readers.TraceError, match="not a trace this converter knows"):
        readers.detect(other)
    assert bytes_read() - before < 64 << 10
    out = tmp_path / "phases.parquet"
    done = run_cli(str(tmp_path), "-o", str(out))
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "execution_trace" in line]
    assert line.startswith(f"warning: {other}: skipped: not a trace")


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_large_value_before_the_events_is_skipped_not_walked(tmp_path, monkeypatch, gzipped):
    """A JSON object whose first key a trace may open with ("metadata": a
    model's safetensors index opens so) is walked for "traceEvents" past
    its values: megabytes of them are skipped whole, not token by token in
    Python (2 us a token: 6 minutes for 1 GiB); a "traceEvents" inside them
    counts for nothing, the one after them is read."""
    numbers = list(range(1_500_000))  # 12 MB of numbers
    fake = {"traceEvents": [{"ph": "X", "name": "fake", "ts": 1, "dur": 1}]}
    other = tmp_path / "model.safetensors.index.json"
    other.write_text(
        json.dumps({"metadata": {"numbers": numbers, "inner": fake}, "weight_map": {}})
    )
    trace = tmp_path / "rank0.json"
    event = {"ph": "X", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 2}
    trace.write_text(json.dumps({"samples": [numbers, fake], "traceEvents": [event]}))
    if gzipped:
        for path in (other, trace):
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes(), 1))
        other, trace = (path.with_name(path.name + ".gz") for path in (other, trace))
    readers.names()  # every reader's module imported: not timed
    readers.detect(trace)  # the scanner built: not timed
    cpu = time.process_time()
    with pytest.raises(readers.TraceError, match="not a trace this converter knows"):
        readers.detect(other)
    assert readers.detect(trace) == "kineto"
    assert time.process_time() - cpu < 1.0  # 4-5 s token by token on a 2-core EPYC guest
    df, problems = read(trace)
    assert list(df["region"]) == ["aten::add"] and problems == []
    monkeypatch.setenv("DDLC_JSON_SCANNER", "msgspec")  # no scanner: walked token by token
    trace.write_text(json.dumps({"samples": [numbers[:1000], fake], "traceEvents": [event]}))
    df, problems = read(trace)
    assert list(df["region"]) == ["aten::add"] and problems == []


def imported_by_ddlc_import(trace: Path | list[Path], out: Path) -> set[str]:
    """The modules `ddlc import TRACE... -o OUT` imports (it must succeed)."""
    traces = trace if isinstance(trace, list) else [trace]
    done = python(
        "-X", "importtime", "-m", "front.cli", "import", *map(str, traces), "-o", str(out)
    )
    assert done.returncode == 0, done.stderr
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}


def test_ddlc_import_imports_only_what_it_needs(tmp_path):
    """`ddlc import` converts traces: the design's machinery, the run
    harness, the frameworks and the analysis (a second of imports) are not
    loaded for it; of the analysis only the import-free numbers that the
    command line's help states (analysis/stage_limits.py)."""
    imported = imported_by_ddlc_import(
        REAL / "hta" / "mtia-allgathers-window.json.gz", tmp_path / "p.parquet"
    )
    unneeded = {"ddlcompare.plan", "ddlcompare.run", "frameworks", "jsonschema"}
    unneeded |= {m for m in imported if m.startswith("analysis.")} - {"analysis.stage_limits"}
    assert imported & unneeded == set(), sorted(imported & unneeded)


@pytest.mark.parametrize("config", ["[1, 2]", '"run"', "{", None])
def test_a_config_json_beside_a_trace_that_is_no_run_record(tmp_path, config):
    """An imported trace's folder may hold any config.json (a list, a
    string, broken JSON, a FIFO): the trace is read, under no run id (a FIFO
    is no file: the folder's name)."""
    trace = kineto(tmp_path / "rank0.json", [{"name": "aten::add", "ts": 1, "dur": 2}])
    if config is None:
        os.mkfifo(tmp_path / "config.json")
    else:
        (tmp_path / "config.json").write_text(config)
    assert convert.run_id_of(trace) == ("" if config else tmp_path.name)
    done = run_cli(str(trace), "-o", str(tmp_path / "out.parquet"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_ddlc_import_of_a_kineto_trace_with_steps_does_without_pandas(tmp_path):
    """A real Kineto trace with its ProfilerStep intervals (an H200's) is
    read and written without pandas (a tenth of the command's CPU on the
    bench's 3 M-event set) and without pyarrow.compute (its kernels are
    called by name: traces/arrow_kernels.py); the table is the one the
    in-process conversion gives."""
    trace = REAL / "kineto-cuda-h200" / "kineto-gpu-rank0.json.gz"
    out = tmp_path / "p.parquet"
    imported = imported_by_ddlc_import(trace, out)
    assert "traces.readers.kineto" in imported
    assert "pandas" not in imported
    assert "pyarrow.compute" not in imported
    table, _, errors = convert.convert([trace], RULES)
    assert errors == [] and pq.read_table(out).equals(table)


def test_ddlc_import_of_an_otf2_archive_with_steps_does_without_pandas(tmp_path):
    """Our own archive (step intervals on its rank) is read and written
    without pandas (a third of the command's start-up), without the ``otf2``
    bindings and without pyarrow.compute, two of them (the op_ids of the second shifted). The
    table is the one the in-process conversion gives."""
    from frameworks.otf2_writer import write_archive

    part = one_rank_part(
        intervals=[("data_load", 1, 0, 10, 20), ("forward", 1, 0, 20, 40)],
        collectives=[("allreduce", 4096, 45, 60)],
    )
    anchors = [write_archive([part], tmp_path / f"trace{i}") for i in range(2)]
    out = tmp_path / "p.parquet"
    imported = imported_by_ddlc_import(anchors, out)
    assert "traces.readers.otf2_reader" in imported
    assert "pandas" not in imported
    assert "otf2" not in imported  # the definitions read in C: 25-50 ms of imports
    assert "pyarrow.compute" not in imported  # some 30 ms more
    table, _, errors = convert.convert(anchors, RULES)
    assert errors == [] and pq.read_table(out).equals(table)
    assert table.column("op_id").drop_null().to_pylist() == [0, 4]  # 4 rows before it


def test_the_next_file_is_read_while_the_table_before_is_written(tmp_path, monkeypatch):
    """Two files read at a time: while the first file's table is written
    (held here, as a slow write would hold it), the two readers read the
    second and the third, not only the second."""
    for name in sorted(os.listdir(REAL / "hta"))[:3]:
        shutil.copy(REAL / "hta" / name, tmp_path / name)
    begun: list[str] = []
    read = readers.parts

    def parts(trace, *args):
        begun.append(trace.name)
        return read(trace, *args)

    monkeypatch.setattr(readers, "parts", parts)
    monkeypatch.setattr(convert, "READ_AHEAD", 2)
    tables = convert.parts([tmp_path], RULES, "r1", [], [])
    next(tables)  # the first file's table, being written
    deadline = time.monotonic() + 30
    while len(begun) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert begun == sorted(os.listdir(tmp_path))
    assert len(list(tables)) == 2


def test_ddlc_import_loads_its_modules_cheaply():
    """`ddlc import` makes no BLAS call: numpy is loaded with one OpenBLAS
    thread, not one per core spinning for work (some 45 ms of CPU), the
    setting not left for children to inherit; and the modules' objects are
    not collected while they load, nor after (about 9 ms)."""
    blas = (
        "import os\n"
        "from traces import loading\n"
        "with loading._blas_of_one_thread():\n"
        "    import numpy\n"
        "print(len(os.listdir('/proc/self/task')), os.environ.get(loading.OPENBLAS_THREADS))\n"
    )
    done = python("-c", blas)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "None"]
    collections = (
        "import gc\n"
        "from traces import loading\n"
        "gc.callbacks.append(lambda phase, info: print(phase))\n"
        "with loading._imports_uncollected():\n"
        "    from traces import convert\n"
        "print(gc.isenabled(), gc.get_freeze_count() > 10000)\n"
    )
    done = python("-c", collections)
    assert done.returncode == 0, done.stderr
    # no collection started before (those at the exit come after)
    assert done.stdout.split()[:2] == ["True", "True"]


def test_the_workflows_convert_as_ddlc_import_loads(tmp_path):
    """The workflows' ``python -m traces`` is ``python -m traces.convert``
    with the converter loaded as ``ddlc import`` loads it: the same table,
    the modules' objects frozen out of the collections."""
    trace = REAL / "scorep-8.4-mpi-pthread-np3" / "traces.otf2"
    out = tmp_path / "entry.parquet"
    entry = (
        "import gc, runpy, sys\n"
        f"sys.argv = ['traces', {str(trace)!r}, '-o', {str(out)!r}]\n"
        "try:\n"
        "    runpy.run_module('traces', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, gc.get_freeze_count() > 10000)\n"
    )
    done = python("-c", entry)
    assert done.stdout.split()[-2:] == ["0", "True"], done.stderr
    plain = run_cli(str(trace), "-o", str(tmp_path / "plain.parquet"))
    assert plain.returncode == 0, plain.stderr
    assert pq.read_table(out).equals(pq.read_table(tmp_path / "plain.parquet"))
    # statistics (for a filter to skip row groups) of the columns filtered by only
    chunks = pq.ParquetFile(out).metadata.row_group(0)
    with_statistics = {
        chunks.column(i).path_in_schema
        for i in range(chunks.num_columns)
        if chunks.column(i).is_stats_set
    }
    assert with_statistics == set(convert.FILTERED_BY)
    # compressed with LZ4, read many times by the analysis (pyarrow's "LZ4"
    # is Parquet's LZ4_RAW)
    codecs = {chunks.column(i).compression for i in range(chunks.num_columns)}
    assert codecs == {"LZ4"}
    for workflow in ("traces.smk", "analysis.smk"):
        text = (REPO / "workflows" / workflow).read_text()
        assert "-m traces {" in text and "-m traces.convert" not in text


def test_what_a_reader_imports_is_imported_by_the_thread_that_waits(monkeypatch):
    """A folder of Kineto files: numpy.ma (np.unique's) is imported by the
    thread that waits for the first files, not by a reader holding the
    lock; pyarrow.compute is not imported at all (traces/arrow_kernels.py)."""
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(
        readers,
        "import_ahead",
        lambda name: asked.append((name, threading.current_thread().name)),
    )
    convert.convert([REAL / "hta"], RULES, "r1")
    assert asked == [("kineto", threading.main_thread().name)]
    fresh = "import sys; from traces import readers; readers.import_ahead('kineto'); "
    fresh += "print('pyarrow.compute' in sys.modules, 'numpy.ma' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_the_parquet_writer_is_imported_while_the_first_files_are_read(tmp_path, monkeypatch):
    """pyarrow.parquet (some 15 ms of imports) is not imported with
    traces.convert, before any file is read, but by the thread that waits
    for the first files of a folder, while they are read; the table is
    written all the same."""
    fresh = "import sys; from traces import convert; print('pyarrow.parquet' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "False", done.stderr
    asked: list[tuple[str, str]] = []
    real = convert.importlib.import_module

    def recorded(name):
        asked.append((name, threading.current_thread().name))
        return real(name)

    monkeypatch.setattr(convert.importlib, "import_module", recorded)
    rows, _, errors = convert.write([REAL / "hta"], tmp_path / "t.parquet", RULES, "r1")
    assert ("pyarrow.parquet", threading.main_thread().name) in asked
    assert rows == pq.read_table(tmp_path / "t.parquet").num_rows > 0 and not errors


def test_files_read_ahead_in_threads_give_what_one_at_a_time_gives(tmp_path, monkeypatch):
    """A folder's files read several at a time (in threads, while the one
    before is written) give the table, sources and errors, in file order,
    that reading them one after the other gives: real Kineto traces with a
    broken file and a file of no trace between them, and an OTF2 archive
    (read part by part, not ahead)."""
    for name in sorted(os.listdir(REAL / "hta")):
        shutil.copy(REAL / "hta" / name, tmp_path / name)
    (tmp_path / "m-broken.json").write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X",')
    (tmp_path / "n-no-trace.json").write_text('{"schema": "1.0.1", "nodes": []}')
    shutil.copytree(REAL / "scorep-8.4-mpi-openmp-np2", tmp_path / "scorep")
    paths = [tmp_path]  # its scorep/traces.otf2 too, as a run folder's
    monkeypatch.setattr(convert, "READ_AHEAD", 1)
    one_at_a_time = convert.convert(paths, RULES, "r1")
    monkeypatch.setattr(convert, "READ_AHEAD", 3)
    ahead = convert.convert(paths, RULES, "r1")
    assert ahead[0].equals(one_at_a_time[0])
    assert ahead[1:] == one_at_a_time[1:]
    read = [Path(s["path"]).name for s in ahead[1] if s["rows"]]
    assert sorted(read) == sorted([*os.listdir(REAL / "hta"), "traces.otf2"])
    assert any("m-broken.json" in e for e in ahead[2])
    out = tmp_path / "written.parquet"
    rows, sources, errors = convert.write(paths, out, RULES, "r1")
    assert pq.read_table(out).equals(ahead[0]) and (sources, errors) == ahead[1:]


def test_the_events_of_a_trace_larger_than_the_walk_limit_are_found(tmp_path, monkeypatch):
    """WALK_LIMIT bounds how much of a file is read to tell its format, not
    the reader's walk to the events array of a document already in memory:
    a trace over the limit (1 GiB) found none and was decoded whole."""
    events = [{"name": f"op{k}", "ts": k * 10, "dur": 5} for k in range(2000)]
    data = kineto(tmp_path / "t.json", events).read_bytes()
    monkeypatch.setattr(readers, "WALK_LIMIT", 1 << 10)
    assert len(data) > readers.WALK_LIMIT
    opened = readers.events_opened_at(data)
    assert opened == data.index(b'"traceEvents": [') + len(b'"traceEvents": [')


@pytest.mark.parametrize("before_events", [1 << 19, 3 << 20], ids=["within", "past the limit"])
def test_a_document_with_no_events_in_its_first_walk_limit_bytes_is_refused(
    tmp_path, monkeypatch, before_events
):
    """A trace opens its events array after a few KiB of keys; a document
    that opens with a key a trace may open with ("metadata") and holds none
    in its first WALK_LIMIT bytes is refused there, not read on through its
    whole value (a 1 GiB one: 7.6 s and 3.2 GB, its value held whole); nor
    read past the limit by the skip's growing reads (seven times what it
    holds: 1 MiB, then 7 more)."""
    monkeypatch.setattr(readers, "WALK_LIMIT", 3 << 19)
    numbers = list(range(before_events // 8))  # about 8 bytes of JSON each
    event = {"ph": "X", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 2}
    doc = tmp_path / "rank0.json"
    doc.write_text(json.dumps({"metadata": {"numbers": numbers}, "traceEvents": [event]}))
    readers.names()  # every reader's module imported
    read = []
    upto = readers._upto
    monkeypatch.setattr(readers, "_upto", lambda *a: read.append(upto(*a)) or read[-1])
    if before_events < readers.WALK_LIMIT:
        assert readers.detect(doc) == "kineto"
    else:
        with pytest.raises(readers.TraceError, match="not a trace this converter knows"):
            readers.detect(doc)
        assert sum(map(len, read)) <= readers.WALK_LIMIT + (1 << 20)  # a read past it, no more


@pytest.mark.parametrize("engine", ["scanner", "msgspec"])
def test_untimed_events_are_counted_as_what_they_are(tmp_path, monkeypatch, engine):
    """A complete event without 'ts' or beyond int64 nanoseconds is skipped
    and counted; one without 'dur' is read as an instant (the message said
    it was skipped among those without a valid 'dur')."""
    if engine == "msgspec":
        monkeypatch.setenv("DDLC_JSON_SCANNER", "msgspec")
    events = [
        {"name": "no_ts", "dur": 4},
        {"name": "far", "ts": 1e30, "dur": 1},
        {"name": "long", "ts": 5, "dur": 1e30},
        {"name": "instant", "ts": 6},
        {"name": "kept", "ts": 7, "dur": 3},
    ]
    df, problems = read(kineto(tmp_path / "rank0.json", events))
    assert list(df["region"]) == ["instant", "kept"]
    assert (df["end_ns"] - df["start_ns"]).tolist() == [0, 3000]
    (said,) = [p for p in map(str, problems) if "without a valid 'ts'" in p]
    assert ": 3 complete event(s) without a valid 'ts'" in said
    assert "one without 'dur' is read as an instant, zero length" in said


@pytest.mark.parametrize(
    "given, name, rank, used",
    [
        (3, "trace.json", 3, None),
        (None, "rank7.json", 7, None),
        ("3", "trace.json", 0, "rank 0"),
        (3.0, "worker_rank5.json", 5, "the rank in the file's name"),
        (True, "trace.json", 0, "rank 0"),
        (-1, "trace.json", 0, "rank 0"),
        (1 << 40, "trace.json", 0, "rank 0"),
    ],
)
def test_a_rank_that_is_none_is_named_not_taken(tmp_path, given, name, rank, used):
    """distributedInfo.rank of text, a fraction, true, negative or past the
    rank column's int32 is no rank: the file name's (else 0) is used, and
    said; true was rank 1, -1 rank -1, all of them without a word."""
    event = {"name": "aten::add", "ts": 5, "dur": 2}
    info = {} if given is None else {"distributedInfo": {"rank": given, "world_size": 8}}
    df, problems = read(kineto(tmp_path / name, [event], **info))
    assert df["rank"].tolist() == [rank]
    said = [p for p in map(str, problems) if "distributedInfo.rank" in p]
    assert said == (
        []
        if used is None
        else [
            f"{tmp_path / name}: distributedInfo.rank {json.dumps(given)} is no rank (a whole "
            f"number from 0); {used} ({rank}) is used"
        ]
    )
