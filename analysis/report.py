"""The HTML report: one self-contained file, figures embedded, nothing fetched.

Sections: design and provenance, run status (failed and missing cells
visible), throughput and scaling, phase breakdown, bottlenecks, design
statistics, accuracy, gradient compression. Everything is computed from
the tables.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import accuracy, bottlenecks, cells, stats
from analysis import compression as compression_table
from ddlcompare.atomic import write_text
from ddlcompare.design import Design
from frameworks import registry

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f2f2f2; }
.ok { color: #176117; } .failed, .missing, .interrupted { color: #a31515; font-weight: bold; }
img { max-width: 100%; } code { background: #f5f5f5; padding: 0 0.2em; }
"""


def _table(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for _, row in df.iterrows():
        cells = []
        for c in df.columns:
            value = row[c]
            text = f"{value:.4g}" if isinstance(value, float) else str(value)
            cls = f' class="{value}"' if c == "status" else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _figure(path: Path, alt: str) -> str:
    if not path.exists():
        return f"<p><em>{html.escape(alt)}: no figure (no successful run).</em></p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def design_section(design: Design, runs: pd.DataFrame) -> str:
    factors = pd.DataFrame([{"factor": f, "levels": ", ".join(map(str, v))}
                            for f, v in design.factors.items()])
    fixed = pd.DataFrame([{"setting": k, "value": v} for k, v in design.fixed.items()])
    commits = ", ".join(sorted(runs["harness_commit"].dropna().unique())) or "unknown"
    versions = runs[[c for c in runs.columns if c.startswith("version_")] + ["mpi", "cpu"]]
    versions = versions.dropna(how="all").drop_duplicates()
    return (f"<h2>Design and provenance</h2><p>Design <code>{html.escape(design.name)}</code> "
            f"from <code>{html.escape(design.source)}</code>, settings hash "
            f"<code>{design.settings_hash}</code>, seed {design.seed}, "
            f"{design.replications} replication(s), run order "
            f"{'randomized' if design.randomize else 'as listed'}. "
            f"batch_size is per process; global_batch = batch_size x processes.</p>"
            f"<h3>Factors</h3>{_table(factors)}<h3>Fixed settings</h3>{_table(fixed)}"
            f"<h3>Software and hosts</h3><p>Harness commit(s): <code>{commits}</code>; "
            f"hosts: {html.escape(', '.join(sorted(set(runs['hosts'].dropna()))) or 'none')}"
            f"</p>{_table(versions)}")


def status_section(design: Design, runs: pd.DataFrame) -> str:
    cell = [f for f in design.path_factors()]
    counts = (runs.groupby(cell + ["status"]).size().unstack(fill_value=0).reset_index())
    problems = runs[runs["status"] != "ok"][["run_id", *cell, "rep", "status", "reason"]]
    ok = int((runs["status"] == "ok").sum())
    text = (f"<h2>Run status</h2><p>{ok} of {len(runs)} runs ok.</p>"
            f"<h3>Runs per design cell, by status</h3>{_table(counts)}")
    if not problems.empty:
        text += f"<h3>Runs that did not succeed</h3>{_table(problems)}"
    return text


def results_section(runs: pd.DataFrame, figures: Path) -> str:
    scaling = stats.scaling(runs)
    return (f"<h2>Throughput and scaling</h2>{_figure(figures / 'throughput.png', 'throughput')}"
            f"<p>images_per_s is global: images processed by all ranks in the measured steps "
            f"(after warmup_steps) over the slowest rank's wall time; evaluation is excluded. "
            f"batch_size is per process, so adding processes is weak scaling: the ideal "
            f"speedup is the ratio of process counts.</p>"
            f"{_figure(figures / 'scaling.png', 'scaling')}{_table(scaling)}"
            f"<h3>Where the speedup goes</h3>{_figure(figures / 'waterfall.png', 'waterfall')}"
            f"<p>Each bar is one phase's share of the gap between ideal and measured speedup: "
            f"gap = (N/N0) x sum over phases of (t_N - t_N0) / t_N, exactly.</p>")


def phases_section(runs: pd.DataFrame, phases: pd.DataFrame, figures: Path) -> str:
    ok = runs[runs["status"] == "ok"]
    cell = cells.CELL
    table = bottlenecks.breakdown(phases[phases["run_id"].isin(ok["run_id"])], ok, cell) \
        if len(ok) and len(phases) else pd.DataFrame()
    if len(table):
        table = table.pivot_table(index=cell, columns="phase", values="mean").reset_index()
    return (f"<h2>Phase breakdown</h2>{_figure(figures / 'phases.png', 'phase breakdown')}"
            f"<p>Seconds per measured step in each phase, mean over ranks and "
            f"replications; 'other' is step time outside the named phases.</p>{_table(table)}"
            f"{_figure(figures / 'timeline.png', 'timeline')}")


def bottlenecks_section(runs: pd.DataFrame, phases: pd.DataFrame) -> str:
    found = bottlenecks.findings(phases, runs)
    if len(found):
        found = found.sort_values([*cells.CELL, "bottleneck"])
    return (f"<h2>Bottlenecks</h2><p>One number and one sentence per finding and design "
            f"cell (framework, processes, setting: batch_size and the other factors that "
            f"vary).</p>{_table(found)}")


def statistics_section(design: Design, runs: pd.DataFrame) -> str:
    factors = stats.varied_factors(runs, [f for f in design.path_factors() if f in runs])
    parts = ["<h2>Design statistics</h2>"]
    cell = design.path_factors()
    for response in stats.RESPONSES:
        if response not in runs or runs[response].dropna().empty:
            continue
        parts.append(f"<h3>{response}</h3>")
        reps = stats.replicate_table(runs, cell, response)
        flagged = int(reps["needs_more_replications"].sum()) if len(reps) else 0
        parts.append(f"<p>Mean +- t s / sqrt(n) per cell (95 %). {flagged} cell(s) have a "
                     f"half-width over 5 % of the mean and need more replications.</p>")
        parts.append(_table(reps))
        parts.append(_anova_html(runs, factors, response))
    return "".join(parts)


def _anova_html(runs: pd.DataFrame, factors: list[str], response: str) -> str:
    if not factors:
        return "<p>No factor varies among the successful runs: no allocation of variation.</p>"
    try:
        table = stats.anova(runs, factors, response)
        fit = stats.log_model_fits_better(runs, factors, response)
    except (ValueError, np.linalg.LinAlgError) as exc:
        return f"<p>Allocation of variation not computed: {html.escape(str(exc))}.</p>"
    text = (f"<p>Allocation of variation (full-factorial ANOVA, main effects and two-way "
            f"interactions): R<sup>2</sup> {fit['r_squared_additive']:.3f} on {response}, "
            f"{fit['r_squared_log']:.3f} on log({response}); the "
            f"{'multiplicative (log)' if fit['log_fits_better'] else 'additive'} model fits "
            f"better.</p>{_table(table)}")
    ok = runs[runs["status"] == "ok"]
    if all(ok[f].nunique() == 2 for f in factors):
        try:
            effects = stats.sign_table_2kr(runs, factors, response)
            text += f"<p>2<sup>k</sup>r sign-table effects (Jain):</p>{_table(effects)}"
        except ValueError as exc:
            text += f"<p>2<sup>k</sup>r method not applicable: {html.escape(str(exc))}.</p>"
    return text


def traces_section(runs: pd.DataFrame, tables: Path) -> str:
    """What the converted traces hold: our runs' (collectives and their bytes)
    and any imported ones (phase totals per trace)."""
    parts = ["<h2>Traces</h2>"]
    ours = pd.read_parquet(tables / "phases.parquet") if (tables / "phases.parquet").exists() \
        else pd.DataFrame()
    if len(ours):
        info = runs.set_index("run_id")[[*cells.CELL, "tracer"]]
        coll = ours[ours["collective"].notna()].groupby("run_id").agg(
            collectives=("collective", "count"), bytes=("bytes", "sum"),
            steps=("step", "nunique"), ranks=("rank", "nunique"))
        coll["MB_per_step_per_rank"] = coll["bytes"] / coll["steps"] / coll["ranks"] / 1e6
        summary = ours.groupby("run_id").agg(intervals=("phase", "count"),
                                             sources=("source", lambda s: ", ".join(sorted(set(s)))))
        parts.append("<h3>Traces of these runs</h3><p>Intervals converted per run and the "
                     "gradient collectives the trace records, with bytes where the framework "
                     "exposes them.</p>")
        parts.append(_table(info.join(summary, how="inner").join(coll, how="left").reset_index()))
    errors = runs[runs.get("trace_errors", pd.Series(dtype=str)).notna()] \
        if "trace_errors" in runs else pd.DataFrame()
    if len(errors):
        parts.append("<h3>Unreadable traces</h3>" + _table(errors[["run_id", "trace_errors"]]))
    imported = tables / "imported.parquet"
    if imported.exists():
        table = pd.read_parquet(imported)
        totals = table[table["phase"] != "step"].pivot_table(
            index=["run_id", "source"], columns="phase", values="dur_ns", aggfunc="sum") / 1e9
        counts = table.groupby(["run_id", "source"]).agg(ranks=("rank", "nunique"),
                                                          intervals=("phase", "count"))
        parts.append("<h3>Imported traces</h3><p>Seconds in each phase (all ranks) after "
                     "mapping regions with traces/rules.yaml.</p>")
        parts.append(_table(counts.join(totals).reset_index()))
    if len(parts) == 1:
        parts.append("<p>No traces (tracer: none, and none imported).</p>")
    return "".join(parts)


def energy_section(runs: pd.DataFrame, figures: Path) -> str:
    """Energy per run and per image by framework and processes, or why it
    was not measured."""
    ok = cells.with_setting(runs[runs["status"] == "ok"])
    if "energy_status" not in ok:
        return "<h2>Energy</h2><p>No energy figures in these tables.</p>"
    measured = ok[ok["energy_j"].notna()]
    unmeasured = ok[ok["energy_j"].isna()]
    text = "<h2>Energy</h2>"
    if len(measured):
        table = measured.groupby(cells.CELL + ["energy_status"]).agg(
            runs=("run_id", "count"), energy_j=("energy_j", "mean"),
            energy_per_epoch_j=("energy_per_epoch_j", "mean"),
            energy_per_image_j=("energy_per_image_j", "mean")).reset_index()
        text += (f"{_figure(figures / 'energy.png', 'energy per image')}"
                 f"<p>Joules over the run clock's window (first data touched to the last "
                 f"evaluation), all nodes: Kwollect's node power where it measured every "
                 f"node, else RAPL (CPU packages and DRAM) plus NVML (GPUs); means over "
                 f"replications.</p>{_table(table)}")
    if len(unmeasured):
        reasons = unmeasured.groupby("energy_status").size().rename("runs").reset_index()
        lead = "Energy was not measured" if measured.empty else \
            f"Energy was not measured for {len(unmeasured)} run(s)"
        text += f"<p>{lead}; the reasons, as each run reported them:</p>{_table(reasons)}"
    return text


def accuracy_section(runs: pd.DataFrame, figures: Path) -> str:
    text = (f"<h2>Accuracy</h2>{_figure(figures / 'accuracy.png', 'accuracy')}"
            f"<p>Evaluation is distributed: each rank scores its share of the test set.</p>"
            f"<h3>Time to accuracy</h3>")
    table = accuracy.summary(runs)
    if table.empty:
        return text + ("<p>Not measured: set <code>target_accuracy</code> under "
                       "<code>fixed</code> in the design (it only re-analyses the runs).</p>")
    return (text + f"{_figure(figures / 'time_to_accuracy.png', 'time to accuracy')}"
            f"<p>The run clock starts just before the training data is touched and stops "
            f"at the end of the first evaluation at or above target_accuracy (MLPerf's "
            f"rule), so it counts data loading and evaluation. A run that never reaches "
            f"the target is counted in <i>runs</i> but not in <i>reached</i>; the means "
            f"are over the runs that reached it, and so is energy_to_accuracy_j (the "
            f"joules up to that evaluation, where energy was measured). Accuracy is only "
            f"checked where an epoch evaluates (eval_every).</p>{_table(table)}")


def compression_section(runs: pd.DataFrame, figures: Path) -> str:
    """Gradient compression: measured bytes per step against time per step
    and final accuracy, which framework can run which codec, the codecs'
    error bounds."""
    text = "<h2>Gradient compression</h2>"
    table = compression_table.summary(runs)
    if compression_table.varies(runs) and len(table):
        text += (f"{_figure(figures / 'compression.png', 'compression')}"
                 f"<p>comm_bytes_per_step: the bytes of the buffers each rank handed to "
                 f"collectives in a measured step (counted where they are handed over; the "
                 f"lossless codec's real compressed lengths), mean over steps and ranks. "
                 f"bytes_vs_none divides it by the same framework's uncompressed runs. These "
                 f"are input buffers: a ring all-reduce puts 2(p-1)/p of its buffer on the "
                 f"wire per rank, an all-gather (p-1) times it, so at p ranks int8's gather "
                 f"sends p/8 of fp32's all-reduce bytes and stops saving at 8 ranks.</p>"
                 f"{_table(table)}")
    else:
        text += ("<p>One compression in these runs (set <code>compression</code> as a "
                 "factor to compare them).</p>")
    return (text + f"<h3>Which framework can run which compression</h3>"
            f"{_table(compression_table.support())}"
            f"<h3>Codecs and their error bounds</h3>{_table(compression_table.codecs())}")


def gate_section(tables: Path) -> str:
    """The same-model gate's verdict: every builder's layers and parameters
    against the shared specification."""
    path = tables / "model_gate.json"
    if not path.exists():
        return "<h2>Same model everywhere</h2><p>The same-model gate did not run.</p>"
    gate = json.loads(path.read_text())
    per_model = gate.get("models") or {gate["model"]: gate}  # one model: the older format
    rows = [{"model": model, "dataset": name, "builder": builder, "status": entry["status"],
             "parameters": entry.get("total_params"),
             "BN running statistics": entry.get("total_running_stats", 0),
             "checked on": entry.get("checked_on", entry.get("reason")),
             "problems": "; ".join(entry.get("problems", []))}
            for model, result in per_model.items()
            for name, d in result["datasets"].items()
            for builder, entry in d["builders"].items()]
    names = ", ".join(html.escape(m) for m in per_model)
    return (f"<h2>Same model everywhere</h2><p>Same-model gate: <b>{gate['status']}</b> "
            f"(models {names}: layer shapes, trainable parameters and BN running statistics "
            f"of every builder against the shared specification).</p>"
            f"{_table(pd.DataFrame(rows))}")


def frameworks_section(design: Design) -> str:
    names = design.factors.get("framework", [design.fixed.get("framework")])
    rows = pd.DataFrame([{"framework": n, "launcher": registry.FRAMEWORKS[n].launcher,
                          "phases exposed": ", ".join(registry.FRAMEWORKS[n].exposes),
                          "notes": registry.FRAMEWORKS[n].notes} for n in names])
    return (f"<h2>Frameworks and the phases they expose</h2>{_table(rows)}"
            f"{_not_compared(names)}")


def _not_compared(names: list[str]) -> str:
    """Every registered framework this design leaves out, and whether it is
    installed here: none is dropped without a word."""
    from ddlcompare import envs
    rows = [{"framework": n, "environment here": "built" if envs.has_module(info.env, info.probe)
             else f"not built: {envs.how_to_build(info.env)}"}
            for n, info in registry.FRAMEWORKS.items() if n not in names]
    if not rows:
        return ""
    return ("<h3>Frameworks not in this design</h3><p>Add them to the design's "
            "<code>framework</code> factor to compare them.</p>" + _table(pd.DataFrame(rows)))


def build(design: Design, tables: Path, out: Path) -> Path:
    runs = pd.read_parquet(tables / "runs.parquet")
    phases = pd.read_parquet(tables / "step_phases.parquet")
    figures = tables / "figures"
    body = "".join([design_section(design, runs), status_section(design, runs),
                    results_section(runs, figures), phases_section(runs, phases, figures),
                    frameworks_section(design), gate_section(tables),
                    bottlenecks_section(runs, phases),
                    statistics_section(design, runs), accuracy_section(runs, figures),
                    energy_section(runs, figures),
                    compression_section(runs, figures),
                    traces_section(runs, tables)])
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>ddl-compare: {html.escape(design.name)}</title><style>{STYLE}</style>"
            f"</head><body><h1>ddl-compare report: {html.escape(design.name)}</h1>"
            f"{body}</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, page)
    return out
