"""The OTF2 event pass in C (reader.c), for traces of millions of events.

``library()`` gives the compiled reader, building it on first use with gcc
against Debian's ``libopen-trace-format2-dev`` (``envs/setup.sh`` installs it
and builds it) into ``~/.cache/ddl-compare/fastotf2/``, one file per hash of
the source, so an edit to reader.c rebuilds it. Without gcc or the library,
``library()`` is None and ``why_unavailable()`` says why: the Python reader
then reads the trace.

    python -m traces.fastotf2     # build it now; prints its path or why not
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("reader.c")
HEADER = Path("/usr/include/otf2/otf2.h")
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall")
LIBS = ("-lopen-trace-format2",)
ATTR_STEP, ATTR_EPOCH = 1, 2
NULL = np.iinfo(np.int64).min  # same as traces.table.NULL
OVERFLOW = "more events than the definitions announce"

_loaded: ctypes.CDLL | None = None
_why = ""


class _Columns(ctypes.Structure):
    """Mirrors ``Columns`` in reader.c."""
    _fields_ = [("capacity", ctypes.c_int64),
                ("start", ctypes.c_void_p), ("end", ctypes.c_void_p),
                ("location", ctypes.c_void_p), ("region", ctypes.c_void_p),
                ("depth", ctypes.c_void_p), ("parent", ctypes.c_void_p),
                ("step", ctypes.c_void_p), ("epoch", ctypes.c_void_p),
                ("collective", ctypes.c_void_p), ("bytes", ctypes.c_void_p),
                ("enter_row", ctypes.c_void_p), ("enter_capacity", ctypes.c_int64),
                ("attribute_kind", ctypes.c_void_p), ("attribute_kinds", ctypes.c_uint32),
                ("rows", ctypes.c_int64), ("unbalanced", ctypes.c_int64),
                ("overlapping", ctypes.c_int64), ("unclosed", ctypes.c_int64),
                ("error", ctypes.c_char * 1024)]


# column -> dtype, in the order of _Columns
COLUMN_TYPES = {"start": np.int64, "end": np.int64, "location": np.int32,
                "region": np.uint32, "depth": np.int32, "parent": np.int64,
                "step": np.int64, "epoch": np.int64, "collective": np.int32,
                "bytes": np.int64}


def cache_dir() -> Path:
    base = os.environ.get("DDLC_CACHE") or Path(os.environ.get("XDG_CACHE_HOME")
                                                or Path.home() / ".cache") / "ddl-compare"
    return Path(base) / "fastotf2"


def library_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS + LIBS).encode())
    return cache_dir() / f"libfastotf2-{digest.hexdigest()[:16]}.so"


def build() -> Path:
    """Compile reader.c unless this version is built already; RuntimeError
    saying what is missing otherwise."""
    target = library_path()
    if target.is_file():
        return target
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc) to build traces/fastotf2/reader.c")
    if not HEADER.is_file():
        raise RuntimeError(f"{HEADER} missing: install Debian's libopen-trace-format2-dev "
                           "(envs/setup.sh does)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    done = subprocess.run([compiler, *CFLAGS, str(SOURCE), *LIBS, "-o", tmp],
                          capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building {SOURCE} failed: {done.stderr.strip()[-2000:]}")
    os.replace(tmp, target)  # atomic: concurrent builds of one version agree
    return target


def library() -> ctypes.CDLL | None:
    """The compiled reader, built on first use; None when it cannot be."""
    global _loaded, _why
    if _loaded is None and not _why:
        try:
            lib = ctypes.CDLL(str(build()))
        except (RuntimeError, OSError) as exc:
            _why = str(exc)
            return None
        lib.fastotf2_read.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int32,
                                      ctypes.POINTER(_Columns)]
        lib.fastotf2_read.restype = ctypes.c_int
        _loaded = lib
    return _loaded


def why_unavailable() -> str:
    return _why


class ReadError(Exception):
    """The C reader stopped: the message says why (the library's own words)."""


def read_intervals(anchor: Path, locations: list[int], attribute_kinds: dict[int, int],
                   events: int) -> tuple[dict, dict]:
    """(columns, counts): one entry per matched interval of the given
    locations (refs), read in that order; ``events`` bounds the rows (each
    takes an Enter and a Leave). Raises ReadError."""
    lib = library()
    capacity = events // 2 + 1
    # np.empty: pages the reader never writes cost no memory
    columns = {name: np.empty(capacity, dtype=dtype) for name, dtype in COLUMN_TYPES.items()}
    enter_row = np.empty(events + 1, dtype=np.int64)
    kinds = np.zeros(max(attribute_kinds, default=-1) + 1, dtype=np.uint8)
    for ref, kind in attribute_kinds.items():
        kinds[ref] = kind
    refs = np.asarray(locations, dtype=np.uint64)
    out = _Columns(capacity=capacity, enter_row=enter_row.ctypes.data,
                   enter_capacity=enter_row.size, attribute_kind=kinds.ctypes.data,
                   attribute_kinds=kinds.size,
                   **{name: array.ctypes.data for name, array in columns.items()})
    status = lib.fastotf2_read(str(anchor).encode(), refs.ctypes.data, refs.size,
                               ctypes.byref(out))
    if status != 0:
        raise ReadError(out.error.decode(errors="replace") or "unknown error")
    del enter_row
    rows = out.rows
    # Slices keep the whole allocation alive, but only the rows were touched.
    columns = {name: array[:rows] for name, array in columns.items()}
    return columns, {"unbalanced": out.unbalanced, "overlapping": out.overlapping,
                     "unclosed": out.unclosed}


def main() -> int:
    try:
        print(build())
    except RuntimeError as exc:
        print(f"fastotf2: {exc}", file=sys.stderr)
        return 1
    return 0

