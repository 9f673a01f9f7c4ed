"""Why a step took as long as it did: the critical path across ranks and the
root causes of waiting, from any phase table (ours, or converted Score-P,
Horovod Timeline and PyTorch profiler traces).

The model. Each rank runs its step phases one after another, and once per
step the ranks *join* at the gradient exchange: no rank leaves it before
the last one has arrived. The join of a step is, per run:

- ``grad_comm`` where the run exposes it (its mean is at least
  EXPOSED_SHARE of the step; Horovod's synchronize): entry at its start,
  exit at its end;
- else ``collective`` where the trace holds the collectives on every rank
  (our OTF2's comm locations, Score-P's MPI): entry at the start of the
  step's last collective on the rank (its last gradient handed over), exit
  at that collective's end;
- else ``backward`` (DDP without a trace, whose all-reduce runs inside
  backward and returns with the last bucket): entry at backward's start,
  exit at its end, so the join holds the last rank's backward too;
- else ``other`` where the run times only whole steps (a framework that
  owns its step, like Tarantella's fit): the whole step is the join, entry
  at its start, exit at its end; compute and exchange are not told apart,
  and the windows between joins hold only the untimed gaps between steps.

Between two joins each rank works alone, in a *window* from its exit of one
join to its entry of the next. The last rank to arrive at a join sets when
everyone leaves it, so the critical path is, join after join: the last
rank's window, then the join from that last arrival to the exit of the
rank whose window comes next (communication proper). Earlier ranks wait
(Scalasca's Wait at N x N: last entry minus own entry): that waiting is
synchronisation skew, kept apart from the communication proper (exit minus
last entry).

Root causes, after Scalasca's delay analysis: a rank r that waits
w_r = entry_last - entry_r waits exactly the sum, over the window's phases,
of (time on the last rank - time on r), plus how much later the last rank
left the previous join (PROPAGATED) and its longer untimed gaps (UNTIMED).
Each positive term causes its proportional part of w_r.

Everything runs on numpy arrays, one loop per run and rank, none per interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from runfiles.names import PHASE_TABLE
from analysis import cells, humanize, phase_recording
from analysis.section import Section
from runfiles.phases import STEP_PHASES
from runfiles.tables import read_table

EXPOSED_SHARE = 0.02  # grad_comm is the join where it holds 2 % of the step or more
UNTIMED = "untimed"  # time in a window outside every phase
PROPAGATED = "previous join"  # the late rank left the previous join later
CAUSES = (*STEP_PHASES, UNTIMED, PROPAGATED)
COMMUNICATION = "communication"  # kind of the path's pieces inside a join
JOIN = "join"  # ... where the join is backward: compute and all-reduce, not told apart
EMPTY = {
    "joins": [
        *("join", "step", "rank", "entry_ns", "exit_ns", "wait_ns", "comm_ns", "last"),
        "location",
    ],
    "windows": ["join", "rank", "cause", "ns"],
    "path": ["join", "step", "rank", "phase", "kind", "start_ns", "end_ns", "dur_ns"],
    "causes": ["join", "step", "late_rank", "cause", "waited_ns"],
}
# The one figure of waiting the report quotes, everywhere under this name:
# cell_table's waiting_ms_per_step (the summary and the bottlenecks take it
# from there).
WAIT_NAME = "wait per step at the gradient exchange"
WAIT_DEFINITION = (
    "the last rank's entry into the step's gradient exchange minus a rank's own, "
    "mean over ranks and measured steps (Scalasca's Wait at N x N)"
)
JOIN_NAMES = {
    "grad_comm": "the gradient exchange",
    "collective": "the last gradient all-reduce",
    "backward": "the all-reduce inside backward",
    "other": "the whole step (compute and exchange not told apart)",
}
# The joins whose pieces on the path are compute and exchange together.
WHOLE_JOINS = ("backward", "other")
# A step's rows the analysis reads: its phases, and ``other`` (a whole step).
READ_PHASES = (*STEP_PHASES, "other")


@dataclass
class CriticalPath:
    """Every table of the analysis, one row per ...

    - ``joins``: run, join (0, 1, ... in time), step, rank: entry_ns,
      exit_ns, wait_ns (last entry - own entry), comm_ns (own exit - last
      entry), last (this rank arrived last), location (where the trace
      holds the interval the join was read from; None without locations);
    - ``windows``: run, join, rank, cause: ns in the window before the join
      (join == number of joins: the tail after the last one);
    - ``path``: run, join, step, rank, phase, kind (phase, communication,
      untimed), start_ns, end_ns, dur_ns (untimed pieces have no start);
    - ``causes``: run, join, step, late_rank, cause, waited_ns: the waiting
      of all ranks at the join that the late rank's excess time in ``cause``
      caused;
    - ``intervals``: the top-level step phases the analysis read;
    - ``method``: run -> join kind; ``problems``: run -> why it has no path.
    """

    joins: pd.DataFrame
    windows: pd.DataFrame
    path: pd.DataFrame
    causes: pd.DataFrame
    intervals: pd.DataFrame
    method: dict = field(default_factory=dict)
    problems: dict = field(default_factory=dict)


# --------------------------------------------------------------- intervals


def measured(phases: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Rows of training steps, the runs' warm-up steps left out; names as
    categories (a table has few distinct names, and comparing categories is
    fast where comparing strings is not)."""
    keep = [
        c
        for c in (
            "run_id",
            "rank",
            "step",
            "epoch",
            "phase",
            "start_ns",
            "end_ns",
            "location",
            "collective",
            "bytes",
        )
        if c in phases
    ]
    steps = phases.loc[phases["step"].notna(), keep]
    steps = steps.astype(
        {
            "step": "int64",
            "rank": "int64",
            "start_ns": "int64",
            "end_ns": "int64",
            **{c: "category" for c in ("run_id", "phase", "location", "collective") if c in steps},
        }
    )
    first = (
        steps["run_id"].map(runs.set_index("run_id")["warmup_steps"]).astype("float64")
        if runs is not None and "warmup_steps" in runs
        else 0
    )
    return steps[steps["step"] >= np.maximum(0, np.nan_to_num(first))]


def _is_collective(rows: pd.DataFrame) -> pd.Series:
    if "collective" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["collective"].notna()


def main_intervals(steps: pd.DataFrame) -> pd.DataFrame:
    """Each rank's step phases on its training loop's location, outermost
    only (a region inside a phase is part of it), overlaps cut: run_id,
    rank, step, phase, start_ns, end_ns (and location, where the table has
    it), in time order per rank."""
    rows = steps[steps["phase"].isin(READ_PHASES) & ~_is_collective(steps)]
    if "location" in rows and rows["location"].notna().any():
        rows = rows.merge(_loop_locations(steps), on=["run_id", "rank", "location"])
    epoch = ["epoch"] if "epoch" in rows else []
    rows = rows[["run_id", "rank", "step", *epoch, "phase", "start_ns", "end_ns", *_located(rows)]]
    rows = rows.sort_values(
        ["run_id", "rank", "start_ns", "end_ns"], ascending=[True, True, True, False], kind="stable"
    )
    rows = rows[rows["end_ns"].to_numpy() > _previous_end(rows)]  # nested: dropped
    rows = rows.copy()
    rows["start_ns"] = np.maximum(rows["start_ns"].to_numpy(), _previous_end(rows))
    return rows.reset_index(drop=True)


def _located(rows: pd.DataFrame) -> list[str]:
    """["location"] where the table has locations (a trace), else []."""
    return ["location"] if "location" in rows else []


def _loop_locations(steps: pd.DataFrame) -> pd.DataFrame:
    """(run_id, rank, location) of each rank's training loop: the location
    holding its step intervals (our OTF2, PyTorch's ProfilerStep), else its
    forward, else most of its step phases (not a GPU stream's kernels, which
    come after the steps)."""
    keys = ["run_id", "rank", "location"]
    counts = (
        steps.assign(
            weight=np.select(
                [
                    steps["phase"] == "step",
                    steps["phase"] == "forward",
                    steps["phase"].isin(STEP_PHASES),
                ],
                [1e12, 1e6, 1],
                0,
            )
        )
        .groupby(keys, observed=True)["weight"]
        .sum()
        .rename("n")
        .reset_index()
    )
    counts = counts[counts["n"] > 0]
    return counts.sort_values("n").drop_duplicates(["run_id", "rank"], keep="last")[keys]


def _groups(rows: pd.DataFrame) -> list[tuple[int, int]]:
    """(first, past-last) row of each (run, rank) in rows sorted by them."""
    run = pd.factorize(rows["run_id"])[0]
    rank = rows["rank"].to_numpy()
    change = np.flatnonzero((np.diff(run) != 0) | (np.diff(rank) != 0)) + 1
    edges = [0, *change.tolist(), len(rows)]
    return list(zip(edges[:-1], edges[1:])) if len(rows) else []


def _previous_end(rows: pd.DataFrame) -> np.ndarray:
    """The latest end of the rows before each one on its rank (in int64:
    epoch nanoseconds do not fit a float)."""
    end = rows["end_ns"].to_numpy(np.int64)
    out = np.full(len(end), np.iinfo(np.int64).min, dtype=np.int64)
    for first, last in _groups(rows):
        out[first + 1 : last] = np.maximum.accumulate(end[first : last - 1])
    return out


# -------------------------------------------------------------------- joins


def join_kind(intervals: pd.DataFrame, collectives: pd.DataFrame) -> dict[str, str]:
    """Per run, which join the analysis uses (see the module's docstring)."""
    dur = intervals["end_ns"] - intervals["start_ns"]
    per_run = dur.groupby(intervals["run_id"]).sum()
    comm = dur[intervals["phase"] == "grad_comm"].groupby(intervals["run_id"]).sum()
    exposed = comm.reindex(per_run.index, fill_value=0) >= EXPOSED_SHARE * per_run
    named = dur[intervals["phase"].isin(STEP_PHASES)].groupby(intervals["run_id"]).sum()
    whole = named.reindex(per_run.index, fill_value=0) == 0
    ranks = intervals.groupby("run_id")["rank"].nunique()
    with_coll = collectives.groupby("run_id")["rank"].nunique().reindex(ranks.index, fill_value=0)
    return {
        run: "grad_comm"
        if exposed[run]
        else "collective"
        if with_coll[run] == ranks[run]
        else "other"
        if whole[run]
        else "backward"
        for run in per_run.index
    }


def joins(
    intervals: pd.DataFrame, collectives: pd.DataFrame, kinds: dict[str, str]
) -> pd.DataFrame:
    """run_id, step, rank, entry_ns, exit_ns of each step's join, for the
    steps every rank of the run joined."""
    keys = ["run_id", "rank", "step"]
    kind = intervals["run_id"].map(kinds)
    by_phase = intervals[
        ((kind == "grad_comm") & (intervals["phase"] == "grad_comm"))
        | ((kind == "backward") & (intervals["phase"] == "backward"))
        | ((kind == "other") & (intervals["phase"] == "other"))
    ]
    where = {"location": ("location", "first")} if "location" in by_phase else {}
    found = [
        by_phase.groupby(keys, observed=True).agg(
            entry_ns=("start_ns", "min"), exit_ns=("end_ns", "max"), **where
        )
    ]
    coll = collectives[collectives["run_id"].map(kinds) == "collective"]
    if len(coll):
        last = coll.sort_values("start_ns", kind="stable").groupby(keys, observed=True).tail(1)
        found.append(
            last.set_index(keys)[["start_ns", "end_ns", *_located(last)]].rename(
                columns={"start_ns": "entry_ns", "end_ns": "exit_ns"}
            )
        )
    found = [f.astype({"location": "object"}) if "location" in f else f for f in found]
    table = pd.concat(found).reset_index()
    ranks = intervals.groupby("run_id")["rank"].nunique()
    present = table.groupby(["run_id", "step"])["rank"].transform("nunique")
    table = table[present.to_numpy() == table["run_id"].map(ranks).to_numpy()]
    return table.sort_values(["run_id", "step", "rank"]).reset_index(drop=True)


# ---------------------------------------------------------------- analysis


def analyse(phases: pd.DataFrame, runs: pd.DataFrame | None = None) -> CriticalPath:
    """The critical path and the causes of waiting of every run in ``phases``."""
    steps = measured(phases, runs)
    intervals = main_intervals(steps)
    coll_rows = steps[_is_collective(steps)]
    collectives = coll_rows[["run_id", "rank", "step", "start_ns", "end_ns", *_located(coll_rows)]]
    kinds = join_kind(intervals, collectives) if len(intervals) else {}
    table = (
        joins(intervals, collectives, kinds)
        if kinds
        else pd.DataFrame(columns=["run_id", "step", "rank", "entry_ns", "exit_ns"])
    )
    parts: dict[str, list[pd.DataFrame]] = {
        name: [] for name in ("joins", "windows", "path", "causes")
    }
    problems = {}
    for run_id, run_joins in table.groupby("run_id", sort=True):
        mine = intervals[intervals["run_id"] == run_id]
        join_phase = kinds[run_id] if kinds[run_id] in WHOLE_JOINS else "grad_comm"
        for name, frame in _one_run(run_id, mine, run_joins, join_phase).items():
            parts[name].append(frame)
    # Sorted, so that the report's sentences keep their order from run to run.
    for run_id in sorted(set(intervals["run_id"]) - set(table["run_id"])):
        problems[run_id] = "no step that every rank joined"
    if phases["run_id"].nunique() > intervals["run_id"].nunique():
        for run_id in sorted(set(phases["run_id"]) - set(intervals["run_id"])):
            problems[run_id] = "no step phases in its table"
    frames = {
        name: pd.concat(found, ignore_index=True)
        if found
        else pd.DataFrame(columns=["run_id", *EMPTY[name]])
        for name, found in parts.items()
    }
    return CriticalPath(intervals=intervals, method=kinds, problems=problems, **frames)


def _one_run(
    run_id: str, intervals: pd.DataFrame, run_joins: pd.DataFrame, join_phase: str
) -> dict:
    entry = run_joins.pivot(index="step", columns="rank", values="entry_ns")
    exit_ = run_joins.pivot(index="step", columns="rank", values="exit_ns")
    ranks, steps = entry.columns.to_numpy(), entry.index.to_numpy()
    entry, exit_ = entry.to_numpy(np.int64), exit_.to_numpy(np.int64)
    n_joins = len(steps)
    late = entry.argmax(axis=1)
    last_entry = entry.max(axis=1)
    first = intervals[intervals["step"] == steps[0]].groupby("rank")["start_ns"].min()
    tail = intervals[intervals["step"] == steps[-1]].groupby("rank")["end_ns"].max()
    # Window k on a rank runs from its exit of join k-1 to its entry of join k;
    # window n_joins is the tail after the last join.
    w_start = np.vstack([_per_rank(first, ranks, entry[0])[None], exit_])
    for k in _new_epochs(intervals, steps):
        # Between epochs lie evaluation and the framework's set-up, no step's
        # time: the window starts at each rank's first phase of the step, as
        # the first one does.
        began = intervals[intervals["step"] == steps[k]].groupby("rank")["start_ns"].min()
        w_start[k] = _per_rank(began, ranks, entry[k])
    w_end = np.vstack([entry, np.maximum(_per_rank(tail, ranks, exit_[-1]), exit_[-1])[None]])
    w_end = np.maximum(w_end, w_start)
    critical = np.append(late, int(w_end[-1].argmax()))

    n_causes = len(CAUSES)
    time = np.zeros((n_joins + 1, len(ranks), n_causes), dtype=np.int64)
    path = []
    for j, rank in enumerate(ranks):
        # ``other`` within a window counts as untimed (it is no phase of the model)
        rows = intervals[(intervals["rank"] == rank) & intervals["phase"].isin(STEP_PHASES)]
        pieces = _clip(
            rows["start_ns"].to_numpy(np.int64),
            rows["end_ns"].to_numpy(np.int64),
            w_start[:, j],
            w_end[:, j],
        )
        idx, win, start, end = pieces
        # each row's place in STEP_PHASES (-1: none), from strings or from
        # categories alike (a converted table's, with other phases among
        # them: pandas deprecates recasting those to STEP_PHASES)
        phase = pd.Index(STEP_PHASES).get_indexer(rows["phase"]).astype(np.int64)[idx]
        time[:, j, : len(STEP_PHASES)] = np.bincount(
            win * len(STEP_PHASES) + phase,
            weights=end - start,
            minlength=(n_joins + 1) * len(STEP_PHASES),
        ).reshape(n_joins + 1, -1)
        on_path = critical[win] == j
        path.append(
            pd.DataFrame(
                {
                    "join": win[on_path],
                    "step": rows["step"].to_numpy()[idx[on_path]],
                    "rank": rank,
                    "phase": np.asarray(STEP_PHASES, dtype=object)[phase[on_path]],
                    "kind": "phase",
                    "start_ns": start[on_path],
                    "end_ns": end[on_path],
                }
            )
        )
    span = w_end - w_start
    time[:, :, CAUSES.index(UNTIMED)] = span - time.sum(axis=2)
    time[1:, :, CAUSES.index(PROPAGATED)] = w_start[1:]  # made relative in _causes
    time[0, :, CAUSES.index(PROPAGATED)] = w_start[0]

    windows_at = np.arange(n_joins + 1)
    step_of = np.append(steps, steps[-1])
    untimed = pd.DataFrame(
        {
            "join": windows_at,
            "step": step_of,
            "rank": ranks[critical],
            "phase": UNTIMED,
            "kind": UNTIMED,
            "start_ns": pd.NA,
            "end_ns": pd.NA,
            "dur_ns": time[windows_at, critical, CAUSES.index(UNTIMED)],
        }
    )
    leave = exit_[np.arange(n_joins), critical[1:]]
    comm = pd.DataFrame(
        {
            "join": windows_at[:-1],
            "step": steps,
            "rank": ranks[late],
            "phase": join_phase,
            "kind": JOIN if join_phase in WHOLE_JOINS else COMMUNICATION,
            "start_ns": last_entry,
            "end_ns": np.maximum(leave, last_entry),
        }
    )
    path = pd.concat([*path, comm], ignore_index=True)
    path["dur_ns"] = path["end_ns"] - path["start_ns"]
    path = pd.concat([path, untimed[untimed["dur_ns"] > 0]], ignore_index=True)

    wait = last_entry[:, None] - entry
    join_rows = pd.DataFrame(
        {
            "join": np.repeat(np.arange(n_joins), len(ranks)),
            "step": np.repeat(steps, len(ranks)),
            "rank": np.tile(ranks, n_joins),
            "entry_ns": entry.ravel(),
            "exit_ns": exit_.ravel(),
            "wait_ns": wait.ravel(),
            "comm_ns": (exit_ - last_entry[:, None]).clip(0).ravel(),
            "last": (np.arange(len(ranks))[None, :] == late[:, None]).ravel(),
            "location": _pivot(run_joins, "location").ravel(),
        }
    )
    windows = pd.DataFrame(
        {
            "join": np.repeat(windows_at, len(ranks) * n_causes),
            "rank": np.tile(np.repeat(ranks, n_causes), n_joins + 1),
            "cause": np.tile(np.asarray(CAUSES, dtype=object), (n_joins + 1) * len(ranks)),
            "ns": _relative_propagated(time).ravel(),
        }
    )
    causes = _causes(time[:-1], late, wait, steps, ranks)
    return {
        name: frame.assign(run_id=run_id)
        for name, frame in (
            ("joins", join_rows),
            ("windows", windows),
            ("path", path),
            ("causes", causes),
        )
    }


def _pivot(run_joins: pd.DataFrame, column: str) -> np.ndarray:
    """(steps, ranks) of a column of the joins, None where the table lacks it."""
    if column not in run_joins:
        shape = (run_joins["step"].nunique(), run_joins["rank"].nunique())
        return np.full(shape, None, dtype=object)
    return run_joins.pivot(index="step", columns="rank", values=column).to_numpy(object)


def _new_epochs(intervals: pd.DataFrame, steps: np.ndarray) -> np.ndarray:
    """The joins (indexes into ``steps``, the first left out) whose step
    begins an epoch, where the table says epochs."""
    if "epoch" not in intervals or intervals["epoch"].isna().all():
        return np.array([], dtype=np.int64)
    epoch = intervals.groupby("step")["epoch"].first().reindex(steps).to_numpy()
    return np.flatnonzero(epoch[1:] != epoch[:-1]) + 1


def _per_rank(values: pd.Series, ranks: np.ndarray, default: np.ndarray) -> np.ndarray:
    """values[rank] for each rank, default where a rank has none (int64 kept)."""
    out = default.astype(np.int64).copy()
    present = np.isin(ranks, values.index)
    out[present] = values.loc[ranks[present]].to_numpy(np.int64)
    return out


def _clip(start: np.ndarray, end: np.ndarray, w_start: np.ndarray, w_end: np.ndarray):
    """Cut intervals by windows (sorted, disjoint): (interval index, window,
    start, end) of each non-empty piece."""
    first = np.searchsorted(w_end, start, side="right")
    past = np.searchsorted(w_start, end, side="left")
    count = np.clip(past - first, 0, None)
    idx = np.repeat(np.arange(len(start)), count)
    offset = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    win = np.repeat(first, count) + offset
    cut_start = np.maximum(start[idx], w_start[win])
    cut_end = np.minimum(end[idx], w_end[win])
    keep = cut_end > cut_start
    return idx[keep], win[keep], cut_start[keep], cut_end[keep]


def _relative_propagated(time: np.ndarray) -> np.ndarray:
    """Window times with the propagated column as each rank's window start
    against the earliest rank's (how much later it began the window)."""
    out = time.copy()
    col = CAUSES.index(PROPAGATED)
    out[:, :, col] = time[:, :, col] - time[:, :, col].min(axis=1, keepdims=True)
    return out


def _causes(
    time: np.ndarray, late: np.ndarray, wait: np.ndarray, steps: np.ndarray, ranks: np.ndarray
) -> pd.DataFrame:
    """Scalasca's delay costs: each waiting rank's wait split over the late
    rank's positive excess terms, summed over the waiting ranks."""
    n_joins = len(late)
    mine = time[np.arange(n_joins), late][:, None, :]  # (joins, 1, causes)
    excess = (mine - time).astype(np.float64)  # window start columns give the propagated skew
    excess = np.clip(excess, 0, None)
    total = excess.sum(axis=2, keepdims=True)
    share = np.divide(excess, total, out=np.zeros_like(excess), where=total > 0)
    waited = (share * wait[:, :, None]).sum(axis=1)  # (joins, causes)
    return pd.DataFrame(
        {
            "join": np.repeat(np.arange(n_joins), len(CAUSES)),
            "step": np.repeat(steps, len(CAUSES)),
            "late_rank": np.repeat(ranks[late], len(CAUSES)),
            "cause": np.tile(np.asarray(CAUSES, dtype=object), n_joins),
            "waited_ns": waited.ravel(),
        }
    )


# --------------------------------------------------------------- summaries


def phase_shares(found: CriticalPath) -> pd.DataFrame:
    """Per run and phase: its share of the critical path against its share
    of the mean step (a rank's step: from its first phase's start to its
    last phase's end)."""
    if found.path.empty:
        return pd.DataFrame(columns=["run_id", "phase", "path_share", "step_share"])
    path = found.path.groupby(["run_id", "phase"])["dur_ns"].sum()
    path = path / path.groupby("run_id").transform("sum")
    iv = found.intervals[found.intervals["run_id"].isin(found.joins["run_id"])]
    dur = (iv["end_ns"] - iv["start_ns"]).groupby([iv["run_id"], iv["phase"]]).sum()
    spans = iv.groupby(["run_id", "rank", "step"]).agg(a=("start_ns", "min"), b=("end_ns", "max"))
    total = (spans["b"] - spans["a"]).groupby("run_id").sum()
    step = dur / dur.index.get_level_values("run_id").map(total).to_numpy()
    untimed = 1 - step.groupby("run_id").sum()
    step = pd.concat(
        [
            step,
            pd.Series(
                untimed.clip(lower=0).to_numpy(),
                index=pd.MultiIndex.from_arrays(
                    [untimed.index, [UNTIMED] * len(untimed)], names=["run_id", "phase"]
                ),
            ),
        ]
    )
    table = pd.DataFrame({"path_share": path, "step_share": step}).fillna(0.0)
    return table.reset_index()


def rank_table(found: CriticalPath) -> pd.DataFrame:
    """Per run and rank: how often it arrives last at the join, and its
    share of the critical path's time."""
    if found.joins.empty:
        return pd.DataFrame(columns=["run_id", "rank", "last_share", "path_share"])
    last = found.joins.groupby(["run_id", "rank"])["last"].mean().rename("last_share")
    on_path = found.path.groupby(["run_id", "rank"])["dur_ns"].sum()
    on_path = (on_path / on_path.groupby("run_id").transform("sum")).rename("path_share")
    return pd.concat([last, on_path], axis=1).fillna(0.0).reset_index()


def cause_table(found: CriticalPath) -> pd.DataFrame:
    """Per run, late rank and cause: the waiting caused, in ms per join and
    as a share of all the run's waiting."""
    if found.causes.empty:
        return pd.DataFrame(
            columns=["run_id", "late_rank", "cause", "waited_ms_per_step", "waiting_share"]
        )
    caused = found.causes.groupby(["run_id", "late_rank", "cause"])["waited_ns"].sum()
    caused = caused[caused > 0]
    joins = found.joins.groupby("run_id")["join"].nunique()
    table = pd.DataFrame(
        {
            "waited_ms_per_step": caused
            / caused.index.get_level_values(0).map(joins).to_numpy()
            / 1e6,
            "waiting_share": caused / caused.groupby("run_id").transform("sum"),
        }
    )
    return table.reset_index().sort_values(["run_id", "waiting_share"], ascending=[True, False])


def run_summary(found: CriticalPath) -> pd.DataFrame:
    """One row per run: the join used, steps analysed, the path's length
    per step, waiting (synchronisation skew) and communication proper per
    step (means over ranks), and the main cause of waiting."""
    if found.joins.empty:
        return pd.DataFrame(
            columns=[
                "run_id",
                "join_kind",
                "steps",
                "path_ms_per_step",
                "waiting_ms_per_step",
                "communication_ms_per_step",
            ]
        )
    per_join = found.joins.groupby(["run_id", "join"])[["wait_ns", "comm_ns"]].mean()
    table = per_join.groupby("run_id").mean() / 1e6
    table.columns = ["waiting_ms_per_step", "communication_ms_per_step"]
    table["steps"] = per_join.groupby("run_id").size()
    table["path_ms_per_step"] = found.path.groupby("run_id")["dur_ns"].sum() / table["steps"] / 1e6
    table["join_kind"] = table.index.map(found.method)
    # Where backward or the whole step is the join, its all-reduce is not seen apart from it.
    table.loc[table["join_kind"].isin(WHOLE_JOINS), "communication_ms_per_step"] = np.nan
    causes = cause_table(found).drop_duplicates("run_id").set_index("run_id")
    table = table.join(
        causes.rename(columns={"late_rank": "main_cause_rank", "cause": "main_cause"})
    )
    return table.reset_index()


def cell_table(found: CriticalPath, runs: pd.DataFrame) -> pd.DataFrame:
    """Per design cell (replications pooled): the run summary's means, the
    main cause of waiting over the cell's runs and the phase whose share of
    the path is largest, with its share of the mean step, and a sentence."""
    info = cells.with_setting(runs).set_index("run_id")
    summary = run_summary(found)
    summary = summary[summary["run_id"].isin(info.index)]
    if summary.empty:
        return pd.DataFrame(columns=[*cells.CELL, "finding"])
    summary = summary.join(info[cells.CELL], on="run_id")
    causes = cause_table(found).join(info[cells.CELL], on="run_id")
    shares = phase_shares(found).join(info[cells.CELL], on="run_id")
    rows = []
    for key, group in summary.groupby(cells.CELL):
        runs_here = set(group["run_id"])
        row = {
            **dict(zip(cells.CELL, key)),
            "runs": len(group),
            "join_kind": group["join_kind"].iloc[0],
        }
        for column in (
            "steps",
            "path_ms_per_step",
            "waiting_ms_per_step",
            "communication_ms_per_step",
        ):
            row[column] = group[column].mean()
        mine = causes[causes["run_id"].isin(runs_here)]
        caused = mine.groupby(["late_rank", "cause"])["waited_ms_per_step"].sum() / len(group)
        if len(caused) and caused.sum() > 0:
            (rank, cause), value = caused.idxmax(), caused.max()
            row.update(
                main_cause_rank=int(rank),
                main_cause=cause,
                main_cause_ms_per_step=value,
                main_cause_share=value / caused.sum(),
            )
        share = (
            shares[shares["run_id"].isin(runs_here)]
            .groupby("phase")[["path_share", "step_share"]]
            .mean()
        )
        if len(share):
            top = share["path_share"].idxmax()
            row.update(
                path_top_phase=top,
                path_top_share=share.loc[top, "path_share"],
                path_top_step_share=share.loc[top, "step_share"],
            )
        if row["world_size"] == 1:  # a one-process "join" exchanges nothing
            row["communication_ms_per_step"] = np.nan
        row["finding"] = sentence(row)
        rows.append(row)
    return cells.in_order(pd.DataFrame(rows), cells.CELL)


def processes(n) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def run_label(runs: pd.DataFrame, run_id: str) -> str:
    """A run as a reader knows it: framework, processes, setting and
    replication (its id only where the runs table lacks those)."""
    row = cells.with_setting(runs).set_index("run_id").loc[run_id]
    rep = f", rep {row['rep']}" if "rep" in row else ""
    return f"{row['framework']}, {processes(row['world_size'])}, {row['setting']}{rep}"


def _cause_words(rank: int, cause: str) -> str:
    if cause == UNTIMED:
        return f"rank {rank}'s longer untimed gaps cause"
    if cause == PROPAGATED:
        return f"rank {rank}'s later exit from the previous join causes"
    return f"rank {rank}'s slower {cause} causes"


def sentence(row: dict) -> str:
    """One sentence for a cell of cell_table."""
    where = JOIN_NAMES.get(row["join_kind"], row["join_kind"])
    if row.get("world_size") == 1:  # no other rank: nothing to wait for, nothing to exchange
        text = "One process: no communication and no waiting"
        if "path_top_phase" in row:
            text += f"; {row['path_top_phase']} is {row['path_top_share']:.0%} of its critical path"
        return text + "."
    if row.get("main_cause") is not None and not pd.isna(row.get("main_cause")):
        text = (
            f"{_cause_words(row['main_cause_rank'], row['main_cause'])} "
            f"{row['main_cause_share']:.0%} of the waiting at {where} "
            f"({humanize.number(row['main_cause_ms_per_step'], 'ms')} per step, all ranks' together); "
        )
    else:
        text = f"No rank waits at {where}; "
    if row["join_kind"] == "other":  # whole steps: their starts are all that is seen
        text += (
            f"ranks wait {humanize.number(row['waiting_ms_per_step'], 'ms')} per step for the "
            "last to begin its step (synchronisation skew; the wait inside the step is not seen)"
        )
    else:
        text += (
            f"the {WAIT_NAME} is {humanize.number(row['waiting_ms_per_step'], 'ms')} "
            f"(synchronisation skew)"
        )
    if pd.isna(row["communication_ms_per_step"]):
        apart = "the step" if row["join_kind"] == "other" else "backward"
        text += f", its all-reduce not seen apart from {apart} (no trace of the collectives)"
    else:
        text += (
            f" against {humanize.number(row['communication_ms_per_step'], 'ms')} per step "
            f"of communication proper"
        )
    if "path_top_phase" in row:
        text += (
            f", and {row['path_top_phase']} is {row['path_top_share']:.0%} of the "
            f"critical path against {row['path_top_step_share']:.0%} of the mean step"
        )
    return text[0].upper() + text[1:] + "."


# ------------------------------------------------------------------ report


def phase_table(tables) -> pd.DataFrame:
    """What the analysis reads from a tables folder: each run's converted
    trace (phases.parquet) where it has one with step phases, else its
    phase recorder's intervals (step_phases.parquet)."""
    tables = Path(tables)
    recorder = (
        read_table(tables / "step_phases.parquet")
        if (tables / "step_phases.parquet").exists()
        else pd.DataFrame(columns=["run_id"])
    )
    traced = (
        read_table(tables / PHASE_TABLE)
        if (tables / PHASE_TABLE).exists()
        else pd.DataFrame(columns=["run_id"])
    )
    if len(traced):
        with_steps = traced[traced["phase"].isin(STEP_PHASES) & traced["step"].notna()]
        traced = traced[traced["run_id"].isin(set(with_steps["run_id"]))]
        recorder = recorder[~recorder["run_id"].isin(set(traced["run_id"]))]
    return pd.concat([traced, recorder], ignore_index=True) if len(traced) else recorder


SECTION_ID, SECTION_TITLE = "critical-path", "Critical path and causes of waiting"


def section(
    runs: pd.DataFrame,
    phases: pd.DataFrame,
    figure: Path | None = None,
    found: CriticalPath | None = None,
) -> Section:
    """The report's section: a sentence and a row per design cell, the
    causes of waiting, the ranks on the path, the phases' shares; with
    ``figure`` (analysis/figures.py's critical_path), the per-rank timeline
    with the path marked."""
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    if found is None:
        found = analyse(phases[phases["run_id"].isin(ok["run_id"])], ok)
    table = cell_table(found, ok)
    info = cells.with_setting(ok).set_index("run_id")[cells.CELL]
    out = Section(SECTION_ID, SECTION_TITLE)
    out.items(
        [
            f"{r['framework']}, {processes(r['world_size'])}, {r['setting']}: "
            f"{r['finding'][0].lower()}{r['finding'][1:]}"
            for _, r in table.iterrows()
        ]
        + [
            f"{run_label(ok, run)}: no critical path ({why})."
            for run, why in found.problems.items()
            if run in info.index
        ]
        + phase_recording.lines(ok, lacking="its ranks join at the whole step")
    )
    if figure is not None:
        out.figure(figure, SECTION_TITLE)
    tables = {
        "per cell": table.drop(columns="finding"),  # the sentences above say it
        "causes of waiting": cause_table(found).join(info, on="run_id"),
        "ranks on the critical path": rank_table(found).join(info, on="run_id"),
        "share of the critical path and of the mean step": phase_shares(found).join(
            info, on="run_id"
        ),
    }
    for caption, t in tables.items():
        if len(t):
            out.table(cells.by_rep(t, ok), caption=caption)
    return out
