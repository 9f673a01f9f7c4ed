"""replications: auto: enough replications per cell, and no more.

Every cell runs ``min_replications`` times first (round 0). Once a round's
runs are done, the decision of that round (results/<design>/replication/
round-<k>.json) gives each cell whose 95 % interval of the mean throughput
is still wider than ``target_half_width`` of the mean the replications its
first round's spread says it needs (Stein's two-stage rule: the smallest n
whose Stein interval, t at the first round's degrees of freedom and its
spread, meets the target), capped at ``max_replications``; later rounds
only make up for runs that failed. The report gives such a cell Stein's
interval (analysis/stats.py: ``stein_half_width``). Those runs, shuffled with the design's seed and
interleaved across cells, make the next round; the rounds end when no cell
gets more. Cells that met the target, reached the cap, or have fewer than
two successful first-round runs to estimate a spread from get none.

The decisions are files: a workflow started again reads them and redoes
nothing finished (the Snakefile's ``replicate`` checkpoint writes them).
"""

from __future__ import annotations

import collections
import json
import math
import statistics
from pathlib import Path

import pandas as pd

from runfiles.atomic import write_text
from runfiles.names import DONE, METRICS
from runfiles import records
from ddlcompare.plan.design import Adaptive, Design
from ddlcompare.plan.params import RunRow, cell_of
from runfiles import files

RESPONSE = "images_per_s"
CONFIDENCE = 0.95
FOLDER = "replication"


def relative_half_width(n: int, first_stage: list[float]) -> float:
    """Stein's half-width of the mean of n runs (stats.stein_half_width: t
    at the first stage's degrees of freedom, its standard deviation) over
    the first stage's mean; nan below two first-stage values."""
    if len(first_stage) < 2 or not statistics.fmean(first_stage):
        return math.nan
    # Here, not above: scipy and the report's modules load only where a spread
    # is judged, not in every run's start line (the time left's forecast).
    from analysis import stats

    half = stats.stein_half_width(pd.Series(first_stage), n, CONFIDENCE)
    return half / abs(statistics.fmean(first_stage))


def needed(first_stage: list[float], target: float, most: int) -> int:
    """Stein's two-stage rule: the replications a cell needs for an interval
    within ``target`` of its mean, from its first stage alone (at most
    ``most``; as many as the first stage has when fewer than two values
    give no spread). The number depends on the first stage only, so
    Stein's interval over all of them covers at its nominal level; a rule
    that looked again at each round's spread would stop on a spread that
    came out small by chance."""
    n = len(first_stage)
    if n < 2:
        return n
    for m in range(n, max(most, n) + 1):
        if relative_half_width(m, first_stage) <= target:
            return m
    return max(most, n)


def decide(design: Design, planned: dict[str, int], values: dict[str, dict[int, float]]) -> dict:
    """One round's decision: per cell (its ok runs' throughput by
    replication), its replications so far, Stein's interval, and how many
    more it gets (failed runs are made up for); ``add`` lists the next
    round's runs in their (shuffled) execution order."""
    rule = adaptive_rule(design)
    rows, more = [], {}
    for cell, count in planned.items():
        got = values.get(cell, {})
        first = [v for rep, v in got.items() if rep <= rule.least]
        n = len(got)
        rel = relative_half_width(n, first)
        extra = 0
        if len(first) >= 2:
            extra = max(
                0,
                min(rule.most, count + needed(first, rule.target_half_width, rule.most) - n)
                - count,
            )
        more[cell] = extra
        rows.append(
            {
                "cell": cell,
                "replications": count,
                "ok": n,
                RESPONSE: statistics.fmean(got.values()) if n else math.nan,
                "relative_half_width": rel,
                "met": bool(rel <= rule.target_half_width),
                "add": extra,
            }
        )
    add = [
        row.path
        for row in design.runs(most=True)
        if planned.get(cell_of(row), 0)
        < row.rep
        <= planned.get(cell_of(row), 0) + more.get(cell_of(row), 0)
    ]
    return {"rule": rule_of(design), "cells": rows, "add": add}


def adaptive_rule(design: Design) -> Adaptive:
    """The design's replications: auto rule (only such a design has rounds)."""
    if design.adaptive is None:
        raise ValueError(f"design {design.name!r}: replications is not auto, so it has no rounds")
    return design.adaptive


def rule_of(design: Design) -> dict:
    rule = adaptive_rule(design)
    return {
        "target_half_width": rule.target_half_width,
        "min_replications": rule.least,
        "max_replications": rule.most,
    }


def folder(design: Design, results: Path) -> Path:
    return Path(results) / design.root / FOLDER


def round_file(design: Design, results: Path, k: int) -> Path:
    return folder(design, results) / f"round-{k}.json"


def rounds(design: Design, results: Path, upto: int | None = None) -> list[dict]:
    """The decisions taken so far (rounds 0..upto-1 at most), in order; a
    round decided under other settings (target, min, max) ends the list:
    the workflow decides it again."""
    found = []
    k = 0
    while upto is None or k < upto:
        try:
            doc = files.read_json(round_file(design, results, k))
        except (OSError, ValueError):
            break
        if not isinstance(doc, dict) or doc.get("rule") != rule_of(design):
            break
        found.append(doc)
        if not doc.get("add"):
            break
        k += 1
    return found


def planned(design: Design, results: Path, upto: int | None = None) -> list[RunRow]:
    """The runs planned so far: every run of a fixed design; under
    replications: auto, round 0's and those the decisions of rounds before
    ``upto`` (default: all taken) added, in execution order."""
    if not design.adaptive:
        return design.runs()
    added = {path for doc in rounds(design, results, upto) for path in doc["add"]}
    return [r for r in design.runs(most=True) if r.rep <= design.replications or r.path in added]


def forecast(design: Design, results: Path) -> tuple[list[RunRow], dict[str, tuple[int, int]]]:
    """The runs planned so far, and per cell how many more the next round
    may add (fewest, most), for the time left (ddlc plan, ./ddlc run -n).
    Round 0's decision gives all the runs a cell gets beyond the first
    round: a cell whose first-round runs are all done gets exactly what it
    will decide; one not yet done from none up to the cap (how many
    depends on the spread its runs will have). Once round 0 is decided,
    later rounds only make up for failed runs: none are forecast."""
    rows = planned(design, results)
    if not design.adaptive or rounds(design, results, upto=1):
        return rows, {}
    cells = collections.Counter(cell_of(r) for r in rows)  # their planned replications
    unfinished = {cell_of(r) for r in rows if not (Path(results) / r.path / DONE).is_file()}
    decided = {}
    if set(cells) - unfinished:  # the rule judges a cell once its first round is done
        decided = {c["cell"]: c["add"] for c in decide(design, *measured(rows, results))["cells"]}
    most = design.adaptive.most
    return rows, {
        cell: (0, most - n) if cell in unfinished else (decided[cell], decided[cell])
        for cell, n in cells.items()
    }


def measured(
    rows: list[RunRow], results: Path
) -> tuple[dict[str, int], dict[str, dict[int, float]]]:
    """Per cell: its planned replications, and the throughput of its runs
    that finished ok, by replication."""
    counts: dict[str, int] = {}
    values: dict[str, dict[int, float]] = {}
    for row in rows:
        cell = cell_of(row)
        counts[cell] = counts.get(cell, 0) + 1
        run = Path(results) / row.path
        status, problem = records.done_status(run)
        if status != "ok" or problem:
            continue
        try:
            value = files.read_json(run / METRICS)[RESPONSE]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            values.setdefault(cell, {})[row.rep] = float(value)
    return counts, values


def write_round(design: Design, results: Path, k: int, out: Path | None = None) -> dict:
    """Round k's decision, from the runs planned through round k."""
    counts, values = measured(planned(design, results, upto=k), results)
    doc = {"round": k, **decide(design, counts, values)}
    path = out or round_file(design, results, k)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text(Path(path), json.dumps(doc, indent=1) + "\n")
    return doc
