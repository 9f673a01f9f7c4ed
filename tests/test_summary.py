"""The answer-first summary on constructed tables where the answer is known:
ranking, significance with Holm's correction, degenerate cells said in
words, the bottleneck sentence, human numbers."""

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis import cells, humanize, summary


def runs_table(cells: dict) -> pd.DataFrame:
    """cells: (framework, procs) -> list of images_per_s, one per replication."""
    rows = []
    for (framework, procs), values in cells.items():
        for rep, value in enumerate(values, start=1):
            rows.append(
                {
                    "run_id": f"{framework}-{procs}-{rep}",
                    "status": "ok",
                    "framework": framework,
                    "nodes": 1,
                    "procs_per_node": procs,
                    "world_size": procs,
                    "batch_size": 64,
                    "images_per_s": value,
                    "time_to_accuracy_s": np.nan,
                    "rep": rep,
                }
            )
    return pd.DataFrame(rows)


def test_ranking_neighbours_and_holm_correction():
    rng = np.random.default_rng(1)
    runs = runs_table(
        {
            ("fast", 2): list(300 + rng.normal(0, 2, 5)),
            ("middle", 2): list(200 + rng.normal(0, 2, 5)),
            ("close", 2): list(199.5 + rng.normal(0, 2, 5)),  # within noise of middle
            ("fast", 1): list(160 + rng.normal(0, 2, 5)),
            ("middle", 1): list(110 + rng.normal(0, 2, 5)),
            ("close", 1): list(108 + rng.normal(0, 2, 5)),
        }
    )
    table = summary.ranking(runs, "images_per_s", higher_is_better=True)
    two = table[table["world_size"] == 2].set_index("rank")
    assert list(two["framework"][:1]) == ["fast"]
    assert two.loc[1, "next"] in ("middle", "close")
    assert two.loc[1, "significant"] == "yes"
    assert two.loc[2, "significant"] == "no"  # 0.5 images/s apart, sd 2
    assert math.isnan(two.loc[3, "p_raw"]) and pd.isna(two.loc[3, "next"])
    # The third is tested against the best too, in the same Holm family.
    assert two.loc[3, "significant_best"] == "yes" and pd.isna(two.loc[2, "p_raw_best"])
    # Holm: the adjusted p of the smallest raw p is raw x (number of tests),
    # the neighbour pairs and the pairs with the best counted together.
    family = pd.concat(
        [
            table[["p_raw", "p_adjusted"]],
            table[["p_raw_best", "p_adjusted_best"]].set_axis(["p_raw", "p_adjusted"], axis=1),
        ]
    ).dropna(subset=["p_raw"])
    assert len(family) == 2 * 2 + 2 * 1
    smallest = family.iloc[family["p_raw"].argmin()]
    assert smallest["p_adjusted"] == pytest.approx(min(1, smallest["p_raw"] * len(family)))
    # Speedup against the framework's smallest scale.
    scaled = summary.with_scaling(table, runs)
    fast2 = scaled[(scaled["framework"] == "fast") & (scaled["world_size"] == 2)].iloc[0]
    assert fast2["speedup"] == pytest.approx(300 / 160, rel=0.03)
    assert fast2["efficiency"] == pytest.approx(300 / 160 / 2, rel=0.03)


def test_degenerate_cells_are_said_in_words():
    runs = runs_table(
        {("a", 2): [100.0, 100.0, 100.0], ("b", 2): [90.0, 90.0, 90.0], ("c", 2): [50.0]}
    )
    table = summary.ranking(runs, "images_per_s", True).set_index("framework")
    assert "no variance within either cell" in table.loc["a", "significant"]
    assert table.loc["b", "significant"] == "too few replications to test: n = 1"
    result = summary.build(runs, pd.DataFrame())
    line = result.headlines[0]
    # no variance in either cell: the gap is exact, so a leader may be named
    assert line.startswith("Throughput at 1 node x 2 processes, batch_size 64: a leads")
    assert "100 images/s (identical in every replication)" in line
    assert "10 images/s (11.1 %) ahead of b" in line
    table = result.replications.set_index("framework")
    assert table.loc["c", "met_target"] == "no: one replication, no interval"
    assert table.loc["a", "met_target"] == "yes"  # identical replications: a zero-width interval
    assert "nan" not in " ".join(result.headlines)


def headline_of(cells: dict) -> str:
    (line,) = summary.build(runs_table(cells), pd.DataFrame()).headlines[:1]
    return line


def test_headline_names_a_leader_only_where_the_test_supports_it():
    significant = headline_of({("a", 2): [300.0, 302.0, 298.0], ("b", 2): [200.0, 203.0, 197.0]})
    assert significant.startswith(
        "Throughput at 1 node x 2 processes, batch_size 64: a leads with 300 "
        "images/s (95 % interval "
    )
    assert "ahead of b (significant, Holm-adjusted p " in significant
    close = headline_of({("a", 2): [300.0, 330.0, 270.0], ("b", 2): [290.0, 320.0, 262.0]})
    assert close.startswith(
        "No significant difference in throughput between a and b at 1 node x 2 processes, "
        "batch_size 64 (Holm-adjusted p "
    )
    assert "leads" not in close and "ahead" not in close
    single = headline_of({("a", 2): [300.0], ("b", 2): [200.0]})
    assert single == (
        "Throughput at 1 node x 2 processes, batch_size 64: a and b cannot be "
        "told apart (too few replications to test: n = 1): a 300 images/s (one replication: "
        "no interval), b 200 images/s (one replication: no interval)."
    )


def test_intervals_of_positive_figures_stay_positive():
    """A wide spread over three runs: the t interval would reach below 0."""
    runs = runs_table({("a", 1): [100.0, 900.0, 50.0], ("a", 2): [80.0, 2000.0, 60.0]})
    table = summary.ranking(runs, "images_per_s", True)
    assert (table["images_per_s_low"] > 0).all()
    assert (table["images_per_s_low"] < table["images_per_s"]).all()
    assert (table["images_per_s"] < table["images_per_s_high"]).all()
    scaled = summary.with_scaling(table, runs).set_index("world_size").loc[2]
    assert 0 < scaled["speedup_low"] < scaled["speedup"] < scaled["speedup_high"]
    assert 0 < scaled["efficiency_low"] < scaled["efficiency"] < scaled["efficiency_high"]
    assert scaled["efficiency_high"] == pytest.approx(scaled["speedup_high"] / 2)
    line = summary.build(runs, pd.DataFrame()).headlines[-1]
    assert "speedup" in line and "95 % interval" in line and " -" not in line


def test_olympic_mean_from_five_replications():
    runs = runs_table({("a", 1): [100.0, 101.0, 99.0, 100.0, 500.0]})
    row = summary.replication_table(runs).iloc[0]
    assert row["olympic_images_per_s"] == pytest.approx(100.333, rel=1e-3)
    assert row["images_per_s"] == pytest.approx(180)
    assert row["met_target"] == "no: needs more replications"
    capped = summary.replication_table(runs, most=5).iloc[0]
    assert capped["met_target"] == "no: the cap of 5 replications reached"
    four = summary.replication_table(runs_table({("a", 1): [100.0, 101.0, 99.0, 100.0]}))
    assert pd.isna(four.iloc[0]["olympic_images_per_s"])
    assert four.iloc[0]["met_target"] == "yes"


def test_bottleneck_sentence_names_the_dominant_share_and_the_wait():
    found = pd.DataFrame(
        [
            {
                "framework": "horovod-torch",
                "world_size": 2,
                "setting": "batch_size 64",
                "bottleneck": "exposed communication",
                "value": 0.32,
                "finding": "",
            },
            {
                "framework": "horovod-torch",
                "world_size": 2,
                "setting": "batch_size 64",
                "bottleneck": "data loading",
                "value": 0.04,
                "finding": "",
            },
            {
                "framework": "horovod-torch",
                "world_size": 2,
                "setting": "batch_size 64",
                "bottleneck": "wait per step at the gradient exchange",
                "value": 0.012,
                "finding": "",
            },
            {
                "framework": "torch-ddp",
                "world_size": 1,
                "setting": "batch_size 64",
                "bottleneck": "exposed communication",
                "value": 0.0,
                "finding": "",
            },
            {
                "framework": "torch-ddp",
                "world_size": 1,
                "setting": "batch_size 64",
                "bottleneck": "data loading",
                "value": 0.01,
                "finding": "",
            },
        ]
    )
    lines = summary.dominant_bottlenecks(found).set_index("framework")["sentence"]
    assert lines["horovod-torch"] == (
        "horovod-torch, 2 processes (batch_size 64): 32 % of "
        "the step is exposed gradient exchange; the wait per step at the gradient "
        "exchange is 12 ms."
    )
    assert "compute dominates" in lines["torch-ddp"]


def test_whole_step_framework_is_not_said_to_be_compute_bound():
    """Tarantella's findings hold only its initialisation: no phase share
    was measured, so none may be called small."""
    found = pd.DataFrame(
        [
            {
                "framework": "tarantella",
                "world_size": 2,
                "setting": "batch_size 64",
                "bottleneck": "initialisation",
                "value": 0.05,
                "finding": "",
            }
        ]
    )
    (line,) = summary.dominant_bottlenecks(found)["sentence"]
    assert line == (
        "tarantella, 2 processes (batch_size 64): it times whole steps only, "
        "so no phase can be named the bottleneck (its runs did not record them, "
        "fit_step_phases: false; recording them lengthens its step, most likely by more "
        "than 1 %: docs/tracing.md)."
    )


def test_human_numbers():
    assert humanize.number(1234.5678, "images/s") == "1230 images/s"
    assert humanize.number(0.0000123, "s") == "12.3 µs"
    assert humanize.number(0.0000123) == "0.0000123"
    assert humanize.number(4.56e-4, "ms") == "456 ns"
    assert humanize.number(0.0123, "s") == "12.3 ms"
    assert humanize.number(2.5, "s") == "2.5 s"
    assert humanize.number(1e-12, "s") == "0.001 ns"
    assert humanize.number(-0.00002, "J") == "-20 µJ"
    assert humanize.percent(3.2e-7) == "< 0.01 %"
    assert humanize.percent(-3.2e-7) == "> -0.01 %"
    assert humanize.percent(0.0012) == "0.12 %"
    assert humanize.percent(0.5) == "50 %"
    assert humanize.number(123.456, "images/s") == "123 images/s"
    assert humanize.number(2_500_000, "B") == "2.5 MB"
    assert humanize.number(float("nan")) == "none"
    assert humanize.percent(0.3214) == "32.1 %"
    frame = humanize.frame(
        pd.DataFrame(
            {
                "sum_sq": [5547.0, 6.939e-18],
                "p": [1e-117, 0.2],
                "variation": [0.789, 0.0],
                "unset": [None, None],
            }
        )
    )
    assert list(frame["sum_sq"]) == ["5550", "0"]  # a residue of 6.9e-18 is zero
    assert list(frame["p"]) == ["< 0.001", "0.200"]
    assert list(frame["variation"]) == ["78.9 %", "0 %"]
    assert "unset" not in frame


def test_units_keep_their_own_prefixes():
    assert humanize.number(1.07e6, "MB/s") == "1070000 MB/s"
    assert humanize.number(1686568, "B") == "1.69 MB"
    assert humanize.number(5160, "B") == "5.16 kB"
    assert humanize.percent(18300) == "1830000 %"
    bytes_column = humanize.frame(pd.DataFrame({"bytes": [1280, 1686568]}))["bytes"]
    assert list(bytes_column) == ["1.28 kB", "1.69 MB"]


def test_levels_in_numeric_order():
    """batch_size 64 before 256 (and 1024), in the headlines and every table."""
    rows = []
    for batch in (1024, 256, 64):
        part = runs_table({("a", 1): [100.0 + batch, 101.0 + batch], ("b", 1): [90.0, 91.0]})
        rows.append(part.assign(batch_size=batch, run_id=part["run_id"] + f"-{batch}"))
    runs = pd.concat(rows, ignore_index=True)
    result = summary.build(runs, pd.DataFrame())
    order = [line.split("batch_size ")[1].split(" ")[0].rstrip(":") for line in result.headlines]
    assert order == ["64", "256", "1024"]
    for table in (result.rankings["images_per_s"], result.replications):
        settings = list(dict.fromkeys(table["setting"]))
        assert settings == ["batch_size 64", "batch_size 256", "batch_size 1024"]
    assert sorted(["x 10", "x 9", "x 9.5"], key=cells.natural_key) == ["x 9", "x 9.5", "x 10"]


def test_loaded_runs_are_said_before_any_figure_and_clean_runs_ranked_apart():
    """Of 4 runs a framework, the first loaded: the summary's first lines say
    so, with the foreign share, and rank the 3 clean runs of each framework
    apart; the section says it before its first figure."""
    runs = runs_table({("a", 2): [300.0, 101.0, 100.0, 99.0], ("b", 2): [90.0, 91.0, 89.0, 90.5]})
    runs = runs.assign(
        loaded=runs["rep"] == 1,
        foreign_cpu_share=np.where(runs["rep"] == 1, 0.6, 0.02),
        cpu="Some CPU",
        machine_cores=2,
        device="cpu",
        network="this machine's own (eth0)",
        ranks_per_node=2,
        cores_per_rank=2,
        compute_threads=1,
        runnable_per_core=1.0,
    )
    result = summary.build(runs, pd.DataFrame())
    first, loaded = result.conditions
    assert first.startswith(
        "Conditions of the 8 successful runs: CPU Some CPU (2 cores), device cpu"
    )
    assert "2 ranks per node" in first and "2 cores a rank could use" in first
    assert loaded.startswith("2 of 8 runs were measured beside heavy foreign load")
    assert "60 %" in loaded
    (clean,) = result.clean_headlines
    assert clean.startswith("Clean runs only:") and "a" in clean and "100" in clean
    html = summary.section(SimpleNamespace(extra={"summary": result})).html()
    assert html.index("heavy foreign load") < html.index("Which framework leads")
    # Too few clean runs in a cell: no clean ranking, the loaded line stays.
    three = runs[runs["rep"] <= 3]
    assert summary.build(three, pd.DataFrame()).clean_headlines == []


def test_oversubscribed_runs_are_said_in_the_conditions():
    runs = runs_table({("a", 2): [100.0, 101.0]}).assign(
        loaded=False, ranks_per_node=2, cores_per_rank=2, compute_threads=2, runnable_per_core=2.0
    )
    (first,) = summary.build(runs, pd.DataFrame()).conditions
    assert "in 2 of 2 runs more compute threads than cores (up to 2 a core)" in first


def test_runs_that_held_the_machine_shared_are_never_clean():
    """A run that only checked correctness (the suite's: machine_shared, it
    held the machine shared with other runs of ours) counts as loaded
    whatever its meter saw, and the summary's conditions say why."""
    from analysis import collect, conditions

    quiet = {"machine_load": {"foreign_cpu_share": 0.01, "loaded": False}}
    shared = {**quiet, "machine_shared": True, "conditions": {"machine_shared": True}}
    assert collect.load_figures(quiet)["loaded"] is False
    assert collect.load_figures(shared)["loaded"] is True
    assert conditions.columns(shared)["machine_shared"] is True
    runs = runs_table({("a", 2): [100.0, 101.0], ("b", 2): [90.0, 91.0]})
    runs = runs.assign(loaded=True, machine_shared=True, foreign_cpu_share=0.01)
    _, loaded = summary.build(runs, pd.DataFrame()).conditions
    assert loaded.startswith("4 of 4 runs were measured beside heavy foreign load (")
    assert "4 of them held the machine shared with other runs of ours" in loaded
