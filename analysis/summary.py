"""The answer first: for each scale (nodes x processes) and setting, the
frameworks ranked by throughput and by time to accuracy with 95 % intervals,
whether each gap between neighbours and each framework's gap to the best
are significant, speedup and efficiency against the framework's smallest
scale, its dominant bottleneck in one sentence, and the cells that need
more replications.

Significance: Welch's t-test between each pair of neighbours in a ranking
and between the best and each framework from the third on (the second's
test against the best is its neighbour test), the p-values of all those
pairs of one response corrected together, one family, with Holm's
step-down method (family-wise error 5 %). Degenerate cases are said
in words, never as a test statistic: a cell with one replication cannot be
tested, and two cells identical in every replication differ exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis import (
    cells,
    conditions,
    critical_path,
    humanize,
    levels,
    phase_recording,
    stats,
    transfer,
)
from analysis.section import Code, Section, Strong

ALPHA = 0.05
CORRECTION = "Holm"  # statsmodels' multipletests method "holm"
SCALE = ["nodes", "procs_per_node", "world_size"]
# Responses ranked in the summary: (column, higher is better, unit).
RANKED = (("images_per_s", True, "images/s"), ("time_to_accuracy_s", False, "s"))
LABELS = {"images_per_s": "Throughput", "time_to_accuracy_s": "Time to accuracy"}
EXPOSED = "exposed communication"
DATA = "data loading"
WAIT = critical_path.WAIT_NAME
QUIET = 0.05  # below this share of the step, no phase is called a bottleneck
# The study's question is about these three (README.md, "The three
# frameworks"): each one's design levels. A design without any of them says
# so in its answer.
STUDIED = {
    "Horovod": ("horovod-torch", "horovod-keras"),
    "LBANN": ("lbann",),
    "Tarantella": ("tarantella", "tarantella-patched"),
}


@dataclass
class Summary:
    headlines: list[str]
    rankings: dict[str, pd.DataFrame]
    bottlenecks: list[str]
    replications: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)  # where the figures hold, said first
    clean_headlines: list[str] = field(default_factory=list)  # ranked on clean runs only
    # a framework's own setting, level against level (analysis/levels.py)
    levels: list[str] = field(default_factory=list)
    # whether the order holds across each other factor (analysis/transfer.py)
    holds: list[str] = field(default_factory=list)
    target: float = stats.NEEDS_MORE_REPLICATIONS  # relative half-width each cell should meet
    correction: str = (
        f"Welch's t-test between neighbours and between the best and each framework "
        f"further down, p-values corrected with {CORRECTION}'s method over all those "
        f"pairs of a response together, family-wise error {ALPHA * 100:g} %"
    )

    @property
    def definitions(self) -> list[str]:
        """What the figures of the "why" sentences are."""
        said = ["Shares are of the mean measured step"]
        if any(WAIT in line for line in self.bottlenecks):
            said.append(f"the {WAIT}: {critical_path.WAIT_DEFINITION}")
        return said

    @property
    def replication_words(self) -> str:
        """The replications in one sentence: how many cells met the target."""
        table = self.replications
        if table is None or table.empty:
            return "no successful run yet."
        met = int((table["met_target"] == "yes").sum())
        target = f"{self.target * 100:g} %"
        if met == len(table):
            return (
                f"every cell's 95 % interval of throughput is within {target} of its mean "
                f"({_span(table['replications'])} replications per cell)."
            )
        return (
            f"{met} of {len(table)} cells met the target of a 95 % interval of throughput "
            f"within {target} of the mean ({_span(table['replications'])} replications per "
            f"cell); the table says which and why not. Where a cell did not, its differences "
            f"to the others are less sure than the target."
        )

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables written as CSV next to the report."""
        return {
            **{f"summary-{name}": t for name, t in self.rankings.items()},
            "summary-replications": self.replications,
        }


def _span(counts: pd.Series) -> str:
    low, high = int(counts.min()), int(counts.max())
    return str(low) if low == high else f"{low} to {high}"


def ok_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The successful runs, labelled as every planned run is (a factor's
    level that no run reached still names the setting)."""
    labelled = cells.with_scale(runs)
    return labelled[labelled["status"] == "ok"]


def ranking(runs: pd.DataFrame, response: str, higher_is_better: bool) -> pd.DataFrame:
    """One row per scale, setting and framework, best first, with the gap to
    the next framework and whether it is significant, and from the third
    on whether its gap to the best is (columns ending in ``_best``)."""
    ok = ok_runs(runs)
    if response not in ok or ok[response].dropna().empty:
        return pd.DataFrame()
    rows = []
    for key, group in ok.groupby([*SCALE, "setting"]):
        per = []
        for framework, cell in group.groupby("framework"):
            mean, low, high, n = stats.cell_interval(cell, response)
            if n:
                per.append((framework, mean, (low, high), n, cell[response]))
        per.sort(key=lambda f: f[1], reverse=higher_is_better)
        for rank, (framework, mean, (low, high), n, values) in enumerate(per, start=1):
            row = {
                **dict(zip([*SCALE, "setting"], key)),
                "rank": rank,
                "framework": framework,
                response: mean,
                f"{response}_low": low,
                f"{response}_high": high,
                "replications": n,
                "next": None,
                f"gap_{response}": math.nan,
                "gap_share": math.nan,
                "p_raw": math.nan,
                "untested": "",
                "p_raw_best": math.nan,
                "untested_best": "",
            }
            if rank < len(per):
                other = per[rank]
                row.update(
                    {
                        "next": other[0],
                        f"gap_{response}": mean - other[1],
                        "gap_share": abs(mean - other[1]) / abs(other[1]) if other[1] else math.nan,
                    }
                )
                row["p_raw"], row["untested"] = stats.welch(values, other[4])
            if rank >= 3:
                row["p_raw_best"], row["untested_best"] = stats.welch(values, per[0][4])
            rows.append(row)
    table = pd.DataFrame(rows)
    return cells.in_order(_correct(table), [*SCALE, "setting", "rank"])


def _correct(table: pd.DataFrame) -> pd.DataFrame:
    """Holm-adjusted p-values over every tested pair of the response, the
    neighbour pairs and the pairs with the best in one family, and a
    verdict in words for each gap."""
    table = table.assign(
        p_adjusted=math.nan, significant="", p_adjusted_best=math.nan, significant_best=""
    )
    family = pd.concat([table["p_raw"].dropna(), table["p_raw_best"].dropna()], keys=["", "_best"])
    if len(family):
        adjusted, reject = stats.holm(family, ALPHA)
        for against in ("", "_best"):
            tested = family.index.get_level_values(0) == against
            rows = family.index[tested].get_level_values(1)
            table.loc[rows, f"p_adjusted{against}"] = adjusted[tested].to_numpy()
            table.loc[rows, f"significant{against}"] = np.where(reject[tested], "yes", "no")
    for against, asked in (("", table["next"].notna()), ("_best", table["rank"] >= 3)):
        untested = table[f"p_raw{against}"].isna() & asked
        table.loc[untested, f"significant{against}"] = table.loc[untested, f"untested{against}"]
    return table.drop(columns=["untested", "untested_best"])


SCALING = [
    "speedup",
    "speedup_low",
    "speedup_high",
    "efficiency",
    "efficiency_low",
    "efficiency_high",
]


def with_scaling(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency against the framework's smallest scale, each
    with its own 95 % interval."""
    if table.empty:
        return table
    scaling = stats.scaling(cells.with_scale(runs))
    if scaling.empty:
        return table
    keep = scaling[["framework", "setting", "world_size", *SCALING]]
    return table.merge(keep, on=["framework", "setting", "world_size"], how="left")


def headline(group: pd.DataFrame, response: str, unit: str, higher_is_better: bool) -> str:
    """One sentence per scale and setting that claims only what the test
    supports: where the gap between the first two is not significant (or
    cannot be tested) it says so first and names no leader."""
    first = group.iloc[0]
    label = LABELS[response]
    where = f"{humanize.scale(first['nodes'], first['procs_per_node'])}, {first['setting']}"
    value = _with_interval(first, response, unit)
    if len(group) == 1:
        return f"{label} at {where}: only {first['framework']} ran: {value}{_scaling_words(first)}."
    second = group.iloc[1]
    both = f"{first['framework']} {value}, {second['framework']} {_with_interval(second, response, unit)}"
    verdict = first["significant"]
    if verdict == "no":
        return (
            f"No significant difference in {label.lower()} between {first['framework']} and "
            f"{second['framework']} at {where} ({CORRECTION}-adjusted p "
            f"{humanize.p_value(first['p_adjusted'])}): {both}."
        )
    if verdict != "yes" and not verdict.startswith("no variance"):
        return (
            f"{label} at {where}: {first['framework']} and {second['framework']} cannot be "
            f"told apart ({verdict}): {both}."
        )
    gap = humanize.number(abs(first[f"gap_{response}"]), unit)
    share = humanize.percent(first["gap_share"])
    better = "ahead of" if higher_is_better else "sooner than"
    word = "leads" if higher_is_better else "reaches the target first"
    return (
        f"{label} at {where}: {first['framework']} {word} with {value}, {gap} ({share}) "
        f"{better} {second['framework']} ({_verdict(first)}){_scaling_words(first)}."
    )


def the_rest(group: pd.DataFrame, response: str, unit: str, higher_is_better: bool) -> str:
    """Where each framework behind the first two stands: against the best
    and against the one just ahead of it, each with its own test of the
    ranking's Holm family."""
    if len(group) < 3:
        return ""
    best = group.iloc[0]
    parts = []
    for i in range(2, len(group)):
        row, ahead = group.iloc[i], group.iloc[i - 1]
        if higher_is_better:
            against_best = f"{humanize.percent(1 - row[response] / best[response])} below"
        else:
            against_best = f"{humanize.percent(row[response] / best[response] - 1)} more than"
        parts.append(
            f"{row['framework']} {_with_interval(row, response, unit)}, {against_best} the best "
            f"({best['framework']}: {_gap_words(row, '_best')}), behind {ahead['framework']} "
            f"({_gap_words(ahead)})"
        )
    return " Then " + "; ".join(parts) + "."


def _gap_words(row, against: str = "") -> str:
    """The ranking's verdict on the gap between ``row`` and the next one
    (``against="_best"``: between ``row`` and the best)."""
    if row[f"significant{against}"] == "no":
        return (
            f"not significant, {CORRECTION}-adjusted p "
            f"{humanize.p_value(row[f'p_adjusted{against}'])}"
        )
    return _verdict(row, against)


def not_reached(runs: pd.DataFrame, key: tuple) -> str:
    """The frameworks planned at one scale and setting with no successful
    run there, and what became of their runs."""
    planned = cells.with_scale(runs)
    here = planned[planned[[*SCALE, "setting"]].apply(tuple, axis=1) == key]
    missing = []
    for framework, cell in here.groupby("framework"):
        if not (cell["status"] == "ok").any():
            missing.append(f"{framework} ({', '.join(sorted(cell['status'].dropna().unique()))})")
    return f" No successful run here: {', '.join(missing)}." if missing else ""


def unreached(runs: pd.DataFrame) -> str:
    """The design's frameworks that no run reached at any scale, or ''."""
    if "framework" not in runs:
        return ""
    ok = set(runs.loc[runs["status"] == "ok", "framework"])
    never = sorted(set(runs["framework"].dropna()) - ok)
    if not never:
        return ""
    return (
        f"In the design but reached by no successful run, so in no comparison: "
        f"{', '.join(never)} (Run status says why)."
    )


def not_studied(runs: pd.DataFrame) -> str:
    """The study's frameworks this design has no level of, or ''."""
    if "framework" not in runs:
        return ""
    planned = set(runs["framework"].dropna())
    absent = [name for name, levels in STUDIED.items() if not planned & set(levels)]
    if not absent:
        return ""
    which = ", ".join(f"{name} ({', '.join(STUDIED[name])})" for name in absent)
    return (
        f"Not in this design, so not in this answer: {which}, of the study's three "
        f"frameworks ({', '.join(STUDIED)}); the Frameworks section says how to add "
        f"{'it' if len(absent) == 1 else 'them'}."
    )


def _scaling_words(row) -> str:
    speedup = row.get("speedup")
    if speedup is None or not math.isfinite(speedup) or row.get("efficiency") == 1:
        return ""
    return (
        f"; speedup {_number_between(row, 'speedup', '')} over its smallest scale, "
        f"efficiency {_number_between(row, 'efficiency', '%')}"
    )


def _number_between(row, name: str, unit: str) -> str:
    """A figure and its interval's ends, or the figure alone without them."""
    show = humanize.percent if unit == "%" else (lambda v: humanize.number(v, unit))
    low, high = row.get(f"{name}_low"), row.get(f"{name}_high")
    if low is None or not (math.isfinite(low) and math.isfinite(high)):
        return show(row[name])
    return f"{show(row[name])} (95 % interval {show(low)} to {show(high)})"


def _with_interval(row, response: str, unit: str) -> str:
    text = humanize.number(row[response], unit)
    low, high = row[f"{response}_low"], row[f"{response}_high"]
    if row["replications"] < 2:
        return f"{text} (one replication: no interval)"
    if low == high:
        return f"{text} (identical in every replication)"
    return f"{text} (95 % interval {humanize.number(low, unit)} to {humanize.number(high, unit)})"


def _verdict(row, against: str = "") -> str:
    if row[f"significant{against}"] == "yes":
        return (
            f"significant, {CORRECTION}-adjusted p {humanize.p_value(row[f'p_adjusted{against}'])}"
        )
    return row[f"significant{against}"]


def dominant_bottlenecks(found: pd.DataFrame) -> pd.DataFrame:
    """Per framework, processes and setting: the largest share of the step
    lost to exposed communication or data loading, and the wait per
    collective; ``sentence`` says it with its number."""
    if found.empty:
        return pd.DataFrame(columns=[*cells.CELL, "bottleneck", "share", "sentence"])
    rows = []
    for key, group in found.groupby(cells.CELL):
        value = group.set_index("bottleneck")["value"]
        shares = {name: float(value[name]) for name in (EXPOSED, DATA) if name in value}
        name, share = max(shares.items(), key=lambda kv: kv[1]) if shares else (None, 0.0)
        framework, world, setting = key
        lead = f"{framework}, {humanize.processes(world)} ({setting}): "
        if not shares:  # its runs timed whole steps only (Tarantella's recording off)
            text = "it times whole steps only, so no phase can be named the bottleneck"
            text += phase_recording.why_none(framework)
            name = "not timed"
        elif share < QUIET:
            text = (
                f"no exposed communication or data-loading bottleneck (each under "
                f"{QUIET * 100:g} % of the step): compute dominates"
            )
            name = "compute"
        elif name == EXPOSED:
            text = f"{humanize.percent(share)} of the step is exposed gradient exchange"
        else:
            text = f"{humanize.percent(share)} of the step is data loading"
        if WAIT in value and math.isfinite(value[WAIT]):
            text += f"; the {WAIT} is {humanize.number(value[WAIT] * 1e3, 'ms')}"
        rows.append(
            {
                **dict(zip(cells.CELL, key)),
                "bottleneck": name,
                "share": share,
                "sentence": lead + text + ".",
            }
        )
    return cells.in_order(pd.DataFrame(rows), cells.CELL)


def replication_table(
    runs: pd.DataFrame, target: float = stats.NEEDS_MORE_REPLICATIONS, most: int | None = None
) -> pd.DataFrame:
    """Per cell: the replications it took, its mean throughput with the
    positive 95 % interval, MLPerf's olympic mean (best and worst dropped)
    from 5 replications on, the run-to-run variation, and whether the
    interval's relative half-width met ``target`` (capped at ``most``
    replications under replications: auto)."""
    ok = ok_runs(runs)
    cell = ["framework", *SCALE, "setting"]
    table = stats.replicate_table(ok, cell, "images_per_s")
    if table.empty:
        return table

    def met(row) -> str:
        if row["n"] < 2:
            return "no: one replication, no interval"
        if row["relative_half_width"] <= target:
            return "yes"
        if most is not None and row["n"] >= most:
            return f"no: the cap of {most} replications reached"
        return "no: needs more replications"

    table["met_target"] = table.apply(met, axis=1)
    table = table.rename(
        columns={
            "n": "replications",
            "mean": "images_per_s",
            "low": "images_per_s_low",
            "high": "images_per_s_high",
            "olympic_mean": "olympic_images_per_s",
            "cv_share": "throughput_cv_share",
        }
    )
    keep = [
        *cell,
        "replications",
        "images_per_s",
        "images_per_s_low",
        "images_per_s_high",
        "olympic_images_per_s",
        "throughput_cv_share",
        "relative_half_width",
        "met_target",
    ]
    return cells.in_order(table[keep], cell).drop(columns=["nodes", "procs_per_node"])


def build(
    runs: pd.DataFrame,
    found: pd.DataFrame,
    target: float = stats.NEEDS_MORE_REPLICATIONS,
    most: int | None = None,
    level_lines: list[str] | None = None,
) -> Summary:
    """The summary; ``target`` and ``most``: the design's replications
    rule (the relative half-width to meet, and the cap under auto);
    ``level_lines``: analysis/levels.py's sentences, where already made."""
    rankings, headlines, notes = {}, [], []
    involved = levels.involved(runs)
    for response, higher, unit in RANKED:
        table = ranking(runs, response, higher)
        if table.empty:
            if response == "time_to_accuracy_s":
                notes.append(
                    "Time to accuracy: not measured (no target_accuracy, or no run reached it)."
                )
            continue
        if response == "images_per_s":
            table = with_scaling(table, runs)
        rankings[response] = table
        alone = 0
        for key, group in table.groupby([*SCALE, "setting"], sort=False):
            group = group.sort_values("rank")
            if _compared_by_level(group, involved) and not not_reached(runs, key):
                alone += 1
                continue
            headlines.append(
                headline(group, response, unit, higher)
                + the_rest(group, response, unit, higher)
                + not_reached(runs, key)
            )
        if alone:
            headlines.append(_alone_words(LABELS[response], alone, involved))
    notes[:0] = [line for line in (unreached(runs), not_studied(runs)) if line]
    dominant = dominant_bottlenecks(found)
    return Summary(
        headlines=headlines,
        rankings=rankings,
        bottlenecks=dominant["sentence"].tolist(),
        replications=replication_table(runs, target, most),
        target=target,
        notes=notes,
        conditions=conditions.lines(runs),
        clean_headlines=clean_headlines(runs),
        levels=levels.sentences(*levels.tables(runs)) if level_lines is None else level_lines,
        holds=transfer.sentences(runs),
    )


def _compared_by_level(group: pd.DataFrame, involved: set[str]) -> bool:
    """A cell of one framework whose levels analysis/levels.py compares
    (or their baseline's): a ranking there would rank nothing."""
    return len(group) == 1 and group["framework"].iloc[0] in involved


def _alone_words(label: str, cells_alone: int, involved: set[str]) -> str:
    return (
        f"{label}: {humanize.count(cells_alone, 'cell holds', 'cells hold')} one framework "
        f"only ({', '.join(sorted(involved))}): the design varies a setting that only some "
        f"frameworks take, so each of its levels is a cell of its own and no framework is "
        f"ranked there. Their figures are in the table below; their levels are compared "
        f'under "{levels.HEADING}".'
    )


def clean_headlines(runs: pd.DataFrame) -> list[str]:
    """Throughput ranked on the runs measured without heavy foreign load,
    in the scales and settings where every framework has at least
    conditions.CLEAN_MIN of them (none where no run was loaded)."""
    if "loaded" not in runs or not runs["loaded"].fillna(False).astype(bool).any():
        return []
    group = [*SCALE, "setting"]
    everyone = ok_runs(runs).groupby(group)["framework"].nunique()
    clean = ok_runs(runs[~runs["loaded"].fillna(False).astype(bool)])
    if clean.empty:
        return []
    per = clean.groupby([*group, "framework"]).size()
    enough = (per >= conditions.CLEAN_MIN).groupby(level=group).sum()
    cells_kept = enough[enough == everyone.reindex(enough.index)].index
    kept = clean.set_index(group).loc[lambda t: t.index.isin(cells_kept)].reset_index()
    table = ranking(kept, "images_per_s", True) if len(kept) else pd.DataFrame()
    if table.empty:
        return []
    involved = levels.involved(runs)
    said = [
        "Clean runs only: " + headline(g.sort_values("rank"), "images_per_s", "images/s", True)
        for _, g in table.groupby(group, sort=False)
        if not _compared_by_level(g, involved)
    ]
    alone = sum(_compared_by_level(g, involved) for _, g in table.groupby(group, sort=False))
    if alone:
        said.append("Clean runs only: " + _alone_words(LABELS["images_per_s"], alone, involved))
    return said


# ----------------------------------------------------------------- section

CAPTIONS = {
    "summary-images_per_s": "throughput ranking per scale and setting",
    "summary-time_to_accuracy_s": "time-to-accuracy ranking per scale and setting",
    "summary-replications": "replications per cell: mean throughput, its 95 % interval, "
    "the olympic mean (best and worst dropped, from 5 replications), run-to-run variation "
    "(coefficient of variation) and whether the interval met the target",
}


def of(ctx) -> Summary:
    """The design's Summary, built once for the report (its section and
    summary.md next to it)."""
    if "summary" not in ctx.extra:
        rule = ctx.design.adaptive
        said = levels.of(ctx)[2]
        if rule:
            ctx.extra["summary"] = build(
                ctx.runs, ctx.findings, rule.target_half_width, rule.most, said
            )
        else:
            ctx.extra["summary"] = build(ctx.runs, ctx.findings, level_lines=said)
    return ctx.extra["summary"]


def conditions_block(out: Section, result: Summary) -> None:
    """Where the figures hold, before any of them: the runs' conditions,
    foreign load if any, and the ranking of clean runs where there are
    enough of them."""
    if result.conditions:
        out.para(Strong("Where these figures hold"), ": " + " ".join(result.conditions))
    if result.clean_headlines:
        out.items(result.clean_headlines)


def section(ctx) -> Section:
    """The answer first: who leads, why, how sure."""
    result = of(ctx)
    out = Section("summary", "Summary", css="answer")
    conditions_block(out, result)
    if result.headlines:
        out.para(Strong("Which framework leads, by how much, how sure"), f" ({result.correction}):")
        out.items(result.headlines)
    else:
        out.para("No successful run to compare yet.")
    if result.holds:
        out.para(Strong(transfer.HEADING), f" ({transfer.HOW}):")
        out.items(result.holds)
    if result.levels:
        out.para(Strong(levels.HEADING), f" ({levels.HOW}; the section of that name says more):")
        out.items(result.levels)
    for line in result.notes:
        out.para(line)
    if result.bottlenecks:
        # the definitions hold brackets of their own: a sentence, not a bracket
        out.para(
            Strong("Why"),
            f": the dominant bottleneck of each framework. {'; '.join(result.definitions)}.",
        )
        out.items(result.bottlenecks)
    out.para(Strong("Replications"), f": {result.replication_words}")
    for name, t in result.tables().items():
        if len(t):
            out.table(t, caption=CAPTIONS.get(name, name))
    return out.para(
        "Also as ",
        Code("summary.md"),
        " and CSV tables (",
        Code("summary-*.csv"),
        ") next to this report.",
    )
