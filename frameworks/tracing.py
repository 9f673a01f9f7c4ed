"""The run's tracer, chosen by the ``tracer`` parameter (none | otf2 | scorep).

Framework-neutral: every family's loop makes its recorder with
:func:`recorder` (Score-P's user regions are live from the start, so that
``init`` is one of them) and calls :func:`attach` once it knows its rank
(after ``init``); the recorder hands the init interval to the new sinks.
With ``tracer: none`` nothing is attached and a phase costs the recorder's
bookkeeping alone.
"""

from __future__ import annotations

from pathlib import Path

from frameworks.recorder import LiveRegions, PhaseRecorder
from runfiles import names
from runfiles.run_config import RunConfig


class ScorepRegions(LiveRegions):
    """Phases as Score-P user regions (Score-P names them ``user:<phase>``).
    The worker runs under ``python -m scorep``, which provides the module."""

    def __init__(self):
        import scorep.user

        self.user = scorep.user

    def begin(self, name: str) -> None:
        # file and line given: the bindings would otherwise inspect the stack
        self.user.region_begin(name, __file__, 0)

    def end(self, name: str) -> None:
        self.user.region_end(name)


def recorder(config: RunConfig) -> PhaseRecorder:
    """The run's phase recorder, before ``init``."""
    phases = PhaseRecorder()
    if config.get("tracer") == "scorep":
        phases.live.append(ScorepRegions())
    return phases


def attach(
    recorder: PhaseRecorder, config: RunConfig, run_dir: Path, rank: int, world: int
) -> None:
    """Sinks that need the rank (our OTF2 tracer), and the rank's heartbeat
    file, once ``init`` is over."""
    recorder.heartbeat = run_dir / names.progress(rank)
    if config.get("tracer", "none") == "otf2":
        from frameworks.otf2_writer import Otf2Sink

        recorder.attach([Otf2Sink(run_dir, rank, world, config.get("run_id", ""))])
