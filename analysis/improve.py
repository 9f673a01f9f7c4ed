"""How to make it faster: hypotheses from the evidence, ranked per framework;
the design that tests the top ones; and, once it ran, the proof.

Each hypothesis is one change, the phase it acts on and its predicted gain
(the share of the step it saves) with a 95 % interval, from:

- the what-if replays of the critical path (analysis/whatif.py): data
  loading twice as fast (data_load), the straggler removed (the wait at
  the join), fp16 gradients (the exchange on the wire);
- the critical path's communication proper (analysis/critical_path.py):
  the exposed exchange hidden behind backward (an upper bound);
- the runs table: contention removed, each rank's step back to the one
  process step of the same framework and setting, plus the exchange's
  wire time where the network is emulated (for frameworks that own their
  step, Tarantella and LBANN, this needs no trace);
- the kernel's per-thread counters (machine_load): spinning stopped, where
  a run's threads spin (never block, yet take a core). Its other threads
  ran on ``c`` cores and waited for one ``w`` cores' worth; ``k`` cores
  are theirs to take without the spinning (the machine's, less what other
  processes took). Two cases, by whether the cores stay all taken:
  * ``c + w >= k``: the other threads still want more cores than there
    are, so the cores stay the bottleneck and the step's CPU part shrinks
    as the cores they get grow: ``1 - c / min(c + spinning cores, k)``
    (their CPU work per step is kept);
  * ``c + w < k``: the cores are no longer all taken, so no thread waits
    for one; the step sheds the wait of the thread that waited most, its
    share of the window (its CPU and blocked time stay).
  The wire time (as above) does not shrink. The wait the spinning
  accounts for (each thread's wait blamed on what was runnable beside it)
  is shown as evidence, not used: it leaves out the cores the spinning
  held, which the others take once it stops.

Intervals: the t interval over a cell's runs for the replayed changes and
spinning stopped; for contention removed, the t interval of the ratio of
the two cells' mean steps (stats.ratio_factor). Where a design factor
can test the change (REMEDIES), the hypothesis names its two levels:
``ddlc improve`` writes a design that runs those before and after, at
least MIN_REPLICATIONS times each, in one randomized order (so the two
levels interleave in time), and the report's section compares what was
predicted with what was measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis import cells, humanize, stats, summary
from analysis.followup import _plain, _product, located, origin
from analysis.stage_limits import IMPROVE_MIN_REPLICATIONS as MIN_REPLICATIONS, TOP
from analysis.section import Code, Section
from ddlcompare.plan.design import Design
from runfiles.tables import read_runs
from frameworks import registry

# Below this many first-stage runs a cell, a prediction's point moves more
# than the change it predicts can be told apart by (a t interval over 2 runs
# spans 0 to 100 %): ddlc improve says so.
MIN_PREDICTING_RUNS = 3
ALPHA = 0.05
RULE = (
    "per framework and cell, every change the evidence predicts a gain for, largest "
    "predicted gain first; ddlc improve tests the top ones that a design factor can test "
    "(before and after, in one randomized, interleaved order)"
)


@dataclass(frozen=True)
class Remedy:
    """How a design tests a change: its factor, and the level before and after."""

    factor: str
    before: object
    after: object


def remedy(change: str, framework: str) -> Remedy | None:
    """The design factor that tests ``change`` for ``framework``, if any."""
    info = registry.FRAMEWORKS[framework]
    if change in (CONTENTION, SPINNING) and f"{framework}-patched" in registry.FRAMEWORKS:
        return Remedy("framework", framework, f"{framework}-patched")
    if change == "compression fp16" and "fp16" in info.compressions:
        return Remedy("compression", "none", "fp16")
    if change == "straggler removed" and "calibrated" in info.batch_splits:
        return Remedy("batch_split", "even", "calibrated")
    if change == HIDDEN and "fusion_threshold_kib" in getattr(info, "knobs", ()):
        # Smaller buckets than the whole gradient: the first ones start
        # during backward instead of after it.
        return Remedy("fusion_threshold_kib", None, OVERLAP_BUCKET_KIB)
    return None


CONTENTION = "contention removed"
SPINNING = "spinning stopped"
OVERLAP_BUCKET_KIB = 256  # a seventh of the shared CNN's 1.7 MB of gradients
HIDDEN = "exposed exchange hidden"
# The what-if replays' changes (whatif.ASSUMPTIONS) and the phase each acts on.
REPLAYED = {
    "data loading twice as fast": "data_load",
    "straggler removed": "wait at the join",
    "compression fp16": "grad_comm",
}
NEEDS_A_PEER = ("compression fp16", "straggler removed", HIDDEN)


# ------------------------------------------------------------- hypotheses


def hypotheses(runs: pd.DataFrame, phases: pd.DataFrame, found=None) -> pd.DataFrame:
    """Every hypothesis, ranked per framework (largest predicted gain first):
    framework, world_size, setting, change, phase, predicted_gain, low, high,
    runs, evidence, and the factor and levels that test it. ``found``: the
    ok runs' critical path where the caller has it already (the report's
    Context)."""
    ok = summary.ok_runs(runs)
    rows = _replayed(ok, phases, found) + _contention(ok) + _spinning(ok)
    columns = [
        *cells.CELL,
        "change",
        "phase",
        "predicted_gain",
        "low",
        "high",
        "runs",
        "evidence",
        "factor",
        "before",
        "after",
    ]
    if not rows:
        return pd.DataFrame(columns=[*columns, "rank"])
    table = pd.DataFrame(rows)
    tests = [remedy(r.change, r.framework) for r in table.itertuples()]
    table["factor"] = [t.factor if t else None for t in tests]
    table["before"] = [t.before if t else None for t in tests]
    table["after"] = [t.after if t else None for t in tests]
    rate = ok.groupby(cells.CELL)["net_rate_mbit"].first() if "net_rate_mbit" in ok else None
    table["net_rate_mbit"] = (
        [rate.get(tuple(r[c] for c in cells.CELL)) for _, r in table.iterrows()]
        if rate is not None
        else None
    )
    columns.insert(3, "net_rate_mbit")
    table = with_premises(table, ok)
    columns[columns.index("evidence") + 1 : columns.index("evidence") + 1] = ["premise", "test_bed"]
    table = table[table["predicted_gain"] > 0][columns]
    table = table.sort_values(
        ["framework", "predicted_gain"], ascending=[True, False], kind="stable"
    ).reset_index(drop=True)
    table["rank"] = table.groupby("framework").cumcount() + 1
    return table


def _replayed(ok: pd.DataFrame, phases: pd.DataFrame, found=None) -> list[dict]:
    """The what-if replays and the hidden exchange, per cell, from the runs
    with a phase table (``found``: their critical path, if computed)."""
    from analysis import critical_path as cp
    from analysis import whatif

    traced = phases[phases["run_id"].isin(ok["run_id"])] if len(phases) else phases
    if traced.empty:
        return []
    if found is None:
        found = cp.analyse(traced, ok)
    table = whatif.measures(found, ok, whatif.traced_bytes(traced))
    if table.empty:
        return []
    info = ok.set_index("run_id")[cells.CELL]
    replays = whatif.what_ifs(found, table, {}, info, ["framework"])
    per_run = [replays.assign(gain=-replays["change"])[[*cells.CELL, "what_if", "gain"]]]
    hidden = table.set_index("run_id")
    hidden = hidden.drop(columns=[c for c in cells.CELL if c in hidden]).join(info)
    hidden = hidden.assign(what_if=HIDDEN, gain=hidden["comm_s"] / hidden["step_s"])
    exposing = hidden["framework"].map(lambda f: "grad_comm" in registry.FRAMEWORKS[f].exposes)
    per_run.append(hidden[exposing][[*cells.CELL, "what_if", "gain"]])
    changes = pd.concat(per_run)
    # One process has no peer: nothing crosses a wire and nobody arrives late.
    alone = (changes["world_size"] < 2) & changes["what_if"].isin(NEEDS_A_PEER)
    rows = []
    for key, group in changes[~alone].groupby([*cells.CELL, "what_if"]):
        mean, half, n = stats.mean_ci(group["gain"])
        change = key[-1]
        rows.append(
            {
                **dict(zip(cells.CELL, key)),
                "change": change,
                "phase": REPLAYED.get(change, "grad_comm"),
                "predicted_gain": mean,
                "low": mean - half,
                "high": mean + half,
                "runs": n,
                "evidence": _replay_words(change, mean),
            }
        )
    return rows


def _replay_words(change: str, gain: float) -> str:
    if change == HIDDEN:
        return (
            f"the exchange on the critical path (the last arrival at the join to its "
            f"exit) is {gain:.0%} of the step; hiding it behind backward is the most "
            "any overlap can save"
        )
    return f"the critical path replayed with {change} is {gain:.0%} shorter"


def _contention(ok: pd.DataFrame) -> list[dict]:
    """Per framework and setting with runs of one process and of more: the
    step each multi-process cell would have at the one-process step (same
    per-process batch) plus the exchange's wire time."""
    ok = _with_step_and_rate(ok)
    by = ["framework", "batch_size", *[c for c in cells.varied(ok) if c != "batch_size"]]
    by = [c for c in dict.fromkeys(by) if c in ok and c != "net_rate_mbit"]
    rows = []
    for _, group in ok.groupby(by, dropna=False):
        alone = group[group["world_size"] == 1]["step_s"]
        if not len(alone):
            continue
        for key, cell in group[group["world_size"] > 1].groupby(cells.CELL):
            wire = _wire_s(cell)
            steps = cell["step_s"]
            kept = (alone.mean() + wire) / steps.mean()  # the step's share that stays
            # The ratio's t interval on the log scale (Welch-Satterthwaite):
            # a percentile bootstrap of 3 runs a cell held the truth in
            # about 80 % of cases (bench/interval_coverage.py).
            factor = stats.ratio_factor(alone + wire, steps)
            low, high = 1 - kept * factor, 1 - kept / factor
            exposes = registry.FRAMEWORKS[key[0]].exposes
            compute = [p for p in ("forward", "backward", "other") if p in exposes]
            rows.append(
                {
                    **dict(zip(cells.CELL, key)),
                    "change": CONTENTION,
                    "phase": "compute (" + ", ".join(compute) + ")",
                    "predicted_gain": 1 - kept,
                    "low": low,
                    "high": high,
                    # the prediction rests on both cells: the fewer runs say how sure
                    "runs": min(len(alone), len(steps)),
                    "evidence": (
                        f"one process steps in {alone.mean() * 1e3:.0f} ms, {int(key[1])} in "
                        f"{steps.mean() * 1e3:.0f} ms of which the wire needs "
                        f"{wire * 1e3:.0f} ms: the rest is ranks slowing each other"
                        + _spinning_words(cell)
                    ),
                }
            )
    return rows


def _spinning(ok: pd.DataFrame) -> list[dict]:
    """Per cell whose runs had spinning threads: the step without them (see
    the module's docstring), a t interval over the cell's runs."""
    needed = [
        "spinning_threads",
        "spinning_cores",
        "others_cpu_cores",
        "others_wait_cores",
        "others_wait_behind_spinning_cores",
        "others_largest_wait_share",
        "machine_cores",
        "foreign_cpu_share",
    ]
    if any(c not in ok for c in needed):
        return []
    ok = _with_step_and_rate(ok)
    figures = ok[needed].apply(pd.to_numeric, errors="coerce")
    spun = ok[figures["spinning_threads"] > 0]
    rows = []
    for key, cell in spun.groupby(cells.CELL):
        f = figures.loc[cell.index]
        wire = min(_wire_s(cell) / cell["step_s"].mean(), 1.0)
        shares, saturated = _cpu_share_saved(f)
        gains = ((1 - wire) * shares.clip(0, 1)).dropna()
        if gains.empty:
            continue
        mean, half, n = stats.mean_ci(gains)
        rows.append(
            {
                **dict(zip(cells.CELL, key)),
                "change": SPINNING,
                "phase": "the step's CPU time (every phase but the wire)",
                "predicted_gain": mean,
                # each run's gain is a share of its step: so is the interval
                # (a t interval over 2 runs can reach past it)
                "low": max(mean - half, 0.0),
                "high": min(mean + half, 1.0),
                "runs": n,
                "evidence": _spinning_evidence(f, saturated.mean() >= 0.5, wire),
            }
        )
    return rows


def _cpu_share_saved(f: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per run, the share of the step's CPU part that stopping the spinning
    saves, and whether the cores stay all taken without it (the module's
    docstring gives both cases)."""
    c, w = f["others_cpu_cores"], f["others_wait_cores"]
    free = f["machine_cores"] * (1 - f["foreign_cpu_share"].fillna(0))
    saturated = c + w >= free
    cores_then = np.minimum(c + f["spinning_cores"], free)
    share = (1 - c / cores_then.where(cores_then > 0)).where(
        saturated, f["others_largest_wait_share"]
    )
    return share, saturated


def _spinning_evidence(f: pd.DataFrame, saturated: bool, wire: float) -> str:
    said = (
        f"{humanize.count(round(f['spinning_threads'].mean()), 'thread')} per run never blocked yet "
        f"took {f['spinning_cores'].mean():.2f} cores; the others ran on "
        f"{f['others_cpu_cores'].mean():.2f} cores and waited for one "
        f"{f['others_wait_cores'].mean():.2f} cores' worth "
        f"({f['others_wait_behind_spinning_cores'].mean():.2f} of it blamed on the spinning; "
        f"of {f['machine_cores'].mean():.0f} cores, "
        f"{f['foreign_cpu_share'].mean():.0%} taken by other processes): "
    )
    said += (
        "they want more cores than there are even without the spinning, so the "
        "step shrinks as the cores they get grow"
        if saturated
        else "without the spinning the cores are no longer all taken, so the step "
        f"sheds the largest wait of one thread, {f['others_largest_wait_share'].mean():.0%} "
        "of it"
    )
    return said + (f"; the wire's {wire:.0%} of the step stays" if wire > 0 else "")


def _spinning_words(cell: pd.DataFrame) -> str:
    """What the runs' own spinning threads took (machine_load's per-thread
    counters), where any spun: one cause of ranks slowing each other."""
    if "spinning_threads" not in cell:
        return ""
    threads = pd.to_numeric(cell["spinning_threads"], errors="coerce")
    if not (threads > 0).any():
        return ""
    cores = pd.to_numeric(cell["spinning_cores"], errors="coerce").mean()
    return (
        f"; {humanize.count(round(threads.mean()), 'thread')} per run never blocked yet took {cores:.2f} "
        "cores (busy-polling: run.json's machine_load.spinning)"
    )


def _with_step_and_rate(ok: pd.DataFrame) -> pd.DataFrame:
    """The runs with their step (s) and emulated link rate (NaN on the
    machine's own network), as _wire_s reads them."""
    ok = ok.assign(step_s=ok["world_size"] * ok["batch_size"] / ok["images_per_s"])
    rate = pd.to_numeric(ok.get("net_rate_mbit", pd.Series(np.nan, index=ok.index)), "coerce")
    return ok.assign(net_rate=rate.where(rate > 0))


def _wire_s(cell: pd.DataFrame) -> float:
    """Seconds a node's share of the exchange takes on the emulated link (0
    on the machine's own): what the link counters saw each node send per
    step (net_tx_bytes_per_step over the nodes), else a ring all-reduce of
    the bytes a rank hands to collectives."""
    rate = cell["net_rate"].mean()
    if not np.isfinite(rate):
        return 0.0
    p = cell["world_size"].iloc[0]
    sent = _mean(cell, "net_tx_bytes_per_step") / cell["nodes"].iloc[0]
    if not np.isfinite(sent):
        sent = 2 * (p - 1) / p * _mean(cell, "comm_bytes_per_step")
    return sent * 8 / (rate * 1e6) if np.isfinite(sent) else 0.0


def _mean(cell: pd.DataFrame, column: str) -> float:
    return float(cell[column].mean()) if column in cell else math.nan


# -------------------------------------------------------------- premises

# What each change assumes of the cell, and which properties of the test bed
# would make that assumption true here and not on a cluster node.
PREMISES = {
    CONTENTION: ("ranks share cores", ("oversubscribed", "foreign load")),
    SPINNING: ("a thread spins, taking a core the others need", ("oversubscribed", "foreign load")),
    "straggler removed": ("one rank is slower than the others", ("oversubscribed", "foreign load")),
    "data loading twice as fast": ("data loading is slow", ("foreign load",)),
    "compression fp16": ("the wire is slow", ("emulated link",)),
    HIDDEN: ("the wire is slow", ("emulated link",)),
}


def with_premises(table: pd.DataFrame, ok: pd.DataFrame) -> pd.DataFrame:
    """Each hypothesis with its premise and, in ``test_bed``, the properties
    of the test bed that make the premise true in its cell ("" where none
    does; None where the runs do not say). A test-bed premise proposes no
    change to a framework's code: its framework-swap test is dropped. No
    interval from fewer than MIN_PREDICTING_RUNS runs."""
    bed = _test_bed(ok)
    premises, found = [], []
    for row in table.itertuples():
        premise, relevant = PREMISES.get(row.change, (row.change, ()))
        props = bed.get(tuple(getattr(row, c) for c in cells.CELL), {})
        known = [p for p in relevant if props.get(p) is not None]
        holds = [p for p in relevant if props.get(p)]
        premises.append(premise)
        found.append(", ".join(holds) if holds or known else None)
    table = table.assign(premise=premises, test_bed=found)
    code_change = table["test_bed"].fillna("").ne("") & table["factor"].eq("framework")
    table.loc[code_change, ["factor", "before", "after"]] = None
    few = table["runs"] < MIN_PREDICTING_RUNS
    table.loc[few, ["low", "high"]] = np.nan
    return table


def _test_bed(ok: pd.DataFrame) -> dict[tuple, dict]:
    """Per cell: whether its runs had more runnable threads than cores
    (oversubscribed), were measured beside heavy foreign load, and ran on
    an emulated link; None where its runs do not say."""
    found = {}
    for key, cell in ok.groupby(cells.CELL):
        loaded = cell["loaded"].dropna() if "loaded" in cell else pd.Series(dtype=bool)
        rate = cell["net_rate_mbit"] if "net_rate_mbit" in cell else pd.Series(np.nan)
        found[key] = {
            "oversubscribed": _oversubscribed(cell),
            "foreign load": bool(loaded.astype(bool).mean() >= 0.5) if len(loaded) else None,
            "emulated link": bool(pd.to_numeric(rate, errors="coerce").notna().any()),
        }
    return found


def _oversubscribed(cell: pd.DataFrame) -> bool | None:
    """More runnable threads than cores in most of the cell's runs, by any
    evidence the runs hold: the kernel's counters (the threads that do not
    spin ran and waited for more cores than other processes left: every
    such thread, the frameworks' helpers too; a spinning thread is the
    framework's, which a change to its code stops, not the test bed's), the
    ranks' compute threads per core they could use (read back), else ranks
    x threads against the machine's cores. None where the runs hold none of
    them. The compute threads alone miss the helpers: two ranks of one
    compute thread on two cores (runnable_per_core 1) still waited for a
    core (the default design's runs, 2026-11-27: 0.3-0.9 cores' worth)."""
    said = []
    kernel = ["others_cpu_cores", "others_wait_cores", "machine_cores"]
    if all(c in cell for c in kernel) and cell[kernel].notna().all(axis=None):
        f = cell[kernel].apply(pd.to_numeric)
        foreign = cell.get("foreign_cpu_share", pd.Series(0.0, index=cell.index))
        free = f["machine_cores"] * (1 - pd.to_numeric(foreign, errors="coerce").fillna(0))
        said.append(bool((f["others_cpu_cores"] + f["others_wait_cores"] > free).mean() >= 0.5))
    if "runnable_per_core" in cell and cell["runnable_per_core"].notna().any():
        said.append(bool((pd.to_numeric(cell["runnable_per_core"]) > 1).mean() >= 0.5))
    elif {"machine_cores", "threads"} <= set(cell) and cell["machine_cores"].notna().any():
        threads = pd.to_numeric(cell["threads"], errors="coerce").fillna(1)
        said.append(bool((cell["procs_per_node"] * threads > cell["machine_cores"]).mean() >= 0.5))
    return any(said) if said else None


# ------------------------------------------------------------------ design


def design_doc(
    design: Design,
    ranked: pd.DataFrame,
    tables: Path,
    top: int = TOP,
    replications: int | None = None,
) -> dict:
    """The design that tests the ``top`` testable hypotheses: each one's
    cell at its factor's level before and after."""
    testable = ranked[ranked["factor"].notna()].sort_values("predicted_gain", ascending=False)
    chosen = testable.drop_duplicates(["framework", "change"]).head(top)
    if chosen.empty:
        raise ValueError(
            "no hypothesis that a design factor can test (see the report's 'How to make it "
            "faster'): nothing to run"
        )
    ok = summary.ok_runs(read_runs(tables / "runs.parquet", design.factors))
    keys = [f for f in design.factors if f in ok]
    combos, tested = [], []
    for h in chosen.to_dict("records"):
        # Every cell of the framework, so that the change is measured at each
        # scale and network of the first stage (predicted where it predicts).
        runs = ok[ok["framework"] == h["framework"]].drop_duplicates(keys)
        for level in (h["before"], h["after"]):
            combos += [
                # the level as the design writes it: a table's NaN (a null
                # 'before') would not match the null other changes' cells
                # take for this factor, and exclude those cells
                {**{k: _level(k, run[k]) for k in keys}, h["factor"]: _level(h["factor"], level)}
                for _, run in runs.iterrows()
            ]
        same = ranked[(ranked["framework"] == h["framework"]) & (ranked["change"] == h["change"])]
        predictions = same[["world_size", "net_rate_mbit", "predicted_gain", "low", "high", "runs"]]
        tested.append(
            _plain(
                {
                    **{
                        k: h[k]
                        for k in ("framework", "change", "phase", "factor", "before", "after")
                    },
                    "predictions": predictions.to_dict("records"),
                }
            )
        )
    factors: dict[str, list] = {}
    for combo in combos:
        for k, v in combo.items():
            factors.setdefault(k, [])
            if v not in factors[k]:
                factors[k].append(v)
    keys = list(factors)
    full = [dict(zip(keys, c)) for c in _product(factors, keys)]
    wanted = [tuple(c.get(k, _default(k, design)) for k in keys) for c in combos]
    exclude = [c for c in full if tuple(c[k] for k in keys) not in set(wanted)]
    from ddlcompare.plan.params import PARAMS

    fixed = {k: v for k, v in design.fixed.items() if k not in factors and v != PARAMS[k].default}
    replications = max(MIN_REPLICATIONS, replications or 0, design.replications)
    return _plain(
        {
            "name": f"{design.name}-improve",
            "factors": factors,
            "fixed": fixed,
            "replications": replications,
            "seed": design.seed,
            "randomize": True,  # before and after interleave in one shuffled order
            "exclude": exclude,
            "zip": [],
            "follow_up": {
                **origin(
                    design,
                    tables,
                    RULE,
                    len(combos) * replications,
                    [
                        {k: h[k] for k in ("framework", "change", "factor", "before", "after")}
                        for h in tested
                    ],
                    [],
                ),
                "hypotheses": tested,
            },
        }
    )


def _level(name: str, value):
    """A runs-table value as the design writes the level: null for a missing
    one, an int for an int setting (parquet stores them as floats beside NaN)."""
    from ddlcompare.plan.params import PARAMS

    value = _plain(value)
    if value is None:
        return None
    if PARAMS[name].kind is int and float(value).is_integer():
        return int(value)
    return value


def _default(name: str, design: Design):
    from ddlcompare.plan.params import PARAMS

    return design.fixed.get(name, PARAMS[name].default)


def write(design: Design, tables: Path, out: Path, top: int = TOP, replications=None) -> dict:
    from analysis import critical_path as cp
    from runfiles.atomic import write_text

    runs = read_runs(tables / "runs.parquet", design.factors)
    ranked = hypotheses(runs, cp.phase_table(tables))
    doc = located(design_doc(design, ranked, tables, top, replications), out.parent)
    header = (
        f"# The test of {design.name}'s top hypotheses (written by ddlc improve): each\n"
        f"# change's cell before and after, replications interleaved in a random order.\n"
    )
    write_text(out, header + yaml.safe_dump(doc, sort_keys=False))
    return doc


# ------------------------------------------------------------------- proof


def proof(runs: pd.DataFrame, tested: list[dict]) -> pd.DataFrame:
    """Per tested hypothesis and scale: the predicted and measured change in
    step time and throughput (after over before, 95 % intervals), Welch's
    p-value on log step time, Holm-adjusted over every comparison, and the
    final test accuracy before and after; ``held`` says whether the measured
    step change lies inside the predicted interval."""
    ok = summary.ok_runs(runs)
    ok = ok.assign(step_s=ok["world_size"] * ok["batch_size"] / ok["images_per_s"])
    rows = []
    for h in tested:
        factor = h["factor"]
        if factor not in ok:
            continue
        same = [c for c in cells.varied(ok) if c not in (factor, "setting")]
        scope = ok[ok["framework"].isin({h["framework"], h["before"], h["after"]})]
        for key, group in scope.groupby(["nodes", "procs_per_node", *same], dropna=False):
            before = group[group[factor] == h["before"]]
            after = group[group[factor] == h["after"]]
            if before.empty or after.empty:
                continue
            rows.append(_compare(h, key, before, after))
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["p_holm"] = stats.holm(table["p_raw"], ALPHA)[0]
    table["significant"] = table["p_holm"] < ALPHA
    return table


def _compare(h: dict, key: tuple, before: pd.DataFrame, after: pd.DataFrame) -> dict:
    step_change, step_low, step_high = _ratio_ci(before["step_s"], after["step_s"])
    thr_change, thr_low, thr_high = _ratio_ci(before["images_per_s"], after["images_per_s"])
    p, _ = stats.welch(np.log(before["step_s"]), np.log(after["step_s"]))
    predicted = _prediction(h, before)
    low, high = -predicted.get("high", math.nan), -predicted.get("low", math.nan)
    acc_b, acc_b_half, _ = stats.mean_ci(before.get("final_test_accuracy", pd.Series(dtype=float)))
    acc_a, acc_a_half, _ = stats.mean_ci(after.get("final_test_accuracy", pd.Series(dtype=float)))
    return {
        "change": h["change"],
        "test": f"{h['factor']}: {h['before']} -> {h['after']}",
        "scale": humanize.scale(key[0], key[1]),
        "net_rate_mbit": before["net_rate_mbit"].iloc[0] if "net_rate_mbit" in before else None,
        "runs_before": len(before),
        "runs_after": len(after),
        "predicted_step_change": -predicted.get("predicted_gain", math.nan),
        "predicted_low": low,
        "predicted_high": high,
        # the goal: the measured change within the prediction's stated interval
        "held": bool(low <= step_change <= high) if np.isfinite([low, high]).all() else None,
        "step_before_ms": before["step_s"].mean() * 1e3,
        "step_after_ms": after["step_s"].mean() * 1e3,
        "step_change": step_change,
        "step_change_low": step_low,
        "step_change_high": step_high,
        "throughput_change": thr_change,
        "throughput_change_low": thr_low,
        "throughput_change_high": thr_high,
        "p_raw": p,
        "accuracy_before": acc_b,
        "accuracy_before_ci": acc_b_half,
        "accuracy_after": acc_a,
        "accuracy_after_ci": acc_a_half,
    }


def _prediction(h: dict, runs: pd.DataFrame) -> dict:
    """The hypothesis's prediction at these runs' scale and network, if any."""
    rate = runs["net_rate_mbit"].iloc[0] if "net_rate_mbit" in runs else None
    for p in h.get("predictions", []):
        same_rate = _same(p.get("net_rate_mbit"), rate)
        if p["world_size"] == runs["world_size"].iloc[0] and same_rate:
            return {k: v if v is not None else math.nan for k, v in p.items()}
    return {}


def _same(a, b) -> bool:
    missing = [v is None or (isinstance(v, float) and math.isnan(v)) for v in (a, b)]
    return all(missing) or (not any(missing) and float(a) == float(b))


def _ratio_ci(before: pd.Series, after: pd.Series) -> tuple[float, float, float]:
    """after / before - 1 and its 95 % interval (Fieller's, by the delta
    method on the log of the means' ratio)."""
    mb, ma = before.mean(), after.mean()
    change = ma / mb - 1
    if min(len(before), len(after)) < 2:
        return change, math.nan, math.nan
    var = before.var(ddof=1) / len(before) / mb**2 + after.var(ddof=1) / len(after) / ma**2
    dof = max(min(len(before), len(after)) - 1, 1)
    half = stats.t_quantile(dof) * math.sqrt(var)
    ratio = math.log(ma / mb)
    return change, math.exp(ratio - half) - 1, math.exp(ratio + half) - 1


# ----------------------------------------------------------------- section


def section(ctx) -> Section:
    """The report's "How to make it faster": the ranked hypotheses; in a
    design written by ddlc improve, the proof of those it tested."""
    origin = ctx.design.follow_up or {}
    out = Section("improve", "How to make it faster")
    if origin.get("hypotheses"):
        found = proof(ctx.runs, origin["hypotheses"])
        out.para(
            "This design tests the hypotheses below, each before and after in one "
            "randomized order. Changes are after over before: negative step change, "
            "positive throughput change is faster. Intervals 95 %; p-values Welch's on "
            "log step time, Holm-adjusted over every row."
        )
        out.items([_proof_words(r) for r in found.to_dict("records")])
        out.table(found, caption="predicted against measured")
    ranked = hypotheses(ctx.runs, ctx.phases, ctx.critical_path)
    if ranked.empty:
        return out.para(
            "No hypothesis: no run of more than one process, or no phase table, "
            "from which to predict a gain."
        )
    best = ranked[ranked["rank"] == 1]
    out.items(
        [
            f"{r['framework']}, {humanize.processes(r['world_size'])}, {r['setting']}: "
            f"{r['change']}, acting on {r['phase']}, would save {_interval(r)} of the step, "
            f"if {r['premise']}: {r['evidence']}." + _premise_words(r)
            for r in best.to_dict("records")
        ]
    )
    out.para(
        Code(f"./ddlc improve --design {ctx.design.source}"),
        f" writes and runs the design that tests the top {TOP} testable hypotheses ({RULE}; "
        f"at least {MIN_REPLICATIONS} replications).",
    )
    # low and high are the predicted gain's interval: named so, they read as percentages
    shown = ranked.rename(columns={"low": "predicted_gain_low", "high": "predicted_gain_high"})
    return out.table(shown, caption="every hypothesis, ranked per framework")


def _premise_words(row: dict) -> str:
    """Whether the premise is the test bed's, and then no code change."""
    bed = row.get("test_bed")
    if isinstance(bed, str) and bed:
        return (
            f" The premise is a property of this test bed ({bed}): it would not hold on a "
            "node with a core per thread, no other load and a real network, so no change to "
            "the framework's code is proposed"
            + (f"; {_test_words(row).strip()}" if isinstance(row["factor"], str) else ".")
        )
    unknown = " (whether the test bed makes it true, its runs do not say)" if bed is None else ""
    return _test_words(row) + unknown


def _test_words(row: dict) -> str:
    """How a design tests the hypothesis, or that no setting can yet (the
    factor is missing, NaN in the ranked table, where none applies)."""
    if isinstance(row["factor"], str) and row["factor"]:
        return f" Tested by {row['factor']}: {row['before']} -> {row['after']}."
    return " No design setting tests it: a change to the framework's code would."


def _interval(row: dict) -> str:
    if not np.isfinite(row["low"]):
        return (
            f"{humanize.percent(row['predicted_gain'], 2)} (from {humanize.count(int(row['runs']), 'run')}: "
            f"no interval; {MIN_PREDICTING_RUNS} runs a cell give one)"
        )
    return (
        f"{humanize.percent(row['predicted_gain'], 2)} (95 % interval "
        f"{humanize.percent(row['low'], 2)} to {humanize.percent(row['high'], 2)})"
    )


def _proof_words(r: dict) -> str:
    predicted = (
        f"predicted {r['predicted_step_change']:+.0%} [{r['predicted_low']:+.0%}, "
        f"{r['predicted_high']:+.0%}], "
        if np.isfinite(r["predicted_step_change"])
        else "no prediction at this scale, "
    )
    held = {True: " (inside the predicted interval)", False: " (outside the predicted interval)"}
    verdict = "significant" if r["significant"] else "not significant"
    return (
        f"{r['change']}, {r['test']} at {r['scale']}: step {predicted}measured "
        f"{r['step_change']:+.0%} [{r['step_change_low']:+.0%}, {r['step_change_high']:+.0%}]"
        f"{held.get(r['held'], '')} "
        f"({r['step_before_ms']:.0f} -> {r['step_after_ms']:.0f} ms; p = {r['p_holm']:.2g} "
        f"after Holm, {verdict}); throughput {r['throughput_change']:+.0%}; test accuracy "
        f"{r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f}."
    )
