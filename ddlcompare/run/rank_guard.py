"""Run one training rank and say how it ended, for launchers that do not:

    python -m ddlcompare.run.rank_guard RUN_DIR

GPI-2's gaspi_run (Tarantella's launcher) neither reports a rank that a
signal ended nor stops its peers: they wait in their next collective until
the run's timeout, and the run's reason was Tarantella's "Execution failed
with status 1". The guard starts ``python -m frameworks.worker RUN_DIR`` as
its child, passes on the signals that stop a job, and when the child ends
badly writes ``failed_rank.<rank>.json`` into the run folder (shared by
every node of a job) and says it on stderr in the form the runner reads.
The runner then stops the whole job at once (ddlcompare/run/runner.py).

Standard library only: it runs in every framework's Python (3.9 for
Tarantella).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

from runfiles import atomic, ownership
from runfiles.names import failed_rank
from runfiles.ranks import launcher_rank

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def ending(returncode: int) -> dict:
    """How the child ended: its exit status, or the signal that ended it."""
    if returncode < 0:
        return {"signal": -returncode, "exit_status": 128 - returncode}
    return {"signal": None, "exit_status": returncode}


def say(rank: str, pid: int, how: dict) -> str:
    """The line the runner reads (runner.RANK_SIGNAL, like spawn's)."""
    if how["signal"]:
        return f"rank guard: rank {rank} (pid {pid}) killed by signal {how['signal']}"
    return f"rank guard: rank {rank} (pid {pid}) exited with status {how['exit_status']}"


def main(argv: list[str] | None = None) -> int:
    run_dir = Path((argv if argv is not None else sys.argv[1:])[0])
    owner = ownership.read_owner(run_dir)
    child = subprocess.Popen([sys.executable, "-m", "frameworks.worker", str(run_dir)])
    stopped = []  # a signal asked this job to stop: its ranks' ends are no failure of theirs

    def forward(signum, _frame):
        stopped.append(signum)
        child.send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    how = ending(child.wait())
    if stopped or how["exit_status"] in (0, ownership.LOST_OWNERSHIP):
        return how["exit_status"]
    if owner and not ownership.owns(run_dir, owner["token"]):
        return how["exit_status"]  # another attempt's folder now: write nothing
    rank = launcher_rank()
    record = {"rank": rank, "pid": child.pid, "host": socket.gethostname(), **how}
    atomic.write_json(run_dir / failed_rank(rank), record)
    print(say(rank, child.pid, how), file=sys.stderr, flush=True)
    return how["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
