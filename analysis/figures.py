"""Figures, drawn from the tables only: ``python -m analysis.figures TABLES``.

Each figure is one function of the tables that returns a plotnine plot; the
names and units on the axes are the columns' names in the tables.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pandas as pd
from plotnine import (aes, annotate, facet_wrap, geom_line, geom_point, ggplot, labs, scale_x_continuous,
                      stat_summary, theme, theme_bw)

FIGURE_SIZE = (8, 4.5)


def nothing_to_show(title: str):
    """A figure that says why it is empty, instead of no figure at all."""
    return (ggplot() + annotate("text", x=0, y=0, label="no successful run to show")
            + labs(title=title, x="", y="") + theme_bw() + theme(figure_size=FIGURE_SIZE))


def throughput(runs: pd.DataFrame):
    ok = runs[runs["status"] == "ok"].copy()
    if ok.empty:
        return nothing_to_show("Training throughput against processes")
    ok["batch_size"] = "batch_size " + ok["batch_size"].astype(str) + " per process"
    return (ggplot(ok, aes("world_size", "images_per_s", color="framework"))
            + geom_point(alpha=0.6, size=2)
            + stat_summary(fun_y=lambda y: y.mean(), geom="line", size=1)
            + facet_wrap("~batch_size")
            + scale_x_continuous(breaks=sorted(ok["world_size"].unique()))
            + labs(title="Training throughput against processes (points: replications; "
                         "line: mean)",
                   x="processes (nodes x procs_per_node)",
                   y="images_per_s (all ranks, images/s)")
            + theme_bw() + theme(figure_size=FIGURE_SIZE))


def accuracy(runs: pd.DataFrame, epochs: pd.DataFrame):
    keep = ["run_id", "framework", "world_size", "batch_size"]
    df = epochs.merge(runs[keep], on="run_id")
    if df.empty:
        return nothing_to_show("Test accuracy after each epoch")
    df["processes"] = df["world_size"].astype(str) + " process(es)"
    return (ggplot(df, aes("epoch", "test_accuracy", color="framework",
                           group="run_id"))
            + geom_line(alpha=0.7) + geom_point(size=1.5)
            + facet_wrap("~processes")
            + labs(title="Test accuracy after each epoch (one line per run)",
                   x="epoch", y="test_accuracy (fraction)")
            + theme_bw() + theme(figure_size=FIGURE_SIZE))


def draw_all(tables: Path) -> dict[str, Path]:
    runs = pd.read_parquet(tables / "runs.parquet")
    epochs = pd.read_parquet(tables / "epochs.parquet")
    folder = tables / "figures"
    folder.mkdir(exist_ok=True)
    plots = {"throughput": throughput(runs), "accuracy": accuracy(runs, epochs)}
    paths = {}
    for name, plot in plots.items():
        paths[name] = folder / f"{name}.png"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # plotnine's notes on saving
            plot.save(paths[name], dpi=110, verbose=False)
    return paths


if __name__ == "__main__":
    draw_all(Path(sys.argv[1]))
