"""lbann-driver: one driver here; LBANN's lbann.run starts the ranks."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ddlcompare.run.launch import base_env, refuse_untraceable, worker_argv, launcher
from ddlcompare.run.schedulers import Host, Scheduler
from runfiles.run_config import RunConfig

# The variable that hands the scheduler's lbann.run arguments to the driver.
LBANN_RUN_ARGS = "DDLC_LBANN_RUN_ARGS"


@launcher("lbann-driver")
def lbann_driver(hosts: list[Host], config: RunConfig, run_dir: Path, scheduler: Scheduler):
    """One driver process here; LBANN's own launcher (lbann.run: srun, or
    mpiexec with the OAR node file) starts the ranks on the hosts, as the
    scheduler's ``lbann_run_args`` (handed over as JSON) say."""
    refuse_untraceable(config)
    env = {
        **base_env(config),
        LBANN_RUN_ARGS: json.dumps(scheduler.lbann_run_args(os.environ, hosts)),
    }
    return worker_argv(config, run_dir), env
