"""What every bench does around its figures: hold the machine (the
host-wide measuring lock of ddlcompare/run/machine_lock.py, which training runs
take too) while it measures, and say the machine's load beside each figure
(a figure taken beside other work is not a clean one)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddlcompare.run import machine_lock  # noqa: E402

# One-minute load above which a figure is marked loaded: the bench itself
# is one runnable process, so a quiet machine shows about 1.
BUSY = 1.5


@contextlib.contextmanager
def holding_the_machine(what: str):
    """The measuring lock for the block (waits while a run or another bench
    holds it, saying so once)."""
    with machine_lock.measuring(
        f"bench: {what}", lambda line: print(line, flush=True), lambda: None
    ):
        yield


def load() -> str:
    """The load averages now, and whether the machine was quiet enough."""
    one, five, fifteen = os.getloadavg()
    state = "loaded" if one > BUSY else "quiet"
    return f"load {one:.2f}/{five:.2f}/{fifteen:.2f} ({state})"


def load_fields() -> str:
    """The load as key=value pairs, for a bench's last line."""
    one, five, _ = os.getloadavg()
    return f"load1={one:.2f} load5={five:.2f} cores={len(os.sched_getaffinity(0))}"
