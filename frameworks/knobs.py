"""The frameworks' own knobs: which framework takes which, what the plan
refuses, and the check that a run's knobs took effect.

Each adapter names the knobs it takes (``AdapterInfo.knobs``) and, at the
end of its run, reads each back from the framework itself (its API, its
trace or its log: docs/knobs.md says which). What it read goes into its
rank's record (run.json's ``ranks[].knobs``); a knob the design set that is
not in effect fails the run with a message naming it, so that none is ever
silently ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from frameworks import registry
from frameworks.common import RunError
from runfiles.run_config import RunConfig

KNOBS = (
    "fusion_threshold_kib",
    "horovod_cycle_time_ms",
    "horovod_hierarchical_allreduce",
    "ddp_gradient_as_bucket_view",
    "mwms_implementation",
    "lbann_io_threads",
    "inter_op_threads",
    "gaspi_sweep_pause_us",
)
# A knob at this value is the framework's own setting: nothing to apply.
UNSET = {
    "fusion_threshold_kib": None,
    "horovod_cycle_time_ms": None,
    "horovod_hierarchical_allreduce": False,
    "ddp_gradient_as_bucket_view": False,
    "mwms_implementation": None,
    "lbann_io_threads": None,
    "inter_op_threads": None,
    "gaspi_sweep_pause_us": None,
}
# The patched GaspiCxx reads its progress thread's pause from this variable
# in each rank's environment (envs/patches/tarantella/GaspiCxx/IdleWait.cpp).
GASPI_PAUSE_VARIABLE = "DDLC_GASPI_SWEEP_PAUSE_US"
KIB = 1024
# Where Horovod's adapter writes the short timeline it reads its knobs from
# (the run folder's file, named to the adapter by this variable).
KNOBS_TIMELINE = "DDLC_KNOBS_TIMELINE"
KNOBS_TIMELINE_FILE = "knobs.horovod_timeline.json"


def asked(config: Mapping[str, Any]) -> dict:
    """The knobs a run's config sets away from the framework's own default."""
    return {k: config[k] for k in KNOBS if config.get(k, UNSET[k]) != UNSET[k]}


def frameworks_taking(knob: str) -> list[str]:
    return sorted(n for n, info in registry.FRAMEWORKS.items() if knob in info.knobs)


def cell_problems(cells: list[dict], factors=()) -> list[str]:
    """Knobs set for a framework that does not take them, or where the
    framework would not apply them; one message per case, naming the field
    and the fix (an exclude rule where the knob or the framework is a factor)."""
    found: dict[tuple, str] = {}
    for config in cells:
        name = config["framework"]
        info = registry.FRAMEWORKS[name]
        for knob, value in asked(config).items():
            if knob not in info.knobs:
                takers = ", ".join(frameworks_taking(knob)) or "none here"
                if knob in factors:
                    fix = f"add the exclude rule {{framework: {name}, {knob}: {value}}}"
                else:
                    fix = "remove it from fixed, or make it a factor and exclude the others"
                found[knob, name] = (
                    f"{knob}: {value!r} is set for framework {name}, which has no such "
                    f"knob (frameworks that take it: {takers}); {fix}"
                )
            elif problem := _condition(knob, value, config):
                found[knob, name, problem] = f"{knob}: {value!r} for framework {name}: {problem}"
    return list(found.values())


def _condition(knob: str, value, config: Mapping[str, Any]) -> str | None:
    """Where a framework takes a knob but would not apply this value here."""
    if knob == "horovod_hierarchical_allreduce" and (
        config["device"] != "gpu" or config["horovod_controller"] != "mpi"
    ):
        return (
            "Horovod 0.28 has a hierarchical all-reduce only for NCCL with MPI; "
            "it needs device: gpu and horovod_controller: mpi (on CPUs it would be ignored)"
        )
    if knob == "mwms_implementation" and value == "nccl" and config["device"] != "gpu":
        return "NCCL reduces GPU tensors only; use ring or auto on device: cpu"
    if knob == "fusion_threshold_kib" and value == 0 and config["framework"] == "tf-mwms":
        return "TensorFlow reads a bytes_per_pack of 0 as 'choose for me'; give 1 or more"
    if knob == "inter_op_threads" and value == 1 and config.get("fit_step_phases"):
        # Measured: data_load took most of forward, forward 2-3 us a step.
        return (
            "one inter-op thread runs the step graph's timestamps late, so fit_step_phases "
            "would record wrong phases (data_load takes in forward); set fit_step_phases: "
            "false (whole steps, their time is right) or inter_op_threads: 2 or more"
        )
    return None


def confirm(config: RunConfig, found: dict, where: str) -> dict:
    """Compare the knobs a run asked for with those read back from the
    framework (``found``: knob -> value in effect); raise RunError naming
    each one not in effect. Returns ``found``, for the rank's record."""
    wrong = [
        f"{k}: asked {v!r}, {where} says {found.get(k, 'nothing')!r}"
        for k, v in asked(config).items()
        if found.get(k) != v
    ]
    if wrong:
        raise RunError(
            f"{config['framework']}: a knob did not take effect ({'; '.join(wrong)}); "
            "the run's figures would not be those of its settings"
        )
    return found


def packs(sizes: list[int], limit: int) -> list[int]:
    """Bytes of each pack when tensors of ``sizes`` are packed in order and
    a pack closes once it holds ``limit`` bytes or more (TensorFlow's
    group_by_size, DDP's buckets)."""
    found, pack = [], 0
    for size in sizes:
        pack += size
        if pack >= limit:
            found.append(pack)
            pack = 0
    return found + ([pack] if pack else [])


def horovod_env(config: RunConfig, run_dir) -> dict[str, str]:
    """Horovod reads its knobs from the environment at hvd.init(). With a
    knob set, the adapter records a short timeline of its own to read them
    back (HOROVOD_TIMELINE=DYNAMIC lets it start and stop one), unless the
    design asked for the whole run's timeline (horovod_timeline)."""
    set_ = asked(config)
    env = {}
    if "fusion_threshold_kib" in set_:
        env["HOROVOD_FUSION_THRESHOLD"] = str(set_["fusion_threshold_kib"] * KIB)
    if "horovod_cycle_time_ms" in set_:
        env["HOROVOD_CYCLE_TIME"] = f"{set_['horovod_cycle_time_ms']:g}"
    if set_.get("horovod_hierarchical_allreduce"):
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    if set_ and config.get("horovod_timeline"):
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    elif set_:
        env["HOROVOD_TIMELINE"] = "DYNAMIC"
        env[KNOBS_TIMELINE] = str(run_dir / KNOBS_TIMELINE_FILE)
    return env


# --- Horovod: its knobs read back from its own timeline ----------------------

TIMELINE_EVENT = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)?\}")


def timeline_events(text: str) -> list[dict]:
    """Horovod Timeline's events, in the order written; a file still open
    (no closing bracket, a last event cut) gives those complete so far."""
    events = []
    for match in TIMELINE_EVENT.finditer(text):
        try:
            events.append(json.loads(match.group()))
        except ValueError:
            continue
    return events


def fused_responses(events: list[dict]) -> list[list[str]]:
    """The tensors of each all-reduce response Horovod executed: it starts
    (writes the ALLREDUCE begin of) every tensor of one response in a row,
    before any of its activities, so a run of those begins is one response."""
    names = {
        e.get("pid"): e.get("args", {}).get("name")
        for e in events
        if e.get("name") == "process_name"
    }
    responses: list[list[str]] = []
    run: list[str] = []
    for event in events:
        if event.get("ph") == "B" and event.get("name") == "ALLREDUCE":
            run.append(names.get(event.get("pid"), "?"))
        elif event.get("ph") in ("B", "E", "X"):
            if run:
                responses.append(run)
            run = []
    return responses + ([run] if run else [])


DEFAULT_CYCLE_MS = 1.0  # Horovod 0.28's HOROVOD_CYCLE_TIME when unset


def cycle_ms(events: list[dict]) -> float | None:
    """The shortest time between Horovod's cycle starts
    (HOROVOD_TIMELINE_MARK_CYCLES): its background loop sleeps until one
    cycle time has passed since the last start, so no gap is shorter than
    the cycle time; idle cycles on a free CPU are spaced by it, busy ones
    and those of a loaded machine by more (a 5 ms cycle's gaps were all 8
    to 18 ms in a short run beside a test suite)."""
    starts = [e["ts"] for e in events if e.get("name") == "CYCLE_START"]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    return min(gaps) / 1000 if len(gaps) >= 10 else None


def horovod_threshold_bytes(kib: int, local_size: int) -> int:
    """The threshold Horovod 0.28 applies (Controller::TensorFusionThresholdBytes):
    rounded up to a multiple of local_size x 8 bytes x 64 on a homogeneous cluster."""
    div = local_size * 8 * 64
    return -(-kib * KIB // div) * div


def horovod_evidence(
    events: list[dict], sizes: dict[str, int], config: RunConfig, local_size: int
) -> dict:
    """What Horovod's timeline says of the knobs asked: the largest fused
    response and the cycle spacing, and each asked knob's value where the
    timeline agrees with it (else what the timeline shows instead)."""
    set_ = asked(config)
    found: dict = {}
    fused = [sum(sizes.get(n, 0) for n in r) for r in fused_responses(events) if len(r) > 1]
    found["horovod_fused_responses"] = len(fused)
    found["horovod_largest_fused_bytes"] = max(fused, default=0)
    if "fusion_threshold_kib" in set_:
        kib = set_["fusion_threshold_kib"]
        limit = horovod_threshold_bytes(kib, local_size) if kib else 0
        over = [b for b in fused if b > limit]
        found["fusion_threshold_kib"] = (
            kib if not over else f"a fused response of {max(over)} bytes (over {limit})"
        )
    if set_.get("horovod_hierarchical_allreduce"):
        # NCCLHierarchicalAllreduce's own activities (a flat one is NCCL_ALLREDUCE)
        steps = {e.get("name") for e in events} & {"NCCL_REDUCESCATTER", "NCCL_REDUCE"}
        found["horovod_hierarchical_allreduce"] = bool(steps)
    spacing = cycle_ms(events)
    found["horovod_cycle_min_ms"] = spacing
    if "horovod_cycle_time_ms" in set_:
        ms = set_["horovod_cycle_time_ms"]
        # No gap under the time asked. Above it is no contradiction where
        # the default lies below (a loaded machine stretches every cycle);
        # an ask under the default must show gaps near it.
        agrees = (
            spacing is not None
            and 0.9 * ms <= spacing
            and (ms >= DEFAULT_CYCLE_MS or spacing <= 1.5 * ms + 0.3)
        )
        found["horovod_cycle_time_ms"] = ms if agrees else f"cycles every {spacing} ms"
    return found


# --- a rule for the fusion threshold and bucket size --------------------------


def fusion_rule_kib(gradient_bytes: int, framework: str, nodes: int, procs_per_node: int) -> int:
    """A fusion threshold (bucket size) for a model of ``gradient_bytes``, as
    a power of two KiB: a quarter of its gradients, so that the first
    buckets travel while backward computes the rest; but one bucket for DDP
    when every rank shares one node, and a thirty-second for Tarantella
    across nodes.

    DDP on one node: the exchange is a copy through the loopback (the
    probe's link: ~15 GB/s, 0.1 ms for the CNN's 1.65 MiB), so splitting
    overlaps next to nothing, while each further bucket is one more Gloo
    all-reduce call: two grids (bench/fusion_grid.yaml, 3 and 5
    replications; docs/measurements.md) found one bucket DDP's fastest point
    there, and a third, run after, again.

    Tarantella across nodes: its bucket closes once it holds the threshold,
    so at a quarter the first layer's gradients (computed last) share a
    bucket with the second's, which then waits for the end of backward; at
    a thirty-second (64 KiB for the CNN) the second layer's travel while the
    first layer's backward runs. Two grids (the third, and
    bench/fusion_grid_2nodes.yaml) found that split the fastest on 2 nodes
    at 1 Gbit/s, the two before them a quarter; a grid run after this rule
    was set (bench/fusion_grid_tarantella.yaml) found it the fastest. The
    figures: docs/measurements.md.

    ``procs_per_node`` is not a term yet: the grids had one shape per node
    count."""
    del procs_per_node
    share = 4
    if framework == "torch-ddp" and nodes == 1:
        share = 1
    elif framework == "tarantella" and nodes > 1:
        share = 32
    return 1 << max(0, math.ceil(math.log2(gradient_bytes / share / KIB)))
