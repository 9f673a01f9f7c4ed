"""Stopping a started command with every process it started: its tree
(launchers put ranks in sessions of their own) and what is left in its
session (gaspi_run starts ranks in the background, and a rank stuck in
start-up outlives a launcher that gave up). The runner stops its launchers
so, and the same-model gate its builders."""

from __future__ import annotations

import os
import signal
import subprocess

import psutil

from runfiles.ownership import wait_ended


def kill_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop the launcher and every process under it. Launchers put ranks in
    sessions of their own (torchrun, Horovod's Gloo), so a process group is
    not enough: the tree is listed first, then SIGTERM (with SIGCONT, so a
    stopped rank can act on it), ``grace`` seconds, then SIGKILL for the rest."""
    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for p in tree:
            _send(p, sig)
    alive = wait_ended(tree, grace)
    for p in alive:
        _send(p, signal.SIGKILL)
    wait_ended(alive, grace)
    proc.wait()


def stop_session(session: int) -> None:
    """Kill what the launcher left running in its session after it ended:
    gaspi_run (Tarantella) starts ranks in the background, and a rank stuck
    in start-up outlives a launcher that gave up."""
    left = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == session:
                left.append(p)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    for p in left:
        _send(p, signal.SIGKILL)
    wait_ended(left, 5)


def _send(process: psutil.Process, sig: int) -> None:
    try:
        process.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
    except psutil.AccessDenied:
        pass  # another user's (OAR's setuid oarsh): it ends with its connection
