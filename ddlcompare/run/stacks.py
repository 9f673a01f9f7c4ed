"""Where each rank of a hung run waited, taken before the runner kills it.

A run that reaches its timeout is stuck more often than slow: a rank lost
in a collective, a hand-shake that never completes (Tarantella's
``waitForSetup``, docs/improvements.md). Once killed, nothing says where. So
before the kill, every training process of the launcher's tree on this
machine is dumped with py-spy: its Python stack, and with ``--native`` the
C and C++ frames under it (GPI-2, Gloo, MPI), into the run folder's
stacks.txt. Ranks on other machines are out of reach (their node's py-spy
would be needed); a machine that forbids ptrace says so in the file.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psutil

from runfiles import atomic
from runfiles.names import STACKS


def training_processes(root: int) -> list[psutil.Process]:
    """The ranks under ``root``: Python processes running the worker."""
    found = []
    try:
        tree = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for process in tree:
        try:
            if "frameworks.worker" in " ".join(process.cmdline()):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def py_spy() -> str | None:
    """The py-spy beside this Python (envs/torch.txt pins it), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


# Native frames first; a stopped process (SIGSTOP, a debugger) cannot be
# paused by py-spy, but its memory can still be read without pausing it.
ATTEMPTS: tuple[tuple[list[str], int], ...] = (
    (["--native"], 20),
    ([], 10),
    (["--nonblocking"], 10),
)


def dump_one(tool: str, pid: int) -> str:
    """One process's stacks, native frames included where they can be had."""
    why = "no output"
    for extra, seconds in ATTEMPTS:
        try:
            done = subprocess.run(
                [tool, "dump", "--pid", str(pid), *extra],
                capture_output=True,
                text=True,
                timeout=seconds,
            )
        except subprocess.TimeoutExpired:
            why = f"no answer in {seconds} s"
            continue
        if done.returncode == 0:
            note = (
                "" if extra == ["--native"] else f"(Python frames only, py-spy {' '.join(extra)})\n"
            )
            return note + done.stdout
        why = ((done.stderr or done.stdout).strip().splitlines() or [why])[0]
    return f"(py-spy could not read it: {why})\n"


def record(root: int, run_dir: Path) -> Path | None:
    """Write stacks.txt for the training processes under ``root``; its path,
    or None when there is nothing to dump."""
    ranks = training_processes(root)
    if not ranks:
        return None
    tool = py_spy()
    parts = []
    for process in ranks:
        header = f"==== pid {process.pid}: {' '.join(process.cmdline())}\n"
        body = (
            dump_one(tool, process.pid)
            if tool
            else "(py-spy is not installed: pip install py-spy)\n"
        )
        parts.append(header + body)
    atomic.write_text(run_dir / STACKS, "\n".join(parts))
    return run_dir / STACKS
