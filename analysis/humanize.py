"""Numbers as people read them: three significant digits, a unit, a share as
a percentage, an unset value said in words, a floating-point residue as 0.

Every table of the report and of summary.md goes through :func:`frame`, so
that ``nan`` and ``6.939e-18`` never reach a reader. A column's unit is
read from its name (the project's one vocabulary: ``_s`` seconds, ``_j``
joules, ``images_per_s``...).
"""

from __future__ import annotations

import math
import numbers
import re

import pandas as pd

NOT_SET = "not set"  # a setting left unset; never a missing figure
NONE = "none"  # a figure that was not measured or does not apply, said in a sentence
NO_VALUE = "–"  # a figure that does not exist (a residual's F, a rank with no next)
RESIDUE = 1e-9  # relative to the column's largest magnitude: below it is rounding noise
TABLE_RESIDUE = 1e-12  # relative to the largest value of the same unit in the table

# Column-name endings and the unit they carry, longest first.
UNITS = (
    ("images_per_s", "images/s"),
    ("_bytes_per_step", "B/step"),
    ("_bytes", "B"),
    ("_mb_s", "MB/s"),
    ("_ms_per_step", "ms"),  # path_ms_per_step: ms in each step
    ("_ms", "ms"),
    ("_j", "J"),
    ("_s", "s"),
    ("seconds", "s"),  # the probe's all-reduce time
)
# Units that take k/M/G prefixes (the others have their own: ms, MB/s, s).
PREFIXED = ("images/s", "J", "B", "B/step")
# Columns that hold a share of a whole (0..1), written as a percentage.
SHARES = (
    "share",
    "efficiency",
    "variation",
    "relative_half_width",
    "accuracy",
    "late_share",
    "tracing_cost",
    "predicted_gain",
    "relative_error",
    "naive_error",
    # the what-if's: its group's held-out error beside each prediction, and
    # how far the compute it holds fixed moved between fit and check
    "held_out_error",
    "compute_drift",
    "change",  # a what-if's replayed step over the measured one, less 1
    # ddlc improve's proof: relative changes and the predicted one's interval
    "step_change",
    "throughput_change",
    "predicted_low",
    "predicted_high",
)
# Columns that hold p-values.
P_VALUES = ("p", "p_adjusted", "p_raw", "p_adjusted_best", "p_raw_best")


def number(value, unit: str = "", digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits with its unit; 1234567 ->
    "1.23 M"; a missing or non-finite value -> "none"."""
    if value is None or isinstance(value, bool):
        return NONE if value is None else ("yes" if value else "no")
    if not isinstance(value, numbers.Real):
        return str(value)
    value = float(value)
    if not math.isfinite(value):
        return NONE
    if value == 0:
        return f"0 {unit}".strip()
    magnitude = abs(value)
    prefix = ""
    scales = (
        ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
        if unit.startswith("B")
        else ((1e12, "T"), (1e9, "G"), (1e6, "M"))
        if unit in PREFIXED
        else ()
    )
    for scale, name in scales:
        if magnitude >= scale:
            value, prefix = value / scale, name
            break
    if magnitude < 1 and unit in SMALLER:  # 0.0201 s -> 20.1 ms, 1.23e-05 s -> 12.3 µs
        for scale, name in SMALLER[unit]:
            if magnitude >= scale or scale == SMALLER[unit][-1][0]:
                value, unit = value / scale, name
                break
    suffix = f"{prefix}{unit}"
    text = plain(value, digits)
    return f"{text} {suffix}".strip() if suffix else text


# Below 1, a unit that has smaller ones takes the largest that reads >= 1.
SMALLER = {
    "s": ((1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")),
    "ms": ((1e-3, "µs"), (1e-6, "ns")),
    "J": ((1e-3, "mJ"), (1e-6, "µJ"), (1e-9, "nJ")),
}


def plain(value: float, digits: int = 3) -> str:
    """``digits`` significant digits, never in exponent notation: 1234.5 ->
    1230, 0.0000123 -> 0.0000123, 10.0 -> 10."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(float(f"{value:.{digits}g}"))))
    if exponent >= digits - 1:
        return f"{float(f'{value:.{digits}g}'):.0f}"
    text = f"{value:.{digits - 1 - exponent}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text  # as %g: 10, not 10.0


def percent(share, digits: int = 3) -> str:
    if share is None or (isinstance(share, float) and not math.isfinite(share)):
        return NONE
    value = float(share) * 100
    if 0 < abs(value) < TINY_PERCENT:  # 3.2e-05 %: nothing a reader can use
        return f"< {TINY_PERCENT:g} %" if value > 0 else f"> -{TINY_PERCENT:g} %"
    return f"{plain(value, digits if abs(value) >= 1 else 2)} %"


TINY_PERCENT = 0.01


def processes(n) -> str:
    """1 process, 2 processes: a count of processes with its plural."""
    n = int(n)
    return f"{n} process" if n == 1 else f"{n} processes"


def scale(nodes, procs_per_node) -> str:
    """1 node x 2 processes; on several nodes with the total: 2 nodes x 2
    processes (4 in all)."""
    if int(nodes) == 1:
        return f"1 node x {processes(procs_per_node)}"
    total = int(nodes) * int(procs_per_node)
    return f"{int(nodes)} nodes x {processes(procs_per_node)} ({total} in all)"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """3 replications, 1 cell: a count with its noun's proper plural."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def p_value(p) -> str:
    if p is None or not math.isfinite(float(p)):
        return "not tested"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def unit_of(column: str) -> str:
    # an interval (its half-width or its ends) has its mean's unit
    name = re.sub(r"_(ci(_half_width)?|low|high)$", "", column.lower())
    for ending, unit in UNITS:
        if name.endswith(ending) or name == ending.lstrip("_"):
            return unit
    return ""


def is_share(column: str) -> bool:
    name = column.lower()
    if "_to_" in name:  # time_to_accuracy_s, epochs_to_accuracy: not shares
        return False
    return any(name == s or name.endswith("_" + s) or name.startswith(s + "_") for s in SHARES)


def clean(series: pd.Series, largest: float | None = None) -> pd.Series:
    """Floating-point residues (below RESIDUE of ``largest``, by default the
    column's largest magnitude) to exactly 0."""
    if not pd.api.types.is_float_dtype(series):
        return series
    largest = series.abs().max() if largest is None else largest
    if not largest or not math.isfinite(largest):
        return series
    return series.mask(series.abs() < RESIDUE * largest, 0.0)


def column(series: pd.Series, largest: float | None = None) -> pd.Series:
    """One column as text, by what its name says it holds."""
    name = str(series.name)
    if pd.api.types.is_bool_dtype(series):
        return series.map(lambda v: "yes" if v else "no")
    if not pd.api.types.is_numeric_dtype(series):
        return series.map(_text)
    if pd.api.types.is_integer_dtype(series):
        unit = unit_of(name)
        return series.map(lambda v: number(v, unit) if unit.startswith("B") else str(v))
    series = clean(series.astype(float), largest)
    if name in P_VALUES:
        text = series.map(p_value)
    elif is_share(name):
        text = series.map(percent)
    else:
        unit = unit_of(name)
        text = series.map(lambda v: number(v, unit))
    return text.where(series.notna(), NO_VALUE)


def _text(value) -> str:
    """Text as written, booleans lower case as design.yaml spells them; a
    missing value is "–" (a table of settings says "not set" itself)."""
    if _missing(value):
        return NO_VALUE
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def frame(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell as text; columns that are unset in every row are dropped
    (an unset setting is left out, not shown as a column of 'not set')."""
    if df.empty:
        return df
    keep = [c for c in df.columns if not df[c].map(_missing).all()]
    # Residues judged against the largest value of the same unit in the table
    # (a phase of 1e-18 s beside steps of 0.05 s is noise), more strictly
    # than within one column.
    floats = [c for c in keep if pd.api.types.is_float_dtype(df[c]) and not is_share(str(c))]
    largest: dict[str, float] = {}
    for c in floats:
        top = df[c].abs().max()
        if math.isfinite(top):
            largest[unit_of(str(c))] = max(top, largest.get(unit_of(str(c)), 0.0))
    scale = {c: largest.get(unit_of(str(c)), 0.0) * TABLE_RESIDUE / RESIDUE for c in floats}
    return pd.DataFrame({c: column(df[c], scale.get(c) or None) for c in keep}, index=df.index)


def _missing(value) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False
