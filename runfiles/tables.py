"""Reading the tables a run leaves (its TSV files, its converted traces) and
the Parquet tables built from them, checked before anything reads a figure.

A file can be damaged after the run wrote it (a full disk, a careless edit,
a copy cut short, a file deleted): the reader raises ``Damaged``, one line
naming the file and what is wrong, never NaN figures and never a crash of
the tables. The columns each TSV file must have are declared in names.py,
beside the file names, where the training side that writes them finds them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from runfiles import files
from runfiles.names import RUNS_COLUMNS, TABLE_COLUMNS, column_kind


class Damaged(Exception):
    """One file of a run is damaged; the message names it and the problem."""


def read_record(path: Path, *keys: str) -> dict:
    """A JSON record the workflow wrote into the tables folder (the model
    gate's verdict, the probe's timings), with ``keys``; Damaged, naming it
    and the fix, when it is not one (a cut, edited or swapped file)."""
    try:
        doc = files.read_json(path)
    except (OSError, ValueError) as exc:
        raise Damaged(f"{path}: cannot be read ({exc}); {_REWRITE}") from None
    if not isinstance(doc, dict):
        raise Damaged(f"{path}: not a JSON object; {_REWRITE}")
    if missing := [k for k in keys if k not in doc]:
        raise Damaged(f"{path}: has no {', '.join(missing)}; {_REWRITE}")
    return doc


_REWRITE = "delete it, and the workflow writes it again"


def read_tsv(path: Path, columns: tuple[str, ...], min_rows: int = 1) -> pd.DataFrame:
    """A run's table, checked for its columns and numbers."""
    name = path.name
    try:
        table = pd.read_csv(files.regular(path), sep="\t")
    except FileNotFoundError:
        raise Damaged(f"{name}: missing") from None
    except files.NotRegular as exc:
        raise Damaged(f"{name}: cannot be read ({exc})") from None
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise Damaged(f"{name}: cannot be read as a table ({str(exc)[:120]})") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise Damaged(f"{name}: column {missing[0]} missing")
    if len(table) < min_rows:
        raise Damaged(f"{name}: no rows (cut short?)")
    for column in columns:
        if column == "phase":
            continue
        numbers = pd.to_numeric(table[column], errors="coerce")
        bad = table.index[numbers.isna() & table[column].notna()]
        if len(bad):
            raise Damaged(
                f"{name}: row {bad[0] + 2}, column {column}: "
                f"{str(table[column][bad[0]])[:30]!r} is not a number"
            )
    return table


def plain_text(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary-encoded text columns as plain strings
    (cast in Arrow: one take each), metadata kept: the values, whatever
    names each part's dictionary holds (a reader's may hold names no row
    uses, in an order of its own)."""
    schema = pa.schema(
        [
            f.with_type(f.type.value_type)
            if pa.types.is_dictionary(f.type) and pa.types.is_string(f.type.value_type)
            else f
            for f in table.schema
        ],
        metadata=table.schema.metadata,
    )
    return table if schema.equals(table.schema) else table.cast(schema)


def read_table(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """A Parquet table (a run's phases.parquet, the tables the analysis
    reads), read whole; Damaged, naming the file and the fix, when it cannot be."""
    import pyarrow.parquet as pq

    # A phase table's text columns are dictionaries in the file (schema 3:
    # traces/table.py); the analysis gets them as before, pandas' string
    # columns (what a column of strings gives), not Categoricals:
    # those group (observed=False: a group per category, seen or not), sort
    # (by code, not by name) and concatenate (with the recorder's plain
    # columns) otherwise. The cast is one take per column, paid here, where
    # the analysis reads the stacked table, not in every conversion.
    table = _parquet(path, lambda: plain_text(pq.read_table(path, columns=columns)))
    _check_columns(path, table.schema, all_read=columns is None)
    return table.to_pandas()


def read_runs(path: Path, factors=()) -> pd.DataFrame:
    """The runs table (runs.parquet), with the columns its readers need;
    Damaged, naming the first missing column and the fix, when not."""
    runs = read_table(path)
    missing = [c for c in (*RUNS_COLUMNS, "images_per_s", *factors) if c not in runs]
    if missing:
        raise Damaged(
            f"{path}: column {missing[0]} missing: not the runs table of this design; "
            "delete it and run the workflow again (./ddlc run), or pass the right --tables"
        )
    return runs


def check_table(path: Path) -> None:
    """A Parquet table's footer and schema, read without its data (cheap: a
    file cut short or overwritten fails here); Damaged when unreadable."""
    import pyarrow.parquet as pq

    _check_columns(path, _parquet(path, lambda: pq.read_schema(path)))


def _check_columns(path: Path, schema: pa.Schema, all_read: bool = True) -> None:
    """A table of a known name has the columns its readers need (when read
    whole), each of the kind they compute on (names.column_kind)."""
    name = Path(path).name
    if all_read and (missing := [c for c in TABLE_COLUMNS.get(name, ()) if c not in schema.names]):
        wrong = f"column {missing[0]} missing"
    elif odd := [f for f in schema if not _holds(column_kind(name, f.name), f.type)]:
        wrong = f"column {odd[0].name} holds {odd[0].type}, not {column_kind(name, odd[0].name)}"
    else:
        return
    raise Damaged(
        f"{path}: {wrong}: not the {name} the workflow builds (another table copied "
        "over it, or edited?); delete it and run the workflow again (./ddlc run), "
        "which builds it again"
    )


def _holds(kind: str | None, type_: pa.DataType) -> bool:
    """Whether a column of Arrow type ``type_`` holds ``kind`` (a column
    of nulls holds any: a figure no run had)."""
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    if kind is None or pa.types.is_null(type_):
        return True
    if kind == "text":
        return pa.types.is_string(type_) or pa.types.is_large_string(type_)
    return pa.types.is_integer(type_) or pa.types.is_floating(type_)


def _parquet(path: Path, read):
    try:
        files.regular(path)
        return read()
    except FileNotFoundError:
        raise Damaged(f"{path}: missing") from None
    except files.NotRegular as exc:
        raise Damaged(f"{exc}; delete it and run the workflow again (./ddlc run)") from None
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise Damaged(
            f"{path}: damaged table ({str(exc).splitlines()[0][:120]}); delete it and run "
            "the workflow again (./ddlc run), which builds it again"
        ) from None
