"""one-process: one process that drives every local device itself."""

from __future__ import annotations

from pathlib import Path

from ddlcompare.run.launch import base_env, worker_argv, launcher
from ddlcompare.run.schedulers import Host, Scheduler
from runfiles.run_config import RunConfig


@launcher("one-process")
def one_process(hosts: list[Host], config: RunConfig, run_dir: Path, scheduler: Scheduler):
    """One process on the first host, driving its local devices itself
    (DataParallel, MirroredStrategy)."""
    return worker_argv(config, run_dir), base_env(config)
