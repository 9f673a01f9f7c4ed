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

from frameworks import registry
from frameworks.common import RunError

KNOBS = (
    "fusion_threshold_kib",
    "horovod_cycle_time_ms",
    "horovod_hierarchical_allreduce",
    "ddp_gradient_as_bucket_view",
    "mwms_implementation",
    "lbann_io_threads",
)
# A knob at this value is the framework's own setting: nothing to apply.
UNSET = {
    "fusion_threshold_kib": None,
    "horovod_cycle_time_ms": None,
    "horovod_hierarchical_allreduce": False,
    "ddp_gradient_as_bucket_view": False,
    "mwms_implementation": None,
    "lbann_io_threads": None,
}
KIB = 1024


def asked(config: dict) -> dict:
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


def _condition(knob: str, value, config: dict) -> str | None:
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
    return None


def confirm(config: dict, found: dict, where: str) -> dict:
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


def horovod_env(config: dict) -> dict[str, str]:
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
    if set_ and not config.get("horovod_timeline"):
        env["HOROVOD_TIMELINE"] = "DYNAMIC"
    return env
