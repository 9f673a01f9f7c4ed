"""The framework levels of a design (factors.framework), one a line, read by
./ddlc before any environment exists: with the system's python3 alone, so
that a fresh clone checks the sources of the frameworks it names (Tarantella
is built from GitHub) in seconds, not after the minutes of set-up.

PyYAML where the system has it (Debian's python3-yaml); else a reader of the
forms the key takes in a design: a flow list (on one line or several), a
block list, a single name, in a factors block or a factors flow mapping. The
harness reads the design exactly after set-up (ddlcompare/plan/design.py);
this only decides what to check early, and prints nothing it cannot read.

    python3 envs/design_frameworks.py DESIGN
"""

import re
import sys

# The factors mapping: its block (to the next key at the left margin) or flow.
FACTORS = re.compile(r"^factors:(.*?)(?=^\S|\Z)", re.M | re.S)
# Its framework entry: [a, b] / - a lines (blank ones between) / one name.
FRAMEWORK = re.compile(
    r"(?:^|[\s{,])framework:[ \t]*(\[[^\]]*\]|(?:\n[ \t]*(?:-[^\n]*)?)+|[^\s,}\]]+)"
)
# A comment: '#' at a line's start or after a blank (YAML's rule).
COMMENT = re.compile(r"(?:^|[ \t])#[^\n]*", re.M)


def levels_from_text(text: str) -> list[str]:
    """factors.framework of a design's text, by the forms a design uses."""
    factors = FACTORS.search(COMMENT.sub("", text))
    found = factors and FRAMEWORK.search(factors.group(1))
    if not found:
        return []
    value = found.group(1).strip()
    if value.startswith("["):
        items = value[1:-1].split(",")
    elif value.startswith("-"):
        items = [line.strip()[1:] for line in value.splitlines()]
    else:
        items = [value]
    return [name for item in items if (name := item.strip().strip("'\""))]


def levels(text: str) -> list[str]:
    try:
        import yaml
    except ImportError:
        return levels_from_text(text)
    try:
        factors = (yaml.safe_load(text) or {}).get("factors") or {}
        value = factors.get("framework")
    except (yaml.YAMLError, AttributeError):
        return []  # the harness says what is wrong, after set-up
    value = value if isinstance(value, list) else [value]
    return [str(v) for v in value if isinstance(v, str)]


def main(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as design:
            text = design.read()
    except (OSError, UnicodeDecodeError):
        return 0  # the harness says what is wrong, after set-up
    print("\n".join(levels(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
