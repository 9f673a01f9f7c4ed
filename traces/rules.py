"""Region name -> phase through the versioned rules file ``traces/rules.yaml``."""

from __future__ import annotations

import functools
import re
import re._parser as sre  # the stdlib's own parse of a pattern, for its literals
import threading
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

import numpy as np
import yaml

from runfiles import files
from runfiles.phases import MARKERS, PHASES

RULES_FILE = Path(__file__).with_name("rules.yaml")


class RulesError(ValueError):
    pass


NO_MATCH: tuple[str | None, str | None] = (None, None)
UNSEEN = -2  # in first_rules: a region not in the cache yet


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern
    phase: str
    collective: str | None
    sources: tuple[str, ...] | None
    # what match() gives for it, one tuple for every region it names
    found: tuple[str | None, str | None] = field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "found", (self.phase, self.collective))

    @functools.cached_property
    def needs(self) -> tuple[str, ...] | None:
        """Lower-case strings one of which every match holds (see _needs):
        parsed when first asked (by first_rules, under its lock), not when
        the rules are loaded: a second parse of every pattern, about a third
        of loading them, which ``ddlc import`` does before it reads anything."""
        return _needs_of(self.pattern)


class PhaseRules:
    """The rules of one file; ``match`` is cached per (region, source)."""

    def __init__(self, path: Path = RULES_FILE):
        """The rules of ``path``; whether the sources they name are readers
        is check_sources' question (the readers are a layer above)."""
        self.path = Path(path)
        doc = _load(self.path)
        self.version = doc["version"]
        self.rules = [_rule(self.path, i, entry) for i, entry in enumerate(doc["rules"])]
        # source -> region -> the index of its first rule (-1: none): small
        # ints, so that a trace's many names add no objects to collect
        self._cache: dict[str, dict[str, int]] = {}
        # first_rules' last (source, regions, answer): a reader and the
        # table ask it of the same names, and the files of one trace of
        # each other's (a Kineto trace: some 30,000 names a file)
        self._last: tuple | None = None
        # the files of a folder are read in threads (traces/convert.py), and
        # their first files ask for the same new names at about the same
        # time: one matches them, the other waits and finds them cached
        # (each matched the bench's 31,000 names, 0.07 s, in turn: the GIL)
        self._lock = threading.Lock()

    def check_sources(self, known) -> None:
        """Raises RulesError naming the first rule whose ``sources`` names a
        reader not in ``known`` (traces/readers asks it with its readers)."""
        known = frozenset(known)
        for index, rule in enumerate(self.rules):
            if rule.sources and not known.issuperset(rule.sources):
                raise RulesError(
                    f"{self.path}: rule {index + 1}: 'sources' must be a list of "
                    f"{', '.join(sorted(known))}"
                )

    def match(self, region: str, source: str) -> tuple[str | None, str | None]:
        """(phase, collective) of the first matching rule; (None, None) when
        no rule matches (the region then takes its parent's phase)."""
        cache = self._cache.setdefault(source, {})
        first = cache.get(region)
        if first is None:
            first = cache[region] = self._first(region, source)
        return self.rules[first].found if first >= 0 else NO_MATCH

    def first_rules(self, regions: list, source: str) -> np.ndarray:
        """The index in ``rules`` of each region's first matching rule, -1
        where none matches. The regions not seen yet go through the rules a
        rule at a time: each rule searches only the regions no rule before
        it matched that hold one of the strings it needs (found in all of
        them at once), not every region; the five case-insensitive
        collective rules cost most where every region was searched by every
        rule (a trace of 30,000 distinct names)."""
        with self._lock:
            return self._first_rules(regions, source)

    def _first_rules(self, regions: list, source: str) -> np.ndarray:
        last = self._last
        if isinstance(regions, list) and last and last[0] == source and last[1] == regions:
            return last[2].copy()  # list equality: the same str objects compare at once
        cache = self._cache.setdefault(source, {})
        first = np.fromiter(map(cache.get, regions, repeat(UNSEEN)), np.int64, len(regions))
        unseen = np.flatnonzero(first == UNSEEN)
        if unseen.size:
            new = [r for r in dict.fromkeys(regions[i] for i in unseen) if isinstance(r, str)]
            cache.update(zip(new, self._first_matches(new, source)))
            first[unseen] = [
                cache[regions[i]] if regions[i] in cache else self._first(regions[i], source)
                for i in unseen.tolist()
            ]
        if isinstance(regions, list):
            self._last = (source, list(regions), first.copy())
        return first

    def _first(self, region: str, source: str) -> int:
        return next((i for i, r in self._of(source) if r.pattern.search(region)), -1)

    def _first_matches(self, regions: list[str], source: str) -> list[int]:
        # the strings a rule needs are looked for in lower case, which only
        # ASCII names allow (a case-insensitive pattern's k matches the
        # Kelvin sign): the others are searched by every rule
        other = np.array([not r.isascii() for r in regions], dtype=bool)
        holding = _Holding([r.lower() if r.isascii() else "" for r in regions])
        found = [-1] * len(regions)
        left = np.arange(len(regions))
        for index, rule in self._of(source):
            if left.size == 0:
                break
            maybe = (
                left if rule.needs is None else left[other[left] | holding.any(rule.needs)[left]]
            )
            search = rule.pattern.search
            matched = [i for i in maybe.tolist() if search(regions[i])]
            for i in matched:
                found[i] = index
            left = np.setdiff1d(left, matched, assume_unique=True)
        return found

    def _of(self, source: str) -> list[tuple[int, Rule]]:
        """The rules of a source, with their index in ``rules``."""
        return [
            (i, r) for i, r in enumerate(self.rules) if r.sources is None or source in r.sources
        ]


def _load(path: Path) -> dict:
    try:
        # libyaml's loader where PyYAML has it: a tenth of the pure Python's time;
        # read bounded and regular: a FIFO or /dev/zero is refused
        doc = yaml.load(files.read_text(path), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RulesError(f"{path}: cannot read the phase rules: {exc}") from None
    except RecursionError:
        raise RulesError(f"{path}: nested too deep to be phase rules") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("version"), int)
        or not isinstance(doc.get("rules"), list)
    ):
        raise RulesError(f"{path}: expected 'version: <integer>' and 'rules: [...]'")
    return doc


def _rule(path: Path, index: int, entry) -> Rule:
    where = f"{path}: rule {index + 1}"
    if not isinstance(entry, dict) or "pattern" not in entry or "phase" not in entry:
        raise RulesError(f"{where}: each rule needs 'pattern' and 'phase'")
    if entry["phase"] not in (*PHASES, *MARKERS):
        raise RulesError(
            f"{where}: unknown phase {entry['phase']!r} (allowed: {', '.join((*PHASES, *MARKERS))})"
        )
    sources = entry.get("sources")
    if sources is not None and (
        not isinstance(sources, list) or not all(isinstance(s, str) for s in sources)
    ):
        raise RulesError(f"{where}: 'sources' must be a list of reader names")
    try:
        pattern = re.compile(entry["pattern"])
    except re.error as exc:
        raise RulesError(f"{where}: bad pattern {entry['pattern']!r}: {exc}") from None
    return Rule(
        pattern, entry["phase"], entry.get("collective"), tuple(sources) if sources else None
    )


class _Holding:
    """Which of some texts hold a string: each string is found in all of
    them joined by newlines (one fast search over the whole), not text by
    text; a string with a newline is said to be in every text. A string
    without digits is found in the texts' distinct forms without digits
    (it is in a text only where it is in its form; a form may hold it where
    its text does not, which the patterns' search then tells): the names of
    a trace often differ only by their numbers (a model's layers, its
    kernels' instances), and 31,000 such names of the Kineto bench make a
    handful of forms to search, not 31,000 names, each hit a step of
    Python."""

    def __init__(self, texts: list[str]):
        self.joined = "\n".join(texts)
        self.n = len(texts)
        self._lengths = [len(t) for t in texts]
        self._starts: np.ndarray | None = None
        self._found: dict[str, np.ndarray] = {}
        forms = self.joined.encode("utf-8", "surrogatepass").translate(None, DIGITS).split(b"\n")
        self.form_of: np.ndarray | None = None
        if len(forms) == self.n:  # else a text holds a newline: every search on the texts
            distinct = dict.fromkeys(forms)
            codes = dict(zip(distinct, range(len(distinct))))
            self.form_of = np.fromiter(map(codes.__getitem__, forms), np.int64, self.n)
            self.forms = _Texts(b"\n".join(distinct), list(distinct))

    def any(self, needs) -> np.ndarray:
        """Whether each text holds one of ``needs``."""
        out = np.zeros(self.n, dtype=bool)
        for needed in needs:
            out |= self._of(needed)
        return out

    def _of(self, needed: str) -> np.ndarray:
        found = self._found.get(needed)
        if found is None:
            if "\n" in needed:
                found = np.ones(self.n, dtype=bool)
            elif self.form_of is not None and not any(d in needed for d in DIGIT_TEXTS):
                found = self.forms.holding(needed.encode())[self.form_of]
            else:
                if self._starts is None:
                    self._starts = _starts(self._lengths)
                found = _hits(self.joined, needed, self._starts, self.n)
            self._found[needed] = found
        return found


DIGITS = b"0123456789"
DIGIT_TEXTS = tuple("0123456789")


class _Texts:
    """Distinct byte strings joined by newlines."""

    def __init__(self, joined: bytes, texts: list[bytes]):
        self.joined, self.n = joined, len(texts)
        self.starts = _starts([len(t) for t in texts])

    def holding(self, needed: bytes) -> np.ndarray:
        return _hits(self.joined, needed, self.starts, self.n)


def _starts(lengths: list[int]) -> np.ndarray:
    """Where each of texts of these lengths begins, joined by newlines."""
    return np.cumsum([0] + [n + 1 for n in lengths[:-1]])


def _hits(joined, needed, starts: np.ndarray, n: int) -> np.ndarray:
    """Whether each of the ``n`` texts joined in ``joined`` (beginning at
    ``starts``) holds ``needed``."""
    found = np.zeros(n, dtype=bool)
    at, hits = joined.find(needed), []
    while at >= 0:
        hits.append(at)
        at = joined.find(needed, at + 1)
    found[np.searchsorted(starts, hits, side="right") - 1] = True
    return found


def _needs_of(pattern: re.Pattern) -> tuple[str, ...] | None:
    """Lower-case strings one of which is in every region the pattern
    matches (``all_?reduce|quick_?reduce``: "reduce"), so that a region
    holding none of them need not be searched; None where the pattern's
    parse (the stdlib's) shows none."""
    try:
        needs = _needs(sre.parse(pattern.pattern, pattern.flags))
    except Exception:  # a parse of another Python's: every region is searched
        return None
    return tuple(sorted(needs)) if needs else None


def _needs(items) -> set[str] | None:
    """Of a parsed sequence: the set of strings of one of its parts that
    every match must hold (the longest such set), or None. Only literal
    runs, groups, alternatives and repeats of at least one count; an
    assertion or a class needs nothing."""
    sets: list[set[str]] = []
    run: list[str] = []
    inner: set[str] | None
    for op, arg in [*items, (None, None)]:
        if op is sre.LITERAL:
            run.append(chr(arg))
            continue
        text = "".join(run)
        if text.isascii() and text:
            sets.append({text.lower()})
        run = []
        if op is sre.SUBPATTERN:
            inner = _needs(arg[-1])
        elif op is sre.BRANCH:
            branches = [_needs(branch) for branch in arg[1]]
            inner = set().union(*branches) if all(branches) else None  # type: ignore[arg-type]
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and arg[0] >= 1:
            inner = _needs(arg[2])
        else:
            inner = None
        if inner:
            sets.append(inner)
    return max(sets, key=lambda s: min(map(len, s)), default=None)
