"""The memory of a conversion's process: freed memory kept by glibc for
reuse, and how many files are read at once.

A light module (the standard library only): ``ddlc import`` calls it
before it imports the converter.
"""

from __future__ import annotations

import ctypes
import os

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
LARGEST_BLOCK = 1 << 30  # from the heap up to this (the mmap threshold below)


def _mallopt():
    """glibc's mallopt, typed; None elsewhere."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.restype, mallopt.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    return mallopt


def reuse_freed_memory() -> None:
    """glibc gives each large block freed back to the kernel (a block of
    over 128 KiB is its own mapping; the heap's free top is trimmed), and
    the next one is faulted in and zeroed page by page. A conversion frees
    and allocates arrays of the same sizes part after part and stage after
    stage: kept in the process (blocks up to 1 GiB from the heap, never
    trimmed), they are reused, and the kernel's zeroing of new pages, the
    largest system cost of a conversion, is paid about once (on the 7 M-event
    archive: 85 k page faults -> 47 k, measured beside other work). One
    heap (glibc arena) serves every thread: an OTF2 archive's next part,
    read in a thread while the part before is written (traces/convert.py),
    then reuses what the first part, read on the main thread, freed, and
    the C reader's threads reuse the main heap (figures in docs/tracing.md,
    "Speed and memory"; on the Kineto bench's set one arena gave the same
    page faults and peak memory as glibc's default arenas, 2026-11-28, 4
    pairs beside other work). In this process only; elsewhere than glibc,
    nothing changes. The process ends after its conversion, so nothing is
    held long."""
    mallopt = _mallopt()
    if mallopt is None:
        return
    mallopt(M_MMAP_THRESHOLD, LARGEST_BLOCK)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    mallopt(M_ARENA_MAX, 1)


def files_at_once() -> int:
    """Trace files read at once, each in a thread (traces/convert.py): two
    where two cores are free for it, else one."""
    return max(1, min(2, len(os.sched_getaffinity(0))))
