"""Which devices a design's cells may use: checks of the design alone
(``cell_problems``, part of validation) and of this machine
(``machine_problems``, part of ``ddlc plan``'s preflight; ``--no-check``
skips them, to plan here for a GPU machine elsewhere)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddlcompare.plan.params import PARAMS
from frameworks import registry

NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")


def cell_problems(cells: list[dict]) -> list[str]:
    """Framework x device x batch split x nodes combinations that cannot run
    anywhere, one message each."""
    found: dict[tuple, str] = {}
    for config in cells:
        info = registry.FRAMEWORKS[config["framework"]]
        name, device = info.name, config["device"]
        if problem := device_problem(name, info, device):
            found[name, "device", device] = problem
        split = "calibrated" if device == "hybrid" else config["batch_split"]
        if split not in info.batch_splits:
            found[name, "split", split] = (
                f"framework {name} cannot cut the batch '{split}' (device: {device}, "
                f"batch_split: {config['batch_split']}; it runs: {', '.join(info.batch_splits)})"
                f"; calibrated shares run with {', '.join(_frameworks_with(split))}"
            )
        if info.one_process and config["nodes"] > 1:
            found[name, "nodes"] = (
                f"framework {name} drives the devices of one process on one "
                f"node: nodes must be 1, got {config['nodes']}"
            )
        if device == "hybrid" and config["procs_per_node"] <= config["hybrid_gpus"]:
            found["hybrid", config["procs_per_node"], config["hybrid_gpus"]] = (
                f"device: hybrid needs processes on CPU cores besides the {config['hybrid_gpus']} "
                f"on GPUs (hybrid_gpus): procs_per_node must exceed it, got "
                f"{config['procs_per_node']}"
            )
    return list(found.values()) + _settings_applying_nowhere(cells)


def _settings_applying_nowhere(cells: list[dict]) -> list[str]:
    """A setting set (to other than its default) where it acts on no run of
    the design would change nothing but the runs' folder names. (Set for a
    mixed design, e.g. horovod_timeline for Horovod and DDP runs, it acts on
    some: the follow-up designs do so; ``where_acting`` then files it with
    those runs alone.)"""
    found = []
    for setting, (applies, where) in {**ONLY_WHERE, **ACTING_ONLY_WHERE}.items():
        asked = [c for c in cells if c[setting] != PARAMS[setting].default]
        if asked and not any(applies(c, registry.FRAMEWORKS[c["framework"]]) for c in asked):
            found.append(
                f"{setting}: {asked[0][setting]!r} applies to {where}, and no run of the "
                f"design is one (framework {asked[0]['framework']}, device "
                f"{asked[0]['device']}); remove it"
            )
    return found


# Settings that act only where a condition holds: set elsewhere (to other
# than their default) they would change nothing but the run's folder name.
ONLY_WHERE = {
    "horovod_timeline": (
        lambda config, info: info.launcher == "horovodrun",
        "Horovod's frameworks only (horovod-torch, horovod-keras)",
    ),
    "hybrid_gpus": (lambda config, info: config["device"] == "hybrid", "device: hybrid only"),
    "fit_step_phases": (
        lambda config, info: info.owns_step,
        "frameworks whose own fit runs the step only (tarantella, tarantella-patched)",
    ),
}


# Settings that act only where a condition holds too, refused alike where
# they act on no run of the design; set for a mixed design they stay in every
# run's configuration (not filed as ONLY_WHERE's are: their runs keep their
# folders).
ACTING_ONLY_WHERE = {
    "torch_profiler": (
        lambda config, info: info.family == "torch",
        "the PyTorch frameworks only (torch-ddp, torch-dp, horovod-torch)",
    ),
    "net_rate_mbit": (
        lambda config, info: config["nodes"] > 1,
        "the network between nodes (nodes above 1)",
    ),
}


def where_acting(config: dict, factors=()) -> dict:
    """The ONLY_WHERE settings of one run's ``config`` set away from their
    default and acting on that run (they name a level of its folder); those
    that do not act on it are put back to their default in ``config``, so
    that adding one to a mixed design leaves its other runs' folders,
    identity and configuration as they were (nothing to rerun). ``factors``
    (varied on purpose, named in every path) are left as they are."""
    info = registry.FRAMEWORKS.get(str(config.get("framework")))
    acting = {}
    for setting, (applies, _) in ONLY_WHERE.items():
        default = PARAMS[setting].default
        if info is None or setting in factors or config.get(setting, default) == default:
            continue
        if applies(config, info):
            acting[setting] = config[setting]
        else:
            config[setting] = PARAMS[setting].default
    return acting


def device_problem(name: str, info: registry.AdapterInfo, device: str) -> str | None:
    """Why the plan refuses framework ``name`` on ``device``; None where it
    runs there (the report's list of frameworks left out asks the same)."""
    if device in info.devices:
        return None
    return (
        f"framework {name} cannot run device {device} (it runs: "
        f"{', '.join(info.devices)}); exclude that combination or change device"
    )


def _frameworks_with(split: str) -> list[str]:
    return sorted(n for n, info in registry.FRAMEWORKS.items() if split in info.batch_splits)


def machine_problems(cells: list[dict]) -> list[str]:
    """Cells that need more GPUs than this machine has."""
    found: dict[tuple, str] = {}
    gpus = gpu_count()
    for config in cells:
        info = registry.FRAMEWORKS[config["framework"]]
        needed = gpus_needed(config, info)
        if needed > gpus:
            why = (
                "DataParallel spreads one process over GPUs"
                if info.name == "torch-dp"
                else f"device: {config['device']} puts processes on GPUs"
            )
            found[info.name, config["device"], needed] = (
                f"framework {info.name} with device: {config['device']} needs {needed} GPU(s) "
                f"and this machine has {gpus} ({why}); plan it on a GPU node, or "
                "'ddlc plan --no-check' to plan here for one"
            )
    return list(found.values())


def gpus_needed(config: Mapping[str, Any], info: registry.AdapterInfo) -> int:
    """GPUs one node of a cell computes on (0: none needed)."""
    if config["device"] == "hybrid":
        return config["hybrid_gpus"]
    if config["device"] == "gpu" and info.devices == ("gpu",):
        return config["procs_per_node"]  # a GPU-only framework: one GPU per replica
    return 0


def gpu_count() -> int:
    """NVIDIA GPUs of this machine, from the driver (no framework import)."""
    if NVIDIA_PROC.is_dir():
        return len(list(NVIDIA_PROC.iterdir()))
    if shutil.which("nvidia-smi"):
        try:
            listed = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return 0
        return sum(line.startswith("GPU ") for line in listed.splitlines())
    return 0
