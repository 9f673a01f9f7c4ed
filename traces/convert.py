"""Convert traces into the phase table (see traces/table.py).

    python -m traces.convert RUN_DIR_OR_TRACE ... -o phases.parquet

A run directory contributes every trace a run leaves there, and a folder of
traces from elsewhere every file some reader recognises (each reader in
traces/readers/ names the files it looks for). A Score-P experiment of ranks
traced without MPI is one per rank (``scorep/rank<r>/traces.otf2``): each
one's rows take the rank in its folder's name. A file is read as what it is.
A trace that cannot be read gives one ``error:`` line naming the file and
why; the others are converted all the same, and the table is written. What
a reader read but had to leave out gives a ``warning:`` line, and an
``error:`` line when records of the file are missing from the table. The
Parquet metadata keeps the schema version, the rules version, each source
file and each error.
Exit status: 0 when every record of every trace is in the table; 1 when a
trace could not be read, records were lost, or nothing was converted (a
folder with no trace, traces with no interval); 0 with --keep-going.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import re
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from runfiles.atomic import refuse_inputs, refuse_to_replace, replacing
from runfiles import files, names
from runfiles.files import NotRegular
from runfiles.names import CONFIG
from traces import readers
from traces.memory import files_at_once, reuse_freed_memory
from traces.readers import TraceError, otf2_reader
from traces.rules import RULES_FILE, PhaseRules, RulesError
from traces.table import SCHEMA, SCHEMA_VERSION, empty_table

SCOREP_DIR = names.SCOREP_DIR
# One Score-P experiment per rank (ddlcompare/run/tracers.py, --mpp=none): each
# holds one process, which Score-P calls rank 0.
PER_RANK_EXPERIMENT = re.compile(r"(?:^|/)rank(\d+)/traces\.otf2$")


def traces_in(path: Path, skipped: list | None = None) -> list[Path]:
    """The trace files a path stands for; ``skipped``: filled with the files
    of a folder that look like traces by name but are none."""
    return [path] if path.is_file() else readers.traces_in(path, skipped)


def rank_of_experiment(trace: Path) -> int | None:
    """The rank a per-rank Score-P experiment was recorded for (from its folder)."""
    found = PER_RANK_EXPERIMENT.search(trace.as_posix())
    return int(found.group(1)) if found else None


def with_rank(table: pa.Table, rank: int) -> pa.Table:
    """Every row on ``rank``: a per-rank experiment's one process, whatever
    Score-P numbered it, with all of its threads."""
    at = table.schema.get_field_index("rank")
    return table.set_column(
        at, table.schema.field(at), pa.repeat(pa.scalar(rank, pa.int32()), table.num_rows)
    )


def with_epochs_of_run(table: pa.Table, trace: Path) -> pa.Table:
    """A Score-P experiment's steps (user:step regions, numbered in order)
    carry no epoch: the run's ``steps.rank<r>.tsv`` says each step's epoch."""
    run = next((p.parent for p in trace.parents if p.name == SCOREP_DIR), None)
    if run is None or table.num_rows == 0:
        return table
    steps = list(run.glob(names.STEPS_GLOB))
    if not steps:
        return table
    import pandas as pd  # here only: a trace from elsewhere needs none of it
    import pyarrow.compute as pc

    from runfiles.tables import Damaged, read_tsv

    try:  # the run's file at fault, not the trace
        epochs = [
            read_tsv(f, ("epoch", "step"), min_rows=0)[["epoch", "step"]].assign(
                rank=int(f.name[len("steps.rank") : -len(".tsv")])
            )
            for f in steps
        ]
    except Damaged as exc:
        raise TraceError(
            f"{trace}: its run's {exc}, which gives its steps their epochs; "
            "a damaged run: ./ddlc check --rerun queues it to run again"
        ) from None
    rows = table.select(["rank", "step"]).to_pandas()
    found = rows.merge(pd.concat(epochs), on=["rank", "step"], how="left")["epoch"]
    at = table.schema.get_field_index("epoch")
    filled = pa.array(found.to_numpy(dtype="float64"), from_pandas=True).cast(pa.int64())
    return table.set_column(at, table.schema.field(at), pc.coalesce(table.column("epoch"), filled))


def of_run(table: pa.Table, trace: Path) -> pa.Table:
    """A part of a trace with what its place in the run folder says."""
    if (rank := rank_of_experiment(trace)) is not None:
        table = with_rank(table, rank)
    return with_epochs_of_run(table, trace)


def run_id_of(path: Path) -> str:
    """The run's id from its config.json; for a trace from elsewhere (an
    imported one), the name of its folder, so that it stays identifiable."""
    folder = path if path.is_dir() else path.parent
    for candidate in (folder, *folder.parents[:3]):
        config = candidate / CONFIG
        if config.is_file():
            try:
                found = files.read_json(config)
            except (OSError, ValueError):
                return ""
            return str(found.get("run_id", "")) if isinstance(found, dict) else ""
    return folder.parent.name if folder.name in ("traces", "trace") else folder.name


def parts(paths: list[Path], rules: PhaseRules, run_id: str | None, sources: list, errors: list):
    """The tables of every readable trace, part by part (an OTF2 archive a
    group of ranks at a time), as they are read; fills ``sources`` and
    ``errors`` (the traces that could not be read and the records lost)."""
    try:
        yield from _parts(paths, rules, run_id, sources, errors)
    finally:
        readers.let_go()


def _parts(paths: list[Path], rules: PhaseRules, run_id: str | None, sources: list, errors: list):
    rows_before = 0
    spans: dict[tuple, list] = {}  # (run_id, rank): the Kineto traces that held it, and when
    with ThreadPoolExecutor(READ_AHEAD) as pool:
        for path in paths:
            if not path.exists():
                errors.append(f"{path}: no such file or directory")
                continue
            if not (path.is_file() or path.is_dir()):  # not "no trace in this folder"
                kind = files.kind(path.stat().st_mode)
                errors.append(f"{path}: {kind}, neither a trace file nor a folder; give a file")
                continue
            skipped: list[Path] = []
            found = traces_in(path, skipped)
            if not found:
                errors.append(
                    f"{path}: no trace this converter knows in this folder (its "
                    f"readers look for {', '.join(_patterns())})"
                )
            else:  # one line each: not silently
                sources += [
                    {"path": str(p), "format": None, "rows": 0, "skipped": True} for p in skipped
                ]
            for trace, opened in _read_ahead(found, rules, run_id, pool):
                source = {"path": str(trace), "format": None, "rows": 0, "problems": []}
                try:
                    source["format"], trace_parts = opened()
                    for table, problems in trace_parts:
                        errors += [str(p) for p in problems if getattr(p, "lost", False)]
                        source["problems"] += [
                            str(p) for p in problems if not getattr(p, "lost", False)
                        ]
                        reader = (table.schema.metadata or {}).get(otf2_reader.META_READER)
                        if reader:
                            source["reader"] = reader.decode()  # fastotf2, or python (fallback)
                        source["rows"] += table.num_rows
                        table = of_run(table, trace)
                        if source["format"] == "kineto" and table.num_rows:
                            source["problems"] += _rank_again(table, trace, spans)
                        yield _offset_op_ids(table, rows_before)
                        rows_before += table.num_rows
                        del table  # before the next part is read (write's loop)
                except TraceError as exc:
                    errors.append(str(exc))
                    if not source["rows"]:
                        continue
                except Exception as exc:  # noqa: BLE001 (one trace's fault costs only that trace)
                    errors.append(
                        f"{trace}: could not be read ({type(exc).__name__}: {exc}); input this "
                        "reader does not expect: please report it with the file"
                    )
                    if not source["rows"]:
                        continue
                if source["rows"] == 0:
                    errors.append(f"{trace}: no interval in this trace (nothing to convert)")
                sources.append(source)


def _rank_again(table: pa.Table, trace: Path, spans: dict) -> list[str]:
    """A Kineto trace is one process, its rank from distributedInfo or the
    file's name, else 0: a trace of a run that holds a rank at the same
    time as another trace does is another process mixed with it as one
    rank (a folder of traces without either: each was rank 0, and nothing
    said so). Traces of one rank at other times are the same process's
    profiling windows. ``spans``: (run, rank) -> [(trace, start, end)]."""
    first = {name: table.column(name).chunks[0] for name in ("run_id", "rank")}
    key = (first["run_id"][0].as_py(), first["rank"][0].as_py())
    start = min(
        int(_values(chunk).min()) for chunk in table.column("start_ns").chunks if len(chunk)
    )
    end = max(int(_values(chunk).max()) for chunk in table.column("end_ns").chunks if len(chunk))
    held = spans.setdefault(key, [])
    held.append((trace, start, end))
    for other, other_start, other_end in held[:-1]:
        if other != trace and start < other_end and other_start < end:
            return [
                f"{trace}: rank {key[1]} of run {key[0]!r} at the same time as {other}: two "
                "processes, their rows mixed as one rank's (a trace's rank comes from its "
                "distributedInfo, else from its file's name: rename them rank0.json, "
                "rank1.json ...)"
            ]
    return []


def _values(times: pa.Int64Array) -> np.ndarray:
    """An int64 column's values, read in place (``to_numpy`` imports
    pyarrow.compute, which a Kineto conversion does without)."""
    values = np.frombuffer(times.buffers()[1], dtype=np.int64, count=times.offset + len(times))
    return values[times.offset :]


# Files read at once, each in a thread of its own, while the table of the
# one before is written: a folder of Kineto traces (a file per rank) is read
# on two cores (the scanner, the name lookups and Arrow let go of the
# interpreter's lock). Two at most: each holds a whole file and its table
# (a trace's file may be a gigabyte); the table being written is a third.
READ_AHEAD = files_at_once()


def _read_ahead(traces: list[Path], rules: PhaseRules, run_id: str | None, pool):
    """(trace, opened) of each trace, in order; ``opened()`` gives (its
    format, its parts) or raises what reading it raised. A file that its
    reader reads in one part is read in ``pool``, READ_AHEAD of them at a
    time, the next begun as soon as one is read: the cores go on reading
    while the parts of the one read are consumed (written); one read in
    parts (an OTF2 archive) is read part by part as its parts are asked
    for, so that memory holds one of them."""
    started: dict[int, Callable] = {}
    kinds: set[str] = set()  # of the files read in the pool

    def start(i: int) -> None:
        trace = traces[i]
        rid = run_id if run_id is not None else run_id_of(trace)
        try:
            name = readers.detect(trace)
        except TraceError as exc:
            started[i] = functools.partial(_raise, exc)
            return
        if readers.in_one_part(name):
            future = pool.submit(lambda: list(readers.parts(trace, rules, rid, name)))
            kinds.add(name)
            started[i] = lambda: (name, _drained(future.result()))
        else:
            started[i] = lambda: (name, _one_part_ahead(readers.parts(trace, rules, rid, name)))

    # the READ_AHEAD files being read and the one whose table is being
    # written (one reader alone reads and writes in turn, one core's way)
    in_hand = READ_AHEAD + 1 if READ_AHEAD > 1 else 1
    imported: set[str] = set()
    for i, trace in enumerate(traces):
        for ahead in range(i, min(i + in_hand, len(traces))):
            if ahead not in started:
                start(ahead)
        for name in kinds - imported:  # while the pool's first reads run
            readers.import_ahead(name)
            for module in WRITER_IMPORTS:
                importlib.import_module(module)
            imported.add(name)
        yield trace, started.pop(i)


def _one_part_ahead(trace_parts):
    """The parts of a trace read in parts (an OTF2 archive), each read in a
    thread while the one before is consumed (written), where two cores are
    free for it (READ_AHEAD): the C reader and Arrow's Parquet encoding let
    go of the interpreter's lock, so part k+1 is read on one core while
    part k is written on the other. Memory then holds two parts, not one:
    part k+2 is begun once part k is written and part k+1 taken. The first
    part is read here, as before (an archive of one part, most, is read
    as it was, from this thread's memory); one thread reads the others, so
    that each reuses the memory of those before it (its glibc arena)."""
    if READ_AHEAD < 2:  # one core: read and write in turn
        yield from trace_parts
        return
    part = next(trace_parts, None)
    with ThreadPoolExecutor(1) as reading:
        while part is not None:
            ahead = reading.submit(next, trace_parts, None)
            yield part
            del part  # written: its memory goes back before part k+2 is read
            part = ahead.result()


def _raise(exc: Exception):
    raise exc


def _drained(parts: list):
    """The parts, each let go of by the list as it is given (the list
    outlives them in the future that read them)."""
    parts.reverse()
    while parts:
        yield parts.pop()


def convert(paths: list[Path], rules: PhaseRules, run_id: str | None = None):
    """(table, sources, errors): every readable trace's rows in one table,
    in memory."""
    sources, errors = [], []
    tables = list(parts(paths, rules, run_id, sources, errors))
    table = pa.concat_tables(tables) if tables else empty_table()
    return table, sources, errors


def write(paths: list[Path], out: Path, rules: PhaseRules, run_id: str | None = None):
    """Converts into ``out`` part by part, each part a row group written as
    soon as it is read, so that memory holds one part, not the whole table
    (readers can then read only the row groups and columns they need).
    Returns (rows, sources, errors), also kept in the file's metadata."""
    sources, errors = [], []
    meta = dict(empty_table().schema.metadata or {})
    meta.update(
        {
            b"ddlcompare.schema_version": str(SCHEMA_VERSION).encode(),
            b"ddlcompare.rules_version": str(rules.version).encode(),
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp, contextlib.ExitStack() as opened:
        writer, rows = None, 0
        for table in parts(paths, rules, run_id, sources, errors):
            writer = writer or opened.enter_context(_parquet_writer(tmp, meta))
            writer.write_table(table.replace_schema_metadata(meta))
            rows += table.num_rows
            # Each part's memory is let go once it is written (here and in
            # each generator that yields it): a later part then reuses those
            # pages instead of faulting in and zeroing new ones. (An OTF2
            # archive's next part is read meanwhile where two cores are
            # free: _one_part_ahead.)
            del table
        writer = writer or opened.enter_context(_parquet_writer(tmp, meta))
        writer.add_key_value_metadata(
            {"ddlcompare.sources": json.dumps(sources), "ddlcompare.errors": json.dumps(errors)}
        )
    return rows, sources, errors


# What the conversion imports once the first files are read (its Parquet
# writer): imported by the thread that waits for them, while they are read,
# not before the reading begins (pyarrow.parquet: some 15 ms of imports)
WRITER_IMPORTS = ("pyarrow.parquet",)


def _parquet_writer(path: Path, meta: dict):
    """The table's Parquet writer, opened when the first part is read."""
    import pyarrow.parquet as pq

    return pq.ParquetWriter(path, SCHEMA.with_metadata(meta), **WRITE_OPTIONS)


FILTERED_BY = ("rank", "step", "epoch", "start_ns", "end_ns")


def _write_options(schema: pa.Schema) -> dict:
    """How the table's columns are encoded in Parquet: a dictionary only for
    the text columns (Arrow's default tries one for every column, hashing
    each of millions of distinct times before it gives up), times and other
    int64 columns as deltas (a location's times ascend: far fewer
    bytes to compress and write), and statistics (each row group's least
    and greatest value, which let a reader skip the row groups a filter
    rules out) only of the columns a table is filtered by: rank, step,
    epoch and the times; each other column's cost a pass of its own and no
    reader here filters on them (without those of duration, depth, bytes
    and op_id: 0.98x the write's CPU, the median of 12 interleaved pairs
    on each of the benches' OTF2 and Kineto tables, beside other work). The
    same values come back, whatever the encoding."""
    text = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    return {
        "use_dictionary": text,
        "column_encoding": {
            f.name: "DELTA_BINARY_PACKED" for f in schema if pa.types.is_int64(f.type)
        },
        "write_statistics": [name for name in FILTERED_BY if name in schema.names],
        # values encoded 64 Ki at a time, not 1 Ki: less work per value
        "write_batch_size": 1 << 16,
        # LZ4 (Parquet's LZ4_RAW), not Arrow's default Snappy: the write
        # costs the same, and the table, read many times by the analysis,
        # is smaller and cheaper to read back (0.76-0.91x the read's CPU;
        # files 14 % to 11 times smaller on the benches' tables)
        "compression": "lz4",
    }


WRITE_OPTIONS = _write_options(SCHEMA)


def _patterns() -> list[str]:
    return list(dict.fromkeys(p for r in readers.readers().values() for p in r.patterns))


def _offset_op_ids(table: pa.Table, offset: int) -> pa.Table:
    """op_id is a row number within one trace's table: shifted by the rows
    before it, it stays unique in the stacked table. In numpy, on the
    column's buffers (pyarrow.compute is an import an OTF2 archive's
    conversion does without)."""
    if offset == 0 or table.num_rows == 0:
        return table
    at = table.schema.get_field_index("op_id")
    shifted = [_shifted(chunk, offset) for chunk in table.column(at).chunks]
    return table.set_column(at, "op_id", pa.chunked_array(shifted, pa.int64()))


def _shifted(ids: pa.Int64Array, offset: int) -> pa.Int64Array:
    """``ids`` + offset, null where they are null."""
    validity, values = ids.buffers()
    shifted = np.frombuffer(values, dtype=np.int64, count=ids.offset + len(ids)) + offset
    return pa.Array.from_buffers(
        pa.int64(),
        len(ids),
        [validity, pa.py_buffer(shifted)],
        null_count=ids.null_count,
        offset=ids.offset,
    )


def metadata_of(path: Path) -> dict:
    """A phase table's key-value metadata, those written at its end
    (sources, errors) included: read_schema and read_table give only those
    of its start."""
    import pyarrow.parquet as pq

    return pq.read_metadata(path).metadata or {}


def errors_of(metadata: Mapping[bytes, bytes]) -> list[str]:
    """The errors a phase table was written with, from its metadata."""
    return files.loads(metadata.get(b"ddlcompare.errors", b"[]"))


def no_huge_pages() -> None:
    """numpy advises the kernel to back its large arrays with huge pages,
    which pays for arrays that live long and are read many times. A
    conversion fills each of its arrays about once and soon frees it: the
    kernel's zeroing and compaction of 2 MiB pages buys nothing there (the
    issue's count, on a loaded machine: twice the system time). Off in this
    process only, not through the environment that children inherit (a
    training run is measured as it is); bench/otf2_parts.py times both."""
    core = getattr(np, "_core", None) or np.core  # numpy 2, else 1
    switch = getattr(core.multiarray, "_set_madvise_hugepage", None)  # numpy's one switch
    if switch is not None:
        switch(False)


def _output_problem(out: Path, paths: list[Path]) -> str | None:
    """Why ``-o`` cannot be written, checked before the work: it would
    replace a device, a FIFO or a folder, or one of the traces it reads
    (given, or found in a given folder)."""
    try:
        refuse_to_replace(out)
        inputs = [*paths, *(t for p in paths if p.is_dir() for t in traces_in(p))]
        refuse_inputs(out, inputs)
    except NotRegular as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    no_huge_pages()
    reuse_freed_memory()
    parser = argparse.ArgumentParser(
        prog="python -m traces.convert", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="RUN_DIR_OR_TRACE")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the Parquet file to write")
    parser.add_argument("--rules", type=Path, default=RULES_FILE, help="phase rules (YAML)")
    parser.add_argument("--run-id", default=None, help="run_id column (default: config.json's)")
    parser.add_argument(
        "--keep-going", action="store_true", help="exit 0 even when a trace could not be read"
    )
    args = parser.parse_args(argv)
    if problem := _output_problem(args.out, args.paths):
        print(f"error: -o {problem}", file=sys.stderr)
        return 2
    try:
        rules = readers.checked(PhaseRules(args.rules))
    except RulesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows, sources, errors = write(args.paths, args.out, rules, args.run_id)
    for source in sources:
        if source.get("skipped"):
            if not files.harness_file(Path(source["path"])):  # a run's records are no traces
                print(
                    f"warning: {source['path']}: skipped: not a trace any reader knows "
                    f"({', '.join(readers.names())})",
                    file=sys.stderr,
                )
            continue
        for problem in source.get("problems", []):
            print(f"warning: {problem}", file=sys.stderr)
        via = f", {source['reader']} reader" if "reader" in source else ""
        print(f"{source['path']}: {source['rows']} intervals ({source['format']}{via})")
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    print(f"{args.out}: {rows} rows")
    failed = errors or rows == 0
    return 1 if failed and not args.keep_going else 0


if __name__ == "__main__":
    sys.exit(main())
