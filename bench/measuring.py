"""What every bench does around its figures: hold the machine (the
host-wide measuring lock of ddlcompare/run/machine_lock.py, which training runs
take too) while it measures, and say the machine's load and CPU beside each
figure (a figure taken beside other work is not a clean one, and one CPU's
figure need not hold on another: runfiles/cpu.py)."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ddlcompare.run import machine_lock  # noqa: E402
from runfiles import cpu  # noqa: E402

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
    """The load averages now, whether the machine was quiet enough, and
    its CPU."""
    one, five, fifteen = os.getloadavg()
    state = "loaded" if one > BUSY else "quiet"
    if machine_lock.shared_mode():  # held shared: no measurement, whatever the load
        state = f"machine shared: {machine_lock.SHARED_ENV}=1"
    return f"load {one:.2f}/{five:.2f}/{fifteen:.2f} ({state}), cpu {cpu_token()}"


def load_fields() -> str:
    """The load and CPU as key=value pairs, for a bench's last line."""
    one, five, _ = os.getloadavg()
    shared = " machine_shared=1" if machine_lock.shared_mode() else ""
    cores = len(os.sched_getaffinity(0))
    return f"load1={one:.2f} load5={five:.2f} cores={cores} cpu={cpu_token()}{shared}"


def cpu_token() -> str:
    """This machine's CPU in one word: "AMD-EPYC/avx2/vm"."""
    return cpu.token(cpu.this_machine())


def figures_line(figures: dict) -> str:
    """A bench's last line: its figures as key=value (floats to 5
    significant digits), then the load's."""
    fields = (f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    return " ".join(fields) + " " + load_fields()


def cli(*args: str) -> list[str]:
    """The harness's command line as a user runs it (``./ddlc <args>`` runs
    ``python -m front.cli <args>`` in the environment)."""
    return [sys.executable, "-m", "front.cli", *args]


# a bench's child must find the checkout's packages, wherever it runs from
CHILD_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}


def whole_process(argv: list[str], env: dict | None = None) -> dict:
    """One run of a command, timed from outside as a user waits for it,
    start-up and imports included: wall seconds, and the operating system's
    account of the finished child's CPU (user, system), the load when it
    ended beside them. Run one at a time (the children's CPU is the
    difference of this process's account of all its finished children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env or CHILD_ENV, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "wall": wall,
        "user": user,
        "system": system,
        "cpu": user + system,
        "returncode": done.returncode,
        "stderr": done.stderr,
        "load": load(),
    }


def median_run(runs: list[dict]) -> dict:
    """The run of median CPU (the lower middle if even)."""
    return sorted(runs, key=lambda run: run["cpu"])[(len(runs) - 1) // 2]


def whole_line(what: str, run: dict, per: str = "") -> str:
    """One whole-process figure, with its load."""
    return (
        f"{what}, whole process: {run['wall']:.2f} s wall, {run['cpu']:.2f} s CPU "
        f"({run['user']:.2f} user + {run['system']:.2f} system){per}; {run['load']}"
    )


def bench_cache() -> Path:
    """The benches' cache folder (generated traces, built programs)."""
    from runfiles import variables

    base = variables.cache_root()
    (base / "bench").mkdir(parents=True, exist_ok=True)
    return base / "bench"
