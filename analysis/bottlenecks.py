"""Phase breakdowns and bottlenecks, from the phase table (phases.parquet)
and the results table (runs.parquet) only.

Every finding is a number and a sentence. Step phases are those with
step >= 0; the run's warm-up steps are left out, as they are of throughput.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import cells, critical_path, humanize, phase_recording, stats
from analysis.section import Section
from frameworks import registry
from runfiles.phases import STEP_PHASES

STRAGGLER_MARGIN = 0.05  # later than the others by 5 % of the median step time


def measured_steps(phases: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    warmup = runs.set_index("run_id")["warmup_steps"]
    steps = phases[phases["step"] >= 0]
    return steps[steps["step"] >= steps["run_id"].map(warmup)]


def per_step(phases: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run, rank and step: each phase's time in seconds, the
    step's wall time, and the arrival at the gradient synchronisation."""
    steps = measured_steps(phases, runs)
    wide = (
        steps.pivot_table(
            index=["run_id", "rank", "step"],
            columns="phase",
            values="dur_ns",
            aggfunc="sum",
            fill_value=0,
        )
        / 1e9
    )
    for phase in STEP_PHASES:
        if phase not in wide:
            wide[phase] = 0.0
    bounds = steps.groupby(["run_id", "rank", "step"]).agg(
        start=("start_ns", "min"), end=("end_ns", "max")
    )
    wide["step_s"] = (bounds["end"] - bounds["start"]) / 1e9
    sync = steps[steps["phase"] == "grad_comm"].set_index(["run_id", "rank", "step"])["start_ns"]
    back = steps[steps["phase"] == "backward"].set_index(["run_id", "rank", "step"])["start_ns"]
    # Entry to the gradient synchronisation: the exposed grad_comm where the
    # framework shows it, else the start of backward (DDP all-reduces inside it).
    exposed = wide.groupby("run_id")["grad_comm"].transform("sum") > 0
    wide["sync_entry_ns"] = np.where(exposed, sync.reindex(wide.index), back.reindex(wide.index))
    return wide.reset_index()


def breakdown(phases: pd.DataFrame, runs: pd.DataFrame, cell: list[str]) -> pd.DataFrame:
    """Mean seconds per step in each phase, per run (averaged over ranks),
    then per design cell with its 95 % confidence interval over replications."""
    steps = per_step(phases, runs)
    per_run = steps.groupby("run_id")[list(STEP_PHASES) + ["step_s"]].mean()
    per_run["other"] = (per_run["step_s"] - per_run[list(STEP_PHASES)].sum(axis=1)).clip(lower=0)
    per_run = per_run.join(runs.set_index("run_id")[cell]).reset_index()
    long = per_run.melt(
        id_vars=["run_id", *cell],
        value_vars=[*STEP_PHASES, "other"],
        var_name="phase",
        value_name="seconds_per_step",
    )
    rows = []
    for key, group in long.groupby([*cell, "phase"]):
        mean, half, n = stats.mean_ci(group["seconds_per_step"])
        rows.append(
            {
                **dict(zip([*cell, "phase"], key)),
                "mean": mean,
                "ci_half_width": half,
                "replications": n,
            }
        )
    return pd.DataFrame(rows)


def collective_wait(steps: pd.DataFrame) -> pd.DataFrame:
    """Scalasca's wait at an N x N collective, per instance (one per step):
    latest entry across ranks minus the rank's own entry. The report quotes
    the critical path's (critical_path.WAIT_NAME); bench/critical_path.py
    times this one as its baseline."""
    latest = steps.groupby(["run_id", "step"])["sync_entry_ns"].transform("max")
    return steps.assign(wait_s=(latest - steps["sync_entry_ns"]) / 1e9)


STRAGGLER_COLUMNS = ["run_id", "rank", "late_steps", "late_share", "lost_in", "lost_s"]


def stragglers(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run: the rank most often last at the synchronisation (by more than
    STRAGGLER_MARGIN of the median step), how often, and the phase in which
    it lost the most time against the other ranks in those steps."""
    rows = []
    for run_id, run in steps.groupby("run_id"):
        if run["rank"].nunique() < 2:
            continue
        margin = STRAGGLER_MARGIN * run["step_s"].median() * 1e9
        order = run.sort_values("sync_entry_ns").groupby("step")
        last = order.tail(1).set_index("step")
        second = order.nth(-2).set_index("step")["sync_entry_ns"]
        late = last[(last["sync_entry_ns"] - second.reindex(last.index)) > margin]
        if late.empty:
            rows.append(
                {
                    "run_id": run_id,
                    "rank": None,
                    "late_steps": 0,
                    "late_share": 0.0,
                    "lost_in": None,
                    "lost_s": 0.0,
                }
            )
            continue
        rank = late["rank"].mode().iloc[0]
        steps_late = late[late["rank"] == rank].index
        mine = run[(run["rank"] == rank) & run["step"].isin(steps_late)][list(STEP_PHASES)].mean()
        others = run[(run["rank"] != rank) & run["step"].isin(steps_late)][list(STEP_PHASES)].mean()
        lost = (mine - others).drop("grad_comm")
        rows.append(
            {
                "run_id": run_id,
                "rank": int(rank),
                "late_steps": len(steps_late),
                "late_share": len(steps_late) / run["step"].nunique(),
                "lost_in": lost.idxmax(),
                "lost_s": float(lost.max()),
            }
        )
    # named columns: a study whose runs all have one rank has no rows
    return pd.DataFrame(rows, columns=STRAGGLER_COLUMNS)


def imbalance(steps: pd.DataFrame) -> pd.DataFrame:
    """Load imbalance per run and phase: max over ranks of the mean phase
    time, over the mean across ranks (1 = balanced)."""
    per_rank = steps.groupby(["run_id", "rank"])[list(STEP_PHASES)].mean()
    grouped = per_rank.groupby("run_id")
    ratio = grouped.max() / grouped.mean()
    return ratio.reset_index().melt(id_vars="run_id", var_name="phase", value_name="imbalance")


def waterfall(breakdown_table: pd.DataFrame, cell_keys: list[str]) -> pd.DataFrame:
    """Scaling loss split by phase, for each group of ``cell_keys`` (e.g.
    framework, batch_size) against its smallest world size.

    batch_size is per process, so ideal speedup is N / N0 at unchanged step
    time, and gap = ideal - measured = (N / N0) * sum_p (t_N,p - t_0,p) / t_N
    exactly: each phase's share of the gap is its own term.
    """
    rows = []
    table = breakdown_table.pivot_table(
        index=[*cell_keys, "world_size"], columns="phase", values="mean"
    ).reset_index()
    phases = [c for c in table.columns if c not in (*cell_keys, "world_size")]
    for key, group in table.groupby(cell_keys):
        group = group.sort_values("world_size")
        base = group.iloc[0]
        t0 = base[phases].sum()
        if t0 <= 0:
            continue  # no phase timed (Tarantella's own table): no step time to split
        for _, row in group.iloc[1:].iterrows():
            tn = row[phases].sum()
            if tn <= 0:
                continue
            factor = row["world_size"] / base["world_size"]
            for phase in phases:
                rows.append(
                    {
                        **dict(zip(cell_keys, key if isinstance(key, tuple) else (key,))),
                        "world_size": row["world_size"],
                        "phase": phase,
                        "speedup_lost": factor * (row[phase] - base[phase]) / tn,
                        "ideal_speedup": factor,
                        "speedup": factor * t0 / tn,
                    }
                )
    return pd.DataFrame(rows)


WAIT = critical_path.WAIT_NAME
# The phases whose share of the step is a finding where the framework times
# them apart: the bottleneck's name, and how the finding says it.
STEP_SHARES = {
    "grad_comm": ("exposed communication", "is exposed gradient communication (grad_comm)"),
    "data_load": ("data loading", "is spent in data_load"),
}


def findings(
    phases: pd.DataFrame, runs: pd.DataFrame, path_cells: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The report's bottleneck list: per design cell, a number and a sentence.
    The wait at the gradient exchange is the critical path's figure
    (``path_cells``: critical_path.cell_table, computed from ``phases``
    when not given), so that every section quotes the same one."""
    ok = runs[runs["status"] == "ok"]
    if ok.empty or phases.empty:
        return pd.DataFrame(columns=[*cells.CELL, "bottleneck", "value", "finding"])
    if path_cells is None:
        mine = phases[phases["run_id"].isin(ok["run_id"])]
        path_cells = critical_path.cell_table(critical_path.analyse(mine, ok), ok)
    waits = (
        path_cells.set_index(cells.CELL)["waiting_ms_per_step"]
        if len(path_cells) and "waiting_ms_per_step" in path_cells
        else pd.Series(dtype=float)
    )
    steps = per_step(phases[phases["run_id"].isin(ok["run_id"])], ok)
    cell = cells.CELL
    info = cells.with_setting(ok).set_index("run_id")[cell]
    per_run = (
        steps.assign(named=steps[list(STEP_PHASES)].sum(axis=1))
        .groupby("run_id")
        .agg(
            step_s=("step_s", "sum"),
            grad_comm=("grad_comm", "sum"),
            data_load=("data_load", "sum"),
            named=("named", "sum"),
        )
    )
    per_run = per_run.join(info)
    rows = []

    def add(key, name, value, sentence):
        rows.append(
            {**dict(zip(cell, key)), "bottleneck": name, "value": value, "finding": sentence}
        )

    strag = stragglers(steps).set_index("run_id").join(info)
    imb = imbalance(steps).set_index("run_id").join(info)
    evals = phases[(phases["phase"] == "eval")].groupby("run_id")["dur_ns"].mean() / 1e9
    inits = ok.set_index("run_id")
    for key, group in per_run.groupby(cell):
        # A share of a phase the framework does not time apart (Tarantella
        # and LBANN own the step) would read as a measured 0 %.
        # A run that timed whole steps only (fit_step_phases: false) times none.
        phased = group["named"].sum() > 0
        exposes = registry.FRAMEWORKS[key[0]].exposes if phased else ()
        # where ranks enter the gradient exchange (per_step's sync_entry_ns)
        times_sync = "grad_comm" in exposes or "backward" in exposes
        # Where the exchange is not timed apart (DDP all-reduces inside
        # backward, LBANN waits for it in the optimizer) 0 % would be a claim.
        for phase, (bottleneck, words) in STEP_SHARES.items():
            if phase in exposes:
                share = group[phase].sum() / group["step_s"].sum()
                add(key, bottleneck, share, f"{humanize.percent(share)} of the step {words}.")
        if key[1] > 1 and phased and pd.notna(waits.get(key)):
            add(
                key,
                WAIT,
                waits[key] / 1e3,
                f"The {WAIT} is {humanize.number(waits[key], 'ms')}: "
                f"{critical_path.WAIT_DEFINITION}.",
            )
        if key[1] > 1 and times_sync:
            s = strag[strag.index.isin(group.index)]
            if len(s) and s["late_steps"].sum() > 0:
                worst = s.sort_values("late_share").iloc[-1]
                add(
                    key,
                    "straggler",
                    worst["late_share"],
                    f"Rank {int(worst['rank'])} arrives last in {humanize.percent(worst['late_share'])} of "
                    f"steps, losing most time in {worst['lost_in']} "
                    f"({humanize.number(worst['lost_s'], 's')} per late step).",
                )
        if key[1] > 1:
            # phases never timed on any rank have no imbalance (0 / 0)
            by_phase = imb[imb.index.isin(group.index)].groupby("phase")["imbalance"].mean()
            by_phase = by_phase.dropna()
            if len(by_phase):
                worst_phase, value = by_phase.idxmax(), by_phase.max()
                add(
                    key,
                    "load imbalance",
                    value,
                    f"Most imbalanced phase: {worst_phase} (max/mean across ranks "
                    f"{humanize.number(value)}).",
                )
        init = inits.loc[group.index]
        if init["init_s"].isna().all():  # the runs did not record their start-up
            continue
        share = (
            init["init_s"] / (init["init_s"] + init["time_per_epoch_s"] * init["epochs"])
        ).mean()
        add(
            key,
            "initialisation",
            share,
            f"Initialisation takes {humanize.number(init['init_s'].mean(), 's')}, "
            f"{humanize.percent(share)} of the run.",
        )
    result = pd.DataFrame(rows)
    return pd.concat([result, eval_scaling(evals, info)], ignore_index=True)


def eval_scaling(evals: pd.Series, info: pd.DataFrame) -> pd.DataFrame:
    """Evaluation should shrink as ranks share the test set: its time at N
    ranks against the smallest N, per framework and setting."""
    rows = []
    table = info.join(evals.rename("eval_s"), how="inner")
    for (framework, setting), group in table.groupby(["framework", "setting"]):
        means = group.groupby("world_size")["eval_s"].mean().sort_index()
        if len(means) < 2:
            continue
        base_n, largest = means.index[0], means.index[-1]
        speedup = means.iloc[0] / means.iloc[-1]
        ideal = largest / base_n
        verdict = "scales" if speedup >= 0.5 * ideal else "does not scale"
        rows.append(
            {
                "framework": framework,
                "world_size": largest,
                "setting": setting,
                "bottleneck": "evaluation scaling",
                "value": speedup / ideal,
                "finding": f"Evaluation {verdict} with ranks: "
                f"{humanize.number(means.iloc[0], 's')} at {base_n} against "
                f"{humanize.number(means.iloc[-1], 's')} at {largest} "
                f"(speedup {humanize.number(speedup)} of an ideal {ideal:.0f}).",
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- sections


def phases_section(ctx) -> Section:
    """Time per measured step in each phase, per cell."""
    runs, phases, figures = ctx.runs, ctx.step_phases, ctx.figures
    ok = runs[runs["status"] == "ok"]
    cell = cells.CELL
    table = (
        breakdown(phases[phases["run_id"].isin(ok["run_id"])], ok, cell)
        if len(ok) and len(phases)
        else pd.DataFrame()
    )
    if len(table):
        table = (table.assign(mean=table["mean"] * 1e3)).pivot_table(
            index=cell, columns="phase", values="mean"
        )
        # A cell whose runs timed whole steps only measured no phase: no 0 ms.
        timed = phases.loc[phases["phase"].isin(STEP_PHASES) & (phases["dur_ns"] > 0), "run_id"]
        named = cells.with_setting(ok).assign(named=ok["run_id"].isin(timed))
        named = named.groupby(cell)["named"].any().reindex(table.index, fill_value=False)
        table.loc[~named.to_numpy(), [p for p in STEP_PHASES if p in table]] = np.nan
        table.columns = [f"{phase}_ms" for phase in table.columns]
        table = cells.in_order(table.reset_index(), cell)
    return (
        Section("phases", "Phase breakdown")
        .figure(figures / "phases.png", "phase breakdown")
        .para(
            "Time per measured step in each phase, mean over ranks and "
            "replications; 'other' is step time outside the named phases."
        )
        .items(phase_recording.lines(ok))
        .table(table)
        .figure(figures / "timeline.png", "timeline")
    )


def section(ctx) -> Section:
    """The findings: one number and one sentence per finding and cell."""
    found = ctx.findings
    if len(found):
        found = cells.in_order(found, [*cells.CELL, "bottleneck"])
        found = found.assign(
            value=[_figure(b, v) for b, v in zip(found["bottleneck"], found["value"])]
        )
    return (
        Section("bottlenecks", "Bottlenecks")
        .para(
            "One number and one sentence per finding and design "
            "cell (framework, processes, setting: batch_size and the other factors that "
            "vary)."
        )
        .items(phase_recording.lines(ctx.runs, lacking="no phase of its step is a finding here"))
        .table(found)
    )


def _figure(bottleneck: str, value: float) -> str:
    """A finding's number in its own unit (the column holds several)."""
    if bottleneck == WAIT:
        return humanize.number(value, "s")
    if bottleneck == "load imbalance":
        return f"{humanize.number(value)} (max/mean)"
    return humanize.percent(value)
