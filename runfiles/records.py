"""Reading the records a run leaves (its JSON files), and checking a whole
run folder before anything reads its figures.

A file can be damaged after the run wrote it (a full disk, a careless edit,
a copy cut short, a file deleted): such a run is "damaged", with the file and
what is wrong, never "ok" with NaN figures, and never a crash of the tables.
JSON files are checked against JSON Schemas; TSV files for their columns,
numbers and, for the per-rank files, one per rank (tables.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Callable

import jsonschema
import pandas as pd

from runfiles import files, names
from runfiles.names import (
    BALANCE,
    BALANCE_KEYS,
    CONFIG,
    DONE,
    ENERGY,
    EPOCH_COLUMNS,
    EPOCHS,
    INTERVAL_COLUMNS,
    METRICS,
    NETWORK,
    OWNER,
    PHASE_TABLE,
    RUN_RECORD,
    STEP_COLUMNS,
)
from runfiles.tables import Damaged, read_table, read_tsv
from runfiles.run_config import RunConfig
from runfiles.strict_json import LIMIT, strict_validator

# run.json's record of the machine's load while the run measured
# (ddlcompare/run/machine_load.py writes it): its key, and the share of the
# machine's CPU time taken by others from which a run is "loaded". A quarter:
# on 2 cores, half a core busy all along (one busy loop beside a run of 2
# ranks takes about a third of the machine).
MACHINE_LOAD = "machine_load"
LOADED_SHARE = 0.25

NUMBER = {"type": "number"}
NUMBER_OR_NULL = {"type": ["number", "null"]}
# Counts are read as ints (range, pandas' int64): 2.0 or 1e308 is no count,
# and one edited to billions would have its readers fill the memory.
COUNT = {"type": "integer", "minimum": 0, "maximum": LIMIT}
POSITIVE_COUNT = {**COUNT, "minimum": 1}
TEXT_OR_NULL = {"type": ["string", "null"]}

SCHEMAS = {
    DONE: {
        "type": "object",
        "required": ["status", "exit_status", "reason", "run_id"],
        "properties": {
            "status": {"enum": ["ok", "failed", "suspect"]},
            "exit_status": {"type": ["integer", "null"]},
            "reason": TEXT_OR_NULL,
            "run_id": {"type": "string"},
        },
    },
    RUN_RECORD: {
        "type": "object",
        "required": ["run_id", "status"],
        "properties": {
            "run_id": {"type": "string"},
            "status": {"type": "string"},
            "start": TEXT_OR_NULL,
            "end": TEXT_OR_NULL,
            "exit_status": {"type": ["integer", "null"]},
            "reason": TEXT_OR_NULL,
            "harness_commit": TEXT_OR_NULL,
            # held the machine shared with runs that only check correctness
            # (ddlcompare/run/machine_lock.py shared_mode): not clean
            "machine_shared": {"type": "boolean"},
            MACHINE_LOAD: {
                "type": "object",
                "required": ["foreign_cpu_share", "loaded", "busiest_foreign"],
                "properties": {
                    "foreign_cpu_share": {"type": ["number", "null"], "minimum": 0},
                    "loaded": {"type": "boolean"},
                    "busiest_foreign": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["pid", "command", "cores"],
                            "properties": {
                                "pid": COUNT,
                                "command": {"type": "string"},
                                "cores": NUMBER,
                            },
                        },
                    },
                    "spinning": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["pid", "tid", "cpu_share", "wait_share", "blocks_per_s"],
                            "properties": {
                                "pid": COUNT,
                                "tid": COUNT,
                                "cpu_share": NUMBER,
                                "wait_share": NUMBER,
                                "blocks_per_s": NUMBER,
                            },
                        },
                    },
                },
            },
            # what analysis/conditions.py reads of it, each of the type it reads
            "conditions": {
                "type": ["object", "null"],
                "properties": {
                    "cores_per_rank": {"type": ["array", "null"], "items": NUMBER_OR_NULL},
                    "compute_threads": {"type": ["array", "null"], "items": NUMBER_OR_NULL},
                    "ranks_per_node": {"type": ["array", "null"], "items": NUMBER},
                    "network": {
                        "type": ["object", "null"],
                        "properties": {
                            "emulated": {"type": "boolean"},
                            "rate_mbit": NUMBER_OR_NULL,
                            "delay_ms": NUMBER_OR_NULL,
                            "interfaces": {
                                "type": ["object", "null"],
                                "additionalProperties": NUMBER_OR_NULL,
                            },
                        },
                    },
                    "cpu": {
                        "type": ["object", "null"],
                        "properties": {
                            "per_host": {
                                "type": "object",
                                "additionalProperties": {"type": "object"},
                            }
                        },
                    },
                },
            },
            "ranks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["hostname"],
                    "properties": {"hostname": {"type": "string"}},
                },
            },
        },
    },
    METRICS: {
        "type": "object",
        "required": [
            "world_size",
            "global_batch",
            "steps_per_epoch",
            "epochs_done",
            "images_per_s",
            "time_per_epoch_s",
            "final_test_accuracy",
        ],
        "properties": {
            "world_size": POSITIVE_COUNT,
            "global_batch": POSITIVE_COUNT,
            "steps_per_epoch": POSITIVE_COUNT,
            "epochs_done": POSITIVE_COUNT,
            "images_per_s": {"type": ["number", "null"], "minimum": 0},
            "images_per_s_per_process": {"type": ["number", "null"]},
            "time_per_epoch_s": {"type": "number", "minimum": 0},
            "final_test_accuracy": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            "final_test_loss": {"type": ["number", "null"]},
            "init_s": {"type": ["number", "null"]},
            "learning_rate_scaled": NUMBER,
        },
    },
    ENERGY: {
        "type": "object",
        "required": ["status", "joules"],
        "properties": {
            "status": {"type": "string"},
            "joules": {"type": ["number", "null"]},
            "epochs": {
                "type": ["array", "null"],
                "items": {
                    "type": "object",
                    "required": ["epoch"],
                    "properties": {
                        "epoch": COUNT,
                        "energy_j": {"type": ["number", "null"]},
                        "energy_to_epoch_j": {"type": ["number", "null"]},
                    },
                },
            },
        },
    },
    NETWORK: {
        "type": "object",
        "required": ["tx_bytes"],
        "properties": {"tx_bytes": {"type": "number", "minimum": 0}},
    },
    BALANCE: {
        "type": "object",
        "required": ["ranks"],
        "properties": {
            "ranks": {"type": "array", "items": {"type": "object", "required": list(BALANCE_KEYS)}}
        },
    },
    "rank.json": {
        "type": "object",
        "required": ["rank", "hostname"],
        "properties": {"rank": COUNT, "hostname": {"type": "string"}},
    },
}


def read_json(path: Path, schema: str | None = None) -> dict:
    """A run's JSON file, checked; Damaged when it is not what it should be."""
    name = path.name
    try:
        text = files.read_text(path)
    except FileNotFoundError:
        raise Damaged(f"{name}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise Damaged(f"{name}: cannot be read ({exc})") from None
    if not text.strip():
        raise Damaged(f"{name}: empty")
    try:
        doc = files.loads(text)
    except ValueError as exc:
        raise Damaged(f"{name}: not valid JSON, cut short or edited? ({exc})") from None
    try:
        strict_validator(json.dumps(SCHEMAS[schema or name])).validate(doc)
    except jsonschema.ValidationError as exc:
        where = ".".join(map(str, exc.absolute_path)) or "the file"
        raise Damaged(f"{name}: {where}: {exc.message[:160]}") from None
    if bad := _first_not_finite(doc):
        raise Damaged(f"{name}: {bad} is not a finite number (NaN, infinite or past 64 bits)")
    return doc


def _first_not_finite(doc, where: str = "") -> str | None:
    """Where ``doc`` holds a number no table column holds: NaN, an infinity,
    or an integer past 64 bits (pyarrow refuses it)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return where or "a value"
    if isinstance(doc, int) and not -(2**63) <= doc < 2**63:
        return where or "a value"
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in items:
        if found := _first_not_finite(value, f"{where}.{key}" if where else str(key)):
            return found
    return None


def check_run(
    folder: Path,
    config: RunConfig,
    *,
    rank_steps: bool,
    differs: Callable[[dict, RunConfig], list[str]],
) -> list[str]:
    """The problems of a finished ok (or suspect) run's files; [] when sound:
    each file alone, then the files against each other and the design.
    ``rank_steps``: whether its framework writes a steps file per rank;
    ``differs(written, config)``: where config.json's settings are not this
    run's, [] where they are (the design says, ddlcompare/plan/design.py's
    check_run)."""
    problems = []

    def attempt(check):
        try:
            return check()
        except Damaged as exc:
            problems.append(str(exc))
            return None

    world = config["nodes"] * config["procs_per_node"]
    metrics = attempt(lambda: _check_metrics(folder, world))
    attempt(lambda: read_json(folder / RUN_RECORD))
    attempt(lambda: _check_config(folder, config, differs))
    epochs = attempt(lambda: read_tsv(folder / EPOCHS, EPOCH_COLUMNS))
    if metrics and epochs is not None:
        attempt(lambda: _check_epochs(epochs, metrics))
    if rank_steps:
        for rank in range(world):
            name = names.steps(rank)
            steps = attempt(lambda n=name: read_tsv(folder / n, STEP_COLUMNS))
            if metrics and steps is not None:
                attempt(lambda n=name, t=steps: _check_steps(n, t, metrics))
        for rank, path in names.rank_files(folder, names.STEPS_GLOB):
            if rank >= world:  # collect and the timeline would read it as a rank's
                problems.append(f"{path.name}: rank {rank} in a run of {world}; from elsewhere?")
    for _, path in names.rank_files(folder, names.INTERVALS_GLOB):
        attempt(lambda p=path: read_tsv(p, INTERVAL_COLUMNS, min_rows=0))
    for path in sorted(folder.glob(names.RANK_RECORD_GLOB)):
        attempt(lambda p=path: read_json(p, "rank.json"))
    for name in (ENERGY, NETWORK, BALANCE):
        if os.path.lexists(folder / name):  # a link to itself or nowhere: there, unreadable
            attempt(lambda n=name: read_json(folder / n))
    if os.path.lexists(folder / PHASE_TABLE):
        attempt(lambda: _check_phase_table(folder / PHASE_TABLE))
    return problems


def _check_metrics(folder: Path, world: int) -> dict:
    metrics = read_json(folder / METRICS)
    if metrics["world_size"] != world:
        raise Damaged(
            f"metrics.json: world_size {metrics['world_size']}, but the run has {world} processes"
        )
    return metrics


def _check_config(
    folder: Path, config: RunConfig, differs: Callable[[dict, RunConfig], list[str]]
) -> None:
    """config.json is the run's settings: another run's (a folder copied or
    moved by hand), an edited one, or one whose setting left at its default
    was another default then (a harness upgrade) is not this run's result."""
    if not os.path.lexists(folder / CONFIG):
        return  # runs of older harnesses: run.json holds the config
    try:
        written = files.read_json(folder / CONFIG)
    except (OSError, ValueError) as exc:
        raise Damaged(f"config.json: not valid JSON, cut short or edited? ({exc})") from None
    if not isinstance(written, dict):
        raise Damaged("config.json: not this run's settings (not a JSON object)")
    if found := differs(written, config):
        raise Damaged(
            f"config.json: not this run's settings ({'; '.join(found[:3])}): a harness with "
            "other defaults wrote it, or the folder was copied or edited"
        )


def _check_epochs(epochs: pd.DataFrame, metrics: dict) -> None:
    done = metrics["epochs_done"]
    if len(epochs) != done or list(epochs["epoch"]) != list(range(1, done + 1)):
        raise Damaged(
            f"epochs.tsv: epochs {_listed(epochs['epoch'])}, but metrics.json says "
            f"{done} epoch(s) done (cut short?)"
        )


def _check_steps(name: str, steps: pd.DataFrame, metrics: dict) -> None:
    """Every epoch done has steps_per_epoch rows in each rank's steps file."""
    found = steps.groupby("epoch").size()
    want, done = metrics["steps_per_epoch"], metrics["epochs_done"]
    # Epoch by epoch up to the first wrong one, never a table of `done` rows:
    # a count edited to billions would fill the memory. One epoch past those
    # found is missing when fewer were found than done.
    epoch = next(
        (e for e in range(1, min(done, len(found) + 1) + 1) if found.get(e, 0) != want), None
    )
    if epoch is None and len(found) != done:  # more epochs than done
        epoch = next(e for e in found.index if not 1 <= e <= done)
    if epoch is not None:
        raise Damaged(
            f"{name}: {found.get(epoch, 0)} step rows in epoch {epoch}, but metrics.json "
            f"says {want} steps per epoch for {done} epoch(s) (cut short?)"
        )


def _check_phase_table(path: Path) -> None:
    """The run's converted traces must read whole (the workflow converts
    them again when the file is deleted)."""
    try:
        read_table(path)
    except Damaged as exc:
        raise Damaged(f"{PHASE_TABLE}: {str(exc).split(': ', 1)[1]}") from None


def _listed(values) -> str:
    values = list(values)
    return ", ".join(map(str, values[:5])) + (", ..." if len(values) > 5 else "") or "none"


def done_status(folder: Path) -> tuple[str | None, str | None]:
    """(status, problem) of a run's done marker: (None, None) without one;
    ("damaged", what is wrong) when it is not a valid marker."""
    if not os.path.lexists(folder / DONE):  # exists() takes a link loop for no file
        return None, None
    try:
        return read_json(folder / DONE)["status"], None
    except Damaged as exc:
        return "damaged", str(exc)


# Files of a run folder that are not the run's results: the workflow's own
# (its log, the trace conversion's output, which Snakemake tracks itself) and
# the ownership lock.
INPUTS = "inputs.json"  # in the tables folder: the fingerprint they were built from
NOT_RESULTS = {names.RUNNER_LOG, PHASE_TABLE, names.PHASES_LOG, OWNER, names.OWNER_LOCK}


def fingerprint(folders: list[Path]) -> str:
    """Names, sizes and times of the result files in ``folders`` (top level):
    a change to any of them means the tables must be built again."""
    digest = hashlib.sha256()
    for folder in folders:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name in NOT_RESULTS or not entry.is_file(follow_symlinks=False):
                continue
            info = entry.stat(follow_symlinks=False)
            digest.update(f"{folder}/{entry.name}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()
