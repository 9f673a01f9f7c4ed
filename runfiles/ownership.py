"""One live attempt per run folder.

An attempt claims its run folder before it starts by writing ``owner.json``
(pid, host, the process's start time, a token). Everything that writes a
run's results checks first that the folder is still its own:

- the runner, before each record it writes (run.json, done.json...);
- every training process, through a watchdog thread that also watches the
  runner: when the runner is gone (Snakemake SIGKILLed, a lost terminal, an
  OOM kill) or another attempt owns the folder, the process stops at once and
  writes nothing.

A new attempt that finds the folder owned by a live process, or training
processes of an earlier attempt still running, refuses to start (or stops
them first, on this host, when asked with ``kill_orphans``): two attempts
never train in one folder, and no stale attempt overwrites a new one's files.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import psutil

from runfiles import names, variables
from runfiles.names import OWNER
from runfiles.atomic import write_json
from runfiles import files

# An owner on another host cannot be probed: it proves it is alive by
# rewriting owner.json (see heartbeat) more often than this.
STALE_AFTER_S = 120
HEARTBEAT_S = 30
# Set by the Snakefile in the workflow's main process: "pid:start time".
WORKFLOW_ENV = "DDLC_WORKFLOW_PID"
# Exit status of a training process that stopped because it lost its folder.
LOST_OWNERSHIP = 75


class Busy(Exception):
    """The run folder belongs to another live attempt."""


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def alive(pid: int, started: float | None) -> bool:
    """Whether ``pid`` is still the process that started at ``started``
    (a reused pid is not)."""
    now = _start_time(pid)
    return now is not None and (started is None or abs(now - started) < 0.5)


def read_owner(run_dir: Path) -> dict | None:
    try:
        owner = files.read_json(Path(run_dir) / OWNER)
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("token"), str) else None


def owner_alive(owner: dict, folder: Path, table=None) -> bool:
    """Whether the attempt ``owner`` names still works in ``folder``. On this
    host the pid read from owner.json is only believed when that process
    is shown to work on the folder (run_processes): a hand-written owner.json
    naming another process is a stale claim, never a process to wait for or
    to stop."""
    if owner.get("host") == socket.gethostname():
        pid = owner.get("pid")
        return (
            isinstance(pid, int)
            and alive(pid, owner.get("started"))
            and pid in {p.pid for p in run_processes(folder, table)}
        )
    try:
        age = time.time() - (folder / OWNER).stat().st_mtime
    except OSError:
        return False
    return age < STALE_AFTER_S


def process_table() -> list[tuple[psutil.Process, list[str], str | None]]:
    """Every process of this host with its command line and working folder
    (read once for many run folders)."""
    table = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        if proc.pid != os.getpid() and proc.info["cmdline"]:
            table.append((proc, proc.info["cmdline"], proc.info["cwd"]))
    return table


def names_folder(args: list[str], cwd: str | None, folder: str) -> bool:
    """Whether a command line works on ``folder``: it names the folder or a
    file in it (launchers and ranks), or it is a runner's ``--results R
    --path P`` with R/P the folder (relative to the process's own folder)."""
    if any(a == folder or a.startswith(folder + "/") for a in args):
        return True
    options = dict(zip(args, args[1:]))
    if "--results" not in options or "--path" not in options or not cwd:
        return False
    return os.path.realpath(os.path.join(cwd, options["--results"], options["--path"])) == folder


def run_processes(run_dir: Path, table=None) -> list[psutil.Process]:
    """This host's processes shown to work on ``run_dir`` by their own
    command line (never by a pid read from a file), other than this one."""
    folder = str(Path(run_dir).resolve())
    return [
        proc
        for proc, args, cwd in (process_table() if table is None else table)
        if names_folder(args, cwd, folder)
    ]


def describe(procs: list[psutil.Process]) -> str:
    shown = []
    for p in procs[:3]:
        try:
            shown.append(f"pid {p.pid} ({' '.join(p.cmdline()[:3])[:80]})")
        except psutil.Error:
            shown.append(f"pid {p.pid}")
    more = f" and {len(procs) - 3} more" if len(procs) > 3 else ""
    return ", ".join(shown) + more


def occupants(run_dir: Path, table=None) -> tuple[dict | None, list[psutil.Process]]:
    """The live owner of ``run_dir`` (or None) and the processes still
    working in it on this host."""
    table = process_table() if table is None else table
    owner = read_owner(run_dir)
    if owner and not owner_alive(owner, Path(run_dir), table):
        owner = None
    return owner, run_processes(run_dir, table)


def busy_message(run_dir: Path, owner: dict | None, procs: list[psutil.Process]) -> str:
    who = []
    if owner:
        who.append(
            f"attempt of pid {owner.get('pid')} on {owner.get('host')} since {owner.get('since')}"
        )
    if procs:
        who.append(describe(procs))
    pids = " ".join(str(p.pid) for p in procs) or str((owner or {}).get("pid"))
    return (
        f"{run_dir}: an earlier attempt is still running ({'; '.join(who)}), for example "
        "left behind when Snakemake was killed; wait for it to end, stop it "
        f"(kill {pids}), or rerun with --config kill_orphans=1 to stop it from here"
    )


def stop_processes(procs: list[psutil.Process], grace: float = 5.0) -> None:
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    left = wait_ended(procs, grace)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    wait_ended(left, grace)


def ended(process: psutil.Process) -> bool:
    """Gone, or exited and only waiting to be reaped: a zombie whose parent
    died is reaped by PID 1, which on some machines (a VM's own init) gets
    to it 1-2 s later; waiting on its pid (psutil.wait_procs) waited that
    long for a process that runs nothing."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def wait_ended(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` seconds for ``procs`` to end (see ended); those
    still running then. None of them may be a child of this process that
    nothing else reaps: a zombie counts as ended here and is not reaped."""
    deadline = time.monotonic() + timeout
    left = [p for p in procs if not ended(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if not ended(p)]
    return left


def evict(run_dir: Path, kill: bool, table=None) -> None:
    """Make sure nothing else works in ``run_dir``: raise Busy naming the
    occupant, or (``kill``, on this host) stop the processes whose own
    command line names the folder (a local owner is one of them)."""
    owner, procs = occupants(run_dir, table)
    if not owner and not procs:
        return
    remote = owner and owner.get("host") != socket.gethostname()
    if not kill or remote:
        raise Busy(busy_message(run_dir, owner, procs))
    stop_processes(procs)


def claim(run_dir: Path, kill: bool = False) -> str:
    """Take ``run_dir`` for this process; return the attempt's token. Two
    attempts claiming at once take turns (a lock around check and write)."""
    token = uuid.uuid4().hex
    me = os.getpid()
    with folder_lock(run_dir):
        evict(run_dir, kill)
        write_json(
            Path(run_dir) / OWNER,
            {
                "pid": me,
                "host": socket.gethostname(),
                "started": _start_time(me),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "token": token,
            },
        )
    return token


@contextmanager
def folder_lock(run_dir: Path):
    """The run folder's lock, held: around a claim's check and write, and
    around moving an attempt's files aside (two ``ddlc check --rerun`` at
    once would otherwise split one attempt's files between two folders)."""
    with _lock_file(Path(run_dir) / names.OWNER_LOCK) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _lock_file(path: Path):
    """The run folder's lock file, opened without blocking and without
    following a link: a FIFO there would hang the run before it starts, a
    link would have it create a file where it leads (files.NotRegular)."""
    try:
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
    except OSError:
        if os.path.islink(path):
            raise files.NotRegular(f"{path}: a link, not the run's lock file (remove it)") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise files.NotRegular(f"{path}: {files.kind(mode)}, not the run's lock file (remove it)")
    return os.fdopen(fd, "r+")


def owns(run_dir: Path, token: str) -> bool:
    owner = read_owner(run_dir)
    return owner is not None and owner["token"] == token


def heartbeat(run_dir: Path, token: str) -> None:
    """Show hosts that cannot probe this process that it is alive."""
    if owns(run_dir, token):
        os.utime(Path(run_dir) / OWNER)


def release(run_dir: Path, token: str) -> None:
    # Under the folder's lock, as a claim checks and writes: a claim that
    # stops this attempt (kill_orphans) would otherwise write its owner.json
    # between this check and the unlink, and lose it.
    if not Path(run_dir).is_dir():
        return
    with folder_lock(run_dir):
        if owns(run_dir, token):
            (Path(run_dir) / OWNER).unlink(missing_ok=True)


def workflow_process() -> tuple[int, float | None] | None:
    """The Snakemake process that started this one, if it is an ancestor of
    this process (on a cluster node the variable names a process elsewhere)."""
    text = variables.get(WORKFLOW_ENV) or ""
    pid, _, started = text.partition(":")
    if not pid.isdigit():
        return None
    try:
        ancestors = {p.pid for p in psutil.Process().parents()}
    except psutil.Error:
        return None
    if int(pid) not in ancestors:
        return None
    try:
        return int(pid), variables.number(WORKFLOW_ENV, started) if started else None
    except ValueError:  # no start time to tell a reused pid apart: not that workflow
        return None


def workflow_mark() -> str:
    """What the Snakefile puts in WORKFLOW_ENV: this process and its start."""
    return f"{os.getpid()}:{_start_time(os.getpid())}"


def watch_from_worker(run_dir: Path, interval: float = 1.0) -> None:
    """In a training process: stop it, writing nothing more, as soon as the
    attempt that started it no longer owns the folder or its runner died."""
    owner = read_owner(run_dir)
    if owner is None:
        return  # started by hand, outside the runner
    _WORKER_OWNER[str(Path(run_dir).resolve())] = owner["token"]
    local = owner.get("host") == socket.gethostname()

    def watch():
        while True:
            time.sleep(interval)
            if local and not alive(owner["pid"], owner.get("started")):
                why = f"its runner (pid {owner['pid']}) is gone"
            elif not owns(run_dir, owner["token"]):
                why = "another attempt owns the run folder now"
            else:
                continue
            print(f"stopping without writing: {why}", file=sys.stderr, flush=True)
            os._exit(LOST_OWNERSHIP)

    threading.Thread(target=watch, name="ownership-watchdog", daemon=True).start()


# run folder -> the token of the attempt that started this training process
_WORKER_OWNER: dict[str, str] = {}


def guard_worker_write(run_dir: Path) -> None:
    """Just before a training process writes a result: still ours?"""
    token = _WORKER_OWNER.get(str(Path(run_dir).resolve()))
    if token and not owns(run_dir, token):
        print(
            "stopping without writing: another attempt owns the run folder now",
            file=sys.stderr,
            flush=True,
        )
        os._exit(LOST_OWNERSHIP)


def die_with_parent() -> None:
    """For a child's preexec_fn: SIGTERM it when the process that started it
    dies (Linux's PR_SET_PDEATHSIG), so a killed runner leaves no launcher."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
