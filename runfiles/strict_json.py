"""JSON Schema checks that count as Python counts: what the design file and
a run's records hold is read by code that takes an integer as an int
(range, pandas' int64, the frameworks' 32-bit arguments)."""

from __future__ import annotations

import functools
import json

# The largest number any setting or count takes unless it says otherwise:
# every framework and library below takes it as a 32-bit integer.
LIMIT = 2**31 - 1


@functools.cache
def strict_validator(schema_json: str):
    """A JSON Schema validator whose "integer" is Python's int (jsonschema
    takes 1.0 for an integer) and whose numbers are never booleans."""
    import jsonschema

    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)
    )
    kind = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)
    return kind(json.loads(schema_json))
