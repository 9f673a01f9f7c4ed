"""What trace files look like at their start: the standard library only."""

from __future__ import annotations

# The keys a trace document may open with: Kineto's and those of Chrome's
# Trace Event Format. A JSON object that opens with another (a PyTorch
# execution trace's "schema", a configuration) is no trace: it is refused
# on its first key, not walked for an events array to its end.
TRACE_FIRST_KEYS = frozenset(
    b'"%s"' % key
    for key in (
        b"schemaVersion",
        b"deviceProperties",
        b"distributedInfo",
        b"traceEvents",
        b"traceName",
        b"displayTimeUnit",
        b"baseTimeNanoseconds",
        b"systemTraceEvents",
        b"otherData",
        b"metadata",
        b"stackFrames",
        b"samples",
        b"powerTraceAsString",
        b"controllerTraceDataKey",
    )
)
