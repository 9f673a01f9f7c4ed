"""Time to accuracy, MLPerf's way: the run clock (frameworks.common.RunClock)
starts just before the training data is touched, and a run reaches the
target at the end of the first evaluation whose test accuracy is at or above
``target_accuracy``. Runs that never reach it are kept and marked, never
dropped: leaving them out would flatter the frameworks that miss it.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import cells
from analysis.section import Code, Em, Section

REACHED, NOT_REACHED, NOT_ASKED = "reached", "not reached", "no target_accuracy"
COLUMNS = ("target_status", "time_to_accuracy_s", "epochs_to_accuracy", "energy_to_accuracy_j")


def time_to_accuracy(epochs: pd.DataFrame, target: float | None) -> dict:
    """One run's epochs (epochs.tsv, with ``energy_to_epoch_j`` where energy
    was measured) -> its target status, and the wall time, epochs and joules
    to the target (NaN unless reached; joules also NaN where not measured)."""
    nan = {
        "time_to_accuracy_s": math.nan,
        "epochs_to_accuracy": math.nan,
        "energy_to_accuracy_j": math.nan,
    }
    if target is None:
        return {"target_status": NOT_ASKED, **nan}
    evaluated = epochs.dropna(subset=["test_accuracy"]).sort_values("epoch")
    hits = evaluated[evaluated["test_accuracy"] >= target]
    if hits.empty:
        return {"target_status": NOT_REACHED, **nan}
    first = hits.iloc[0]
    return {
        "target_status": REACHED,
        "time_to_accuracy_s": float(first["elapsed_s"]),
        "epochs_to_accuracy": int(first["epoch"]),
        "energy_to_accuracy_j": float(first.get("energy_to_epoch_j", math.nan)),
    }


def summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per framework and process count: runs, how many reached the target,
    and the mean time and epochs of those that did."""
    asked = runs[(runs["status"] == "ok") & (runs["target_status"] != NOT_ASKED)]
    if asked.empty:
        return pd.DataFrame()
    grouped = cells.with_setting(asked).groupby(cells.CELL, dropna=False)
    table = grouped.agg(
        runs=("run_id", "size"),
        reached=("target_status", lambda s: int((s == REACHED).sum())),
        time_to_accuracy_s=("time_to_accuracy_s", "mean"),
        epochs_to_accuracy=("epochs_to_accuracy", "mean"),
        energy_to_accuracy_j=("energy_to_accuracy_j", "mean"),
    )
    return cells.in_order(table.reset_index(), cells.CELL)  # batch 64 before 256


def section(ctx) -> Section:
    """Accuracy over time and time to accuracy."""
    figures = ctx.figures
    out = (
        Section("accuracy", "Accuracy")
        .figure(figures / "accuracy.png", "accuracy")
        .para("Evaluation is distributed: each rank scores its share of the test set.")
        .heading("Time to accuracy")
    )
    table = summary(ctx.runs)
    if table.empty:
        return out.para(
            "Not measured: set ",
            Code("target_accuracy"),
            " under ",
            Code("fixed"),
            " in the design (it only re-analyses the runs).",
        )
    return (
        out.figure(figures / "time_to_accuracy.png", "time to accuracy")
        .para(
            "The run clock starts just before the training data is touched and stops "
            "at the end of the first evaluation at or above target_accuracy (MLPerf's "
            "rule), so it counts data loading and evaluation. A run that never reaches "
            "the target is counted in ",
            Em("runs"),
            " but not in ",
            Em("reached"),
            "; the means are over the runs that reached it, and so is "
            "energy_to_accuracy_j (the joules up to that evaluation, where energy was "
            "measured). Accuracy is only checked where an epoch evaluates (eval_every).",
        )
        .table(table)
    )
