"""Room for a run's files, checked before it starts; what to do when the
disk fills anyway.

The estimate comes from the design: a fixed part per run (logs, records,
tables, the converted phase table) and a part per optimizer step and rank
(step rows, and trace events for the tracers and profilers asked for),
doubled for safety. Measured on the tiny test runs: about 50 kB for 24 steps
x 2 ranks with the OTF2 tracer; profilers write far more per step.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

from frameworks import data
from runfiles.run_config import RunConfig

PER_RUN = 2 << 20
PER_STEP_RANK = {
    "base": 512,
    "otf2": 2048,
    "scorep": 4096,
    "torch_profiler": 200 << 10,
    "horovod_timeline": 16 << 10,
}
SAFETY = 2
# Snakemake's job scheduler writes its problem to the temporary folder
# (TMPDIR) before any job runs, and dies with a traceback when it cannot.
TEMP_BASE = 4 << 20
TEMP_PER_JOB = 4 << 10


class NoSpace(Exception):
    """Not enough room for a run's files; the message says where and how much."""


def estimate_bytes(config: RunConfig) -> int:
    world = config["nodes"] * config["procs_per_node"]
    steps = data.epoch_steps(config)
    per_step = PER_STEP_RANK["base"] + PER_STEP_RANK.get(config["tracer"], 0)
    per_step += PER_STEP_RANK["torch_profiler"] if config.get("torch_profiler") else 0
    per_step += PER_STEP_RANK["horovod_timeline"] if config.get("horovod_timeline") else 0
    return SAFETY * (PER_RUN + steps * config["epochs"] * world * per_step)


def free_bytes(folder: Path) -> int:
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check(folder: Path, needed: int) -> None:
    free = free_bytes(folder)
    if free < needed:
        raise NoSpace(
            f"No space left on {mount_point(folder)} for {folder} (needs about "
            f"{_mb(needed)} MB, {_mb(free)} MB free); free some space or pass "
            "--config results=ELSEWHERE"
        )


def check_temp(jobs: int) -> None:
    """Room in the temporary folder for the workflow's scheduler."""
    folder = Path(tempfile.gettempdir())
    needed = TEMP_BASE + jobs * TEMP_PER_JOB
    free = free_bytes(folder)
    if free < needed:
        raise NoSpace(
            f"No space left on {mount_point(folder)} for temporary files in {folder} "
            f"(the workflow's scheduler writes there; needs about {_mb(needed)} MB, "
            f"{_mb(free)} MB free); free some space or point TMPDIR at a folder with room"
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}" if n < 10e6 else f"{n / 1e6:.0f}"


def mount_point(folder: Path) -> str:
    path = Path(folder).resolve()
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return str(path)


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def record_anyway(path: Path, doc: dict) -> bool:
    """Write ``doc`` to ``path`` on a full disk: the normal way first, then
    over the file's own blocks (an earlier version of it, e.g. run.json
    written when the run started), in the shortest form. True if it worked."""
    text = json.dumps(doc, separators=(",", ":"), default=str)
    try:
        from runfiles.atomic import write_text

        write_text(path, text + "\n")
        return True
    except OSError:
        pass
    try:
        with open(path, "r+") as f:
            if len(text) > os.fstat(f.fileno()).st_size:
                return False
            f.write(text)
            f.truncate()
        return True
    except OSError:
        return False
