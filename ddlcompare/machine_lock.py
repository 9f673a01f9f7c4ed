"""This machine, one measurement at a time, across every invocation.

Snakemake's ``benchmark_slot`` keeps the runs of one invocation apart; two
invocations (two ``./ddlc run`` with different ``results=``) would still
measure at once on the same cores. On the local profile a run therefore
holds a host-wide lock (a file in /tmp, released by the kernel when its
holder dies) while it trains. Runs that still meet other training processes
of the harness (started by hand, by an older harness, by a test) notice them
(``overlapping``) and are recorded as suspect, never as clean.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Callable
from collections.abc import Iterator

import psutil

LOCK_ENV = "DDLC_MEASURE_LOCK"
DEFAULT_LOCK = "/tmp/ddl-compare.measure.lock"
WORKER_MODULE = "frameworks.worker"


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or DEFAULT_LOCK)


@contextlib.contextmanager
def measuring(
    what: str, on_wait: Callable[[str], None], check: Callable[[], None]
) -> Iterator[float]:
    """Hold the machine while the block runs; yield the seconds waited.
    ``on_wait`` hears once who holds it; ``check`` runs each second of the
    wait (it raises to give up, e.g. when the workflow is gone)."""
    path = lock_path()
    started = time.monotonic()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)  # every user's runs share the machine (umask aside)
    except PermissionError:
        pass  # another user's file, already open to all
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    holder = Path(path).read_text(errors="replace").strip() or "unknown"
                    on_wait(f"waiting for the machine: another measurement holds {path} ({holder})")
                    told = True
                check()
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {what}\n".encode(), 0)
        yield time.monotonic() - started
    finally:
        os.close(fd)  # releases the lock


def other_training(own_dir: Path, checkout: Path) -> list[str]:
    """Training processes of this harness checkout (they start in it) on
    this machine that are not this run's: what would share its cores."""
    mine, home = str(Path(own_dir).resolve()), str(checkout)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        args = proc.info["cmdline"] or []
        if proc.info["cwd"] != home or not args or args[-1] == mine:
            continue
        if WORKER_MODULE in args or any(a.endswith("frameworks/worker.py") for a in args):
            found.append(f"pid {proc.pid} training {args[-1]}")
    return found
