"""Design statistics on constructed tables with known answers."""

import math
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from analysis import stats


def jain_2x2():
    """Jain's memory-cache example (Table 18.1, 2^2 3): y for
    (A, B) = (-1,-1): 15 18 12; (+1,-1): 45 48 51; (-1,+1): 25 28 19;
    (+1,+1): 75 75 81. Effects: q0 41, qA 21.5, qB 9.5, qAB 5;
    SSA 5547, SSB 1083, SSAB 300, SSE 102 (SST 7032)."""
    data = {
        (16, 1): [15, 18, 12],
        (64, 1): [45, 48, 51],
        (16, 2): [25, 28, 19],
        (64, 2): [75, 75, 81],
    }
    rows = [
        {"batch_size": a, "procs_per_node": b, "images_per_s": y, "status": "ok"}
        for (a, b), ys in data.items()
        for y in ys
    ]
    return pd.DataFrame(rows)


# The example's sums of squares (SSA, SSB, SSAB), of the error and in all.
JAIN_SUM_SQ = {"batch_size": 5547, "procs_per_node": 1083, "batch_size:procs_per_node": 300}
JAIN_SSE, JAIN_SST = 102, 7032


def test_sign_table_reproduces_jain_allocation_of_variation():
    effects = stats.sign_table_2kr(jain_2x2(), ["batch_size", "procs_per_node"], "images_per_s")
    by = effects.set_index("term")
    assert by.loc["mean", "effect"] == pytest.approx(41)
    assert by.loc["batch_size", "effect"] == pytest.approx(21.5)
    assert by.loc["procs_per_node", "effect"] == pytest.approx(9.5)
    assert by.loc["batch_size:procs_per_node", "effect"] == pytest.approx(5)
    variation = {term: ss / JAIN_SST for term, ss in JAIN_SUM_SQ.items()}
    assert by.loc[list(variation), "variation"].to_dict() == pytest.approx(variation)
    assert effects.attrs["error_variation"] == pytest.approx(JAIN_SSE / JAIN_SST)
    # s_e = sqrt(102 / 8) = 3.57; s_q = s_e / sqrt(12) = 1.03; t[0.975; 8] = 2.306
    assert by.loc["batch_size", "ci_half_width"] == pytest.approx(2.306 * 1.0308, rel=1e-3)


def test_anova_agrees_with_sign_table_on_two_levels():
    table = stats.anova(jain_2x2(), ["batch_size", "procs_per_node"], "images_per_s")
    by = table.set_index("term")
    assert by.loc[list(JAIN_SUM_SQ), "sum_sq"].to_dict() == pytest.approx(JAIN_SUM_SQ)
    assert by.loc["Residual", "sum_sq"] == pytest.approx(JAIN_SSE)


def test_anova_of_one_run_per_cell_says_why_it_has_no_table_without_warnings():
    """One run per cell: as many terms as runs, no error left. statsmodels
    printed divide-by-zero warnings, then refused in its own words; the
    report now has one sentence and its remedy."""
    one_each = jain_2x2().groupby(["batch_size", "procs_per_node"], as_index=False).first()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"^4 model terms for 4 runs: .*replicate the cells$"):
            stats.anova(one_each, ["batch_size", "procs_per_node"], "images_per_s")


def test_anova_leaves_out_an_interaction_whose_levels_did_not_all_run():
    """A framework that ran at one scale only (LBANN at 2 processes): the
    framework x scale interaction cannot be estimated, and statsmodels
    warned of a rank-deficient matrix and gave its F test a wrong df."""
    rows = jain_2x2().assign(framework="a")
    lbann = rows[rows["procs_per_node"] == 2].assign(framework="b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = stats.anova(
            pd.concat([rows, lbann]), ["framework", "procs_per_node"], "images_per_s"
        )
    assert list(table["term"]) == ["framework", "procs_per_node", "Residual"]
    assert table.attrs["left_out"] == [
        "framework x procs_per_node (3 of its 4 combinations of levels ran)"
    ]


def test_anova_names_the_factors_the_finished_runs_confound():
    """Each framework ran at its own scale only: no effect of either can be
    told from the other's."""
    runs = jain_2x2()
    runs = runs[runs["batch_size"] == 16].assign(framework=runs["procs_per_node"].map(str))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"confound framework and procs_per_node: .*missing"):
            stats.anova(runs, ["framework", "procs_per_node"], "images_per_s")


def test_log_model_detected_when_effects_multiply():
    rng = np.random.default_rng(0)
    rows = []
    for a, fa in ((1, 1.0), (2, 10.0), (3, 100.0)):
        for b, fb in ((1, 1.0), (2, 10.0)):
            for _ in range(4):
                rows.append({"a": a, "b": b, "status": "ok", "y": fa * fb * rng.lognormal(0, 0.05)})
    result = stats.log_model_fits_better(pd.DataFrame(rows), ["a", "b"], "y")
    assert result["log_fits_better"] and result["r_squared_log"] > 0.99


def test_replicates_flagged_when_interval_is_wide():
    runs = pd.DataFrame(
        {
            "framework": ["x"] * 3 + ["y"] * 3,
            "status": "ok",
            "images_per_s": [100, 101, 99, 100, 150, 50],
        }
    )
    table = stats.replicate_table(runs, ["framework"], "images_per_s").set_index("framework")
    # x: s = 1, t(0.975, 2) = 4.303 -> half-width 2.48 = 2.5 % of 100
    assert table.loc["x", "ci_half_width"] == pytest.approx(4.3027 / math.sqrt(3), rel=1e-3)
    assert not table.loc["x", "needs_more_replications"]
    assert table.loc["y", "needs_more_replications"]


def test_scaling_gives_known_efficiencies():
    runs = pd.DataFrame(
        {
            "framework": ["f"] * 6,
            "batch_size": [64] * 6,
            "status": "ok",
            "world_size": [1, 1, 2, 2, 4, 4],
            "images_per_s": [100, 100, 180, 180, 300, 300],
        }
    )
    table = stats.scaling(runs).set_index("world_size")
    assert table.loc[2, "speedup"] == pytest.approx(1.8)
    assert table.loc[2, "efficiency"] == pytest.approx(0.9)
    assert table.loc[4, "efficiency"] == pytest.approx(0.75)
    assert table.loc[4, "ideal_speedup"] == 4
    # no spread: an interval of no width
    assert table.loc[4, "speedup_low"] == pytest.approx(table.loc[4, "speedup_high"])


def test_cells_keep_apart_every_varied_factor():
    """Scaling never averages over a factor the design varies: the setting
    names batch_size and each other varied factor, not the scale itself nor
    analysis-only or path settings."""
    from analysis import cells

    runs = pd.DataFrame(
        {
            "framework": ["a", "a", "b", "b"],
            "nodes": [1, 2, 1, 2],
            "procs_per_node": [1, 1, 2, 2],
            "batch_size": [64] * 4,
            "dataset": ["fashion-mnist", "cifar10"] * 2,
            "tracer": ["otf2"] * 4,
            "target_accuracy": [0.8, 0.9, 0.8, 0.9],
            "data_dir": ["/a", "/b"] * 2,
            "net_rate_mbit": [100.0, float("nan")] * 2,
        }
    )
    labels = cells.with_setting(runs)["setting"].tolist()
    assert (
        labels
        == [
            "batch_size 64, dataset fashion-mnist, net_rate_mbit 100",
            "batch_size 64, dataset cifar10, net_rate_mbit null",
        ]
        * 2
    )
    apart = cells.with_setting(runs, leave_out=("dataset",))["setting"].tolist()
    assert apart == ["batch_size 64, net_rate_mbit 100", "batch_size 64, net_rate_mbit null"] * 2


@pytest.mark.parametrize("dof", [1, 2, 5, 29, 3.7, 1e6])
def test_t_quantile_is_scipys_t_ppf_to_the_bit(dof):
    from scipy import stats as scipy_stats

    for confidence in (0.95, 0.9):
        assert stats.t_quantile(dof, confidence) == scipy_stats.t.ppf((1 + confidence) / 2, dof)


def test_the_figures_do_not_import_scipy_stats():
    """Importing scipy.stats costs the figures' process about a second of
    CPU, in every workflow; only the report needs it."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, analysis.figures; print('scipy.stats' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "False"
