"""One merged, clock-aligned timeline of all ranks, in the Chrome trace JSON
that Perfetto (ui.perfetto.dev) and chrome://tracing open.

    ./ddlc timeline RUN_DIR_OR_TABLE... -o timeline.json [--steps A:B]
                    [--max-intervals N] [--align auto|trace|join]

What goes in:

- a process per rank of each run (named run, node and rank), a thread per
  location (training loop, comm streams, ...);
- every interval of the phase table as a complete slice named by its phase
  (region, step, collective and bytes in its args); collectives have
  category ``collective``;
- the critical path (analysis/critical_path.py) as its own process per run
  (the path's pieces as slices) and as flow arrows from the last rank to
  arrive at each join to the rank whose work comes next;
- ``otherData``: the clock alignment used, per rank, and what was left out.

Inputs: a run folder (its converted ``phases.parquet``, else its phase
recorder's ``steps.rank<r>.tsv``; any trace it holds is converted when
neither is there), a ``phases.parquet``, or any trace file the converter
reads (Score-P, Horovod Timeline, PyTorch profiler): imported traces go out
the same way.

Clocks. Our OTF2 traces are on each node's wall clock, the phase recorder
on each node's monotonic clock: one clock per node. ``--align join`` shifts
each rank so that its median exit from the joins (the ranks leave an N x N
collective together, within its latency) matches rank 0's; ``auto`` does so
only where the trace's clocks break causality (a rank leaving a join before
the last rank arrived) at more than CLOCK_VIOLATIONS of the joins, as
clocks of different nodes that drifted apart do, and keeps them otherwise
(exits differ by the collective's own latency, which a shift would hide).
The offsets measured and the share of joins breaking causality are
written either way.

Size: above ``--max-intervals`` (default MAX_INTERVALS, a file of about
65 MB that Perfetto's UI and chrome://tracing open) a window of consecutive steps from the
middle of the run is kept, and otherData says which.

The events are written as rows of bytes formatted by numpy
(analysis/json_rows.py: no Python per interval), so a million intervals
export in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from runfiles import files

from runfiles import names
from runfiles.names import PHASE_TABLE
from analysis import critical_path as cp
from analysis import json_rows

MAX_INTERVALS = 400_000
CLOCK_VIOLATIONS = 0.1  # share of joins a rank seems to leave before the last arrives
PATH_PID = 999  # the critical path's process within a run's block of pids
PIDS_PER_RUN = 1000
GENERATOR = "ddl-compare analysis/timeline.py"
USED_COLUMNS = {
    *("run_id", "rank", "node", "location", "step", "phase", "region"),
    *("start_ns", "end_ns", "collective", "bytes"),
}


class TimelineError(Exception):
    """An input that cannot go into the timeline; the message names it."""


# ------------------------------------------------------------------ inputs


def load(path: Path) -> pd.DataFrame:
    """The phase table a path stands for (see the module's docstring)."""
    path = Path(path)
    if not path.exists():
        raise TimelineError(f"{path}: no such file or directory")
    if path.suffix == ".parquet":
        return _read_parquet(path)
    if path.is_dir() and (path / PHASE_TABLE).is_file():
        table = _read_parquet(path / PHASE_TABLE)
        if len(table) or not any(path.glob(names.STEPS_GLOB)):
            return table
    if path.is_dir() and any(path.glob(names.STEPS_GLOB)):  # a run without a trace
        from analysis.collect import phase_intervals
        from runfiles.tables import Damaged
        from traces.convert import run_id_of

        try:
            return phase_intervals(path, run_id_of(path))
        except Damaged as exc:  # names the file only: say which run's, and the way out
            raise TimelineError(
                f"{path}: {exc}; a damaged run: ./ddlc check --rerun queues it to run again"
            ) from None
    from traces.convert import convert
    from traces.rules import RULES_FILE, PhaseRules

    table, _, errors = convert([path], PhaseRules(RULES_FILE))
    if table.num_rows == 0:  # the converter's errors name their file
        raise TimelineError(
            "; ".join(errors) or f"{path}: no phase table, recorder table or trace in it"
        )
    return table.to_pandas()


def _read_parquet(path: Path) -> pd.DataFrame:
    """The columns of a phase table that the timeline uses, its text columns
    as categories: a table has few distinct names, kept dictionary-encoded
    from the file on (a third of the time of decoding a million strings).
    A table of schema 3 holds them as dictionaries already (their
    categories may name a region no row has: nothing here counts them);
    one of schema 2, as strings, is asked for them as dictionaries."""
    try:
        schema = pq.read_schema(files.regular(path))
        needed = [c for c in names.PHASE_TABLE_COLUMNS if c in USED_COLUMNS]
        if missing := [c for c in needed if c not in schema.names]:
            raise TimelineError(
                f"{path}: column {missing[0]} missing: not a phase table (ddlc import writes "
                "one; a run's is its phases.parquet)"
            )
        used = [f for f in schema if f.name in USED_COLUMNS]
        texts = [
            f.name for f in used if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
        ]
        table = pq.read_table(path, columns=[f.name for f in used], read_dictionary=texts)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise TimelineError(
            f"{path}: damaged table ({str(exc).splitlines()[0][:120]}); delete it and run "
            "the workflow again (./ddlc run), which builds it again"
        ) from None
    return table.to_pandas()


# ------------------------------------------------------------------ clocks


def join_offsets(found: cp.CriticalPath) -> pd.DataFrame:
    """Per run and rank: how far its median join exit lies after rank 0's
    (the lowest rank's), in ns."""
    if found.joins.empty:
        return pd.DataFrame(columns=["run_id", "rank", "offset_ns"])
    joins = found.joins
    lowest = joins.groupby("run_id")["rank"].transform("min")
    ref = joins[joins["rank"] == lowest].set_index(["run_id", "join"])["exit_ns"]
    diff = (
        joins["exit_ns"]
        - ref.reindex(pd.MultiIndex.from_arrays([joins["run_id"], joins["join"]])).to_numpy()
    )
    offsets = diff.groupby([joins["run_id"], joins["rank"]]).median().round().astype(np.int64)
    return offsets.rename("offset_ns").reset_index()


def violations(found: cp.CriticalPath) -> pd.Series:
    """Per run, the share of joins whose clocks break causality: a rank
    leaves before the last rank has arrived (Scalasca's clock condition)."""
    if found.joins.empty:
        return pd.Series(dtype="float64")
    per_join = found.joins.groupby(["run_id", "join"]).agg(
        first_exit=("exit_ns", "min"), last_entry=("entry_ns", "max")
    )
    broken = per_join["first_exit"] < per_join["last_entry"]
    return broken.groupby("run_id").mean()


def alignment(phases: pd.DataFrame, found: cp.CriticalPath, method: str) -> dict:
    """{run_id: {"method": ..., "offsets_ns": {rank: ns subtracted}, ...}}.
    ``auto`` keeps the trace's clocks unless they break causality at more
    than CLOCK_VIOLATIONS of the joins (clocks of different nodes apart):
    then each rank is shifted by its measured join offset."""
    offsets = join_offsets(found)
    broken = violations(found)
    out = {}
    for run_id in phases["run_id"].unique():
        mine = offsets[offsets["run_id"] == run_id].set_index("rank")["offset_ns"]
        nodes = (
            phases.loc[phases["run_id"] == run_id, "node"].dropna().nunique()
            if "node" in phases
            else 0
        )
        share = float(broken.get(run_id, 0.0))
        chosen = method
        if method == "auto":
            chosen = "join" if share > CLOCK_VIOLATIONS else "trace"
        applied = {int(r): int(v) for r, v in mine.items()} if chosen == "join" else {}
        out[str(run_id)] = {
            "method": chosen,
            "description": (
                "each rank shifted so that its median exit from the joins matches the lowest rank's"
                if chosen == "join"
                else "the trace's own clocks: each node's wall clock (OTF2) or monotonic "
                "clock (phase recorder)"
            ),
            "nodes": int(nodes),
            "joins_breaking_causality": share,
            "offsets_ns": applied,
            "measured_join_offsets_ns": {int(r): int(v) for r, v in mine.items()},
        }
    return out


def _offsets(aligned: dict, origin: dict | None = None) -> dict:
    """{run: {rank: ns to subtract}} (rank None: every rank) from the
    alignment, plus each run's origin."""
    return {
        r: {
            **{k: v + (origin or {}).get(r, 0) for k, v in info["offsets_ns"].items()},
            None: (origin or {}).get(r, 0),
        }
        for r, info in aligned.items()
    }


def _text(values: pd.Series) -> pd.Series:
    """Values as text; categories stay categories (renaming a few is cheaper
    than writing a million strings)."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        return values.cat.rename_categories([str(c) for c in values.cat.categories])
    return values if pd.api.types.is_string_dtype(values) else values.astype(str)


def _shift(frame: pd.DataFrame, offsets: dict, columns: tuple[str, ...]) -> pd.DataFrame:
    """frame with ``columns`` moved back by each run's and rank's offset;
    run_id as text."""
    frame = frame.assign(run_id=_text(frame["run_id"]))
    if frame.empty:
        return frame
    runs, names = pd.factorize(frame["run_id"])
    ranks = frame["rank"].to_numpy(np.int64)
    # One offset per (run, rank), looked up by run code * ranks + rank.
    width = int(ranks.max()) + 1
    table = np.zeros(len(names) * width, dtype=np.int64)
    for code, run_id in enumerate(names):
        per_rank = offsets.get(run_id, {})
        table[code * width : (code + 1) * width] = per_rank.get(None, 0)
        for rank, offset in per_rank.items():
            if rank is not None and 0 <= rank < width:
                table[code * width + rank] = offset
    shift = table[runs * width + ranks]
    frame = frame.copy(deep=False)
    for column in columns:
        frame[column] = frame[column].to_numpy(np.int64) - shift
    return frame


# ---------------------------------------------------------------- sampling


def window(phases: pd.DataFrame, max_intervals: int, steps: tuple[int, int] | None) -> tuple:
    """(rows kept, note): all rows when they fit, else consecutive steps
    from the middle of each run (rows outside steps are then left out)."""
    if steps is None and len(phases) <= max_intervals:
        return phases, None
    step = phases["step"]
    if steps is None:
        counts = phases.groupby(step.dropna().astype(np.int64)).size().sort_index()
        n_steps = max(1, int(len(counts) * max_intervals / max(len(phases), 1)))
        while n_steps > 1 and counts.rolling(n_steps).sum().max() > max_intervals:
            n_steps -= 1
        middle = max(0, (len(counts) - n_steps) // 2)
        steps = (int(counts.index[middle]), int(counts.index[middle + n_steps - 1]))
    kept = phases[(step >= steps[0]) & (step <= steps[1])]
    if kept.empty:
        have = f"steps {int(step.min())} to {int(step.max())}" if step.notna().any() else "no steps"
        raise TimelineError(
            f"--steps {steps[0]}:{steps[1]}: no step in that range; the runs have {have}"
        )
    note = {
        "steps": list(steps),
        "of_steps": [int(step.min()), int(step.max())],
        "intervals": int(len(kept)),
        "of_intervals": int(len(phases)),
        "why": f"more than {max_intervals} intervals: a window of consecutive steps from "
        f"the middle of the run; rows outside steps (init, eval) left out",
    }
    return kept, note


# ------------------------------------------------------------------ events


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


class Events:
    """Rows of events of one shape: their number and their fields (see
    analysis/json_rows.py), each row ending with a comma."""

    def __init__(self, n: int, fields: list):
        self.n, self.fields = n, fields


def slices(phases: pd.DataFrame, pids: np.ndarray, tids: np.ndarray) -> Events:
    """One complete slice per interval. The text that depends on names only
    (phase, region, collective) is formatted once per distinct combination;
    numbers are formatted by numpy (analysis/json_rows.py)."""
    start = phases["start_ns"].to_numpy(np.int64)
    region = phases["region"] if "region" in phases else phases["phase"]
    coll = phases["collective"] if "collective" in phases else pd.Series(None, index=phases.index)
    names = pd.DataFrame({"phase": phases["phase"], "region": region, "collective": coll})
    names = names.astype("category")  # few distinct names: codes, compared as integers
    codes = [names[c].cat.codes.to_numpy(np.int64) for c in names]
    sizes = [len(names[c].cat.categories) + 1 for c in names]  # code -1 (missing) as 0
    combined = np.zeros(len(phases), dtype=np.int64)
    for code, size in zip(codes, sizes):
        combined = combined * size + (code + 1)
    triples, rows = np.unique(combined, return_inverse=True)
    heads = []
    for triple in triples.tolist():
        found = []
        for column, size in zip(reversed(names.columns), reversed(sizes)):
            triple, code = divmod(triple, size)
            found.append(None if code == 0 else str(names[column].cat.categories[code - 1]))
        heads.append(_head(*reversed(found)))
    step = phases["step"]
    fields = [
        json_rows.Choice(heads, rows.ravel()),
        json_rows.Text('"step":'),
        json_rows.Ints(step.fillna(-1).to_numpy(np.int64), null=step.isna().to_numpy()),
    ]
    if "bytes" in phases and coll.notna().any():
        nbytes = phases["bytes"].astype("Float64")
        sized = (coll.notna() & nbytes.notna()).to_numpy()
        fields.append(
            json_rows.When(
                sized,
                json_rows.Text(',"bytes":'),
                json_rows.Ints(nbytes.fillna(0).round().astype("int64").to_numpy()),
            )
        )
    fields += [
        json_rows.Text('},"pid":'),
        json_rows.Ints(pids),
        json_rows.Text(',"tid":'),
        json_rows.Ints(tids),
        json_rows.Text(',"ts":'),
        json_rows.Micros(start),
        json_rows.Text(',"dur":'),
        json_rows.Micros(phases["end_ns"].to_numpy(np.int64) - start),
        json_rows.Text("},\n"),
    ]
    return Events(len(phases), fields)


def _head(phase: str | None, region: str | None, collective: str | None) -> str:
    """The start of a slice's JSON up to its args' numbers (keys in any order
    are valid JSON; the viewers read them by name)."""
    args = {"region": region or phase, **({"collective": collective} if collective else {})}
    category = "collective" if collective else "phase"
    return f'{{"ph":"X","name":{json.dumps(phase)},"cat":"{category}","args":{_compact(args)[:-1]},'


def path_slices(found: cp.CriticalPath, pid_base: dict) -> tuple[pd.DataFrame, np.ndarray]:
    """The critical path's pieces as rows for :func:`slices`, on a process
    of their own per run (named "rank r phase"), and their pids."""
    path = found.path[found.path["kind"] != cp.UNTIMED]
    rows = pd.DataFrame(
        {
            "run_id": path["run_id"],
            "rank": path["rank"],
            "step": path["step"],
            "phase": "rank " + path["rank"].astype(str) + " " + path["phase"].astype(str),
            "region": path["kind"],
            "start_ns": path["start_ns"].astype(np.int64),
            "end_ns": path["end_ns"].astype(np.int64),
        }
    )
    return rows, rows["run_id"].map(pid_base).to_numpy() + PATH_PID


def flows(found: cp.CriticalPath, pid_base: dict, tids: pd.DataFrame) -> Events:
    """An arrow per join, from the last rank in to the rank whose work comes
    next, drawn at the middle of the communication proper: both ranks are
    then inside the interval their join was read from, and each end goes on
    that interval's thread (its location), which the viewers bind it to."""
    path = found.path
    comm = path[path["kind"].isin([cp.COMMUNICATION, cp.JOIN])].sort_values(["run_id", "join"])
    # The rank of each window's first piece is the rank the path goes on on.
    first = (
        path[~path["kind"].isin([cp.COMMUNICATION, cp.JOIN])]
        .sort_values(["run_id", "join"])
        .drop_duplicates(["run_id", "join"])
        .set_index(["run_id", "join"])["rank"]
    )
    after = first.reindex(pd.MultiIndex.from_arrays([comm["run_id"], comm["join"] + 1]))
    leave = np.where(after.isna(), comm["rank"], after.fillna(-1)).astype(np.int64)
    base = comm["run_id"].map(pid_base).to_numpy()
    ts = (comm["start_ns"].to_numpy(np.int64) + comm["end_ns"].to_numpy(np.int64)) // 2
    tid = _join_threads(found.joins, tids, comm["run_id"], comm["join"], comm["rank"])
    tid_out = _join_threads(found.joins, tids, comm["run_id"], comm["join"], leave)
    ids = np.arange(len(comm))
    return Events(
        2 * len(comm),
        [
            json_rows.Text('{"name":"critical path","cat":"critical_path","id":'),
            json_rows.Ints(np.concatenate([ids, ids])),
            json_rows.Text(',"ts":'),
            json_rows.Micros(np.concatenate([ts, ts])),
            json_rows.Choice([',"ph":"s",', ',"ph":"f","bp":"e",'], np.repeat([0, 1], len(comm))),
            json_rows.Text('"pid":'),
            json_rows.Ints(np.concatenate([base + comm["rank"].to_numpy() + 1, base + leave + 1])),
            json_rows.Text(',"tid":'),
            json_rows.Ints(np.concatenate([tid, tid_out])),
            json_rows.Text("},\n"),
        ],
    )


# ------------------------------------------------------------------ export


def export(
    paths: list[Path],
    out: Path,
    max_intervals: int = MAX_INTERVALS,
    steps: tuple[int, int] | None = None,
    align: str = "auto",
    keep_going: bool = False,
) -> dict:
    """Write the timeline; returns what otherData says, with the counts.
    With ``keep_going`` an input that cannot be read is listed under
    ``skipped`` instead of stopping (the workflow's failed runs)."""
    tables, skipped = [], []
    for path in paths:
        try:
            table = load(Path(path))
            if table.empty:
                raise TimelineError(f"{path}: the phase table is empty")
        except TimelineError as exc:
            if not keep_going:
                raise
            skipped.append(str(exc))
            continue
        tables.append(table)
    if not tables:
        return _write(
            Path(out),
            {
                "generator": GENERATOR,
                "skipped": skipped,
                "runs": {},
                "downsampled": None,
                "counts": {"processes": 0, "slices": 0, "flows": 0},
            },
            [],
        )
    phases = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    timed = phases["end_ns"].notna() & phases["start_ns"].notna()
    phases = phases if timed.all() else phases[timed]  # a copy of a million rows saved
    phases = phases.assign(run_id=_text(phases["run_id"]))
    phases, note = window(phases, max_intervals, steps)
    found = cp.analyse(phases)
    aligned = alignment(phases, found, align)
    phases = _shift(phases, _offsets(aligned), ("start_ns", "end_ns"))
    # Each run starts at 0, so that runs laid side by side compare.
    run_codes, run_names = pd.factorize(phases["run_id"])
    run_ids = [str(r) for r in run_names]
    pid_base = {r: PIDS_PER_RUN * (i + 1) for i, r in enumerate(run_ids)}
    first = phases["start_ns"].groupby(run_codes).min()
    t0 = {r: int(first[i]) for i, r in enumerate(run_ids)}
    phases = _shift(phases, {r: {None: t} for r, t in t0.items()}, ("start_ns", "end_ns"))
    moved = _offsets(aligned, t0)
    found.joins = _shift(found.joins, moved, ("entry_ns", "exit_ns"))
    timed = found.path[found.path["kind"] != cp.UNTIMED]
    found.path = _shift(timed, moved, ("start_ns", "end_ns"))

    threads, tids = _threads(phases)
    pids = np.array([pid_base[r] for r in run_ids])[run_codes] + phases["rank"].to_numpy() + 1

    meta = _metadata(phases, threads, pid_base, found)
    pieces, piece_pids = path_slices(found, pid_base)
    arrows = flows(found, pid_base, threads) if len(pieces) else Events(0, [])
    other = {
        "generator": GENERATOR,
        "time_unit": "microseconds",
        "runs": {
            r: {
                "pid_base": pid_base[r],
                "origin_ns": t0[r],
                "clock_alignment": aligned.get(r, {"method": "trace"}),
                "join": found.method.get(r),
                "no_critical_path": found.problems.get(r),
            }
            for r in run_ids
        },
        "downsampled": note,
        "counts": {
            "processes": len(meta["processes"]),
            "slices": int(len(phases) + len(pieces)),
            "flows": int(arrows.n // 2),
        },
    }
    other["skipped"] = skipped
    return _write(
        Path(out),
        other,
        [
            slices(phases, pids, tids),
            slices(pieces, piece_pids, np.zeros(len(pieces), np.int64)),
            arrows,
        ],
        meta["events"],
    )


def _write(out: Path, other: dict, chunks: list[Events], meta: list | None = None) -> dict:
    """The file, atomically: otherData, then the events (each row of each
    chunk already ends with a comma), the metadata events last."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(b'{"displayTimeUnit":"ms","otherData":')
        f.write(msgspec.json.encode(other))
        f.write(b',"traceEvents":[\n')
        for chunk in chunks:
            json_rows.write(f, chunk.n, chunk.fields)
        empty = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "empty"}}]
        f.write(b",\n".join(msgspec.json.encode(e) for e in meta or empty))
        f.write(b"\n]}\n")
    tmp.replace(out)
    return other


def _threads(phases: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """A thread per (run, rank, location), numbered per rank in order of
    appearance (location "main" where the table has none), and each row's
    thread."""
    location = (
        phases["location"].astype("string").fillna("main")
        if "location" in phases
        else pd.Series("main", index=phases.index, dtype="string")
    )
    keys = pd.DataFrame({"run_id": phases["run_id"], "rank": phases["rank"], "location": location})
    combined = np.zeros(len(keys), dtype=np.int64)
    for column in keys:  # one integer per (run, rank, location)
        codes, uniques = pd.factorize(keys[column])
        combined = combined * (len(uniques) + 1) + codes
    row_thread, _ = pd.factorize(combined)  # numbered in order of appearance
    _, first_rows = np.unique(row_thread, return_index=True)
    threads = keys.iloc[first_rows].reset_index(drop=True)
    threads["tid"] = threads.groupby(["run_id", "rank"]).cumcount()
    return threads, threads["tid"].to_numpy()[row_thread]


def _join_threads(joins, tids, run_id, join, rank) -> np.ndarray:
    """The tid of the location each (run, join, rank)'s join was read from."""
    where = joins.assign(location=joins["location"].astype("string").fillna("main"))
    where = where.set_index(["run_id", "join", "rank"])["location"]
    location = where.reindex(
        pd.MultiIndex.from_arrays([np.asarray(run_id), np.asarray(join), np.asarray(rank)])
    )
    found = tids.set_index(["run_id", "rank", "location"])["tid"].reindex(
        pd.MultiIndex.from_arrays([np.asarray(run_id), np.asarray(rank), location.to_numpy()])
    )
    return found.fillna(0).to_numpy(np.int64)


def _metadata(phases, threads, pid_base, found) -> dict:
    """Process and thread names, sorted by rank."""
    nodes = {}
    if "node" in phases:
        first = phases.dropna(subset=["node"]).drop_duplicates(["run_id", "rank"])
        nodes = {
            (str(r), int(k)): n for r, k, n in zip(first["run_id"], first["rank"], first["node"])
        }
    events, processes = [], set()
    for row in threads.itertuples():
        pid = pid_base[row.run_id] + int(row.rank) + 1
        if pid not in processes:
            processes.add(pid)
            node = nodes.get((row.run_id, int(row.rank)))
            name = f"{row.run_id} rank {row.rank}" + (f" ({node})" if node else "")
            events += [
                {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}},
                {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
            ]
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": int(row.tid),
                "args": {"name": str(row.location)},
            }
        )
    for run_id in set(found.path["run_id"]) if len(found.path) else ():
        pid = pid_base[run_id] + PATH_PID
        processes.add(pid)
        events += [
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "args": {"name": f"{run_id} critical path"},
            },
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid,
                "args": {"sort_index": pid_base[run_id]},
            },
        ]
    return {"events": events, "processes": processes}
