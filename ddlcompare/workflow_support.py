"""The little the Snakefile needs, kept here where it can be tested."""
from __future__ import annotations

import sys
from pathlib import Path

from ddlcompare import runner
from ddlcompare.cli import UserError, load_design
from ddlcompare.params import RunRow

# Run paths are built from validated values only (see params.SAFE_TEXT).
PATH_PATTERN = r"[A-Za-z0-9._+~/-]+"


def prepare(design_file: str, results: Path, main: bool, dryrun: bool):
    """Load the design or stop with its problems listed (no traceback), and
    put failed runs back in the queue: their attempt moves to attempts/<n>/
    and their done marker goes with it, so Snakemake runs them again."""
    try:
        design = load_design(design_file, check_ready=main)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    runs = design.runs()
    if main:
        failed = runner.failed_runs(runs, results)
        if failed and dryrun:
            print(f"{len(failed)} failed run(s) will run again (their files move to attempts/)",
                  file=sys.stderr)
        elif failed:
            for row in failed:
                runner.archive_attempt(results / row.path)
            print(f"{len(failed)} failed run(s) queued again; earlier attempts kept "
                  "under attempts/", file=sys.stderr)
    return design, runs


def runtime_minutes(row: RunRow) -> int:
    """The scheduler's walltime for a run: its hang timeout plus a margin."""
    return runner.derived_timeout(row.config) // 60 + 5


def as_list(value) -> list[str]:
    """A config value given as a YAML list or a comma-separated string."""
    if isinstance(value, str):
        return [v for v in value.split(",") if v]
    return [str(v) for v in value]
# Memory a training process asks for (the model is small; the data set and
# the framework's runtime dominate). Override per cluster with
# ``set-resources: {run: {mem_mb: ...}}`` in a profile.
MB_PER_PROCESS = 3000


def job_resources(row: RunRow) -> dict:
    """What a run's job asks a cluster for, under Snakemake's resource names
    (the Slurm executor reads them as they are; the Grid'5000 submit command
    gets them as arguments). Values of None are left out by Snakemake.

    Inside a Slurm allocation Snakemake runs each job's command in a one-task
    ``srun`` step unless the job has an ``mpi`` resource. A run of several
    processes per node takes the ``mpi`` route so that its launcher owns the
    whole allocation; ``tasks_per_node`` must then be above 1. A run of one
    process per node asks for ``tasks`` instead, and its launcher's own
    ``srun`` (multi-node) shares the step's CPUs (``--overlap``).
    """
    c = row.config
    nodes, per_node = c["nodes"], c["procs_per_node"]
    gpu = c["device"] == "gpu"
    gpus = per_node if gpu else c["hybrid_gpus"] if c["device"] == "hybrid" else 0
    return {
        "nodes": nodes,
        "tasks_per_node": per_node,
        "tasks": nodes if per_node == 1 else None,
        "mpi": "launcher" if per_node > 1 else None,
        "cpus_per_task": c["torch_threads"],
        "mem_mb": per_node * MB_PER_PROCESS,  # per node
        "runtime": runtime_minutes(row),
        "gpus_per_node": gpus,
        "gres": f"gpu:{gpus}" if gpus else None,
        "tasks_per_gpu": 1 if gpu else None,
    }
