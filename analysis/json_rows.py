"""Many JSON objects of one shape written at once, formatted by numpy.

A row's text is laid out in a byte matrix, one row per object and a fixed
span of columns per field: constant text, one of a few strings (by code), an
integer, nanoseconds as microseconds. A field narrower than its span is
padded with NUL bytes, which are then dropped from the whole matrix in one
step. No Python runs per row, so a million rows take about a second, where
building a million dicts or structs for json, orjson or msgspec takes
seconds before the encoder starts.

    write(f, n, [Text('{"ts":'), Micros(ns), Text(',"pid":'), Ints(pids), Text("},\\n")])
"""

from __future__ import annotations

import numpy as np

PAD = 0  # padding byte, dropped before writing
ROWS_PER_CHUNK = 1 << 16  # bounds the matrix's memory (about 10 MiB)
NULL = np.frombuffer(b"null", dtype=np.uint8)


class Text:
    """The same text on every row."""

    def __init__(self, text: str):
        self.table = np.frombuffer(text.encode(), dtype=np.uint8)
        self.width = len(self.table)

    def fill(self, out: np.ndarray, rows: slice) -> None:
        out[:] = self.table


class Choice:
    """One of a few strings per row: ``texts[codes[row]]``."""

    def __init__(self, texts: list[str], codes: np.ndarray):
        encoded = [t.encode() for t in texts]
        self.width = max((len(t) for t in encoded), default=0)
        self.table = np.full((max(len(encoded), 1), self.width), PAD, dtype=np.uint8)
        for i, text in enumerate(encoded):
            self.table[i, : len(text)] = np.frombuffer(text, dtype=np.uint8)
        self.codes = np.asarray(codes, dtype=np.intp)

    def fill(self, out: np.ndarray, rows: slice) -> None:
        out[:] = self.table[self.codes[rows]]


class Ints:
    """An integer per row; ``null`` (a mask) writes null there, ``negative``
    (a mask) a minus sign before the magnitude (default: values < 0)."""

    def __init__(self, values, null: np.ndarray | None = None, negative: np.ndarray | None = None):
        values = np.asarray(values, dtype=np.int64)
        self.null = null if null is not None and null.any() else None
        if self.null is not None:
            values = np.where(self.null, 0, values)
        negative = values < 0 if negative is None else np.asarray(negative, dtype=bool)
        self.negative = negative if negative.any() else None
        magnitude = np.abs(values)
        largest = int(magnitude.max()) if len(values) else 0
        # 32-bit division where the numbers fit: about twice as fast.
        self.magnitude = magnitude.astype(np.uint32 if largest < 2**32 else np.uint64)
        self.digits = len(str(largest))
        self.width = max(self.digits + (self.negative is not None), 4 * (self.null is not None))

    def fill(self, out: np.ndarray, rows: slice) -> None:
        negative = None if self.negative is None else self.negative[rows]
        _digits(out, self.magnitude[rows], self.digits, negative)
        if self.null is not None:
            null = self.null[rows]
            out[null] = PAD
            out[null, -4:] = NULL


class Micros:
    """Nanoseconds as microseconds, exactly: whole microseconds, then up to
    three decimals with trailing zeros (and a bare point) left out."""

    def __init__(self, ns):
        ns = np.asarray(ns, dtype=np.int64)
        self.whole = Ints(np.abs(ns) // 1000, negative=ns < 0)
        self.fraction = (np.abs(ns) % 1000).astype(np.uint16)
        self.width = self.whole.width + 4

    def fill(self, out: np.ndarray, rows: slice) -> None:
        self.whole.fill(out[:, :-4], rows)
        fraction = self.fraction[rows]
        # The decimals with trailing zeros cut: 500 -> ".5", 0 -> nothing.
        tens, hundreds = fraction % 10 == 0, fraction % 100 == 0
        _digits(out[:, -3:], fraction, 3, zeros=True)
        out[:, -4] = ord(".")
        out[tens, -1] = PAD
        out[hundreds, -2] = PAD
        zero = fraction == 0
        out[zero, -3] = PAD
        out[zero, -4] = PAD


class When:
    """Fields written only on the rows of a mask (nothing elsewhere)."""

    def __init__(self, mask: np.ndarray, *fields):
        self.mask = np.asarray(mask, dtype=bool)
        self.fields = fields
        self.width = sum(f.width for f in fields)

    def fill(self, out: np.ndarray, rows: slice) -> None:
        _fill(out, self.fields, rows)
        out[~self.mask[rows]] = PAD


def write(f, n: int, fields: list) -> int:
    """Write n rows of the fields one after another; returns the bytes written."""
    written = 0
    width = sum(f.width for f in fields)
    for first in range(0, n, ROWS_PER_CHUNK):
        rows = slice(first, min(n, first + ROWS_PER_CHUNK))
        matrix = np.empty((rows.stop - rows.start, width), dtype=np.uint8)
        _fill(matrix, fields, rows)
        text = matrix[matrix != PAD]
        f.write(memoryview(text))
        written += text.size
    return written


def _fill(out: np.ndarray, fields, rows: slice) -> None:
    at = 0
    for field in fields:
        field.fill(out[:, at : at + field.width], rows)
        at += field.width


def _digits(
    out: np.ndarray,
    magnitude: np.ndarray,
    digits: int,
    negative: np.ndarray | None = None,
    zeros: bool = False,
) -> None:
    """Each magnitude's decimal text right-aligned in out's columns, a minus
    sign before the rows of ``negative``, PAD before that (``zeros``: zeros
    up to ``digits`` instead). One division by 10 per digit (numpy divides
    by a scalar without a hardware division), digits first laid out by
    place, then transposed."""
    width = out.shape[1]
    out[:, : width - digits] = PAD
    body = np.empty((digits, len(magnitude)), dtype=np.uint8)  # a digit's row is contiguous
    rest = magnitude
    for place in range(digits - 1, -1, -1):
        quotient = rest // 10
        body[place] = rest - quotient * 10 + ord("0")
        rest = quotient
    if not zeros:
        powers = 10 ** np.arange(1, digits, dtype=np.uint64)
        length = np.searchsorted(powers, magnitude, side="right") + 1
        body[np.arange(digits)[:, None] < (digits - length)[None, :]] = PAD
    out[:, width - digits :] = body.T
    if negative is not None and negative.any():
        rows = np.flatnonzero(negative)
        first = width - digits + (out[rows, width - digits :] == PAD).sum(axis=1)
        out[rows, first - 1] = ord("-")
