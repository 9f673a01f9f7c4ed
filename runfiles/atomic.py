"""Atomic writes: a reader sees the old file or the whole new one, never a
half-written one, even if the writer is killed. Every writer of the project
goes through ``replacing``."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write into; when the block ends
    well it replaces ``path`` in one step, and when it fails (a full disk, a
    kill) it is removed, so no half-written temporary is left behind."""
    path = Path(path)
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


def write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
