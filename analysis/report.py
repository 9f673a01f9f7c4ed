"""The HTML report: one self-contained file, figures embedded, nothing fetched.

The page is the Jinja2 template analysis/templates/report.html.j2; the
sections are SECTIONS below, in order: the answer first (analysis/summary.py),
then design and provenance, run status, throughput and scaling, phases,
bottlenecks, design statistics, accuracy, energy, compression, traces.
Everything is computed from the tables. A new section is one line in
SECTIONS (see analysis/page.py). Next to report.html: summary.md and the
summary's tables as CSV.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd

from runfiles.names import PHASE_TABLE
from analysis import (
    accuracy,
    bottlenecks,
    cells,
    devices,
    explain,
    followup,
    humanize,
    improve,
    network_limit,
    spread,
    stats,
    summary,
)
from analysis import compression as compression_table
from analysis import page
from analysis.page import Context, Section
from ddlcompare.run import machine_load
from runfiles.atomic import write_text
from ddlcompare.plan.design import Design
from frameworks import registry
from runfiles.phases import MARKERS
from ddlcompare.run.validate import check_table, read_table

TEMPLATES = Path(__file__).parent / "templates"


def design_section(design: Design, runs: pd.DataFrame) -> str:
    factors = pd.DataFrame(
        [{"factor": f, "levels": ", ".join(map(str, v))} for f, v in design.factors.items()]
    )
    fixed = pd.DataFrame([{"setting": k, "value": v} for k, v in design.fixed.items()])
    commits = ", ".join(sorted(runs["harness_commit"].dropna().unique())) or "unknown"
    versions = runs[[c for c in runs.columns if c.startswith("version_")] + ["mpi", "cpu"]]
    versions = versions.dropna(how="all").drop_duplicates()
    return (
        f"<p>Design <code>{html.escape(design.name)}</code> "
        f"from <code>{html.escape(design.source)}</code>, settings hash "
        f"<code>{design.settings_hash}</code>, seed {design.seed}, "
        f"{_replication_words(design)}, run order "
        f"{'randomized' if design.randomize else 'as listed'}. "
        f"batch_size is per process; global_batch = batch_size x processes.</p>"
        f"<h3>Factors</h3>{page.table(factors)}<h3>Fixed settings</h3>{page.table(fixed)}"
        f"<h3>Software and hosts</h3><p>Harness commit(s): <code>{commits}</code>; "
        f"hosts: {html.escape(', '.join(sorted(set(runs['hosts'].dropna()))) or 'none')}"
        f"</p>{page.table(versions)}"
    )


def _replication_words(design: Design) -> str:
    rule = design.adaptive
    if not rule:
        return f"{design.replications} replication(s)"
    return (
        f"replications auto ({rule.least} to {rule.most} per cell, until the 95 % interval "
        f"of throughput is within {rule.target_half_width * 100:g} % of the mean)"
    )


def status_section(design: Design, runs: pd.DataFrame) -> str:
    cell = [f for f in design.path_factors()]
    counts = runs.groupby(cell + ["status"]).size().unstack(fill_value=0)
    loaded = runs["loaded"].eq(True) if "loaded" in runs else pd.Series(False, index=runs.index)
    counts["measured beside foreign load"] = loaded.groupby([runs[c] for c in cell]).sum()
    counts = counts.reset_index()
    problems = runs[runs["status"] != "ok"][["run_id", *cell, "rep", "status", "reason"]]
    ok = int((runs["status"] == "ok").sum())
    text = (
        f"<p>{ok} of {len(runs)} runs ok.</p>"
        f"<h3>Runs per design cell, by status</h3>{page.table(counts)}"
    )
    if not problems.empty:
        text += f"<h3>Runs that did not succeed</h3>{page.table(problems)}"
    if loaded.any():
        beside = runs[loaded][["run_id", *cell, "rep", "foreign_cpu_share", "busiest_foreign"]]
        text += (
            "<h3>Runs measured beside foreign load</h3><p>Not clean: other processes took "
            f"at least {machine_load.LOADED_SHARE:.0%} of the machine's CPU time during their "
            f"measured steps.</p>{page.table(beside)}"
        )
    return text


def results_section(runs: pd.DataFrame, figures: Path) -> str:
    scaling = stats.scaling(runs)
    return (
        f"{page.figure(figures / 'throughput.png', 'throughput')}"
        f"<p>images_per_s is global: images processed by all ranks in the measured steps "
        f"(after warmup_steps) over the slowest rank's wall time; evaluation is excluded. "
        f"batch_size is per process, so adding processes is weak scaling: the ideal "
        f"speedup is the ratio of process counts.</p>"
        f"{page.figure(figures / 'scaling.png', 'scaling')}{page.table(scaling)}"
        f"<h3>Where the speedup goes</h3>{page.figure(figures / 'waterfall.png', 'waterfall')}"
        f"<p>Each bar is one phase's share of the gap between ideal and measured speedup: "
        f"gap = (N/N0) x sum over phases of (t_N - t_N0) / t_N, exactly.</p>"
    )


def spread_section(ctx: Context) -> str:
    """Step-time distributions, run-to-run variation, and where each cell's
    runs, traces and the merged timeline are."""
    found = spread.table(ctx.runs, ctx.step_phases)
    if found.empty:
        text = "<p>No measured step in the phase tables: no step-time distribution.</p>"
    else:
        text = (
            f"{page.figure(ctx.figures / 'step_times.png', 'step time per cell')}"
            f"<p>Time of each measured step (warm-up left out), over all ranks and "
            f"replications of a cell; p95_over_median is the tail's length. "
            f"throughput_cv is the run-to-run variation: the standard deviation of "
            f"images_per_s over replications divided by its mean.</p>{page.table(found)}"
        )
    return (
        text + "<h3>Runs, traces and the merged timeline</h3><p>Each cell's run folders "
        "(status, converted phase table, trace where one was written); the merged "
        "Perfetto timeline (open it in ui.perfetto.dev) holds each framework's largest "
        "run.</p>" + spread.links(ctx.runs, ctx.design.root, ctx.tables.parent)
    )


def phases_section(runs: pd.DataFrame, phases: pd.DataFrame, figures: Path) -> str:
    ok = runs[runs["status"] == "ok"]
    cell = cells.CELL
    table = (
        bottlenecks.breakdown(phases[phases["run_id"].isin(ok["run_id"])], ok, cell)
        if len(ok) and len(phases)
        else pd.DataFrame()
    )
    if len(table):
        table = (table.assign(mean=table["mean"] * 1e3)).pivot_table(
            index=cell, columns="phase", values="mean"
        )
        table.columns = [f"{phase}_ms" for phase in table.columns]
        table = cells.in_order(table.reset_index(), cell)
    return (
        f"{page.figure(figures / 'phases.png', 'phase breakdown')}"
        f"<p>Time per measured step in each phase, mean over ranks and "
        f"replications; 'other' is step time outside the named phases.</p>{page.table(table)}"
        f"{page.figure(figures / 'timeline.png', 'timeline')}"
    )


def bottlenecks_section(found: pd.DataFrame) -> str:
    if len(found):
        found = cells.in_order(found, [*cells.CELL, "bottleneck"])
        found = found.assign(
            value=[_figure(b, v) for b, v in zip(found["bottleneck"], found["value"])]
        )
    return (
        f"<p>One number and one sentence per finding and design "
        f"cell (framework, processes, setting: batch_size and the other factors that "
        f"vary).</p>{page.table(found)}"
    )


def _figure(bottleneck: str, value: float) -> str:
    """A finding's number in its own unit (the column holds several)."""
    if bottleneck == bottlenecks.WAIT:
        return humanize.number(value, "s")
    if bottleneck == "load imbalance":
        return f"{humanize.number(value)} (max/mean)"
    return humanize.percent(value)


def statistics_section(design: Design, runs: pd.DataFrame) -> str:
    ok = runs[runs["status"] == "ok"]
    listed = [f for f in design.path_factors() if f in runs]
    factors = stats.varied_factors(runs, listed)
    constant = [f for f in design.factors if f in ok and f not in factors]
    parts = [_fraction_html(design)]
    if constant:
        parts.append(
            f"<p>One level among the successful runs, so no effect to estimate: "
            f"{html.escape(', '.join(constant))}.</p>"
        )
    for response in stats.RESPONSES:
        if response not in runs or runs[response].dropna().empty:
            continue
        parts.append(f"<h3>{response}</h3>")
        reps = stats.replicate_table(runs, listed, response)
        flagged = int(reps["needs_more_replications"].sum()) if len(reps) else 0
        single = int((reps["n"] < 2).sum()) if len(reps) else 0
        few = f", or {single} with one replication: too few for an interval" if single else ""
        parts.append(
            f"<p>Mean and its 95 % interval per cell (low and high: the t interval on the "
            f"log scale, positive; ci_half_width: t s / sqrt(n)). {flagged} cell(s) need "
            f"more replications (half-width over {stats.NEEDS_MORE_REPLICATIONS * 100:g} % "
            f"of the mean{few}).</p>"
        )
        parts.append(page.table(reps, caption=f"{response} per cell"))
        if _deterministic(ok, listed, response):
            parts.append(
                f"<p>{response} is identical in every replication: the runs are "
                f"deterministic for this seed, so there is no error to test effects "
                f"against; the allocation below is exact, without F or p.</p>"
            )
        parts.append(_anova_html(design, runs, factors, response))
    return "".join(parts)


def _deterministic(ok: pd.DataFrame, cell: list[str], response: str) -> bool:
    spread = ok.dropna(subset=[response]).groupby(cell)[response].agg(["std", "count"])
    replicated = spread[spread["count"] > 1]
    return bool(len(replicated)) and bool(
        (replicated["std"].fillna(0) <= 1e-12 * ok[response].abs().max()).all()
    )


def _fraction_html(design: Design) -> str:
    if not design.fraction:
        return ""
    lines = design.fraction.describe()
    return (
        f"<p>{html.escape(lines[0])}. Only the effects the fraction separates are "
        f"estimated: each row of the sign table below stands for its whole alias chain.</p>"
        f"<pre>{html.escape(chr(10).join(lines[1:]))}</pre>"
    )


def _anova_html(design: Design, runs: pd.DataFrame, factors: list[str], response: str) -> str:
    if not factors:
        return "<p>No factor varies among the successful runs: no allocation of variation.</p>"
    if design.sample:
        text = (
            "<p>No allocation of variation: a Latin hypercube leaves most cells of the "
            "grid empty, so a full-factorial ANOVA cannot tell its sampled factors apart "
            "(docs/design.md).</p>"
        )
    else:
        text = "" if design.fraction else _anova_table(runs, factors, response)
    ok = runs[runs["status"] == "ok"]
    if all(ok[f].nunique() == 2 for f in factors):
        levels = {f: _two_levels(design, f, ok) for f in factors}
        terms = design.fraction.estimable() if design.fraction else None
        try:
            effects = stats.sign_table_2kr(runs, factors, response, levels=levels, terms=terms)
        except ValueError as exc:
            return text + f"<p>2<sup>k</sup>r method not applicable: {html.escape(str(exc))}.</p>"
        coding = "; ".join(f"{f}: -1 = {lv[0]}, +1 = {lv[1]}" for f, lv in levels.items())
        text += (
            f"<p>2<sup>k</sup>r sign-table effects (Jain). Levels: {html.escape(coding)}. "
            f"<i>difference</i> is the mean at +1 minus the mean at -1 (twice the "
            f"effect q).</p>{page.table(effects, caption=f'effects on {response}')}"
        )
    return text


def _two_levels(design: Design, factor: str, ok: pd.DataFrame) -> list:
    """The factor's levels in the design's order (first listed = -1)."""
    present = set(ok[factor].unique())
    listed = [lv for lv in design.factors.get(factor, []) if lv in present]
    return listed if len(listed) == 2 else sorted(present)


def _anova_table(runs: pd.DataFrame, factors: list[str], response: str) -> str:
    try:
        table = stats.anova(runs, factors, response)
        fit = stats.log_model_fits_better(runs, factors, response)
    except (ValueError, np.linalg.LinAlgError) as exc:
        return f"<p>Allocation of variation not computed: {html.escape(str(exc))}.</p>"
    residual = table.loc[table["term"] == "Residual", "sum_sq"]
    if len(residual) and residual.iloc[0] <= 1e-9 * table["sum_sq"].sum():
        table = table.drop(columns=["F", "p"])  # no error: a test statistic would be noise
    return (
        f"<p>Allocation of variation (full-factorial ANOVA, main effects and two-way "
        f"interactions): R<sup>2</sup> {humanize.percent(fit['r_squared_additive'])} "
        f"on {response}, {humanize.percent(fit['r_squared_log'])} on log({response}); "
        f"the {'multiplicative (log)' if fit['log_fits_better'] else 'additive'} model "
        f"fits better.</p>" + page.table(table, caption=f"allocation of variation of {response}")
    )


def traces_section(runs: pd.DataFrame, tables: Path) -> str:
    """What the converted traces hold: our runs' (collectives and their bytes)
    and any imported ones (phase totals per trace)."""
    parts = [""]
    ours = read_table(tables / PHASE_TABLE) if (tables / PHASE_TABLE).exists() else pd.DataFrame()
    if len(ours):
        info = runs.set_index("run_id")[[*cells.CELL, "tracer"]]
        coll = (
            ours[ours["collective"].notna()]
            .groupby("run_id")
            .agg(
                collectives=("collective", "count"),
                bytes=("bytes", "sum"),
                steps=("step", "nunique"),
                ranks=("rank", "nunique"),
            )
        )
        coll["MB_per_step_per_rank"] = coll["bytes"] / coll["steps"] / coll["ranks"] / 1e6
        held = ours.groupby("run_id").agg(
            intervals=("phase", "count"), sources=("source", lambda s: ", ".join(sorted(set(s))))
        )
        parts.append(
            "<h3>Traces of these runs</h3><p>Intervals converted per run and the "
            "gradient collectives the trace records, with bytes where the framework "
            "exposes them.</p>"
        )
        parts.append(page.table(info.join(held, how="inner").join(coll, how="left").reset_index()))
    errors = (
        runs[runs.get("trace_errors", pd.Series(dtype=str)).notna()]
        if "trace_errors" in runs
        else pd.DataFrame()
    )
    if len(errors):
        parts.append("<h3>Unreadable traces</h3>" + page.table(errors[["run_id", "trace_errors"]]))
    imported = tables / "imported.parquet"
    if imported.exists():
        table = read_table(imported)
        totals = (
            table[~table["phase"].isin(MARKERS)].pivot_table(
                index=["run_id", "source"], columns="phase", values="dur_ns", aggfunc="sum"
            )
            / 1e9
        )
        counts = table.groupby(["run_id", "source"]).agg(
            ranks=("rank", "nunique"), intervals=("phase", "count")
        )
        parts.append(
            "<h3>Imported traces</h3><p>Seconds in each phase (all ranks) after "
            "mapping regions with traces/rules.yaml.</p>"
        )
        parts.append(page.table(counts.join(totals).reset_index()))
    if len(parts) == 1:
        parts.append("<p>No traces (tracer: none, and none imported).</p>")
    return "".join(parts)


def energy_section(runs: pd.DataFrame, figures: Path) -> str:
    """Energy per run and per image by framework and processes, or why it
    was not measured."""
    ok = cells.with_setting(runs[runs["status"] == "ok"])
    if "energy_status" not in ok:
        return "<p>No energy figures in these tables.</p>"
    measured = ok[ok["energy_j"].notna()]
    unmeasured = ok[ok["energy_j"].isna()]
    text = ""
    if len(measured):
        table = (
            measured.groupby(cells.CELL + ["energy_status"])
            .agg(
                runs=("run_id", "count"),
                energy_j=("energy_j", "mean"),
                energy_per_epoch_j=("energy_per_epoch_j", "mean"),
                energy_per_image_j=("energy_per_image_j", "mean"),
            )
            .reset_index()
        )
        text += (
            f"{page.figure(figures / 'energy.png', 'energy per image')}"
            f"<p>Joules over the run clock's window (first data touched to the last "
            f"evaluation), all nodes: Kwollect's node power where it measured every "
            f"node, else RAPL (CPU packages and DRAM) plus NVML (GPUs); means over "
            f"replications.</p>{page.table(table)}"
        )
    if len(unmeasured):
        reasons = unmeasured.groupby("energy_status").size().rename("runs").reset_index()
        lead = (
            "Energy was not measured"
            if measured.empty
            else f"Energy was not measured for {len(unmeasured)} run(s)"
        )
        text += f"<p>{lead}; the reasons, as each run reported them:</p>{page.table(reasons)}"
    return text


def accuracy_section(runs: pd.DataFrame, figures: Path) -> str:
    text = (
        f"{page.figure(figures / 'accuracy.png', 'accuracy')}"
        f"<p>Evaluation is distributed: each rank scores its share of the test set.</p>"
        f"<h3>Time to accuracy</h3>"
    )
    table = accuracy.summary(runs)
    if table.empty:
        return text + (
            "<p>Not measured: set <code>target_accuracy</code> under "
            "<code>fixed</code> in the design (it only re-analyses the runs).</p>"
        )
    return (
        text + f"{page.figure(figures / 'time_to_accuracy.png', 'time to accuracy')}"
        f"<p>The run clock starts just before the training data is touched and stops "
        f"at the end of the first evaluation at or above target_accuracy (MLPerf's "
        f"rule), so it counts data loading and evaluation. A run that never reaches "
        f"the target is counted in <i>runs</i> but not in <i>reached</i>; the means "
        f"are over the runs that reached it, and so is energy_to_accuracy_j (the "
        f"joules up to that evaluation, where energy was measured). Accuracy is only "
        f"checked where an epoch evaluates (eval_every).</p>{page.table(table)}"
    )


def compression_section(runs: pd.DataFrame, figures: Path) -> str:
    """Gradient compression: measured bytes per step against time per step
    and final accuracy, which framework can run which codec, the codecs'
    error bounds."""
    text = ""
    table = compression_table.summary(runs)
    if compression_table.varies(runs) and len(table):
        text += (
            f"{page.figure(figures / 'compression.png', 'compression')}"
            f"<p>comm_bytes_per_step: the bytes of the buffers each rank handed to "
            f"collectives in a measured step (counted where they are handed over; the "
            f"lossless codec's real compressed lengths), mean over steps and ranks. "
            f"bytes_vs_none divides it by the same framework's uncompressed runs. These "
            f"are input buffers: a ring all-reduce puts 2(p-1)/p of its buffer on the "
            f"wire per rank, an all-gather (p-1) times it, so at p ranks int8's gather "
            f"sends p/8 of fp32's all-reduce bytes and stops saving at 8 ranks.</p>"
            f"{page.table(table)}"
        )
    else:
        text += (
            "<p>One compression in these runs (set <code>compression</code> as a "
            "factor to compare them).</p>"
        )
    return (
        text + f"<h3>Which framework can run which compression</h3>"
        f"{page.table(compression_table.support())}"
        f"<h3>Codecs and their error bounds</h3>{page.table(compression_table.codecs())}"
    )


def gate_section(tables: Path) -> str:
    """The same-model gate's verdict: every builder's layers and parameters
    against the shared specification."""
    path = tables / "model_gate.json"
    if not path.exists():
        return "<p>The same-model gate did not run.</p>"
    gate = json.loads(path.read_text())
    per_model = gate.get("models") or {gate["model"]: gate}  # one model: the older format
    rows = [
        {
            "model": model,
            "dataset": name,
            "builder": builder,
            "frameworks": ", ".join(entry.get("frameworks", [])),
            "status": entry["status"],
            "parameters": entry.get("total_params"),
            "BN running statistics": entry.get("total_running_stats", 0),
            "checked on": entry.get("checked_on", entry.get("reason")),
            "problems": "; ".join(entry.get("problems", [])),
        }
        for model, result in per_model.items()
        for name, d in result["datasets"].items()
        for builder, entry in d["builders"].items()
    ]
    names = ", ".join(html.escape(m) for m in per_model)
    return (
        f"<p>Same-model gate: <b>{gate['status']}</b> "
        f"(models {names}: layer shapes, trainable parameters and BN running statistics "
        f"of every builder against the shared specification).</p>"
        f"{page.table(pd.DataFrame(rows))}"
    )


def devices_section(runs: pd.DataFrame, tables: Path) -> str:
    """Calibrated runs: each device kind's share of the global batch and its
    idle time (does the CPU help or hold back?)."""
    path = tables / "balance.parquet"
    table = devices.by_device(read_table(path), runs) if path.exists() else pd.DataFrame()
    if table.empty:
        return (
            "<p class='empty'>No calibrated run (batch_split: calibrated, or device: hybrid): "
            "every rank took an even share of the batch.</p>"
        )
    return (
        "<p>Calibrated runs (batch_split: "
        "calibrated, device: hybrid): each device kind's share of the global batch, from "
        "its ranks' speed timed at start, and its idle time: the measured step time less "
        "the time its share takes at its calibrated speed.</p>" + page.table(table)
    )


def frameworks_section(design: Design) -> str:
    names = design.factors.get("framework", [design.fixed.get("framework")])
    rows = pd.DataFrame(
        [
            {
                "framework": n,
                "launcher": registry.FRAMEWORKS[n].launcher,
                "phases exposed": ", ".join(registry.FRAMEWORKS[n].exposes),
                "notes": registry.FRAMEWORKS[n].notes,
            }
            for n in names
        ]
    )
    return page.table(rows) + _not_compared(names)


def summary_section(ctx: Context) -> str:
    """The answer first; its own template (sections/summary.html.j2) lays it out."""
    rule = ctx.design.adaptive
    if rule:
        result = summary.build(ctx.runs, ctx.findings, rule.target_half_width, rule.most)
    else:
        result = summary.build(ctx.runs, ctx.findings)
    ctx.extra["summary"] = result
    return ""


# The report's sections in order: (anchor, title, builder of the Context).
# A new section is one line here.
SECTIONS = [
    Section("summary", "Summary", summary_section),
    Section("improve", "How to make it faster", improve.section),
    Section("stages", "Two stages", followup.section),
    Section("design", "Design and provenance", lambda c: design_section(c.design, c.runs)),
    Section("status", "Run status", lambda c: status_section(c.design, c.runs)),
    Section("throughput", "Throughput and scaling", lambda c: results_section(c.runs, c.figures)),
    Section("spread", "Spread: step times and run-to-run variation", spread_section),
    Section(
        "phases", "Phase breakdown", lambda c: phases_section(c.runs, c.step_phases, c.figures)
    ),
    Section(
        "devices", "Devices: shares and idle time", lambda c: devices_section(c.runs, c.tables)
    ),
    Section(
        "frameworks",
        "Frameworks and the phases they expose",
        lambda c: frameworks_section(c.design),
    ),
    Section("gate", "Same model everywhere", lambda c: gate_section(c.tables)),
    Section("bottlenecks", "Bottlenecks", lambda c: bottlenecks_section(c.findings)),
    Section("critical-path", "Critical path and causes of waiting", lambda c: explained(c, 0)),
    Section("what-if", "What if: a calibrated model of the step", lambda c: explained(c, 1)),
    Section(
        "trace-diff",
        "Trace diff: framework against framework, phase by phase",
        lambda c: explained(c, 2),
    ),
    Section("network", "Network bandwidth limit", network_limit.section),
    Section("statistics", "Design statistics", lambda c: statistics_section(c.design, c.runs)),
    Section("accuracy", "Accuracy", lambda c: accuracy_section(c.runs, c.figures)),
    Section("energy", "Energy", lambda c: energy_section(c.runs, c.figures)),
    Section(
        "compression", "Gradient compression", lambda c: compression_section(c.runs, c.figures)
    ),
    Section("traces", "Traces", lambda c: traces_section(c.runs, c.tables)),
]


def render(ctx: Context, sections: list[Section] = SECTIONS) -> tuple[str, list[Section]]:
    built = []
    for spec in sections:
        body = spec.build(ctx)
        if not body.strip() and spec.id != "summary":
            body = "<p class='empty'><em>Nothing to show for these runs.</em></p>"
        built.append(Section(spec.id, spec.title, spec.build, body=body))
    result = ctx.extra.get("summary")
    for section in built:
        if section.id == "summary" and result is not None:
            section.data = {
                "summary": result,
                "tables": {
                    name: page.table(t, caption=_caption(name))
                    for name, t in result.tables().items()
                    if len(t)
                },
            }
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    html_page = env.get_template("report.html.j2").render(
        name=ctx.design.name, design=ctx.design, sections=built
    )
    return html_page, built


def _caption(name: str) -> str:
    return {
        "summary-images_per_s": "throughput ranking per scale and setting",
        "summary-time_to_accuracy_s": "time-to-accuracy ranking per scale and setting",
        "summary-replications": "replications per cell: mean throughput, its 95 % interval, "
        "the olympic mean (best and worst dropped, from 5 replications), run-to-run variation "
        "(coefficient of variation) and whether the interval met the target",
    }.get(name, name)


def write_summary(ctx: Context, out: Path) -> None:
    """summary.md and the summary's tables as CSV, next to the report."""
    result = ctx.extra.get("summary")
    if result is None:
        return
    tables = {name: t for name, t in result.tables().items() if len(t)}
    for name, t in tables.items():
        write_text(out.parent / f"{name}.csv", t.to_csv(index=False))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False, keep_trailing_newline=True
    )
    text = env.get_template("summary.md.j2").render(
        name=ctx.design.name,
        summary=result,
        tables={n: humanize.frame(t).to_markdown(index=False) for n, t in tables.items()},
    )
    write_text(out.parent / "summary.md", text)


def explained(ctx: Context, index: int) -> str:
    """One of the sections that explain a step (analysis/explain.py: critical
    path and causes of waiting, the calibrated what-if, the trace diff),
    computed once for the three."""
    if "explain" not in ctx.extra:
        ctx.extra["explain"] = explain.sections(ctx.runs, ctx.tables, ctx.critical_path)
    found = ctx.extra["explain"]
    if index >= len(found):
        return "<p><em>No phase table in these tables: nothing to explain.</em></p>"
    return section_body(found[index])


def section_body(part) -> str:
    """A module's section (sentences, figures, tables) as the body the
    template frames with its title."""
    return "".join(
        [
            page.sentences(part.sentences),
            *(page.figure(p, part.title) for p in part.figures),
            *(page.table(t, caption=c) for c, t in part.tables.items() if len(t)),
        ]
    )


def _not_compared(names: list[str]) -> str:
    """Every registered framework this design leaves out, told apart:
    installed here (add it to the design) or not (the command that builds
    it). None is dropped without a word."""
    rows = [_how_to_compare(n, info) for n, info in registry.FRAMEWORKS.items() if n not in names]
    if not rows:
        return ""
    return (
        "<h3>Frameworks not in this design</h3><p>Every other framework here: installed "
        "or not, and how to compare it (add it to the design's <code>framework</code> "
        "factor).</p>" + page.table(pd.DataFrame(rows).sort_values("installed here", kind="stable"))
    )


def _how_to_compare(name: str, info: registry.AdapterInfo) -> dict:
    from ddlcompare.run import envs

    command = envs.how_to_build(info.env)
    if envs.has_module(info.env, info.probe):
        installed, how = "yes", "add it to the design"
    elif envs.set_up_by_setup_sh(info.env):  # ./ddlc run sets up what its design needs
        installed, how = "no", f"add it to the design: ./ddlc run sets it up; or {command}"
    else:
        installed, how = "no", f"{command}; then add it to the design"
    return {"framework": name, "installed here": installed, "to compare it": how}


def build(design: Design, tables: Path, out: Path) -> Path:
    for path in sorted(Path(tables).glob("*.parquet")):  # any a section may read
        check_table(path)
    ctx = Context(
        design=design,
        runs=read_table(tables / "runs.parquet"),
        step_phases=read_table(tables / "step_phases.parquet"),
        tables=tables,
    )
    text, _ = render(ctx)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, text)
    write_summary(ctx, out)
    return out
