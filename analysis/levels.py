"""A framework's own setting, level by level.

A design may sweep a knob that only some of its frameworks take
(frameworks/knobs.py): designs/tarantella-pause-sweep.yaml sweeps
tarantella-patched's gaspi_sweep_pause_us beside the plain tarantella
build. Each level is then a cell of its own in which no other framework
ran, so the summary's ranking of frameworks within a cell compares
nothing. Here a knob's levels are compared within each framework that
takes it, at each scale (nodes x processes) and other setting: each level
against the framework's baseline (AdapterInfo.baseline: the plain build of
a patched one) where the design ran it there, and the fastest level
against each other level.

The statistics are the report's own: the step time of the slowest rank;
each level's mean with its positive 95 % interval (stats.cell_interval);
each comparison the ratio of the two mean steps, said as a change, with
the 95 % interval of the speedups (stats.ratio_factor), and Welch's test
on log step time (stats.welch); the p-values of every comparison of the
design Holm-adjusted together (stats.holm). Runs measured beside heavy
foreign load are left out, and counted, wherever each level compared keeps
FEWEST_CLEAN clean runs; elsewhere all are kept and the sentence says so.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import cells, conditions, humanize, stats
from analysis.section import Section, Strong
from frameworks import knobs, registry

RESPONSE = "step_mean_s_slowest_rank"
WHERE = ["nodes", "procs_per_node", "world_size", "setting"]
GROUP = ["factor", "framework", *WHERE]
FEWEST_CLEAN = 2  # clean runs each level keeps before loaded runs are left out
ALPHA = 0.05
BASELINE = "baseline"
HEADING = "A framework's own setting, level by level"
HOW = (
    "levels no other framework ran at, compared within the framework: change in step "
    "time against its baseline build and against the fastest level, Holm-adjusted over "
    "those comparisons"
)
FASTEST = "fastest level"


def swept(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """(factor, framework): each framework knob the runs vary, with each
    framework that takes it and has successful runs at two or more of its
    levels."""
    ok = runs[runs["status"] == "ok"]
    found = []
    for factor in knobs.KNOBS:
        if factor not in ok:
            continue
        for framework, group in ok.groupby("framework"):
            takes = (
                framework in registry.FRAMEWORKS and factor in registry.FRAMEWORKS[framework].knobs
            )
            if takes and group[factor].map(cells.level_text).nunique() > 1:
                found.append((factor, str(framework)))
    return found


def involved(runs: pd.DataFrame) -> set[str]:
    """The frameworks whose levels are compared here, and their baselines."""
    found = {framework for _, framework in swept(runs)}
    return found | {registry.FRAMEWORKS[f].baseline for f in found} - {""}


def _arms(runs: pd.DataFrame, factor: str, framework: str) -> pd.DataFrame:
    """The successful runs of ``framework`` and of its baseline with a step
    time, labelled by the setting without ``factor`` and by their ``arm``:
    the level ("10"), or the baseline's name."""
    baseline = registry.FRAMEWORKS[framework].baseline
    labelled = cells.with_scale(cells.with_setting(runs, leave_out=(factor,)))
    ok = labelled[
        (labelled["status"] == "ok")
        & labelled["framework"].isin({framework, baseline})
        & labelled[RESPONSE].notna()
    ]
    arm = np.where(ok["framework"] == framework, ok[factor].map(cells.level_text), ok["framework"])
    return ok.assign(arm=arm)


def _loaded(runs: pd.DataFrame) -> pd.Series:
    if "loaded" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["loaded"].fillna(False).astype(bool)


def _measured(group: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The runs a comparison uses, and what became of the loaded ones."""
    loaded = _loaded(group)
    if not loaded.any():
        return group, ""
    clean = group[~loaded]
    if clean.groupby("arm").size().reindex(group["arm"].unique()).min() >= FEWEST_CLEAN:
        return clean, f"{humanize.count(int(loaded.sum()), 'loaded run')} left out"
    return group, (
        f"{humanize.count(int(loaded.sum()), 'run')} measured beside heavy foreign load kept "
        f"(too few clean runs a level): these figures hold for a busy machine"
    )


def tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(levels, comparisons): per level (and baseline) its runs and mean
    step with its 95 % interval and conditions; per comparison the change
    in step time with its 95 % interval and Welch's p, Holm-adjusted."""
    levels, compared = [], []
    for factor, framework in swept(runs):
        baseline = registry.FRAMEWORKS[framework].baseline
        for key, group in _arms(runs, factor, framework).groupby(WHERE, sort=False):
            own = group[group["framework"] == framework]
            if own["arm"].nunique() < 2:
                continue
            used, loaded = _measured(group)
            where = {"factor": factor, "framework": framework, **dict(zip(WHERE, key))}
            steps = {arm: runs_of[RESPONSE] * 1e3 for arm, runs_of in used.groupby("arm")}
            for arm, runs_of in used.groupby("arm"):
                levels.append(_level(where, arm, runs_of, loaded, used))
            fastest = min((a for a in steps if a != baseline), key=lambda a: steps[a].mean())
            for arm in sorted(steps, key=cells.natural_key):
                if arm == baseline:
                    continue
                if baseline in steps:
                    compared.append(_compare(where, arm, steps, baseline, BASELINE))
                if arm != fastest:
                    compared.append(_compare(where, arm, steps, fastest, FASTEST))
    comparisons = pd.DataFrame(compared)
    if len(comparisons):
        adjusted, reject = stats.holm(comparisons["p_raw"], ALPHA)
        tested = comparisons["p_raw"].notna()
        comparisons = comparisons.assign(
            p_adjusted=adjusted,
            significant=np.where(tested, np.where(reject, "yes", "no"), comparisons["untested"]),
        ).drop(columns="untested")
    return _in_order(pd.DataFrame(levels)), _in_order(comparisons)


def _in_order(table: pd.DataFrame) -> pd.DataFrame:
    """Rows by group, the baseline first, then the levels in numeric order."""
    if table.empty:
        return table
    baseline = table["framework"].map(lambda name: registry.FRAMEWORKS[name].baseline)
    first = table.assign(_level=table["level"] != baseline)
    return cells.in_order(first, [*GROUP, "_level", "level"]).drop(columns="_level")


def _level(where: dict, arm: str, runs: pd.DataFrame, loaded: str, compared: pd.DataFrame) -> dict:
    step, low, high, n = stats.cell_interval(runs.assign(step_ms=runs[RESPONSE] * 1e3), "step_ms")
    taken = runs["runnable_per_core"] >= 1 if "runnable_per_core" in runs else pd.Series()
    return {
        **where,
        "level": arm,
        "runs": n,
        "step_ms": step,
        "step_ms_low": low,
        "step_ms_high": high,
        "loaded_runs": loaded,
        "conditions": conditions.brief(runs, compared),
        "every_core_taken": bool(taken.all()) if len(taken) else None,
    }


def _compare(where: dict, arm: str, steps: dict, other: str, role: str) -> dict:
    """One level against ``other`` (the baseline or the fastest level):
    the change of the mean step, its 95 % interval, Welch's p on log step."""
    mine, theirs = steps[arm], steps[other]
    ratio = mine.mean() / theirs.mean()
    factor = stats.ratio_factor(mine, theirs)
    p, untested = stats.welch(np.log(mine), np.log(theirs))
    return {
        **where,
        "level": arm,
        "against": f"{other} ({role})" if role == BASELINE else f"{other} ({FASTEST})",
        "role": role,
        "runs": len(mine),
        "runs_against": len(theirs),
        "step_ms": mine.mean(),
        "step_ms_against": theirs.mean(),
        "step_change": ratio - 1,
        "step_change_low": ratio / factor - 1,
        "step_change_high": ratio * factor - 1,
        "p_raw": p,
        "untested": untested,
    }


# ------------------------------------------------------------------ words


def sentences(levels: pd.DataFrame, comparisons: pd.DataFrame) -> list[str]:
    """One sentence per framework, factor, scale and other setting: where
    the figures hold, each level against the baseline, the fastest level
    against the others."""
    said: list[str] = []
    if levels.empty:
        return said
    for key, group in levels.groupby(GROUP, sort=False):
        where = dict(zip(GROUP, key))
        mine = comparisons[(comparisons[GROUP] == pd.Series(where)).all(axis=1)]
        runs = group["runs"]
        counted = f"{_span(runs)} runs a level"
        loaded = next((text for text in group["loaded_runs"] if text), "")
        head = (
            f"{where['framework']}'s {where['factor']} at "
            f"{humanize.scale(where['nodes'], where['procs_per_node'])}, {where['setting']} "
            f"({group['conditions'].iloc[0]}; {counted}{', ' + loaded if loaded else ''})"
        )
        parts = []
        against_base = mine[mine["role"] == BASELINE]
        if len(against_base):
            base = against_base["against"].iloc[0].split(" (")[0]
            parts.append(
                f"step time against {base} ({_step(group, base)}): "
                + "; ".join(_change(row) for row in against_base.to_dict("records"))
            )
        fastest = mine.loc[mine["role"] == FASTEST, "against"]
        if len(fastest):
            best = fastest.iloc[0].split(" (")[0]
            parts.append(
                f"Fastest level {best} ({_step(group, best)}), against it: "
                + "; ".join(
                    _change(row) for row in mine[mine["role"] == FASTEST].to_dict("records")
                )
            )
        said.append(f"{head}: {'. '.join(parts)}.")
    return said


def _span(counts: pd.Series) -> str:
    low, high = int(counts.min()), int(counts.max())
    return str(low) if low == high else f"{low} to {high}"


def _step(levels: pd.DataFrame, arm: str) -> str:
    row = levels[levels["level"] == arm].iloc[0]
    text = humanize.number(row["step_ms"], "ms")
    if not math.isfinite(row["step_ms_low"]):
        return text
    low, high = (humanize.number(row[c], "ms") for c in ("step_ms_low", "step_ms_high"))
    return f"{text}, 95 % interval {low} to {high}"


def _signed(share: float) -> str:
    return ("+" if share > 0 else "") + humanize.percent(share)


def _change(row: dict) -> str:
    """'10 -26 % (95 % interval -31 % to -20 %; significant, Holm-adjusted p 0.004)'."""
    interval = ""
    if math.isfinite(row["step_change_low"]):
        interval = (
            f"95 % interval {_signed(row['step_change_low'])} to "
            f"{_signed(row['step_change_high'])}; "
        )
    verdict = row["significant"]
    if verdict in ("yes", "no"):
        word = "significant" if verdict == "yes" else "not significant"
        verdict = f"{word}, Holm-adjusted p {humanize.p_value(row['p_adjusted'])}"
    return f"level {row['level']} {_signed(row['step_change'])} ({interval}{verdict})"


# ---------------------------------------------------------------- section

CAPTIONS = {
    "levels": "each level's step time of the slowest rank, mean and 95 % interval, "
    "over the runs compared, and their conditions",
    "comparisons": "each level against the baseline and against the fastest level: "
    "change in mean step time with its 95 % interval, Welch's p on log step time, "
    "Holm-adjusted over every comparison",
}


def of(ctx) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The tables and sentences, computed once for the summary and the section."""
    if "levels" not in ctx.extra:
        levels, comparisons = tables(ctx.runs)
        ctx.extra["levels"] = (levels, comparisons, sentences(levels, comparisons))
    return ctx.extra["levels"]


def section(ctx) -> Section:
    """A framework's own setting, level by level."""
    levels, comparisons, said = of(ctx)
    out = Section("levels", HEADING)
    if levels.empty:
        return out.para(
            "No framework's own knob (frameworks/knobs.py) has two or more levels among this "
            "design's successful runs: nothing to compare level by level."
        )
    out.para(
        Strong("Levels of a setting only some frameworks take"),
        ": each level is a cell of its own, where no other framework ran, so the summary "
        "ranks nothing there. Here they are compared within the framework: each level "
        "against the framework's baseline build where the design ran it, and the fastest "
        "level against the others. Negative changes are faster. Intervals 95 %; p-values "
        f"Welch's on log step time, Holm-adjusted over all {len(comparisons)} comparisons; "
        "runs measured beside heavy foreign load left out where each level keeps "
        f"{FEWEST_CLEAN} clean runs.",
    )
    out.items(said)
    out.table(levels, caption=CAPTIONS["levels"])
    return out.table(comparisons.drop(columns="role"), caption=CAPTIONS["comparisons"])
