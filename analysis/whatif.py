"""What if: a model of step time calibrated on the measured phases, checked
on scales and networks it was not fitted on, and the what-if questions it
answers.

The model, per group (a framework with the factors other than processes,
batch_size and net_rate_mbit fixed), from the critical path analysis of
each run (analysis/critical_path.py):

    step(p, b, n, R) = sum over phases of (u_phase + v_phase b)   compute, per process batch b
                     + untimed                                     gaps between phases
                     + s C(b) e(p)                                 synchronisation skew
                     + 2 (p - 1) alpha + 2 (p - 1) / p n (beta + 8 / R)   ring all-reduce

- compute phases (each rank's window between joins, mean over ranks) are
  linear in the per-process batch; with one batch size measured, they are
  taken proportional to it (u = 0);
- skew is the expected excess of the slowest of p ranks over the mean: e(p)
  is the expected maximum of p standard normals, s the measured skew over
  C e(p) (ranks' compute varies by the same fraction at every scale);
- communication proper (the join's last arrival to its exit, what lies on
  the critical path) follows the alpha-beta model of a ring all-reduce of n
  bytes per rank (comm_bytes_per_step), with the link's rate R in bit/s
  where the network is emulated (net_rate_mbit) and beta the host's own
  cost per byte. alpha and beta come from a non-negative least-squares fit
  to the measured exchange. With one process count measured they cannot
  be told apart: then the MPI all-reduce probe's shape is used where the
  tables hold one (``probe/probe-<P>.json``), scaled to the measured
  exchange, else alpha is taken as 0.

Intervals: the prediction's standard error over the model refitted to 200
bootstrap resamples of the runs (within each measured configuration, of
modified residuals), times Student's t at the runs' degrees of freedom
within configurations, widened by the largest held-out error E measured on
the same group (low / (1 + E), high x (1 + E)); none where no configuration
was run twice. Held-out checks: fit
without the largest process count and predict it; fit at one network rate
and predict another. Each check also gives the naive guess's error (the
step does not change) and how much the compute the model holds fixed
(phases with no communication in them, per image) moved between the runs
fitted on and the runs predicted: on a shared or oversubscribed machine
that drift, not the model, can set the error. The what-ifs replay each measured run's steps with one thing
changed, so they answer at the measured scales.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from analysis import cells, phase_recording, stats
from analysis import critical_path as cp
from analysis.section import Section
from runfiles.phases import STEP_PHASES
from runfiles.tables import read_record

BOOTSTRAP = 200
CONFIDENCE = 0.95
WINDOW_PHASES = list(STEP_PHASES)
# Phases with no communication in them (backward holds DDP's overlapped
# all-reduce): the compute that a held-out check expects unchanged.
FIXED_COMPUTE = ["data_load", "h2d", "forward", "optimizer"]
SCALE = ("world_size", "batch_size", "net_rate_mbit")
# The parts of a run the model is fitted to (the bootstrap resamples them).
MEASURED = [*WINDOW_PHASES, cp.UNTIMED, "skew_s", "comm_s", "step_s"]
ASSUMPTIONS = {
    "compression fp16": "half the bytes on the wire (fp16 gradients); the encoding and decoding "
    "on the host are not modelled (bench/compression_network.py measured them "
    "costing more than they save on fast networks), and so is any change "
    "in accuracy",
    "data loading twice as fast": "every rank's data_load halves; nothing else changes, and the "
    "waiting it caused shrinks as the replay of the steps says",
    "straggler removed": "the rank most often last at the join behaves like the median of the "
    "other ranks in every window; the others are unchanged",
}


# ---------------------------------------------------------------- measures


@functools.cache  # the bootstrap asks for the same few p thousands of times
def expected_max(p: int) -> float:
    """E[max of p independent standard normals] (0 for one)."""
    if p <= 1:
        return 0.0
    x = np.linspace(-8, 8, 4001)
    # scipy.stats.norm's pdf and cdf, to the last bit, without importing
    # scipy.stats (a third of a second of the report's CPU): its pdf is this
    # expression, its cdf scipy.special.ndtr.
    pdf = np.exp(-(x**2) / 2.0) / np.sqrt(2 * np.pi)
    density = p * pdf * special.ndtr(x) ** (p - 1)
    return float(np.trapezoid(x * density, x))


def measures(
    found: cp.CriticalPath, runs: pd.DataFrame, traced_bytes: pd.Series | None = None
) -> pd.DataFrame:
    """One row per analysed run: each window phase's mean seconds per step
    (mean over ranks and joins), untimed, skew, communication proper and
    the measured step (the critical path per join), with the run's scale."""
    if found.joins.empty:
        return pd.DataFrame()
    # Every window counts, the tail after the last join too (it holds the
    # last step's optimizer), so that the parts add up to the path per join.
    n_joins = found.joins.groupby("run_id")["join"].max() + 1
    wide = (
        found.windows.pivot_table(
            index=["run_id", "join", "rank"],
            columns="cause",
            values="ns",
            aggfunc="sum",
            observed=True,
        )
        / 1e9
    )
    wide = wide.reindex(columns=list(cp.CAUSES), fill_value=0.0)
    span = wide.drop(columns=cp.PROPAGATED).sum(axis=1)
    per_join = span.groupby(["run_id", "join"])
    skew = (per_join.max() - per_join.mean()).groupby("run_id").sum() / n_joins
    per_rank = wide.groupby(["run_id", "rank"]).sum()
    table = per_rank.groupby("run_id").mean()[[*WINDOW_PHASES, cp.UNTIMED]]
    table = table.div(n_joins.reindex(table.index), axis=0)
    comm = found.path[found.path["kind"] == cp.COMMUNICATION]
    table["comm_s"] = (
        (comm.groupby("run_id")["dur_ns"].sum() / n_joins / 1e9).reindex(table.index).fillna(0.0)
    )
    # Where backward is the join, the last rank's backward (with the hidden
    # all-reduce) lies in the join, not in a window: it counts as compute.
    joined = found.path[found.path["kind"] == cp.JOIN]
    table["backward"] += (
        (joined.groupby("run_id")["dur_ns"].sum() / n_joins / 1e9).reindex(table.index).fillna(0.0)
    )
    table["skew_s"] = skew
    table["step_s"] = found.path.groupby("run_id")["dur_ns"].sum() / n_joins / 1e9
    info = runs.set_index("run_id")
    table = table.join(
        info[
            [
                c
                for c in (
                    "framework",
                    "world_size",
                    "batch_size",
                    "net_rate_mbit",
                    "comm_bytes_per_step",
                )
                if c in info
            ]
        ],
        how="inner",
    )
    if "net_rate_mbit" not in table:
        table["net_rate_mbit"] = np.nan
    if "comm_bytes_per_step" not in table:
        table["comm_bytes_per_step"] = np.nan
    if traced_bytes is not None:
        table["comm_bytes_per_step"] = table["comm_bytes_per_step"].fillna(traced_bytes)
    return table.reset_index()


def traced_bytes(phases: pd.DataFrame) -> pd.Series:
    """Per run, the bytes a rank handed to collectives per step, from the
    trace's collectives (for runs whose table has no comm_bytes_per_step)."""
    if "collective" not in phases or "bytes" not in phases:
        return pd.Series(dtype="float64")
    coll = phases[
        phases["collective"].notna() & phases["bytes"].notna() & (phases["step"].fillna(-1) >= 0)
    ]
    per_step = coll.groupby(["run_id", "rank", "step"])["bytes"].sum()
    return per_step.groupby("run_id").mean().astype("float64")


def wire_seconds_per_byte(rate_mbit) -> np.ndarray:
    """8 / R: a byte's time on a link of net_rate_mbit (0: the machine's own)."""
    rate = np.asarray(pd.to_numeric(pd.Series(rate_mbit), errors="coerce"), dtype=float)
    return np.where(np.isnan(rate) | (rate <= 0), 0.0, 8 / (rate * 1e6))


def probe_points(tables: Path | None) -> pd.DataFrame:
    """The MPI all-reduce probe's timings (processes, bytes, seconds), where
    the tables hold it (tables/probe/probe-<P>.json)."""
    rows = []
    for path in sorted((Path(tables) / "probe").glob("probe-*.json")) if tables else []:
        doc = read_record(path, "processes", "sizes")
        rows += [
            {"processes": doc["processes"], "bytes": s["bytes"], "seconds": s["seconds"]}
            for s in doc["sizes"]
        ]
    return pd.DataFrame(rows, columns=["processes", "bytes", "seconds"])


# ------------------------------------------------------------------- model


@dataclass
class Model:
    phases: dict  # phase -> (u, v): seconds = u + v * batch_size
    untimed: float
    skew: float  # s: skew = s * compute * e(p)
    alpha: float
    beta: float
    notes: list = field(default_factory=list)

    def compute(self, batch) -> np.ndarray:
        batch = np.asarray(batch, dtype=float)
        return sum(u + v * batch for u, v in self.phases.values())

    def step(self, p, batch, nbytes, rate_mbit) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        compute = self.compute(batch)
        skew = (
            self.skew
            * compute
            * np.array([expected_max(int(q)) for q in np.ravel(p)]).reshape(np.shape(p))
        )
        ring = 2 * (p - 1) / p * np.asarray(nbytes, dtype=float)
        comm = np.where(
            p > 1,
            2 * (p - 1) * self.alpha + ring * (self.beta + wire_seconds_per_byte(rate_mbit)),
            0.0,
        )
        return compute + self.untimed + skew + comm


def fit(table: pd.DataFrame, probe: pd.DataFrame | None = None) -> Model:
    """The model of one group's runs (rows of :func:`measures`)."""
    return _fit(_columns(table), probe)


# What the model is fitted to: the measured parts and the scale.
FITTED = [*MEASURED, "world_size", "batch_size", "comm_bytes_per_step", "net_rate_mbit"]


def _columns(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """The table's fitted columns as float arrays: the bootstrap resamples
    these, not the table (a DataFrame per resample cost most of its time)."""
    return {
        c: np.asarray(pd.to_numeric(table[c], errors="coerce"), dtype=float)
        for c in FITTED
        if c in table
    }


def _mean(values: np.ndarray) -> float:
    """The mean of the values that are not NaN, as pandas takes it."""
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else np.nan


def _distinct(values: np.ndarray) -> int:
    return len(np.unique(values[~np.isnan(values)]))


def _fit(table: dict[str, np.ndarray], probe: pd.DataFrame | None) -> Model:
    notes = []
    phases = {}
    batches = table["batch_size"]
    for phase in WINDOW_PHASES:
        if _distinct(batches) > 1:
            v, u = np.polyfit(batches, table[phase], 1)
        else:
            u, v = 0.0, _mean(table[phase] / batches)
        phases[phase] = (float(u), float(v))
    if _distinct(batches) == 1:
        notes.append("one batch size measured: compute taken proportional to it")
    model = Model(phases, _mean(table[cp.UNTIMED]), 0.0, 0.0, 0.0, notes)
    several = table["world_size"] > 1
    if several.any():
        many = {c: values[several] for c, values in table.items()}
        spread = np.array([expected_max(int(p)) for p in many["world_size"]])
        compute = model.compute(many["batch_size"]) * spread
        # A framework whose phases are not timed has no compute to scale skew by.
        nothing = np.full(len(compute), np.nan)
        model.skew = _mean(np.divide(many["skew_s"], compute, out=nothing, where=compute > 0))
        model.alpha, model.beta = _fit_comm(many, probe, notes)
    else:
        notes.append("no run of more than one process: no skew or communication measured")
    return model


def _fit_comm(many: dict[str, np.ndarray], probe: pd.DataFrame | None, notes: list) -> tuple:
    p = many["world_size"]
    nbytes = many["comm_bytes_per_step"]
    if np.isnan(nbytes).any():
        notes.append(
            "bytes per step unknown: taken as 1, so beta is the seconds per step "
            "per unit of 2(p-1)/p"
        )
        nbytes = np.where(np.isnan(nbytes), 1.0, nbytes)
    x1, x2 = 2 * (p - 1), 2 * (p - 1) / p * nbytes
    y = many["comm_s"] - x2 * wire_seconds_per_byte(many["net_rate_mbit"])
    if len(np.unique(p)) > 1:
        (alpha, beta), _ = _nnls(np.column_stack([x1, x2]), y)
        return float(alpha), float(beta)
    if probe is not None and len(probe) >= 2:
        a, b = _probe_fit(probe)
        shape = a * x1 + b * x2
        scale = float(np.clip((shape @ y) / (shape @ shape), 0, None)) if shape @ shape else 0.0
        notes.append(
            "one process count measured: latency and bandwidth split as the MPI "
            "all-reduce probe's, scaled to the measured exchange"
        )
        return a * scale, b * scale
    notes.append("one process count measured and no probe: latency alpha taken as 0")
    return 0.0, float(np.clip((x2 @ y) / (x2 @ x2), 0, None))


def _probe_fit(probe: pd.DataFrame) -> tuple[float, float]:
    p = probe["processes"].to_numpy(float)
    design = np.column_stack([2 * (p - 1), 2 * (p - 1) / p * probe["bytes"].to_numpy(float)])
    (alpha, beta), _ = _nnls(design, probe["seconds"].to_numpy(float))
    return float(alpha), float(beta)


def _nnls(a: np.ndarray, b: np.ndarray):
    """scipy.optimize.nnls, imported where a fit needs it: a report without
    a communication term to fit does not load scipy.optimize."""
    from scipy import optimize

    return optimize.nnls(a, b)


def bootstrap(table: pd.DataFrame, probe, rows: pd.DataFrame, seed: int = 0) -> np.ndarray:
    """(BOOTSTRAP, len(rows)) predicted step seconds, the model refitted to
    each of :func:`resamples`. The fit reads arrays indexed by each
    resample, not a resampled table (building one per resample cost most
    of the bootstrap's time): the same fits, to the last bit."""
    modified, picks = resamples(table, seed)
    columns = _columns(modified)
    out = np.empty((len(picks), len(rows)))
    for i, pick in enumerate(picks):
        out[i] = _predict(_fit({c: v[pick] for c, v in columns.items()}, probe), rows)
    return out


def resamples(table: pd.DataFrame, seed: int = 0) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """The runs with modified residuals (reindexed 0..n-1), and BOOTSTRAP
    resamples of their positions within each measured configuration: each
    measured part its configuration's mean plus a resampled modified
    residual (the residual times sqrt(n / (n - 1)), n the configuration's
    runs): a configuration's mean is a fit with leverage 1 / n, and
    resampling the raw residuals of 3 runs would spread the means by two
    thirds of their variance (Davison and Hinkley 1997, Bootstrap Methods
    and their Application, ch. 6: model-based resampling of modified
    residuals)."""
    rng = np.random.default_rng(seed)
    table = table.reset_index(drop=True)  # labels are positions
    by_configuration = table.groupby(list(SCALE), dropna=False)
    groups = [g.index.to_numpy() for _, g in by_configuration]
    measured = [c for c in MEASURED if c in table]
    mean = by_configuration[measured].transform("mean")
    runs = by_configuration[measured[0]].transform("size").to_numpy(float)
    inflate = np.sqrt(runs / np.maximum(runs - 1, 1))[:, None]
    modified = table.copy()
    modified[measured] = mean + (table[measured] - mean) * inflate
    picks = [np.concatenate([rng.choice(g, len(g)) for g in groups]) for _ in range(BOOTSTRAP)]
    return modified, picks


def interval(table: pd.DataFrame, predicted: np.ndarray, draws: np.ndarray | None) -> tuple:
    """The 95 % interval of each prediction: its bootstrap standard error
    times Student's t at the runs' degrees of freedom within configurations
    (:func:`degrees_of_freedom`: what the spread is estimated from), taken
    on the log scale as the summary's positive intervals are, so both ends
    stay positive. A normal quantile or the bootstrap's own percentiles
    would take that spread as known, which 3 runs a configuration do not
    give. nan where no configuration has two runs."""
    df = degrees_of_freedom(table)
    if df < 1 or draws is None:
        return np.full(len(predicted), np.nan), np.full(len(predicted), np.nan)
    half = stats.t_quantile(df, CONFIDENCE) * draws.std(axis=0, ddof=1)
    factor = np.exp(half / predicted)
    return predicted / factor, predicted * factor


def degrees_of_freedom(table: pd.DataFrame) -> int:
    """Runs less configurations, of the runs each part of the model is fitted
    to (compute: all; skew and communication: those of more than one
    process), the smallest of them: a prediction's variance sums the parts',
    and Satterthwaite's degrees of freedom of such a sum are at least the
    smallest of its terms'."""

    def within(rows: pd.DataFrame) -> int:
        return len(rows) - rows.groupby(list(SCALE), dropna=False).ngroups

    many = table[table["world_size"] > 1]
    return min(within(table), within(many)) if len(many) else within(table)


def _predict(model: Model, rows: pd.DataFrame) -> np.ndarray:
    return model.step(
        rows["world_size"], rows["batch_size"], rows["comm_bytes_per_step"], rows["net_rate_mbit"]
    )


# ------------------------------------------------------------------ checks


def group_keys(runs: pd.DataFrame) -> list[str]:
    """The factors a model's group holds fixed: framework and every varied
    factor but the scale's, and but those that change only with the scale
    (one level at each of a framework's scales, like cores_per_node set on
    the emulated nodes of a design whose one process runs on one plain
    node): they cannot be told apart from the scale, so splitting on them
    would leave every group one scale and nothing to check."""
    varied = [f for f in cells.varied(runs, leave_out=("net_rate_mbit",)) if f != "batch_size"]
    scale = [c for c in ("nodes", *SCALE) if c in runs]
    return ["framework", *(f for f in varied if not _follows_scale(runs, f, scale))]


def _follows_scale(runs: pd.DataFrame, factor: str, scale: list[str]) -> bool:
    levels = runs[factor].astype("string").fillna("null")
    return bool(
        levels.groupby([runs[c] for c in ["framework", *scale]], dropna=False).nunique().max() == 1
    )


def held_out_scale(table: pd.DataFrame, probe=None) -> dict | None:
    """Fit without the largest process count, predict it: mean relative
    error over its runs."""
    largest = table["world_size"].max()
    train, test = table[table["world_size"] < largest], table[table["world_size"] == largest]
    if train.empty or train["world_size"].max() < 1:
        return None
    nearest = train[train["world_size"] == train["world_size"].max()]
    return {
        "check": f"fit without {largest} processes, predict {largest}",
        "fitted_on": ", ".join(str(p) for p in sorted(train["world_size"].unique())),
        **_errors(_predict(fit(train, probe), test), test, nearest),
    }


def held_out_network(table: pd.DataFrame, probe=None) -> list[dict]:
    """For each pair of measured network rates: fit at one, predict the other."""
    rates = table["net_rate_mbit"].astype("float64")
    levels = sorted(rates.dropna().unique().tolist()) + ([np.nan] if rates.isna().any() else [])
    rows = []
    for a in levels:
        for b in levels:
            if a is b or a == b:
                continue
            train = table[rates.isna()] if np.isnan(a) else table[rates == a]
            test = table[rates.isna()] if np.isnan(b) else table[rates == b]
            if train["world_size"].max() < 2 or test.empty:
                continue
            rows.append(
                {
                    "check": f"fit at {_rate(a)}, predict {_rate(b)}",
                    "fitted_on": _rate(a),
                    **_errors(_predict(fit(train, probe), test), test, train),
                }
            )
    return rows


def _errors(predicted: np.ndarray, test: pd.DataFrame, nearest: pd.DataFrame) -> dict:
    """A check's figures: the model's error; the naive guess's, "the step
    does not change" (the step of the nearest runs fitted on); and how much
    the compute the model holds fixed moved between those runs and the ones
    predicted (per image, phases with no communication in them): a floor
    under the error that no model of the scale or the network removes."""
    measured = float(test["step_s"].mean())
    fixed = [p for p in FIXED_COMPUTE if p in test]

    def per_image(rows):
        return float((rows[fixed].sum(axis=1) / rows["batch_size"].astype(float)).mean())

    # A run that times whole steps only (fit_step_phases: false) exposes
    # none of those phases: no drift to tell
    fixed = fixed if fixed and per_image(nearest) > 0 else []

    found = {
        "predicted_ms": float(np.mean(predicted) * 1e3),
        "measured_ms": measured * 1e3,
        "relative_error": float(np.mean(predicted / test["step_s"] - 1)),
        "naive_error": float(nearest["step_s"].mean() / measured - 1),
        # nan where those phases are not timed apart (whole steps only)
        "compute_drift": per_image(test) / per_image(nearest) - 1
        if fixed and per_image(nearest) > 0
        else np.nan,
        "why_not": None,
    }
    if not np.isfinite(predicted).all():  # a model input the runs never measured
        unknown = "bytes per step" if test["comm_bytes_per_step"].isna().any() else "model input"
        found["why_not"] = f"not predicted: the runs to predict record no {unknown}"
    return found


def _rate(rate) -> str:
    return "the machine's own network" if rate is None or np.isnan(rate) else f"{rate:g} Mbit/s"


# ------------------------------------------------------------- predictions


def predictions(table: pd.DataFrame, probe=None, error: float | None = None) -> pd.DataFrame:
    """Measured configurations and unrun ones (twice and four times the
    largest process count, half and twice the batch, 10 Gbit/s, 1 Gbit/s
    and 100 Mbit/s links), each with its interval and its weak-scaling
    efficiency (one process's step over this one's, at the same batch and
    network); measured figures beside."""
    measured = (
        table.groupby(list(SCALE), dropna=False)
        .agg(
            measured_ms=("step_s", lambda s: s.mean() * 1e3),
            comm_bytes_per_step=("comm_bytes_per_step", "mean"),
        )
        .reset_index()
    )
    nbytes = float(table["comm_bytes_per_step"].mean())
    top = measured[measured["world_size"] == measured["world_size"].max()].iloc[0]
    unrun = [
        {
            "world_size": top["world_size"] * k,
            "batch_size": top["batch_size"],
            "net_rate_mbit": top["net_rate_mbit"],
        }
        for k in (2, 4)
    ]
    unrun += [
        {
            "world_size": top["world_size"],
            "batch_size": top["batch_size"] * k,
            "net_rate_mbit": top["net_rate_mbit"],
        }
        for k in (0.5, 2)
    ]
    unrun += [
        {
            "world_size": max(top["world_size"], 2),
            "batch_size": top["batch_size"],
            "net_rate_mbit": r,
        }
        for r in (10_000, 1_000, 100)
    ]
    unrun = pd.DataFrame(unrun).assign(comm_bytes_per_step=nbytes, measured_ms=np.nan)
    rows = pd.concat([measured, unrun], ignore_index=True).drop_duplicates(list(SCALE))
    rows["batch_size"] = rows["batch_size"].astype(float)
    model = fit(table, probe)
    predicted = _predict(model, rows)
    # No interval where no configuration ran twice: no resamples to draw then.
    draws = bootstrap(table, probe, rows) if degrees_of_freedom(table) >= 1 else None
    low, high = interval(table, predicted, draws)
    # Widened by the held-out error on the log scale, as the interval itself
    # is taken: both ends stay positive whatever the error (a model 140 %
    # off put the low end below zero as low x (1 - 1.4)).
    widen = 1 + abs(error) if error is not None and np.isfinite(error) else 1.0
    rows["predicted_ms"] = predicted * 1e3
    rows["low_ms"] = low * 1e3 / widen
    rows["high_ms"] = high * 1e3 * widen
    rows["predicted_images_per_s"] = rows["world_size"] * rows["batch_size"] / predicted
    # Weak scaling: against one process at the same batch and network.
    alone = model.step(
        np.ones(len(rows)), rows["batch_size"], rows["comm_bytes_per_step"], rows["net_rate_mbit"]
    )
    rows["efficiency"] = alone / predicted
    rows["kind"] = np.where(rows["measured_ms"].notna(), "measured", "not run")
    rows["held_out_error"] = error
    return rows


# ---------------------------------------------------------------- what-ifs


def replay(
    found: cp.CriticalPath, run_id, change: str | None = None, beta_bytes: float | None = None
) -> float:
    """Mean seconds per step of a run's steps replayed with one change: at
    each join, the slowest rank's window (phases and gaps) then the
    communication proper (the ranks leave a join together, so the skew
    with which they left the previous one is not replayed)."""
    return _Replayable(found, run_id).replay(change, beta_bytes)


class _Replayable:
    """One run's windows per join, rank and cause and its communication on
    the path, read from the critical path once for every change replayed
    (the pivot of its windows was most of a replay's time)."""

    def __init__(self, found: cp.CriticalPath, run_id) -> None:
        windows = found.windows[
            (found.windows["run_id"] == run_id) & (found.windows["cause"] != cp.PROPAGATED)
        ]
        self.n_joins = int(found.joins.loc[found.joins["run_id"] == run_id, "join"].max()) + 1
        cube = windows.pivot_table(
            index=["join", "rank"], columns="cause", values="ns", aggfunc="sum", observed=True
        ).fillna(0)
        self.ranks = cube.index.get_level_values("rank").unique()
        self.values = cube.to_numpy(float, copy=True).reshape(self.n_joins + 1, len(self.ranks), -1)
        self.causes = list(cube.columns)
        comm = found.path[
            (found.path["run_id"] == run_id) & (found.path["kind"] == cp.COMMUNICATION)
        ].sort_values("join")
        comm = comm["dur_ns"].to_numpy(float) if len(comm) else np.zeros(self.n_joins)
        # Where backward is the join, its pieces on the path are not replayed
        # from the windows: they count as they were.
        joined = found.path[(found.path["run_id"] == run_id) & (found.path["kind"] == cp.JOIN)]
        self.joined = len(joined)
        self.comm = comm + (
            joined.sort_values("join")["dur_ns"].to_numpy(float) if len(joined) else 0
        )
        joins = found.joins[found.joins["run_id"] == run_id]
        self.last = joins[joins["last"]]["rank"]  # the rank last at each join

    def replay(self, change: str | None = None, beta_bytes: float | None = None) -> float:
        values, causes, ranks, comm = self.values.copy(), self.causes, self.ranks, self.comm
        if change == "data loading twice as fast" and "data_load" in causes:
            values[:, :, causes.index("data_load")] *= 0.5
        elif change == "straggler removed" and len(ranks) > 1:
            j = list(ranks).index(self.last.mode().iloc[0])
            others = np.delete(values, j, axis=1)
            values[:, j, :] = np.median(others, axis=1)
        elif change == "compression fp16" and self.joined == 0:
            comm = (
                np.clip(comm - (beta_bytes or 0.0) * 1e9 / 2, 0, None)
                if beta_bytes is not None
                else comm / 2
            )
        # The tail after the last join counts with it, as on the critical path.
        return float((values.sum(axis=2).max(axis=1).sum() + comm.sum()) / self.n_joins / 1e9)


def what_ifs(
    found: cp.CriticalPath, table: pd.DataFrame, models: dict, info: pd.DataFrame, keys: list[str]
) -> pd.DataFrame:
    rows = []
    for row in table.itertuples():
        model = models.get(tuple(getattr(row, k) for k in keys))
        ring = (
            2 * (row.world_size - 1) / row.world_size * row.comm_bytes_per_step
            if row.world_size > 1 and np.isfinite(row.comm_bytes_per_step)
            else None
        )
        beta_bytes = (
            model.beta * ring if model is not None and ring is not None and model.beta > 0 else None
        )
        run = _Replayable(found, row.run_id)
        base = run.replay()
        for change, assumption in ASSUMPTIONS.items():
            after = run.replay(change, beta_bytes)
            if change == "compression fp16" and beta_bytes is None:
                assumption += "; no fitted bandwidth term here: communication proper halves"
            rows.append(
                {
                    "run_id": row.run_id,
                    "what_if": change,
                    "measured_ms": row.step_s * 1e3,
                    "replayed_ms": base * 1e3,
                    "predicted_ms": after * 1e3,
                    "change": after / base - 1,
                    "assumes": assumption,
                }
            )
    out = pd.DataFrame(rows)
    return out.join(info, on="run_id") if len(out) else out


# ------------------------------------------------------------------ report


def analyse(
    runs: pd.DataFrame,
    phases: pd.DataFrame,
    tables: Path | None = None,
    found: cp.CriticalPath | None = None,
) -> dict:
    """Every table of the section: per group its model, predictions, held-out
    checks; per run the what-ifs. ``found``: the ok runs' critical path where
    the caller has it already (the report's Context)."""
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    if found is None:
        found = cp.analyse(phases[phases["run_id"].isin(ok["run_id"])], ok)
    table = measures(found, ok, traced_bytes(phases))
    probe = probe_points(tables)
    keys = group_keys(ok)
    if table.empty or "run_id" not in table:  # no run with usable steps: nothing to model
        empty = pd.DataFrame()
        return {
            "checks": empty,
            "predictions": empty,
            "parameters": empty,
            "what_ifs": empty,
            "probe": probe,
        }
    for column in keys:
        if column not in table:
            table[column] = table["run_id"].map(ok.set_index("run_id")[column])
    checks, preds, params, models = [], [], [], {}
    for key, group in table.groupby(keys, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        label = dict(zip(keys, key))
        group = group.reset_index(drop=True)
        scale = held_out_scale(group, probe) if group["world_size"].nunique() > 1 else None
        found_checks = ([scale] if scale else []) + held_out_network(group, probe)
        checks += [{**label, **c} for c in found_checks]
        model = fit(group, probe)
        models[key] = model
        params.append(
            {
                **label,
                "alpha_us": model.alpha * 1e6,
                "beta_ns_per_byte": model.beta * 1e9,
                "skew_s": model.skew,
                "untimed_ms": model.untimed * 1e3,
                "notes": "; ".join(model.notes),
            }
        )
        # The error shown beside its predictions (and widening their
        # intervals): the largest of the group's held-out errors, not a mean
        # that would hide the check the model missed.
        error = max((c["relative_error"] for c in found_checks), key=abs) if found_checks else None
        preds.append(predictions(group, probe, error).assign(**label))
    info = cells.with_setting(ok).set_index("run_id")[cells.CELL]
    return {
        "checks": pd.DataFrame(checks),
        "predictions": pd.concat(preds, ignore_index=True) if preds else pd.DataFrame(),
        "parameters": pd.DataFrame(params),
        "what_ifs": what_ifs(found, table, models, info, keys) if len(table) else pd.DataFrame(),
        "probe": probe,
    }


SECTION_ID, SECTION_TITLE = "what-if", "What if: a calibrated model of the step"


def section(
    runs: pd.DataFrame,
    phases: pd.DataFrame,
    tables: Path | None = None,
    critical: cp.CriticalPath | None = None,
) -> Section:
    """The report's section: each held-out check and each what-if in a
    sentence, the predictions, checks, what-ifs and parameters as tables;
    ``critical``: the ok runs' critical path where the caller has it."""
    found = analyse(runs, phases, tables, critical)
    said: list = []  # sentences: strings, or pieces with a link
    checks = found["checks"]
    unpredicted = checks[checks["why_not"].notna()] if len(checks) else checks
    checks = checks[checks["why_not"].isna()] if len(checks) else checks
    if len(checks):
        errors = checks["relative_error"].abs()
        better = int((errors < checks["naive_error"].abs()).sum())
        said.append(
            f"Held-out error over {len(checks)} check{'s' * (len(checks) > 1)}: median "
            f"{errors.median():.0%}, largest "
            f"{errors.max():.0%}; the model beats the naive guess (the step does not change) "
            f"in {better} of them. Each prediction's interval is widened by its group's "
            "largest held-out error."
        )
    for c in checks.to_dict("records"):
        drift = (
            f"the compute it holds fixed moved {c['compute_drift']:+.0%} between the runs"
            if np.isfinite(c["compute_drift"])
            else "the compute it holds fixed is not timed apart in these runs"
        )
        said.append(
            f"{c['framework']}: {c['check']}: predicted {c['predicted_ms']:.1f} ms per step "
            f"against {c['measured_ms']:.1f} measured ({c['relative_error']:+.0%}; naive "
            f"{c['naive_error']:+.0%}; {drift})."
        )
    for c in unpredicted.to_dict("records"):
        said.append(f"{c['framework']}: {c['check']}: {c['why_not']}.")
    whatifs = found["what_ifs"]
    if len(whatifs):
        mean = (
            whatifs.groupby([*cells.CELL, "what_if"], dropna=False)
            .agg(
                measured_ms=("measured_ms", "mean"),
                predicted_ms=("predicted_ms", "mean"),
                change=("change", "mean"),
                assumes=("assumes", "first"),
            )
            .reset_index()
        )
        for r in mean.to_dict("records"):
            said.append(
                f"{r['framework']}, {cp.processes(r['world_size'])}, {r['setting']}, "
                f"{r['what_if']}: {r['predicted_ms']:.1f} ms per step instead of "
                f"{r['measured_ms']:.1f} ({r['change']:+.0%}), assuming {r['assumes']}."
            )
    if not len(checks):
        said.append(
            "No held-out check: one process count and one network rate "
            "measured per group, so nothing was left to predict."
        )
    said += phase_recording.lines(
        runs, lacking="the model counts its whole step as compute, no exchange told apart"
    )
    out = Section(SECTION_ID, SECTION_TITLE).items(said)
    shown = {
        "predicted against measured (held-out error beside)": found["predictions"],
        "held-out checks": found["checks"],
        "what-ifs": whatifs,
        "model parameters": found["parameters"],
    }
    for caption, t in shown.items():
        if len(t):
            out.table(cells.by_rep(t, runs), caption=caption)
    return out
