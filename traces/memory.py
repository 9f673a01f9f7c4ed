"""The memory of a conversion's process: glibc's heap kept and shared by
its threads, and the first files' memory faulted in ahead.

A light module (the standard library only): ``ddlc import`` calls it
before it imports the converter, so that the faulting in runs on the core
those imports leave idle.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from pathlib import Path

from traces.formats import refused_on_its_first_key

# glibc's mallopt parameters (malloc.h) and madvise's (linux/mman.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MADV_POPULATE_WRITE = 23  # Linux 5.14 and later
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
LARGEST_BLOCK = 1 << 30  # from the heap up to this (the mmap threshold below)


def _libc():
    """glibc's malloc, free, mallopt and madvise, typed; None elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        functions = (libc.malloc, libc.free, libc.mallopt, libc.madvise)
    except (OSError, AttributeError):
        return None
    malloc, free, mallopt, madvise = functions
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    mallopt.restype, mallopt.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    madvise.restype = ctypes.c_int
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def reuse_freed_memory() -> None:
    """glibc gives each large block freed back to the kernel (a block of
    over 128 KiB is its own mapping; the heap's free top is trimmed), and
    the next one is faulted in and zeroed page by page. A conversion frees
    and allocates arrays of the same sizes part after part and stage after
    stage: kept in the process (blocks up to 1 GiB from the heap, never
    trimmed), they are reused, and the kernel's zeroing of new pages, the
    largest system cost of a conversion, is paid about once (on the 7 M-event
    archive: 85 k page faults -> 47 k, measured beside other work). One heap
    for every thread (glibc gives each thread an arena of its own
    otherwise): what one reader thread freed, the other reuses, and memory
    faulted in ahead (fault_in_ahead) serves them all. In this process
    only; elsewhere than glibc, nothing changes. The process ends after
    its conversion, so nothing is held long."""
    libc = _libc()
    if libc is None:
        return
    libc.mallopt(M_ARENA_MAX, 1)
    libc.mallopt(M_MMAP_THRESHOLD, LARGEST_BLOCK)
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


def files_at_once() -> int:
    """Trace files read at once, each in a thread (traces/convert.py): two
    where two cores are free for it, else one."""
    return max(1, min(2, len(os.sched_getaffinity(0))))


# The memory a trace file's reading first touches, as a multiple of its
# size: its bytes, the scanner's columns, the stages' arrays, the table
# (a Kineto file of 59 MiB: about 160 MiB, 40 k page faults, and more
# where two are read at once)
TOUCHED_PER_BYTE = 3
LEAST_AHEAD = 16 << 20  # less is not worth a thread
# at most what a core faults in while the converter's modules are imported
# (about 0.15 s): the reading of larger files takes the rest as it goes
MOST_AHEAD = 384 << 20
PIECE = 1 << 20  # faulted in a piece at a time: each holds the process's mappings' lock
# (about a millisecond), which the imports' mmap calls wait for


def fault_in_ahead(paths: list[Path]) -> threading.Thread | None:
    """Faults in, in a thread of its own, the heap memory that the first
    files read at once will take (reuse_freed_memory must come first): its
    pages, zeroed by the kernel, are then in the process when the readers
    ask for them. Started before the converter's modules are imported (a
    tenth of a second or more on one core), it runs on the core they leave
    idle, and the first files' reading, on both cores, pays no first touch:
    one page fault per 4 KiB, some 40 k for a Kineto file of 59 MiB. The
    thread, or None where nothing is to be faulted in."""
    nbytes = bytes_ahead(paths)
    libc = _libc() if nbytes >= LEAST_AHEAD else None
    if libc is None:
        return None
    thread = threading.Thread(target=_fault_in, args=(libc, nbytes), name="fault-in", daemon=True)
    thread.start()
    return thread


def bytes_ahead(paths: list[Path]) -> int:
    """What fault_in_ahead faults in: TOUCHED_PER_BYTE times the largest
    files given (or found in a given folder and its subfolders) that are
    read at once, to MOST_AHEAD and a quarter of the memory free at most.
    A JSON document that every reader refuses on its first key counts for
    nothing (a 1 GiB one is refused in a fraction of a second)."""
    read: list[int] = []
    for size, path in sorted(_sizes(paths), reverse=True):
        if len(read) == files_at_once():
            break
        if not _refused(path):
            read.append(size)
    free = os.sysconf("SC_AVPHYS_PAGES") * PAGE if hasattr(os, "sysconf") else 0
    return min(int(TOUCHED_PER_BYTE * sum(read)), MOST_AHEAD, free // 4)


def _fault_in(libc, nbytes: int) -> None:
    """The heap grown by a block and the block given back at once (free
    keeps it: reuse_freed_memory), then its pages faulted in, a piece at a
    time: the readers may take them meanwhile (a page they touch first they
    fault in themselves; faulting in writes nothing, so what they wrote
    stays)."""
    block = libc.malloc(nbytes)
    if not block:
        return
    libc.free(block)
    start, end = -(-block // PAGE) * PAGE, (block + nbytes) // PAGE * PAGE
    for at in range(start, end, PIECE):
        if libc.madvise(at, min(PIECE, end - at), MADV_POPULATE_WRITE) != 0:
            break  # a kernel before 5.14, or no memory: the readers fault in the rest


def _sizes(paths: list[Path], depth: int = 2, most: int = 10_000):
    """(size, path) of the regular files given, and of those in a folder
    given or in its subfolders (``most`` entries of each folder looked at)."""
    for path in paths:
        try:
            if not os.path.isdir(path):
                if os.path.isfile(path):
                    yield os.path.getsize(path), Path(path)
                continue
            with os.scandir(path) as found:
                for entry in itertools.islice(found, most):
                    if entry.is_file():
                        yield entry.stat().st_size, Path(entry.path)
                    elif depth > 1 and entry.is_dir():
                        yield from _sizes([Path(entry.path)], depth - 1, most)
        except OSError:
            continue


def _refused(path: Path) -> bool:
    """Whether every reader refuses the file on its first bytes (or it
    cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put there meanwhile: no wait
    except OSError:
        return True
    try:
        return refused_on_its_first_key(os.read(fd, HEAD_BYTES))
    except OSError:
        return True
    finally:
        os.close(fd)


HEAD_BYTES = 4096
