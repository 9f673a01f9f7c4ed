"""Does the ranking hold? Whether the frameworks' order by throughput stays
the same across each other factor the runs vary: the scale, each setting
the design varies beside the framework, and the CPU the runs recorded where
they ran on more than one (a campaign resumed on another machine, a
heterogeneous cluster, results of two machines collected together).

A ranking measured at one level of a factor is a fact about that level
until the other levels say the same. For each factor, within each
combination of the other factors' levels (its "contexts"), the frameworks
that ran at every level of it are ordered by mean throughput at each level.
Where the order is the same at every level, the ranking holds across that
factor there. Where it is not, each pair of frameworks whose order differs
is tested at each level (Welch's t-test on the replications, as the
summary's rankings are); the order **reverses** only where one framework
is significantly ahead of the other at one level and significantly behind
it at another, all these tests of the study corrected together with Holm's
method (family-wise error 5 %). Any other change of order is within the
noise: the runs do not show that the ranking changes there, nor that it
holds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pandas as pd

from analysis import cells, humanize, stats

ALPHA = 0.05
RESPONSE = "images_per_s"
HEADING = "Where the ranking holds"
HOW = (
    "the frameworks' order by throughput at each level of every other factor the runs vary; "
    "a reversal: one framework significantly ahead of another at one level and significantly "
    "behind it at another, by Welch's t-test with Holm's method over every such test, "
    f"family-wise error {ALPHA * 100:g} %"
)
SHOWN = 2  # contexts whose changed order a sentence spells out
SCALE = "scale"
CPU = "cpu"


@dataclass
class Context:
    """One combination of the other factors' levels, and the frameworks'
    order at each level of the factor examined."""

    label: str
    orders: dict[str, list[str]]  # level -> frameworks, fastest first
    values: dict[tuple[str, str], pd.Series]  # (level, framework) -> throughput of its runs

    @property
    def same(self) -> bool:
        return len({tuple(o) for o in self.orders.values()}) == 1

    def swapped_pairs(self) -> list[tuple[str, str]]:
        """Pairs of frameworks whose order differs between two levels."""
        first = next(iter(self.orders.values()))
        return [
            (a, b)
            for a, b in itertools.combinations(sorted(first), 2)
            if len({o.index(a) < o.index(b) for o in self.orders.values()}) > 1
        ]


def sentences(runs: pd.DataFrame) -> list[str]:
    """One sentence per factor the runs vary beside the framework: whether
    the frameworks' order holds across its levels (none where no factor
    varies, or no two frameworks met at two levels of one)."""
    ok = _labelled(runs)
    if ok.empty or ok["framework"].nunique() < 2:
        return []
    factors = _factors(ok)
    found = {name: _contexts(ok, name, [f for f in factors if f != name]) for name in factors}
    found = {name: ctx for name, ctx in found.items() if ctx}
    tests = _tests(found)
    return [_sentence(name, ok, ctx, tests) for name, ctx in found.items()]


def _labelled(runs: pd.DataFrame) -> pd.DataFrame:
    ok = cells.with_scale(runs)
    ok = ok[(ok["status"] == "ok") & ok[RESPONSE].notna()] if RESPONSE in ok else ok.iloc[0:0]
    scale = [humanize.scale(n, p) for n, p in zip(ok["nodes"], ok["procs_per_node"])]
    return ok.assign(**{SCALE: scale})


def _factors(ok: pd.DataFrame) -> list[str]:
    """The scale, the settings the runs vary, then the CPU where the runs
    recorded more than one."""
    named = [SCALE, *cells.varied(ok)]  # varied: batch_size, varied or not, then the rest
    if CPU in ok and ok[CPU].dropna().nunique() > 1:
        named.append(CPU)
    return [f for f in named if ok[f].map(cells.level_text).nunique() > 1]


def _level(name: str, value) -> str:
    if name == CPU and not isinstance(value, str):
        return "CPU not recorded"
    return value if name == SCALE else cells.level_text(value)


def _contexts(ok: pd.DataFrame, name: str, others: list[str]) -> list[Context]:
    """The contexts of ``name``: each combination of ``others`` in which at
    least two frameworks ran at two or more of its levels."""
    found = []
    data = ok.dropna(subset=[name])
    grouped = data.groupby(others, dropna=False, sort=False) if others else [((), data)]
    for key, here in grouped:
        key = key if isinstance(key, tuple) else (key,)
        levels = sorted({_level(name, v) for v in here[name]}, key=cells.natural_key)
        at = here.assign(level=[_level(name, v) for v in here[name]])
        everywhere = set.intersection(
            *(set(at.loc[at["level"] == lv, "framework"]) for lv in levels)
        )
        if len(levels) < 2 or len(everywhere) < 2:
            continue
        at = at[at["framework"].isin(everywhere)]
        means = at.groupby(["level", "framework"])[RESPONSE].mean()
        orders = {lv: means[lv].sort_values(ascending=False).index.tolist() for lv in levels}
        values = {k: g[RESPONSE] for k, g in at.groupby(["level", "framework"])}
        label = ", ".join(
            _level(o, v) if o in (SCALE, CPU) else f"{o} {_level(o, v)}"
            for o, v in zip(others, key)
        )
        found.append(Context(label, orders, values))
    return found


def _tests(found: dict[str, list[Context]]) -> pd.Series:
    """Holm-adjusted p of each swapped pair at each level, one family over
    the study, keyed (factor, context, a, b, level)."""
    raw = {}
    for name, contexts in found.items():
        for ctx in contexts:
            for a, b in ctx.swapped_pairs():
                for level in ctx.orders:
                    key = (name, ctx.label, a, b, level)
                    raw[key] = stats.welch(ctx.values[(level, a)], ctx.values[(level, b)])[0]
    p = pd.Series(raw, dtype=float)
    return stats.holm(p, ALPHA)[0] if len(p) else p


def _reversal(name: str, ctx: Context, tests: pd.Series) -> str | None:
    """A pair that is significantly ahead at one level and significantly
    behind at another, in words; None where no pair is."""
    for a, b in ctx.swapped_pairs():
        ahead: list[tuple[str, float]] = []
        behind: list[tuple[str, float]] = []
        for level, order in ctx.orders.items():
            p = tests.get((name, ctx.label, a, b, level))
            if p is None or not p < ALPHA:
                continue
            (ahead if order.index(a) < order.index(b) else behind).append((level, p))
        if ahead and behind:
            (up, p_up), (down, p_down) = ahead[0], behind[0]
            return (
                f"{a} significantly ahead of {b} at {up} (Holm-adjusted p "
                f"{humanize.p_value(p_up)}), behind it at {down} (p {humanize.p_value(p_down)})"
            )
    return None


def _sentence(name: str, ok: pd.DataFrame, contexts: list[Context], tests: pd.Series) -> str:
    levels = sorted({_level(name, v) for v in ok[name].dropna()}, key=cells.natural_key)
    title = f"{_title(name)} ({('; ' if name == CPU else ', ').join(levels)})"
    changed = [c for c in contexts if not c.same]
    if not changed:
        if len(contexts) > 1:
            where = f"in each of the {len(contexts)} combinations of the other factors"
        else:
            where = f"{_at(contexts[0])} ({_orders(contexts[0], once=True)})".lstrip()
        return f"{title}: the same order of frameworks at every level {where}."
    listed = "; ".join(f"{_at(c)} ({_orders(c)})".lstrip() for c in changed[:SHOWN])
    if len(changed) > SHOWN:
        listed += f"; and in {len(changed) - SHOWN} more"
    kept = [c for c in contexts if c.same]
    if 0 < len(kept) <= SHOWN:
        listed += "; the same " + "; ".join(f"{_at(c)} ({_orders(c, once=True)})" for c in kept)
    elif kept:
        listed += f"; the same in the other {len(kept)} combinations of the other factors"
    reversed_ = [(c, r) for c in changed if (r := _reversal(name, c, tests))]
    if not reversed_:
        verdict = (
            "Within the noise: no pair of frameworks is significantly ahead at one level and "
            "significantly behind at another"
        )
    else:
        ctx, words = reversed_[0]
        more = f" (and in {len(reversed_) - 1} more)" if len(reversed_) > 1 else ""
        verdict = (
            f"The ranking reverses{' ' + _at(ctx) if ctx.label else ''}: {words}{more}: "
            "a ranking measured at one "
            "level does not hold at the others"
        )
    return f"{title}: the order changes {listed}. {verdict}."


def _title(name: str) -> str:
    return {SCALE: "Scale", CPU: "CPU"}.get(name, name)


def _at(ctx: Context) -> str:
    return f"at {ctx.label}" if ctx.label else ""


def _orders(ctx: Context, once: bool = False) -> str:
    """Each level's order; ``once``: the one order of a context where it is the same."""
    if once:
        return " > ".join(next(iter(ctx.orders.values())))
    return "; ".join(f"{level}: {' > '.join(order)}" for level, order in ctx.orders.items())
