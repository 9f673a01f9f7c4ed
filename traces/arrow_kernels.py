"""Arrow's compute kernels called by name, without ``pyarrow.compute``.

Importing ``pyarrow.compute`` builds some 300 Python wrappers and parses
their docstrings: about 200 M instructions, some 50 ms of CPU, the largest
import of a Kineto conversion, run while its first files are read and
holding the interpreter's lock. Arrow's own array methods (``take``,
``filter``, ``dictionary_encode``, ``is_null``, ``fill_null`` ...) import it
on their first call, so the readers call the same kernels here, through
``pyarrow._compute.call_function`` (what those wrappers call), with the
options the wrappers give by default: the same arrays.
"""

from __future__ import annotations

import pyarrow as pa
from pyarrow import _compute


def take(array, indices):
    """``array.take(indices)``."""
    return _compute.call_function("take", [array, indices], _compute.TakeOptions(boundscheck=True))


def filter(array, mask):  # noqa: A001 (Arrow's name)
    """``array.filter(mask)``: the rows where mask is true (null: dropped)."""
    return _compute.call_function("filter", [array, mask], _compute.FilterOptions("drop"))


def dictionary_encode(array, null_encoding: str = "mask"):
    """``array.dictionary_encode(null_encoding)``."""
    options = _compute.DictionaryEncodeOptions(null_encoding)
    return _compute.call_function("dictionary_encode", [array], options)


def unique(array):
    """``array.unique()``."""
    return _compute.call_function("unique", [array])


def is_null(array):
    """``array.is_null()``."""
    options = _compute.NullOptions(nan_is_null=False)
    return _compute.call_function("is_null", [array], options)


def is_valid(array):
    """``array.is_valid()``."""
    return _compute.call_function("is_valid", [array])


def fill_null(array, value):
    """``array.fill_null(value)`` of a Python value."""
    return _compute.call_function("coalesce", [array, pa.scalar(value, type=array.type)])


def index_in(array, value_set):
    """``pyarrow.compute.index_in(array, value_set=value_set)``."""
    options = _compute.SetLookupOptions(value_set=value_set)
    return _compute.call_function("index_in", [array], options)


def and_(left, right):
    """``pyarrow.compute.and_(left, right)``."""
    return _compute.call_function("and", [left, right])


def any_true(array) -> bool:
    """``pyarrow.compute.any(array).as_py()``, as a bool (nulls skipped)."""
    options = _compute.ScalarAggregateOptions(skip_nulls=True, min_count=1)
    return bool(_compute.call_function("any", [array], options).as_py())
