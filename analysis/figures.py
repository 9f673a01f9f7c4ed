"""Figures, drawn from the tables only: ``python -m analysis.figures TABLES``.

Each figure is one function of the tables that returns a plotnine plot; the
names and units on the axes are the columns' names in the tables.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from plotnine import (
    aes,
    annotate,
    coord_flip,
    geom_boxplot,
    facet_grid,
    facet_wrap,
    geom_col,
    geom_errorbar,
    geom_hline,
    geom_line,
    geom_point,
    geom_segment,
    geom_text,
    ggplot,
    labs,
    scale_color_manual,
    scale_fill_manual,
    scale_x_continuous,
    scale_y_continuous,
    stat_summary,
    theme,
    theme_bw,
    element_text,
)

from analysis import accuracy, bottlenecks, cells, humanize, spread, stats
from analysis import critical_path as cp
from analysis.section import EMPTY_FIGURES, figures_folder
from analysis import compression as compression_table
from frameworks import compression as codecs
from runfiles.atomic import write_text
from runfiles.phases import PHASES, STEP_PHASES
from runfiles.tables import read_table

FIGURE_SIZE = (8, 4.5)
# One colour per phase in every figure (ColorBrewer Set3 and Dark2 hues).
PHASE_COLORS = dict(
    zip(
        PHASES,
        [
            "#8dd3c7",
            "#e6ab02",
            "#bebada",
            "#1b9e77",
            "#fb8072",
            "#377eb8",
            "#80b1d3",  # other_comm: grad_comm's hue, lighter
            "#e7298a",
            "#b3de69",
            "#d9d9d9",
        ],
    )
)


EMPTY_SIZE = (6, 1.5)  # inches: a figure with nothing to show


class EmptyFigure(ggplot):
    """A small figure that says why it is empty; draw_all records ``why`` so
    that the report says it in one line instead of showing the figure."""

    def __init__(self, why: str, title: str):
        super().__init__()
        self.why, self.title = why, title


def framed(title: str, x: str, y: str, figure_size=FIGURE_SIZE, **theme_args) -> list:
    """Every figure's frame: its title and axis labels, plotnine's
    black-and-white theme, its size (and any other theme setting)."""
    return [labs(title=title, x=x, y=y), theme_bw(), theme(figure_size=figure_size, **theme_args)]


def nothing_to_show(title: str, why: str = "no successful run to show") -> EmptyFigure:
    plot = EmptyFigure(why, title)
    plot += [annotate("text", x=0, y=0, label=why), *framed(title, "", "", figure_size=EMPTY_SIZE)]
    return plot


SINGLE_SCALE = "every framework ran at one scale only: no speedup to show"


def against_processes(table: pd.DataFrame, response: str, title: str, y_label: str):
    """A response against processes for every framework: each run a point,
    the mean a line, one panel per setting."""
    table = table.assign(setting=cells.natural(table["setting"]))
    return (
        ggplot(table, aes("world_size", response, color="framework"))
        + geom_point(alpha=0.6, size=2)
        + stat_summary(fun_y=lambda y: y.mean(), geom="line", size=1)
        + facet_wrap("~setting")
        + scale_x_continuous(breaks=sorted(table["world_size"].unique()))
        + framed(title=title, x="processes (nodes x procs_per_node)", y=y_label)
    )


def throughput(runs: pd.DataFrame):
    ok = cells.with_setting(runs[runs["status"] == "ok"])
    if ok.empty:
        return nothing_to_show("Training throughput against processes")
    return against_processes(
        ok,
        "images_per_s",
        "Training throughput against processes (points: replications; line: mean)",
        "images_per_s (all ranks, images/s)",
    )


def energy(runs: pd.DataFrame):
    """Energy per training image against processes, where it was measured."""
    ok = cells.with_setting(runs[runs["status"] == "ok"])
    measured = ok[ok["energy_per_image_j"].notna()] if "energy_per_image_j" in ok else ok[0:0]
    if measured.empty:
        return nothing_to_show(
            "Energy per image against processes",
            "energy not available (see the report's energy section)",
        )
    return against_processes(
        measured,
        "energy_per_image_j",
        "Energy per training image against processes (points: replications; line: mean)",
        "energy_per_image_j (all nodes, J/image)",
    )


def accuracy_per_epoch(runs: pd.DataFrame, epochs: pd.DataFrame):
    keep = ["run_id", "framework", "world_size", "batch_size"]
    df = epochs.merge(runs[keep], on="run_id")
    if df.empty:
        return nothing_to_show("Test accuracy after each epoch")
    df["processes"] = cells.natural(df["world_size"].map(humanize.processes))
    return (
        ggplot(df, aes("epoch", "test_accuracy", color="framework", group="run_id"))
        + geom_line(alpha=0.7)
        + geom_point(size=1.5)
        + facet_wrap("~processes")
        + scale_x_continuous(breaks=whole_numbers(df["epoch"]))  # no epoch 1.5
        + framed(
            title="Test accuracy after each epoch (one line per run)",
            x="epoch",
            y="test_accuracy (fraction)",
        )
    )


def whole_numbers(values: pd.Series) -> list[int]:
    """Axis breaks at every whole number the values span, for a count
    (epochs, ranks) that has no fractions."""
    return list(range(int(values.min()), int(values.max()) + 1))


def time_to_accuracy(runs: pd.DataFrame):
    """Time to target accuracy against processes; runs that never reached
    it are drawn as crosses on a band above the others, not left out."""
    title = "Time to target accuracy against processes"
    asked = runs[(runs["status"] == "ok") & (runs["target_status"] != accuracy.NOT_ASKED)]
    if asked.empty:
        return nothing_to_show(title)
    asked = cells.with_setting(asked)
    reached = asked[asked["target_status"] == accuracy.REACHED]
    ceiling = (reached["time_to_accuracy_s"].max() if len(reached) else 1.0) * 1.15
    missed = asked[asked["target_status"] == accuracy.NOT_REACHED].assign(
        time_to_accuracy_s=ceiling
    )
    target = asked["target_accuracy"].iloc[0]
    if reached.empty:
        return nothing_to_show(title, f"no run reached test accuracy {target:g}")
    plot = against_processes(
        reached,
        "time_to_accuracy_s",
        f"Time to test accuracy {target:g} (points: runs; crosses: not reached)",
        "time_to_accuracy_s (run clock, s)",
    )
    if len(missed):
        plot = (
            plot
            + geom_point(
                aes("world_size", "time_to_accuracy_s", color="framework"),
                data=missed,
                shape="x",
                size=4,
            )
            + annotate(
                "text",
                x=min(asked["world_size"]),
                y=ceiling * 1.04,
                label="not reached",
                ha="left",
                size=8,
            )
        )
    return plot


def compression(runs: pd.DataFrame):
    """Bytes sent per step, time per step and final accuracy against the
    gradient compression, one colour per framework."""
    table = compression_table.summary(runs)
    if table.empty:
        return nothing_to_show("Gradient compression")
    panels = {
        "comm_bytes_per_step": ("MB/step handed over", 1e-6),
        "step_mean_s": ("ms/step, slowest rank", 1e3),
        "final_test_accuracy": ("final test accuracy", 1.0),
    }
    long = pd.concat(
        [
            table.assign(response=label, value=table[column] * factor)
            for column, (label, factor) in panels.items()
        ]
    )
    long["processes"] = long["world_size"].astype(str) + " proc."
    # in the codecs' order (frameworks/compression.py), the panels as listed
    long["compression"] = pd.Categorical(
        long["compression"], [c for c in codecs.NAMES if c in set(long["compression"])]
    )
    long["response"] = pd.Categorical(long["response"], [label for label, _ in panels.values()])
    settings = long["setting"].nunique()
    return (
        ggplot(
            long,
            aes(
                "compression",
                "value",
                color="framework",
                shape="processes",
                group="framework + processes",
            ),
        )
        + geom_point(size=2.5)
        + geom_line()
        + facet_grid("response ~ setting", scales="free_y")
        + framed(
            title="Gradient compression: bytes, step time and accuracy (means over replications)",
            x="compression",
            y="",
            figure_size=(3 + 3 * settings, 7),
            axis_text_x=element_text(rotation=30, ha="right"),
        )
    )


def scaling(runs: pd.DataFrame):
    table = stats.scaling(runs)
    if table.empty:
        return nothing_to_show("Speedup against processes")
    if table.groupby(["framework", "setting"])["world_size"].nunique().max() < 2:
        return nothing_to_show("Speedup against processes", SINGLE_SCALE)
    table = table.assign(setting=cells.natural(table["setting"]))
    return (
        ggplot(table, aes("world_size", "speedup", color="framework"))
        + geom_line(aes(y="ideal_speedup"), linetype="dashed", color="grey")
        + geom_line(size=1)
        + geom_point(size=2)
        + geom_errorbar(aes(ymin="speedup_low", ymax="speedup_high"), width=0.1)
        + facet_wrap("~setting")
        + scale_x_continuous(breaks=sorted(table["world_size"].unique()))
        + framed(
            title="Speedup over the smallest planned scale\n(dashed: ideal; bars: 95 % interval)",
            x="processes",
            y="speedup (throughput / base throughput)",
        )
    )


def phase_breakdown(table: pd.DataFrame):
    if table.empty:
        return nothing_to_show("Time per step by phase")
    # One horizontal bar per processes x setting, so that any number of
    # settings stays readable.
    table = table.assign(
        ms=table["mean"] * 1e3,
        cell=cells.natural(table["world_size"].astype(str) + " proc., " + table["setting"]),
    )
    bars = table.groupby("framework")["cell"].nunique().sum()
    drawn = (table["ms"] > 0).groupby(table["framework"]).any()
    notes = empty_panel_notes(table, drawn, lambda part: {"cell": part["cell"].min(), "ms": 0.0})
    plot = (
        ggplot(table, aes("cell", "ms", fill="phase"))
        + geom_col()
        + scale_fill_manual(values=PHASE_COLORS)
        + coord_flip()
        + facet_wrap("~framework", ncol=1, scales="free_y")
        + framed(
            title="Mean time per step in each phase (ranks and replications)",
            x="",
            y="time per step (ms)",
            figure_size=(9, 2 + 0.35 * bars),
        )
    )
    if not notes.empty:
        notes["cell"] = pd.Categorical(notes["cell"], table["cell"].cat.categories, ordered=True)
        plot += geom_text(
            aes("cell", "ms", label="label"), data=notes, size=9, ha="left", inherit_aes=False
        )
    return plot


def timeline(phases: pd.DataFrame, runs: pd.DataFrame, window: int = 12):
    """Gantt of every rank over a window of steps of the largest run of each
    framework, outlier steps (beyond median + 3 MAD) marked."""
    ok = runs[runs["status"] == "ok"].sort_values(["world_size", "rep"], ascending=[False, True])
    chosen = ok.groupby("framework").head(1)
    frames = []
    for row in chosen.itertuples():
        run = phases[(phases["run_id"] == row.run_id) & (phases["step"] >= row.warmup_steps)]
        first = run["step"].min()
        part = run[run["step"] < first + window]
        if part.empty:
            continue
        t0 = part["start_ns"].min()
        frames.append(
            part.assign(
                framework=row.framework,
                start_ms=(part["start_ns"] - t0) / 1e6,
                end_ms=(part["end_ns"] - t0) / 1e6,
                rank=part["rank"].map(lambda r: f"rank {r}"),
            )
        )
    if not frames:
        return nothing_to_show("Per-rank timeline")
    data = pd.concat(frames)
    steps = data.groupby(["framework", "rank", "step"]).agg(
        start=("start_ms", "min"), end=("end_ms", "max")
    )
    steps["dur"] = steps["end"] - steps["start"]
    med = steps.groupby("framework")["dur"].transform("median")
    mad = steps.groupby("framework")["dur"].transform(lambda d: (d - d.median()).abs().median())
    outliers = steps[steps["dur"] > med + 3 * mad].reset_index()
    plot = (
        ggplot(data)
        + geom_segment(
            aes(x="start_ms", xend="end_ms", y="rank", yend="rank", color="phase"), size=6
        )
        + scale_color_manual(values=PHASE_COLORS)
        + facet_wrap("~framework", ncol=1, scales="free")
        + framed(
            title=f"Per-rank timeline of {window} measured steps "
            "(largest run of each framework; x: outlier steps)",
            x="time since the window's start (ms)",
            y="rank",
            figure_size=(9, 2 + 1.6 * data["framework"].nunique()),
        )
    )
    if not outliers.empty:
        plot += geom_point(
            aes(x="start", y="rank"), data=outliers, shape="x", size=4, color="black"
        )
    drawn = (data["end_ms"] > data["start_ms"]).groupby(data["framework"]).any()
    notes = empty_panel_notes(data, drawn, lambda part: {"x": 0.0, "rank": part["rank"].min()})
    if not notes.empty:
        plot += geom_text(aes(x="x", y="rank", label="label"), data=notes, size=9, ha="left")
    return plot


def empty_panel_notes(data: pd.DataFrame, drawn: pd.Series, at) -> pd.DataFrame:
    """One line, placed ``at(its rows)`` (the panel's coordinates), in each framework's
    panel that would otherwise be empty (``drawn``: per framework, whether
    anything of positive length is drawn), saying why."""
    from frameworks import registry

    rows = []
    for framework, part in data.groupby("framework", observed=True):
        if drawn.get(framework, False):
            continue
        info = registry.FRAMEWORKS.get(framework)
        timed = info is not None and set(info.exposes) & set(STEP_PHASES)
        why = "no phase timed here" if timed else "whole steps only, no phase inside them"
        if info is not None and info.owns_step:  # phases only where the design asked
            why = "whole steps only (fit_step_phases: false)"
        rows.append({"framework": framework, **at(part), "label": f"{framework}: {why}"})
    return pd.DataFrame(rows)


def waterfall(table: pd.DataFrame, why: str = "no successful run to show"):
    if table.empty:
        return nothing_to_show("Scaling loss by phase", why)
    table = table.assign(
        cell=cells.natural(
            table["framework"]
            + ", "
            + table["world_size"].astype(str)
            + " proc., "
            + table["setting"]
        )
    )
    return (
        ggplot(table, aes("phase", "speedup_lost", fill="phase"))
        + geom_col()
        + scale_fill_manual(values=PHASE_COLORS)
        + geom_hline(yintercept=0, color="grey")
        + coord_flip()
        + facet_wrap("~cell")
        + framed(
            title="Where the speedup goes: ideal minus measured speedup, split by phase",
            x="phase",
            y="speedup lost (negative: gained)",
            figure_size=(9, 5),
            legend_position="none",
        )
    )


def step_times(runs: pd.DataFrame, phases: pd.DataFrame):
    """Box plot of the measured steps' times, one box per cell."""
    steps = spread.step_times(runs, phases)
    if steps.empty:
        return nothing_to_show("Step time per cell", "no measured step in the phase tables")
    label = (
        steps["framework"]
        + ", "
        + steps["world_size"].astype(int).astype(str)
        + " proc., "
        + steps["setting"]
    )
    steps = steps.assign(cell=cells.natural(label), step_ms=steps["step_s"] * 1e3)
    return (
        ggplot(steps, aes("cell", "step_ms", fill="framework"))
        + geom_boxplot(outlier_size=0.6, outlier_alpha=0.4)
        + coord_flip()
        + framed(
            title="Time of each measured step (all ranks and replications; box: quartiles, "
            "whiskers: 1.5 IQR)",
            x="",
            y="step time (ms)",
            figure_size=(9, 1.5 + 0.4 * steps["cell"].nunique()),
        )
    )


def run_name(runs: pd.DataFrame | None, run_id: str) -> str:
    """A run as a reader names it (framework, processes, setting, replication),
    its id only where the runs table does not know it."""
    if runs is None or "run_id" not in runs or not (runs["run_id"] == run_id).any():
        return run_id
    row = cells.with_setting(runs).set_index("run_id").loc[run_id]
    rep = f", rep {row['rep']}" if "rep" in row else ""
    return f"{row['framework']}, {humanize.processes(row['world_size'])}, {row['setting']}{rep}"


def critical_path(
    found: cp.CriticalPath, folder: Path, runs: pd.DataFrame | None = None, joins: int = 6
) -> Path:
    """critical_path.png in ``folder``: :func:`critical_path_plot`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "critical_path.png"
    critical_path_plot(found, runs, joins).save(out, dpi=100, verbose=False)
    return out


def critical_path_plot(found: cp.CriticalPath, runs: pd.DataFrame | None = None, joins: int = 6):
    """The per-rank timeline of a few joins of the first run with the most
    ranks, the critical path drawn over it in black, on the rank rows."""
    ranks = found.joins.groupby("run_id")["rank"].nunique()
    run_id = ranks.idxmax()
    first = int(found.joins[found.joins["run_id"] == run_id]["join"].min()) + 1
    path = found.path[
        (found.path["run_id"] == run_id)
        & (found.path["kind"] != cp.UNTIMED)
        & found.path["join"].between(first, first + joins - 1)
    ]
    path = path.astype({"start_ns": "int64", "end_ns": "int64", "rank": "int64"})
    start, end = path["start_ns"].min(), path["end_ns"].max()
    iv = found.intervals[
        (found.intervals["run_id"] == run_id)
        & (found.intervals["end_ns"] > start)
        & (found.intervals["start_ns"] < end)
    ]
    data = iv.assign(
        start_ms=(iv["start_ns"] - start) / 1e6,
        end_ms=(iv["end_ns"] - start) / 1e6,
        y=iv["rank"].astype(float),
        phase=iv["phase"].astype(str),
    )
    marks = path.assign(
        start_ms=(path["start_ns"] - start) / 1e6,
        end_ms=(path["end_ns"] - start) / 1e6,
        y=path["rank"].astype(float),
    )
    jumps = marks.sort_values("start_ms")
    jumps = pd.DataFrame(
        {
            "x": jumps["end_ms"].to_numpy()[:-1],
            "y": jumps["y"].to_numpy()[:-1],
            "yend": jumps["y"].to_numpy()[1:],
        }
    )
    return (
        ggplot()
        + geom_segment(
            aes(x="start_ms", xend="end_ms", y="y", yend="y", color="phase"), data=data, size=6
        )
        + geom_segment(
            aes(x="start_ms", xend="end_ms", y="y", yend="y"), data=marks, size=1.2, color="black"
        )
        + geom_segment(
            aes(x="x", xend="x", y="y", yend="yend"), data=jumps, size=0.6, color="black"
        )
        + scale_color_manual(values=PHASE_COLORS)
        + scale_y_continuous(breaks=whole_numbers(data["y"]))  # ranks only, no rank 0.5
        + framed(
            title=f"Critical path (black) over {joins} steps of {run_name(runs, run_id)}",
            x="time since the window's start (ms)",
            y="rank",
            figure_size=(9, 2 + 0.4 * ranks.max()),
        )
    )


# plotnine refuses to save a figure over 25 inches a side; a design of many
# levels (a facet per setting) would ask for more.
MAX_INCHES = 24


def save(plot, path: Path) -> None:
    """``plot`` as a PNG at ``path``, each side within MAX_INCHES (a wider
    figure is drawn narrower, its facets closer, rather than not at all).
    A figure with nothing to show is its title and its one line, drawn by
    matplotlib alone: plotnine's layout of that one line cost a tenth to a
    third of a CPU second a figure (the report shows the line instead)."""
    if isinstance(plot, EmptyFigure):
        figure = Figure(figsize=EMPTY_SIZE)
        figure.suptitle(plot.title)
        figure.text(0.5, 0.4, plot.why, ha="center", va="center")
        figure.savefig(path, dpi=110)
        return
    width, height = plot.theme.getp("figure_size")
    if max(width, height) > MAX_INCHES:
        plot = plot + theme(figure_size=(min(width, MAX_INCHES), min(height, MAX_INCHES)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plotnine's notes on saving
        plot.save(path, dpi=110, verbose=False)


def draw_all(tables: Path) -> dict[str, Path]:
    runs = read_table(tables / "runs.parquet")
    epochs = read_table(tables / "epochs.parquet")
    phases = read_table(tables / "step_phases.parquet")
    ok = runs[runs["status"] == "ok"]
    table = (
        bottlenecks.breakdown(phases[phases["run_id"].isin(ok["run_id"])], ok, cells.CELL)
        if not phases.empty and not ok.empty
        else pd.DataFrame()
    )
    gap = bottlenecks.waterfall(table, ["framework", "setting"]) if len(table) else table
    folder = figures_folder(tables)
    folder.mkdir(exist_ok=True)
    plots = {
        "throughput": throughput(runs),
        "scaling": scaling(runs),
        "phases": phase_breakdown(table),
        "timeline": timeline(phases, runs),
        "waterfall": waterfall(gap, SINGLE_SCALE if len(table) else "no phase table"),
        "accuracy": accuracy_per_epoch(runs, epochs),
        "time_to_accuracy": time_to_accuracy(runs),
        "energy": energy(runs),
        "compression": compression(runs),
        "step_times": step_times(runs, phases),
    }
    paths, empty = {}, {}
    for name, plot in plots.items():
        if isinstance(plot, EmptyFigure):
            empty[name] = plot.why
        paths[name] = folder / f"{name}.png"
        save(plot, paths[name])
    write_text(folder / EMPTY_FIGURES, json.dumps(empty, indent=1) + "\n")
    return paths


if __name__ == "__main__":
    from runfiles.tables import Damaged

    try:
        draw_all(Path(sys.argv[1]))
    except Damaged as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
