"""The files of a run folder, named once, and the columns of its tables.

Every layer that writes or reads a run's files uses these names: the
training side (frameworks/), the runner, the readers of what a run left
(records.py, tables.py), the analysis.
"""

from __future__ import annotations

from pathlib import Path

from runfiles.phases import LATER_PHASES, PHASES

CONFIG = "config.json"  # the resolved configuration of the run
RUN_RECORD = "run.json"  # provenance, hosts, command, status and reason
DONE = "done.json"  # the done marker, written whether the run succeeded or failed
OWNER = "owner.json"  # the live attempt that owns the folder
METRICS = "metrics.json"  # the run's figures
EPOCHS = "epochs.tsv"  # one row per epoch
ENERGY = "energy.json"  # the run's energy, or why it was not measured
NETWORK = "network.json"  # the emulated network's rate and byte counters
BALANCE = "balance.json"  # calibrated shares, speeds and idle times
PHASE_TABLE = "phases.parquet"  # the run's converted traces
TRAIN_LOG = "train.log"  # the processes' output
RUNNER_LOG = "runner.log"  # the runner's own output
PHASES_LOG = "phases.log"  # the trace conversion's output
STACKS = "stacks.txt"  # where each rank waited when the run reached its timeout
HOROVOD_TIMELINE = "horovod_timeline.json"  # Horovod's own timeline (horovod_timeline: true)
OTF2_DIR = "trace"  # our tracer's OTF2 archive
OTF2_PARTS_DIR = "trace.parts"  # each rank's part of it, until the archive is written
SCOREP_DIR = "scorep"  # Score-P's experiment
TORCH_PROFILER_DIR = "torch_profiler"  # the PyTorch profiler's traces
LBANN_DIR = "lbann"  # LBANN's own work folder: its prototext, output and timeline
LBANN_BATCH_TIMES = "lbann_batch_times.tsv"  # LBANN's mini-batch times, from its output
# One file per rank, or per energy source: their names and their patterns.
STEPS_GLOB = "steps.rank*.tsv"
INTERVALS_GLOB = "intervals.rank*.tsv"
RANK_RECORD_GLOB = "rank*.json"
ENERGY_SAMPLES_GLOB = "energy_samples.*.tsv"
ENERGY_SOURCES_GLOB = "energy_sources.*.json"
FAILED_RANK_GLOB = "failed_rank.*.json"
PROGRESS_GLOB = "progress.rank*"
# What a run folder holds that the harness writes, names and patterns: an
# output given by hand (``ddlc import -o``, ``timeline -o``) never replaces one.
OWNER_LOCK = ".owner.lock"  # held by the attempt that runs in the folder
ATTEMPTS_DIR = "attempts"  # earlier attempts' files, moved there before a rerun
# A heartbeat's last word while its rank evaluates (no step ends then).
PROGRESS_EVALUATING = "eval"


def steps(rank: int) -> str:
    """Every step's phase times on one rank."""
    return f"steps.rank{rank}.tsv"


def progress(rank: int) -> str:
    """One rank's heartbeat: rewritten (epoch and step) at most once a
    second as its steps end, so that a hang inside an epoch is seen
    (ddlcompare/run/stall.py), and (then PROGRESS_EVALUATING) as it begins
    to evaluate."""
    return f"progress.rank{rank}"


def rank_files(folder: Path, glob: str) -> list[tuple[int, Path]]:
    """(rank, path) of a run's per-rank files of one kind (``STEPS_GLOB``,
    ``INTERVALS_GLOB``), by rank: only names of the exact form, so that a
    copy beside them (steps.rank0.old.tsv) is no rank's file, read twice."""
    prefix, suffix = glob.split("*")
    found = []
    for path in folder.glob(glob):
        middle = path.name[len(prefix) : -len(suffix)]
        if middle.isascii() and middle.isdigit():
            found.append((int(middle), path))
    return sorted(found)


def intervals(rank: int) -> str:
    """Phases outside steps (init, eval) on one rank."""
    return f"intervals.rank{rank}.tsv"


def rank_record(rank: int) -> str:
    """One rank's record: its host, versions and what it saw."""
    return f"rank{rank}.json"


def failed_rank(rank: str) -> str:
    """How a rank ended that did not end well, written by its guard
    (ddlcompare/run/rank_guard.py) for launchers that leave its peers waiting."""
    return f"failed_rank.{rank}.json"


def energy_samples(source: str) -> str:
    """One energy source's samples (a rank's meters, or the cluster's)."""
    return f"energy_samples.{source}.tsv"


def energy_sources(source: str) -> str:
    """One energy source's state, or why it was not read."""
    return f"energy_sources.{source}.json"


# epochs.tsv: one row per epoch (frameworks/common.py writes it).
EPOCH_COLUMNS = (
    "epoch",
    "wall_s",
    "train_loss",
    "train_accuracy",
    "test_loss",
    "test_accuracy",
    "images_per_s",
    "measured_images",
    "measured_s",
    "elapsed_s",
)
# steps.rank<N>.tsv: one row per step, a column per phase timed (those a
# steps file must have).
STEP_COLUMNS = (
    "epoch",
    "step",
    "start_ns",
    "end_ns",
    *(f"{p}_ns" for p in PHASES if p not in LATER_PHASES),  # older runs lack those
)
# intervals.rank<N>.tsv: evaluation and other intervals outside the steps.
INTERVAL_COLUMNS = ("epoch", "start_ns", "end_ns")
# What balance.json says of each rank (its "ranks" list).
BALANCE_KEYS = (
    "rank",
    "device",
    "images_per_step",
    "share",
    "calibrated_images_per_s",
    "idle_s",
    "measured_s",
)

# The Parquet tables of a design's tables folder (analysis/collect.py
# builds them; a run's phases.parquet and an imported one are
# traces/convert.py's), each with the columns every reader of it needs: a
# file of that name without one is another table (copied or swapped by
# hand), refused in one line by runfiles/tables.py, never read as an empty
# or wrong one.
RUNS_COLUMNS = ("run_id", "status", "framework", "nodes", "procs_per_node", "world_size")
PHASE_TABLE_COLUMNS = ("run_id", "rank", "step", "epoch", "phase", "start_ns", "end_ns", "dur_ns")
TABLE_COLUMNS = {
    "runs.parquet": RUNS_COLUMNS,
    "epochs.parquet": ("run_id", "epoch", "test_accuracy"),
    "step_stats.parquet": ("run_id", "rank", "step_mean_s"),
    "step_phases.parquet": ("run_id", "rank", "epoch", "step", "phase", "dur_ns"),
    "balance.parquet": ("run_id", *BALANCE_KEYS),
    PHASE_TABLE: PHASE_TABLE_COLUMNS,
    "imported.parquet": PHASE_TABLE_COLUMNS,
}
# The kind of a column the analysis computes on, whichever table holds it: a
# table written over by hand with text where numbers were (or the other way)
# is refused in one line, never a mean of words. Text: these names; numbers:
# every other column a table must have, and any column named by its unit.
TEXT_COLUMNS = ("run_id", "status", "framework", "phase", "device")
NUMBER_SUFFIXES = ("_s", "_ns", "_j", "_bytes", "_accuracy", "_loss", "_share")


def column_kind(table: str, column: str) -> str | None:
    """ "text", "numbers" or None (any) for ``column`` of the table ``table``."""
    if column in TEXT_COLUMNS:
        return "text"
    if column in TABLE_COLUMNS.get(table, ()) or column.endswith(NUMBER_SUFFIXES):
        return "numbers"
    return None


RUN_FILES = (
    CONFIG, RUN_RECORD, DONE, OWNER, OWNER_LOCK, METRICS, EPOCHS, ENERGY, NETWORK, BALANCE,
    PHASE_TABLE, TRAIN_LOG, RUNNER_LOG, PHASES_LOG, STACKS, HOROVOD_TIMELINE, OTF2_DIR,
    OTF2_PARTS_DIR, SCOREP_DIR, TORCH_PROFILER_DIR, LBANN_DIR, LBANN_BATCH_TIMES, ATTEMPTS_DIR,
    STEPS_GLOB, INTERVALS_GLOB, RANK_RECORD_GLOB, ENERGY_SAMPLES_GLOB, ENERGY_SOURCES_GLOB,
    FAILED_RANK_GLOB, PROGRESS_GLOB,
)  # fmt: skip
# A run folder is known by any of these (written as its attempt starts and ends).
RUN_MARKS = (CONFIG, RUN_RECORD, DONE)
