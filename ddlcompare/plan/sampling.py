"""Latin hypercube samples of the numeric factors' grid (McKay, Beckman and
Conover 1979), for designs whose full grid is too large to run.

In design.yaml, next to ``factors``::

    design: latin-hypercube
    samples: 8

The numeric factors with two levels or more (batch_size, learning_rate,
...) are sampled: pydoe's ``lhs`` draws ``samples`` points in the unit cube
from the design's seed, exactly one in each of ``samples`` equal slices of
every axis. A point's coordinate u on a factor with L levels picks its
level floor(u L) in increasing order, so every level is taken equally often
where ``samples`` is a multiple of L (near-equally otherwise), and a large
grid is covered evenly by a few runs. The other factors (framework,
dataset, ... and numeric factors with one level) are crossed with every
point: each framework runs at the same points, so they compare cell for
cell. Points that fall on the same combination of levels run once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

KIND = "latin-hypercube"
KEYS = {"samples": f"with design: {KIND}, the number of points sampled (an integer >= 2)"}
MAX_SAMPLES = 10_000


@dataclass(frozen=True)
class Sample:
    factors: tuple[str, ...]  # the sampled numeric factors, in design order
    points: tuple[tuple[Any, ...], ...]  # distinct points, in the order drawn
    samples: int  # points drawn (duplicates included)

    def others(self, levels: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {f: v for f, v in levels.items() if f not in self.factors}

    def cells_per_replication(self, levels: dict[str, list[Any]]) -> int:
        combinations = 1
        for values in self.others(levels).values():
            combinations *= len(values)
        return len(self.points) * combinations

    def cells(self, levels: dict[str, list[Any]]) -> list[dict[str, Any]]:
        """Every point crossed with every combination of the other factors."""
        others = self.others(levels)
        return [
            {**dict(zip(self.factors, point)), **dict(zip(others, combination))}
            for point in self.points
            for combination in itertools.product(*others.values())
        ]

    def describe(self, levels: dict[str, list[Any]]) -> list[str]:
        crossed = [f for f, v in self.others(levels).items() if len(v) > 1]
        repeated = self.samples - len(self.points)
        lines = [
            f"latin hypercube: {self.samples} samples of {', '.join(self.factors)}"
            + (
                f", {len(self.points)} distinct ({repeated} drawn twice run once)"
                if repeated
                else ""
            )
            + (f", crossed with every {' x '.join(crossed)}" if crossed else "")
            + f": {self.cells_per_replication(levels)} cells per replication",
        ]
        lines += [
            "  " + ", ".join(f"{f}={v}" for f, v in zip(self.factors, point))
            for point in self.points
        ]
        return lines


def numeric(levels: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in levels)


def parse(
    raw: dict, factors: dict[str, list[Any]], seed: int, problems: list[str]
) -> Sample | None:
    """The sample a design.yaml asks for (design: latin-hypercube), or None.
    Problems are appended as one line each, naming the key and the fix."""
    if raw.get("design") != KIND:
        if "samples" in raw:
            problems.append(f"samples: only with 'design: {KIND}'; add it or remove samples")
        return None
    for key in ("zip", "exclude", "resolution", "generators"):
        if raw.get(key):
            problems.append(f"{key}: cannot be combined with design: {KIND}; remove it")
    samples = raw.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool) or not 2 <= samples <= MAX_SAMPLES:
        problems.append(
            f"samples: design: {KIND} needs samples: N, an integer from 2 to "
            f"{MAX_SAMPLES}, got {samples!r}"
        )
        return None
    sampled = [f for f, v in factors.items() if len(v) > 1 and numeric(v)]
    if not sampled:
        problems.append(
            f"design: {KIND} samples numeric factors with two levels or more "
            "(batch_size: [16, 32, 64], ...), and this design has none; use design: full"
        )
        return None
    from pydoe import lhs

    unit = lhs(len(sampled), samples=samples, seed=seed)
    ordered = [sorted(factors[f]) for f in sampled]
    points = [
        tuple(levels[min(int(u * len(levels)), len(levels) - 1)] for u, levels in zip(row, ordered))
        for row in unit
    ]
    return Sample(factors=tuple(sampled), points=tuple(dict.fromkeys(points)), samples=samples)
