"""This machine: one measurement at a time, and nothing of ours beside it.

A measurement (a run's training, the network probe, a timed bench) holds a
host-wide lock (a file in /tmp, released by the kernel when its holders
die) exclusively; every workflow job holds it shared for its whole life
(the Snakefile's shell prefix, workflows/share_machine.sh). So no job of any
invocation or checkout runs while a measurement holds the machine, and a
measurement starts only once the jobs under way have ended. Snakemake's
``benchmark_slot`` only keeps the runs of one invocation from queueing on
the lock together.

A measuring job inherits its shell's shared hold: ``measuring`` turns that
same open file exclusive (flock(2) locks belong to the open file, which the
job's shell and its command share; opening the file again would wait on
itself) and shared again afterwards.

Runs that only check correctness (the test suite's: SHARED_ENV, set by
tests/conftest.py) measure nothing worth keeping: they hold the lock
shared, as jobs do, so they overlap one another but never a measurement,
and record ``machine_shared`` (the runner, the probe) so that analysis
never counts them as clean. They pass the turnstile like jobs: a
measurement waiting there goes before every shared taker that comes after
it, so a stream of them cannot starve it.

Runs register their training host-wide (``training``): the owner record's
pid and the launcher's session. Another run that meets live training of
this checkout (its process tree or session, confirmed by the run folder's
owner record) while it measures is recorded as suspect; a process that only
names the worker module on its command line (an editor, a grep) is not
training.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable
from collections.abc import Iterator

import psutil

from runfiles import files, ownership, variables
from runfiles.atomic import write_json

LOCK_ENV = "DDLC_MEASURE_LOCK"
DEFAULT_LOCK = "/tmp/ddl-compare.measure.lock"
LOCK_TEXT = b"pid "  # how the lock file's only text begins: who measures
# Set while a measurement holds the machine: the pid holding it. What that
# measurement starts (a bench's runs, their workflow jobs) is part of it
# and takes no lock of its own (it would wait for its own ancestor).
HELD_ENV = "DDLC_MACHINE_HELD"
JOB_WAITED_ENV = "DDLC_JOB_WAITED_S"
# "1": runs that only check correctness hold the machine shared (above).
SHARED_ENV = "DDLC_MACHINE_SHARED"
# The file the workflow creates when it is told to stop (front/workflow_support.py).
STOP_ENV = "DDLC_STOP_FILE"


class StopRequested(Exception):
    """The workflow was told to stop while this job waited for the machine."""


def check_stop() -> None:
    """Raise StopRequested once the workflow that started this job was told
    to stop: a job still waiting for the machine must not start after it."""
    stop = variables.get(STOP_ENV)
    if stop and os.path.lexists(stop):
        raise StopRequested(
            "the workflow was told to stop while this run waited for the machine; it did not start"
        )


ATTEMPTS_ENV = "DDLC_ATTEMPTS"
DEFAULT_ATTEMPTS = "/tmp/ddl-compare.attempts"


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or DEFAULT_LOCK)


def shared_mode() -> bool:
    """Whether this process's measurements only check correctness and hold
    the machine shared (SHARED_ENV is "1")."""
    return variables.get(SHARED_ENV) == "1"


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def inherited_hold(path: Path) -> int | None:
    """An open file of this process on the lock (a workflow job's shared
    hold, inherited from its shell), or None."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and _same_file(fd, path):
            return fd
    return None


def open_shared(path: Path) -> int:
    """The lock file opened (created if missing) readable and writable by
    every user: one user's first run must not lock the others out. Only
    a lock file: a device, a FIFO or a file holding other text (a wrong
    DDLC_MEASURE_LOCK=/etc/hosts) is refused (files.NotRegular), never
    made writable by all nor written over with who measures."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o666)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise files.NotRegular(f"{path}: {files.kind(info.st_mode)}, not a lock file")
        head = os.pread(fd, len(LOCK_TEXT), 0)  # read: /proc's files say size 0
        if head and head != LOCK_TEXT:
            raise files.NotRegular(f"{path}: holds other text than a lock's; not a lock file")
        with contextlib.suppress(PermissionError):  # another user's file, already open to all
            os.fchmod(fd, 0o666)  # every user's runs share the machine (umask aside)
    except BaseException:
        os.close(fd)
        raise
    return fd


def holders(path: Path | None = None) -> list[tuple[int, str]]:
    """(pid, "exclusive" or "shared") of each hold on the lock, from the
    kernel's table (/proc/locks)."""
    path = path or lock_path()
    try:
        st = os.stat(path)
        table = Path("/proc/locks").read_text()
    except OSError:
        return []
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found = []
    for line in table.splitlines():
        words = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; blocked requests start "->"
        if len(words) >= 6 and words[1] == "FLOCK" and words[5] == device:
            found.append((int(words[4]), "exclusive" if words[3] == "WRITE" else "shared"))
    return found


def describe_holders(path: Path | None = None) -> str:
    path = path or lock_path()
    shown = []
    for pid, mode in holders(path):
        try:
            what = " ".join(psutil.Process(pid).cmdline())[:100]
        except psutil.Error:
            # the kernel names who locked: for a job, the flock command its
            # shell ran, which has ended while the job holds on
            what = "a workflow job"
        shown.append(f"pid {pid} {mode} ({what})")
    return "; ".join(shown) or "nobody now"


@contextlib.contextmanager
def measuring(
    what: str, on_wait: Callable[[str], None], check: Callable[[], None] = lambda: None
) -> Iterator[float]:
    """Hold the machine exclusively while the block runs (shared in
    shared_mode); yield the seconds waited. ``on_wait`` hears once who
    holds it; ``check`` runs each second of the wait (it raises to give up,
    e.g. when the workflow is gone)."""
    if _held_by_ancestor():
        yield 0.0
        return
    path = lock_path()
    started = time.monotonic()
    held = inherited_hold(path)
    inherited = held is not None
    shared = shared_mode()
    fd = held if held is not None else open_shared(path)
    try:
        if shared:
            if not inherited:  # a job's shell already holds it shared
                _take_shared(fd, path, on_wait, check)
        else:
            _take_alone(fd, path, on_wait, check)
            _say_who(path, what)
        os.environ[HELD_ENV] = str(os.getpid())
        # a job's shell waited for its shared hold first (workflows/share_machine.sh)
        before = _job_waited() if inherited else 0.0
        yield before + time.monotonic() - started
    except BaseException:
        if inherited and not shared:  # leaving early (stopped, the workflow gone): no waiting
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        raise
    else:
        if inherited and not shared:
            fcntl.flock(fd, fcntl.LOCK_SH)  # the job's own hold again, for its last steps
    finally:
        os.environ.pop(HELD_ENV, None)
        if not inherited:
            os.close(fd)  # releases the lock


def turnstile(path: Path) -> Path:
    """Where a waiting measurement stops new jobs from taking the machine."""
    return path.with_name(path.name + ".turn")


def _take_alone(fd: int, path: Path, on_wait: Callable[[str], None], check) -> None:
    """Lock ``fd`` exclusively. While it waits, the measurement holds the
    turnstile, which each job passes before its shared hold: jobs already
    under way finish, new ones wait behind the measurement, so a stream of
    jobs cannot keep it waiting for ever. An inherited shared hold is let
    go first: two measuring jobs must not each hold it while waiting for
    the turnstile."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    gate = open_shared(turnstile(path))
    passed = False

    def take() -> bool:
        nonlocal passed
        passed = passed or _try(gate, fcntl.LOCK_EX)
        return passed and _try(fd, fcntl.LOCK_EX)

    try:
        _waiting(take, path, on_wait, check)
    finally:
        os.close(gate)  # lets the jobs waiting behind it queue on the lock


def _take_shared(fd: int, path: Path, on_wait: Callable[[str], None], check) -> None:
    """Lock ``fd`` shared, as a workflow job does (share_machine.sh): pass
    the turnstile first (a measurement waiting there goes first), then
    share the lock with the other shared holders."""
    _waiting(lambda: _pass_turnstile(path) and _try(fd, fcntl.LOCK_SH), path, on_wait, check)


def _pass_turnstile(path: Path) -> bool:
    """Whether no measurement waits at the turnstile now (taken shared and
    let go at once)."""
    gate = open_shared(turnstile(path))
    try:
        return _try(gate, fcntl.LOCK_SH)
    finally:
        os.close(gate)


def _try(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _waiting(take: Callable[[], bool], path: Path, on_wait: Callable[[str], None], check) -> None:
    """Call ``take`` each second until it succeeds; ``on_wait`` hears once
    who holds the machine, ``check`` runs at each try that failed."""
    told = False
    while not take():
        if not told:
            on_wait(
                f"waiting for the machine: {path} is held by {describe_holders(path)}"
                + measured_by(path)
            )
            told = True
        check()
        time.sleep(1)


def measured_by(path: Path) -> str:
    """What the measurement holding the machine wrote into the lock file
    (``_say_who``: its pid and run), while someone holds it exclusively; for
    the waiting message only, never acted on."""
    if not any(mode == "exclusive" for _, mode in holders(path)):
        return ""  # the text is an earlier measurement's
    try:
        text = path.read_text(errors="replace")[:200].strip()
    except OSError:
        return ""
    return f"; measuring: {text}" if text else ""


def _job_waited() -> float:
    """The seconds the job's shell waited (JOB_WAITED_ENV); 0 when it says
    no number: it only adds to the figure of the wait."""
    try:
        return variables.number(JOB_WAITED_ENV, os.environ.get(JOB_WAITED_ENV) or "0")
    except ValueError:
        return 0.0


def _held_by_ancestor() -> bool:
    """Whether this process or one it descends from holds the machine alone
    (HELD_ENV names it)."""
    held = os.environ.get(HELD_ENV, "")
    if not held.isdigit():
        return False
    if int(held) == os.getpid():
        return True
    try:
        return int(held) in {p.pid for p in psutil.Process().parents()}
    except psutil.Error:
        return False


def _say_who(path: Path, what: str) -> None:
    """Write who measures into the lock file, for those who wait (a job's
    inherited hold may be read-only: the text goes through its own open)."""
    try:
        with open(path, "w") as f:
            f.write(f"{LOCK_TEXT.decode()}{os.getpid()}: {what}\n")
    except OSError:
        pass  # another user's file: the waiting message names the pid from /proc/locks


def attempts_dir() -> Path:
    return Path(os.environ.get(ATTEMPTS_ENV) or DEFAULT_ATTEMPTS)


@contextlib.contextmanager
def training(run_dir: Path, session: int, checkout: Path) -> Iterator[None]:
    """Register this attempt's training host-wide while the block runs: the
    runner's pid (its run folder's owner record names it) and the
    launcher's session (ranks that outlive their parent keep it)."""
    folder = attempts_dir()
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o777, exist_ok=True)
        os.chmod(folder, 0o1777)  # any user's runs register here
    me = os.getpid()
    entry = folder / f"{me}.json"
    doc = {
        "pid": me,
        "started": psutil.Process(me).create_time(),
        "session": session,
        "run_dir": str(Path(run_dir).resolve()),
        "checkout": str(checkout),
    }
    try:
        write_json(entry, doc)
    except OSError as exc:  # the run goes on; only others' overlap checks miss it
        print(
            f"warning: could not register this run's training in {folder}: {exc}", file=sys.stderr
        )
    try:
        yield
    finally:
        entry.unlink(missing_ok=True)


def attempt_processes(pid: int, session: int, table: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of one attempt: the runner ``pid``, its descendants
    and whatever runs in its launcher's ``session``. ``table``: this host's
    processes (from psutil.process_iter, with "ppid" read or not)."""
    children: dict[int, list[int]] = {}
    for p in table:
        with contextlib.suppress(psutil.Error):
            parent = p.info["ppid"] if "ppid" in getattr(p, "info", {}) else p.ppid()
            children.setdefault(parent, []).append(p.pid)
    mine, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in mine:
            mine.add(p)
            todo += children.get(p, [])
    found = []
    for p in table:
        try:
            if p.pid in mine or os.getsid(p.pid) == session:
                found.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    return found


def live_attempts() -> list[dict]:
    """Registered attempts whose runner is alive and still owns its run
    folder (the owner record names it); stale entries are removed."""
    found = []
    for entry in sorted(attempts_dir().glob("*.json")):
        try:
            doc = files.read_json(entry)
        except (OSError, ValueError):
            continue
        if not ownership.alive(doc.get("pid", -1), doc.get("started")):
            with contextlib.suppress(OSError):
                entry.unlink()
            continue
        owner = ownership.read_owner(Path(doc["run_dir"]))
        if owner and owner.get("pid") == doc["pid"]:
            found.append(doc)
    return found


def other_training(own_dir: Path, checkout: Path) -> list[str]:
    """Training of this harness checkout on this machine that is not this
    run's: live registered attempts with processes under way."""
    mine = str(Path(own_dir).resolve())
    others = [a for a in live_attempts() if a["run_dir"] != mine and a["checkout"] == str(checkout)]
    if not others:
        return []
    table = list(psutil.process_iter())
    found = []
    for attempt in others:
        procs = [
            p
            for p in attempt_processes(attempt["pid"], attempt["session"], table)
            if p.pid != attempt["pid"]
        ]
        if procs:
            found.append(f"pid {attempt['pid']} training {attempt['run_dir']}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The host-wide measuring lock: who holds it, or run a command holding it."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("holders", help="who holds the machine now")
    run = sub.add_parser("measure", help="run a command (after --) holding the machine alone")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "holders":
        print(describe_holders())
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("measure: name the command after --")
    with measuring(" ".join(command), lambda text: print(text, file=sys.stderr, flush=True)):
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
