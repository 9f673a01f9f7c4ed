"""Convert traces into the phase table (see traces/table.py).

    python -m traces.convert RUN_DIR_OR_TRACE ... -o phases.parquet

A run directory contributes every trace a run leaves there: our OTF2 archive
(``trace/traces.otf2``), a Score-P experiment (``scorep/traces.otf2``, or
one per rank, ``scorep/rank<r>/traces.otf2``, from ranks Score-P traced
without MPI: each one's rows take the rank in its folder's name), the
Horovod Timeline (``horovod_timeline.json``) and PyTorch profiler traces
(``torch_profiler/*.json[.gz]``). A file or an OTF2 archive folder is read
as what it is. A trace that cannot be read gives one ``error:`` line naming
the file and why; the others are converted all the same, and the table is
written (empty when nothing could be read). The Parquet metadata keeps the
schema version, the rules version, each source file and each error.
Exit status: 0, or 1 when a trace could not be read (0 with --keep-going).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces import readers
from traces.readers import TraceError, otf2_reader
from traces.rules import RULES_FILE, PhaseRules, RulesError
from traces.table import empty_table

RUN_TRACES = ("trace/traces.otf2", "scorep/traces.otf2", "horovod_timeline.json")
PROFILER_DIR = "torch_profiler"
SCOREP_DIR = "scorep"
# One Score-P experiment per rank (ddlcompare/tracers.py, --mpp=none): each
# holds one process, which Score-P calls rank 0.
PER_RANK_EXPERIMENT = re.compile(r"(?:^|/)rank(\d+)/traces\.otf2$")


def traces_in(path: Path) -> list[Path]:
    """The trace files a path stands for."""
    if path.is_file():
        return [path]
    if (path / "traces.otf2").is_file():
        return [path / "traces.otf2"]
    found = [path / name for name in RUN_TRACES if (path / name).is_file()]
    found += per_rank_experiments(path) or per_rank_experiments(path / SCOREP_DIR)
    profiler = path / PROFILER_DIR
    if profiler.is_dir():
        found += sorted(p for p in profiler.iterdir()
                        if p.name.endswith((".json", ".json.gz")))
    return found


def per_rank_experiments(folder: Path) -> list[Path]:
    """``rank<r>/traces.otf2`` under ``folder``, in rank order."""
    found = [p for p in folder.glob("rank*/traces.otf2") if rank_of_experiment(p) is not None]
    return sorted(found, key=rank_of_experiment)


def rank_of_experiment(trace: Path) -> int | None:
    """The rank a per-rank Score-P experiment was recorded for (from its folder)."""
    found = PER_RANK_EXPERIMENT.search(trace.as_posix())
    return int(found.group(1)) if found else None


def with_rank(table: pa.Table, rank: int) -> pa.Table:
    """Every row on ``rank``: a per-rank experiment's one process, whatever
    Score-P numbered it, with all of its threads."""
    at = table.schema.get_field_index("rank")
    return table.set_column(at, table.schema.field(at),
                            pa.repeat(pa.scalar(rank, pa.int32()), table.num_rows))


def with_epochs_of_run(table: pa.Table, trace: Path) -> pa.Table:
    """A Score-P experiment's steps (user:step regions, numbered in order)
    carry no epoch: the run's ``steps.rank<r>.tsv`` says each step's epoch."""
    run = next((p.parent for p in trace.parents if p.name == SCOREP_DIR), None)
    if run is None or table.num_rows == 0:
        return table
    epochs = [pd.read_csv(f, sep="\t", usecols=["epoch", "step"]).assign(
              rank=int(f.name[len("steps.rank"):-len(".tsv")]))
              for f in run.glob("steps.rank*.tsv")]
    if not epochs:
        return table
    rows = table.select(["rank", "step"]).to_pandas()
    found = rows.merge(pd.concat(epochs), on=["rank", "step"], how="left")["epoch"]
    at = table.schema.get_field_index("epoch")
    filled = pa.array(found.to_numpy(dtype="float64"), from_pandas=True).cast(pa.int64())
    return table.set_column(at, table.schema.field(at),
                            pc.coalesce(table.column("epoch"), filled))


def run_id_of(path: Path) -> str:
    """The run's id from its config.json; for a trace from elsewhere (an
    imported one), the name of its folder, so that it stays identifiable."""
    folder = path if path.is_dir() else path.parent
    for candidate in (folder, *folder.parents[:3]):
        config = candidate / "config.json"
        if config.is_file():
            try:
                return str(json.loads(config.read_text()).get("run_id", ""))
            except (OSError, ValueError):
                return ""
    return folder.parent.name if folder.name in ("traces", "trace") else folder.name


def convert(paths: list[Path], rules: PhaseRules, run_id: str | None = None):
    """(table, sources, errors): every readable trace's rows in one table."""
    tables, sources, errors = [], [], []
    for path in paths:
        if not path.exists():
            errors.append(f"{path}: no such file or directory")
            continue
        found = traces_in(path)
        if not found:
            sources.append({"path": str(path), "note": "no trace in this folder"})
        for trace in found:
            try:
                table, problems = readers.read(trace, rules, run_id if run_id is not None
                                               else run_id_of(trace))
            except TraceError as exc:
                errors.append(str(exc))
                continue
            if (rank := rank_of_experiment(trace)) is not None:
                table = with_rank(table, rank)
            table = with_epochs_of_run(table, trace)
            tables.append(table)
            source = {"path": str(trace), "format": table.column("source")[0].as_py()
                      if table.num_rows else readers.detect(trace),
                      "rows": table.num_rows, "problems": problems}
            reader = (table.schema.metadata or {}).get(otf2_reader.META_READER)
            if reader:
                source["reader"] = reader.decode()  # fastotf2, or python (the fallback)
            sources.append(source)
    table = pa.concat_tables(tables) if tables else empty_table()
    return table, sources, errors


def write(table: pa.Table, out: Path, rules: PhaseRules, sources: list, errors: list) -> None:
    meta = dict(table.schema.metadata or empty_table().schema.metadata or {})
    meta.pop(otf2_reader.META_READER, None)  # per trace, in ddlcompare.sources
    meta.update({b"ddlcompare.schema_version": b"1",
                 b"ddlcompare.rules_version": str(rules.version).encode(),
                 b"ddlcompare.sources": json.dumps(sources).encode(),
                 b"ddlcompare.errors": json.dumps(errors).encode()})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        pq.write_table(table.replace_schema_metadata(meta), tmp)
        tmp.replace(out)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no temporary behind
        raise


def errors_of(path: Path) -> list[str]:
    """The errors a phase table was written with."""
    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta.get(b"ddlcompare.errors", b"[]"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m traces.convert",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, metavar="RUN_DIR_OR_TRACE")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the Parquet file to write")
    parser.add_argument("--rules", type=Path, default=RULES_FILE, help="phase rules (YAML)")
    parser.add_argument("--run-id", default=None, help="run_id column (default: config.json's)")
    parser.add_argument("--keep-going", action="store_true",
                        help="exit 0 even when a trace could not be read")
    args = parser.parse_args(argv)
    try:
        rules = PhaseRules(args.rules)
    except RulesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table, sources, errors = convert(args.paths, rules, args.run_id)
    write(table, args.out, rules, sources, errors)
    for source in sources:
        for problem in source.get("problems", []):
            print(f"warning: {problem}", file=sys.stderr)
        if "rows" in source:
            via = f", {source['reader']} reader" if "reader" in source else ""
            print(f"{source['path']}: {source['rows']} intervals ({source['format']}{via})")
        else:
            print(f"{source['path']}: {source['note']}")
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    print(f"{args.out}: {table.num_rows} rows")
    return 1 if errors and not args.keep_going else 0


if __name__ == "__main__":
    sys.exit(main())
