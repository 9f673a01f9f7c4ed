"""Reading a file of a results folder without trusting what it is: a FIFO
would hang the reader, a link to /dev/zero would fill its memory. Every
reader of run files (done.json, owner.json, run.json, the tables) goes
through ``regular`` or the readers here, which accept only a regular file
(a link to one is fine) within a size bound."""

from __future__ import annotations

import json
import os
import stat
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from runfiles import names

# Far above any record the harness writes (a few kB), far below a memory.
MAX_RECORD_BYTES = 64 << 20


class NotRegular(OSError):
    """The path is not the regular file (or the plain folder) expected: a
    folder, a device, a FIFO, a socket, a link, or too big."""


def kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _check(path: Path, info: os.stat_result, limit: int | None) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise NotRegular(f"{path}: {kind(info.st_mode)}, not a regular file")
    if limit is not None and info.st_size > limit:
        raise NotRegular(f"{path}: {info.st_size} bytes, more than the {limit} expected")


def regular(path: Path, limit: int | None = None) -> Path:
    """``path`` when it is a regular file (of at most ``limit`` bytes);
    FileNotFoundError when missing, NotRegular otherwise. For readers that
    open the file themselves (Parquet, CSV)."""
    _check(Path(path), os.stat(path), limit)
    return Path(path)


@contextmanager
def _opened(path: Path, limit: int | None):
    """The regular file at ``path``, opened without blocking (a FIFO does
    not wait for a writer), and what it is, checked on the open file, so
    that nothing swapped in between is read; checked before Python's file
    object, which refuses a folder naming the descriptor, not the path."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        _check(Path(path), info, limit)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f, info


def read_bytes(path: Path, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The content of a regular file of at most ``limit`` bytes."""
    with _opened(path, limit) as (f, _):
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise NotRegular(f"{path}: more than the {limit} bytes expected")
    return data


def read_text(path: Path, limit: int = MAX_RECORD_BYTES) -> str:
    return read_bytes(path, limit).decode()


def read_tail(path: Path, size: int) -> str:
    """The last ``size`` bytes of a regular file, as text: the end of a log
    of any length (a cut character is replaced)."""
    with _opened(path, None) as (f, info):
        f.seek(max(0, info.st_size - size))
        return f.read(size).decode(errors="replace")


def read_json(path: Path, limit: int = MAX_RECORD_BYTES):
    """A JSON record: OSError (NotRegular included) when it cannot be read,
    ValueError when it is not JSON."""
    return loads(read_bytes(path, limit))


def loads(text: str | bytes):
    """json.loads for text read from data: a document nested deeper than
    Python's recursion (100,000 '[') is a ValueError like any other text
    that is not a record, not a RecursionError that no reader expects."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep to be a record") from None


def plain_folder(path: Path) -> Path:
    """``path`` as a folder of its own, created if missing: never a link
    (which could lead out of the results folder) nor a file."""
    path = Path(path)
    try:
        path.mkdir()
    except FileExistsError:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            raise NotRegular(
                f"{path}: a link, not a folder of its own; nothing is written through it "
                "(remove the link)"
            ) from None
        if not stat.S_ISDIR(mode):
            raise NotRegular(
                f"{path}: {kind(mode)}, where a folder is expected (remove or rename it)"
            ) from None
    return path


def within(path: Path, root: Path) -> None:
    """NotRegular when ``path``, links followed, leads out of ``root``: a run
    folder (or a folder above it) that is a link elsewhere would have the
    harness move and write files outside the results folder."""
    # realpath, not Path.resolve, which raises RuntimeError on a link loop
    # (the reader that follows names it: ELOOP)
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real != top and top not in real.parents:
        raise NotRegular(
            f"{path}: leads out of {root} (to {real}) through a link; nothing is read or written "
            "through it (replace the link with a folder)"
        )


def place_problem(path: Path, root: Path, *, folder: bool = True) -> str | None:
    """Why the harness cannot use ``path`` under ``root`` (a folder, or a
    file when ``folder`` is False): the first part of it, from ``root``
    down, that exists but is not a folder (a file, a FIFO, a device, a link
    to nowhere), ``path`` itself not a regular file (nor a link) where a file
    is expected, or a link leading out of ``root``. None when every part is
    what is expected or missing (made when needed)."""
    path, root = Path(path), Path(root)
    parts = path.relative_to(root).parts
    if not folder and os.path.islink(path):  # written, it would replace what it leads to
        return f"{path}: a link, where a file is expected (remove it; the workflow writes it)"
    here = root
    for i, part in enumerate(parts):
        here = here / part
        expected = "a folder" if folder or i < len(parts) - 1 else "a file"
        try:
            mode = os.stat(here).st_mode
        except FileNotFoundError:
            if os.path.islink(here):
                return f"{here}: a link to nowhere, where {expected} is expected (remove it)"
            break  # made when needed; the parts above must still lead nowhere else
        except OSError as exc:
            return f"{here}: cannot be read ({exc.strerror})"
        if expected == "a folder" and not stat.S_ISDIR(mode):
            return f"{here}: {kind(mode)}, where a folder is expected (remove or rename it)"
        if expected == "a file" and not stat.S_ISREG(mode):
            return f"{here}: {kind(mode)}, where a file is expected (remove or rename it)"
    try:
        within(path, root)
    except NotRegular as exc:
        return str(exc)
    return None


def harness_file(path: Path) -> str | None:
    """What ``path`` is of the harness's own, or None: a file (or under a
    folder) that a run folder holds by the harness's name for it (run.json,
    epochs.tsv, phases.parquet, trace/, attempts/...), or a table of a
    design's tables folder. An output given by hand never replaces one: the
    run's record would be lost, and nothing says so."""
    path = Path(os.path.abspath(path))
    for folder in path.parents:
        if any(os.path.lexists(folder / mark) for mark in names.RUN_MARKS):
            first = path.relative_to(folder).parts[0]
            if any(fnmatch(first, own) for own in names.RUN_FILES):
                return f"the run folder {folder}'s own {first}"
            return None
    if path.name in names.TABLE_COLUMNS and os.path.lexists(path.parent / "runs.parquet"):
        return f"the table {path.name} of the tables folder {path.parent}"
    return None
