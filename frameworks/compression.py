"""Gradient compression codecs, framework-neutral (numpy), with their error bounds.

A codec turns one float32 gradient buffer into what a rank hands to the
network and back. Two kinds, because of how they are exchanged:
- cast codecs (none, fp16, bf16) stay summable: they go through the
  framework's all-reduce in the wire type, and the sum is cast back;
- int8 codecs cannot be summed in int8 (the sum overflows), so every rank's
  payload is exchanged with an all-gather and every rank decodes each
  payload and averages them.

The adapters use these functions for the int8 codecs (the payload is bytes);
fp16 and bf16 are the frameworks' own casts, which round to nearest even
(tests/test_compression.py holds them, bit for bit, to a numpy model and
each codec to its stated error bound).
Importing this module is cheap: params.py reads :data:`NAMES`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

# The lossless byte compressor after int8: zlib at level 1 (the fastest) from
# the standard library; lz4 is not installed in either environment.
LOSSLESS_LEVEL = 1
SCALE_BYTES = 4  # the float32 scale that heads every int8 payload
INT8_MAX = 127


@dataclass(frozen=True)
class Codec:
    name: str
    exchange: str  # "allreduce" (summable) or "allgather" (every payload to every rank)
    wire: str  # what is handed to the collective
    error_bound: str  # per element, after decode (before averaging)

    @property
    def gathers(self) -> bool:
        return self.exchange == "allgather"


CODECS = {
    c.name: c
    for c in [
        Codec("none", "allreduce", "float32", "exact (0)"),
        Codec(
            "fp16",
            "allreduce",
            "float16",
            "|e| <= 2^-11 |x| for 6.1e-5 <= |x| <= 65504; <= 2^-25 below; "
            "|x| > 65504 overflows to inf",
        ),
        Codec("bf16", "allreduce", "bfloat16", "|e| <= 2^-8 |x| (float32's range kept)"),
        Codec(
            "int8",
            "allgather",
            "int8 + a float32 scale per buffer",
            "|e| <= scale/2, scale = max|x|/127 over the buffer",
        ),
        Codec(
            "int8+lossless",
            "allgather",
            f"zlib (level {LOSSLESS_LEVEL}) of the int8 bytes + the scale, variable length",
            "as int8 (the zlib step is exact)",
        ),
    ]
}
NAMES = tuple(CODECS)


def int8_scale(x: np.ndarray) -> np.float32:
    """max|x| / 127; 1 for an all-zero buffer (any scale decodes zeros exactly)."""
    peak = np.float32(np.abs(x).max()) if x.size else np.float32(0)
    return peak / np.float32(INT8_MAX) if peak > 0 else np.float32(1)


def int8_encode(x: np.ndarray, lossless: bool = False) -> bytes:
    """The payload: a float32 scale, then each element as round(x / scale)
    in [-127, 127] (then zlib-compressed when ``lossless``)."""
    x = np.asarray(x, dtype=np.float32)
    scale = int8_scale(x)
    q = np.clip(np.rint(x / scale), -INT8_MAX, INT8_MAX).astype(np.int8).tobytes()
    if lossless:
        q = zlib.compress(q, LOSSLESS_LEVEL)
    return np.float32(scale).tobytes() + q


def int8_decode(payload, lossless: bool = False) -> np.ndarray:
    payload = memoryview(payload).cast("B")
    scale = np.frombuffer(payload[:SCALE_BYTES], dtype=np.float32)[0]
    body = payload[SCALE_BYTES:]
    if lossless:
        body = zlib.decompress(body)
    return np.frombuffer(body, dtype=np.int8).astype(np.float32) * scale


def encode(name: str, x: np.ndarray) -> bytes:
    """A gather codec's payload for one float32 buffer."""
    return int8_encode(x, lossless=name == "int8+lossless")


def decode(name: str, payload) -> np.ndarray:
    return int8_decode(payload, lossless=name == "int8+lossless")


def average_payloads(name: str, payloads: list) -> np.ndarray:
    """What every rank computes after the all-gather: the mean of the
    decoded payloads (in the same order on every rank, so the same result)."""
    total = decode(name, payloads[0]).copy()
    for payload in payloads[1:]:
        total += decode(name, payload)
    return total / np.float32(len(payloads))


def table() -> list[dict]:
    """The codecs as rows, for the report."""
    return [
        {
            "compression": c.name,
            "exchange": c.exchange,
            "on the wire": c.wire,
            "error bound": c.error_bound,
        }
        for c in CODECS.values()
    ]
