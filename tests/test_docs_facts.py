"""The documents a reader meets first: no path of one machine (a user's
home, a session's work folder) where any reader's differs, and the facts
that drifted apart stated in one place, the others linking to it."""

import re

from conftest import REPO

DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "envs").glob("*.md")),
]
# a session work folder, root's or a user's home, and /tmp/... but the harness's own
# documented defaults there (/tmp/ddl-compare.*, /tmp/ddlc-*); a path inside
# a URL or after ~ or $VAR is not a machine's.
MACHINE_PATH = re.compile(
    r"(?<![\w.~}$/-])/(work|root|home/[\w.-]+|tmp/(?!ddl-compare|ddlc-))[\w./+-]*"
)
DURATION = re.compile(r"\b(\d+(\.\d+)? ?(s|min|minutes?)|hours?)\b")


def lines_of(paths):
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            yield f"{path.relative_to(REPO)}:{number}", line


def test_no_document_names_a_path_of_one_machine():
    found = [
        f"{where}: {m.group(0)}"
        for where, line in lines_of(DOCS)
        for m in MACHINE_PATH.finditer(line)
    ]
    assert found == [], "a path of one machine; say what it is instead:\n" + "\n".join(found)


def test_the_check_finds_machine_paths():
    # spelled in parts: tests/test_variables.py looks for such paths in code
    home, root, work = "/" + "home", "/" + "root", "/" + "work"
    for path in (f"{work}/.mirror", f"{root}/x", f"{home}/alice/data", "/tmp/session/out"):
        assert MACHINE_PATH.search(f"with `DDLC_SOURCES={path}` here"), path
    for fine in (
        "/tmp/ddl-compare.measure.lock",
        "~/." + "cache/ddl-compare",
        f"https://x.org{home}/a",
    ):
        assert not MACHINE_PATH.search(fine), fine


def sentences(path):
    """A document's sentences; code's lines (its comments and messages
    seldom end in a full stop)."""
    if path.suffix in (".py", ".sh"):
        return path.read_text().splitlines()
    text = re.sub(r"\s+", " ", path.read_text().replace("#", " "))
    return re.split(r"(?<=[.!?])\s", text)


# Code and tests state no build time either: their messages link to the doc.
CODE = [
    path
    for folder in ("envs", "ddlcompare", "frameworks", "front", "runfiles", "tests", "bench")
    for pattern in ("*.sh", "**/*.py")
    for path in sorted((REPO / folder).glob(pattern))
]


def test_build_times_are_stated_once():
    """How long Tarantella's and LBANN's builds take is said in one place
    each, envs/tarantella.md and docs/frameworks.md ("LBANN's build"); the
    other documents, and the code's messages and comments for Tarantella's
    figure, link there."""
    documents = [*DOCS, REPO / "design.yaml"]
    facts = {
        "tarantella": (
            re.compile(
                r"build-tarantella|setup\.sh tarantella|builds? Tarantella|Tarantella, about"
                r"|Tarantella's build"
            ),
            re.compile(r"\babout \d+ min"),
            "envs/tarantella.md",
            documents + CODE,
        ),
        "lbann": (
            re.compile(r"build-lbann|LBANN's build"),
            re.compile(r"\bhours\b"),
            "docs/frameworks.md",
            documents,
        ),
    }
    stated = [
        f"{path.relative_to(REPO)} ({name}): {sentence}"
        for name, (about, duration, home, paths) in facts.items()
        for path in paths
        if str(path.relative_to(REPO)) != home
        for sentence in sentences(path)
        if about.search(sentence) and duration.search(sentence)
    ]
    assert stated == [], "\n".join(stated)
