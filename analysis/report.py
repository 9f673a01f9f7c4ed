"""The HTML report: one self-contained file, figures embedded, nothing fetched.

Sections: design and provenance, run status (failed and missing cells
visible), throughput, accuracy, and what each framework exposes.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

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
    ok = runs[runs["status"] == "ok"]
    summary = pd.DataFrame()
    if not ok.empty:
        summary = (ok.groupby(["framework", "world_size", "batch_size"])
                   .agg(runs=("run_id", "count"), images_per_s=("images_per_s", "mean"),
                        images_per_s_sd=("images_per_s", "std"),
                        time_per_epoch_s=("time_per_epoch_s", "mean"),
                        final_test_accuracy=("final_test_accuracy", "mean"),
                        init_s=("init_s", "mean"))
                   .reset_index())
    return (f"<h2>Throughput</h2>{_figure(figures / 'throughput.png', 'throughput')}"
            f"{_table(summary)}<p>images_per_s is global: images processed by all ranks in "
            f"the measured steps (after warmup_steps) over the slowest rank's wall time; "
            f"evaluation is excluded.</p>"
            f"<h2>Accuracy</h2>{_figure(figures / 'accuracy.png', 'accuracy')}"
            f"<p>Evaluation is distributed: each rank scores its share of the test set.</p>")


def frameworks_section(design: Design) -> str:
    names = design.factors.get("framework", [design.fixed.get("framework")])
    rows = pd.DataFrame([{"framework": n, "launcher": registry.FRAMEWORKS[n].launcher,
                          "phases exposed": ", ".join(registry.FRAMEWORKS[n].exposes),
                          "notes": registry.FRAMEWORKS[n].notes} for n in names])
    return f"<h2>Frameworks and the phases they expose</h2>{_table(rows)}"


def build(design: Design, tables: Path, out: Path) -> Path:
    runs = pd.read_parquet(tables / "runs.parquet")
    figures = tables / "figures"
    body = "".join([design_section(design, runs), status_section(design, runs),
                    results_section(runs, figures), frameworks_section(design)])
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>ddl-compare: {html.escape(design.name)}</title><style>{STYLE}</style>"
            f"</head><body><h1>ddl-compare report: {html.escape(design.name)}</h1>"
            f"{body}</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, page)
    return out
