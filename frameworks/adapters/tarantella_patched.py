"""Tarantella with our patch to GaspiCxx (envs/patches/tarantella): its
progress thread sleeps while no collective runs instead of sweeping them
without pause (docs/improvements.md). Everything else is the tarantella
adapter's; its environment is the patched build's own prefix, so both can
run in one design."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from frameworks import common, knobs
from frameworks.adapters import tarantella
from frameworks.registry import register
from runfiles.run_config import RunConfig

ADAPTER = register(
    replace(
        tarantella.ADAPTER,
        name="tarantella-patched",
        env="tarantella-patched",
        knobs=(*tarantella.ADAPTER.knobs, "gaspi_sweep_pause_us"),
        baseline=tarantella.ADAPTER.name,
        notes=tarantella.ADAPTER.notes
        + " Built by 'bash envs/build-tarantella.sh patched': GaspiCxx's progress "
        "thread sleeps while no collective runs (docs/improvements.md).",
    )
)


class Adapter(tarantella.Adapter):
    knobs_read_from = f"{tarantella.Adapter.knobs_read_from}, and the rank's environment"

    def init(self, config: RunConfig):
        # The build records its patch next to the environment: a run of this
        # level on an unpatched Tarantella would compare it with itself.
        if not (Path(sys.prefix) / "patch.txt").exists():
            raise common.RunError(
                f"tarantella-patched: {sys.prefix} is not the patched build (no patch.txt); "
                "build it with 'bash envs/build-tarantella.sh patched'"
            )
        return super().init(config)

    def knobs_found(self) -> dict:
        """Tarantella's, and the progress thread's pause as this rank's
        GaspiCxx reads it: the variable in its environment (GaspiCxx has no
        call that returns it)."""
        found = super().knobs_found()
        pause = os.environ.get(knobs.GASPI_PAUSE_VARIABLE)
        found["gaspi_sweep_pause_us"] = int(pause) if pause and pause.isdigit() else pause
        return found
