"""What the design alone says about its runs, said before any run starts.

Refused (one message each, with the fix): runs that would measure nothing
(``max_steps`` at or below ``warmup_steps``), ``device: gpu`` on the local
profile of a machine without a GPU, data files present but damaged (their
digests are checked here once, not in every run). Warned: runs with no step
in an epoch (they fail, with the reason), more processes than cores on the
local profile (they run, slowly and with noisy figures). Refused too: more
processes here than this machine's memory holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ddlcompare.run import schedulers
from runfiles.atomic import write_text
from runfiles import variables
from ddlcompare.plan.design import Design
from frameworks import data


def _configs(design: Design) -> list[dict]:
    return [{**design.fixed, **cell} for cell in design._cells()]


def _local() -> bool:
    return schedulers.detect(1, 1)[0].this_host


def problems(design: Design) -> list[str]:
    found = []
    configs = _configs(design)
    idle = [
        (c, n) for c in configs if 0 < (n := data.epoch_steps(c) * c["epochs"]) <= c["warmup_steps"]
    ]
    if idle:
        c, n = idle[0]
        found.append(
            f"warmup_steps: {c['warmup_steps']}, but runs with batch_size "
            f"{c['batch_size']} take only {n} steps in all (max_steps: "
            f"{c['max_steps']}, epochs: {c['epochs']}), so none would be measured; "
            "raise max_steps or lower warmup_steps"
        )
    if any(c["device"] == "gpu" for c in configs) and _local() and not has_gpu():
        found.append(
            "device: gpu, but this machine has no NVIDIA GPU (no /dev/nvidia*) and "
            "the local profile runs here; use device: cpu, or a cluster profile"
        )
    found += _damaged_data(design, configs)
    if _local() and (problem := measure_lock_problem()):
        found.append(problem)
    if _local() and (problem := memory_problem(configs)):
        found.append(problem)
    return found


# The least a training process holds: Python with its framework imported
# (torch alone: 218 MiB resident here, 2026-11-28).
PROCESS_MIB = 200


def memory_problem(configs: list[dict]) -> str | None:
    """Runs here (emulated nodes too) that would start more processes than
    this machine's memory holds, refused before any starts: the kernel
    would kill them one by one, or the machine with them."""
    total = _memory_mib()
    busiest = max(configs, key=lambda c: c["nodes"] * c["procs_per_node"])
    world = busiest["nodes"] * busiest["procs_per_node"]
    if total is None or world * PROCESS_MIB <= total:
        return None
    return (
        f"procs_per_node {busiest['procs_per_node']} x nodes {busiest['nodes']}: runs would start "
        f"{world} processes on this machine, more than its {total / 1024:.0f} GiB of memory "
        f"holds at about {PROCESS_MIB} MiB each (at most {total // PROCESS_MIB}); lower "
        "procs_per_node or nodes, or run them on a cluster profile"
    )


def _memory_mib() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def measure_lock_problem() -> str | None:
    """Every local run takes the host-wide measuring lock: a lock file that
    cannot be opened would fail each run, so it is named here, once."""
    from ddlcompare.run import machine_lock

    path = machine_lock.lock_path()
    try:
        os.close(machine_lock.open_shared(path))
    except OSError as exc:
        where = (
            f"{machine_lock.LOCK_ENV}={path}"
            if os.environ.get(machine_lock.LOCK_ENV)
            else f"the measuring lock {path}"
        )
        return (
            f"{where}: cannot be opened ({exc.strerror or exc}); point {machine_lock.LOCK_ENV} at a "
            f"file in a folder that exists and you may write (default {machine_lock.DEFAULT_LOCK})"
        )
    return None


def has_gpu() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


def _damaged_data(design: Design, configs: list[dict]) -> list[str]:
    found = []
    for name in sorted({c["dataset"] for c in configs}):
        data_dir = design.fixed.get("data_dir")
        if data.missing_files(name, data_dir):
            continue  # preflight names the missing files
        try:
            _verify_once(name, data_dir)
        except data.DataError as exc:
            found.append(f"dataset {exc}")
    return found


VERIFIED = variables.cache("verified-data.json")


def _verify_once(name: str, data_dir: str | None) -> None:
    """data.verify, skipped for files unchanged (size, time) since they last
    passed: reading them costs seconds at every plan."""
    folder = data.data_dir(data.DATASETS[name], data_dir)
    stamp = ";".join(
        f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
        for p in (folder / f for f in data.DATASETS[name].files)
    )
    try:
        seen = json.loads(VERIFIED.read_text())
    except (OSError, ValueError):
        seen = {}
    if not isinstance(seen, dict) or seen.get(name) != stamp:
        data.verify(name, data_dir)
        seen = {**(seen if isinstance(seen, dict) else {}), name: stamp}
        try:
            VERIFIED.parent.mkdir(parents=True, exist_ok=True)
            write_text(VERIFIED, json.dumps(seen))
        except OSError:
            pass  # a read-only home: check again next time


def warnings(design: Design, runs_here: bool | None = None) -> list[str]:
    """What a plan should know before it runs. ``runs_here``: whether the
    runs share this machine (None: as the scheduler found here says; a
    workflow whose jobs go to a cluster says False)."""
    found = []
    configs = _configs(design)
    for c in configs:
        if data.epoch_steps(c) == 0:
            world = c["nodes"] * c["procs_per_node"]
            found.append(
                f"batch_size {c['batch_size']} x {world} processes exceeds the "
                f"{data.epoch_images(c)} training images: runs with it have no step in an "
                "epoch and will fail"
            )
            break
    if (_local() if runs_here is None else runs_here) and (crowded := cores_warning(design)):
        found.append(crowded)
    return found


def cores_warning(design: Design) -> str | None:
    """Runs that start more processes x threads than this machine has cores."""
    cores = os.cpu_count() or 1
    busiest = max(c["nodes"] * c["procs_per_node"] * c["threads"] for c in _configs(design))
    if busiest <= cores:
        return None
    return (
        f"some runs start {busiest} processes x threads on this machine's "
        f"{cores} cores: they run, but slower, and their figures are noisy"
    )
