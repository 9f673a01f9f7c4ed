"""Atomic writes: a reader sees the old file or the whole new one, never a
half-written one, even if the writer is killed. Every writer of the project
goes through ``replacing``; a shared cache entry is built under
``entry_lock`` (the shell's side: envs/build-lib.sh)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any
from pathlib import Path

from runfiles.files import NotRegular, kind


def refuse_to_replace(path: Path) -> None:
    """NotRegular when ``path`` exists and is neither a regular file nor a
    link to one (a link is replaced, not followed): a write would replace a
    folder, /dev/null, /dev/stdout (a link to a device) or a FIFO with a
    file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise NotRegular(f"{path}: {kind(mode)}, not a regular file; not replaced")
    if stat.S_ISLNK(mode):  # /dev/stdout is a link to a device: never replaced with a file
        try:
            target = os.stat(path).st_mode
        except OSError:
            return  # a link to nowhere (or a loop): replaced
        if not stat.S_ISREG(target):
            raise NotRegular(f"{path}: a link to {kind(target)}, not a regular file; not replaced")


def refuse_inputs(path: Path, inputs) -> None:
    """NotRegular when ``path`` is one of ``inputs`` (the same file, by
    inode, whatever the spelling or link): writing it would replace what
    the command reads."""
    if not os.path.exists(path):
        return
    for source in inputs:
        if os.path.exists(source) and os.path.samefile(path, source):
            raise NotRegular(
                f"{path}: is the input {source}; writing it would replace it, give another file"
            )


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write into; when the block ends
    well it replaces ``path`` in one step, and when it fails (a full disk, a
    kill) it is removed, so no half-written temporary is left behind."""
    path = Path(path)
    refuse_to_replace(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, payload: bytes) -> None:
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def entry_lock(entry: Path) -> Iterator[None]:
    """Hold ``<entry>.lock`` while the block builds a cache entry that other
    checkouts share: one builds, the others wait, told (on stderr) whom for,
    then find it built. The holder's line in the lock file is for that
    message only."""
    path = Path(f"{entry}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text(errors="replace").strip()[:200] or "another process"
            print(f"waiting for {entry}, which {holder} is building", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.truncate(0)
        lock.write(
            f"pid {os.getpid()} on {socket.gethostname()}, checkout {os.getcwd()}, "
            f"since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
        )
        lock.flush()
        yield
