"""The one shape of a report section, and its one renderer.

Every section of the report is a :class:`Section`: an id (the anchor), a
title (its heading and its line in the table of contents) and its blocks in
the order the page shows them: paragraphs, headings, lists of sentences,
tables, figures, preformatted text. A builder, a function of the report's
:class:`~analysis.page.Context` that lives in the module whose results the
section presents, fills one in and returns it; it never writes HTML.

Text is plain strings, escaped when rendered. Where a sentence needs more
than plain text it is a list of pieces: strings and the few marks below
(:class:`Code`, :class:`Em`, :class:`Strong`, :class:`Sup`, :class:`Link`).

The Jinja2 template analysis/templates/section.html.j2 turns a Section into
HTML, with autoescaping; :meth:`Section.html` renders one alone and
analysis/report.py renders them all into the page.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Union

import jinja2
import pandas as pd

from analysis import humanize
from runfiles import files

TEMPLATES = Path(__file__).parent / "templates"
LONG_TABLE = 12  # rows; longer tables start folded (one click opens them)


EMPTY_FIGURES = "empty.json"  # figure name -> why it has nothing to show (analysis/figures.py)


def figures_folder(tables: Path) -> Path:
    """The tables' figures folder; Damaged, naming it and the fix, where it
    is no folder inside the tables (a file; a link leading out, through
    which a figure drawn would be written outside the results)."""
    from runfiles.tables import Damaged

    folder = Path(tables) / "figures"
    if problem := files.place_problem(folder, Path(tables)):
        raise Damaged(problem)
    return folder


def empty_figures(folder: Path) -> dict:
    try:
        return files.read_json(folder / EMPTY_FIGURES)
    except (OSError, ValueError):
        return {}


# ------------------------------------------------------------ rich text


@dataclass(frozen=True)
class Mark:
    """A run of text the template sets apart; ``kind`` names how."""

    text: str
    kind: ClassVar[str] = ""


class Code(Mark):
    kind = "code"


class Em(Mark):
    kind = "em"


class Strong(Mark):
    kind = "strong"


class Sup(Mark):
    kind = "sup"


@dataclass(frozen=True)
class Link(Mark):
    href: str
    kind: ClassVar[str] = "link"


Text = Union[str, Mark, list]  # a string, a mark, or a list of strings and marks


def pieces(text: Text) -> list:
    """Text as a list of strings and marks."""
    return list(text) if isinstance(text, list) else [text]


def plain(text: Text) -> str:
    """Text without its marks (what a reader reads)."""
    return "".join(p if isinstance(p, str) else p.text for p in pieces(text))


# --------------------------------------------------------------- blocks


@dataclass
class Paragraph:
    text: list
    css: str = ""
    kind: ClassVar[str] = "paragraph"


@dataclass
class Heading:
    text: str
    kind: ClassVar[str] = "heading"


@dataclass
class Items:
    """Sentences, one per list item."""

    items: list[list]
    ordered: bool = False
    css: str = ""
    kind: ClassVar[str] = "items"


@dataclass
class Preformatted:
    text: str
    kind: ClassVar[str] = "pre"


@dataclass
class Table:
    """A DataFrame shown with human numbers; long ones start folded."""

    data: pd.DataFrame
    caption: str = ""
    fold: bool | None = None
    kind: ClassVar[str] = "table"

    @functools.cached_property
    def shown(self) -> pd.DataFrame:
        if self.data is None or self.data.empty:
            return pd.DataFrame()
        return humanize.frame(self.data.reset_index(drop=True))

    @property
    def empty(self) -> bool:
        return self.data is None or self.data.empty

    @property
    def folded(self) -> bool:
        return len(self.data) > LONG_TABLE if self.fold is None else self.fold

    @property
    def columns(self) -> list[list[str]]:
        """Each column's name in parts split at "_" (a long name may wrap
        after each)."""
        return [str(name).split("_") for name in self.shown.columns]

    @property
    def rows(self) -> list[list[tuple[str, str]]]:
        """Each row's cells as (text, css class): a run's status cell is
        coloured by its value."""
        shown = self.shown
        status = [str(c) == "status" for c in shown.columns]
        return [
            [
                (text, text if is_status else "")
                for text, is_status in zip(
                    (humanize.NO_VALUE if _missing(v) else str(v) for v in row), status
                )
            ]
            for row in shown.itertuples(index=False)
        ]


def _missing(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


@dataclass
class Figure:
    """A figure embedded, or why there is none (analysis/figures.py records
    why a figure has nothing to show)."""

    path: Path
    alt: str
    kind: ClassVar[str] = "figure"

    @property
    def why_not(self) -> str:
        if not self.path.exists():
            return "no figure (no successful run)"
        try:  # a FIFO would hang the report, /dev/zero fill its memory
            files.regular(self.path, files.MAX_RECORD_BYTES)
        except files.NotRegular as exc:
            return f"no figure ({exc}; delete it, and the workflow draws it again)"
        return empty_figures(self.path.parent).get(self.path.stem, "")

    @property
    def src(self) -> str:
        return "data:image/png;base64," + base64.b64encode(files.read_bytes(self.path)).decode()


Block = Union[Paragraph, Heading, Items, Preformatted, Table, Figure]


# -------------------------------------------------------------- section


@dataclass
class Section:
    id: str
    title: str
    blocks: list = field(default_factory=list)
    css: str = ""  # a class for the whole section ("answer": the summary)

    def para(self, *text: Text, css: str = "") -> Section:
        """A paragraph of the pieces given (strings and marks)."""
        self.blocks.append(Paragraph([p for t in text for p in pieces(t)], css))
        return self

    def heading(self, text: str) -> Section:
        self.blocks.append(Heading(text))
        return self

    def items(self, lines: list, ordered: bool = False, css: str = "") -> Section:
        """A list, one sentence per item (nothing where there is none)."""
        if lines:
            self.blocks.append(Items([pieces(line) for line in lines], ordered, css))
        return self

    def table(self, df: pd.DataFrame, caption: str = "", fold: bool | None = None) -> Section:
        self.blocks.append(Table(df, caption, fold))
        return self

    def figure(self, path: Path, alt: str) -> Section:
        self.blocks.append(Figure(Path(path), alt))
        return self

    def pre(self, text: str) -> Section:
        self.blocks.append(Preformatted(text))
        return self

    # Views of the blocks, for whoever reads a section rather than its page.

    @property
    def sentences(self) -> list[str]:
        """Every listed sentence, as plain text."""
        return [plain(i) for b in self.blocks if isinstance(b, Items) for i in b.items]

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """caption -> table (of tables sharing a caption, the last)."""
        return {b.caption: b.data for b in self.blocks if isinstance(b, Table)}

    @property
    def figures(self) -> list[Path]:
        return [b.path for b in self.blocks if isinstance(b, Figure)]

    def html(self) -> str:
        """This section alone as HTML (the page renders each the same way)."""
        return environment().get_template("section.html.j2").render(s=self)


@functools.cache
def environment() -> jinja2.Environment:
    """The report's templates, autoescaping."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
