"""How a conversion's process loads the converter (``ddlc import`` and the
workflows' ``python -m traces``, bench/ too): numpy with one BLAS thread,
and no garbage collection of the modules' objects. Set up before numpy is
first imported, so the process's entry does it, not traces.convert."""

from __future__ import annotations

import contextlib
import gc

from runfiles import variables

OPENBLAS_THREADS = "OPENBLAS_NUM_THREADS"


@contextlib.contextmanager
def converter_loading():
    """Loads what is imported inside it as a conversion should."""
    with _blas_of_one_thread(), _imports_uncollected():
        yield


@contextlib.contextmanager
def _blas_of_one_thread():
    """numpy loaded with one OpenBLAS thread: OpenBLAS starts a thread per
    core as it is loaded, and they spin for work a conversion never gives
    them (it makes no BLAS call): some 45 ms of CPU of a 90 ms ``import
    numpy``, measured beside other work. Only while it is loaded: no child
    inherits the setting."""
    with variables.setting(OPENBLAS_THREADS, "1"):
        yield


@contextlib.contextmanager
def _imports_uncollected():
    """No garbage collection while the converter's modules load (each of
    their many objects lives as long as the process), and those objects
    left out of the collections after it: 70 collections, about 9 ms of
    CPU of a conversion, measured beside other work."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
