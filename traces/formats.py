"""What trace files look like at their start, for the code that must tell
before the readers are loaded (traces/memory.py sizes what it faults in
ahead by them): the standard library only."""

from __future__ import annotations

import re

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
_FIRST_KEY = re.compile(rb'\s*\{\s*("(?:[^"\\]|\\.)*")')


def refused_on_its_first_key(head: bytes) -> bool:
    """Whether a file whose first bytes are ``head`` is a JSON object whose
    first key is none a trace opens with (every reader refuses it); False
    for anything else, and where the first key is not whole in ``head``."""
    found = _FIRST_KEY.match(head)
    return found is not None and found.group(1) not in TRACE_FIRST_KEYS
