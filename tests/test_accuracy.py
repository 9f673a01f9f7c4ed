"""Time to accuracy on constructed epochs tables: the first evaluation at or
above the target counts, and runs that miss it are marked, not dropped."""

import math

import pandas as pd
import pytest

from analysis import accuracy, figures


def epochs(accuracies, elapsed=None):
    elapsed = elapsed or [10.0 * (i + 1) for i in range(len(accuracies))]
    return pd.DataFrame(
        {"epoch": range(1, len(accuracies) + 1), "test_accuracy": accuracies, "elapsed_s": elapsed}
    )


def test_first_epoch_at_or_above_the_target_counts():
    table = epochs([0.80, 0.85, 0.84, 0.90], [12, 23.5, 35, 47])
    got = accuracy.time_to_accuracy(table, 0.85)
    assert got["target_status"] == "reached" and math.isnan(got["energy_to_accuracy_j"])
    assert (got["time_to_accuracy_s"], got["epochs_to_accuracy"]) == (23.5, 2)
    measured = table.assign(energy_to_epoch_j=[100.0, 210.0, 330.0, 450.0])
    assert accuracy.time_to_accuracy(measured, 0.85)["energy_to_accuracy_j"] == 210.0


def test_epochs_without_evaluation_are_skipped():
    # eval_every 2: odd epochs carry no test accuracy.
    got = accuracy.time_to_accuracy(epochs([math.nan, 0.7, math.nan, 0.88]), 0.85)
    assert got["epochs_to_accuracy"] == 4 and got["time_to_accuracy_s"] == 40.0


def test_a_run_that_never_reaches_the_target_is_marked():
    got = accuracy.time_to_accuracy(epochs([0.5, 0.6]), 0.85)
    assert got["target_status"] == "not reached"
    assert math.isnan(got["time_to_accuracy_s"]) and math.isnan(got["epochs_to_accuracy"])


def test_no_target_means_not_measured():
    assert accuracy.time_to_accuracy(epochs([0.9]), None)["target_status"] == "no target_accuracy"


def constructed_runs():
    rows = []
    for framework, times in {"torch-ddp": [30.0, 18.0], "horovod-torch": [33.0, None]}.items():
        for world, t in zip([1, 2], times):
            for rep in (1, 2):
                rows.append(
                    {
                        "run_id": f"{framework}-{world}-{rep}",
                        "status": "ok",
                        "framework": framework,
                        "world_size": world,
                        "batch_size": 64,
                        "target_accuracy": 0.85,
                        "target_status": "reached" if t else "not reached",
                        "time_to_accuracy_s": (t + rep) if t else math.nan,
                        "epochs_to_accuracy": 3 if t else math.nan,
                        "energy_to_accuracy_j": math.nan,
                    }
                )
    return pd.DataFrame(rows)


def test_summary_counts_runs_that_missed():
    table = accuracy.summary(constructed_runs()).set_index(["framework", "world_size"])
    assert table.loc[("horovod-torch", 2), "runs"] == 2
    assert table.loc[("horovod-torch", 2), "reached"] == 0
    assert table.loc[("torch-ddp", 2), "time_to_accuracy_s"] == pytest.approx(19.5)


def test_figure_draws_reached_and_missed_runs(tmp_path):
    plot = figures.time_to_accuracy(constructed_runs())
    plot.save(tmp_path / "tta.png", dpi=60, verbose=False)
    assert (tmp_path / "tta.png").stat().st_size > 5_000
    layers = [type(layer.geom).__name__ for layer in plot.layers]
    assert layers.count("geom_point") == 2  # the reached runs and the crosses


def test_figure_says_when_no_run_reached_the_target(tmp_path):
    runs = constructed_runs().assign(target_status="not reached", time_to_accuracy_s=math.nan)
    plot = figures.time_to_accuracy(runs)
    plot.save(tmp_path / "none.png", dpi=60, verbose=False)
    (text,) = plot.layers
    assert text.geom.aes_params["label"] == "no run reached test accuracy 0.85"


def test_a_figure_with_nothing_to_show_is_saved_as_its_title_and_line(tmp_path):
    """draw_all's save of an empty figure draws its title and its one line
    with matplotlib alone (no plotnine layout): a PNG of the empty figure's
    size, with ink in it, that the report replaces by the line."""
    from PIL import Image

    runs = constructed_runs().assign(target_status="not reached", time_to_accuracy_s=math.nan)
    plot = figures.time_to_accuracy(runs)
    assert plot.why == "no run reached test accuracy 0.85"
    figures.save(plot, tmp_path / "none.png")
    with Image.open(tmp_path / "none.png") as drawn:
        assert drawn.size == (6 * 110, int(1.5 * 110))
        assert drawn.convert("L").getextrema()[0] < 100  # dark text on white
