"""Trace diff: the same cell under two frameworks (or two levels of any
factor), phase by phase, and where the difference lands on the critical
path.

For each run (analysis/critical_path.py): each phase's seconds per step
(mean over ranks), its seconds per step on the critical path (grad_comm on
the path is exposed communication proper, the rest of grad_comm is
waiting), and the step (the path per join). For two levels A and B of the
compared factor in the same cell (processes and every other factor equal):
the difference of the means over replications with Welch's 95 % interval
(none with a single replication on a side), and one sentence.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from analysis import cells, phase_recording
from analysis import critical_path as cp
from analysis.section import Section
from runfiles.phases import STEP_PHASES

PARTS = [*STEP_PHASES, "other", cp.UNTIMED]  # other: a whole step's join
CONFIDENCE = 0.95


def per_run(found: cp.CriticalPath) -> pd.DataFrame:
    """One row per run and part: seconds per step in the mean step and on
    the critical path, and the run's step."""
    if found.joins.empty:
        return pd.DataFrame(columns=["run_id", "part", "step_s", "path_s", "run_step_s"])
    joins = found.joins.groupby("run_id")["join"].max() + 1
    ranks = found.joins.groupby("run_id")["rank"].nunique()
    windows = found.windows[found.windows["cause"].isin(PARTS)]
    mean = windows.groupby(["run_id", "cause"], observed=True)["ns"].sum()
    runs = mean.index.get_level_values("run_id")
    mean = mean / (joins.reindex(runs).to_numpy() * ranks.reindex(runs).to_numpy()) / 1e9
    # The joins themselves: grad_comm where the run exposes it (waiting and
    # communication proper), else part of the phase the join is.
    join_time = (
        (found.joins["exit_ns"] - found.joins["entry_ns"]).groupby(found.joins["run_id"]).sum()
        / (joins * ranks)
        / 1e9
    )
    for run_id, seconds in join_time.items():
        method = found.method.get(run_id)
        part = method if method in cp.WHOLE_JOINS else "grad_comm"
        mean.loc[(run_id, part)] = mean.get((run_id, part), 0.0) + seconds
    path = found.path.groupby(["run_id", "phase"])["dur_ns"].sum()
    path = path / joins.reindex(path.index.get_level_values("run_id")).to_numpy() / 1e9
    table = pd.DataFrame({"step_s": mean, "path_s": path}).fillna(0.0)
    table.index.names = ["run_id", "part"]
    table = table.reset_index()
    step = found.path.groupby("run_id")["dur_ns"].sum() / joins / 1e9
    return table.assign(run_step_s=table["run_id"].map(step))


def difference(a: pd.Series, b: pd.Series) -> tuple[float, float, float]:
    """mean(a) - mean(b) and Welch's interval (NaN with one run on a side)."""
    diff = float(a.mean() - b.mean())
    constant = np.allclose(a, a.mean(), rtol=1e-9, atol=1e-12) and np.allclose(
        b, b.mean(), rtol=1e-9, atol=1e-12
    )
    if len(a) < 2 or len(b) < 2 or constant:
        spread = 0.0 if len(a) >= 2 and len(b) >= 2 else np.nan
        return diff, diff - spread, diff + spread
    # Here, not above: scipy.stats costs a third of a second of CPU, which a
    # report of one run per cell does not need.
    from scipy import stats

    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(CONFIDENCE)
    return diff, float(ci.low), float(ci.high)


def compare(
    runs: pd.DataFrame, phases: pd.DataFrame, by: str = "framework", found=None
) -> pd.DataFrame:
    """Per cell and pair of levels of ``by``: per part, the difference in
    seconds per step (mean step and on the path) with its interval;
    ``found``: the ok runs' critical path where the caller has it already."""
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    if found is None:
        found = cp.analyse(phases[phases["run_id"].isin(ok["run_id"])], ok)
    parts = per_run(found)
    if parts.empty or by not in ok:
        return pd.DataFrame()
    labelled = cells.with_setting(ok, leave_out=(by,) if by != "framework" else ())
    keys = [k for k in cells.CELL if k != by]
    parts = parts.join(labelled.set_index("run_id")[[*keys, by]], on="run_id")
    rows = []
    for key, cell in parts.groupby(keys):
        levels = sorted(cell[by].dropna().unique(), key=str)
        for a, b in combinations(levels, 2):
            rows += _pair(
                cell, by, a, b, dict(zip(keys, key if isinstance(key, tuple) else (key,)))
            )
    return pd.DataFrame(rows)


def _pair(cell: pd.DataFrame, by: str, a, b, label: dict) -> list[dict]:
    first, second = cell[cell[by] == a], cell[cell[by] == b]
    steps_a = first.drop_duplicates("run_id").set_index("run_id")["run_step_s"]
    steps_b = second.drop_duplicates("run_id").set_index("run_id")["run_step_s"]
    diff, low, high = difference(steps_a, steps_b)
    base = {**label, "compared": by, "a": a, "b": b, "runs_a": len(steps_a), "runs_b": len(steps_b)}
    rows = [
        {
            **base,
            "part": "step",
            "diff_ms": diff * 1e3,
            "low_ms": low * 1e3,
            "high_ms": high * 1e3,
            "on_path_ms": diff * 1e3,
        }
    ]
    for part in PARTS:
        if part == "other" and "other" not in set(first["part"]) | set(second["part"]):
            continue  # only runs joined at their whole step have it
        mine = _part(first, part, steps_a.index)
        theirs = _part(second, part, steps_b.index)
        d, lo, hi = difference(mine["step_s"], theirs["step_s"])
        on_path = float(mine["path_s"].mean() - theirs["path_s"].mean())
        rows.append(
            {
                **base,
                "part": part,
                "diff_ms": d * 1e3,
                "low_ms": lo * 1e3,
                "high_ms": hi * 1e3,
                "on_path_ms": on_path * 1e3,
            }
        )
    return rows


def _part(side: pd.DataFrame, part: str, run_ids: pd.Index) -> pd.DataFrame:
    """A part's seconds per run (0 where a run has none of it)."""
    mine = side[side["part"] == part].set_index("run_id")[["step_s", "path_s"]]
    return mine.reindex(run_ids).fillna(0.0)


def sentences(table: pd.DataFrame) -> list[str]:
    """One per cell and pair: the step's difference and where on the path
    most of it lies."""
    out: list[str] = []
    if table.empty:
        return out
    for _, pair in table.groupby([*[k for k in cells.CELL if k in table], "a", "b"]):
        step = pair[pair["part"] == "step"].iloc[0]
        parts = pair[pair["part"] != "step"]
        slower, faster, sign = (
            (step["a"], step["b"], 1) if step["diff_ms"] >= 0 else (step["b"], step["a"], -1)
        )
        top = parts.loc[(parts["on_path_ms"] * sign).idxmax()]
        where = "exposed grad_comm" if top["part"] == "grad_comm" else top["part"]
        interval = (
            ""
            if np.isnan(step["low_ms"])
            else f" (95 % interval {sign * step['low_ms']:.1f} to {sign * step['high_ms']:.1f})"
        )
        if sign < 0:
            interval = (
                ""
                if np.isnan(step["low_ms"])
                else f" (95 % interval {-step['high_ms']:.1f} to {-step['low_ms']:.1f})"
            )
        cell = ", ".join(
            ([] if step["compared"] == "framework" else [str(step["framework"])])
            + [cp.processes(step["world_size"]), str(step["setting"])]
        )
        out.append(
            f"{cell}: {slower} spends {abs(step['diff_ms']):.1f} ms more per step than "
            f"{faster}{interval}, {sign * top['on_path_ms']:.1f} ms of it in {where} on "
            f"the critical path."
        )
    return out


SECTION_ID = "trace-diff"


def section(runs: pd.DataFrame, phases: pd.DataFrame, by: str = "framework", found=None) -> Section:
    """The report's section: a sentence per cell, the differences as a table."""
    table = compare(runs, phases, by, found)
    out = Section(SECTION_ID, f"Trace diff: {by} against {by}, phase by phase")
    out.items(sentences(table) or [f"No cell holds two levels of {by} to compare."])
    out.items(phase_recording.lines(runs, lacking="its step is compared whole, as 'other'"))
    if len(table):
        out.table(table, caption="difference per step (a - b), mean step and critical path")
    return out
