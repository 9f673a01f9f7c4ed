"""Reading a design file a user wrote, whatever they wrote.

The file must be a small regular UTF-8 file (a FIFO would hang the reader,
/dev/zero would fill the memory); the YAML may hold only what JSON holds
(dates, sets and binary values are refused with the fix), no key twice (YAML
keeps the last silently: a second ``factors:`` block would drop the first),
and no alias bomb (a few lines expanding to millions of values). Every
problem is a :class:`YamlProblem` with one line naming the place and the fix.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # a design is a page of YAML
MAX_VALUES = 100_000  # values after expanding aliases
# Lists and mappings inside each other: a design needs four levels; PyYAML's
# composer and the checks below recurse once per level.
MAX_DEPTH = 50
# The workflow records its design file's digest here; a job started later
# tells a design edited mid-campaign apart from a wrong run path.
DIGEST_ENV = "DDLC_DESIGN_DIGEST"


class YamlProblem(Exception):
    """One problem, one line."""


def read_text(path: Path) -> str:
    """The file's text, refusing what is not a small regular UTF-8 file."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise YamlProblem(f"cannot be read: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise YamlProblem(
            "is a directory; give the design file inside it (--config design=FOLDER/design.yaml)"
        )
    if not stat.S_ISREG(info.st_mode):
        raise YamlProblem(
            "is not a regular file (a pipe or a device?); save the design "
            "to a file and pass its path"
        )
    if info.st_size > MAX_BYTES:
        raise YamlProblem(
            f"is {info.st_size} bytes; a design is at most {MAX_BYTES} bytes "
            "of YAML: is this the right file?"
        )
    raw = Path(path).read_bytes()[: MAX_BYTES + 1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise YamlProblem(
            f"line {line}: byte {raw[exc.start]:#04x} is not UTF-8; save the file as UTF-8"
        ) from None


def file_digest(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(read_text(Path(path)).encode()).hexdigest()[:16]
    except (OSError, YamlProblem):
        return None


# PyYAML's messages come in fragments ("expected a single document in the
# stream" / "but found another document"); these say what to do instead.
PLAIN_PROBLEMS = {
    "but found another document": "a second document (a '---' line) follows the first; "
    "a design is one document: remove the '---'",
    "found duplicate anchor": "an anchor (&name) is defined twice; give each its own name",
    "found undefined alias": "an alias (*name) comes before any anchor &name",
    "could not determine a constructor for the tag": "a tag designs do not use; remove it "
    "(a design holds text, numbers, true/false, lists and mappings)",
}


def plain(exc: yaml.YAMLError) -> str:
    """One sentence for a PyYAML error, without its fragments."""
    context = str(getattr(exc, "context", None) or "")
    problem = str(getattr(exc, "problem", None) or str(exc).splitlines()[0])
    both = f"{context} {problem}"
    for fragment, sentence in PLAIN_PROBLEMS.items():
        if fragment in both:
            detail = problem.split(fragment, 1)[1].strip() if fragment in problem else ""
            return sentence + (f" ({detail})" if "tag" in fragment and detail else "")
    problem = problem.removeprefix("but ")
    return f"{context}: {problem}" if context else problem


# Plain numbers that YAML 1.1 (PyYAML) reads otherwise than YAML 1.2 and
# than a reader would: 032 is octal 26, 1:04 is base 60 (64); 0b101 and
# 1_000 are numbers to YAML 1.1 only (1.2 reads them as text).
YAML11_NUMBERS = (
    (
        re.compile(r"[-+]?0[0-7_]+"),
        "an octal number in YAML 1.1 ({value} = {read}); write {decimal} for the decimal "
        "number, or quote it for text",
    ),
    (
        re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"),
        "a base-60 number in YAML 1.1 ({value} = {read}); write {read} if you meant that "
        "number, or quote it ('{value}') for text",
    ),
    (
        re.compile(r"[-+]?0b[01_]+"),
        "a binary number in YAML 1.1 only ({value} = {read}; YAML 1.2 reads text); write "
        "{read} if you meant that number, or quote it for text",
    ),
    (
        re.compile(r"[-+]?[0-9.]*_[0-9_.]*([eE][-+]?[0-9]+)?"),
        "a number in YAML 1.1 only ({value} = {read}; YAML 1.2 reads text): write {read} "
        "without the underscores, or quote it for text",
    ),
)


def _yaml11_reading(node, read) -> str | None:
    if node.style is not None:  # quoted: text
        return None
    sign = "-" if node.value.startswith("-") else ""
    decimal = sign + (node.value.replace("_", "").lstrip("+-0") or "0")
    same = ":" not in node.value and "b" not in node.value and "_" not in node.value
    for pattern, what in YAML11_NUMBERS:
        if pattern.fullmatch(node.value) and not (same and float(decimal) == read):
            said = what.format(value=node.value, read=read, decimal=decimal)
            return f"line {node.start_mark.line + 1}: {node.value} reads as {said}"
    return None


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses keys given twice, numbers that YAML 1.1 reads
    otherwise than 1.2, and explicit tags on values of the wrong form."""

    def construct_object(self, node, deep=False):
        try:
            value = super().construct_object(node, deep)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            tag = node.tag.rsplit(":", 1)[-1]
            raise YamlProblem(
                f"line {node.start_mark.line + 1}: {str(node.value)[:40]!r} is not a valid "
                f"!!{tag}; remove the tag or fix the value"
            ) from None
        if isinstance(node, yaml.ScalarNode) and isinstance(value, (int, float)):
            if not isinstance(value, bool) and (problem := _yaml11_reading(node, value)):
                raise YamlProblem(problem)
        return value

    def construct_ordered(self, node):
        raise YamlProblem(
            f"line {node.start_mark.line + 1}: {node.tag.rsplit(':', 1)[-1]} (an ordered "
            "mapping) is not read; write a plain mapping (key: value lines)"
        )

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *base' merges; the merged keys are checked there
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise YamlProblem(
                    f"line {key_node.start_mark.line + 1}: a key must be a plain "
                    "name, not a list or mapping"
                ) from None
            if key in seen:
                raise YamlProblem(
                    f"line {key_node.start_mark.line + 1}: key {key!r} appears "
                    f"twice (first on line {seen[key]}); YAML would keep only the "
                    "last one: merge the two into one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_Loader.add_constructor("tag:yaml.org,2002:omap", _Loader.construct_ordered)
_Loader.add_constructor("tag:yaml.org,2002:pairs", _Loader.construct_ordered)


def load(text: str) -> Any:
    """Parse the YAML; yaml.YAMLError for syntax, YamlProblem for the rest."""
    _check_depth(text)
    data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    _check_size(data)
    problem = _not_json(data, "")
    if problem:
        raise YamlProblem(problem)
    return data


def _check_depth(text: str) -> None:
    """Refuse lists and mappings nested deeper than MAX_DEPTH, from the
    parser's events (which do not recurse), before anything recurses."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):  # noqa: S506
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise YamlProblem(
                    f"line {event.start_mark.line + 1}: lists or mappings nested more "
                    f"than {MAX_DEPTH} deep; a design needs a few levels: is this the "
                    "right file?"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_size(data: Any) -> None:
    """Count values as a reader would see them (aliases expanded), stopping
    as soon as there are too many."""
    count = 0
    stack = [data]
    while stack:
        item = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise YamlProblem(
                f"expands to more than {MAX_VALUES} values (YAML aliases "
                "repeating each other?); write the design out plainly"
            )
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)


FIXES = {  # datetime before date: a datetime is a date too
    datetime.datetime: "a date and time; put it in quotes if you meant text",
    datetime.date: "a date; put it in quotes if you meant text",
    set: "a set (!!set or '? key' entries); write a list [a, b] instead",
    bytes: "a binary value (!!binary); designs hold only text, numbers, true/false and lists",
}


def _not_json(item: Any, where: str) -> str | None:
    """The first value JSON cannot hold, named by its place and the fix."""
    if isinstance(item, dict):
        for key, value in item.items():
            if not isinstance(key, str):
                return (
                    f"{where or 'top level'}: key {key!r} is not text; keys are names "
                    "(put it in quotes)"
                )
            found = _not_json(value, f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    if isinstance(item, list):
        for i, value in enumerate(item):
            if found := _not_json(value, f"{where}[{i}]"):
                return found
        return None
    if item is None or isinstance(item, (str, int, float, bool)):
        return None
    fix = next(
        (text for kind, text in FIXES.items() if isinstance(item, kind)),
        f"a {type(item).__name__}; use text, a number, true/false or a list",
    )
    return f"{where}: {str(item)[:40]!r} is {fix}"
