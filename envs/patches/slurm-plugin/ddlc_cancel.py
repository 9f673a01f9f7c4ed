"""ddl-compare's patch of snakemake-executor-plugin-slurm (envs/patches/
slurm-plugin/cancel.json puts this file in the installed plugin and calls it
from ``Executor.cancel_jobs``).

Snakemake hands ``cancel_jobs`` its list of active jobs, and that list is
empty while a status check runs (the check takes the jobs out and puts the
ones still running back when it ends): a Ctrl-C in that moment cancelled
nothing, and the jobs ran on to their time limit. Every job the plugin
submits carries the workflow's run id as its Slurm job name, so one
``scancel --name`` cancels them all, whichever list holds them."""

from __future__ import annotations

import os
import pwd
import subprocess


def cancel_workflow_jobs(run_uuid: str, clusters: set[str], logger) -> bool:
    """Cancel every job of this user named ``run_uuid``; False (and a
    warning) when scancel failed, so that the plugin's own cancel by job id
    still runs."""
    argv = ["scancel", f"--name={run_uuid}", f"--user={pwd.getpwuid(os.getuid()).pw_name}"]
    if clusters:  # as the plugin's own scancel: jobs sent to other clusters too
        argv.append("--clusters=all")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning(f"Cancelling the workflow's jobs by name ({' '.join(argv)}): {exc}")
        return False
    if out.returncode != 0:
        logger.warning(
            f"Cancelling the workflow's jobs by name ({' '.join(argv)}) failed: "
            f"{out.stderr.strip()}; cancelling those Snakemake lists"
        )
        return False
    return True
