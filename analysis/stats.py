"""Design statistics over the results table (runs.parquet).

- replicate statistics: mean +- t * s / sqrt(n) per design cell; cells whose
  half-width exceeds 5 % of the mean need more replications;
- scaling: throughput, speedup and efficiency against each framework's
  smallest configuration, with confidence intervals;
- allocation of variation: general full-factorial ANOVA (statsmodels) over
  the varied factors and their two-way interactions, on the response and on
  its logarithm (the multiplicative model), and Jain's 2^k r sign-table
  method when every factor has two levels.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pandas as pd
from scipy import special

from analysis import cells, humanize
from analysis.section import Em, Section, Sup

# Responses without a value in any run (energy where nothing can be read,
# time to accuracy without a target) are left out of the report.
RESPONSES = (
    "images_per_s",
    "time_per_epoch_s",
    "final_test_accuracy",
    "time_to_accuracy_s",
    "energy_j",
    "energy_per_image_j",
    "energy_to_accuracy_j",
)
CONFIDENCE = 0.95
NEEDS_MORE_REPLICATIONS = 0.05  # half-width over mean


def t_quantile(dof, confidence: float = CONFIDENCE):
    """Student's t quantile at (1 + confidence) / 2, ``dof`` degrees of
    freedom (> 0): scipy.stats.t.ppf's own kernel, called without importing
    scipy.stats, which costs the figures' process about a second of CPU."""
    return special.stdtrit(dof, (1 + confidence) / 2)


def mean_ci(values: pd.Series, confidence: float = CONFIDENCE) -> tuple[float, float, int]:
    """Mean and the half-width of its t confidence interval (nan for n < 2)."""
    values = values.dropna()
    n = len(values)
    mean = values.mean() if n else math.nan
    if n < 2:
        return mean, math.nan, n
    t = t_quantile(n - 1, confidence)
    return mean, t * values.std(ddof=1) / math.sqrt(n), n


def positive_interval(
    values: pd.Series, confidence: float = CONFIDENCE, first_stage: pd.Series | None = None
) -> tuple[float, float, float, int]:
    """Mean, and the ends of its 95 % interval, of a positive quantity: the
    t interval's half-width taken on the log scale (mean x exp(-+ t se /
    mean), the log-transformed interval), so both ends stay positive and
    its width is the t interval's to first order. nan ends for n < 2; a
    mean that is not positive gets the t interval. With ``first_stage``
    (the values a two-stage rule decided n from) the half-width is
    Stein's: see :func:`stein_half_width`."""
    mean, half, n = mean_ci(values, confidence)
    if first_stage is not None:
        half = stein_half_width(first_stage, n, confidence)
    if not math.isfinite(half):
        return mean, math.nan, math.nan, n
    if mean <= 0:
        return mean, mean - half, mean + half, n
    factor = math.exp(half / mean)
    return mean, mean / factor, mean * factor, n


def stein_half_width(first_stage: pd.Series, n: int, confidence: float = CONFIDENCE) -> float:
    """Stein's two-stage interval's half-width for the mean of all n values:
    t at n0 - 1 degrees of freedom times the first stage's standard
    deviation (its n0 values) over sqrt(n). Where n was chosen from that
    first stage (replications: auto), the usual interval over all n values
    covers too rarely (a cell stops early when its spread came out small);
    Stein's covers at its nominal level whatever the rule chose (C. Stein,
    Ann. Math. Statist. 16 (1945) 243-258). nan below 2 first-stage values."""
    first_stage = first_stage.dropna()
    if len(first_stage) < 2 or n < 1:
        return math.nan
    t = t_quantile(len(first_stage) - 1, confidence)
    return t * first_stage.std(ddof=1) / math.sqrt(n)


FIRST_STAGE = "first_stage"  # runs-table column: the run was in replications: auto's first round


def first_stage(cell: pd.DataFrame, response: str) -> pd.Series | None:
    """The values replications: auto decided a cell's number of runs from
    (its runs-table column ``first_stage``); None in a fixed design."""
    if FIRST_STAGE not in cell or not cell[FIRST_STAGE].eq(True).any():
        return None
    return cell.loc[cell[FIRST_STAGE].eq(True), response]


def cell_interval(cell: pd.DataFrame, response: str) -> tuple[float, float, float, int]:
    """:func:`positive_interval` of a cell's runs: Stein's where replications:
    auto chose their number, else the t interval."""
    return positive_interval(cell[response].dropna(), first_stage=first_stage(cell, response))


OLYMPIC_FROM = 5  # MLPerf drops the best and the worst of 5 or more runs


def olympic_mean(values: pd.Series) -> float:
    """MLPerf's olympic mean: the mean without the best and the worst run
    (nan below OLYMPIC_FROM runs)."""
    values = values.dropna().sort_values()
    return float(values.iloc[1:-1].mean()) if len(values) >= OLYMPIC_FROM else math.nan


def replicate_table(runs: pd.DataFrame, cell: list[str], response: str) -> pd.DataFrame:
    """Per cell: replications, mean with its positive 95 % interval (low,
    high; Stein's under replications: auto), that interval's relative
    half-width (what replications: auto meets), the olympic mean from 5 replications on, and the run-to-run
    coefficient of variation (cv_share: standard deviation over mean)."""
    ok = runs[runs["status"] == "ok"]
    rows = []
    for key, group in ok.groupby(cell, sort=True):
        values = group[response]
        mean, low, high, n = cell_interval(group, response)
        first = first_stage(group, response)
        half = mean_ci(values)[1] if first is None else stein_half_width(first, n)
        rows.append(
            {
                **dict(zip(cell, key if isinstance(key, tuple) else (key,))),
                "n": n,
                "mean": mean,
                "low": low,
                "high": high,
                "ci_half_width": half,
                "relative_half_width": half / mean if mean else math.nan,
                "olympic_mean": olympic_mean(values),
                "cv_share": values.std(ddof=1) / mean if n > 1 and mean else math.nan,
            }
        )
    table = pd.DataFrame(rows)
    if not table.empty:
        table["needs_more_replications"] = ~(
            table["relative_half_width"] <= NEEDS_MORE_REPLICATIONS
        )
    return table


def scaling(runs: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """Throughput, speedup and efficiency per framework (and ``by`` groups)
    against the smallest process count of that framework.

    batch_size is per process, so this is weak scaling: ideal throughput
    grows with the process count. Speedup = T_N / T_base; efficiency =
    speedup / (N / N_base). Their 95 % intervals are taken on the log scale,
    where a ratio's error is the sum of its means' (relative standard errors
    added in quadrature, Welch-Satterthwaite degrees of freedom), so they
    stay positive; the throughput's is :func:`positive_interval`.
    """
    by = ["framework"] + [b for b in (by or ["setting"]) if b != "framework"]
    planned = cells.with_setting(runs)
    # The base is the smallest process count the design planned, run or not:
    # a cell whose base has no successful run has no speedup yet (not 1).
    smallest = {key: group["world_size"].min() for key, group in planned.groupby(by)}
    ok = planned[planned["status"] == "ok"]
    rows = []
    for key, group in ok.groupby(by):
        base_n = smallest[key]
        base = group[group["world_size"] == base_n]["images_per_s"].dropna()
        for n, cell in group.groupby("world_size"):
            values = cell["images_per_s"].dropna()
            mean, low, high, reps = cell_interval(cell, "images_per_s")
            speedup = mean / base.mean() if len(base) else math.nan
            factor = ratio_factor(values, base) if n != base_n else math.nan
            ideal = n / base_n
            rows.append(
                {
                    **dict(zip(by, key)),
                    "world_size": n,
                    "replications": reps,
                    "images_per_s": mean,
                    "images_per_s_low": low,
                    "images_per_s_high": high,
                    "speedup": speedup,
                    "speedup_low": speedup / factor,
                    "speedup_high": speedup * factor,
                    "ideal_speedup": ideal,
                    "efficiency": speedup / ideal,
                    "efficiency_low": speedup / factor / ideal,
                    "efficiency_high": speedup * factor / ideal,
                }
            )
    return cells.in_order(pd.DataFrame(rows), [*by, "world_size"])


def ratio_factor(a: pd.Series, b: pd.Series, confidence: float = CONFIDENCE) -> float:
    """The multiplicative half-width of the 95 % interval of mean(a) /
    mean(b): the ratio's interval is [ratio / f, ratio x f] (nan when either
    has fewer than two values; 1 without spread)."""
    if min(len(a), len(b)) < 2:
        return math.nan
    parts = [x.var(ddof=1) / len(x) / x.mean() ** 2 for x in (a, b)]
    total = sum(parts)
    if total == 0:
        return 1.0
    dof = total**2 / sum(v**2 / (len(x) - 1) for v, x in zip(parts, (a, b)))
    return math.exp(t_quantile(dof, confidence) * math.sqrt(total))


def welch(a: pd.Series, b: pd.Series) -> tuple[float, str]:
    """Welch's t-test of two cells' replications: (p, why not tested).
    Degenerate cases are said in words, never as a test statistic."""
    a, b = a.dropna(), b.dropna()
    if min(len(a), len(b)) < 2:
        return math.nan, f"too few replications to test: n = {min(len(a), len(b))}"
    if a.std(ddof=1) == 0 and b.std(ddof=1) == 0:
        if a.iloc[0] == b.iloc[0]:
            return math.nan, "identical in every replication"
        return math.nan, (
            "no variance within either cell (deterministic runs): the gap is exact, not estimated"
        )
    from scipy import stats  # not at the top: a second of CPU the figures do not need

    return float(stats.ttest_ind(a, b, equal_var=False).pvalue), ""


def holm(p: pd.Series, alpha: float = 0.05) -> tuple[pd.Series, pd.Series]:
    """Holm's step-down adjustment of a family of p-values (family-wise
    error ``alpha``): the adjusted p-values and whether each rejects; an
    untested pair's nan stays nan (and rejects nothing), outside the family."""
    from statsmodels.stats.multitest import multipletests

    adjusted = pd.Series(math.nan, index=p.index)
    reject = pd.Series(False, index=p.index)
    tested = p.notna()
    if tested.any():
        found, corrected, _, _ = multipletests(p[tested], alpha=alpha, method="holm")
        adjusted[tested], reject[tested] = corrected, found
    return adjusted, reject


def varied_factors(runs: pd.DataFrame, factors: list[str]) -> list[str]:
    ok = runs[runs["status"] == "ok"]
    return [f for f in factors if ok[f].nunique() > 1]


def anova(runs: pd.DataFrame, factors: list[str], response: str, log: bool = False) -> pd.DataFrame:
    """Allocation of variation by a general full-factorial ANOVA with main
    effects and two-way interactions. Columns: term, sum_sq, df, F, p,
    variation (share of the total sum of squares, residual included)."""
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm
    from statsmodels.tools.sm_exceptions import SingularMatrixWarning

    data = runs[(runs["status"] == "ok")][factors + [response]].dropna()
    if log:
        data = data[data[response] > 0].assign(**{response: np.log(data[response])})
    term = {f: f"C(Q('{f}'))" for f in factors}
    crossed, left_out = _crossed_pairs(data, factors)
    pairs = [f"{term[a]}:{term[b]}" for a, b in crossed]
    formula = f"Q('{response}') ~ " + " + ".join([*term.values(), *pairs])
    # A saturated model's division by zero, and a rank-deficient one's
    # warning: both are said in words below.
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", SingularMatrixWarning)
        model = smf.ols(formula, data=data).fit()
    if model.df_resid < 1:
        raise ValueError(
            f"{int(model.df_model) + 1} model terms for {len(data)} runs: nothing is left "
            "to tell variation from noise; replicate the cells"
        )
    if model.model.rank < model.model.exog.shape[1]:
        raise ValueError(
            f"the finished runs confound {' and '.join(_confounded(data, factors))}: their "
            "levels ran in too few combinations to tell their effects apart; run the "
            "missing cells"
        )
    table = (
        anova_lm(model, typ=2)
        .reset_index()
        .rename(columns={"index": "term", "PR(>F)": "p", "F": "F"})
    )
    table["term"] = table["term"].str.replace(r"C\(Q\('([^']+)'\)\)", r"\1", regex=True)
    table["variation"] = table["sum_sq"] / table["sum_sq"].sum()
    table = table[["term", "sum_sq", "df", "F", "p", "variation"]]
    table.attrs.update(r_squared=model.rsquared, left_out=left_out)
    return table


def _confounded(data: pd.DataFrame, factors: list[str]) -> list[str]:
    """The first two factors whose main effects alone the runs cannot tell
    apart; all of them where only together they cannot."""

    def separable(chosen) -> bool:
        dummies = pd.get_dummies(data[list(chosen)].astype(str), drop_first=True, dtype=float)
        columns = np.column_stack([np.ones(len(data)), dummies.to_numpy()])
        return np.linalg.matrix_rank(columns) == columns.shape[1]

    return next(
        (list(pair) for pair in itertools.combinations(factors, 2) if not separable(pair)),
        factors,
    )


def _crossed_pairs(data: pd.DataFrame, factors: list[str]) -> tuple[list, list[str]]:
    """The two-way interactions the runs can estimate: those whose factors'
    levels ran in every combination (a pair with a combination missing makes
    the model rank-deficient, and statsmodels' F tests of it meaningless);
    and a sentence for each left out."""
    crossed, left_out = [], []
    for a, b in itertools.combinations(factors, 2):
        ran = len(data[[a, b]].drop_duplicates())
        every = data[a].nunique() * data[b].nunique()
        if ran == every:
            crossed.append((a, b))
        else:
            left_out.append(f"{a} x {b} ({ran} of its {every} combinations of levels ran)")
    return crossed, left_out


def sign_table_2kr(
    runs: pd.DataFrame,
    factors: list[str],
    response: str,
    confidence: float = CONFIDENCE,
    levels: dict[str, list] | None = None,
    terms: list[tuple[tuple[str, ...], str]] | None = None,
) -> pd.DataFrame:
    """Jain's 2^k r design: effects from the sign table, allocation of
    variation, and confidence intervals of the effects.

    ``levels`` gives each factor's [-1, +1] levels (the design's order: the
    first listed is -1); without it they are sorted. Rows map to effects
    through their own level values, never by position. ``terms`` lists the
    effects to estimate as (factors, label); by default every interaction of
    the full 2^k design. A fraction passes one term per alias group, labelled
    with the group, so that only separable effects are estimated.
    """
    ok = runs[runs["status"] == "ok"].dropna(subset=[response])
    levels = levels or {f: sorted(ok[f].unique()) for f in factors}
    present = {f: set(ok[f].unique()) for f in factors}
    if any(len(levels[f]) != 2 or not present[f] <= set(levels[f]) for f in factors):
        raise ValueError("the 2^k r method needs exactly two levels per factor")
    if terms is None:
        terms = [
            (c, ":".join(c))
            for n in range(1, len(factors) + 1)
            for c in itertools.combinations(factors, n)
        ]
    coded = pd.DataFrame(
        {f: np.where(ok[f] == levels[f][1], 1, -1) for f in factors}, index=ok.index
    )
    cell_y = coded.assign(y=ok[response].values).groupby(factors)["y"]
    means, counts = cell_y.mean(), cell_y.count()
    r = int(counts.min())
    if r != counts.max() or len(means) != len(terms) + 1:
        raise ValueError(
            "the 2^k r method needs every cell of the design with the same number of replications"
        )
    n_cells = len(means)
    cell_index = pd.DataFrame(list(means.index), columns=factors)
    rows = [{"term": "mean", "effect": float(means.values.mean())}]
    for term, label in terms:
        signs = np.prod([cell_index[f].values for f in term], axis=0)
        rows.append({"term": label, "effect": float((signs * means.values).sum() / n_cells)})
    effects = pd.DataFrame(rows)
    fitted = cell_y.transform("mean")
    sse = float(((ok[response].values - fitted.values) ** 2).sum())
    ss = {
        row.term: n_cells * r * row.effect**2 for row in effects.itertuples() if row.term != "mean"
    }
    sst = sum(ss.values()) + sse
    dof = n_cells * (r - 1)
    se = math.sqrt(sse / dof) / math.sqrt(n_cells * r) if dof > 0 else math.nan
    t = t_quantile(dof, confidence) if dof > 0 else math.nan
    effects["variation"] = effects["term"].map(
        lambda term: ss.get(term, math.nan) / sst if sst else math.nan
    )
    effects["ci_half_width"] = t * se
    effects["significant"] = [_significance(e, t * se, dof, sse) for e in effects["effect"]]
    labels = dict((label, term) for term, label in terms)
    effects["difference"] = [
        _difference(labels.get(name, ()), levels, effect, response)
        for name, effect in zip(effects["term"], effects["effect"])
    ]
    effects.attrs["error_variation"] = sse / sst if sst else math.nan
    return effects


def _significance(effect: float, half: float, dof: int, sse: float) -> str:
    if dof <= 0:
        return "no interval: one replication per cell"
    if sse == 0:
        return "no interval: identical in every replication"
    return "yes" if abs(effect) > half else "no"


def _difference(
    term: tuple[str, ...], levels: dict[str, list], effect: float, response: str
) -> str:
    """The effect as a person reads it: the mean at +1 minus the mean at -1
    (twice Jain's q), e.g. "torch-ddp over horovod-torch: +101 images/s"."""
    from analysis import humanize

    if not term:
        return ""
    value = 2 * effect
    sign = "+" if value > 0 else ("-" if value < 0 else "")
    amount = sign + humanize.number(abs(value), humanize.unit_of(response))
    if len(term) == 1:
        minus, plus = levels[term[0]]
        return f"{term[0]} {plus} over {minus}: {amount}"
    return (
        f"{' x '.join(term)}: {amount} when their levels agree (both -1 or both +1) "
        f"over when they differ"
    )


def log_model_fits_better(
    runs: pd.DataFrame, factors: list[str], response: str, additive: pd.DataFrame | None = None
) -> dict:
    """Compare the additive and multiplicative models by the share of
    variation the factors explain (R^2) on y and on log y; ``additive``:
    :func:`anova` of y, where the caller has it already."""
    if additive is None:
        additive = anova(runs, factors, response)
    multiplicative = anova(runs, factors, response, log=True)
    r2_add, r2_log = additive.attrs["r_squared"], multiplicative.attrs["r_squared"]
    return {
        "r_squared_additive": r2_add,
        "r_squared_log": r2_log,
        "log_fits_better": bool(r2_log > r2_add),
    }


# ---------------------------------------------------------------- sections


def throughput_section(ctx) -> Section:
    """Throughput, scaling and where the speedup goes."""
    figures = ctx.figures
    return (
        Section("throughput", "Throughput and scaling")
        .figure(figures / "throughput.png", "throughput")
        .para(
            "images_per_s is global: images processed by all ranks in the measured steps "
            "(after warmup_steps) over the slowest rank's wall time; evaluation is excluded. "
            "batch_size is per process, so adding processes is weak scaling: the ideal "
            "speedup is the ratio of process counts."
        )
        .figure(figures / "scaling.png", "scaling")
        .table(scaling(ctx.runs))
        .heading("Where the speedup goes")
        .figure(figures / "waterfall.png", "waterfall")
        .para(
            "Each bar is one phase's share of the gap between ideal and measured speedup: "
            "gap = (N/N0) x sum over phases of (t_N - t_N0) / t_N, exactly."
        )
    )


def section(ctx) -> Section:
    """Design statistics: each response's mean and interval per cell, the
    allocation of variation, the 2^k r effects."""
    design, runs = ctx.design, ctx.runs
    out = Section("statistics", "Design statistics")
    ok = runs[runs["status"] == "ok"]
    listed = [f for f in design.path_factors() if f in runs]
    factors = varied_factors(runs, listed)
    constant = [f for f in design.factors if f in ok and f not in factors]
    _fraction(out, design)
    if constant:
        out.para(
            f"One level among the successful runs, so no effect to estimate: {', '.join(constant)}."
        )
    for response in RESPONSES:
        if response not in runs or runs[response].dropna().empty:
            continue
        out.heading(response)
        reps = replicate_table(runs, listed, response)
        flagged = int(reps["needs_more_replications"].sum()) if len(reps) else 0
        single = int((reps["n"] < 2).sum()) if len(reps) else 0
        few = f", or {single} with one replication: too few for an interval" if single else ""
        out.para(
            f"Mean and its 95 % interval per cell (low and high: the t interval on the "
            f"log scale, positive; ci_half_width: t s / √n). "
            f"{humanize.count(flagged, 'cell needs', 'cells need')} more replications (half-width over {NEEDS_MORE_REPLICATIONS * 100:g} % "
            f"of the mean{few})."
        )
        out.table(reps, caption=f"{response} per cell")
        if _deterministic(ok, listed, response):
            out.para(
                f"{response} is identical in every replication: the runs are "
                f"deterministic for this seed, so there is no error to test effects "
                f"against; the allocation below is exact, without F or p."
            )
        _anova_section(out, design, runs, factors, response)
    return out


def _deterministic(ok: pd.DataFrame, cell: list[str], response: str) -> bool:
    spread = ok.dropna(subset=[response]).groupby(cell)[response].agg(["std", "count"])
    replicated = spread[spread["count"] > 1]
    return bool(len(replicated)) and bool(
        (replicated["std"].fillna(0) <= 1e-12 * ok[response].abs().max()).all()
    )


def _fraction(out: Section, design) -> None:
    if not design.fraction:
        return
    lines = design.fraction.describe()
    out.para(
        f"{lines[0]}. Only the effects the fraction separates are "
        f"estimated: each row of the sign table below stands for its whole alias chain."
    )
    out.pre("\n".join(lines[1:]))


def _anova_section(out: Section, design, runs: pd.DataFrame, factors: list[str], response: str):
    if not factors:
        out.para("No factor varies among the successful runs: no allocation of variation.")
        return
    if design.sample:
        out.para(
            "No allocation of variation: a Latin hypercube leaves most cells of the "
            "grid empty, so a full-factorial ANOVA cannot tell its sampled factors apart "
            "(docs/design.md)."
        )
    elif not design.fraction:
        _anova_table(out, runs, factors, response)
    ok = runs[runs["status"] == "ok"]
    if all(ok[f].nunique() == 2 for f in factors):
        levels = {f: _two_levels(design, f, ok) for f in factors}
        terms = design.fraction.estimable() if design.fraction else None
        try:
            effects = sign_table_2kr(runs, factors, response, levels=levels, terms=terms)
        except ValueError as exc:
            out.para("2", Sup("k"), f"r method not applicable: {exc}.")
            return
        coding = "; ".join(f"{f}: -1 = {lv[0]}, +1 = {lv[1]}" for f, lv in levels.items())
        out.para(
            "2",
            Sup("k"),
            f"r sign-table effects (Jain). Levels: {coding}. ",
            Em("difference"),
            " is the mean at +1 minus the mean at -1 (twice the effect q).",
        )
        out.table(effects, caption=f"effects on {response}")


def _two_levels(design, factor: str, ok: pd.DataFrame) -> list:
    """The factor's levels in the design's order (first listed = -1)."""
    present = set(ok[factor].unique())
    listed = [lv for lv in design.factors.get(factor, []) if lv in present]
    return listed if len(listed) == 2 else sorted(present)


def _anova_table(out: Section, runs: pd.DataFrame, factors: list[str], response: str) -> None:
    from analysis import humanize

    try:
        table = anova(runs, factors, response)
        fit = log_model_fits_better(runs, factors, response, additive=table)
    except (ValueError, np.linalg.LinAlgError) as exc:
        out.para(f"Allocation of variation not computed: {exc}.")
        return
    left_out = table.attrs["left_out"]
    residual = table.loc[table["term"] == "Residual", "sum_sq"]
    if len(residual) and residual.iloc[0] <= 1e-9 * table["sum_sq"].sum():
        table = table.drop(columns=["F", "p"])  # no error: a test statistic would be noise
    out.para(
        "Allocation of variation (full-factorial ANOVA, main effects and two-way interactions): R",
        Sup("2"),
        f" {humanize.percent(fit['r_squared_additive'])} "
        f"on {response}, {humanize.percent(fit['r_squared_log'])} on log({response}); "
        f"the {'multiplicative (log)' if fit['log_fits_better'] else 'additive'} model "
        f"fits better.",
    )
    if left_out:
        out.para(
            "Interactions left out, since not every combination of their levels ran: "
            f"{'; '.join(left_out)}."
        )
    out.table(table, caption=f"allocation of variation of {response}")
