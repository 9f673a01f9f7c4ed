"""What was run and on what: the report's sections on the design and its
provenance, the runs' status, the frameworks compared (and those left out)
and the same-model gate's verdict."""

from __future__ import annotations


import pandas as pd

from analysis import humanize
from analysis.section import Code, Section, Strong
from ddlcompare.plan import devices
from ddlcompare.plan.design import Design
from frameworks import model_gate, registry
from runfiles import records
from runfiles.tables import Damaged, read_record


def design_section(ctx) -> Section:
    """The design, its settings and the software and hosts it ran on."""
    design, runs = ctx.design, ctx.runs
    factors = pd.DataFrame(
        [{"factor": f, "levels": ", ".join(map(str, v))} for f, v in design.factors.items()]
    )
    fixed = pd.DataFrame(
        [
            {"setting": k, "value": humanize.NOT_SET if v is None else v}
            for k, v in design.fixed.items()
        ]
    )
    commits = sorted(runs["harness_commit"].dropna().unique())
    hosts = ", ".join(sorted(_hosts(runs))) or "none recorded"
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
        .para(
            f"Harness commit{'s' if len(commits) > 1 else ''}: ",
            Code(", ".join(commits) or "unknown"),
            f"; hosts: {hosts}",
        )
        .table(software_versions(runs))
    )


def _hosts(runs: pd.DataFrame) -> set[str]:
    """Every host a run recorded (a run's ``hosts`` is a comma-separated
    list, empty where it recorded none)."""
    return {h.strip() for text in runs["hosts"].dropna() for h in str(text).split(",") if h.strip()}


def software_versions(runs: pd.DataFrame) -> pd.DataFrame:
    """The software each framework's runs recorded, one row per framework and
    set of versions (a version row without its framework says nothing)."""
    columns = [c for c in runs.columns if c.startswith("version_")] + ["mpi", "cpu"]
    columns = [c for c in columns if c in runs]
    versions = runs[["framework", *columns]].dropna(how="all", subset=columns)
    return versions.drop_duplicates().sort_values("framework", kind="stable")


def replication_words(design: Design) -> str:
    rule = design.adaptive
    if not rule:
        return humanize.count(design.replications, "replication")
    return (
        f"replications auto ({rule.least} to {rule.most} per cell, as many as the first "
        f"{rule.least} say the 95 % interval of throughput needs to be within "
        f"{rule.target_half_width * 100:g} % of the mean: Stein's two-stage rule)"
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
    problems = runs[runs["status"] != "ok"][[*cell, "rep", "status", "reason"]]
    ok = int((runs["status"] == "ok").sum())
    out = Section("status", "Run status").para(f"{ok} of {len(runs)} runs ok.")
    if said := order_words(runs):
        out.para(said)
    out.heading("Runs per design cell, by status").table(counts)
    if not problems.empty:
        out.heading("Runs that did not succeed").table(problems)
    if loaded.any():
        shown = [*cell, "rep", "foreign_cpu_share", "busiest_foreign", "machine_shared"]
        beside = runs[loaded][[c for c in shown if c in runs]]
        out.heading("Runs measured beside foreign load").para(
            "Not clean: other processes took "
            f"at least {records.LOADED_SHARE:.0%} of the machine's CPU time during their "
            f"measured steps, or the run held the machine shared with other runs of ours "
            f"that only checked correctness (machine_shared)."
        )
        out.table(beside)
    return out


def order_words(runs: pd.DataFrame) -> str | None:
    """Whether the runs executed in the design's randomized order (its
    ``order``; their run.json's ``start``): drifting load then falls on
    every level alike."""
    if not {"order", "start"} <= set(runs):
        return None
    started = runs.dropna(subset=["start"]).sort_values("start")
    if len(started) < 2:
        return None
    executed = started["order"].tolist()
    out_of_order = sum(a > b for a, b in zip(executed, executed[1:]))
    if not out_of_order:
        return (
            f"Executed order: the {len(started)} runs started in the design's randomized "
            "order (the runs table's order and start)."
        )
    from scipy import stats  # here: only runs out of order need it

    tau = stats.kendalltau(started["order"], range(len(started))).statistic
    return (
        f"Executed order: of {len(started)} runs, {out_of_order} started after a run later in "
        f"the design's randomized order (Kendall's tau {tau:.2f} between the design's order "
        "and the executed one; 1 is the design's order): reruns, a second workflow, or a "
        "scheduler's own order; the runs table's order and start say which."
    )


def frameworks_section(ctx) -> Section:
    """The frameworks compared, their launchers and the phases they expose;
    every other registered framework and how to compare it."""
    names = _design_frameworks(ctx.design)
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
        _how_to_compare(n, info, _design_devices(ctx.design))
        for n, info in registry.FRAMEWORKS.items()
        if n not in names
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


def _design_devices(design: Design) -> list[str]:
    return list(design.factors.get("device", [design.fixed.get("device", "cpu")]))


def _how_to_compare(name: str, info: registry.AdapterInfo, devices_used: list[str]) -> dict:
    from ddlcompare.plan import envs

    command = envs.how_to_build(info.env)
    refused = [p for d in devices_used if (p := devices.device_problem(name, info, d))]
    if len(refused) == len(devices_used):  # the plan refuses it on every device of the design
        installed = "yes" if envs.has_module(info.env, info.probe) else "no"
        how = f"not on this design's device: {refused[0]}"
    elif envs.has_module(info.env, info.probe):
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
    gate = read_record(path)
    if not gate.get("models") and "model" not in gate:
        raise Damaged(f"{path}: names no model; delete it, and the workflow writes it again")
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
    verdict, next_step = gate_verdict(rows, _design_frameworks(ctx.design))
    out.para(
        "Same-model gate: ",
        Strong(verdict),
        f" (models {', '.join(per_model)}: layer shapes, trainable parameters and BN running "
        f"statistics of each builder this design uses against the shared specification).",
    )
    if next_step:
        out.para(next_step)
    return out.table(pd.DataFrame(rows))


def _design_frameworks(design: Design) -> list[str]:
    return list(design.factors.get("framework", [design.fixed.get("framework")]))


def gate_verdict(rows: list[dict], used: list[str]) -> tuple[str, str]:
    """The gate's verdict for a design's frameworks, and the next step where
    it is not a pass: a builder no framework of the design uses (the Keras
    builder of a PyTorch design) does not make the verdict incomplete."""
    mine = [r for r in rows if set(model_gate.frameworks_of(r["builder"])) & set(used)]
    failed = sorted({r["builder"] for r in mine if r["status"] == "fail"})
    unchecked = [r for r in mine if r["status"] not in ("pass", "fail")]
    if failed:
        return "fail", (
            f"Next step: the {', '.join(failed)} builder's model differs from the "
            "specification (the problems column says where); its results compare "
            "different models until it is fixed."
        )
    if unchecked:
        first = unchecked[0]
        return "incomplete", (
            f"Next step: the {first['builder']} builder (used by "
            f"{', '.join(sorted(set(model_gate.frameworks_of(first['builder'])) & set(used)))}) "
            f"was not checked ({first['checked on'] or 'no reason recorded'}); set up its "
            "environment (the Frameworks section says how), then run ./ddlc run again, "
            "which checks it."
        )
    unused = sorted({r["builder"] for r in rows if r not in mine and r["status"] != "pass"})
    return "pass", (
        f"Not checked, and used by no framework of this design: {', '.join(unused)}."
        if unused
        else ""
    )
