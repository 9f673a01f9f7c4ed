"""The second stage of a study: the telling cells of a finished first stage,
run again instrumented and with more replications.

``ddlc follow-up`` reads the first stage's tables (runs.parquet,
step_phases.parquet), picks cells by the rule below and writes a design
file whose ``follow_up`` key records where it came from. The follow-up is an
ordinary design: ``exclude`` rules keep exactly the chosen cells, so
``ddlc plan`` and the workflow need nothing new.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import yaml

from analysis import summary
from analysis.section import Code, Link, Section
from analysis.stage_limits import FOLLOW_UP_MIN_REPLICATIONS
from ddlcompare.plan.design import Design
from frameworks import registry
from runfiles.tables import read_runs, read_table

RULE = (
    "per framework, its best and worst cell by throughput; the scale and setting where "
    "the frameworks differ most (largest relative gap between the fastest and the "
    "slowest); the cells with the strongest bottleneck finding (largest share of the "
    "step in exposed gradient exchange or data loading). Over the run budget, cells "
    "are kept in this order: best cells, strongest bottlenecks, largest differences, "
    "worst cells; a cell with more reasons before one with fewer"
)
# The reasons' ranks when the budget keeps only some cells: the best cells
# answer the question, the bottlenecks say why, the worst cells (mostly one
# process, where nothing is exchanged) tell least.
PRIORITY = ("best cell", "strongest bottleneck", "frameworks differ most", "worst cell")
STRONGEST = 2  # cells taken for their bottleneck finding
# One epoch of at most STEPS steps: the phases and the throughput of a step
# are what the second stage looks at (throughput is per measured step, after
# warmup_steps, so it compares with the first stage's), and short traced runs
# let both stages of the default study fit the main job's time.
EPOCHS = 1
STEPS = 100


def cell_means(design: Design, runs: pd.DataFrame) -> pd.DataFrame:
    """Mean throughput per cell of the design (its factors' levels)."""
    ok = summary.ok_runs(runs)
    keys = [f for f in design.factors if f in ok]
    means = (
        ok.groupby(keys, dropna=False)
        .agg(
            images_per_s=("images_per_s", "mean"),
            world_size=("world_size", "first"),
            setting=("setting", "first"),
        )
        .reset_index()
    )
    return means.dropna(subset=["images_per_s"])


def select(design: Design, runs: pd.DataFrame, found: pd.DataFrame) -> pd.DataFrame:
    """The chosen cells, one row each, with the reasons they were chosen,
    the most telling first (PRIORITY)."""
    means = cell_means(design, runs)
    keys = [f for f in design.factors if f in means]
    reasons: dict[tuple, list[str]] = {}

    def take(row, why: str) -> None:
        reasons.setdefault(tuple(row[k] for k in keys), []).append(why)

    for framework, group in means.groupby("framework"):
        take(group.loc[group["images_per_s"].idxmax()], f"best cell of {framework}")
        if len(group) > 1:
            take(group.loc[group["images_per_s"].idxmin()], f"worst cell of {framework}")
    spread = means.groupby(["world_size", "setting"])["images_per_s"].agg(
        lambda s: (s.max() - s.min()) / s.max() if len(s) > 1 and s.max() else math.nan
    )
    if spread.notna().any():
        scale, setting = spread.idxmax()
        widest = means[(means["world_size"] == scale) & (means["setting"] == setting)]
        for _, row in widest.iterrows():
            take(row, f"frameworks differ most here ({spread.max():.0%} apart)")
    dominant = summary.dominant_bottlenecks(found)
    dominant = dominant[dominant["bottleneck"] != "compute"]
    # no run measured: an empty column of no type, which nlargest refuses
    dominant = dominant.astype({"share": float}).nlargest(STRONGEST, "share")
    for _, finding in dominant.iterrows():
        match = means[
            (means["framework"] == finding["framework"])
            & (means["world_size"] == finding["world_size"])
            & (means["setting"] == finding["setting"])
        ]
        for _, row in match.iterrows():
            take(row, f"strongest bottleneck: {finding['sentence']}")
    ranked = sorted(reasons.items(), key=lambda item: _rank(item[1]))  # stable
    return pd.DataFrame(
        [{**dict(zip(keys, key)), "reasons": "; ".join(why)} for key, why in ranked]
    )


def _rank(reasons: list[str]) -> tuple[int, int]:
    """The cell's most important reason first, then how many reasons it has."""
    first = min(i for i, rule in enumerate(PRIORITY) for why in reasons if why.startswith(rule))
    return (first, -len(reasons))


def instruments(frameworks: list[str]) -> dict:
    """Score-P where it is installed and every chosen framework can run it
    (MPI-started Horovod), else our OTF2 writer; Horovod's Timeline and the
    PyTorch profiler where a chosen framework has them, and the phases of a
    step its own fit runs (Tarantella's fit_step_phases)."""
    infos = [registry.FRAMEWORKS[f] for f in frameworks]
    scorep = shutil.which("scorep") and importlib.util.find_spec("scorep") is not None
    mpi_horovod = all(i.launcher == "horovodrun" for i in infos)
    settings: dict[str, str | bool] = {"tracer": "scorep" if scorep and mpi_horovod else "otf2"}
    if settings["tracer"] == "scorep":
        settings["horovod_controller"] = "mpi"
    if any(i.launcher == "horovodrun" for i in infos):
        settings["horovod_timeline"] = True
    if any(i.family == "torch" for i in infos):
        settings["torch_profiler"] = True
    if any(i.owns_step for i in infos):
        settings["fit_step_phases"] = True
    return settings


def design_doc(
    design: Design,
    runs: pd.DataFrame,
    found: pd.DataFrame,
    tables: Path,
    replications: int | None = None,
    max_runs: int | None = None,
) -> dict:
    """The follow-up design as design.yaml's mapping: at most ``max_runs``
    runs (default: as many as the first stage planned, at least one cell;
    each is a short one)."""
    chosen = select(design, runs, found)
    if chosen.empty:
        raise ValueError("no successful run in the first stage: nothing to follow up")
    # one more than the first stage's, at least FOLLOW_UP_MIN_REPLICATIONS
    replications = replications or max(FOLLOW_UP_MIN_REPLICATIONS, design.replications + 1)
    # by default as many runs as the first stage planned, and at least one cell
    budget = max(len(design.runs()), replications) if max_runs is None else max_runs
    if budget < replications:
        raise ValueError(
            f"a budget of {budget} runs is less than one cell's {replications} "
            f"replications: raise --max-runs or lower --replications"
        )
    chosen, left_out = chosen.head(budget // replications), chosen.iloc[budget // replications :]
    keys = [c for c in chosen.columns if c != "reasons"]
    factors = {f: [lv for lv in design.factors[f] if lv in set(chosen[f])] for f in keys}
    picked = {tuple(row[f] for f in keys) for _, row in chosen.iterrows()}
    exclude = [dict(zip(keys, combo)) for combo in _product(factors, keys) if combo not in picked]
    from ddlcompare.plan.params import PARAMS

    fixed = {
        k: v for k, v in design.fixed.items() if k not in factors and v != PARAMS[k].default
    }  # defaults stay implicit
    fixed.update(instruments(factors["framework"]))
    if "epochs" not in factors:
        fixed["epochs"] = min(EPOCHS, design.fixed.get("epochs", EPOCHS))
    if "max_steps" not in factors:
        fixed["max_steps"] = min(STEPS, design.fixed.get("max_steps") or STEPS)
    return {
        "name": f"{design.name}-follow-up",
        "factors": factors,
        "fixed": _plain(fixed),
        "replications": replications,
        "seed": design.seed,
        "randomize": design.randomize,
        "exclude": _plain(exclude),
        "zip": [],
        "follow_up": origin(
            design,
            tables,
            RULE,
            budget,
            _plain(chosen.to_dict("records")),
            _plain(left_out.to_dict("records")),
        ),
    }


def origin(design: Design, tables: Path, rule: str, max_runs: int, chosen, left_out) -> dict:
    """A second stage's ``follow_up`` record: where it came from and why."""
    return {
        "design": str(Path(design.source).resolve()),
        "name": design.name,
        "settings_hash": design.settings_hash,
        "tables": str(tables.resolve()),
        "rule": rule,
        "max_runs": max_runs,
        "cells": chosen,
        "left_out": left_out,
    }


def located(doc: dict, folder: Path) -> dict:
    """``doc`` with its follow_up record's paths relative to ``folder``, where
    the design is written: a clone elsewhere, or a committed design, still
    finds its first stage."""
    origin = doc["follow_up"]
    moved = {k: os.path.relpath(origin[k], folder.resolve()) for k in ("design", "tables")}
    return {**doc, "follow_up": {**origin, **moved}}


def first_stage(design: Design, key: str) -> Path:
    """A path the design's follow_up record names (its ``design`` or
    ``tables``), read against the design's own folder."""
    if design.follow_up is None:
        raise ValueError(f"design {design.name!r} is no follow-up: it names no first stage")
    return Path(design.source).parent / design.follow_up[key]


def _product(factors: dict, keys: list[str]):
    import itertools

    return itertools.product(*(factors[k] for k in keys))


def _plain(value):
    """numpy scalars as Python values, so that YAML writes plain numbers."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value  # YAML's null


def write(
    design: Design,
    tables: Path,
    out: Path,
    replications: int | None = None,
    max_runs: int | None = None,
) -> dict:
    from analysis import bottlenecks
    from runfiles.atomic import write_text

    runs = read_runs(tables / "runs.parquet", design.factors)
    found = bottlenecks.findings(read_table(tables / "step_phases.parquet"), runs)
    doc = located(design_doc(design, runs, found, tables, replications, max_runs), out.parent)
    header = (
        f"# The follow-up of {design.name} (written by ddlc follow-up): the cells\n"
        f"# chosen by the rule in follow_up.rule, instrumented, with more replications.\n"
    )
    write_text(out, header + yaml.safe_dump(doc, sort_keys=False))
    return doc


def _instrumented(fixed: dict) -> str:
    parts = [f"tracer {fixed.get('tracer', 'none')}"]
    if fixed.get("horovod_timeline"):
        parts.append("Horovod Timeline")
    if fixed.get("torch_profiler"):
        parts.append("PyTorch profiler")
    if fixed.get("fit_step_phases"):
        parts.append("Tarantella's step phases")
    return " + ".join(parts)


def tracing_cost(design: Design, runs: pd.DataFrame, first: pd.DataFrame) -> pd.DataFrame:
    """Per cell: throughput in the first stage and in this one, and the
    share lost to the follow-up's instruments."""
    from analysis import stats

    keys = [f for f in design.factors if f in runs and f in first]
    rows = []
    for key, cell in summary.ok_runs(runs).groupby(keys):
        key = key if isinstance(key, tuple) else (key,)
        before = summary.ok_runs(first)
        for k, v in zip(keys, key):
            before = before[before[k] == v]
        traced, traced_half, n = stats.mean_ci(cell["images_per_s"])
        plain, plain_half, m = stats.mean_ci(before["images_per_s"])
        rows.append(
            {
                **dict(zip(keys, key)),
                "first_stage_images_per_s": plain,
                "first_stage_images_per_s_ci": plain_half,
                "first_stage_runs": m,
                "follow_up_images_per_s": traced,
                "follow_up_images_per_s_ci": traced_half,
                "follow_up_runs": n,
                "tracing_cost": 1 - traced / plain if m and plain else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def section(ctx) -> Section:
    """The report's two-stage section: in a first stage, how to get the
    second; in a follow-up, the link back and the tracing cost per cell."""
    out = Section("stages", "Two stages")
    origin = ctx.design.follow_up
    if not origin:
        return out.para(
            "This is a first stage. ",
            Code(f"./ddlc follow-up --design {ctx.design.source}"),
            f" writes the second: the cells chosen by this rule, {RULE}; run instrumented "
            f"(Score-P where installed, else OTF2; Horovod Timeline and the PyTorch profiler "
            f"where they apply) with more replications, one epoch of at most {STEPS} steps "
            f"each, and at most as many runs as this stage (",
            Code("--max-runs"),
            "). ",
            Code("./ddlc two-stage"),
            " runs both.",
        )
    first_tables = first_stage(ctx.design, "tables")
    report = first_tables.parent / "report.html"
    link = (
        Link("its report", report.resolve().as_uri())
        if report.exists()
        else "its report (not found where it was)"
    )
    out.para(
        "Follow-up of ",
        Code(origin["name"]),
        " (",
        Code(origin["design"]),
        ", settings ",
        Code(origin["settings_hash"]),
        "): ",
        link,
        f". Cells chosen by the rule: {origin['rule']}.",
    )
    out.table(pd.DataFrame(origin.get("cells", [])), caption="chosen cells")
    if origin.get("left_out"):
        out.table(
            pd.DataFrame(origin["left_out"]),
            caption=f"cells the rule chose but the budget of {origin['max_runs']} runs left out",
        )
    if not (first_tables / "runs.parquet").exists():
        return out.para("The first stage's tables are gone: no tracing cost.")
    first = read_table(first_tables / "runs.parquet")
    first_tracer = (
        first["tracer"].dropna().iloc[0]
        if "tracer" in first and first["tracer"].notna().any()
        else "none"
    )
    cost = tracing_cost(ctx.design, ctx.runs, first)
    out.para(
        f"Throughput per cell, first stage (tracer {first_tracer}) "
        f"against this follow-up ({_instrumented(ctx.design.fixed)}); "
        f"tracing_cost is the share of throughput the follow-up's instruments cost "
        f"(negative: the follow-up ran faster, within noise)."
    )
    return out.table(cost, caption="tracing cost per cell")
