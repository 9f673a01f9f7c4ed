"""Which runs Score-P can trace, decided from the config alone: the plan
refuses the others (design.py, with the fix), and so does a run started by
hand (ddlcompare/run/launch.py). How a traceable run is traced is
ddlcompare/run/tracers.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Launcher (and Horovod controller) -> how its ranks go under Score-P; a
# string is the reason it cannot, with the fix.
REFUSED = {
    "tarantella": "Tarantella's ranks talk through GPI-2, which Score-P has no adapter for, and "
    "gaspi_run gives them no rank before they start; use tracer: otf2",
    "lbann-driver": "LBANN's ranks are its C++ executable, started by lbann.run: the Python "
    "driver that Score-P would wrap trains nothing. Tracing them needs an LBANN "
    "built with Score-P's compiler wrappers (envs/lbann.md); use tracer: none",
}


# Frameworks whose one process drives every local device (DataParallel,
# MirroredStrategy): the per-rank starter (ddlcompare/run/tracers.py) finds
# no rank to name its experiment after, and the trace it would leave is not
# one per replica.
ONE_PROCESS = (
    "it runs as one process driving every device, which has no rank for Score-P's "
    "per-rank starter; use tracer: otf2"
)


def refusal(config: Mapping[str, Any]) -> str | None:
    """Why this run cannot be traced by Score-P (with the fix), or None."""
    if config.get("tracer") != "scorep":
        return None
    from frameworks import registry

    info = registry.FRAMEWORKS[config["framework"]]
    reason = REFUSED.get(info.launcher) or (ONE_PROCESS if info.one_process else None)
    if reason:
        return f"framework {config['framework']} cannot run with tracer: scorep: {reason}"
    return None
