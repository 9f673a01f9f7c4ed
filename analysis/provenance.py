"""What was run and on what: the report's sections on the design and its
provenance, the runs' status, the frameworks compared (and those left out)
and the same-model gate's verdict."""

from __future__ import annotations

import json

import pandas as pd

from analysis.section import Code, Section, Strong
from ddlcompare.run import machine_load
from ddlcompare.plan.design import Design
from frameworks import registry


def design_section(ctx) -> Section:
    """The design, its settings and the software and hosts it ran on."""
    design, runs = ctx.design, ctx.runs
    factors = pd.DataFrame(
        [{"factor": f, "levels": ", ".join(map(str, v))} for f, v in design.factors.items()]
    )
    fixed = pd.DataFrame([{"setting": k, "value": v} for k, v in design.fixed.items()])
    commits = ", ".join(sorted(runs["harness_commit"].dropna().unique())) or "unknown"
    versions = runs[[c for c in runs.columns if c.startswith("version_")] + ["mpi", "cpu"]]
    versions = versions.dropna(how="all").drop_duplicates()
    hosts = ", ".join(sorted(set(runs["hosts"].dropna()))) or "none"
    return (
        Section("design", "Design and provenance")
        .para(
            "Design ",
            Code(design.name),
            " from ",
            Code(design.source),
            ", settings hash ",
            Code(design.settings_hash),
            f", seed {design.seed}, {replication_words(design)}, run order "
            f"{'randomized' if design.randomize else 'as listed'}. "
            f"batch_size is per process; global_batch = batch_size x processes.",
        )
        .heading("Factors")
        .table(factors)
        .heading("Fixed settings")
        .table(fixed)
        .heading("Software and hosts")
        .para("Harness commit(s): ", Code(commits), f"; hosts: {hosts}")
        .table(versions)
    )


def replication_words(design: Design) -> str:
    rule = design.adaptive
    if not rule:
        return f"{design.replications} replication(s)"
    return (
        f"replications auto ({rule.least} to {rule.most} per cell, until the 95 % interval "
        f"of throughput is within {rule.target_half_width * 100:g} % of the mean)"
    )


def status_section(ctx) -> Section:
    """How many runs succeeded per cell, which did not and why, and which
    were measured beside foreign load."""
    design, runs = ctx.design, ctx.runs
    cell = [f for f in design.path_factors()]
    counts = runs.groupby(cell + ["status"]).size().unstack(fill_value=0)
    loaded = runs["loaded"].eq(True) if "loaded" in runs else pd.Series(False, index=runs.index)
    counts["measured beside foreign load"] = loaded.groupby([runs[c] for c in cell]).sum()
    counts = counts.reset_index()
    problems = runs[runs["status"] != "ok"][["run_id", *cell, "rep", "status", "reason"]]
    ok = int((runs["status"] == "ok").sum())
    out = Section("status", "Run status").para(f"{ok} of {len(runs)} runs ok.")
    out.heading("Runs per design cell, by status").table(counts)
    if not problems.empty:
        out.heading("Runs that did not succeed").table(problems)
    if loaded.any():
        beside = runs[loaded][["run_id", *cell, "rep", "foreign_cpu_share", "busiest_foreign"]]
        out.heading("Runs measured beside foreign load").para(
            "Not clean: other processes took "
            f"at least {machine_load.LOADED_SHARE:.0%} of the machine's CPU time during their "
            f"measured steps."
        )
        out.table(beside)
    return out


def frameworks_section(ctx) -> Section:
    """The frameworks compared, their launchers and the phases they expose;
    every other registered framework and how to compare it."""
    names = ctx.design.factors.get("framework", [ctx.design.fixed.get("framework")])
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
    out = Section("frameworks", "Frameworks and the phases they expose").table(rows)
    # Every registered framework this design leaves out, told apart: installed
    # here (add it to the design) or not (the command that builds it). None is
    # dropped without a word.
    left_out = [
        _how_to_compare(n, info) for n, info in registry.FRAMEWORKS.items() if n not in names
    ]
    if left_out:
        out.heading("Frameworks not in this design").para(
            "Every other framework here: installed or not, and how to compare it (add it "
            "to the design's ",
            Code("framework"),
            " factor).",
        )
        out.table(pd.DataFrame(left_out).sort_values("installed here", kind="stable"))
    return out


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


def gate_section(ctx) -> Section:
    """The same-model gate's verdict: every builder's layers and parameters
    against the shared specification."""
    out = Section("gate", "Same model everywhere")
    path = ctx.tables / "model_gate.json"
    if not path.exists():
        return out.para("The same-model gate did not run.")
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
    return out.para(
        "Same-model gate: ",
        Strong(gate["status"]),
        f" (models {', '.join(per_model)}: layer shapes, trainable parameters and BN running "
        f"statistics of every builder against the shared specification).",
    ).table(pd.DataFrame(rows))
