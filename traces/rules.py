"""Region name -> phase through the versioned rules file ``traces/rules.yaml``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from runfiles.phases import MARKERS, PHASES

RULES_FILE = Path(__file__).with_name("rules.yaml")


class RulesError(ValueError):
    pass


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern
    phase: str
    collective: str | None
    sources: tuple[str, ...] | None


class PhaseRules:
    """The rules of one file; ``match`` is cached per (region, source)."""

    def __init__(self, path: Path = RULES_FILE):
        self.path = Path(path)
        doc = _load(self.path)
        self.version = doc["version"]
        self.rules = [_rule(self.path, i, entry) for i, entry in enumerate(doc["rules"])]
        self._cache: dict[tuple[str, str], tuple[str | None, str | None]] = {}

    def match(self, region: str, source: str) -> tuple[str | None, str | None]:
        """(phase, collective) of the first matching rule; (None, None) when
        no rule matches (the region then takes its parent's phase)."""
        key = (region, source)
        found = self._cache.get(key)
        if found is None:
            found = next(
                (
                    (r.phase, r.collective)
                    for r in self.rules
                    if (r.sources is None or source in r.sources) and r.pattern.search(region)
                ),
                (None, None),
            )
            self._cache[key] = found
        return found


def _load(path: Path) -> dict:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RulesError(f"{path}: cannot read the phase rules: {exc}") from None
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
    if sources is not None:
        from traces.readers import names  # the registered readers (they import this module)

        if not isinstance(sources, list) or set(sources) - set(names()):
            raise RulesError(f"{where}: 'sources' must be a list of {', '.join(names())}")
    try:
        pattern = re.compile(entry["pattern"])
    except re.error as exc:
        raise RulesError(f"{where}: bad pattern {entry['pattern']!r}: {exc}") from None
    return Rule(
        pattern, entry["phase"], entry.get("collective"), tuple(sources) if sources else None
    )
