"""Fractional factorial 2^(k-p) designs for screening (Jain, ch. 19).

In design.yaml, next to ``factors``::

    design: fractional      # full (the default) | fractional
    resolution: 3           # the smallest fraction of that resolution, or:
    generators: ["D = A B", "E = A C", "F = B C", "G = A B C"]

Every varied factor has two levels; the first listed is -1, the second +1.
Letters name the two-level factors in the order they are listed (A the
first); a generator may also use the factors' names. Factors with one
level are constants of the fraction.

The matrix comes from ``pydoe`` (PyPI), the maintained successor of pyDOE2:
the project card asked for pyDOE2, which is unmaintained and fails on
Python >= 3.12; pydoe keeps its functions (fracfact, fracfact_by_res).
pydoe's row order is its own (the last base factor varies fastest), so rows
become cells through their signs, never through their position, and every
effect is computed from the cells' own levels.
"""

from __future__ import annotations

import itertools
import re
import string
from dataclasses import dataclass
from typing import Any

import numpy as np

KEYS = {
    "design": "full (every combination, the default), fractional (a 2^(k-p) fraction) "
    "or latin-hypercube (samples of the numeric factors)",
    "resolution": "with design: fractional, the smallest fraction of this resolution (>= 3)",
    "generators": "with design: fractional, e.g. [\"D = A B\", \"E = A C\"]",
}
SHOWN_ORDER = 2  # alias chains show interactions up to this order, then a count


@dataclass(frozen=True)
class Fraction:
    factors: tuple[str, ...]  # the two-level factors, in design order (A, B, ...)
    matrix: tuple[tuple[int, ...], ...]  # one row per cell, one +-1 column per factor

    @property
    def letters(self) -> dict[str, str]:
        return dict(zip(self.factors, string.ascii_uppercase))

    @property
    def runs_per_replication(self) -> int:
        return len(self.matrix)

    @property
    def p(self) -> int:
        return len(self.factors) - int(np.log2(len(self.matrix)))

    def cells(self, levels: dict[str, list[Any]]) -> list[dict[str, Any]]:
        """The fraction's cells as factor -> level (-1: first level, +1: second);
        one-level factors keep their level."""
        constant = {f: v[0] for f, v in levels.items() if f not in self.factors}
        return [
            {
                **{f: levels[f][0 if sign < 0 else 1] for f, sign in zip(self.factors, row)},
                **constant,
            }
            for row in self.matrix
        ]

    def _column(self, term: tuple[str, ...]) -> np.ndarray:
        m = np.array(self.matrix)
        index = [self.factors.index(f) for f in term]
        return np.prod(m[:, index], axis=1)

    def alias_groups(self) -> list[list[tuple[str, ...]]]:
        """Every effect (factor or interaction) grouped with those it cannot
        be told apart from (same column up to sign), lowest order first."""
        groups: dict[bytes, list[tuple[str, ...]]] = {}
        for order in range(1, len(self.factors) + 1):
            for term in itertools.combinations(self.factors, order):
                column = self._column(term)
                key = (column * column[0]).astype(np.int8).tobytes()
                groups.setdefault(key, []).append(term)
        return list(groups.values())

    def defining_relation(self) -> list[tuple[str, ...]]:
        """The words equal to I (constant columns), shortest first."""
        return [t for g in self.alias_groups() for t in g if len(set(self._column(t))) == 1]

    @property
    def resolution(self) -> int | None:
        words = self.defining_relation()
        return min(len(w) for w in words) if words else None  # None: a full factorial

    def estimable(self) -> list[tuple[tuple[str, ...], str]]:
        """One effect per alias group, labelled with its chain: the effects
        the design can separate (the mean's group left out)."""
        out = []
        for group in self.alias_groups():
            if len(set(self._column(group[0]))) == 1:
                continue  # the mean's group: I and the defining words
            out.append((group[0], self.chain(group)))
        return out

    def chain(self, group: list[tuple[str, ...]]) -> str:
        shown = [":".join(t) for t in group if len(t) <= max(SHOWN_ORDER, len(group[0]))]
        rest = len(group) - len(shown)
        return " = ".join(shown) + (f" (+{rest} higher-order)" if rest else "")

    def describe(self) -> list[str]:
        """The alias structure in lines, with letters and names."""
        k, runs = len(self.factors), len(self.matrix)
        letters = self.letters
        word = " = ".join(
            "I" if not w else "".join(letters[f] for f in w)
            for w in [(), *self.defining_relation()]
        )
        lines = [
            f"fractional factorial 2^({k}-{self.p}): {runs} cells per replication, "
            f"resolution {roman(self.resolution)}",
            "letters: " + ", ".join(f"{letters[f]} = {f}" for f in self.factors),
            f"defining relation: {word}",
            "confounded effects (each line is one estimate):",
        ]
        for term, label in self.estimable():
            group = next(g for g in self.alias_groups() if g[0] == term)
            short = " = ".join(
                "".join(letters[f] for f in t)
                for t in group
                if len(t) <= max(SHOWN_ORDER, len(term))
            )
            lines.append(f"  {short}: {label}")
        return lines


def roman(n: int | None) -> str:
    return {None: "full", 3: "III", 4: "IV", 5: "V", 6: "VI", 7: "VII"}.get(n, str(n))


def parse(raw: dict, factors: dict[str, list[Any]], problems: list[str]) -> Fraction | None:
    """The fraction a design.yaml asks for, or None for a full factorial.
    Problems are appended as one line each, naming the key and the fix."""
    kind = raw.get("design", "full")
    if kind not in ("full", "fractional"):
        problems.append(
            f"design: {kind!r} is not a design (use full, fractional or latin-hypercube)"
        )
        return None
    if kind == "full":
        for key in ("resolution", "generators"):
            if key in raw:
                problems.append(f"{key}: only with 'design: fractional'; add it or remove {key}")
        return None
    two = [f for f, levels in factors.items() if len(levels) == 2]
    wrong = [f"{f} has {len(v)}" for f, v in factors.items() if len(v) > 2]
    if wrong:
        problems.append(
            f"design: fractional needs two levels per varied factor "
            f"({', '.join(wrong)}); keep two levels or use design: full"
        )
        return None
    for key in ("zip", "exclude"):
        if raw.get(key):
            problems.append(
                f"{key}: cannot be combined with design: fractional (it would "
                f"break the fraction's balance); remove it"
            )
    if len(two) < 3:
        problems.append(
            f"design: fractional needs at least three two-level factors, "
            f"got {len(two)}; use design: full"
        )
        return None
    has_res, has_gen = "resolution" in raw, "generators" in raw
    if has_res == has_gen:
        problems.append(
            "design: fractional needs exactly one of resolution: N or "
            "generators: [\"D = A B\", ...]"
        )
        return None
    try:
        matrix = (
            _by_resolution(raw["resolution"], len(two))
            if has_res
            else _by_generators(raw["generators"], two)
        )
    except ValueError as exc:
        problems.append(str(exc))
        return None
    return Fraction(factors=tuple(two), matrix=tuple(map(tuple, matrix.astype(int).tolist())))


def _by_resolution(resolution: Any, k: int) -> np.ndarray:
    from pydoe import fracfact_by_res

    if not isinstance(resolution, int) or isinstance(resolution, bool) or resolution < 3:
        raise ValueError(f"resolution: must be an integer >= 3, got {resolution!r}")
    try:
        return fracfact_by_res(k, resolution)
    except ValueError as exc:
        raise ValueError(f"resolution: {exc}") from None


def _by_generators(generators: Any, two: list[str]) -> np.ndarray:
    """pydoe's fracfact from "D = A B" lines: base factors take pydoe's
    letters a, b, ... in design order; the result's columns follow ``two``."""
    from pydoe import fracfact

    if not isinstance(generators, list) or not all(isinstance(g, str) for g in generators):
        raise ValueError("generators: must be a list like [\"D = A B\", \"E = A C\"]")
    letters = dict(zip(string.ascii_uppercase, two))
    defined: dict[str, tuple[str, list[str]]] = {}
    for i, text in enumerate(generators):
        match = re.fullmatch(r"\s*([\w.-]+)\s*=\s*(-?)\s*(.+?)\s*", text)
        if not match:
            raise ValueError(
                f"generators[{i}]: {text!r} is not 'FACTOR = PRODUCT' (e.g. \"D = A B\")"
            )
        target = _name(match.group(1), letters, two, f"generators[{i}]")
        product = [
            _name(token, letters, two, f"generators[{i}]") for token in _tokens(match.group(3), two)
        ]
        if target in defined or target in product:
            raise ValueError(f"generators[{i}]: {target} is defined twice or by itself")
        defined[target] = (match.group(2), product)
    base = [f for f in two if f not in defined]
    if any(f in defined for _, product in defined.values() for f in product):
        raise ValueError(
            "generators: a product may use only base factors (those no generator defines)"
        )
    pydoe_letter = dict(zip(base, string.ascii_lowercase))
    words = [pydoe_letter[f] for f in base] + [
        sign + "".join(sorted(pydoe_letter[f] for f in product))
        for sign, product in defined.values()
    ]
    try:
        matrix = fracfact(" ".join(words))
    except ValueError as exc:
        raise ValueError(f"generators: {exc}") from None
    order = base + list(defined)
    return matrix[:, [order.index(f) for f in two]]


def _tokens(text: str, names: list[str]) -> list[str]:
    """ "A B", "AB" and "batch_size framework" all name factors."""
    out = []
    for token in text.split():
        if token in names or not re.fullmatch(r"[A-Z]+", token):
            out.append(token)
        else:
            out.extend(token)
    return out


def _name(token: str, letters: dict[str, str], two: list[str], key: str) -> str:
    if token in two:
        return token
    if token in letters:
        return letters[token]
    last = string.ascii_uppercase[len(two) - 1]
    raise ValueError(
        f"{key}: {token!r} is neither a letter A-{last} nor a two-level factor ({', '.join(two)})"
    )
