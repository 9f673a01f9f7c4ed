"""Read every run's files once and write the tables the analysis reads.

- ``runs.parquet`` / ``runs.csv``: one row per planned run, every factor and
  setting as a column, its status (ok, failed, interrupted, running, missing)
  and its headline figures. Failed runs keep their reason and no figures.
- ``epochs.parquet``: one row per run and epoch (epochs.tsv of ok runs).
- ``step_stats.parquet``: one row per run and rank: mean, median and p95
  step time over the measured steps, mean time per phase, and
  ``comm_bytes_mean``: the bytes the rank handed to collectives per measured
  step (empty where the adapter cannot see them). The runs table's
  ``comm_bytes_per_step`` is its mean over ranks.
- ``step_phases.parquet``: from the phase recorder, for every run: one row
  per phase interval (run_id, rank, epoch, step, phase, start_ns, end_ns,
  dur_ns, source). Within a step the phases run back to back, so each start
  is the step's start plus the phases before it (source "steps"), ``other``
  last: a framework that times only whole steps has one ``other`` row per
  step, never none; ``init``
  and ``eval`` come from intervals.rank<r>.tsv (step -1). The breakdown and
  bottleneck analyses read this one.
- energy: runs get ``energy_j`` (the run clock's window, see
  runfiles/energy.py for what is counted), ``energy_per_epoch_j``,
  ``energy_per_image_j`` (per training image, evaluation included) and
  ``energy_status`` ("measured: rapl+nvml" or "not available: <reasons>");
  epochs get ``energy_j`` (that epoch) and ``energy_to_epoch_j`` (since the
  run clock's start, for energy to accuracy). NaN where not measured.
- load: runs get ``foreign_cpu_share``, ``loaded`` and ``busiest_foreign``
  (what else the machine did while they measured; see load_figures).
- conditions: runs get ``cores_per_rank``, ``own_cores``,
  ``compute_threads``, ``ranks_per_node``, ``runnable_per_core``,
  ``network`` and ``cpu``, read back from the ranks (analysis/conditions.py).
- ``balance.parquet``: one row per run and rank of calibrated runs
  (balance.json: device kind, images per step, share, speed, idle time;
  analysis/devices.py).
- ``phases.parquet``: every run's converted traces (``<run>/phases.parquet``,
  see traces/table.py) stacked: our OTF2, Score-P, Horovod Timeline, Kineto,
  with collectives and their bytes; runs.csv's ``trace_errors`` says which
  traces could not be read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from runfiles.names import EPOCHS, METRICS, PHASE_TABLE
from analysis import accuracy, cells, conditions, devices, replication, stats
from runfiles import energy, names, records
from runfiles.tables import Damaged, read_tsv
from runfiles.atomic import replacing, write_text
from ddlcompare.plan.design import Design, check_run
from runfiles.phases import LATER_PHASES, PHASES, STEP_PHASES
from traces import convert
from traces.table import META_VERSION, SCHEMA, SCHEMA_VERSION
from runfiles import files
from runfiles.run_config import RunConfig

PHASE_COLUMNS = [
    "run_id",
    "rank",
    "epoch",
    "step",
    "phase",
    "start_ns",
    "end_ns",
    "dur_ns",
    "source",
]

FIGURES = (
    "images_per_s",
    "images_per_s_per_process",
    "time_per_epoch_s",
    "final_test_accuracy",
    "final_test_loss",
    "init_s",
    "global_batch",
    "world_size",
    "steps_per_epoch",
    "learning_rate_scaled",
)


def _read_json(path: Path) -> dict | None:
    try:
        return files.read_json(path)
    except (OSError, ValueError):
        return None


def outcome(folder: Path, config: RunConfig) -> tuple[dict, dict]:
    """The run's record (run.json, {} when unreadable) and its outcome:
    status, exit status and reason, from its done marker, or from run.json
    for a run without one. A run whose files are damaged is "damaged", with
    the file and the problem as its reason."""
    try:
        record = records.read_json(folder / names.RUN_RECORD)
    except Damaged:
        record = {}
    status, problem = records.done_status(folder)
    if status is None:
        result = {
            "status": record.get("status", "missing"),
            "exit_status": record.get("exit_status"),
            "reason": record.get("reason"),
        }
    elif problem:
        result = {"status": "damaged", "exit_status": None, "reason": problem}
    else:
        done = records.read_json(folder / names.DONE)
        result = {k: done[k] for k in ("status", "exit_status", "reason")}
    if result["status"] == "ok" and (problems := check_run(folder, config)):
        result = {
            "status": "damaged",
            "exit_status": result["exit_status"],
            "reason": "; ".join(problems[:3])
            + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""),
        }
    return record, result


def run_row(design: Design, row, results: Path) -> dict:
    folder = results / row.path
    out = {
        "run_id": row.run_id,
        "path": row.path,
        "order": row.order,
        "rep": row.rep,
        **{k: v for k, v in row.config.items() if k not in ("run_id", "rep")},
    }
    if design.adaptive:  # the runs its replications were decided from (stats.cell_interval)
        out[stats.FIRST_STAGE] = row.rep <= design.adaptive.least
    record, result = outcome(folder, row.config)
    out.update(result)
    out["start"], out["end"] = record.get("start"), record.get("end")
    ranks = record.get("ranks", [])
    out["hosts"] = ",".join(sorted({r["hostname"] for r in ranks}))
    out["harness_commit"] = record.get("harness_commit")
    for key in ("torch", "tensorflow", "horovod", "python"):
        out[f"version_{key}"] = ranks[0].get(key) if ranks else None
    out["mpi"] = None if record.get("mpi") is None else str(record.get("mpi"))
    metrics = _read_json(folder / METRICS) if out["status"] == "ok" else None
    for key in FIGURES:
        out[key] = (metrics or {}).get(key)
    out["global_batch"] = row.config["batch_size"] * row.world_size
    out["world_size"] = row.world_size
    out.update(network_figures(folder, metrics))
    out.update(energy_figures(folder, metrics))
    out.update(load_figures(record))
    out.update(conditions.columns(record))
    return out


def load_figures(record: dict) -> dict:
    """What else the machine did while the run measured (run.json's
    machine_load, ddlcompare/run/machine_load.py): ``foreign_cpu_share``,
    ``loaded`` (measured beside heavy foreign load, or on a machine shared
    with other runs of ours, ``machine_shared``: not clean) and
    ``busiest_foreign``; the run's own threads that spin (never block, yet
    take a core): ``spinning_threads`` and the cores they took,
    ``spinning_cores``; the cores its other threads ran on and waited for,
    ``others_cpu_cores`` and ``others_wait_cores`` (of which the spinning
    accounts for ``others_wait_behind_spinning_cores``; the largest share of
    the window one of them waited, ``others_largest_wait_share``), of
    ``machine_cores``;
    empty where the run did not sample it (a cluster
    job, an older run)."""
    load = record.get(records.MACHINE_LOAD) or {}
    busiest = "; ".join(
        f"{p['command'][:60]} (pid {p['pid']}): {p['cores']:.2f} cores"
        for p in load.get("busiest_foreign", [])[:3]
    )
    spinning = load.get("spinning")
    others = load.get("not_spinning") or {}
    return {
        "foreign_cpu_share": load.get("foreign_cpu_share"),
        "loaded": True if record.get("machine_shared") else load.get("loaded"),
        "busiest_foreign": busiest or None,
        "spinning_threads": None if spinning is None else len(spinning),
        "spinning_cores": None
        if spinning is None
        else round(sum(t["cpu_share"] for t in spinning), 3),
        "others_cpu_cores": others.get("cpu_cores"),
        "others_wait_cores": others.get("wait_cores"),
        "others_wait_behind_spinning_cores": others.get("wait_behind_spinning_cores"),
        "others_largest_wait_share": others.get("largest_wait_share"),
        "machine_cores": load.get("cores"),
    }


def network_figures(folder: Path, metrics: dict | None) -> dict:
    """What the emulated network carried (network.json): bytes all nodes
    sent, and that per optimizer step (start-up and evaluation included)."""
    record = _read_json(folder / names.NETWORK) if metrics else None
    if not record or not metrics:
        return {"net_tx_bytes": None, "net_tx_bytes_per_step": None}
    steps = metrics["steps_per_epoch"] * metrics["epochs_done"]
    return {
        "net_tx_bytes": record["tx_bytes"],
        "net_tx_bytes_per_step": record["tx_bytes"] / steps if steps else None,
    }


def energy_figures(folder: Path, metrics: dict | None) -> dict:
    """The run's energy columns from its energy.json (ok runs only, like
    every figure)."""
    out: dict[str, float | str | None] = {
        "energy_j": np.nan,
        "energy_per_epoch_j": np.nan,
        "energy_per_image_j": np.nan,
        "energy_status": None,
    }
    if metrics is None:
        return out
    doc = _read_json(folder / energy.ENERGY)
    if doc is None:
        out["energy_status"] = "not available: the run wrote no energy.json"
        return out
    out["energy_status"] = doc["status"]
    if doc["joules"] is not None:
        images = metrics["steps_per_epoch"] * metrics["global_batch"] * metrics["epochs_done"]
        out["energy_j"] = doc["joules"]
        out["energy_per_epoch_j"] = doc["joules"] / metrics["epochs_done"]
        out["energy_per_image_j"] = doc["joules"] / images
    return out


def epoch_energy(folder: Path, epochs: pd.DataFrame) -> pd.DataFrame:
    """epochs.tsv's rows with each epoch's joules (NaN where not measured)."""
    doc = _read_json(folder / energy.ENERGY) or {}
    measured = pd.DataFrame(
        doc.get("epochs") or [], columns=["epoch", "energy_j", "energy_to_epoch_j"]
    )
    return epochs.merge(measured.astype(float).astype({"epoch": int}), on="epoch", how="left")


def step_stats(folder: Path, warmup: int) -> list[dict]:
    rows = []
    for rank, path in names.rank_files(folder, names.STEPS_GLOB):
        steps = read_steps(path)
        steps = steps[steps["step"] >= warmup]
        if steps.empty:
            continue
        seconds = (steps["end_ns"] - steps["start_ns"]) / 1e9
        stats = {
            "rank": rank,
            "steps": len(steps),
            "step_mean_s": seconds.mean(),
            "step_median_s": seconds.median(),
            "step_p95_s": seconds.quantile(0.95),
        }
        for phase in PHASES:
            stats[f"{phase}_mean_s"] = steps[f"{phase}_ns"].mean() / 1e9
        stats["comm_bytes_mean"] = steps["comm_bytes"].mean() if "comm_bytes" in steps else np.nan
        rows.append(stats)
    return rows


def read_steps(path: Path) -> pd.DataFrame:
    """A rank's steps table, with a column of 0 for each phase younger than
    it (runfiles.phases.LATER_PHASES); Damaged, naming it, when its
    columns or numbers are not a steps table's (the timeline reads a run
    folder that no check has passed)."""
    steps = read_tsv(path, names.STEP_COLUMNS, min_rows=0)
    for phase in LATER_PHASES:
        steps[f"{phase}_ns"] = steps.get(f"{phase}_ns", 0)
    return steps


# A step's rows: its named phases, then ``other`` (a framework that owns its
# step, like Tarantella's fit, records the whole step there), so that no
# step's time is lost to the tables built from these rows.
ROW_PHASES = (*STEP_PHASES, "other")


def phase_intervals(folder: Path, run_id: str) -> pd.DataFrame:
    frames = []
    for rank, path in names.rank_files(folder, names.STEPS_GLOB):
        steps = read_steps(path)
        offset = steps["start_ns"].copy()
        # A zero grad_comm stays where the rank times phases (the exchange
        # was there, it cost nothing); a whole-steps-only rank has none.
        named = steps[[f"{p}_ns" for p in STEP_PHASES]].to_numpy().any()
        for phase in ROW_PHASES:
            dur = steps[f"{phase}_ns"]
            if not dur.any() and not (phase == "grad_comm" and named):
                continue
            frames.append(
                pd.DataFrame(
                    {
                        "rank": rank,
                        "epoch": steps["epoch"],
                        "step": steps["step"],
                        "phase": phase,
                        "start_ns": offset,
                        "end_ns": offset + dur,
                        "dur_ns": dur,
                    }
                )
            )
            offset = offset + dur
    for rank, path in names.rank_files(folder, names.INTERVALS_GLOB):
        spans = read_tsv(path, names.INTERVAL_COLUMNS, min_rows=0)
        frames.append(spans.assign(rank=rank, step=-1, dur_ns=spans["end_ns"] - spans["start_ns"]))
    if not frames:
        return pd.DataFrame(columns=PHASE_COLUMNS)
    table = pd.concat(frames, ignore_index=True)
    table = table[(table["dur_ns"] > 0) | (table["phase"] == "grad_comm")]
    return table.assign(run_id=run_id, source="steps")[PHASE_COLUMNS]


def tables(design: Design, results: Path) -> dict[str, pd.DataFrame]:
    runs, epochs, stats, step_phases, balance = [], [], [], [], []
    for row in replication.planned(design, results):
        info = run_row(design, row, results)
        runs.append(info)
        if info["status"] != "ok":
            continue
        folder = results / row.path
        ep = epoch_energy(folder, pd.read_csv(files.regular(folder / EPOCHS), sep="\t"))
        info.update(accuracy.time_to_accuracy(ep, row.config.get("target_accuracy")))
        ep.insert(0, "run_id", row.run_id)
        epochs.append(ep)
        for s in step_stats(folder, row.config["warmup_steps"]):
            stats.append({"run_id": row.run_id, **s})
        step_phases.append(phase_intervals(folder, row.run_id))
        balance += devices.rows(folder, row.run_id)
    runs_df = cells.with_setting(pd.DataFrame(runs))
    for column in accuracy.COLUMNS:  # failed runs have no epochs to time
        if column not in runs_df:
            runs_df[column] = np.nan
    epochs_df = (
        pd.concat(epochs, ignore_index=True)
        if epochs
        else pd.DataFrame(columns=["run_id", "epoch", "test_accuracy", "images_per_s"])
    )
    stats_df = pd.DataFrame(
        stats,
        columns=[
            "run_id",
            "rank",
            "steps",
            "step_mean_s",
            "step_median_s",
            "step_p95_s",
            *[f"{p}_mean_s" for p in PHASES],
            "comm_bytes_mean",
        ],
    )
    if not stats_df.empty:
        slowest = stats_df.groupby("run_id")["step_mean_s"].max().rename("step_mean_s_slowest_rank")
        runs_df = runs_df.merge(slowest, on="run_id", how="left")
        sent = stats_df.groupby("run_id")["comm_bytes_mean"].mean().rename("comm_bytes_per_step")
        runs_df = runs_df.merge(sent, on="run_id", how="left")
    else:
        runs_df["step_mean_s_slowest_rank"] = np.nan
        runs_df["comm_bytes_per_step"] = np.nan
    step_phases_df = (
        pd.concat(step_phases, ignore_index=True)
        if step_phases
        else pd.DataFrame(columns=PHASE_COLUMNS)
    )
    return {
        "runs": runs_df,
        "epochs": epochs_df,
        "step_stats": stats_df,
        "step_phases": step_phases_df,
        "balance": pd.DataFrame(balance, columns=devices.COLUMNS),
    }


def phase_tables(design: Design, results: Path) -> tuple[pa.Table, dict[str, str]]:
    """Every run's phase table stacked, and each run's trace errors."""
    parts, errors, versions = [], {}, {}
    for row in replication.planned(design, results):
        path = results / row.path / PHASE_TABLE
        if not path.exists():
            continue
        try:
            table = pq.read_table(files.regular(path))
            meta = {**(table.schema.metadata or {}), **convert.metadata_of(path)}
            problems = convert.errors_of(meta)
            # A table of schema version 2 (text columns as plain strings)
            # casts to version 3's dictionaries, the same values; one of
            # other columns (version 1, without op_id) fails: damaged.
            table = table.cast(SCHEMA)
        except (OSError, ValueError, pa.ArrowException) as exc:
            errors[row.run_id] = f"phases.parquet: damaged ({str(exc)[:120]})"
            continue
        if problems:
            errors[row.run_id] = "; ".join(map(str, problems))
        versions = {k: v for k, v in meta.items() if k.endswith(b"_version")}
        versions[META_VERSION] = str(SCHEMA_VERSION).encode()  # cast to it above
        parts.append(table)
    stacked = pa.concat_tables(parts) if parts else SCHEMA.empty_table()
    return stacked.replace_schema_metadata(versions), errors


def _replace(path: Path, write) -> None:
    """Write through a temporary that never outlives a failure (a full disk)."""
    with replacing(path) as tmp:
        write(tmp)


def write_tables(design: Design, results: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    found = tables(design, results)
    phases, trace_errors = phase_tables(design, results)
    found["runs"]["trace_errors"] = found["runs"]["run_id"].map(trace_errors)
    _replace(out / PHASE_TABLE, lambda tmp: pq.write_table(phases, tmp))
    for name, df in found.items():
        _replace(out / f"{name}.parquet", lambda tmp, df=df: df.to_parquet(tmp, index=False))
    write_text(out / "runs.csv", found["runs"].to_csv(index=False))
    # What the tables were built from: the workflow builds them again when
    # any run's files change (workflow_support.note_changed_results).
    folders = [results / row.path for row in replication.planned(design, results)]
    write_text(out / records.INPUTS, json.dumps({"fingerprint": records.fingerprint(folders)}))
